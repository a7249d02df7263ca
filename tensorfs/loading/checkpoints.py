"""A PyTorch checkpoint served as the safetensors file it stands for (docs/reference/pytorch.md).

``served(model)`` turns a model whose files are checkpoints (``tensorfs.formats.pytorch``)
into one whose files are their safetensors equivalents, composed without copying
(``tensorfs.editing.compose``'s pieces): a header built here, then each tensor's bytes read
from its storage in the checkpoint when asked (a non-contiguous tensor's gathered, element
by element, as ``tensor.contiguous()`` would lay them out).  Every tensor of the mount is
read through the composed file; the checkpoint itself stays a source of the model, served
whole and unchanged in ``files/``.

Names: ``pytorch_model.bin`` -> ``model.safetensors``, ``pytorch_model-0000N-of-0000M.bin``
-> ``model-0000N-of-0000M.safetensors`` (with a ``model.safetensors.index.json``), any other
``X.bin``/``X.pt``/``X.pth`` -> ``X.safetensors``: the names the Hub's conversion and
``save_pretrained`` give.

Tied weights (two keys, one view of one storage: same dtype, element 0, shape and strides)
are written once, as safetensors' ``convert.py`` does: the first name in sorted order is
kept, each other one is left out of the composed file and named in its ``__metadata__``
(``{"lm_head.weight": "model.embed_tokens.weight"}``), which is ``{"format": "pt"}``
besides.  Unlike ``convert.py``, a partial view of a shared storage (a slice of a fused
matrix) is not dropped: it is written as its own tensor.  The tree serves every key.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import struct
from collections.abc import Callable
from concurrent.futures import Future

from tensorfs.cache import ByteLRU
from tensorfs.editing.compose import ComposedFile, Layout, Piece
from tensorfs.formats import safetensors
from tensorfs.formats.pytorch import ITEMSIZE
from tensorfs.model import Model, ModelFile, TensorInfo
from tensorfs.sources.source import Source

# A non-contiguous tensor up to this size, and a quarter of the cache it is kept in, is
# gathered whole at its first read and kept: the reads of a transposed matrix each touch all
# of its storage.  A larger one is gathered per read, from the span of its storage the rows
# the read asks for reach.
GATHER_KEEP_BYTES = 64 << 20
# the gathered tensors kept where no cache is given (a mount gives its own, --cache-size:
# tensorfs.budget), the most recently read first, GATHER_KEEP_BYTES in all (per process: a
# checkpoint of a hundred transposed matrices does not keep them all)
_GATHERED = ByteLRU(GATHER_KEEP_BYTES)
# Storage read at once while gathering, where a tensor's rows allow (a transposed matrix's
# first row reaches all of its storage: that is read whole)
GATHER_SPAN_BYTES = 16 << 20

_SHARD = re.compile(r"pytorch_model(-\d{5}-of-\d{5})\.bin")


def safetensors_name(name: str) -> str:
    """The name of the safetensors file a checkpoint named ``name`` stands for."""
    if name == "pytorch_model.bin":
        return "model.safetensors"
    match = _SHARD.fullmatch(name)
    if match:
        return f"model{match[1]}.safetensors"
    stem, dot, _ = name.rpartition(".")
    return f"{stem if dot else name}.safetensors"


class BytesSource(Source):
    """A small file made here (an index), served from memory."""

    name: str
    size: int

    def __init__(self, name: str, data: bytes, like: Source):
        self.name = name
        self.data = data
        self.size = len(data)
        self.like = like             # the source whose owner and times it shows

    def read_into(self, offset: int, buf, span=None) -> int:
        part = self.data[offset:offset + len(buf)]
        buf[:len(part)] = part
        return len(part)

    def stat(self):
        return self.like.stat()


class ComposedSource(Source):
    """The safetensors file composed from one checkpoint read through ``checkpoint``: the
    source a checkpoint's tensors are read from.  It owns the checkpoint's source (started,
    aborted and closed with it), which ``files/`` serves whole beside it."""

    name: str
    size: int

    def __init__(self, name: str, composed: ComposedFile, checkpoint: Source):
        self.name = name
        self.composed = composed
        self.size = composed.size
        self.checkpoint = checkpoint
        self.remote = checkpoint.remote
        self.version = checkpoint.version

    @property
    def broken(self):
        return self.checkpoint.broken

    def read_into(self, offset: int, buf, span=None) -> int:
        return self.composed.read_into(offset, memoryview(buf).cast("B"))

    def read_or_wait(self, offset: int, buf, span=None) -> int | Future[int]:
        """A remote checkpoint's storages without a thread (``ComposedFile``)."""
        return self.composed.read_or_wait(offset, memoryview(buf).cast("B"))

    def stat(self):
        return self.checkpoint.stat()

    def vouch(self, offset: int = 0, size: int = 0) -> None:
        self.checkpoint.vouch()

    def start(self, served_once: bool = True) -> None:
        self.checkpoint.start(False)        # its bytes are served twice: here and whole

    def abort(self) -> None:
        self.checkpoint.abort()

    def close(self) -> None:
        self.checkpoint.close()


