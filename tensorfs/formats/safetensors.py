"""The safetensors parser: the 8-byte header length, the JSON header, nothing else.

A file is ``N`` (u64, little-endian), ``N`` bytes of UTF-8 JSON (padded with spaces), then
the tensor data.  The JSON maps each tensor name to ``{"dtype", "shape", "data_offsets"}``
(offsets relative to the data section) plus an optional ``"__metadata__"`` string map.

Validation follows the reference reader, Hugging Face ``safetensors/src/tensor.rs``
(``SafeTensors::read_metadata`` and ``Metadata::validate``) and the serde / serde_json rules
it inherits, so a file is mounted only if the reference would load it.  Every way a file is
refused is one ``SafetensorsError`` whose ``kind`` is the name of the ``SafeTensorError``
variant the reference would return:

``HeaderTooSmall``
    the file is shorter than the 8-byte length field.
``HeaderTooLarge``
    the header length ``N`` exceeds ``MAX_HEADER_SIZE`` (100,000,000; ``N`` equal to it is
    allowed, as in tensor.rs's ``n > MAX_HEADER_SIZE``).
``InvalidHeaderLength``
    ``8 + N`` reaches past the end of the file.
``InvalidHeader``
    the ``N`` header bytes are not valid UTF-8.
``InvalidHeaderDeserialization``
    the header is not what serde_json would deserialize into ``HashMetadata``: not JSON,
    not an object, trailing bytes other than JSON whitespace, NaN/Infinity, numbers out of
    f64 range, lone UTF-16 surrogates in ``\\u`` escapes, nesting deeper than serde_json's
    recursion limit, a duplicate key, ``__metadata__`` not null or a string-to-string map,
    a tensor entry that is not an object with a known ``dtype``, a ``shape`` of unsigned
    64-bit JSON integers and a two-element ``data_offsets`` of the same.
``InvalidOffset``
    walking the tensors sorted by ``data_offsets``, one does not begin where the previous
    ended (the first must begin at 0), or ends before it begins: a gap or an overlap.
``ValidationOverflow``
    the element count, or element count × bits, does not fit in 64 bits.
``MisalignedSlice``
    a sub-byte dtype (F4, F6_*) whose element count × bits is not a whole number of bytes.
``TensorInvalidInfo``
    ``end - begin`` differs from element count × bits / 8.
``MetadataIncompleteBuffer``
    the data section does not end exactly at the end of the file (short or trailing bytes).

Where this parser is stricter than the reference (it never accepts what the reference
refuses), the difference is deliberate and listed here:

- duplicate keys are refused everywhere.  serde refuses duplicate ``__metadata__`` and
  duplicate fields inside a tensor entry, but keeps the last of two tensors with the same
  name, or of two equal ``__metadata__`` keys.  Serving one of two tensors silently is
  exactly the ambiguity a filesystem view must not hide.
- a tensor entry must be a JSON object.  serde also accepts the positional array form
  ``["F32", [2], [0, 8]]`` and the enum-as-map dtype ``{"F32": null}``; no writer produces
  them.

Unknown fields inside a tensor entry are ignored, as serde does for ``TensorInfo``.

Byte offsets in errors are absolute in the file: for JSON problems the byte where it went
wrong (8 + the UTF-8 position in the header), for tensor problems the start of its data.
"""

from __future__ import annotations

import json
import json.decoder
import math
import re
import struct
from array import array
from itertools import chain, repeat
from operator import itemgetter, mul, sub
from typing import Any, NamedTuple

from tensorfs.dtypes import SAFETENSORS_DTYPES
from tensorfs.errors import SafetensorsError
from tensorfs.formats import NeedMoreBytes
from tensorfs.model import MetadataValue, ModelFile, TensorInfo

MAX_HEADER_SIZE = 100_000_000     # tensor.rs MAX_HEADER_SIZE; "n > MAX_HEADER_SIZE" refuses
N_LEN = 8                         # the u64 header length
USIZE_LIMIT = 1 << 64             # tensor.rs does checked usize arithmetic (64-bit targets)
SERDE_MAX_DEPTH = 127             # serde_json's recursion limit: 128 levels is an error
METADATA_KEY = "__metadata__"

