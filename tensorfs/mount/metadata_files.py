"""The ``metadata/`` directory (docs/shards-and-metadata.md): one file per metadata key, made on first use.

The user's version of these rules is docs/shards-and-metadata.md.

* **File name**: the whole key, escaped like one tensor-name component (``%``, ``/``, control
  characters and undecodable bytes as ``%XX``; the empty key is ``%``; over 200 bytes it is
  shortened with a hash) but dots are kept: ``metadata/tokenizer.ggml.tokens``.  The keys
  ``.`` and ``..`` have their dots written ``%2E``.  Flat: the directory has no subdirectories.
* **Scalars**: the value's text plus one ``\\n``.  A string is written verbatim (its bytes
  as stored, a multi-line chat template stays multi-line): the value is the file minus its
  last byte.  Integers in decimal; floats as the shortest text that round-trips in their
  stored width (``repr`` of the value ``metadata.json`` holds; ``nan``, ``inf``, ``-inf``);
  booleans ``true`` / ``false``; JSON null ``null``; a JSON object (index metadata) as one
  line of JSON.
* **Arrays**: one element per line, every line ending in ``\\n`` (``wc -l`` is the element
  count, an empty array is an empty file, line N is element N - 1).  A string element is
  escaped so that it stays one line: ``\\`` -> ``\\\\``, newline -> ``\\n``, CR -> ``\\r``,
  tab -> ``\\t``, other control characters (U+0000-U+001F, U+007F) -> ``\\xNN``, and a byte
  that is not UTF-8 (a vocabulary may hold such) -> ``\\xNN`` of that byte; everything else
  is the UTF-8 text itself.  ``codecs.escape_decode(line)[0]`` gives the element's bytes
  back.  Numbers and booleans as for scalars; an element that is itself an array (GGUF
  nested arrays) or an object is one line of JSON.

Scalars are ``GeneratedView``s.  Arrays are ``ArrayTextView``s: a ``GeneratedView`` whose
text is made in chunks of ``CHUNK_ELEMENTS`` elements from one decode of the array, kept in
the shared LRU in blocks; the first stat renders the text once to learn its length, and a
sequential read costs one more decode and render whatever ``--cache-size`` is (the view's
cursor continues where the last block ended, see ``tensorfs.views.byteviews.GeneratedView``).
"""

from __future__ import annotations

import math
import re
from collections.abc import Hashable

from tensorfs.cache import ByteLRU
from tensorfs.formats.gguf_write import INT_RANGES
from tensorfs.model import MetadataValue, Model
from tensorfs.mount.metadata_json import json_line
from tensorfs.views.byteviews import GeneratedView
from tensorfs.views.names import Tree, entry_name

DIRECTORY = "metadata"
CHUNK_ELEMENTS = 4096

_ESCAPES = {"\\": "\\\\", "\n": "\\n", "\r": "\\r", "\t": "\\t"}
_NEEDS_ESCAPE = re.compile("[\\\\\x00-\x1f\x7f\ud800-\udfff]")
_NEEDS_ESCAPE_BUT_NEWLINE = re.compile("[\\\\\x00-\x09\x0b-\x1f\x7f\ud800-\udfff]")
_SEPARATOR = "\ue000"                   # a private-use character: almost never in a token
_NUMERIC_ARRAYS = frozenset(f"array[{t}]" for t in (
    "uint8", "int8", "uint16", "int16", "uint32", "int32", "uint64", "int64",
    "float32", "float64"))


def metadata_file_name(key: str) -> str:
    """The file name of ``key`` inside ``metadata/``."""
    return entry_name(key)


# -- text of values -----------------------------------------------------------------------

def _escape_char(match: re.Match) -> str:
    ch = match.group()
    named = _ESCAPES.get(ch)
    if named is not None:
        return named
    code = ord(ch)
    if 0xDC80 <= code <= 0xDCFF:                 # an undecodable byte (surrogateescape)
        return f"\\x{code - 0xDC00:02x}"
    if 0xD800 <= code <= 0xDFFF:                 # a lone surrogate from a JSON \u escape
        return "".join(f"\\x{b:02x}" for b in ch.encode("utf-8", "surrogatepass"))
    return f"\\x{code:02x}"


def escape_element(text: str) -> str:
    """A string array element as one line (no newline at the end)."""
    return _NEEDS_ESCAPE.sub(_escape_char, text)


def _json_line(value) -> str:
    return json_line(value)


def format_element(value) -> str:
    """One array element (or a non-string scalar) as text, without a newline."""
    if isinstance(value, str):
        return escape_element(value)
    if value is True:
        return "true"
    if value is False:
        return "false"
    if value is None:
        return "null"
    if isinstance(value, (int, float)):
        return repr(value)
    return _json_line(value)


def scalar_text(value: object) -> bytes:
    """The content of a scalar's file."""
    if isinstance(value, str):
        try:
            return value.encode("utf-8", "surrogateescape") + b"\n"
        except UnicodeEncodeError:
            return value.encode("utf-8", "surrogatepass") + b"\n"
    return (format_element(value) + "\n").encode("utf-8")


def render_lines(items: list, type_name: str) -> bytes:
    """Array elements, one per line, each line ending in a newline."""
    if not items:
        return b""
    if type_name == "array[string]":
        text = "\n".join(items)
        if (_NEEDS_ESCAPE_BUT_NEWLINE.search(text) is not None
                or text.count("\n") != len(items) - 1):
            # Escape the chunk in one pass, with a separator no element holds.
            text = _SEPARATOR.join(items)
            if text.count(_SEPARATOR) == len(items) - 1:
                text = _NEEDS_ESCAPE.sub(_escape_char, text).replace(_SEPARATOR, "\n")
            else:
                text = "\n".join([_NEEDS_ESCAPE.sub(_escape_char, s) for s in items])
    elif type_name in _NUMERIC_ARRAYS:
        text = "\n".join(map(str, items))        # str(float) is its repr; "nan" stays "nan"
    else:
        text = "\n".join(map(format_element, items))
    return (text + "\n").encode("utf-8")


