"""The converter's GGUF composed without a copy (``tensorfs.editing.compose``'s pieces): the
header made by ``tensorfs.hfgguf.convert``, then each tensor's bytes at the next multiple
of the alignment, zeros between:

- a tensor whose bytes are the source's (a matrix in its own type): a byte range of the
  source file, read when asked;
- llama's q/k rope permutation in its own type: whole rows of the source, gathered on read;
- anything else (widened to F32, rounded to F16/BF16, quantized to Q8_0, gemma's +1):
  computed on read, a chunk of whole rows at a time, with gguf-py's own ``quants.quantize``
  (what the converter calls), kept in a byte cache; small tensors (norms, biases,
  rope_freqs) whole, once.
"""

from __future__ import annotations

import dataclasses
import errno
import logging
import threading
from concurrent.futures import Future

from tensorfs.cache import ByteLRU
from tensorfs.editing.compose import ComposedFile, Layout, Piece
from tensorfs.hfgguf.convert import OutTensor, Plan, permute_rows, row_bytes
from tensorfs.model import ModelFile
from tensorfs.sources.source import Source, SourceError

log = logging.getLogger("tensorfs")

# computed bytes are made this many output bytes of whole rows at a time, at least one row
CHUNK_BYTES = 4 << 20
# the computed chunks kept, per daemon
_COMPUTED = ByteLRU(64 << 20)
# tensors up to this size are computed whole and kept for the mount's life
SMALL_BYTES = 1 << 20


def _element_bytes(dtype: str) -> int:
    return 4 if dtype == "F32" else 2


class _Rows:
    """A piece's reader for a tensor whose bytes are the source's rows, in another order:
    each output row a whole row of the source."""

    def __init__(self, t: OutTensor, source: Source):
        assert t.source is not None and t.perm is not None
        self.source = source
        self.offset = t.source.offset
        rows, cols = t.rows_cols
        self.row = cols * _element_bytes(t.source.dtype)
        self.order = permute_rows(t.perm[1], t.perm[0])

    def read_into(self, offset: int, buf) -> int:
        n = len(buf)
        done = 0
        while done < n:
            r, inside = divmod(offset + done, self.row)
            take = min(self.row - inside, n - done)
            at = self.offset + self.order[r] * self.row + inside
            self.source.read_into(at, buf[done:done + take])
            done += take
        return n

    def read_or_wait(self, offset: int, buf) -> int | Future[int]:
        return self.read_into(offset, buf)


