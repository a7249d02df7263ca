"""GGUF parser: a prefix of a ``.gguf`` file in, one validated ``ModelFile`` out.

Layout (ggml ``docs/gguf.md``; ``ggml/src/gguf.cpp``)::

    magic "GGUF" | version u32 | n_tensors C | n_kv C
    n_kv x      (key S, value type u32, value)
    n_tensors x (name S, n_dims u32, n_dims x ne D, ggml type u32, offset u64)
    padding to ``general.alignment`` (default 32) | tensor data

``C`` (counts), ``S`` (a string: length C + bytes), array lengths and ``D`` (dims) are u64 in
v2 and v3 and u32 in v1.  llama.cpp read v1 until late 2023 (its loader still names it "GGUF
V1 (support until nov 2023)") and nothing current does.  The v1 layout here is the one
gpustack/gguf-parser-go still reads (``file.go``: counts, string lengths, array lengths and
dims go through ``ReadUint64FromUint32`` when ``version <= 1``; n_dims and the type ids are
u32 and the tensor offset u64 in every version), which matches the change the spec's history
records for v2 (ggml commit 54cec9f: "docs(gguf): v2 - uint64 all the things").

A version that reads byte-swapped (``0x03000000``: the low 16 bits are zero, gguf.cpp's test)
marks a big-endian file: every number after the magic is then big-endian, tensor data
included.

What is refused, and how: every refusal is a ``GGUFError`` whose ``kind`` is one of
``KINDS`` below.  Nothing else escapes ``parse_gguf`` (``NeedMoreBytes`` aside, which only
says "give me a longer prefix"), whatever the bytes.

Choices where llama.cpp and gguf-py disagree or are silent:

* Tensor names: gguf.cpp refuses names of 64 bytes or more (GGML_MAX_NAME); gguf-py writes
  and reads any length.  tensorfs accepts any length (bounded only by the file), so it is
  never stricter than either.  Names must be valid UTF-8 (gguf-py refuses otherwise; the
  mount needs a ``str``).  Empty names are accepted (gguf.cpp does).
* Metadata keys: must be valid UTF-8 and non-empty (gguf.cpp aborts on an empty key);
  duplicates are refused, as gguf.cpp and gguf-py do.  Values decode UTF-8 with
  ``surrogateescape`` so a vocabulary with invalid bytes never raises.
* Arrays of arrays: gguf.cpp refuses them, gguf-py writes them.  Accepted up to
  ``MAX_ARRAY_DEPTH`` (3) levels of array; a deeper one is a ``nesting`` error.
* Dims: 0 is allowed (gguf.cpp only refuses negative ne); such a tensor has 0 bytes.  The
  product of the dims (0 counted as 1) must stay below 2**63 - 1, like gguf.cpp's
  "total number of elements is representable" check.
* Offsets: gguf.cpp wants each tensor exactly at the previous one's padded end; tensorfs
  only requires alignment, no overlap (zero-byte tensors overlap nothing) and data inside
  the file, checked in one pass over the tensors sorted by offset.
* ``general.alignment``: must be a scalar uint32, non-zero power of two (gguf.cpp /
  gguf-py).  A vocabulary-only file (0 tensors) may lack the final padding:
  ``header_size`` is then clamped to the file size.
"""

from __future__ import annotations

import array
import math
import struct
import sys
from itertools import repeat
from typing import TYPE_CHECKING

if TYPE_CHECKING:          # annotations only: numpy is imported where it is used
    import numpy as np

from tensorfs.dtypes import GGML_TYPES, GGUF_ARRAY, GGUF_STRING, GGUF_VALUE_TYPES
from tensorfs.errors import GGUFError
from tensorfs.formats import NeedMoreBytes
from tensorfs.model import MetadataValue, ModelFile, TensorInfo

__all__ = ["parse_gguf", "looks_like_gguf", "KINDS", "MAX_ARRAY_DEPTH", "SUPPORTED_VERSIONS"]

GGUF_MAGIC = b"GGUF"
SUPPORTED_VERSIONS = (1, 2, 3)
DEFAULT_ALIGNMENT = 32
MAX_DIMS = 4                    # GGML_MAX_DIMS
MAX_ARRAY_DEPTH = 3             # array[array[array[T]]] is the deepest accepted
MAX_ELEMENTS = 2**63 - 1        # INT64_MAX: element counts must stay below it (gguf.cpp)