# Every SafetensorsError.kind this parser raises (described in the module docstring), named
# after tensor.rs's SafeTensorError variants.
ERROR_KINDS = (
    "HeaderTooSmall", "HeaderTooLarge", "InvalidHeaderLength", "InvalidHeader",
    "InvalidHeaderDeserialization", "InvalidOffset", "ValidationOverflow", "MisalignedSlice",
    "TensorInvalidInfo", "MetadataIncompleteBuffer",
)
_TENSOR_FIELDS = ("dtype", "shape", "data_offsets")

_WS = re.compile(r"[ \t\n\r]*")                     # JSON whitespace, as serde_json skips it
_SURROGATE_ESCAPE = re.compile(r"\\u[dD]([89a-fA-F])[0-9a-fA-F]{2}")


def looks_like_safetensors(prefix: bytes, file_size: int) -> bool:
    """A cheap sniff: a header length that fits the file, then a JSON object.

    The reference lets JSON whitespace precede the ``{`` (its ``InvalidHeaderStart`` check
    is commented out), so whitespace is skipped here too.
    """
    if len(prefix) < N_LEN or file_size < N_LEN + 2:
        return False
    n = int.from_bytes(bytes(prefix[:N_LEN]), "little")
    if n < 2 or n > MAX_HEADER_SIZE or N_LEN + n > file_size:
        return False
    head = bytes(prefix[N_LEN:N_LEN + min(n, 4096)])
    stripped = head.lstrip(b" \t\n\r")
    if not stripped:
        return len(head) < n        # only whitespace so far: undecided, and the length fits
    return stripped[:1] == b"{"


def parse_safetensors(buf, file_size: int, path: str = "<memory>",
                      mtime: float = 0.0) -> ModelFile:
    """Parse and validate a safetensors header from ``buf``, a prefix of the file.

    Raises ``NeedMoreBytes(8 + N)`` if the header lies beyond ``buf`` but inside the file,
    ``SafetensorsError`` for every file the reference would refuse, nothing else.
    """
    if isinstance(buf, (bytes, bytearray)):
        return _parse(buf, file_size, path, mtime)
    # Release our views before returning or raising: the caller may close an mmap next.
    with memoryview(buf) as outer, outer.cast("B") as view:
        return _parse(view, file_size, path, mtime)


def _parse(view, file_size: int, path: str, mtime: float) -> ModelFile:
    if file_size < N_LEN:
        raise SafetensorsError("HeaderTooSmall",
                               f"file is {file_size} bytes, shorter than the 8-byte header length",
                               offset=0)
    if len(view) < N_LEN:
        raise NeedMoreBytes(N_LEN)
    (n,) = struct.unpack_from("<Q", view, 0)
    if n > MAX_HEADER_SIZE:
        raise SafetensorsError("HeaderTooLarge",
                               f"header length {n} exceeds the {MAX_HEADER_SIZE}-byte limit",
                               offset=0)
    header_size = N_LEN + n
    if header_size > file_size:
        raise SafetensorsError("InvalidHeaderLength",
                               f"header length {n} reaches past the end of the "
                               f"{file_size}-byte file", offset=0)
    if header_size > len(view):
        raise NeedMoreBytes(header_size)
    raw = bytes(view[N_LEN:header_size])
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise SafetensorsError("InvalidHeader", "header is not valid UTF-8",
                               offset=N_LEN + exc.start) from None
    try:
        metadata, entries = _Header(text).parse()
    except MemoryError:
        raise SafetensorsError("InvalidHeaderDeserialization",
                               "header JSON too large to parse in memory", offset=N_LEN) from None
    tensors = _validate(entries, header_size, file_size, path)
    return ModelFile(
        format="safetensors", version=None, path=path, file_size=file_size,
        endianness="little", alignment=None, header_size=header_size,
        metadata={k: MetadataValue.of("string", v) for k, v in metadata.items()},
        tensors=tensors, mtime=mtime)


class _Entries(NamedTuple):
    """The tensor entries as read from the JSON, in file order, one list per field.

    Columns rather than one object per tensor: the checks below then run as a few C-level
    passes (``map``, ``sorted``, list comparison) over 100,000 tensors instead of a Python
    loop, and the ``TensorInfo`` records are built by ``map`` too.
    """
    names: list[str]
    dtypes: list[str]
    shapes: list[tuple[int, ...]]
    begins: list[int]
    ends: list[int]


