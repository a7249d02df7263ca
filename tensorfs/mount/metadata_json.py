"""The document behind metadata.json and ``tensorfs inspect --json`` (docs/reference/metadata-json.md).

The text is written piece by piece (``metadata_json_pieces``), never as one string: a
document of hundreds of MB (a 100k-tensor model, a big vocabulary) is served by
``tensorfs.views.byteviews.GeneratedView`` in blocks, and generating it holds one piece at a time
besides the model.  The text is what ``json.dumps(doc, indent=2, ensure_ascii=False)``
writes, with three differences, each so that any model gives strict JSON at a cost linear
in its size:

- a container nested deeper than ``MAX_INDENTED_LEVEL`` (only index metadata can nest
  so: a GGUF value is at most an array of arrays of arrays) is written on one line, since
  indentation grows with depth and would make the text quadratic in it;
- a non-finite float (index metadata may hold ``NaN``, ``Infinity``, or ``1e999``) is the
  string ``"nan"``, ``"inf"`` or ``"-inf"``, as GGUF floats already are: bare ``NaN`` is not
  JSON, and ``json.loads(..., parse_constant=<raise>)`` must accept the file;
- a lone surrogate (an index's ``"\\ud800"``) is written as its ``\\uXXXX`` escape, the rest
  of the text staying UTF-8; ``json.loads`` gives the same string back.
"""

from __future__ import annotations

import json
import math
import os
import re
from typing import Iterator

from tensorfs.convert.plan import ViewPlan
from tensorfs.formats.metadata_text import compact_json, fix_nonfinite
from tensorfs.model import Model
from tensorfs.sources.urls import is_url

MAX_INDENTED_LEVEL = 5          # root 1, "metadata" 2, a value 3, its elements 4, theirs 5
PIECE_CHARS = 64 << 10          # about how much text one piece holds
_LIST_RUN = 4096                # scalars of a list encoded by one json.dumps call
_SCALAR_TYPES = frozenset((str, int, float, bool, type(None)))

_SURROGATE = re.compile("[\ud800-\udfff]")


class _LazyObject:
    """A JSON object whose items are made when the writer reaches them."""

    __slots__ = ("items",)

    def __init__(self, items):
        self.items = items          # a function returning an iterable of (key, value)


def _document(model: Model, paths: dict, plans: dict[str, ViewPlan],
              views: tuple[str, ...] = ("raw", "npy")) -> _LazyObject:
    first = model.files[0]

    def top():
        yield "format", first.format
        yield "version", first.version
        yield "file", os.path.basename(model.source)
        yield "file_size", sum(f.file_size for f in model.files)
        yield "endianness", first.endianness
        yield "alignment", first.alignment
        yield "data_offset", first.data_offset
        yield "metadata", _LazyObject(
            lambda: ((key, value.value()) for key, value in model.metadata.items()))
        yield "metadata_types", _LazyObject(
            lambda: ((key, value.type_name) for key, value in model.metadata.items()))
        remote = model.url is not None or is_url(model.source)
        if remote:  # docs/reference/remote.md: the URL as named (no credentials), the version each file had
            yield "source", model.url or model.source
            if not model.sharded:       # "version" is the format's (GGUF 3)
                yield "source_version", _version(model, first)
        if model.sharded:
            shards = [{"file": os.path.basename(f.path), "size": f.file_size,
                       "format": f.format, "data_offset": f.data_offset}
                      for f in model.files]
            if remote:
                for entry, f in zip(shards, model.files):
                    entry["version"] = _version(model, f)
            yield "shards", shards
        yield "tensors", _LazyObject(lambda: ((t.name, _tensor_entry(model, t, paths, plans))
                                              for t in model.tensors))
        if tuple(views) != ("raw", "npy"):  # a mount --views raw or npy says what it serves
            yield "views", list(views)

    return _LazyObject(top)


def _version(model: Model, f) -> str | None:
    source = model.sources.get(f.path)
    return source.version if source is not None else None


def _tensor_entry(model: Model, tensor, paths: dict, plans: dict) -> dict:
    plan = plans[tensor.name]
    entry = {
        "dtype": tensor.dtype,
        "shape": list(tensor.shape),
        "offset": tensor.offset,
        "nbytes": tensor.nbytes,
        "path": paths[tensor.name].raw,
        "npy_dtype": plan.npy_dtype,
        "converted": plan.kind == "converted",
    }
    if plan.kind is None:
        entry["raw_only"] = plan.reason
    if model.sharded:
        entry["shard"] = os.path.basename(tensor.file)
    return entry


def metadata_document(model: Model, paths: dict, plans: dict[str, ViewPlan],
                      views: tuple[str, ...] = ("raw", "npy")) -> dict:
    """The document as Python objects (what ``json.loads`` of metadata.json gives, except
    that non-finite floats of index metadata are still floats here)."""
    def materialize(value):
        if isinstance(value, _LazyObject):
            return {key: materialize(item) for key, item in value.items()}
        return value
    return materialize(_document(model, paths, plans, views))


