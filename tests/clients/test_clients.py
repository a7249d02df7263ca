"""Real programs load models from a mount's files/ (issue 24): gguf-py's GGUFReader,
safetensors.safe_open, llama.cpp (llama-cpp-python) and transformers on CPU torch, each on a
tiny model the tests write, mounted from a local path, over plain HTTP and from an hf:// repo
(nginx on 127.0.0.1); the oracle is the same program on the local file."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from tests.clients.conftest import GGUF_TYPES, WHERE, need

pytestmark = [pytest.mark.slow, pytest.mark.clients]

# what each program computes from the local files, once per session
_local_results: dict = {}


def files_dir(mnt: Path) -> Path:
    files = mnt / "files"
    assert files.is_dir(), f"no files/ in the mount: {sorted(os.listdir(mnt))}"
    return files


def test_files_are_the_models_bytes(tiny, model_mount):
    """The ground the clients stand on: every file of a mount of the sharded directory, byte
    for byte (sizes included), as the clients below read them."""
    mnt = model_mount("local", "hf-sharded")
    files = files_dir(mnt)
    assert sorted(os.listdir(files)) == sorted(p.name for p in tiny.files("hf-sharded"))
    for local in tiny.files("hf-sharded"):
        assert os.path.getsize(files / local.name) == local.stat().st_size
        assert (files / local.name).read_bytes() == local.read_bytes(), local.name


# -- the reference readers ------------------------------------------------------------------

def gguf_contents(path: Path) -> tuple[dict, dict]:
    from gguf import GGUFReader

    reader = GGUFReader(path)
    fields = {name: [bytes(part) for part in field.parts] for name, field in reader.fields.items()}
    tensors = {t.name: (t.tensor_type, tuple(t.shape), bytes(t.data)) for t in reader.tensors}
    return fields, tensors


@pytest.mark.parametrize("where", WHERE)
def test_gguf_reader(tiny, model_mount, where):
    key = "gguf-Q8_0"
    mnt = model_mount(where, key)
    local = tiny.local(key)
    fields, tensors = gguf_contents(files_dir(mnt) / local.name)
    local_fields, local_tensors = gguf_contents(local)
    assert fields == local_fields
    assert list(tensors) == list(local_tensors)
    for name, (qtype, shape, data) in local_tensors.items():
        assert tensors[name] == (qtype, shape, data), name


@pytest.mark.parametrize("key", ["hf", "hf-sharded"])
@pytest.mark.parametrize("where", WHERE)
def test_safe_open(tiny, model_mount, where, key):
    from safetensors import safe_open

    mnt = model_mount(where, key)
    files = files_dir(mnt)
    shards = [p for p in tiny.files(key) if p.suffix == ".safetensors"]
    assert shards
    for local in shards:
        with safe_open(files / local.name, framework="numpy") as mounted, \
                safe_open(local, framework="numpy") as expected:
            assert mounted.metadata() == expected.metadata()
            assert list(mounted.keys()) == list(expected.keys())
            for name in expected.keys():
                a, b = mounted.get_tensor(name), expected.get_tensor(name)
                assert a.dtype == b.dtype and a.shape == b.shape, name
                assert a.tobytes() == b.tobytes(), name


# -- llama.cpp ------------------------------------------------------------------------------

def llama_run(path: Path, use_mmap: bool, n_new: int = 12) -> tuple[np.ndarray, list[int]]:
    """The prompt's logits and the greedy continuation, from a fresh llama.cpp context."""
    from llama_cpp import Llama

    from tests.support.tiny_models import N_CTX, PROMPT_IDS

    llm = Llama(model_path=str(path), n_ctx=N_CTX, n_threads=1, n_batch=N_CTX,
                use_mmap=use_mmap, logits_all=True, verbose=False, seed=0)
    try:
        llm.eval(PROMPT_IDS)
        logits = np.array(llm.scores[:len(PROMPT_IDS)], dtype=np.float32)
        llm.reset()
        generated = []
        for token in llm.generate(PROMPT_IDS, temp=0.0, top_k=1, reset=True):
            generated.append(token)
            if len(generated) == n_new:
                break
        return logits, generated
    finally:
        llm.close()


@pytest.mark.parametrize("qtype", GGUF_TYPES)
@pytest.mark.parametrize("where", WHERE)
def test_llama_cpp(tiny, model_mount, where, qtype):
    """llama.cpp both ways it reads a model: a memory map (page faults) and read(2)."""
    need("llama_cpp")
    key = f"gguf-{qtype}"
    local = tiny.local(key)
    mnt = model_mount(where, key)
    for use_mmap in (True, False):
        logits, generated = llama_run(files_dir(mnt) / local.name, use_mmap)
        expected = _local_results.get(("llama", key, use_mmap))
        if expected is None:
            expected = _local_results[("llama", key, use_mmap)] = llama_run(local, use_mmap)
        np.testing.assert_array_equal(logits, expected[0], err_msg=f"use_mmap={use_mmap}")
        assert generated == expected[1], f"use_mmap={use_mmap}"
        assert len(generated) == 12


# -- transformers ---------------------------------------------------------------------------

def transformers_logits(directory: Path):
    import torch
    from transformers import AutoModelForCausalLM

    from tests.support.tiny_models import PROMPT_IDS

    model = AutoModelForCausalLM.from_pretrained(directory, local_files_only=True).eval()
    with torch.no_grad():
        return model(torch.tensor([PROMPT_IDS])).logits


def model_directory(mnt: Path, tiny, key: str, where: str, tmp_path: Path) -> Path:
    """MNT/files itself where the mount is of a directory (local, hf://); over plain HTTP,
    which names one file or the index, what a user does: a directory of the config and
    links to the mounted weights."""
    files = files_dir(mnt)
    if where != "http":
        return files
    linked = tmp_path / f"linked-{key}"
    linked.mkdir()
    for local in tiny.files(key):
        if local.suffix == ".json" and local.name != "model.safetensors.index.json":
            (linked / local.name).write_bytes(local.read_bytes())
        else:
            (linked / local.name).symlink_to(files / local.name)
    return linked


@pytest.mark.parametrize("key", ["hf", "hf-sharded"])
@pytest.mark.parametrize("where", WHERE)
def test_transformers_from_pretrained(tiny, model_mount, tmp_path, where, key):
    need("torch", "transformers")
    import torch

    mnt = model_mount(where, key)
    directory = model_directory(mnt, tiny, key, where, tmp_path)
    logits = transformers_logits(directory)
    expected = _local_results.get(("transformers", key))
    if expected is None:
        expected = _local_results[("transformers", key)] = transformers_logits(tiny.local(key).parent)
    assert torch.equal(logits, expected)