class _Computed:
    """A piece's reader for a tensor computed from the source: chunks of whole rows made
    with ``quants.quantize`` and kept in ``_COMPUTED`` (a small tensor: whole, held)."""

    def __init__(self, t: OutTensor, source: Source | None):
        self.t = t
        self.source = source
        rows, cols = t.rows_cols
        self.rows, self.cols = rows, cols
        self.out_row = row_bytes(t.qtype, cols)
        self.per_chunk = max(1, CHUNK_BYTES // max(1, self.out_row))
        self.order = permute_rows(t.perm[1], t.perm[0]) if t.perm is not None else None
        self._whole: bytes | None = None
        self._lock = threading.Lock()
        self.key = object()

    def _make(self, r0: int, r1: int) -> bytes:
        from tensorfs.runtime.libraries import gguf, np
        GGMLQuantizationType, quants = gguf.GGMLQuantizationType, gguf.quants

        t = self.t
        if t.values is not None:
            data = np.asarray(t.values)[r0:r1] if t.values.ndim else t.values
            return quants.quantize(data.astype(np.float32), GGMLQuantizationType(t.qtype)).tobytes()
        src = t.source
        assert src is not None and self.source is not None
        item = _element_bytes(src.dtype)
        in_row = self.cols * item
        if self.order is None:
            raw = bytearray((r1 - r0) * in_row)
            self.source.read_into(src.offset + r0 * in_row, memoryview(raw))
        else:
            raw = bytearray((r1 - r0) * in_row)
            view = memoryview(raw)
            for i, r in enumerate(range(r0, r1)):
                self.source.read_into(src.offset + self.order[r] * in_row,
                                      view[i * in_row:(i + 1) * in_row])
        if src.dtype == "BF16":
            values = (np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16).view(np.float32)
        elif src.dtype == "F16":
            values = np.frombuffer(raw, dtype="<f2")
        else:
            values = np.frombuffer(raw, dtype="<f4")
        values = values.reshape(r1 - r0, self.cols)
        if t.shift:
            values = values + values.dtype.type(t.shift)
        return quants.quantize(values, GGMLQuantizationType(t.qtype)).tobytes()

    def _chunk(self, c: int) -> bytes:
        r0 = c * self.per_chunk
        r1 = min(self.rows, r0 + self.per_chunk)
        return _COMPUTED.get((self.key, c), lambda: self._make(r0, r1))

    def read_into(self, offset: int, buf) -> int:
        n = len(buf)
        if self.t.nbytes <= SMALL_BYTES:
            with self._lock:
                if self._whole is None:
                    self._whole = self._make(0, self.rows)
            buf[:] = self._whole[offset:offset + n]
            return n
        done = 0
        chunk_bytes = self.per_chunk * self.out_row
        while done < n:
            c, inside = divmod(offset + done, chunk_bytes)
            data = self._chunk(c)
            take = min(len(data) - inside, n - done)
            buf[done:done + take] = data[inside:inside + take]
            done += take
        return n

    def read_or_wait(self, offset: int, buf) -> int | Future[int]:
        return self.read_into(offset, buf)


def compose(plan: Plan, sources: dict, path: str) -> ComposedFile:
    """The file ``plan`` describes, its tensors read from ``sources`` (by model file
    path)."""
    pieces = []
    at = 0
    placed = []
    for t in plan.tensors:
        at += -at % plan.alignment
        source = sources[t.source.file] if t.source is not None else None
        reader: _Rows | _Computed
        if t.copied and t.perm is None:
            assert t.source is not None
            pieces.append(Piece(at, t.nbytes, source, t.source.offset))
        else:
            reader = _Rows(t, source) if t.copied else _Computed(t, source)
            pieces.append(Piece(at, t.nbytes, reader, 0))
        placed.append((t, at))
        at += t.nbytes
    at += -at % plan.alignment if plan.tensors else 0
    layout = Layout(placed, pieces, [p.start for p in pieces], at, b"")

    def describe() -> ModelFile:
        from tensorfs.formats.gguf import parse_gguf
        return parse_gguf(plan.head, len(plan.head) + at, path=path)

    return ComposedFile(plan.head, len(plan.head), layout, describe)


class GgufSource(Source):
    """A GGUF the converter would write, composed from the model's sources: served in
    ``files/`` beside them.  It owns nothing: the model's sources are started and closed
    with the mount."""

    name: str
    size: int

    def __init__(self, name: str, composed: ComposedFile, like: Source, plan: Plan):
        self.name = name
        self.composed = composed
        self.size = composed.size
        self.like = like
        self.plan = plan
        self.remote = like.remote
        self.version = like.version

    @property
    def broken(self):
        return self.like.broken

    def read_into(self, offset: int, buf, span=None) -> int:
        try:
            return self.composed.read_into(offset, memoryview(buf).cast("B"))
        except SourceError:
            raise
        except (ValueError, ArithmeticError, MemoryError) as error:
            log.error("%s: %s", self.name, error)
            raise SourceError(errno.EIO, f"{self.name}: {error}") from None

    def read_or_wait(self, offset: int, buf, span=None) -> int | Future[int]:
        return self.composed.read_or_wait(offset, memoryview(buf).cast("B"))

    def stat(self):
        return self.like.stat()

    def vouch(self, offset: int = 0, size: int = 0) -> None:
        self.like.vouch()


def recompose(gguf: GgufSource, files: dict[str, ComposedFile]) -> GgufSource:
    """``gguf`` as the converter writes it from the model as edited (``--edits``,
    ``tensorfs.mount.editversions``): ``files`` is each model file (by path) composed for the
    edits, its tensors' bytes replaced but their names, types and shapes kept, so that the
    plan is the same but for where each tensor's bytes are read from -- then permuted,
    widened or quantized on read as from the source's."""
    edited = {(path, t.name): t for path, composed in files.items()
              for t in composed.model_file.tensors}
    tensors = []
    for t in gguf.plan.tensors:
        if t.source is not None:
            now = edited.get((t.source.file, t.source.name))
            if now is None or (now.dtype, now.shape, now.nbytes) != (
                    t.source.dtype, t.source.shape, t.source.nbytes):
                raise ValueError(f"{t.source.name}: renamed, removed or changed in type or "
                                 "shape by an edit")
            t = dataclasses.replace(t, source=now)
        tensors.append(t)
    plan = dataclasses.replace(gguf.plan, tensors=tensors)
    return GgufSource(gguf.name, compose(plan, dict(files), gguf.name), gguf.like, plan)