# ---------------------------------------------------------------------------------------
# Every way a GGUF file is refused.  ``GGUFError.kind`` is always one of these keys.
# ---------------------------------------------------------------------------------------
KINDS: dict[str, str] = {
    "magic":            "the file does not start with the bytes 'GGUF'",
    "version":          "the version is not 1, 2 or 3 (in either byte order)",
    "truncated":        "a count, string, value or tensor info runs past the end of the file",
    "count":            "a tensor, key-value or array count cannot fit in the bytes that remain",
    "value_type":       "a metadata value or array element type id is not a GGUF value type",
    "nesting":          "arrays nested deeper than MAX_ARRAY_DEPTH",
    "key":              "a metadata key that is empty or not valid UTF-8",
    "duplicate_key":    "the same metadata key twice",
    "alignment":        "general.alignment not a uint32 scalar, or not a non-zero power of two",
    "tensor_name":      "a tensor name that is not valid UTF-8",
    "duplicate_tensor": "the same tensor name twice",
    "n_dims":           "a tensor with more than 4 dimensions",
    "ggml_type":        "a tensor type id ggml does not define (or has removed)",
    "shape":            "a negative dim, too many elements, or ne[0] not a block multiple",
    "offset":           "a tensor offset that is not a multiple of the alignment",
    "overlap":          "two tensors whose data overlap",
    "tensor_data":      "tensor data that starts or ends past the end of the file",
}


def _error(kind: str, message: str, offset: int | None, name: str | None = None) -> GGUFError:
    assert kind in KINDS, kind
    return GGUFError(kind, message, offset=offset, name=name)


def looks_like_gguf(prefix: bytes) -> bool:
    """True when ``prefix`` starts with the GGUF magic (either byte order: the magic is
    four bytes, the same in both; only the version tells the byte order)."""
    return bytes(prefix[:4]) == GGUF_MAGIC


# ---------------------------------------------------------------------------------------
# The cursor: every read checks the bytes that remain.
# ---------------------------------------------------------------------------------------

class _Cursor:
    """Reads numbers of one byte order from ``buf``, never past ``avail``.

    A read that would pass the end of ``buf`` but not the end of the file raises
    ``NeedMoreBytes`` (the opener re-reads a longer prefix); one that would pass the end of
    the file is a ``truncated`` ``GGUFError``.  ``what`` names the structure being read; it
    is a template formatted with ``name`` only when an error is raised, so the hot loops
    build no strings.
    """

    __slots__ = ("buf", "pos", "avail", "file_size", "order", "v1",
                 "_u32", "_u64", "_len", "len_size", "_scalar")

    def __init__(self, buf, file_size: int, order: str, v1: bool):
        self.buf = buf
        self.pos = 0
        self.file_size = file_size
        self.avail = min(len(buf), file_size)
        self.order = order
        self.v1 = v1
        self._u32 = struct.Struct(order + "I").unpack_from
        self._u64 = struct.Struct(order + "Q").unpack_from
        self.len_size = 4 if v1 else 8
        self._len = self._u32 if v1 else self._u64
        self._scalar = {tid: struct.Struct(order + fmt).unpack_from
                        for tid, (_, fmt, _) in GGUF_VALUE_TYPES.items() if fmt}

    @property
    def remaining(self) -> int:
        """Bytes of the file after the cursor (not of the prefix)."""
        return self.file_size - self.pos

    def need(self, n: int, what: str, name=None) -> None:
        end = self.pos + n
        if end > self.avail:
            if end > self.file_size:
                raise _error("truncated", f"{what.format(name)} runs past the end of the file "
                             f"({self.file_size} bytes)", self.pos, _str_or_none(name))
            raise NeedMoreBytes(end)

    def u32(self, what: str, name=None) -> int:
        self.need(4, what, name)
        value = self._u32(self.buf, self.pos)[0]
        self.pos += 4
        return value

    def u64(self, what: str, name=None) -> int:
        self.need(8, what, name)
        value = self._u64(self.buf, self.pos)[0]
        self.pos += 8
        return value

    def count(self, what: str, name=None) -> int:
        """A count, string or array length: u32 in v1, u64 after."""
        return self.u32(what, name) if self.v1 else self.u64(what, name)

    def scalar(self, type_id: int, what: str, name=None):
        size = GGUF_VALUE_TYPES[type_id][2]
        self.need(size, what, name)
        value = self._scalar[type_id](self.buf, self.pos)[0]
        self.pos += size
        return value

    def string_bytes(self, what: str, name=None) -> tuple[int, int]:
        """Reads a string's length and skips its bytes; returns (start, end) in ``buf``."""
        length_at, step = self.pos, self.len_size
        if length_at + step <= self.avail:            # the common case, in one check
            end = length_at + step + self._len(self.buf, length_at)[0]
            if end <= self.avail:
                self.pos = end
                return length_at + step, end
        self.need(step, "length of " + what, name)
        length = self._len(self.buf, length_at)[0]
        self.pos += step
        if length > self.remaining:
            self.pos = length_at
            raise _error("truncated", f"{what.format(name)} is {length} bytes long, past the end "
                         f"of the file ({self.file_size} bytes)", length_at, _str_or_none(name))
        self.need(length, what, name)
        start = self.pos
        self.pos += length
        return start, self.pos

    def skip_strings(self, n: int, what: str, name: str) -> None:
        """Skips ``n`` strings as fast as Python allows.  ``n`` is already checked against
        the remaining bytes, so the loop is bounded by the file size."""
        buf, p, unpack, step = self.buf, self.pos, self._len, self.len_size
        try:
            for _ in repeat(None, n):
                p += step + unpack(buf, p)[0]
        except (struct.error, OverflowError):   # a length pointed past the buffer: walk slowly
            p = self.avail + 1
        if p <= self.avail:             # p only grows, so every read lay inside avail
            self.pos = p
            return
        for i in range(n):              # the careful walk names the element that is short
            self.string_bytes(f"element {i} of " + what, name)


