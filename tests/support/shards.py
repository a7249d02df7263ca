"""Shard sets for the tests: a Hugging Face safetensors index written next to shards saved
by safetensors.numpy, split GGUF written by gguf-py's GGUFWriter, and the check that
``inspect`` and ``mount`` refuse a broken set with the same one line."""

from __future__ import annotations

import json
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import gguf
import numpy as np
from safetensors import safe_open
from safetensors.numpy import save_file

from tests.support.commands import run_tensorfs
from tests.support.models import finish_gguf
from tests.support.mounts import fuse_mounts_under

INDEX = "model.safetensors.index.json"


# -- writers ----------------------------------------------------------------------------------

def hf_tensors(n_layers: int = 6, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    tensors = {"model.embed_tokens.weight": rng.standard_normal((11, 4)).astype(np.float32)}
    for i in range(n_layers):
        p = f"model.layers.{i}."
        tensors[p + "self_attn.q_proj.weight"] = rng.standard_normal((4, 4)).astype(np.float16)
        tensors[p + "mlp.up_proj.weight"] = rng.standard_normal((3, 4)).astype(np.float32)
        tensors[p + "input_layernorm.weight"] = rng.integers(-128, 127, (4,), dtype=np.int8)
        tensors[p + "mlp.mask"] = rng.integers(0, 2, (2, 3)).astype(np.bool_)
    tensors["model.norm.step"] = np.array(7, dtype=np.int64)          # a 0-d tensor
    tensors["lm_head.weight"] = rng.standard_normal((11, 4)).astype(np.float64)
    return tensors


def shard_name(k: int, n: int) -> str:
    return f"model-{k:05d}-of-{n:05d}.safetensors"


def write_hf_shards(directory: Path, n_shards: int = 3, *, tensors=None, metadata=None,
                    index_name: str = INDEX) -> tuple[Path, dict[str, np.ndarray], dict[str, str]]:
    """Shards saved by save_file (each with its own ``__metadata__``, as save_pretrained
    writes) and an index in the Hugging Face layout; (index path, tensors, weight_map)."""
    directory.mkdir(parents=True, exist_ok=True)
    tensors = hf_tensors() if tensors is None else tensors
    names = list(tensors)
    weight_map = {}
    for k in range(n_shards):
        part = names[k::n_shards]
        shard = shard_name(k + 1, n_shards)
        save_file({n: tensors[n] for n in part}, str(directory / shard), metadata={"format": "np"})
        weight_map.update({n: shard for n in part})
    total = sum(a.nbytes for a in tensors.values())
    index = {"metadata": {"total_size": total} if metadata is None else metadata,
             "weight_map": dict(sorted(weight_map.items()))}
    (directory / index_name).write_text(json.dumps(index, indent=2))
    return directory / index_name, tensors, weight_map


def gguf_tensors(n: int = 7, seed: int = 1) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    dtypes = [np.float32, np.float16, np.int8, np.int32, np.float64, np.int16, np.int64]
    out = {}
    for i in range(n):
        dtype = dtypes[i % len(dtypes)]
        shape = [(3, 5), (7,), (2, 3, 4)][i % 3]
        if np.issubdtype(dtype, np.floating):
            out[f"blk.{i}.weight"] = rng.standard_normal(shape).astype(dtype)
        else:
            out[f"blk.{i}.weight"] = rng.integers(-100, 100, shape).astype(dtype)
    return out


def write_split_gguf(directory: Path, *, per_shard: int = 3, tensors=None,
                     stem: str = "model") -> tuple[list[Path], dict[str, np.ndarray]]:
    """A split set as GGUFWriter(split_max_tensors=…) writes it; (files in order, tensors)."""
    directory.mkdir(parents=True, exist_ok=True)
    tensors = gguf_tensors() if tensors is None else tensors
    writer = gguf.GGUFWriter(str(directory / f"{stem}.gguf"), "llama", split_max_tensors=per_shard)
    writer.add_name("split test")
    writer.add_array("tokenizer.ggml.tokens", ["<s>", "hello", "a\nb"])
    finish_gguf(writer, tensors)
    files = sorted(directory.glob(f"{stem}-*-of-*.gguf"))
    assert len(files) == -(-len(tensors) // per_shard)
    return files, tensors


def write_gguf_shard(path: Path, tensors: dict, *, no=None, count=None, total=None) -> Path:
    """One GGUF file whose split.* keys are set by hand (to build broken sets)."""
    writer = gguf.GGUFWriter(str(path), "llama")
    if no is not None:
        writer.add_key_value("split.no", no, gguf.GGUFValueType.UINT16)
    if count is not None:
        writer.add_key_value("split.count", count, gguf.GGUFValueType.UINT16)
    if total is not None:
        writer.add_key_value("split.tensors.count", total, gguf.GGUFValueType.INT32)
    finish_gguf(writer, tensors)
    return path


def one(name: str, value: float = 1.0) -> dict:
    return {name: np.full((2, 2), value, dtype=np.float32)}


# -- reference readers ------------------------------------------------------------------------


def refused_by_both(tmp_path, model, *expect: str) -> str:
    """inspect and mount both refuse ``model`` with the same single line; nothing mounted."""
    mnt = tmp_path / "refused-mnt"
    mnt.mkdir(exist_ok=True)
    with ThreadPoolExecutor(2) as pool:            # the two commands are independent
        inspected = pool.submit(run_tensorfs, "inspect", model)
        mounted = pool.submit(run_tensorfs, "mount", model, mnt)
        result, mounted = inspected.result(), mounted.result()
    assert result.returncode == 1, result.stdout
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("tensorfs: error: "), result.stderr
    print(lines[0])
    for text in expect:
        assert text in lines[0], lines[0]
    assert mounted.returncode == 1 and mounted.stderr.splitlines() == lines
    assert fuse_mounts_under(tmp_path) == [] and os.listdir(mnt) == []
    return lines[0]


def safetensors_reference(index: Path) -> dict[str, tuple[np.ndarray, str]]:
    """tensor -> (array, shard file name), read by safe_open from every shard the index names."""
    weight_map = json.loads(index.read_text())["weight_map"]
    out = {}
    for shard in sorted(set(weight_map.values())):
        with safe_open(str(index.parent / shard), "numpy") as f:
            for name in f.keys():
                out[name] = (f.get_tensor(name), shard)
    return out