class _Gathered:
    """A piece's reader (``offset`` inside the tensor): the bytes of a non-contiguous
    tensor, gathered as ``_gather_piece`` says, in the reading thread."""

    def __init__(self, read_into: Callable[[int, memoryview], int]):
        self._read_into = read_into

    def read_into(self, offset: int, buf) -> int:
        return self._read_into(offset, buf)

    def read_or_wait(self, offset: int, buf) -> int:
        return self._read_into(offset, buf)


def _gather_piece(start: int, t: TensorInfo, source: Source, kept: ByteLRU) -> Piece:
    """The bytes of a non-contiguous tensor in row-major order: rows of its first dimension
    gathered from the span of its storage they reach (numpy's strided view of those bytes,
    made contiguous), a few MiB of storage at a time where the rows allow.  ``kept``: the
    cache a tensor gathered whole is kept in."""
    # numpy with the mount of a checkpoint that has such a tensor (a mount of anything
    # else does without it: docs/internals/copylimit.md), not in the middle of a read
    from tensorfs.runtime.libraries import np

    item = ITEMSIZE[t.dtype]
    shape, strides = t.shape, t.strides
    row_elements = 1
    for d in shape[1:]:
        row_elements *= d
    row_bytes = row_elements * item
    row_extent = sum((d - 1) * s for d, s in zip(shape[1:], strides[1:])) + 1   # elements
    per_batch = max(1, GATHER_SPAN_BYTES // max(1, strides[0] * item))
    key = object()                  # this tensor's entry in ``kept``

    def rows(r0: int, r1: int) -> bytes:
        out = []
        for b0 in range(r0, r1, per_batch):
            b1 = min(r1, b0 + per_batch)
            low = b0 * strides[0]
            span = bytearray(((b1 - 1 - b0) * strides[0] + row_extent) * item)
            source.read_into(t.offset + low * item, memoryview(span))
            view = np.lib.stride_tricks.as_strided(
                np.frombuffer(span, dtype=f"V{item}"), (b1 - b0,) + tuple(shape[1:]),
                tuple(s * item for s in strides), writeable=False)
            out.append(np.ascontiguousarray(view).tobytes())
        return b"".join(out)

    def read_into(offset, buf):
        n = len(buf)
        if t.nbytes <= min(GATHER_KEEP_BYTES, kept.max_bytes // 4):
            whole = kept.get(key, lambda: rows(0, shape[0]))
            buf[:] = whole[offset:offset + n]
            return n
        r0 = offset // row_bytes
        r1 = -(-(offset + n) // row_bytes)
        data = rows(r0, r1)
        skip = offset - r0 * row_bytes
        buf[:] = data[skip:skip + n]
        return n
    return Piece(start, t.nbytes, _Gathered(read_into), 0)


def _same_view(t: TensorInfo) -> tuple:
    return (t.file, t.offset, t.dtype, t.shape, t.strides)


def compose_checkpoint(checkpoint: ModelFile, source: Source, path: str,
                       gathered: ByteLRU | None = None):
    """(the composed file; its ModelFile: ``checkpoint``'s path, every key of the checkpoint
    at its offset in the composed file; the names the composed file holds).  ``gathered``: where
    gathered tensors are kept (default: this process's own, ``_GATHERED``)."""
    kept: dict[tuple, TensorInfo] = {}
    for t in sorted(checkpoint.tensors, key=lambda t: t.name):
        kept.setdefault(_same_view(t), t)
    written = [t for t in checkpoint.tensors if kept[_same_view(t)] is t]
    meta = {"format": "pt"}
    for t in sorted(checkpoint.tensors, key=lambda t: t.name):
        first = kept[_same_view(t)]
        if first is not t:
            meta[t.name] = first.name
    doc: dict = {"__metadata__": meta}
    at = 0
    for t in written:
        doc[t.name] = {"dtype": t.dtype, "shape": list(t.shape),
                       "data_offsets": [at, at + t.nbytes]}
        at += t.nbytes
    raw = json.dumps(doc, separators=(",", ":"), ensure_ascii=False).encode("utf-8",
                                                                            "surrogatepass")
    raw += b" " * (-len(raw) % 8)
    head = struct.pack("<Q", len(raw)) + raw
    pieces = []
    start = 0                       # from the data's start, which follows the header
    for t in written:
        if t.strides is None:
            pieces.append(Piece(start, t.nbytes, source, t.offset))
        else:
            pieces.append(_gather_piece(start, t, source, gathered if gathered is not None else _GATHERED))
        start += t.nbytes
    composed_file = safetensors.parse_safetensors(head, len(head) + start, path=path,
                                                  mtime=checkpoint.mtime)
    where = {t.name: t for t in composed_file.tensors}
    every = tuple(where[kept[_same_view(t)].name]._replace(name=t.name)
                  for t in checkpoint.tensors)
    # the file as the mount describes it: every key of the checkpoint (a tied one at the
    # bytes of the name written), its own metadata
    composed_file = dataclasses.replace(composed_file, format="pytorch", tensors=every,
                                        metadata=checkpoint.metadata)
    layout = Layout([], pieces, [p.start for p in pieces], start, b"")
    return (ComposedFile(head, len(head), layout, lambda: composed_file), composed_file,
            [t.name for t in written])


def served(model: Model, gathered: ByteLRU | None = None) -> Model:
    """``model`` as a mount serves it: each checkpoint's ``ModelFile`` (same path, format
    "pytorch") describes its composed safetensors file, whose ``ComposedSource`` takes the
    checkpoint's place in ``model.sources``; a sharded one's ``model.safetensors.index.json``
    is a source of its own.  Any other model: itself.  ``gathered``: where gathered tensors are
    kept (a mount's cache)."""
    if not model.files or model.files[0].format != "pytorch":
        return model
    sources = dict(model.sources)
    files = []
    tensors = []
    written_names: dict[str, list] = {}
    for f in model.files:
        checkpoint = sources[f.path]
        name = os.path.join(os.path.dirname(f.path), safetensors_name(os.path.basename(f.path)))
        composed, composed_file, written = compose_checkpoint(f, checkpoint, f.path, gathered)
        written_names[f.path] = written
        sources[f.path] = ComposedSource(name, composed, checkpoint)
        files.append(composed_file)
        tensors.extend(composed_file.tensors)
    if len(files) > 1:
        first = sources[files[0].path]
        index = os.path.join(os.path.dirname(first.name), "model.safetensors.index.json")
        weight_map = {name: os.path.basename(sources[f.path].name)
                      for f in files for name in written_names[f.path]}
        total = sum(f.file_size - f.header_size for f in files)
        data = json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map},
                          indent=2).encode() + b"\n"
        sources[index] = BytesSource(index, data, first)
    return dataclasses.replace(model, files=tuple(files), tensors=tuple(tensors),
                               sources=sources)