def _str_or_none(name) -> str | None:
    return name if isinstance(name, str) else None


# ---------------------------------------------------------------------------------------
# Metadata values: validated and skipped at parse time, decoded in MetadataValue.value().
# ---------------------------------------------------------------------------------------

_F32, _BOOL, _F64 = 6, 7, 12
# array-module codes of the numeric types but float32 (of the types' sizes on Linux's
# x86-64 and arm64), and the byte order they are read in
_ARRAY_CODES = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 7: "B", 10: "Q", 11: "q", 12: "d"}
_NATIVE = "<" if sys.byteorder == "little" else ">"


def _f32_json(x: float):
    """A float32 as the shortest decimal that round-trips in float32 (numpy's ``str`` of a
    float32); non-finite as text.  Without numpy: a GGUF's scalars are decoded at parse,
    and a mount does not import numpy (docs/internals/copylimit.md)."""
    if not math.isfinite(x):
        return "nan" if math.isnan(x) else ("inf" if x > 0 else "-inf")
    return _f32_shortest(x)


def _f32_shortest(x: float) -> float:
    """The decimal of fewest digits that reads back as the float32 ``x``, the nearer of two,
    the even one of two as near; as numpy's Dragon4 chooses (tests/formats hold it to numpy)."""
    from fractions import Fraction  # here: fractions imports decimal, 3 ms of a mount's start

    if x == 0:
        return x
    bits = struct.unpack("<I", struct.pack("<f", abs(x)))[0]
    value = Fraction(abs(x))
    below = Fraction(struct.unpack("<f", struct.pack("<I", bits - 1))[0])
    above = (value + (value - below) if bits + 1 == 0x7F800000     # the largest: gap as below
             else Fraction(struct.unpack("<f", struct.pack("<I", bits + 1))[0]))
    # what reads back as x: halfway to each neighbour, the halfway points too when x's last
    # bit is even (a tie reads as the even one)
    low, high, even = (below + value) / 2, (value + above) / 2, bits % 2 == 0
    power = math.floor(math.log10(abs(x)))
    if Fraction(10) ** power > value:
        power -= 1
    elif Fraction(10) ** (power + 1) <= value:
        power += 1
    for digits in range(1, 10):
        unit = Fraction(10) ** (power - digits + 1)
        down, up = math.floor(value / unit), math.ceil(value / unit)
        fits = [n for n in dict.fromkeys((down, up))
                if (low <= n * unit <= high if even else low < n * unit < high)]
        if fits:
            if len(fits) == 2:
                nearer = (value - down * unit) - (up * unit - value)
                fits = [down] if nearer < 0 else [up] if nearer > 0 else \
                    [down if down % 2 == 0 else up]
            return math.copysign(float(fits[0] * unit), x)
    raise ValueError(f"no float32 decimal found for {x!r}")     # 9 digits always suffice


