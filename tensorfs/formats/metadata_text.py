"""The text of a metadata value, both ways: what a file of ``metadata/`` shows for a value
(``scalar_text``, ``render_lines``; docs/reference/shards-and-metadata.md, "metadata/")
and the value a new text stands for in a key's type (``parse_text``, the inverse), the types
a key may have (``SCALAR_TYPES``, ``valid_type``), and a value as one line of JSON
(``json_line``, shared with metadata.json).  Values only: the file names of metadata/ are
``tensorfs.mount.metadata_files``'s.
"""

from __future__ import annotations

import json
import math
import re

from tensorfs.formats.gguf_write import INT_RANGES
from tensorfs.model import MetadataValue

_ESCAPES = {"\\": "\\\\", "\n": "\\n", "\r": "\\r", "\t": "\\t"}
_NEEDS_ESCAPE = re.compile("[\\\\\x00-\x1f\x7f\ud800-\udfff]")
_NEEDS_ESCAPE_BUT_NEWLINE = re.compile("[\\\\\x00-\x09\x0b-\x1f\x7f\ud800-\udfff]")
_SEPARATOR = "\ue000"                   # a private-use character: almost never in a token
_NUMERIC_ARRAYS = frozenset(f"array[{t}]" for t in (
    "uint8", "int8", "uint16", "int16", "uint32", "int32", "uint64", "int64",
    "float32", "float64"))
_NONFINITE = re.compile(r'"(?:[^"\\]|\\.)*"|(-?Infinity|NaN)', re.S)
_NONFINITE_TEXT = {"NaN": '"nan"', "Infinity": '"inf"', "-Infinity": '"-inf"'}


# -- JSON of a value ------------------------------------------------------------------------

def fix_nonfinite(text: str) -> str:
    """JSON text whose bare NaN / Infinity tokens (outside strings) are made strings."""
    if "NaN" not in text and "Infinity" not in text:
        return text
    return _NONFINITE.sub(lambda m: _NONFINITE_TEXT[m.group(1)] if m.group(1) else m.group(0),
                          text)


def compact_json(value, ensure_ascii: bool = False) -> str:
    """A whole value on one line (deeply nested index metadata): json.dumps at C speed, its
    bare NaN / Infinity tokens (outside strings) then turned into strings."""
    return fix_nonfinite(json.dumps(value, ensure_ascii=ensure_ascii))


def json_line(value) -> str:
    """``value`` as one line of strict JSON that encodes to UTF-8 (metadata/ files)."""
    text = compact_json(value)
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        return compact_json(value, ensure_ascii=True)


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
    return json_line(value)


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


def is_array(value: MetadataValue) -> bool:
    return value.count is not None or value.type_name.startswith("array")


# -- text back to values (an edited metadata/ file) ----------------------------------------

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
        if len(word.lstrip("+-").lstrip("0")) > 20:     # beyond any range (and int()'s limit)
            raise TextError(f"{word[:40]}... is out of range for {type_name} ({low} to {high})")
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
            from tensorfs.runtime.libraries import np

            with np.errstate(over="ignore"):
                narrow = np.float32(value)
            if abs(value) != float("inf") and not np.isfinite(narrow):
                raise TextError(f"{word[:40]} is out of range for float32")
            value = float(str(narrow))
        if value in (float("inf"), float("-inf")):
            return "inf" if value > 0 else "-inf"
        return value
    if type_name.startswith("array["):           # an element that is itself an array
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


def valid_type(type_name: str, fmt: str) -> bool:
    """Whether a key of a ``fmt`` model may have type ``type_name`` (a safetensors model's
    metadata is strings only)."""
    if fmt == "safetensors":
        return type_name == "string"
    base = type_name
    while base.startswith("array[") and base.endswith("]"):
        base = base[len("array["):-1]
    return base in SCALAR_TYPES
