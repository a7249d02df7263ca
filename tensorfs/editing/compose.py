"""A model file with edits applied, composed without copying (``--edits``, docs/reference/editing.md).

``compose(model_file, source, state, data)`` gives a ``ComposedFile``: the edited file's
size and bytes, made of pieces -- a new header built here (small: the metadata and the
tensor infos), the unchanged tensors' bytes read from ``source`` by range, the replaced ones
from the edit store's files, zeros for padding -- and the ``ModelFile`` that describes it
(what metadata.json, metadata/ and the tree show).

- GGUF: the key-value pairs in their order, an edited value in its place (an unchanged one
  keeps its bytes as stored), the new keys appended; the tensor infos with the new names
  and offsets, each tensor's data at the next multiple of ``general.alignment`` (the
  edited value if it was changed), the file padded to it as gguf-py's ``GGUFWriter``
  writes it.  The version and byte order stay the source's.
- safetensors: the header JSON (``__metadata__`` first, then the tensors in the order of
  their data), padded with spaces to a multiple of 8 bytes as the reference writer does;
  the data of the tensors kept, one after the other.

Nothing here knows about FUSE, the tree or the store's directory.
"""

from __future__ import annotations

import bisect
import json
import struct
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import replace
from typing import TYPE_CHECKING, NamedTuple, Protocol

from tensorfs.editing.store import EditState
from tensorfs.formats.gguf import DEFAULT_ALIGNMENT, kv_spans
from tensorfs.formats.gguf_write import ValueWriter, check_alignment, check_tensor_name
from tensorfs.model import MetadataValue, ModelFile, TensorInfo
from tensorfs.waits import gathered

if TYPE_CHECKING:              # numpy is imported by an edit that needs it, not with a mount
    import numpy as np


class EditError(ValueError):
    """An edit the format cannot hold (a bad alignment, a name taken): one line."""


class PieceReader(Protocol):
    """What a piece is read from: a ``tensorfs.sources.source.Source`` (the model's, a
    store's ``DataFile``) or a checkpoint's gathered tensor.  ``read_into`` fills ``buf``
    with the bytes at ``offset`` (fewer only at the end); ``read_or_wait`` may instead give
    a ``Future`` of the count, where they are on their way."""

    def read_into(self, offset: int, buf) -> int: ...

    def read_or_wait(self, offset: int, buf) -> int | Future[int]: ...


class Piece(NamedTuple):
    """Bytes of the data part: ``length`` bytes at ``start`` (from the data's start), read
    from ``reader`` at ``at``."""
    start: int
    length: int
    reader: PieceReader
    at: int


class Layout(NamedTuple):
    """The data part of a composed file, which a metadata edit leaves as it is: the tensors
    kept with their offsets from the data's start, their pieces, the data's size, and (GGUF)
    the tensor infos' bytes."""
    placed: list            # [(TensorInfo with its name now, offset from the data's start)]
    pieces: list            # [Piece], by start; the gaps between them are zeros
    starts: list
    size: int
    info: bytes


class ComposedFile:
    """The bytes of an edited file: ``head`` (the header built here), zeros up to
    ``data_offset``, then the data ``layout``; ``size``, ``read_into(offset, buf)``,
    ``read``; ``model_file``, its description, made when first asked."""

    def __init__(self, head: bytes, data_offset: int, layout: Layout,
                 describe: Callable[[], ModelFile]):
        self.head = memoryview(head)
        self.data_offset = data_offset
        self.layout = layout
        self.size = data_offset + layout.size
        self._describe = describe
        self._model_file: ModelFile | None = None

    @property
    def model_file(self) -> ModelFile:
        if self._model_file is None:
            self._model_file = self._describe()
        return self._model_file

    def read_into(self, offset: int, buf) -> int:
        return self._read(offset, buf, None)

    def read_or_wait(self, offset: int, buf) -> int | Future[int]:
        """``read_into``, or a ``Future`` of the count where a piece's bytes are on their way
        (a remote model's: ``Source.read_or_wait``); cancelling it cancels theirs."""
        waits: list[tuple[int, int, Future[int]]] = []
        total = self._read(offset, buf, waits)
        return gathered(total, waits) if waits else total

    def _read(self, offset: int, buf, waits: list | None) -> int:
        """The bytes at ``offset`` into ``buf``, waiting for them (``waits`` None); else
        the pieces on their way are not waited for but put in ``waits`` as (where in
        ``buf``, how many bytes, their ``Future``), counted as read."""
        total = 0
        want = min(len(buf), max(0, self.size - offset))
        layout = self.layout
        while total < want:
            pos = offset + total
            if pos < self.data_offset:
                n = min(want - total, self.data_offset - pos)
                part = self.head[pos:pos + n]
                buf[total:total + len(part)] = part
                buf[total + len(part):total + n] = bytes(n - len(part))
                total += n
                continue
            rel = pos - self.data_offset
            i = bisect.bisect_right(layout.starts, rel) - 1
            piece = layout.pieces[i] if i >= 0 else None
            if piece is None or rel >= piece.start + piece.length:        # padding
                end = layout.starts[i + 1] if i + 1 < len(layout.starts) else layout.size
                n = min(want - total, end - rel)
                buf[total:total + n] = bytes(n)
                total += n
                continue
            inside = rel - piece.start
            n = min(piece.length - inside, want - total)
            if waits is None:
                got = piece.reader.read_into(piece.at + inside, buf[total:total + n])
            else:
                came = piece.reader.read_or_wait(piece.at + inside, buf[total:total + n])
                if isinstance(came, Future):
                    waits.append((total, n, came))
                    got = n
                else:
                    got = came
            if got <= 0:
                break
            total += got
            if got < n:
                break
        return total

    def read(self, offset: int, size: int) -> bytes:
        out = bytearray(max(0, min(size, self.size - offset)))
        n = self.read_into(offset, memoryview(out))
        return bytes(out[:n])