def _f64_json(x: float):
    if not math.isfinite(x):
        return "nan" if math.isnan(x) else ("inf" if x > 0 else "-inf")
    return x


def _scalar_json(type_id: int, raw):
    if type_id == _F32:
        return _f32_json(raw)
    if type_id == _F64:
        return _f64_json(raw)
    if type_id == _BOOL:
        return bool(raw)
    return raw


def _f32_list(arr: np.ndarray) -> list:
    """float32 elements as shortest round-trip decimals.  Integers below 2**24 are their
    own shortest form (float32 spacing there is at most 1), so only the rest pays for
    numpy's per-scalar shortest repr."""
    from tensorfs.runtime.libraries import np  # when an array is read, not at parse

    if not bool(np.isfinite(arr).all()):
        return [float(str(x)) if np.isfinite(x) else _f32_json(float(x)) for x in arr]
    wide = arr.astype(np.float64)
    exact = (np.abs(wide) < 2**24) & (wide == np.round(wide))
    values = wide.tolist()
    if bool(exact.all()):
        return values
    for i in np.flatnonzero(~exact).tolist():
        values[i] = float(str(arr[i]))
    return values


def _numeric_list(buf, type_id: int, order: str, n: int, offset: int) -> list:
    if type_id == _F32:
        from tensorfs.runtime.libraries import np  # when such an array is read, not at parse

        return _f32_list(np.frombuffer(buf, dtype=np.dtype(order + "f4"), count=n, offset=offset))
    # the other types through the array module: a tokenizer's integer arrays need no numpy
    arr = array.array(_ARRAY_CODES[type_id])
    arr.frombytes(memoryview(buf)[offset:offset + n * arr.itemsize])
    if order != _NATIVE:
        arr.byteswap()
    values = arr.tolist()
    if type_id == _BOOL:
        return [v != 0 for v in values]
    if type_id == _F64 and not all(map(math.isfinite, values)):
        return [_f64_json(x) for x in values]
    return values


def _decode_array(buf, pos: int, order: str, v1: bool) -> tuple[list, int]:
    """Decodes an already validated array (element type, length, elements) at ``pos``."""
    unpack_u32 = struct.Struct(order + "I").unpack_from
    unpack_len = unpack_u32 if v1 else struct.Struct(order + "Q").unpack_from
    step = 4 if v1 else 8
    elem_type = unpack_u32(buf, pos)[0]
    n = unpack_len(buf, pos + 4)[0]
    pos += 4 + step
    if elem_type == GGUF_STRING:
        out = []
        append = out.append
        for _ in repeat(None, n):
            length = unpack_len(buf, pos)[0]
            pos += step
            append(buf[pos:pos + length].decode("utf-8", "surrogateescape"))
            pos += length
        return out, pos
    if elem_type == GGUF_ARRAY:
        out = []
        for _ in range(n):
            value, pos = _decode_array(buf, pos, order, v1)
            out.append(value)
        return out, pos
    size = GGUF_VALUE_TYPES[elem_type][2]
    return _numeric_list(buf, elem_type, order, n, pos), pos + n * size


def _min_size(type_id: int, v1: bool) -> int:
    """The fewest bytes one value of this type can take."""
    if type_id == GGUF_STRING:
        return 4 if v1 else 8
    if type_id == GGUF_ARRAY:
        return 8 if v1 else 12
    return GGUF_VALUE_TYPES[type_id][2]