# -- views --------------------------------------------------------------------------------

class ArrayTextView(GeneratedView):
    """An array's text, one element per line, rendered ``CHUNK_ELEMENTS`` elements at a
    time: a ``GeneratedView`` whose producer decodes the array once and yields its lines
    chunk by chunk, so the whole text never exists as one object and reading it costs one
    decode whatever the cache holds."""

    def __init__(self, cache: ByteLRU, key: Hashable, value: MetadataValue):
        super().__init__(cache, key, lambda: self._pieces())
        self.value = value

    def _pieces(self):
        items = self.value.value()
        for start in range(0, len(items), CHUNK_ELEMENTS):
            yield render_lines(items[start:start + CHUNK_ELEMENTS], self.value.type_name)


def is_array(value: MetadataValue) -> bool:
    return value.count is not None or value.type_name.startswith("array")


def metadata_view(cache: ByteLRU, key: str, value: MetadataValue, version: int = 0):
    """``version``: which edit of the key this is (an edited mount), so that the text of an
    earlier value kept in the cache is never served for a later one."""
    cache_key = (DIRECTORY, key) if not version else (DIRECTORY, key, version)
    if is_array(value):
        return ArrayTextView(cache, cache_key, value)
    return GeneratedView(cache, cache_key, lambda: scalar_text(value.value()))


def add_metadata_files(tree: Tree, model: Model, cache: ByteLRU) -> None:
    """``metadata/`` with one file per key of ``model.metadata`` (the directory always exists)."""
    tree.add_dir(DIRECTORY)
    for key, value in model.metadata.items():
        tree.add_file(f"{DIRECTORY}/{metadata_file_name(key)}", metadata_view(cache, key, value))


# -- text back to values (an edited file: tensorfs.mount.editable) ----------------------------------

class TextError(ValueError):
    """A metadata file's new text that does not read as a value of the key's type: one line."""


_FLOAT_TYPES = ("float32", "float64")
SCALAR_TYPES = ("string", "bool", *INT_RANGES, *_FLOAT_TYPES)


def _element(text: str, type_name: str):
    """One scalar or array element of ``type_name`` from its text (as ``format_element``
    writes it), in the JSON-ready form ``MetadataValue.value()`` gives."""
    if type_name == "string":
        return text
    word = text.strip()
    if type_name == "bool":
        if word in ("true", "false"):
            return word == "true"
        raise TextError(f"{word[:40]!r} is not a bool (true or false)")
    if type_name in INT_RANGES:
        low, high = INT_RANGES[type_name]
        if not re.fullmatch(r"[+-]?[0-9]+", word):
            raise TextError(f"{word[:40]!r} is not an integer")
        value = int(word)
        if not low <= value <= high:
            raise TextError(f"{value} is out of range for {type_name} ({low} to {high})")
        return value
    if type_name in _FLOAT_TYPES:
        try:
            value = float(word)
        except ValueError:
            raise TextError(f"{word[:40]!r} is not a number") from None
        if math.isnan(value):
            return "nan"
        if type_name == "float32":
            import numpy as np
            with np.errstate(over="ignore"):
                narrow = np.float32(value)
            if abs(value) != float("inf") and not np.isfinite(narrow):
                raise TextError(f"{word[:40]} is out of range for float32")
            value = float(str(narrow))
        if value in (float("inf"), float("-inf")):
            return "inf" if value > 0 else "-inf"
        return value
    if type_name.startswith("array["):           # an element that is itself an array
        import json
        try:
            items = json.loads(word)
        except ValueError:
            raise TextError(f"{word[:40]!r} is not a JSON array") from None
        if not isinstance(items, list):
            raise TextError(f"{word[:40]!r} is not a JSON array")
        inner = type_name[len("array["):-1]
        return [_element(json.dumps(x) if not isinstance(x, str) or inner != "string" else x,
                         inner) for x in items]
    raise TextError(f"values of type {type_name} cannot be written")


def parse_text(type_name: str, data: bytes):
    """The value a metadata file's new content stands for, read in the key's type: the
    inverse of what the file shows (``scalar_text``, ``render_lines``).  A string is the
    content less one final newline; an array is one element per line.  ``TextError`` (one
    line) when the text is not a value of that type."""
    if type_name == "string":
        return data.removesuffix(b"\n").decode("utf-8", "surrogateescape")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise TextError("the text is not UTF-8") from None
    if not type_name.startswith("array["):
        text = text.removesuffix("\n")
        if "\n" in text:
            raise TextError(f"a {type_name} is one line")
        return _element(text, type_name)
    inner = type_name[len("array["):-1]
    if inner in ("array", ""):
        raise TextError(f"an {type_name} of mixed element types cannot be written")
    if not text:
        return []
    lines = text.removesuffix("\n").split("\n")
    if inner == "string":
        import codecs
        out = []
        for line in lines:
            try:
                raw = codecs.escape_decode(line.encode("utf-8", "surrogateescape"))[0]
            except ValueError as error:
                raise TextError(f"line {len(out) + 1}: {error}") from None
            out.append(raw.decode("utf-8", "surrogateescape"))
        return out
    values = []
    for number, line in enumerate(lines, 1):
        try:
            values.append(_element(line, inner))
        except TextError as error:
            raise TextError(f"line {number}: {error}") from None
    return values
