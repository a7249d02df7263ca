"""llama.cpp (llama-cpp-python) loads a model edited through a mount (``--edits``,
docs/reference/editing.md): a new chat template in its metadata and the same greedy tokens after a
metadata edit; after a tensor edit, the logits of a reference file gguf-py wrote with the
same change."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

from tests.clients.conftest import need
from tests.clients.test_clients import llama_run

pytestmark = [pytest.mark.slow, pytest.mark.clients]

TEMPLATE = "{% for m in messages %}<|{{ m.role }}|>{{ m.content }}\n{% endfor %}"


@pytest.fixture
def tiny_llama(tmp_path):
    from tests.support.tiny_models import write_llama_gguf

    return write_llama_gguf(tmp_path / "tiny.gguf", "F16")


def test_llama_cpp_reads_a_metadata_edit(tmp_path, tiny_llama, mount):
    need("llama_cpp")
    from llama_cpp import Llama

    mnt = mount(tiny_llama, "--edits", tmp_path / "fixes")
    (mnt / "metadata" / "tokenizer.chat_template").write_text(TEMPLATE)
    (mnt / "metadata" / "general.name").write_text("edited through tensorfs\n")
    served = mnt / "files" / "tiny.gguf"
    llm = Llama(model_path=str(served), n_ctx=256, verbose=False)
    try:
        assert llm.metadata["tokenizer.chat_template"] == TEMPLATE
        assert llm.metadata["general.name"] == "edited through tensorfs"
    finally:
        llm.close()
    for use_mmap in (True, False):
        logits, generated = llama_run(served, use_mmap)
        want_logits, want_generated = llama_run(tiny_llama, use_mmap)
        np.testing.assert_array_equal(logits, want_logits)
        assert generated == want_generated


def test_llama_cpp_reads_a_tensor_edit(tmp_path, tiny_llama, mount):
    need("llama_cpp")
    import gguf

    mnt = mount(tiny_llama, "--edits", tmp_path / "fixes")
    view = mnt / "output_norm" / "weight.npy"
    scaled = np.load(view) * 1.5
    np.save(view, scaled)
    reference = tmp_path / "reference.gguf"
    shutil.copyfile(tiny_llama, reference)
    writer = gguf.GGUFReader(str(reference), "r+")       # gguf-py writes the same change
    {t.name: t for t in writer.tensors}["output_norm.weight"].data[:] = scaled
    writer.data.flush()
    del writer
    logits, generated = llama_run(mnt / "files" / "tiny.gguf", use_mmap=True)
    want_logits, want_generated = llama_run(reference, use_mmap=True)
    original_logits, _ = llama_run(tiny_llama, use_mmap=True)
    np.testing.assert_array_equal(logits, want_logits)
    assert generated == want_generated
    assert not np.array_equal(logits, original_logits)


@pytest.mark.parametrize("sharded", [False, True])
def test_transformers_reads_a_tensor_edit(tmp_path, mount, sharded):
    """from_pretrained(MNT/files) after a tensor edit: the logits of a copy of the model
    whose shard save_file rewrote with the same change."""
    need("torch", "transformers")
    import json

    import torch
    from safetensors.numpy import load_file, save_file

    from tests.clients.test_clients import transformers_logits
    from tests.support.tiny_models import write_transformers_model

    local = write_transformers_model(tmp_path / "hf", "100KB" if sharded else None)
    mnt = mount(local, "--edits", tmp_path / "fixes")
    view = mnt / "model" / "norm" / "weight.npy"
    scaled = np.load(view) * 1.5
    np.save(view, scaled)

    reference = tmp_path / "reference"
    shutil.copytree(local, reference)
    index = reference / "model.safetensors.index.json"
    shard = json.loads(index.read_text())["weight_map"]["model.norm.weight"] if sharded \
        else "model.safetensors"
    tensors = load_file(str(reference / shard))
    tensors["model.norm.weight"] = scaled.astype(tensors["model.norm.weight"].dtype)
    save_file(tensors, str(reference / shard), metadata={"format": "pt"})

    logits = transformers_logits(mnt / "files")
    assert torch.equal(logits, transformers_logits(reference))
    assert not torch.equal(logits, transformers_logits(local))


@pytest.mark.parametrize("tool", ["sed", "vim"])
def test_llama_cpp_loads_a_key_a_tool_rewrote(tmp_path, tiny_llama, mount, tool):
    """``sed -i`` (a temporary file renamed over the key) and vim (swap file, backup) on the
    EOS id: llama.cpp loads the model and its EOS is the new id (before, the key became a
    string and llama.cpp refused the model: "wrong type str but expected type u32")."""
    need("llama_cpp")
    import subprocess

    from llama_cpp import Llama

    mnt = mount(tiny_llama, "--edits", tmp_path / "fixes")
    eos = mnt / "metadata" / "tokenizer.ggml.eos_token_id"
    old = int(eos.read_text())
    new = old + 1
    if tool == "sed":
        command = ["sed", "-i", f"s/^{old}$/{new}/", str(eos)]
    else:
        vim = shutil.which("vim") or shutil.which("vim.tiny")
        if vim is None:
            pytest.skip("vim is not installed (make test-system-deps)")
        command = [vim, "-es", "-N", "-c", "set backup backupskip=", "-c", f"s/^{old}$/{new}/",
                   "-c", "wq", str(eos)]
    result = subprocess.run(command, capture_output=True, text=True, check=False,
                            stdin=subprocess.DEVNULL, timeout=60, cwd=eos.parent)
    assert result.returncode == 0, result.stderr
    llm = Llama(model_path=str(mnt / "files" / "tiny.gguf"), n_ctx=64, vocab_only=True,
                verbose=False)
    try:
        assert llm.token_eos() == new
    finally:
        llm.close()
