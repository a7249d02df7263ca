"""The first difference between two GGUF files, said in one line (GGUFReader reads both):
the first metadata key whose type or value differs, the first tensor whose name, type,
shape or bytes differ; or the byte offset where they differ, or None."""

from __future__ import annotations

from pathlib import Path


def first_difference(expected: Path, got: Path) -> str | None:
    a, b = Path(expected).read_bytes(), Path(got).read_bytes()
    if a == b:
        return None
    import gguf
    ra, rb = gguf.GGUFReader(expected), gguf.GGUFReader(got)
    fa, fb = list(ra.fields.values()), list(rb.fields.values())
    for i, (x, y) in enumerate(zip(fa, fb)):
        if x.name != y.name:
            return f"key #{i}: {x.name} expected, {y.name} served"
        if x.types != y.types:
            return f"key {x.name}: type {x.types} expected, {y.types} served"
        cx, cy = x.contents(), y.contents()
        if cx != cy:
            return f"key {x.name}: {str(cx)[:200]} expected, {str(cy)[:200]} served"
    if len(fa) != len(fb):
        return f"{len(fa)} keys expected, {len(fb)} served"
    for x, y in zip(ra.tensors, rb.tensors):
        if (x.name, x.tensor_type, list(x.shape)) != (y.name, y.tensor_type, list(y.shape)):
            return (f"tensor {x.name} {x.tensor_type.name} {list(x.shape)} expected, "
                    f"{y.name} {y.tensor_type.name} {list(y.shape)} served")
        if bytes(x.data.tobytes()) != bytes(y.data.tobytes()):
            return f"tensor {x.name}: other bytes"
    if len(ra.tensors) != len(rb.tensors):
        return f"{len(ra.tensors)} tensors expected, {len(rb.tensors)} served"
    at = next((i for i, (p, q) in enumerate(zip(a, b)) if p != q), min(len(a), len(b)))
    return f"byte {at} differs ({len(a)} bytes expected, {len(b)} served)"