def metadata_json_pieces(model: Model, paths: dict, plans: dict[str, ViewPlan],
                         views: tuple[str, ...] = ("raw", "npy")) -> Iterator[bytes]:
    """metadata.json, as UTF-8 pieces of about ``PIECE_CHARS`` characters."""
    return json_pieces(_document(model, paths, plans, views))


def metadata_json_bytes(doc) -> bytes:
    """The whole text of ``doc`` (a dict, or what ``metadata_document`` gives)."""
    return b"".join(json_pieces(doc))


# -- the writer -----------------------------------------------------------------------------

_encode_str = json.encoder.encode_basestring          # C speed; what json.dumps calls
_CONSTANTS = {True: "true", False: "false", None: "null"}


def _scalar(value) -> str:
    kind = type(value)
    if kind is str:
        return _encode_str(value)
    if kind is int:
        return int.__repr__(value)
    if kind is float:
        if math.isfinite(value):
            return float.__repr__(value)
        return '"nan"' if math.isnan(value) else ('"inf"' if value > 0 else '"-inf"')
    if value is True or value is False or value is None:
        return _CONSTANTS[value]
    return fix_nonfinite(json.dumps(value, ensure_ascii=False))


def _is_scalar(value) -> bool:
    return type(value) in _SCALAR_TYPES


def _flat_text(value: dict, level: int) -> str | None:
    """A dict whose values are scalars or lists of scalars (a tensor's entry) as one
    string, exactly as the general walk writes it; None for any other dict."""
    inner = "\n" + "  " * level
    deeper = inner + "  "
    parts = []
    for key, item in value.items():
        if type(item) in _SCALAR_TYPES:
            text = _scalar(item)
        elif type(item) is list and level + 1 <= MAX_INDENTED_LEVEL and \
                all(type(x) in _SCALAR_TYPES for x in item):
            text = "[" + deeper + ("," + deeper).join(map(_scalar, item)) + inner + "]" \
                if item else "[]"
        else:
            return None
        parts.append(_encode_str(str(key)) + ": " + text)
    if not parts:
        return "{}"
    return "{" + inner + ("," + inner).join(parts) + "\n" + "  " * (level - 1) + "}"


def _encode(text: str) -> bytes:
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:          # lone surrogates: only ever inside JSON strings
        return _SURROGATE.sub(lambda m: f"\\u{ord(m.group()):04x}", text).encode("utf-8")


def json_pieces(doc) -> Iterator[bytes]:
    """``doc`` (dicts, lists, scalars and ``_LazyObject``s) as indented JSON text, in pieces."""
    out: list[str] = []
    length = 0
    for text in _flatten(doc):
        out.append(text)
        length += len(text)
        if length >= PIECE_CHARS:
            yield _encode("".join(out))
            out, length = [], 0
    out.append("\n")
    yield _encode("".join(out))


def _flatten(doc) -> Iterator[str]:
    """The text of ``doc``: an explicit stack of generators rather than recursion (the
    document nests as deep as its index metadata does)."""
    stack = [_walk(doc, 1)]
    while stack:
        item = next(stack[-1], None)
        if item is None:
            stack.pop()
        elif isinstance(item, str):
            yield item
        else:
            stack.append(item)


def _walk(value, level: int):
    """Yields text, and generators for nested containers (``_flatten`` runs them)."""
    if isinstance(value, (dict, _LazyObject)):
        items = value.items() if isinstance(value, dict) else value.items()
        if level > MAX_INDENTED_LEVEL:
            yield compact_json(dict(items) if isinstance(value, _LazyObject) else value)
            return
        if type(value) is dict:
            text = _flat_text(value, level)
            if text is not None:
                yield text
                return
        inner = "\n" + "  " * level
        first = True
        for key, item in items:
            yield ("{" if first else ",") + inner + _encode_str(str(key)) + ": "
            first = False
            if type(item) in _SCALAR_TYPES:
                yield _scalar(item)
            elif type(item) is dict and level + 1 <= MAX_INDENTED_LEVEL and \
                    (text := _flat_text(item, level + 1)) is not None:
                yield text
            else:
                yield _walk(item, level + 1)
        yield "{}" if first else "\n" + "  " * (level - 1) + "}"
    elif isinstance(value, (list, tuple)):
        if level > MAX_INDENTED_LEVEL:
            yield compact_json(value)
            return
        if not value:
            yield "[]"
            return
        inner = "\n" + "  " * level
        n = len(value)
        types = set(map(type, value))
        if types <= _SCALAR_TYPES:      # a vocabulary, a float array: runs at C speed
            for start in range(0, n, _LIST_RUN):
                text = json.dumps(value[start:start + _LIST_RUN], ensure_ascii=False,
                                  separators=("," + inner, ": "))
                if float in types:
                    text = fix_nonfinite(text)
                yield ("[" if start == 0 else ",") + inner + text[1:-1]
        else:
            for i, item in enumerate(value):
                yield ("[" if i == 0 else ",") + inner
                if isinstance(item, (dict, list, tuple, _LazyObject)):
                    yield _walk(item, level + 1)
                else:
                    yield _scalar(item)
        yield "\n" + "  " * (level - 1) + "]"
    else:
        yield _scalar(value)
