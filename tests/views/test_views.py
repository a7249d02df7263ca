"""What a copy costs: ``--views raw,npy`` through real mounts, and ``du`` against what
``cp -r`` of the mount writes."""

from __future__ import annotations

import json
import os
import subprocess

import gguf
import numpy as np
import pytest

from tests.support import run_tensorfs, safetensors_corpus, usage_error
from tests.support.models import finish_gguf


def _model(tmp_path):
    """A quantized GGUF (whose float32 views are ~6x the stored bytes), an F32 tensor, and
    "a.b" beside "a.b.c" (a raw file named PATH.raw)."""
    rng = np.random.default_rng(0)
    path = tmp_path / "q.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    tensors = {
        "blk.0.w": rng.integers(0, 256, (16, 8 * 20), dtype=np.uint8),
        "a.b": rng.standard_normal(5).astype(np.float32),
        "a.b.c": rng.standard_normal((2, 3)).astype(np.float32),
    }
    writer.add_tensor("blk.0.w", tensors["blk.0.w"], raw_dtype=gguf.GGMLQuantizationType.Q4_1)
    finish_gguf(writer, {k: v for k, v in tensors.items() if k != "blk.0.w"})
    return path


def _files(root) -> dict[str, int]:
    out = {}
    for dirpath, _, names in os.walk(root):
        for name in names:
            full = os.path.join(dirpath, name)
            out[os.path.relpath(full, root)] = os.stat(full).st_size
    return out


def _du(path, *flags) -> int:
    return int(subprocess.run(["du", "-s", *flags, str(path)], capture_output=True, text=True,
                              check=True).stdout.split()[0])


TENSOR_FILES = {
    ("raw", "npy"): {"blk/0/w", "blk/0/w.npy", "a/b.raw", "a/b.npy", "a/b/c", "a/b/c.npy"},
    ("raw",): {"blk/0/w", "a/b.raw", "a/b/c"},
    ("npy",): {"blk/0/w.npy", "a/b.npy", "a/b/c.npy"},
}


@pytest.mark.parametrize("views", sorted(TENSOR_FILES), ids=",".join)
def test_du_of_a_mount_is_what_cp_r_writes(tmp_path, mount, views):
    model = _model(tmp_path)
    options = [] if views == ("raw", "npy") else ["--views", ",".join(views)]
    mnt = mount(model, *options)
    files = _files(mnt)
    tensor_files = {p for p in files if p.split("/")[0] not in ("header.bin", "metadata.json",
                                                                 "metadata", "files")}
    assert tensor_files == TENSOR_FILES[views]
    for rel in files:                     # what du adds up, file by file
        st = os.stat(mnt / rel)
        assert st.st_blocks == -(-st.st_size // 512), rel
    copy = tmp_path / "copy"
    subprocess.run(["cp", "-r", str(mnt), str(copy)], check=True)
    assert _files(copy) == files          # cp writes every byte the mount reports
    assert _du(mnt, "-b") == sum(files.values())
    assert _du(mnt, "-B512") == sum(-(-size // 512) for size in files.values())
    doc = json.loads((mnt / "metadata.json").read_bytes())
    assert doc.get("views", ["raw", "npy"]) == list(views)
    if "npy" in views:
        reader = gguf.GGUFReader(str(model), "r")
        with np.errstate(all="ignore"):      # random scales include NaN and inf
            want = gguf.quants.dequantize(reader.get_tensor(0).data,
                                          gguf.GGMLQuantizationType.Q4_1)
        assert np.array_equal(np.load(mnt / "blk/0/w.npy").view(np.uint32),
                              want.reshape(16, 256).view(np.uint32))
    if "raw" in views:
        assert (mnt / "blk/0/w").read_bytes() == reader_bytes(model, "blk.0.w")


def reader_bytes(model, name) -> bytes:
    t = next(t for t in gguf.GGUFReader(str(model), "r").tensors if t.name == name)
    return t.data.tobytes()


def test_raw_only_views_copy_about_the_model_size(tmp_path, mount):
    model = _model(tmp_path)
    both, raw = mount(model), mount(model, "--views", "raw")
    size = model.stat().st_size
    assert _du(both, "-b") > 3 * size     # the float32 views of a 4.5-bit type
    assert _du(raw, "-b") < 2 * size + 4096


def test_npy_views_keep_the_raw_file_of_a_tensor_without_a_view(tmp_path, mount):
    model = tmp_path / "f4.safetensors"
    model.write_bytes(safetensors_corpus.build(
        [("w", safetensors_corpus.tensor("F4", [4], 0, 2)),
         ("x", safetensors_corpus.tensor("U8", [2], 2, 4))], data=b"\x12\x34\x05\x06"))
    mnt = mount(model, "--views", "npy")
    listing = sorted(os.listdir(mnt))
    assert "w" in listing and "w.npy" not in listing           # every tensor still there once
    assert "x.npy" in listing and "x" not in listing
    assert (mnt / "w").read_bytes() == b"\x12\x34"
    assert np.load(mnt / "x.npy").tolist() == [5, 6]


def test_views_is_checked_as_a_usage_error(tmp_path):
    model = _model(tmp_path)
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    for bad in ("bogus", "", "raw,json", ","):
        result = run_tensorfs("mount", model, mnt, "--views", bad)
        assert "--views" in usage_error(result)
    assert os.listdir(mnt) == []
