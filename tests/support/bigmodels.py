"""Models of many GiB that cost no disk: safetensors whose data is a hole (the format puts
the data after the header, so a file cut to its full length with ``truncate`` reads as
zeros), for the work that grows with a tensor's size (its sha256)."""

from __future__ import annotations

import hashlib
import json
import struct
from pathlib import Path

from safetensors import safe_open


def write_sparse_safetensors(path: Path, sizes: dict[str, int]) -> dict[str, tuple[int, int]]:
    """U8 tensors of ``sizes`` bytes each, zeros but for their first byte (so that no two
    tensors of a size hash alike by chance of layout); (absolute offset, size) per name,
    checked with safe_open."""
    header, offset = {}, 0
    for name, n in sizes.items():
        header[name] = {"dtype": "U8", "shape": [n], "data_offsets": [offset, offset + n]}
        offset += n
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    start = 8 + len(text)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text)
        f.truncate(start + offset)
        for i, (name, (begin, _)) in enumerate((k, v["data_offsets"]) for k, v in header.items()):
            f.seek(start + begin)
            f.write(bytes([i % 255 + 1]))
    with safe_open(str(path), "numpy") as f:      # the reference reader takes it
        assert sorted(f.keys()) == sorted(sizes)
        for name, n in sizes.items():
            assert f.get_slice(name).get_shape() == [n]
    return {name: (start + v["data_offsets"][0], sizes[name]) for name, v in header.items()}


def sha256_of_range(path: Path, offset: int, size: int) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        f.seek(offset)
        left = size
        while left:
            piece = f.read(min(left, 8 << 20))
            assert piece, "short file"
            h.update(piece)
            left -= len(piece)
    return h.hexdigest()
