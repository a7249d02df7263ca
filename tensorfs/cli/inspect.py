"""``tensorfs inspect``: a model described for a person, as ``gguf_dump`` does it.

A summary (format, sizes, counts, the dtype histogram), then every metadata key with its
type and value, then one row per tensor.  Two promises hold whatever the file holds:

- **Nothing raw reaches the terminal.**  Every name, key, string value and file name goes
  through ``escape``: control characters (C0, DEL, C1), and anything else Python does not
  call printable (format characters such as U+202E, separators, lone surrogates), are
  written as ``\\xNN`` / ``\\uNNNN`` escapes.
- **Output linear in the input.**  Rows are written as they are made, columns are padded to
  at most ``MAX_NAME_COLUMN`` characters (a longer name overflows its column instead of
  widening every other row), long strings are cut, and an array shows its first
  ``ARRAY_HEAD`` elements.

``cmd_inspect`` is the command: the model's headers read (nothing else), then this report or,
with ``--json``, metadata.json as a mount would serve it (``tensorfs.mount.metadata_json``).
"""

from __future__ import annotations

import os
import sys
from typing import Iterator, TextIO

from tensorfs.errors import plural
from tensorfs.errors import printable as escape
from tensorfs.model import Model

MAX_NAME_COLUMN = 48        # tensor names and keys: a column no wider than this
MAX_SHAPE_COLUMN = 24
MAX_STRING_CHARS = 60       # a string value longer than this is cut, its length said
ARRAY_HEAD = 5              # elements of an array shown

def human_bytes(n: int) -> str:
    if n < 1024:
        return plural(n, "byte")
    for unit in ("KiB", "MiB", "GiB", "TiB"):
        n /= 1024
        if n < 1024 or unit == "TiB":
            return f"{n:.1f} {unit}"
    return str(n)


# -- metadata values ------------------------------------------------------------------------

def _cut(text: str) -> str:
    """A string value, quoted and escaped; cut with its length said when long."""
    if len(text) <= MAX_STRING_CHARS:
        return '"' + escape(text).replace('"', '\\"') + '"'
    head = escape(text[:MAX_STRING_CHARS]).replace('"', '\\"')
    return f'"{head}"… ({plural(len(text), "char")})'


def _scalar(value, is_string: bool) -> str:
    if is_string and isinstance(value, str):
        return _cut(value)
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, str):              # a non-finite float: "nan", "inf", "-inf"
        return escape(value)
    if isinstance(value, (int, float)):
        return repr(value)
    return _compact(value, is_string, depth=0)


def _compact(value, is_string: bool, depth: int) -> str:
    """A nested array or a JSON object (index metadata), shown by its first elements."""
    if depth > 2:
        return "…"
    if isinstance(value, list):
        shown = [_compact(v, is_string, depth + 1) if isinstance(v, (list, dict))
                 else _scalar(v, is_string) for v in value[:ARRAY_HEAD]]
        more = ", …" if len(value) > ARRAY_HEAD else ""
        return "[" + ", ".join(shown) + more + "]"
    if isinstance(value, dict):
        items = list(value.items())[:ARRAY_HEAD]
        shown = [f"{_cut(str(k))}: " + (_compact(v, True, depth + 1) if isinstance(v, (list, dict))
                                        else _scalar(v, isinstance(v, str))) for k, v in items]
        more = ", …" if len(value) > ARRAY_HEAD else ""
        return "{" + ", ".join(shown) + more + "}"
    return _scalar(value, is_string)


def describe_value(type_name: str, count: int | None, value) -> str:
    """One metadata value for a person: a scalar in full, a long string cut with its length,
    an array as its length and first elements."""
    # A float's non-finite values are the strings "nan", "inf", "-inf" (as in metadata.json):
    # only those are shown unquoted.
    strings = "float" not in type_name and "number" not in type_name
    if isinstance(value, list):
        n = count if count is not None else len(value)
        head = ", ".join(_compact(v, strings, 1) if isinstance(v, (list, dict)) else _scalar(v, strings)
                         for v in value[:ARRAY_HEAD])
        more = ", …" if n > ARRAY_HEAD else ""
        return f"{plural(n, 'element')}: [{head}{more}]" if n else "0 elements: []"
    return _scalar(value, strings)


# -- the report -----------------------------------------------------------------------------

def _padded(text: str, width: int) -> str:
    return text + " " * (width - len(text)) if len(text) < width else text


def _shape(shape) -> str:
    return "[" + ", ".join(map(str, shape)) + "]"


