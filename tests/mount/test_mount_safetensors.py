"""safetensors files written by safetensors.numpy, mounted for real, compared with
safe_open on the same file."""

from __future__ import annotations

import json
import struct

import numpy as np
from safetensors import safe_open

from tests.support.models import write_safetensors


def test_tensors_read_back_as_safe_open_sees_them(tmp_path, mount):
    path = tmp_path / "model.safetensors"
    write_safetensors(path)
    mnt = mount(path)
    doc = json.loads((mnt / "metadata.json").read_bytes())
    with safe_open(str(path), "numpy") as reference:
        assert sorted(doc["tensors"]) == sorted(reference.keys())
        assert doc["metadata"] == reference.metadata()
        for name in reference.keys():
            expected = reference.get_tensor(name)
            entry = doc["tensors"][name]
            assert (mnt / entry["path"]).read_bytes() == expected.tobytes()
            assert entry["shape"] == list(expected.shape)
            for mode in (None, "r"):
                loaded = np.load(mnt / (entry["path"] + ".npy"), mmap_mode=mode)
                assert loaded.dtype == expected.dtype and loaded.shape == expected.shape
                assert np.array_equal(loaded, expected)
    assert doc["format"] == "safetensors" and doc["version"] is None
    assert set(doc["metadata_types"].values()) == {"string"}


def test_header_bin_is_the_length_and_the_json(tmp_path, mount):
    path = tmp_path / "model.safetensors"
    write_safetensors(path)
    mnt = mount(path)
    data = path.read_bytes()
    (length,) = struct.unpack("<Q", data[:8])
    assert (mnt / "header.bin").read_bytes() == data[:8 + length]
    assert json.loads((mnt / "metadata.json").read_bytes())["data_offset"] == 8 + length


def test_tree_follows_the_dots(tmp_path, mount):
    path = tmp_path / "model.safetensors"
    tensors = write_safetensors(path)
    mnt = mount(path)
    assert sorted(p.name for p in (mnt / "model" / "layers").iterdir()) == \
        sorted(str(i) for i in range(len(tensors) - 1))
    assert sorted(p.name for p in (mnt / "lm_head").iterdir()) == ["weight", "weight.npy"]
    assert np.array_equal(np.load(mnt / "lm_head" / "weight.npy"), tensors["lm_head.weight"])
