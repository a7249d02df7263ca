"""Tiny models that real programs run, written by the reference writers: a llama GGUF for
llama.cpp (gguf-py's GGUFWriter, random weights, a SentencePiece-style vocabulary llama.cpp
accepts) and a transformers model directory (save_pretrained, one file or shards with an
index).  Seconds to write, kilobytes to megabytes: the client tests load them through mounts
and compare with the same load from the local files."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

# One shape for both formats: small, but every dimension a multiple of the 32-element blocks
# of the quantized GGUF types, and grouped-query attention (fewer key/value heads) as in
# today's llamas.
N_VOCAB = 320           # 3 control tokens, 256 byte tokens, 61 pieces
N_EMBD = 64
N_FF = 128
N_LAYER = 2
N_HEAD = 4
N_HEAD_KV = 2
N_CTX = 256           # llama.cpp pads a context to 256
BOS, EOS = 1, 2
PROMPT_IDS = [BOS, 300, 301, 302, 303, 304, 305]


def _vocab() -> tuple[list[str], list[float], list[int]]:
    import gguf

    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    types = [gguf.TokenType.UNKNOWN, gguf.TokenType.CONTROL, gguf.TokenType.CONTROL]
    types += [gguf.TokenType.BYTE] * 256
    pieces = [f"\u2581{chr(ord('a') + i % 26)}{'' if i < 26 else chr(ord('a') + i // 26)}"
              for i in range(N_VOCAB - len(tokens))]
    tokens += pieces
    types += [gguf.TokenType.NORMAL] * len(pieces)
    scores = [0.0] * 3 + [0.0] * 256 + [-float(i) for i in range(len(pieces))]
    return tokens, scores, [int(t) for t in types]


def write_llama_gguf(path: Path, qtype: str = "F16", seed: int = 0) -> Path:
    """A 2-layer llama with random weights; its 2-D weights stored as ``qtype`` (F32, F16
    or Q8_0), the norms F32 as llama.cpp wants them."""
    import gguf
    from gguf.quants import quantize

    rng = np.random.default_rng(seed)
    arch = "llama"
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_name("tensorfs tiny llama")
    writer.add_context_length(N_CTX)
    writer.add_embedding_length(N_EMBD)
    writer.add_block_count(N_LAYER)
    writer.add_feed_forward_length(N_FF)
    writer.add_head_count(N_HEAD)
    writer.add_head_count_kv(N_HEAD_KV)
    writer.add_rope_dimension_count(N_EMBD // N_HEAD)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_vocab_size(N_VOCAB)
    writer.add_file_type({"F32": gguf.LlamaFileType.ALL_F32, "F16": gguf.LlamaFileType.MOSTLY_F16,
                          "Q8_0": gguf.LlamaFileType.MOSTLY_Q8_0}[qtype])
    tokens, scores, types = _vocab()
    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens)
    writer.add_token_scores(scores)
    writer.add_token_types(types)
    writer.add_bos_token_id(BOS)
    writer.add_eos_token_id(EOS)
    writer.add_unk_token_id(0)
    writer.add_add_bos_token(True)

    kv = N_EMBD // N_HEAD * N_HEAD_KV

    def weight(rows: int, cols: int) -> np.ndarray:
        return (rng.standard_normal((rows, cols)) / np.sqrt(cols)).astype(np.float32)

    def norm() -> np.ndarray:
        return (1 + 0.1 * rng.standard_normal(N_EMBD)).astype(np.float32)

    tensors: dict[str, np.ndarray] = {"token_embd.weight": weight(N_VOCAB, N_EMBD)}
    for i in range(N_LAYER):
        tensors.update({
            f"blk.{i}.attn_norm.weight": norm(),
            f"blk.{i}.attn_q.weight": weight(N_EMBD, N_EMBD),
            f"blk.{i}.attn_k.weight": weight(kv, N_EMBD),
            f"blk.{i}.attn_v.weight": weight(kv, N_EMBD),
            f"blk.{i}.attn_output.weight": weight(N_EMBD, N_EMBD),
            f"blk.{i}.ffn_norm.weight": norm(),
            f"blk.{i}.ffn_gate.weight": weight(N_FF, N_EMBD),
            f"blk.{i}.ffn_up.weight": weight(N_FF, N_EMBD),
            f"blk.{i}.ffn_down.weight": weight(N_EMBD, N_FF),
        })
    tensors["output_norm.weight"] = norm()
    tensors["output.weight"] = weight(N_VOCAB, N_EMBD)
    for name, array in tensors.items():
        if array.ndim == 1 or qtype == "F32":
            writer.add_tensor(name, array)
        elif qtype == "F16":
            writer.add_tensor(name, array.astype(np.float16))
        else:
            q = getattr(gguf.GGMLQuantizationType, qtype)
            writer.add_tensor(name, quantize(array, q), raw_dtype=q)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def llama_config():
    from transformers import LlamaConfig

    return LlamaConfig(vocab_size=N_VOCAB, hidden_size=N_EMBD, intermediate_size=N_FF,
                       num_hidden_layers=N_LAYER, num_attention_heads=N_HEAD,
                       num_key_value_heads=N_HEAD_KV, max_position_embeddings=N_CTX,
                       bos_token_id=BOS, eos_token_id=EOS, tie_word_embeddings=False)


def write_transformers_model(directory: Path, max_shard_size: str | None = None,
                             seed: int = 0) -> Path:
    """A LlamaForCausalLM saved with safetensors (config.json, generation_config.json,
    model.safetensors; with ``max_shard_size`` shards and model.safetensors.index.json)."""
    import torch
    from transformers import LlamaForCausalLM

    torch.manual_seed(seed)
    model = LlamaForCausalLM(llama_config()).eval()
    kwargs = {"max_shard_size": max_shard_size} if max_shard_size else {}
    model.save_pretrained(directory, safe_serialization=True, **kwargs)
    if max_shard_size:
        index = json.loads((directory / "model.safetensors.index.json").read_text())
        assert len(set(index["weight_map"].values())) > 1, "the model was not sharded"
    return directory