_BITS = {name: d.bits for name, d in SAFETENSORS_DTYPES.items()}
_BYTES = {name: bits // 8 for name, bits in _BITS.items() if bits % 8 == 0}


def _validate(entries: _Entries, header_size: int, file_size: int,
              path: str) -> tuple[TensorInfo, ...]:
    """``Metadata::validate`` and the end-of-file check of ``read_metadata``.

    ``_all_valid`` accepts the common case at C speed; anything it does not accept is
    walked by ``_walk``, the specification, which raises the reference's error (or accepts
    what ``_all_valid`` is too conservative for: zero-element tensors, sub-byte dtypes).
    """
    names, dtypes, shapes, begins, ends = entries
    sizes = list(map(sub, ends, begins))
    if not _all_valid(entries, sizes, header_size, file_size):
        _walk(entries, header_size, file_size)
    offsets = [header_size + begin for begin in begins]
    rows = zip(names, dtypes, shapes, offsets, sizes, repeat(path), repeat("<"), repeat(None),
               repeat(None))
    # tuple.__new__(TensorInfo, row) is TensorInfo(*row) without a Python frame per tensor
    return tuple(map(tuple.__new__, repeat(TensorInfo), rows))


_SIZE_LIMIT = USIZE_LIMIT // 8          # a size below it has a bit count that fits in u64


def _all_valid(entries: _Entries, sizes: list[int], header_size: int, file_size: int) -> bool:
    """True if every check of ``_walk`` passes; False means only "walk to be sure".

    Per tensor, for whole-byte dtypes: ``end - begin`` is the element count times the
    dtype's bytes, and not 0.  The layout: with every size positive, the walk in
    ``(begin, end)`` order succeeds exactly when the sorted begins are 0 followed by the
    sorted ends but the largest: the tensor beginning at 0 must be the one ending first
    (every other begins at or after that end, and ends after it begins), so it is
    ``[0, first end]``; drop it and repeat.  The data then ends at the largest end, and
    no size exceeds it: with that end below ``_SIZE_LIMIT`` every bit count fits in 64
    bits, and so does every partial product of a shape (no dimension is 0, so none exceeds
    the element count): the walk's overflow checks.
    """
    names, dtypes, shapes, begins, ends = entries
    if not names:
        return header_size == file_size
    try:
        expected = list(map(mul, map(math.prod, shapes), map(_BYTES.__getitem__, dtypes)))
    except KeyError:                    # a sub-byte dtype
        return False
    if sizes != expected or 0 in sizes:
        return False
    sorted_begins, sorted_ends = sorted(begins), sorted(ends)
    data_end = sorted_ends[-1]
    return (sorted_begins[0] == 0 and sorted_begins[1:] == sorted_ends[:-1]
            and data_end < _SIZE_LIMIT and header_size + data_end == file_size)


def _walk(entries: _Entries, header_size: int, file_size: int) -> None:
    """The reference's checks, tensor by tensor in ``(begin, end)`` order: raise its error."""
    names, dtypes, shapes, begins, ends = entries
    start = 0
    for i in sorted(range(len(names)), key=lambda i: (begins[i], ends[i])):
        name, dtype, shape, begin, end = names[i], dtypes[i], shapes[i], begins[i], ends[i]
        at = header_size + begin
        if begin != start or end < begin:
            why = ("ends before it begins" if end < begin else
                   f"begins at {begin}, expected {start} (gap)" if begin > start else
                   f"begins at {begin}, expected {start} (overlap)")
            raise _tensor_error("InvalidOffset", name,
                                f"data_offsets [{begin}, {end}] {why}", at)
        start = end
        count = 1
        for dim in shape:               # try_fold(1usize, checked_mul): stops at the overflow
            count *= dim
            if count >= USIZE_LIMIT:
                raise _tensor_error("ValidationOverflow", name,
                                    f"element count of shape {_shape(shape)} overflows 64 bits",
                                    at)
        nbits = count * _BITS[dtype]
        if nbits >= USIZE_LIMIT:
            raise _tensor_error("ValidationOverflow", name,
                                f"bit count of {dtype} {_shape(shape)} overflows 64 bits", at)
        if nbits % 8:
            raise _tensor_error("MisalignedSlice", name,
                                f"{count} elements of {dtype} are not a whole number of bytes",
                                at)
        if end - begin != nbits // 8:
            raise _tensor_error("TensorInvalidInfo", name,
                                f"{dtype} {_shape(shape)} needs {nbits // 8} bytes, "
                                f"data_offsets [{begin}, {end}] give {end - begin}", at)
    if header_size + start != file_size:
        raise SafetensorsError(
            "MetadataIncompleteBuffer",
            f"tensor data ends at byte {header_size + start} but the file is {file_size} bytes",
            offset=min(header_size + start, file_size))


def _shape(shape: tuple[int, ...], limit: int = 8) -> str:
    shown = ", ".join(str(d) for d in shape[:limit])
    return f"[{shown}{', ...' if len(shape) > limit else ''}]"


def _tensor_error(kind: str, name: str, what: str, offset: int) -> SafetensorsError:
    return SafetensorsError(kind, f"tensor {_quote(name)}: {what}", offset=offset, name=name)


_SHORT_ESCAPES = {"\n": "\\n", "\r": "\\r", "\t": "\\t", "\x00": "\\0"}


def _quote(s: str, limit: int = 120) -> str:
    """A name as one printable line: control and line-break characters escaped, truncated."""
    if len(s) > limit:
        s = s[:limit] + "…"
    out = []
    for ch in s:
        if ch == '"' or ch == "\\":
            out.append("\\" + ch)
        elif ch in _SHORT_ESCAPES:
            out.append(_SHORT_ESCAPES[ch])
        elif ch.isprintable():
            out.append(ch)
        else:
            code = ord(ch)
            out.append(f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}")
    return '"' + "".join(out) + '"'


class _Problem(Exception):
    """Internal: a header problem found while scanning; ``pos`` is a character index."""

    def __init__(self, message: str, pos: int | None = None, name: str | None = None):
        super().__init__(message)
        self.message, self.pos, self.name = message, pos, name


def _json_int(s: str):
    """serde_json's integer rule: u64 or i64, else an f64 (out of f64 range: an error)."""
    digits = len(s) - (s[0] == "-")
    if digits <= 20:
        value = int(s)
        if value == 0 and s[0] == "-":
            return -0.0                 # serde_json reads "-0" as the float -0.0
        if -(1 << 63) <= value < USIZE_LIMIT:
            return value
    return _json_float(s)


def _json_float(s: str) -> float:
    value = float(s)
    if value in (float("inf"), float("-inf")):
        raise _Problem(f"number out of range: {s[:40]}")
    return value


def _json_constant(s: str):
    raise _Problem(f"invalid JSON value {s}")


def _unique_pairs(pairs):
    result = dict(pairs)
    if len(result) != len(pairs):
        seen = set()
        for key, _ in pairs:
            if key in seen:
                raise _Problem(f"duplicate key {_quote(key)}")
            seen.add(key)
    return result


# A leaf-value decoder: C speed, serde_json's number rules, duplicates refused.
_DECODER = json.JSONDecoder(object_pairs_hook=_unique_pairs, parse_int=_json_int,
                            parse_float=_json_float, parse_constant=_json_constant)
# The whole-header decoder of the fast path: dicts and ints built by C (range and -0 checked
# afterwards, duplicate keys by ``_keys_unique``: a hook called for every object would cost
# a third of the decoding).
_PLAIN_DECODER = json.JSONDecoder(parse_float=_json_float, parse_constant=_json_constant)
# The same refusing duplicates as it decodes, when ``_keys_unique``'s count cannot tell.
_UNIQUE_DECODER = json.JSONDecoder(object_pairs_hook=_unique_pairs, parse_float=_json_float,
                                   parse_constant=_json_constant)
_NEGATIVE_ZERO = re.compile(r"[\[,:][ \t\n\r]*-0(?![0-9.eE])")
_I64_MIN = -(1 << 63)
# dtype name -> the same name: looking a dtype up checks it and gives every tensor one
# shared string (the JSON's per-tensor copies are freed with the decoded header).
_KNOWN_DTYPE = {name: name for name in SAFETENSORS_DTYPES}.__getitem__


def _keys_unique(text: str, start: int, n_keys: int) -> bool:
    """Whether the JSON value at ``start`` (the whole of ``text`` but JSON whitespace), which
    decoded to objects holding ``n_keys`` keys in all, has no object with a duplicate key.

    Every key written in the text is followed by exactly one ``:`` outside strings, and
    ``:`` appears outside strings nowhere else; inside strings it can only add to the count.
    Decoding keeps one of two equal keys, so ``count(":") >= keys written >= n_keys``, and
    equality proves that no key was dropped.  A colon inside a string (a URL in
    ``__metadata__``) leaves the count undecided: then the decoder that refuses a duplicate
    as it meets it decides.
    """
    if text.count(":") == n_keys:
        return True
    try:
        _UNIQUE_DECODER.raw_decode(text, start)
    except (_Problem, ValueError, RecursionError):
        return False
    return True


def _only(kind: type, values) -> bool:
    """Whether every value is exactly a ``kind`` (a bool is no int), at C speed."""
    return {kind}.issuperset(map(type, values))


def _all_u64(numbers: list) -> bool:
    """Whether every number is an int (not a bool) in ``[0, 2**64)``, at C speed."""
    if not _only(int, numbers):
        return False
    try:
        array("Q", numbers)             # OverflowError for a negative or too large one
    except OverflowError:
        return False
    return True


assert array("Q").itemsize == 8        # unsigned long long: 64 bits wherever CPython runs
_DTYPE_FIELD, _SHAPE_FIELD, _OFFSETS_FIELD = map(itemgetter, _TENSOR_FIELDS)


def _extra_keys(value) -> int | None:
    """The object keys inside an ignored tensor field (for ``_keys_unique``), or None if
    the fast path may not accept it: nested deeper than serde_json allows, or holding an
    integer that serde_json would read as a float (those are left to the precise path)."""
    keys, stack = 0, [(value, 3)]       # level 1: the header, 2: the entry, 3: this value
    while stack:
        item, level = stack.pop()
        if type(item) is int:
            if not _I64_MIN <= item < USIZE_LIMIT:
                return None
        elif isinstance(item, (list, dict)):
            if level > SERDE_MAX_DEPTH:
                return None
            if isinstance(item, dict):
                keys += len(item)
                item = item.values()
            stack.extend((child, level + 1) for child in item)
    return keys


class _Where:
    """``tensor "NAME"``, formatted only when an error message needs it."""

    def __init__(self, name: str):
        self.name = name

    def __str__(self) -> str:
        return f"tensor {_quote(self.name)}"


def _depth(value) -> int:
    """Nesting depth of a decoded JSON value (a scalar is 0), without recursion."""
    best, stack = 0, [(value, 1)]
    while stack:
        item, level = stack.pop()
        if isinstance(item, dict):
            item = list(item.values())
        elif not isinstance(item, list):
            continue
        best = max(best, level)
        stack.extend((child, level + 1) for child in item if isinstance(child, (list, dict)))
    return best


def _is_u64(value) -> bool:
    return type(value) is int and 0 <= value < USIZE_LIMIT


def _kind_of(value) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int):
        return f"integer {value}"
    if isinstance(value, float):
        return f"number {value!r}"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    return "an object"