# -- what the edits make of the model's records ------------------------------------------

def typed_value(type_name: str, value) -> MetadataValue:
    count = len(value) if type_name.startswith("array") else None
    return MetadataValue(type_name, lambda: value, count)


def edited_metadata(metadata, state: EditState) -> dict:
    """key -> MetadataValue after the edits: the model's keys in order (edited in place,
    deleted ones left out), then the new ones."""
    out = {}
    for key, value in metadata.items():
        edit = state.metadata.get(key, value) if key in state.metadata else value
        if edit is None:
            continue
        out[key] = typed_value(*edit) if isinstance(edit, tuple) else edit
    for key, edit in state.metadata.items():
        if key not in metadata and edit is not None:
            out[key] = typed_value(*edit)
    return out


def edited_tensors(tensors, state: EditState) -> list[tuple[TensorInfo, object]]:
    """(tensor with its name now, replacement data name or None) of every tensor kept, in
    the model's order."""
    out: list[tuple[TensorInfo, object]] = []
    for t in tensors:
        edit = state.tensors.get(t.name)
        if edit is None:
            out.append((t, None))
        elif edit.name is not None:
            out.append((t._replace(name=edit.name), edit.data))
    return out


# -- GGUF ------------------------------------------------------------------------------------

def _alignment(model_file: ModelFile, state: EditState) -> int:
    """The edited file's ``general.alignment``: the model's (the parser accepted it) unless
    an edit sets it, checked then (a power of two, at most ``MAX_ALIGNMENT``)."""
    if "general.alignment" not in state.metadata:
        return model_file.alignment or DEFAULT_ALIGNMENT
    edit = state.metadata["general.alignment"]
    if edit is None:
        return DEFAULT_ALIGNMENT
    if edit[0] != "uint32":
        raise EditError(f"general.alignment must be a uint32, not a {edit[0]}")
    try:
        return check_alignment(edit[1])
    except ValueError as error:
        raise EditError(str(error)) from None


def _check_edits(model_file: ModelFile, state: EditState) -> None:
    """The names and keys an edit gives: what the format and its readers accept."""
    for key, typed in state.metadata.items():
        if not isinstance(key, str) or not key or "\0" in key:
            raise EditError(f"metadata key {key!r}: a key is a non-empty string without NUL")
        if model_file.format == "safetensors" and typed is not None \
                and (typed[0] != "string" or not isinstance(typed[1], str)):
            raise EditError(f"safetensors metadata holds strings only, not {typed[0]} ({key!r})")
    for original, edit in state.tensors.items():
        if edit.name is None or edit.name == original:
            continue
        if model_file.format == "gguf":
            try:
                check_tensor_name(edit.name)
            except ValueError as error:
                raise EditError(str(error)) from None
        elif not isinstance(edit.name, str) or not edit.name or "\0" in edit.name \
                or edit.name == "__metadata__":
            raise EditError(f"{edit.name!r} cannot name a safetensors tensor (empty, a NUL, or "
                            "the header's __metadata__)")