def _skip_array(cur: _Cursor, depth: int, key: str) -> str:
    """Validates and skips an array body (element type, length, elements) of metadata
    ``key``; returns its type name.  ``depth`` is its nesting level, 1 at the top."""
    type_at = cur.pos
    elem_type = cur.u32("element type of array '{}'", key)
    if elem_type not in GGUF_VALUE_TYPES:
        raise _error("value_type", f"metadata '{key}' is an array of unknown value type "
                     f"{elem_type}", type_at, key)
    if elem_type == GGUF_ARRAY and depth >= MAX_ARRAY_DEPTH:
        raise _error("nesting", f"metadata '{key}' nests arrays more than {MAX_ARRAY_DEPTH} deep",
                     type_at, key)
    count_at = cur.pos
    n = cur.count("length of array '{}'", key)
    least = n * _min_size(elem_type, cur.v1)
    if least > cur.remaining:
        raise _error("count", f"metadata '{key}' claims {n} array elements, needing at least "
                     f"{least} bytes, but only {cur.remaining} remain", count_at, key)
    if elem_type == GGUF_STRING:
        cur.skip_strings(n, "array '{}'", key)
        return "array[string]"
    if elem_type == GGUF_ARRAY:
        inner = set()
        for _ in range(n):
            inner.add(_skip_array(cur, depth + 1, key))
        # an empty array of arrays, or inner arrays of different types: just "array"
        return f"array[{inner.pop() if len(inner) == 1 else 'array'}]"
    cur.need(least, "array '{}'", key)
    cur.pos += least
    return f"array[{GGUF_VALUE_TYPES[elem_type][0]}]"


def _read_value(cur: _Cursor, type_id: int, key: str, type_at: int) -> MetadataValue:
    buf, order, v1 = cur.buf, cur.order, cur.v1
    if type_id not in GGUF_VALUE_TYPES:
        raise _error("value_type", f"metadata '{key}' has unknown value type {type_id}",
                     type_at, key)
    if type_id == GGUF_STRING:
        start, end = cur.string_bytes("value of metadata '{}'", key)
        text = str(buf[start:end], "utf-8", "surrogateescape")
        return MetadataValue("string", lambda: text, None)
    if type_id == GGUF_ARRAY:
        start = cur.pos
        type_name = _skip_array(cur, 1, key)
        n = cur._len(buf, start + 4)[0]
        def decode() -> object:
            return _decode_array(buf, start, order, v1)[0]
        return MetadataValue(type_name, decode, n)
    value = _scalar_json(type_id, cur.scalar(type_id, "value of metadata '{}'", key))
    return MetadataValue(GGUF_VALUE_TYPES[type_id][0], lambda: value, None)


# ---------------------------------------------------------------------------------------
# The parser.
# ---------------------------------------------------------------------------------------

def _byte_order(cur: _Cursor) -> tuple[str, int]:
    """Reads the version; returns (byte order, version)."""
    cur.need(4, "version")
    raw = bytes(cur.buf[4:8])
    little = int.from_bytes(raw, "little")
    big = int.from_bytes(raw, "big")
    if little in SUPPORTED_VERSIONS:
        return "<", little
    if (little & 0xFFFF) == 0 and big in SUPPORTED_VERSIONS:
        return ">", big
    if (little & 0xFFFF) == 0 and big != 0:
        shown = f"{big} (big-endian)"
    else:
        shown = str(little)
    raise _error("version", f"unsupported GGUF version {shown}; tensorfs reads versions 1, 2 "
                 "and 3", 4)