def summary_lines(model: Model) -> Iterator[str]:
    first = model.files[0]
    version = f" v{first.version}" if first.version is not None else ""
    total_file = sum(f.file_size for f in model.files)
    total = sum(t.nbytes for t in model.tensors)
    histogram: dict[str, int] = {}
    for t in model.tensors:
        histogram[t.dtype] = histogram.get(t.dtype, 0) + 1
    yield f"file:       {escape(model.source)}"
    yield (f"format:     {first.format}{version}, {first.endianness}-endian"
           + (f", alignment {first.alignment}" if first.alignment else ""))
    if len(model.files) > 1:
        yield f"size:       {plural(total_file, 'byte')} in {len(model.files)} shards"
    else:
        yield f"size:       {plural(total_file, 'byte')}, data at byte {first.data_offset}"
    yield f"metadata:   {plural(len(model.metadata), 'key')}"
    yield f"tensors:    {len(model.tensors)}, {plural(total, 'byte')}" + (
        f" ({human_bytes(total)})" if total >= 1024 else "")
    yield "dtypes:     " + (", ".join(f"{escape(d)} {n}" for d, n in
                                      sorted(histogram.items(), key=lambda kv: (-kv[1], kv[0])))
                            or "none")
    yield from gguf_offer_lines(model)
    if len(model.files) > 1:
        for f in model.files:
            yield (f"shard:      {escape(os.path.basename(f.path))}: {f.format}, "
                   f"{plural(f.file_size, 'byte')}, data at byte {f.data_offset}, "
                   f"{plural(len(f.tensors), 'tensor')}")


def gguf_offer_lines(model: Model) -> Iterator[str]:
    """What files/ offers as llama.cpp's converter would write it (tensorfs.hfgguf), or in
    one line why a directory with config.json gets no GGUF."""
    from tensorfs.loading.wholefiles import Companions

    companions = model.companions
    if not isinstance(companions, Companions):
        return
    note = companions.gguf_note
    for f in companions.gguf_files:
        yield f"GGUF:       files/{escape(f.name)}, {plural(f.size, 'byte')}"
    if note:
        yield f"GGUF:       none offered: {escape(note)}"


def metadata_lines(model: Model) -> Iterator[str]:
    if not model.metadata:
        return
    width = min(MAX_NAME_COLUMN, max(len(escape(k)) for k in model.metadata))
    type_width = min(MAX_SHAPE_COLUMN, max(len(v.type_name) for v in model.metadata.values()))
    yield f"{_padded('KEY', width)}  {_padded('TYPE', type_width)}  VALUE"
    for key, value in model.metadata.items():
        shown = describe_value(value.type_name, value.count, value.value())
        yield f"{_padded(escape(key), width)}  {_padded(escape(value.type_name), type_width)}  {shown}"


def tensor_lines(model: Model) -> Iterator[str]:
    tensors = model.tensors
    if not tensors:
        return
    width = min(MAX_NAME_COLUMN, max(len(escape(t.name)) for t in tensors))
    dtype_width = max(5, max(len(t.dtype) for t in tensors))
    shape_width = min(MAX_SHAPE_COLUMN, max(len(_shape(t.shape)) for t in tensors))
    yield (f"{_padded('NAME', width)}  {_padded('DTYPE', dtype_width)}  "
           f"{_padded('SHAPE', shape_width)}  BYTES")
    for t in tensors:
        yield (f"{_padded(escape(t.name), width)}  {_padded(escape(t.dtype), dtype_width)}  "
               f"{_padded(_shape(t.shape), shape_width)}  {t.nbytes}")


def write_report(model: Model, out: TextIO) -> None:
    """The whole report, written line by line: nothing the size of the output is built."""
    started = False
    for section in (summary_lines(model), metadata_lines(model), tensor_lines(model)):
        for i, line in enumerate(section):
            if i == 0 and started:
                out.write("\n")
            out.write(line + "\n")
            started = True


def cmd_inspect(args) -> int:
    from tensorfs.cli.models import no_gc_while_building, settings_of
    from tensorfs.loading.loader import load_model

    with no_gc_while_building():
        model = load_model(args.model, settings_of(args, None))
        model.close()                   # headers only: nothing more is read
    if args.json:
        from tensorfs.mount.metadata_json import metadata_json_pieces
        from tensorfs.mount.tree import describe

        paths, plans = describe(model)
        sys.stdout.flush()
        for piece in metadata_json_pieces(model, paths, plans):     # never one string
            sys.stdout.buffer.write(piece)
        sys.stdout.buffer.flush()
        return 0
    write_report(model, sys.stdout)
    sys.stdout.flush()
    return 0