def _pad(n: int, alignment: int) -> int:
    return -(-n // alignment) * alignment


class Composer:
    """One model file composed again at each edit, redoing only what the edit changed: the
    data layout (tensor infos, pieces) is kept while the tensor edits and the alignment
    stay (a metadata edit), a new value's bytes while the value stays, and the model's
    own entries are copied from its header as they are -- an edit costs in proportion to
    the edit and the header, not to the tensors (20,000 of them) nor to the edits before.
    ``data(name)``: a replacement's bytes (``read_into``)."""

    def __init__(self, model_file: ModelFile, header: bytes, source, data: Callable):
        self.model_file = model_file
        self.header = header
        self.source = source
        self.data = data
        self.order = "<" if model_file.endianness == "little" else ">"
        self._layout: tuple | None = None       # (tensors dict, alignment, Layout)
        self._entries: dict = {}                # key -> (typed, its entry's bytes)
        if model_file.format == "gguf":
            self._writer = ValueWriter(self.order, model_file.version == 1)
            self._spans = kv_spans(header, model_file)[0]

    def compose(self, state: EditState) -> ComposedFile:
        _check_edits(self.model_file, state)
        if self.model_file.format == "gguf":
            return self._gguf(state)
        return self._safetensors(state)

    def _kept_layout(self, state: EditState, alignment: int, build: Callable) -> Layout:
        kept = self._layout
        if kept is not None and kept[0] is state.tensors and kept[1] == alignment:
            return kept[2]
        layout = build(state, alignment)
        self._layout = (state.tensors, alignment, layout)
        return layout

    # -- GGUF ------------------------------------------------------------------------------
    def _gguf_layout(self, state: EditState, alignment: int) -> Layout:
        enc = self._writer
        placed, pieces, infos = [], [], []
        rel = 0
        for t, replacement in edited_tensors(self.model_file.tensors, state):
            placed.append((t, rel))
            ne = t.shape[::-1]
            infos += [enc.string(t.name), enc.u32(len(ne)), *(enc.length(d) for d in ne),
                      enc.u32(t.ggml_type or 0), struct.pack(self.order + "Q", rel)]
            if t.nbytes:
                reader, at = (self.source, t.offset) if replacement is None \
                    else (self.data(replacement), 0)
                pieces.append(Piece(rel, t.nbytes, reader, at))
            rel = _pad(rel + t.nbytes, alignment)
        return Layout(placed, pieces, [p.start for p in pieces], rel, b"".join(infos))

    def _entry(self, key: str, typed) -> bytes:
        kept = self._entries.get(key)
        if kept is not None and kept[0] is typed:
            return kept[1]
        try:
            entry = self._writer.string(key) + self._writer.value(*typed)
        except ValueError as error:
            raise EditError(f"metadata {key!r}: {error}") from None
        self._entries[key] = (typed, entry)
        return entry

    def _gguf(self, state: EditState) -> ComposedFile:
        model_file, header, spans, edits = self.model_file, self.header, self._spans, \
            state.metadata
        # the keys in order: the model's (not deleted), then the new ones; no value is made
        # here but the edited ones' bytes (a MetadataValue per key is for ``describe``)
        keys = [k for k in model_file.metadata if edits.get(k, 0) is not None]
        keys += [k for k, e in edits.items() if e is not None and k not in model_file.metadata]
        alignment = _alignment(model_file, state)
        layout = self._kept_layout(state, alignment, self._gguf_layout)
        out = [header[:8], self._writer.length(len(layout.placed)),
               self._writer.length(len(keys))]
        for key in keys:
            edit = edits.get(key)
            if edit is None:
                start, end = spans[key]
                out.append(header[start:end])
            else:
                out.append(self._entry(key, edit))
        out.append(layout.info)
        head = b"".join(out)
        data_offset = _pad(len(head), alignment)

        def describe() -> ModelFile:
            metadata = edited_metadata(model_file.metadata, state)
            tensors = tuple(t._replace(offset=data_offset + rel) for t, rel in layout.placed)
            return replace(model_file, metadata=metadata, tensors=tensors, alignment=alignment,
                           header_size=data_offset, file_size=data_offset + layout.size)
        return ComposedFile(head, data_offset, layout, describe)

    # -- safetensors -----------------------------------------------------------------------
    def _safetensors_layout(self, state: EditState, alignment: int) -> Layout:
        by_offset = sorted(edited_tensors(self.model_file.tensors, state),
                           key=lambda x: x[0].offset)
        doc, placed, pieces = {}, {}, []
        at = 0
        for t, replacement in by_offset:
            doc[t.name] = {"dtype": t.dtype, "shape": list(t.shape),
                           "data_offsets": [at, at + t.nbytes]}
            placed[t.name] = at
            if t.nbytes:
                reader, offset = (self.source, t.offset) if replacement is None \
                    else (self.data(replacement), 0)
                pieces.append(Piece(at, t.nbytes, reader, offset))
            at += t.nbytes
        in_order = [(t, placed[t.name]) for t, _ in edited_tensors(self.model_file.tensors, state)]
        info = json.dumps(doc, separators=(",", ":"), ensure_ascii=False) \
            .encode("utf-8", "surrogatepass")
        return Layout(in_order, pieces, [p.start for p in pieces], at, info)

    def _safetensors(self, state: EditState) -> ComposedFile:
        model_file = self.model_file
        metadata = edited_metadata(model_file.metadata, state)
        layout = self._kept_layout(state, 1, self._safetensors_layout)
        raw = layout.info
        if metadata:
            meta = json.dumps({"__metadata__": {k: v.value() for k, v in metadata.items()}},
                              separators=(",", ":"), ensure_ascii=False) \
                .encode("utf-8", "surrogatepass")
            raw = meta if raw == b"{}" else meta[:-1] + b"," + raw[1:]
        raw += b" " * (-len(raw) % 8)
        head = struct.pack("<Q", len(raw)) + raw

        def describe() -> ModelFile:
            tensors = tuple(t._replace(offset=len(head) + rel) for t, rel in layout.placed)
            return replace(model_file, metadata=metadata, tensors=tensors,
                           header_size=len(head), file_size=len(head) + layout.size)
        return ComposedFile(head, len(head), layout, describe)


def compose(model_file: ModelFile, header: bytes, source, state: EditState,
            data: Callable) -> ComposedFile:
    """The edited ``model_file``: its bytes and its description (once; an editor keeps a
    ``Composer`` per file)."""
    return Composer(model_file, header, source, data).compose(state)


# -- a tensor's new bytes from an array --------------------------------------------------------

def _bf16_bits(values) -> np.ndarray:
    """float32 -> bfloat16 bits, rounded to nearest even, NaN kept a quiet NaN (as torch
    and gguf-py round)."""
    from tensorfs.runtime.libraries import np

    bits = np.ascontiguousarray(values, dtype=np.float32).view(np.uint32).astype(np.uint64)
    rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)
    nan = np.isnan(np.asarray(values, dtype=np.float32))
    rounded[nan] = ((bits[nan] >> 16) | 0x40).astype(np.uint16)
    return rounded


