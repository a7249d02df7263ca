"""Tiny random-weight Hugging Face model directories of each architecture the GGUF view
offers: config.json and model.safetensors (bf16, f16 or f32 matrices), written here with a
safetensors header of our own (numpy has no bfloat16), a few hundred KB each."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np

DTYPES = {"BF16": 2, "F16": 2, "F32": 4}


def as_dtype(values: np.ndarray, dtype: str) -> bytes:
    values = values.astype(np.float32)
    if dtype == "F32":
        return values.tobytes()
    if dtype == "F16":
        return values.astype(np.float16).tobytes()
    bits = values.view(np.uint32)
    return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16).tobytes()


def write_safetensors(path: Path, tensors: dict[str, tuple[str, tuple[int, ...], bytes]],
                      metadata: dict | None = None) -> None:
    doc: dict = {"__metadata__": metadata or {"format": "pt"}}
    at = 0
    for name, (dtype, shape, data) in tensors.items():
        doc[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [at, at + len(data)]}
        at += len(data)
    raw = json.dumps(doc).encode()
    raw += b" " * (-len(raw) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(raw)) + raw)
        for _, (_, _, data) in tensors.items():
            f.write(data)


def random_tensors(shapes: dict[str, tuple[int, ...]], dtype: str, seed: int = 0,
                   ones: tuple[str, ...] = ("norm",)) -> dict:
    rng = np.random.default_rng(seed)
    out = {}
    for name, shape in shapes.items():
        values = rng.standard_normal(shape).astype(np.float32) * 0.05
        if len(shape) == 1 and any(k in name for k in ones):
            values = values + 1.0
        out[name] = (dtype, shape, as_dtype(values, dtype))
    return out


def llama_shapes(cfg: dict, tied: bool = False) -> dict[str, tuple[int, ...]]:
    h, ff, v = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    nh, nkv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    hd = cfg.get("head_dim") or h // nh
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (v, h)}
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        shapes[p + "input_layernorm.weight"] = (h,)
        shapes[p + "self_attn.q_proj.weight"] = (nh * hd, h)
        shapes[p + "self_attn.k_proj.weight"] = (nkv * hd, h)
        shapes[p + "self_attn.v_proj.weight"] = (nkv * hd, h)
        shapes[p + "self_attn.o_proj.weight"] = (h, nh * hd)
        shapes[p + "post_attention_layernorm.weight"] = (h,)
        shapes[p + "mlp.gate_proj.weight"] = (ff, h)
        shapes[p + "mlp.up_proj.weight"] = (ff, h)
        shapes[p + "mlp.down_proj.weight"] = (h, ff)
    shapes["model.norm.weight"] = (h,)
    if not tied:
        shapes["lm_head.weight"] = (v, h)
    return shapes


def llama_config(vocab_size: int, **more) -> dict:
    cfg = {"architectures": ["LlamaForCausalLM"], "model_type": "llama",
           "hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4,
           "num_key_value_heads": 2, "num_hidden_layers": 2, "vocab_size": vocab_size,
           "max_position_embeddings": 256, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
           "bos_token_id": 1, "eos_token_id": 2, "tie_word_embeddings": False,
           "torch_dtype": "bfloat16", "hidden_act": "silu"}
    cfg.update(more)
    return cfg


def write_llama(directory: Path, vocab_size: int, dtype: str = "BF16", seed: int = 0,
                **more) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    cfg = llama_config(vocab_size, **more)
    (directory / "config.json").write_text(json.dumps(cfg, indent=2))
    tensors = random_tensors(llama_shapes(cfg, cfg.get("tie_word_embeddings", False)), dtype, seed)
    write_safetensors(directory / "model.safetensors", tensors)
    return directory


def qwen_shapes(cfg: dict, qwen3: bool) -> dict[str, tuple[int, ...]]:
    shapes = llama_shapes(cfg, cfg.get("tie_word_embeddings", False))
    nh, nkv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    hd = cfg.get("head_dim") or cfg["hidden_size"] // nh
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}.self_attn."
        if qwen3:
            shapes[p + "q_norm.weight"] = (hd,)
            shapes[p + "k_norm.weight"] = (hd,)
        else:
            shapes[p + "q_proj.bias"] = (nh * hd,)
            shapes[p + "k_proj.bias"] = (nkv * hd,)
            shapes[p + "v_proj.bias"] = (nkv * hd,)
    return shapes


def write_qwen(directory: Path, vocab_size: int, qwen3: bool = False, dtype: str = "BF16",
               seed: int = 1, **more) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    cfg = llama_config(vocab_size, **more)
    cfg.update({"architectures": ["Qwen3ForCausalLM" if qwen3 else "Qwen2ForCausalLM"],
                "model_type": "qwen3" if qwen3 else "qwen2", "rope_theta": 1000000.0,
                "rms_norm_eps": 1e-6, "max_window_layers": 2, "use_sliding_window": False,
                "sliding_window": 256})
    if qwen3:
        cfg["head_dim"] = 16
    cfg.update(more)
    (directory / "config.json").write_text(json.dumps(cfg, indent=2))
    tensors = random_tensors(qwen_shapes(cfg, qwen3), dtype, seed)
    write_safetensors(directory / "model.safetensors", tensors)
    return directory


def write_gemma3(directory: Path, vocab_size: int, dtype: str = "BF16", seed: int = 2,
                 **more) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    cfg = {"architectures": ["Gemma3ForCausalLM"], "model_type": "gemma3_text",
           "hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4,
           "num_key_value_heads": 1, "head_dim": 16, "num_hidden_layers": 2,
           "vocab_size": vocab_size, "max_position_embeddings": 512, "rms_norm_eps": 1e-6,
           "rope_theta": 1000000.0, "rope_local_base_freq": 10000.0, "sliding_window": 128,
           "query_pre_attn_scalar": 16, "bos_token_id": 2, "eos_token_id": 1,
           "pad_token_id": 0, "torch_dtype": "bfloat16",
           "hidden_activation": "gelu_pytorch_tanh"}
    cfg.update(more)
    (directory / "config.json").write_text(json.dumps(cfg, indent=2))
    h, ff, v, hd = cfg["hidden_size"], cfg["intermediate_size"], vocab_size, cfg["head_dim"]
    nh, nkv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (v, h)}
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        for norm in ("input_layernorm", "post_attention_layernorm",
                     "pre_feedforward_layernorm", "post_feedforward_layernorm"):
            shapes[p + norm + ".weight"] = (h,)
        shapes[p + "self_attn.q_proj.weight"] = (nh * hd, h)
        shapes[p + "self_attn.k_proj.weight"] = (nkv * hd, h)
        shapes[p + "self_attn.v_proj.weight"] = (nkv * hd, h)
        shapes[p + "self_attn.o_proj.weight"] = (h, nh * hd)
        shapes[p + "self_attn.q_norm.weight"] = (hd,)
        shapes[p + "self_attn.k_norm.weight"] = (hd,)
        shapes[p + "mlp.gate_proj.weight"] = (ff, h)
        shapes[p + "mlp.up_proj.weight"] = (ff, h)
        shapes[p + "mlp.down_proj.weight"] = (h, ff)
    shapes["model.norm.weight"] = (h,)
    write_safetensors(directory / "model.safetensors", random_tensors(shapes, dtype, seed, ()))
    return directory


def write_bert(directory: Path, vocab_size: int, dtype: str = "F32", seed: int = 3,
               **more) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    cfg = {"architectures": ["BertModel"], "model_type": "bert", "hidden_size": 64,
           "intermediate_size": 128, "num_attention_heads": 4, "num_hidden_layers": 2,
           "vocab_size": vocab_size, "max_position_embeddings": 128, "type_vocab_size": 2,
           "layer_norm_eps": 1e-12, "hidden_act": "gelu", "pad_token_id": 0}
    cfg.update(more)
    (directory / "config.json").write_text(json.dumps(cfg, indent=2))
    h, ff = cfg["hidden_size"], cfg["intermediate_size"]
    shapes: dict[str, tuple[int, ...]] = {
        "embeddings.word_embeddings.weight": (vocab_size, h),
        "embeddings.position_embeddings.weight": (cfg["max_position_embeddings"], h),
        "embeddings.token_type_embeddings.weight": (cfg["type_vocab_size"], h),
        "embeddings.LayerNorm.weight": (h,), "embeddings.LayerNorm.bias": (h,),
        "embeddings.position_ids": (1, cfg["max_position_embeddings"]),
    }
    for i in range(cfg["num_hidden_layers"]):
        p = f"encoder.layer.{i}."
        for part in ("attention.self.query", "attention.self.key", "attention.self.value",
                     "attention.output.dense"):
            shapes[p + part + ".weight"] = (h, h)
            shapes[p + part + ".bias"] = (h,)
        shapes[p + "attention.output.LayerNorm.weight"] = (h,)
        shapes[p + "attention.output.LayerNorm.bias"] = (h,)
        shapes[p + "intermediate.dense.weight"] = (ff, h)
        shapes[p + "intermediate.dense.bias"] = (ff,)
        shapes[p + "output.dense.weight"] = (h, ff)
        shapes[p + "output.dense.bias"] = (h,)
        shapes[p + "output.LayerNorm.weight"] = (h,)
        shapes[p + "output.LayerNorm.bias"] = (h,)
    shapes["pooler.dense.weight"] = (h, h)
    shapes["pooler.dense.bias"] = (h,)
    tensors = random_tensors(shapes, dtype, seed, ("LayerNorm.weight",))
    import numpy as np
    tensors["embeddings.position_ids"] = (
        "I64", (1, cfg["max_position_embeddings"]),
        np.arange(cfg["max_position_embeddings"], dtype="<i8").reshape(1, -1).tobytes())
    write_safetensors(directory / "model.safetensors", tensors)
    return directory