class _Header:
    """The JSON header.

    ``_fast`` decodes the whole header with the C decoder and accepts it only when every
    check passes at once; on any doubt it returns None and ``_precise`` decides, scanning
    the top two levels by hand so that an error carries the exact byte where it lies.
    ``_precise`` is the specification; ``_fast`` only ever accepts what it accepts.
    """

    def __init__(self, text: str):
        self.text = text

    def parse(self) -> tuple[dict[str, str], _Entries]:
        try:
            bad = _lone_surrogate(self.text)
            if bad is not None:
                raise _Problem("lone UTF-16 surrogate in a \\u escape", bad)
            result = self._fast()
            return result if result is not None else self._precise()
        except _Problem as exc:
            pos = exc.pos if exc.pos is not None else 0
            raise SafetensorsError("InvalidHeaderDeserialization",
                                   f"invalid JSON header: {exc.message}",
                                   offset=self._byte_offset(pos), name=exc.name) from None
        except json.JSONDecodeError as exc:
            raise SafetensorsError("InvalidHeaderDeserialization",
                                   f"invalid JSON header: {exc.msg}",
                                   offset=self._byte_offset(exc.pos)) from None

    def _fast(self) -> tuple[dict[str, str], _Entries] | None:
        text = self.text
        # "-" first: a one-character search runs at memchr speed, and most headers have none
        if "-" in text and "-0" in text and _NEGATIVE_ZERO.search(text):
            return None                 # Python: int 0; serde: a float
        start = self._ws(0)
        try:
            top, end = _PLAIN_DECODER.raw_decode(text, start)
        except (_Problem, ValueError, RecursionError):   # JSONDecodeError is a ValueError
            return None
        if type(top) is not dict or self._ws(end) != len(text):
            return None
        n_keys = len(top)
        metadata = top.pop(METADATA_KEY, None)
        if metadata is not None:
            if type(metadata) is not dict or not _only(str, metadata.values()):
                return None
            n_keys += len(metadata)
        # Each check is one C-level pass over a column (see _Entries).
        names, infos = list(top), list(top.values())
        # KeyError: a field is missing or the dtype unknown; TypeError: an entry that is not
        # an object, an unhashable dtype, data_offsets without a length.
        try:
            dtypes = list(map(_KNOWN_DTYPE, map(_DTYPE_FIELD, infos)))
            shapes = list(map(_SHAPE_FIELD, infos))
            offsets = list(map(_OFFSETS_FIELD, infos))
            if not {2}.issuperset(map(len, offsets)):
                return None
        except (KeyError, TypeError):
            return None
        if not _only(list, shapes):     # ("" and {} would make empty tuples)
            return None
        shapes = list(map(tuple, shapes))
        # data_offsets of length 2 that are not a list (a string, an object) fail here: their
        # items are not ints.
        bounds = list(chain.from_iterable(offsets))
        if not (_all_u64(bounds) and _all_u64(list(chain.from_iterable(shapes)))):
            return None
        n_entry_keys = sum(map(len, infos))    # each has the 3 fields: more means others too
        n_keys += n_entry_keys
        if n_entry_keys != len(_TENSOR_FIELDS) * len(infos):
            for info in infos:          # fields serde ignores, in some entries
                for key, value in info.items():
                    if key not in _TENSOR_FIELDS:
                        keys = _extra_keys(value)
                        if keys is None:
                            return None
                        n_keys += keys
        if not _keys_unique(text, start, n_keys):
            return None
        return (metadata or {}), _Entries(names, dtypes, shapes, bounds[0::2], bounds[1::2])

    def _precise(self) -> tuple[dict[str, str], _Entries]:
        text = self.text
        i = self._ws(0)
        if i == len(text):
            raise _Problem("header is empty: EOF while parsing a value", i)
        if text[i] != "{":
            raise _Problem("header is not a JSON object", i)
        metadata: dict[str, str] | None = None
        rows: list[tuple] = []
        seen: set[str] = set()
        for key, key_pos, value_pos in self._object(i):
            if key in seen:
                raise _Problem(f"duplicate key {_quote(key)}", key_pos, key)
            seen.add(key)
            if key == METADATA_KEY:
                metadata = self._metadata(value_pos)
            else:
                rows.append(self._tensor(key, value_pos))
        end = self._ws(self._end)
        if end != len(text):
            raise _Problem("trailing characters after the JSON header", end)
        columns = zip(*rows) if rows else [()] * len(_Entries._fields)
        return (metadata or {}), _Entries(*map(list, columns))

    # -- scanning ----------------------------------------------------------------------

    def _ws(self, i: int) -> int:
        return _WS.match(self.text, i).end()

    def _byte_offset(self, pos: int) -> int:
        return N_LEN + len(self.text[:pos].encode("utf-8"))

    def _object(self, i: int):
        """Yield ``(key, key_pos, value_pos)`` for the object at ``i``; the caller must consume
        each value and leave ``self._end`` just after it.  Sets ``self._end`` past ``}``."""
        text = self.text
        i = self._ws(i + 1)
        if text.startswith("}", i):
            self._end = i + 1
            return
        while True:
            if not text.startswith('"', i):
                raise _Problem("expecting a string key", i)
            key, j = json.decoder.scanstring(text, i + 1, True)  # type: ignore[attr-defined]
            j = self._ws(j)
            if not text.startswith(":", j):
                raise _Problem("expecting ':' after a key", j)
            self._end = None
            yield key, i, self._ws(j + 1)
            i = self._ws(self._end)
            if text.startswith(",", i):
                i = self._ws(i + 1)
            elif text.startswith("}", i):
                self._end = i + 1
                return
            else:
                raise _Problem("expecting ',' or '}'", i)

    def _leaf(self, pos: int, name: str | None = None):
        """Decode one value at ``pos`` with the C decoder; sets ``self._end``."""
        try:
            value, self._end = _DECODER.raw_decode(self.text, pos)
        except _Problem as exc:
            exc.pos = pos if exc.pos is None else exc.pos
            exc.name = name
            raise
        except RecursionError:
            raise _Problem("recursion limit exceeded: JSON nested too deeply", pos, name) from None
        return value

    def _metadata(self, pos: int) -> dict[str, str] | None:
        if not self.text.startswith("{", pos):
            value = self._leaf(pos)
            if value is None:                 # Option<HashMap<..>>: null is "no metadata"
                return None
            raise _Problem(f"__metadata__ must be an object of strings, not {_kind_of(value)}",
                           pos)
        result: dict[str, str] = {}
        for key, key_pos, value_pos in self._object(pos):
            if key in result:
                raise _Problem(f"duplicate __metadata__ key {_quote(key)}", key_pos, key)
            value = self._leaf(value_pos, key)
            if not isinstance(value, str):
                raise _Problem(f"__metadata__ {_quote(key)} must be a string, "
                               f"not {_kind_of(value)}", value_pos, key)
            result[key] = value
        return result

    def _tensor(self, name: str, pos: int) -> tuple[str, str, tuple[int, ...], int, int]:
        where = _Where(name)
        if not self.text.startswith("{", pos):
            value = self._leaf(pos, name)
            raise _Problem(f"{where} must be an object, not {_kind_of(value)}", pos, name)
        fields: dict[str, Any] = {}        # JSON values, checked below
        for key, key_pos, value_pos in self._object(pos):
            if key in fields:
                raise _Problem(f"{where}: duplicate field {_quote(key)}", key_pos, name)
            value = self._leaf(value_pos, name)
            fields[key] = value
            if key == "dtype":
                if not isinstance(value, str) or value not in SAFETENSORS_DTYPES:
                    shown = _quote(value) if isinstance(value, str) else _kind_of(value)
                    raise _Problem(f"{where}: unknown dtype {shown}", value_pos, name)
            elif key == "shape":
                if not isinstance(value, list):
                    raise _Problem(f"{where}: shape must be an array, not {_kind_of(value)}",
                                   value_pos, name)
                for dim in value:
                    if not _is_u64(dim):
                        raise _Problem(f"{where}: shape entries must be unsigned 64-bit "
                                       f"integers, not {_kind_of(dim)}", value_pos, name)
            elif key == "data_offsets":
                if not isinstance(value, list) or len(value) != 2:
                    shown = (f"an array of {len(value)}" if isinstance(value, list)
                             else _kind_of(value))
                    raise _Problem(f"{where}: data_offsets must be [begin, end], not {shown}",
                                   value_pos, name)
                for off in value:
                    if not _is_u64(off):
                        raise _Problem(f"{where}: data_offsets must be unsigned 64-bit "
                                       f"integers, not {_kind_of(off)}", value_pos, name)
            elif 2 + _depth(value) > SERDE_MAX_DEPTH:   # ignored, as serde does, if not too deep
                raise _Problem("recursion limit exceeded: JSON nested too deeply", value_pos,
                               name)
        for key in _TENSOR_FIELDS:
            if key not in fields:
                raise _Problem(f"{where}: missing field {key}", pos, name)
        begin, end = fields["data_offsets"]
        return name, fields["dtype"], tuple(fields["shape"]), begin, end