def parse_gguf(buf, file_size: int, path: str = "<memory>", mtime: float = 0.0) -> ModelFile:
    """Parses and validates the GGUF header in ``buf`` (a prefix of a ``file_size``-byte file).

    Raises ``NeedMoreBytes(n)`` when the header reaches past ``buf`` (n: the prefix length
    needed at least) and ``GGUFError`` for every file it refuses.
    """
    if not isinstance(buf, bytes):
        # one private immutable copy: the lazy decoders must not see a bytearray change or
        # keep a map of the file alive
        buf = bytes(buf)
    probe = _Cursor(buf, file_size, "<", False)
    probe.need(4, "magic")
    if bytes(buf[:4]) != GGUF_MAGIC:
        raise _error("magic", f"not a GGUF file: it starts with {bytes(buf[:4])!r}, not b'GGUF'", 0)
    probe.pos = 4
    order, version = _byte_order(probe)
    v1 = version == 1
    cur = _Cursor(buf, file_size, order, v1)
    cur.pos = 8

    # counts, checked against what the rest of the file could hold
    n_tensors_at = cur.pos
    n_tensors = cur.count("tensor count")
    n_kv_at = cur.pos
    n_kv = cur.count("metadata key-value count")
    min_kv = cur.len_size + 4 + 1          # key length, value type, smallest value
    min_ti = cur.len_size + 4 + 4 + 8      # name length, n_dims, type, offset
    if n_tensors * min_ti > cur.remaining:
        raise _error("count", f"the header claims {n_tensors} tensors, needing at least "
                     f"{n_tensors * min_ti} bytes, but only {cur.remaining} remain", n_tensors_at)
    if n_kv * min_kv > cur.remaining:
        raise _error("count", f"the header claims {n_kv} metadata entries, needing at least "
                     f"{n_kv * min_kv} bytes, but only {cur.remaining} remain", n_kv_at)
    if n_kv * min_kv + n_tensors * min_ti > cur.remaining:
        raise _error("count", f"{n_kv} metadata entries and {n_tensors} tensors need at least "
                     f"{n_kv * min_kv + n_tensors * min_ti} bytes, but only {cur.remaining} remain",
                     n_kv_at)

    # key-value pairs
    metadata: dict[str, MetadataValue] = {}
    key_at: dict[str, int] = {}
    value_type: dict[str, int] = {}
    for i in range(n_kv):
        kv_at = cur.pos
        start, end = cur.string_bytes("metadata key {}", i)
        try:
            key = str(buf[start:end], "utf-8")
        except UnicodeDecodeError:
            raise _error("key", f"metadata key {i} is not valid UTF-8", kv_at) from None
        if not key:
            raise _error("key", f"metadata key {i} is empty", kv_at)
        if key in metadata:
            raise _error("duplicate_key", f"metadata key '{key}' appears twice "
                         f"(first at byte {key_at[key]})", kv_at, key)
        type_at = cur.pos
        type_id = cur.u32("value type of metadata '{}'", key)
        metadata[key] = _read_value(cur, type_id, key, type_at)
        key_at[key] = kv_at
        value_type[key] = type_id

    alignment = DEFAULT_ALIGNMENT
    if "general.alignment" in metadata:
        at = key_at["general.alignment"]
        if value_type["general.alignment"] != 4:
            raise _error("alignment", "general.alignment must be a uint32, not "
                         f"{metadata['general.alignment'].type_name}", at, "general.alignment")
        alignment = metadata["general.alignment"].value()
        if alignment == 0 or alignment & (alignment - 1):
            raise _error("alignment", f"general.alignment is {alignment}, not a power of two",
                         at, "general.alignment")

    # tensor infos: the checks of one record here, placement in _validate_placement
    dim_code = "I" if v1 else "Q"
    records = [struct.Struct(order + dim_code * n + "IQ") for n in range(MAX_DIMS + 1)]
    unpack_u32 = cur._u32
    infos: list[tuple[str, int, tuple[int, ...], int, int]] = []
    names: set[str] = set()
    info_offsets: list[int] = []
    for i in range(n_tensors):
        info_at = cur.pos
        start, end = cur.string_bytes("name of tensor {}", i)
        try:
            name = str(buf[start:end], "utf-8")
        except UnicodeDecodeError:
            raise _error("tensor_name", f"the name of tensor {i} is not valid UTF-8",
                         info_at) from None
        if name in names:
            raise _error("duplicate_tensor", f"tensor '{name}' appears twice", info_at, name)
        names.add(name)
        cur.need(4, "n_dims of tensor '{}'", name)
        n_dims = unpack_u32(buf, cur.pos)[0]
        if n_dims > MAX_DIMS:
            raise _error("n_dims", f"tensor '{name}' has {n_dims} dimensions; ggml allows at most "
                         f"{MAX_DIMS}", cur.pos, name)
        cur.pos += 4
        dims_at = cur.pos
        record = records[n_dims]
        cur.need(record.size, "dims, type and offset of tensor '{}'", name)
        *ne, type_id, rel_offset = record.unpack_from(buf, dims_at)
        cur.pos += record.size
        gt = GGML_TYPES.get(type_id)
        if gt is None:
            raise _error("ggml_type", f"tensor '{name}' has unknown ggml type {type_id}",
                         cur.pos - 12, name)
        elements = 1
        for d in ne:
            if d >= 2**63:
                raise _error("shape", f"tensor '{name}' has a dimension of {d}, negative as "
                             "ggml's int64", dims_at, name)
            elements *= d or 1
        if elements >= MAX_ELEMENTS:
            raise _error("shape", f"tensor '{name}' has too many elements: ne {ne} holds "
                         f"{elements}, at least 2**63 - 1", dims_at, name)
        ne0 = ne[0] if ne else 1
        if ne0 % gt.block_size:
            raise _error("shape", f"tensor '{name}' of type {gt.name} has {ne0} elements per row, "
                         f"not a multiple of the block size {gt.block_size}", dims_at, name)
        if rel_offset % alignment:
            raise _error("offset", f"tensor '{name}' has offset {rel_offset}, not a multiple of "
                         f"the alignment {alignment}", cur.pos - 8, name)
        rows = 1
        for d in ne[1:]:
            rows *= d
        nbytes = ne0 // gt.block_size * gt.type_size * rows
        infos.append((name, type_id, tuple(ne), rel_offset, nbytes))
        info_offsets.append(info_at)

    data_offset = -(-cur.pos // alignment) * alignment
    tensors = tuple(
        TensorInfo(name=name, dtype=GGML_TYPES[type_id].name, shape=ne[::-1],
                   offset=data_offset + rel, nbytes=nbytes, file=path, byte_order=order,
                   ggml_type=type_id)
        for name, type_id, ne, rel, nbytes in infos)
    _validate_placement(tensors, info_offsets, file_size)

    return ModelFile(
        format="gguf", version=version, path=path, file_size=file_size,
        endianness="little" if order == "<" else "big", alignment=alignment,
        header_size=min(data_offset, file_size), metadata=metadata, tensors=tensors, mtime=mtime)


def _validate_placement(tensors: tuple[TensorInfo, ...], info_offsets: list[int],
                        file_size: int) -> None:
    """One walk over the tensors sorted by offset: each must start at or after the end of
    the previous one and end inside the file.  Zero-byte tensors overlap nothing.  Errors
    point at the tensor's info record (its data may lie past the end of the file)."""
    previous: TensorInfo | None = None
    previous_end = 0
    for _, _, i in sorted(zip([t.offset for t in tensors], [t.nbytes for t in tensors],
                              range(len(tensors)))):
        t = tensors[i]
        end = t.offset + t.nbytes
        if t.offset > file_size:
            raise _error("tensor_data", f"tensor '{t.name}' data starts at {t.offset}, past the "
                         f"end of the file ({file_size} bytes)", info_offsets[i], t.name)
        if end > file_size:
            raise _error("tensor_data", f"tensor '{t.name}' data ends at {end}, past the end of "
                         f"the file ({file_size} bytes)", info_offsets[i], t.name)
        if t.nbytes == 0:
            continue
        if previous is not None and t.offset < previous_end:
            raise _error("overlap", f"tensor '{t.name}' data starts at {t.offset}, inside tensor "
                         f"'{previous.name}' (which ends at {previous_end})",
                         info_offsets[i], t.name)
        previous, previous_end = t, end


def kv_spans(header, model_file: ModelFile) -> tuple[dict[str, tuple[int, int]], int]:
    """key -> (start, end) of its whole entry (key, value type, value) in ``header`` (the
    first ``header_size`` bytes of the file ``model_file`` describes), and where the entries
    end: the parser's own walk over the values, for a writer that keeps a value's bytes as
    stored (tensorfs.editing.compose)."""
    order = "<" if model_file.endianness == "little" else ">"
    cur = _Cursor(header, len(header), order, model_file.version == 1)
    cur.pos = 8 + 2 * cur.len_size
    spans = {}
    for i in range(len(model_file.metadata)):
        start = cur.pos
        key_start, key_end = cur.string_bytes("metadata key {}", i)
        key = str(header[key_start:key_end], "utf-8")
        type_at = cur.pos
        _read_value(cur, cur.u32("value type of metadata '{}'", key), key, type_at)
        spans[key] = (start, cur.pos)
    return spans, cur.pos
