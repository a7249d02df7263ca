"""PyTorch checkpoints written by real torch (torch.save), for tests/test_pytorch*.py:
state dicts with views, transposes and tied weights, a transformers model directory as
``save_pretrained(..., safe_serialization=False)`` wrote it (``pytorch_model.bin``, or
shards ``pytorch_model-0000N-of-0000M.bin`` with ``pytorch_model.bin.index.json``), and
the hostile pickles of the refusal tests."""

from __future__ import annotations

import json
import os
import zipfile
from pathlib import Path


def tricky_state_dict():
    """A state dict with what a reader gets wrong: a transposed view and a column of one
    storage, a row-slice at an offset, tied keys, BF16, FP8, a scalar, an empty tensor."""
    import collections

    import torch

    torch.manual_seed(0)
    w = torch.randn(8, 6)
    sd = collections.OrderedDict()
    sd["layer.weight"] = w
    sd["layer.bias"] = torch.arange(6, dtype=torch.int64)
    sd["layer.weight_t"] = w.t()
    sd["layer.rows"] = w[2:5]
    sd["layer.column"] = w[:, 3]
    sd["head.weight"] = w                         # tied to layer.weight
    sd["bf16"] = torch.randn(3, 5).to(torch.bfloat16)
    sd["half"] = torch.randn(2, 2, 3).half()
    sd["fp8"] = torch.randn(4).to(torch.float8_e4m3fn)
    sd["scalar"] = torch.tensor(3.5)
    sd["empty"] = torch.zeros(0, 3)
    sd["param"] = torch.nn.Parameter(torch.ones(2))
    return sd


def write_transformers_bin(directory: Path, shards: int = 1, tied: bool = True,
                           seed: int = 0) -> Path:
    """A tiny LlamaForCausalLM (tied embeddings when ``tied``) as
    ``save_pretrained(safe_serialization=False)`` writes it: config.json and
    generation_config.json, and the state dict torch.save'd whole (``pytorch_model.bin``) or
    in ``shards`` shards with ``pytorch_model.bin.index.json`` (transformers 5 writes
    safetensors only, so the checkpoint is written here as transformers 4 did)."""
    import torch
    from transformers import LlamaForCausalLM

    from tests.support.tiny_models import llama_config

    torch.manual_seed(seed)
    config = llama_config()
    config.tie_word_embeddings = tied
    model = LlamaForCausalLM(config).eval()
    model.save_pretrained(directory)
    for name in os.listdir(directory):
        if name.endswith((".safetensors", ".safetensors.index.json")):
            os.unlink(directory / name)
    state = model.state_dict()
    if tied:
        assert state["lm_head.weight"].data_ptr() == state["model.embed_tokens.weight"].data_ptr()
    if shards == 1:
        torch.save(state, directory / "pytorch_model.bin")
        return directory
    keys = list(state)
    per = -(-len(keys) // shards)
    weight_map = {}
    for i in range(shards):
        name = f"pytorch_model-{i + 1:05d}-of-{shards:05d}.bin"
        part = {k: state[k] for k in keys[i * per:(i + 1) * per]}
        torch.save(part, directory / name)
        weight_map.update({k: name for k in part})
    total = sum(t.numel() * t.element_size() for t in state.values())
    (directory / "pytorch_model.bin.index.json").write_text(json.dumps(
        {"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2))
    return directory


def rewrite_entries(src: Path, dst: Path, change) -> Path:
    """``src``'s zip with ``change(name, data) -> (name, data, compress_type)`` applied to
    each entry (a test's damaged container); stored entries stay stored."""
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w") as zout:
        for info in zin.infolist():
            name, data, compression = change(info.filename, zin.read(info.filename))
            zout.writestr(zipfile.ZipInfo(name, info.date_time), data,
                          compress_type=compression)
    return dst


def write_sentence_transformer(directory: Path, seed: int = 0) -> Path:
    """A tiny sentence-transformers model (a 2-layer BERT with a 16-word vocabulary, mean
    pooling, normalization) as SentenceTransformer.save lays it out -- modules.json,
    1_Pooling/config.json, an empty 2_Normalize/ -- with its weights in pytorch_model.bin
    (what older saves wrote) instead of model.safetensors."""
    import torch
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Normalize, Pooling, Transformer
    from transformers import BertConfig, BertModel, BertTokenizer

    torch.manual_seed(seed)
    base = directory.parent / f"{directory.name}-bert"
    base.mkdir(parents=True)
    words = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "cat", "sat", "on", "mat",
             "a", "dog", "ran", "far", "away", "."]
    (base / "vocab.txt").write_text("\n".join(words) + "\n")
    BertTokenizer(str(base / "vocab.txt")).save_pretrained(base)
    BertModel(BertConfig(vocab_size=len(words), hidden_size=32, num_hidden_layers=2,
                         num_attention_heads=2, intermediate_size=64,
                         max_position_embeddings=64)).save_pretrained(base)
    word = Transformer(str(base))
    model = SentenceTransformer(modules=[word, Pooling(32), Normalize()])
    model.save(str(directory))
    for name in os.listdir(directory):
        if name.endswith(".safetensors"):
            state = {}
            from safetensors.torch import load_file

            state.update(load_file(directory / name))
            os.unlink(directory / name)
            torch.save(state, directory / "pytorch_model.bin")
    return directory