def _lone_surrogate(text: str) -> int | None:
    """Position of a ``\\uD800``-``\\uDFFF`` escape not part of a high+low pair, or None.

    Python's json accepts lone surrogates and serde_json refuses them.  A candidate
    ``\\uDxxx`` is a real escape when an even number of backslashes precede its own (in valid
    JSON every backslash starts an escape inside a string); each backslash run is counted
    once, so the scan is linear.  In invalid JSON this may point at a different spot than
    the parser would, but such a file is refused either way.
    """
    if "\\" not in text or ("\\ud" not in text and "\\uD" not in text):
        return None                     # the common case: no backslash (a memchr) at all
    pending = None                      # end of a high surrogate escape awaiting its low half
    pending_at = -1
    for m in _SURROGATE_ESCAPE.finditer(text):
        start = m.start()
        if _backslashes_before(text, start) % 2:
            continue                    # "\\\\uD800": an escaped backslash, then text
        low = m.group(1) in "cdefCDEF"
        if pending is not None:
            if low and start == pending:
                pending = None
                continue
            return pending_at
        if low:
            return start
        pending, pending_at = m.end(), start
    return pending_at if pending is not None else None


def _backslashes_before(text: str, pos: int) -> int:
    """Length of the run of backslashes ending just before ``pos`` (C-speed, any length)."""
    width = 64
    while True:
        low = max(0, pos - width)
        chunk = text[low:pos]
        run = len(chunk) - len(chunk.rstrip("\\"))
        if run < len(chunk) or low == 0:
            return run
        width *= 4
