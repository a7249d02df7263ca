"""A model file with edits applied, composed without copying (``--edits``, docs/editing.md).

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
from dataclasses import replace
from typing import NamedTuple

import numpy as np

from tensorfs.editing.store import EditState
from tensorfs.formats.gguf import DEFAULT_ALIGNMENT, kv_spans
from tensorfs.formats.gguf_write import ValueWriter, check_alignment, check_tensor_name
from tensorfs.model import MetadataValue, ModelFile, TensorInfo


class EditError(ValueError):
    """An edit the format cannot hold (a bad alignment, a name taken): one line."""


class Piece(NamedTuple):
    start: int
    length: int
    read_into: Callable      # (offset in the piece, buf) -> n


def _bytes_piece(start: int, data: bytes) -> Piece:
    view = memoryview(data)

    def read_into(offset, buf):
        part = view[offset:offset + len(buf)]
        buf[:len(part)] = part
        return len(part)
    return Piece(start, len(data), read_into)


def _zeros_piece(start: int, length: int) -> Piece:
    def read_into(offset, buf):
        n = min(len(buf), length - offset)
        buf[:n] = bytes(n)
        return n
    return Piece(start, length, read_into)


def _range_piece(start: int, length: int, source, at: int) -> Piece:
    def read_into(offset, buf):
        return source.read_into(at + offset, buf)
    return Piece(start, length, read_into)


class ComposedFile:
    """The bytes of an edited file: ``size``, ``read_into(offset, buf)``, ``read``."""

    def __init__(self, pieces: list[Piece], model_file: ModelFile):
        self.pieces = [p for p in pieces if p.length > 0]
        self._starts = [p.start for p in self.pieces]
        last = self.pieces[-1] if self.pieces else None
        self.size = last.start + last.length if last else 0
        self.model_file = model_file

    def read_into(self, offset: int, buf) -> int:
        total = 0
        want = min(len(buf), max(0, self.size - offset))
        i = bisect.bisect_right(self._starts, offset) - 1
        while total < want:
            piece = self.pieces[i]
            inside = offset + total - piece.start
            n = min(piece.length - inside, want - total)
            got = piece.read_into(inside, buf[total:total + n])
            if got <= 0:
                break
            total += got
            if got < n:
                break
            i += 1
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
    out = []
    for t in tensors:
        edit = state.tensors.get(t.name)
        if edit is None:
            out.append((t, None))
        elif edit.name is not None:
            out.append((t._replace(name=edit.name), edit.data))
    return out


# -- GGUF ------------------------------------------------------------------------------------

def _alignment(metadata: dict, state: EditState) -> int:
    value = metadata.get("general.alignment")
    if value is None:
        return DEFAULT_ALIGNMENT
    if "general.alignment" not in state.metadata:
        return value.value()                # the model's own, as the parser accepted it
    if value.type_name != "uint32":
        raise EditError(f"general.alignment must be a uint32, not a {value.type_name}")
    try:
        return check_alignment(value.value())
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


def compose_gguf(model_file: ModelFile, header: bytes, source, state: EditState,
                 data: Callable) -> ComposedFile:
    """``header``: the file's first ``header_size`` bytes; ``data(name)``: a replacement's
    bytes (``read_into``)."""
    order = "<" if model_file.endianness == "little" else ">"
    _check_edits(model_file, state)
    enc = ValueWriter(order, model_file.version == 1)
    metadata = edited_metadata(model_file.metadata, state)
    alignment = _alignment(metadata, state)
    tensors = edited_tensors(model_file.tensors, state)
    spans, _ = kv_spans(header, model_file)

    out = bytearray(header[:8])
    out += enc.length(len(tensors)) + enc.length(len(metadata))
    for key, value in metadata.items():
        edit = state.metadata.get(key)
        if edit is None and key in spans:
            start, end = spans[key]
            out += header[start:end]
        else:
            try:
                out += enc.string(key) + enc.value(value.type_name, value.value())
            except ValueError as error:
                raise EditError(f"metadata {key!r}: {error}") from None
    offsets = []
    rel = 0
    for t, _ in tensors:
        offsets.append(rel)
        rel = _pad(rel + t.nbytes, alignment)
    for (t, _), at in zip(tensors, offsets):
        ne = t.shape[::-1]
        out += enc.string(t.name) + enc.u32(len(ne))
        out += b"".join(enc.length(d) for d in ne)
        out += enc.u32(t.ggml_type) + struct.pack(order + "Q", at)
    data_offset = _pad(len(out), alignment)
    pieces = [_bytes_piece(0, bytes(out)), _zeros_piece(len(out), data_offset - len(out))]
    new_tensors = []
    for (t, replacement), at in zip(tensors, offsets):
        start = data_offset + at
        if replacement is None:
            pieces.append(_range_piece(start, t.nbytes, source, t.offset))
        else:
            pieces.append(_range_piece(start, t.nbytes, data(replacement), 0))
        padded = _pad(t.nbytes, alignment)
        pieces.append(_zeros_piece(start + t.nbytes, padded - t.nbytes))
        new_tensors.append(t._replace(offset=start))
    end = data_offset + rel
    edited = replace(model_file, metadata=metadata, tensors=tuple(new_tensors),
                     alignment=alignment, header_size=data_offset, file_size=end)
    return ComposedFile(pieces, edited)


# -- safetensors -----------------------------------------------------------------------------

def compose_safetensors(model_file: ModelFile, header: bytes, source, state: EditState,
                        data: Callable) -> ComposedFile:
    _check_edits(model_file, state)
    metadata = edited_metadata(model_file.metadata, state)
    tensors = sorted(edited_tensors(model_file.tensors, state), key=lambda x: x[0].offset)
    doc: dict = {}
    if metadata:
        doc["__metadata__"] = {k: v.value() for k, v in metadata.items()}
    at = 0
    for t, _ in tensors:
        doc[t.name] = {"dtype": t.dtype, "shape": list(t.shape), "data_offsets": [at, at + t.nbytes]}
        at += t.nbytes
    text = json.dumps(doc, separators=(",", ":"), ensure_ascii=False)
    raw = text.encode("utf-8", "surrogatepass")
    raw += b" " * (-len(raw) % 8)
    head = struct.pack("<Q", len(raw)) + raw
    pieces = [_bytes_piece(0, head)]
    new_tensors = []
    at = len(head)
    for t, replacement in tensors:
        if replacement is None:
            pieces.append(_range_piece(at, t.nbytes, source, t.offset))
        else:
            pieces.append(_range_piece(at, t.nbytes, data(replacement), 0))
        new_tensors.append(t._replace(offset=at))
        at += t.nbytes
    order = {t.name: i for i, (t, _) in enumerate(edited_tensors(model_file.tensors, state))}
    new_tensors.sort(key=lambda t: order[t.name])
    edited = replace(model_file, metadata=metadata, tensors=tuple(new_tensors),
                     header_size=len(head), file_size=at)
    return ComposedFile(pieces, edited)


def compose(model_file: ModelFile, header: bytes, source, state: EditState,
            data: Callable) -> ComposedFile:
    """The edited ``model_file``: its bytes and its description."""
    if model_file.format == "gguf":
        return compose_gguf(model_file, header, source, state, data)
    return compose_safetensors(model_file, header, source, state, data)


# -- a tensor's new bytes from an array --------------------------------------------------------

def _bf16_bits(values) -> np.ndarray:
    """float32 -> bfloat16 bits, rounded to nearest even, NaN kept a quiet NaN (as torch
    and gguf-py round)."""
    bits = np.ascontiguousarray(values, dtype=np.float32).view(np.uint32).astype(np.uint64)
    rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)
    nan = np.isnan(np.asarray(values, dtype=np.float32))
    rounded[nan] = ((bits[nan] >> 16) | 0x40).astype(np.uint16)
    return rounded


def encode_array(tensor: TensorInfo, array) -> bytes:
    """``array`` stored as ``tensor`` is: same shape, the tensor's dtype and byte order
    (quantized where gguf-py quantizes the type).  ``EditError`` (one line) otherwise."""
    from tensorfs.dtypes import native_numpy_dtype

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
        import gguf

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