def encode_array(tensor: TensorInfo, array) -> bytes:
    """``array`` stored as ``tensor`` is: same shape, the tensor's dtype and byte order
    (quantized where gguf-py quantizes the type).  ``EditError`` (one line) otherwise."""
    from tensorfs.dtypes import native_numpy_dtype
    from tensorfs.runtime.libraries import np

    if tuple(array.shape) != tuple(tensor.shape):
        raise EditError(f"the array's shape is {list(array.shape)}, the tensor's "
                        f"{list(tensor.shape)}")
    native = native_numpy_dtype(tensor)
    if native is not None:
        target = np.dtype(native)
        if array.dtype != target and not np.can_cast(array.dtype, target, "same_kind"):
            raise EditError(f"an array of {array.dtype} cannot be stored as {tensor.dtype}")
        data = np.ascontiguousarray(array, dtype=target).tobytes()
    elif array.dtype.kind not in "fiu":
        raise EditError(f"an array of {array.dtype} cannot be stored as {tensor.dtype}")
    elif tensor.dtype == "BF16" and tensor.byte_order == "<":
        data = _bf16_bits(array.astype(np.float32)).tobytes()
    elif tensor.ggml_type is not None and tensor.byte_order == "<":
        from tensorfs.runtime.libraries import gguf

        try:
            qtype = gguf.GGMLQuantizationType(tensor.ggml_type)
            data = gguf.quants.quantize(np.ascontiguousarray(array, dtype=np.float32),
                                        qtype).tobytes()
        except (NotImplementedError, ValueError, KeyError) as error:
            raise EditError(f"gguf-py cannot quantize to {tensor.dtype}: {error}") from None
    else:
        raise EditError(f"tensors of {tensor.dtype} cannot be written from an array")
    if len(data) != tensor.nbytes:
        raise EditError(f"{len(data)} bytes made, the tensor holds {tensor.nbytes}")
    return data
