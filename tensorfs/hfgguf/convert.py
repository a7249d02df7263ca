"""What llama.cpp's ``convert_hf_to_gguf.py`` writes for a model directory: its metadata in
order, its tensors in order, and where each tensor's bytes come from.

Each fact follows the converter vendored in llama-cpp-python 0.3.36 (``conversion/base.py``:
``ModelBase.index_tensors``, ``prepare_tensors``, ``prepare_metadata``, ``TextModel``'s
``set_gguf_parameters``; ``conversion/llama.py``, ``qwen.py``, ``gemma.py``, ``bert.py``):
the comments name the method each rule comes from.  The metadata is made by gguf-py's own
``GGUFWriter`` (``add_*`` in the converter's order) and ``Metadata`` heuristics, so that
its keys, types and order are the converter's by construction.

Nothing here reads a tensor's bytes: ``OutTensor`` says how they are made
(``tensorfs.hfgguf.served`` makes them).
"""

from __future__ import annotations

import io
import json
import logging
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from tensorfs.model import TensorInfo

# the types a matrix of the source may have for the file in "its own type"
OWN_TYPES = {"BF16": "bf16", "F16": "f16", "F32": "f32"}
FLOAT_DTYPES = ("BF16", "F16", "F32")

Read = Callable[[str], "bytes | None"]


class NoGguf(Exception):
    """One line: why the converter would not write a GGUF for this directory."""


@dataclass
class OutTensor:
    """One tensor of the GGUF: its name, ggml type and shape (numpy order, as the
    converter's array), and how its bytes are made: from ``source`` (rows gathered through
    ``perm``, the first ``shape[0]`` rows, ``shift`` added), quantized to ``qtype``; or
    ``values`` (float32, made here: rope_freqs)."""
    name: str
    qtype: int                          # gguf.GGMLQuantizationType
    shape: tuple[int, ...]
    source: TensorInfo | None
    perm: tuple[int, int] | None = None     # (n_head, rows): llama's q/k rope permutation
    shift: float = 0.0
    values: Any = None                  # numpy float32 array (rope_freqs)

    @property
    def rows_cols(self) -> tuple[int, int]:
        if len(self.shape) <= 1:
            return (self.shape[0] if self.shape else 1), 1
        return math.prod(self.shape[:-1]), self.shape[-1]

    @property
    def nbytes(self) -> int:
        rows, cols = self.rows_cols
        return rows * row_bytes(self.qtype, cols)

    @property
    def copied(self) -> bool:
        """The bytes are the source's (rows gathered, maybe): no arithmetic."""
        if self.source is None or self.shift:
            return False
        from tensorfs.runtime.libraries import gguf
        Q = gguf.GGMLQuantizationType
        return {"BF16": Q.BF16, "F16": Q.F16, "F32": Q.F32}.get(self.source.dtype) == self.qtype


def row_bytes(qtype: int, cols: int) -> int:
    from tensorfs.runtime.libraries import gguf
    block, size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType(qtype)]
    return cols // block * size


@dataclass
class Plan:
    """A GGUF the converter writes: its file name, header (every byte before the data,
    padding included), alignment and tensors in order."""
    name: str
    head: bytes
    alignment: int
    tensors: list[OutTensor]
    arch: str = ""
    notes: list[str] = field(default_factory=list)


# -- the directory as the converter reads it -------------------------------------------------

def load_hparams(read: Read) -> dict:
    """``ModelBase.load_hparams``: config.json, with the renames it does."""
    raw = read("config.json")
    if raw is None:
        raise NoGguf("no config.json")
    try:
        config = json.loads(raw)
    except ValueError as error:
        raise NoGguf(f"config.json is not JSON: {error}") from None
    if not isinstance(config, dict):
        raise NoGguf("config.json is not a JSON object")
    if "llm_config" in config:
        config["text_config"] = config["llm_config"]
    if "lm_config" in config:
        config["text_config"] = config["lm_config"]
    if "thinker_config" in config:
        config["text_config"] = config["thinker_config"]["text_config"]
    if "language_config" in config:
        config["text_config"] = config["language_config"]
    if "lfm" in config:
        config["text_config"] = config["lfm"]
    return config


# What transformers' config classes (4.57, ``AutoConfig.from_pretrained(...).to_dict()``,
# which the converter's ``load_hparams`` reads) add to config.json: their defaults, for the
# keys the converter reads, by ``model_type``.  A config.json without a known model_type is
# read as it is (the converter falls back to the JSON too).
_COMMON = {"tie_word_embeddings": False, "max_length": 20, "bos_token_id": None,
           "eos_token_id": None, "pad_token_id": None}
CONFIG_DEFAULTS: dict[str, dict] = {
    "llama": {**_COMMON, "vocab_size": 32000, "max_position_embeddings": 2048,
              "hidden_size": 4096, "intermediate_size": 11008, "num_hidden_layers": 32,
              "num_attention_heads": 32, "rms_norm_eps": 1e-06, "rope_theta": 10000.0,
              "rope_scaling": None, "bos_token_id": 1, "eos_token_id": 2},
    "qwen2": {**_COMMON, "vocab_size": 151936, "max_position_embeddings": 32768,
              "hidden_size": 4096, "intermediate_size": 22016, "num_hidden_layers": 32,
              "num_attention_heads": 32, "rms_norm_eps": 1e-06, "rope_theta": 10000.0,
              "rope_scaling": None, "sliding_window": None},
    "qwen3": {**_COMMON, "vocab_size": 151936, "max_position_embeddings": 32768,
              "hidden_size": 4096, "intermediate_size": 22016, "num_hidden_layers": 32,
              "num_attention_heads": 32, "head_dim": 128, "rms_norm_eps": 1e-06,
              "rope_theta": 10000.0, "rope_scaling": None, "sliding_window": None},
    "gemma3_text": {**_COMMON, "tie_word_embeddings": True, "bos_token_id": 2,
                    "eos_token_id": 1, "pad_token_id": 0, "vocab_size": 262208,
                    "max_position_embeddings": 131072, "hidden_size": 2304,
                    "intermediate_size": 9216, "num_hidden_layers": 26,
                    "num_attention_heads": 8, "head_dim": 256, "num_key_value_heads": 4,
                    "rms_norm_eps": 1e-06, "rope_theta": 1000000.0, "sliding_window": 4096,
                    "final_logit_softcapping": None, "attn_logit_softcapping": None,
                    "rope_local_base_freq": 10000.0, "rope_scaling": None},
    "bert": {**_COMMON, "tie_word_embeddings": True, "pad_token_id": 0, "vocab_size": 30522,
             "hidden_size": 768, "num_hidden_layers": 12, "num_attention_heads": 12,
             "intermediate_size": 3072, "max_position_embeddings": 512, "type_vocab_size": 2,
             "layer_norm_eps": 1e-12},
}


def as_transformers_reads(config: dict) -> dict:
    """config.json as ``AutoConfig.from_pretrained(dir).to_dict()`` gives it, for the keys
    the converter reads: the class's defaults under what the file says, and what the
    class derives (head_dim, num_key_value_heads)."""
    model_type = config.get("model_type")
    defaults = CONFIG_DEFAULTS.get(model_type) if isinstance(model_type, str) else None
    if defaults is None:
        return config
    out = {**defaults, **config}
    if "torch_dtype" in out:
        out["dtype"] = out.pop("torch_dtype")
    if model_type in ("llama", "qwen2", "qwen3") and out.get("num_key_value_heads") is None:
        out["num_key_value_heads"] = out["num_attention_heads"]
    if model_type == "llama" and out.get("head_dim") is None:
        heads = out["num_attention_heads"]
        if not isinstance(heads, int) or heads <= 0:
            raise NoGguf(f"config.json: num_attention_heads is {heads!r}")
        out["head_dim"] = out["hidden_size"] // heads
    if model_type == "qwen2":
        out.pop("head_dim", None) if "head_dim" not in config else None
        if not out.get("use_sliding_window"):
            out["sliding_window"] = None
    rope = out.get("rope_scaling")
    if isinstance(rope, dict) and "type" in rope:
        out["rope_scaling"] = {**rope, "rope_type": rope["type"]}
    return out


def model_architecture(hparams: dict) -> str:
    """``get_model_architecture`` for a text model."""
    arch = None
    arches = hparams.get("architectures")
    if arches is not None and len(arches) > 0:
        arch = arches[0]
    text_config = hparams.get("text_config", {})
    if isinstance(text_config, dict) and text_config.get("architectures") is not None:
        arch = text_config["architectures"][0]
    if not isinstance(arch, str):
        raise NoGguf("config.json names no architecture")
    return arch


# -- architectures ---------------------------------------------------------------------------

class Arch:
    """A converter model class, as far as the files it writes go."""
    hf_names: tuple[str, ...] = ()
    gguf_arch: str = ""

    def __init__(self, hf_arch: str, hparams: dict, read: Read):
        self.hf_arch = hf_arch
        self.read = read
        if "text_config" in hparams and isinstance(hparams["text_config"], dict):
            hparams = {**hparams, **hparams["text_config"]}
        self.hparams = hparams
        from tensorfs.runtime.libraries import gguf
        self.model_arch = getattr(gguf.MODEL_ARCH, self.gguf_arch)
        self.block_count = self.find_hparam(["n_layers", "num_hidden_layers", "n_layer",
                                             "num_layers"])
        if not isinstance(self.block_count, int) or self.block_count < 0:
            raise NoGguf(f"config.json: num_hidden_layers is {self.block_count!r}")
        self.tensor_map = gguf.get_tensor_name_map(self.model_arch, self.block_count)
        rope = self.hparams.get("rope_parameters", self.hparams.get("rope_scaling")) or {}
        self.rope_parameters = dict(rope) if isinstance(rope, dict) else {}
        self._mirror_rope()

    def _mirror_rope(self) -> None:
        """``TextModel.__init__``: the global rope parameters mirrored in rope_parameters."""
        p = self.rope_parameters
        rope_theta = self.find_hparam(["global_rope_theta", "rope_global_theta",
                                       "rope_theta_global", "rope_theta", "rotary_emb_base"],
                                      optional=True)
        local = self.find_hparam(["local_rope_theta", "rope_local_theta", "rope_theta_local",
                                  "swa_rope_theta", "rope_local_base_freq"], optional=True)
        partial = self.find_hparam(["partial_rotary_factor", "rope_pct", "rope_percent"],
                                   optional=True)
        original = self.find_hparam(["original_max_position_embeddings"], optional=True)
        if "full_attention" not in p and "sliding_attention" not in p:
            if local is not None:
                p["sliding_attention"] = {"rope_theta": local}
            if "rope_theta" not in p and rope_theta is not None:
                p["rope_theta"] = rope_theta
            if "rope_type" not in p and (rope_type := p.get("type")) is not None:
                p["rope_type"] = rope_type
            if "partial_rotary_factor" not in p and partial is not None:
                p["partial_rotary_factor"] = partial
            if "original_max_position_embeddings" not in p and original is not None:
                p["original_max_position_embeddings"] = original

    def find_hparam(self, keys, optional: bool = False):
        key = next((k for k in keys if k in self.hparams), None)
        if key is not None:
            return self.hparams[key]
        if optional:
            return None
        raise NoGguf(f"config.json has none of {', '.join(keys)}")

    # what a model class refuses, before anything is written
    def check(self) -> None:
        q = self.hparams.get("quantization_config")
        if q:
            method = q.get("quant_method") if isinstance(q, dict) else None
            raise NoGguf(f"config.json has a quantization_config ({method or 'quantized'}): "
                         "its tensors are dequantized by the converter, not offered here")
        experts = self.find_hparam(["num_local_experts", "num_experts", "n_routed_experts"],
                                   optional=True)
        if experts:
            raise NoGguf(f"a mixture of experts ({experts} experts): not offered here")

    def filter_tensor(self, name: str) -> str | None:
        """``filter_tensors`` (ModelBase, TextModel, the class's own)."""
        if name.startswith(("mlp", "vit.", "vpm.", "siglip2.", "conformer.", "merger.",
                            "resampler.", "sound_encoder.", "sound_projection.",
                            "speech_embeddings.")) \
                or "visual." in name or "vision." in name or "audio." in name \
                or "talker." in name or "vision_" in name or "audio_" in name \
                or "token2wav." in name or "code2wav." in name \
                or "projector." in name or "pre_mm_projector_norm" in name \
                or "image_newline" in name or "view_seperator" in name \
                or "patch_embed" in name or "patch_embedding" in name \
                or "patch_merger." in name or "patch_merge_mlp." in name \
                or "model.connector." in name:
            return None
        if name.endswith("e_score_correction_bias"):
            name = name.replace("e_score_correction_bias", "e_score_correction.bias")
        if "language_model." in name:
            name = name.replace("language_model.", "")
        return name

    def map_name(self, name: str) -> str:
        new = self.tensor_map.get_name(key=name, try_suffixes=(".weight", ".bias"))
        if new is None:
            raise NoGguf(f"the converter cannot map the tensor {name!r}")
        return new

    def modify(self, name: str, t: OutTensor, bid: int | None) -> list[OutTensor]:
        t.name = self.map_name(name)
        return [t]

    def extra_tensors(self) -> list[tuple[str, OutTensor]]:
        return []

    def vocab_count(self, fields) -> int:
        for key, _, value in fields:
            if key == "tokenizer.ggml.tokens":
                return len(value[1])
        raise NoGguf("the tokenizer has no tokens")

    # -- metadata ----------------------------------------------------------------------------
    def set_gguf_parameters(self, w, ftype) -> None:
        """``TextModel.set_gguf_parameters``."""
        from tensorfs.runtime.libraries import gguf
        w.add_block_count(self.block_count)
        n_ctx = self.find_hparam(["max_position_embeddings", "n_ctx", "n_positions",
                                  "max_length", "max_sequence_length", "model_max_length"],
                                 optional=True)
        if n_ctx is not None:
            w.add_context_length(n_ctx)
        if (n_embd := self.find_hparam(["hidden_size", "n_embd", "dim"], optional=True)) is not None:
            w.add_embedding_length(n_embd)
        if (n_ff := self.find_hparam(["prefix_dense_intermediate_size", "dense_intermediate_size",
                                      "intermediate_size", "n_inner", "hidden_dim"],
                                     optional=True)) is not None:
            w.add_feed_forward_length(n_ff)
        if (n_head := self.find_hparam(["num_attention_heads", "n_head", "n_heads"],
                                       optional=True)) is not None:
            w.add_head_count(n_head)
        if (n_head_kv := self.find_hparam(["num_key_value_heads", "n_kv_heads"],
                                          optional=True)) is not None:
            w.add_head_count_kv(n_head_kv)
        if self.hparams.get("is_causal") is False:
            w.add_causal_attention(False)
        rope_params = self.rope_parameters.get("full_attention", self.rope_parameters)
        if (rope_type := rope_params.get("rope_type")) is not None:
            factor = rope_params.get("factor")
            if rope_type == "linear" and factor is not None:
                w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
                w.add_rope_scaling_factor(factor)
            elif rope_type == "yarn" and factor is not None:
                w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
                w.add_rope_scaling_factor(factor)
                w.add_rope_scaling_orig_ctx_len(rope_params["original_max_position_embeddings"])
                if (v := rope_params.get("extrapolation_factor")) is not None:
                    w.add_rope_scaling_yarn_ext_factor(v)
                if (v := rope_params.get("attention_factor", rope_params.get("attn_factor"))) is not None:
                    w.add_rope_scaling_yarn_attn_factor(v)
                if (v := rope_params.get("beta_fast")) is not None:
                    w.add_rope_scaling_yarn_beta_fast(v)
                if (v := rope_params.get("beta_slow")) is not None:
                    w.add_rope_scaling_yarn_beta_slow(v)
            elif rope_type in ("su", "longrope"):
                w.add_rope_scaling_type(gguf.RopeScalingType.LONGROPE)
        if "mrope_section" in self.rope_parameters:
            section = list(self.rope_parameters["mrope_section"])
            while len(section) < 4:
                section.append(0)
            w.add_rope_dimension_sections(section[:4])
        if (rope_theta := rope_params.get("rope_theta")) is not None:
            w.add_rope_freq_base(rope_theta)
        sliding = self.rope_parameters.get("sliding_attention", {})
        if (local := sliding.get("rope_theta")) is not None:
            w.add_rope_freq_base_swa(local)
        if (eps := self.find_hparam(["rms_norm_eps", "norm_eps"], optional=True)) is not None:
            w.add_layer_norm_rms_eps(eps)
        if (eps := self.find_hparam(["layer_norm_eps", "layer_norm_epsilon", "norm_epsilon"],
                                    optional=True)) is not None:
            w.add_layer_norm_eps(eps)
        if (n := self.find_hparam(["num_experts_per_tok", "num_experts_per_token",
                                   "top_k_experts"], optional=True)) is not None:
            w.add_expert_used_count(n)
        if (n := self.hparams.get("n_group")) is not None:
            w.add_expert_group_count(n)
        if (n := self.hparams.get("topk_group")) is not None:
            w.add_expert_group_used_count(n)
        if self.find_hparam(["score_function", "scoring_func", "score_func",
                             "moe_router_activation", "moe_router_activation_func",
                             "expert_selection_fn"], optional=True) is not None:
            raise NoGguf("an expert gating function: a mixture of experts, not offered here")
        if (head_dim := self.hparams.get("head_dim")) is not None:
            w.add_key_length(head_dim)
            w.add_value_length(head_dim)
        w.add_file_type(ftype)

    def pooling_type(self, w) -> None:
        """``TextModel._try_set_pooling_type``."""
        from tensorfs.runtime.libraries import gguf
        pooling_path = None
        raw = self.read("modules.json")
        if raw is not None:
            for mod in json.loads(raw):
                if mod["type"].endswith("Pooling"):
                    pooling_path = mod["path"]
                    break
        modes = {"mean": gguf.PoolingType.MEAN, "cls": gguf.PoolingType.CLS,
                 "lasttoken": gguf.PoolingType.LAST}
        if pooling_path is not None:
            raw = self.read(f"{pooling_path}/config.json")
            if raw is None:
                raise NoGguf(f"modules.json names {pooling_path}/config.json, which is missing")
            pooling = json.loads(raw)
            if pooling.get("pooling_mode_mean_tokens"):
                kind = gguf.PoolingType.MEAN
            elif pooling.get("pooling_mode_cls_token"):
                kind = gguf.PoolingType.CLS
            elif pooling.get("pooling_mode_lasttoken"):
                kind = gguf.PoolingType.LAST
            elif (mode := pooling.get("pooling_mode")) in modes:
                kind = modes[mode]
            else:
                raise NoGguf("a pooling other than mean, cls and last token")
            w.add_pooling_type(kind)
        if (classifier := self.hparams.get("classifier_pooling")) is not None:
            if classifier not in ("cls", "mean"):
                raise NoGguf(f"classifier_pooling {classifier!r}")
            w.add_classifier_pooling_type(modes[classifier])


def permute_rows(rows: int, n_head: int) -> list[int]:
    """``LlamaModel.permute``: output row -> source row of
    ``w.reshape(n_head, 2, rows // n_head // 2, ...).swapaxes(1, 2).reshape(w.shape)``."""
    half = rows // n_head // 2
    out = []
    for h in range(n_head):
        for i in range(half):
            for j in range(2):
                out.append(h * 2 * half + j * half + i)
    return out


class Llama(Arch):
    hf_names = ("LlamaForCausalLM", "LLaMAForCausalLM", "LlamaModel")
    gguf_arch = "LLAMA"

    def check(self) -> None:
        super().check()
        if "draft_vocab_size" in self.hparams and self.hparams.get("num_hidden_layers") == 1:
            raise NoGguf("an EAGLE-3 draft model: the converter needs --target-model-dir")
        raw = self.read("tokenizer_config.json")
        if raw is not None:
            try:
                config = json.loads(raw)
            except ValueError:
                config = {}
            if isinstance(config, dict) and config.get("tokenizer_class") == "HybridDNATokenizer":
                raise NoGguf("a HybridDNATokenizer: not offered here")
        if self.read("tekken.json") is not None and self.read("tokenizer.json") is None:
            raise NoGguf("a Mistral tekken tokenizer: not offered here")
        if self.hparams.get("vocab_size", 32000) == 32016:
            raise NoGguf("a CodeLlama vocabulary (32016): not offered here")

    def filter_tensor(self, name: str) -> str | None:
        if "text_model." in name:
            name = name.replace("text_model.", "")
        return super().filter_tensor(name)

    def modify(self, name: str, t: OutTensor, bid: int | None) -> list[OutTensor]:
        n_head = self.find_hparam(["n_heads", "num_attention_heads"])
        n_kv_head = self.find_hparam(["n_kv_heads", "num_key_value_heads"])
        if self.hf_arch == "LlamaModel":
            name = "model." + name
        heads = None
        if name.endswith(("q_proj.weight", "q_proj.bias")):
            heads = n_head
        if name.endswith(("k_proj.weight", "k_proj.bias")):
            heads = n_kv_head if n_kv_head is not None and n_head != n_kv_head else n_head
        if heads is not None:
            rows = t.shape[0]
            if not isinstance(heads, int) or heads <= 0 or rows % (heads * 2):
                raise NoGguf(f"config.json's head count ({heads}) does not divide {name}'s "
                             f"{rows} rows in two halves per head")
            t.perm = (heads, rows)
        if "block_sparse_moe.experts" in name:
            raise NoGguf("a mixture of experts: not offered here")
        return super().modify(name, t, bid)

    def set_gguf_parameters(self, w, ftype) -> None:
        super().set_gguf_parameters(w, ftype)
        w.add_vocab_size(self.hparams["vocab_size"])
        if (rope_dim := self.hparams.get("head_dim")) is None:
            rope_dim = self.hparams["hidden_size"] // self.hparams["num_attention_heads"]
        w.add_rope_dimension_count(rope_dim)

    def extra_tensors(self) -> list[tuple[str, OutTensor]]:
        """``LlamaModel.generate_extra_tensors``: rope_freqs for llama3 rope scaling, in
        float32 as torch computes it."""
        rope = self.rope_parameters.get("full_attention", self.rope_parameters)
        if not rope or str(rope.get("rope_type", "")).lower() != "llama3":
            return []
        from tensorfs.runtime.libraries import np

        base = rope.get("rope_theta", 10000.0)
        if (dim := self.hparams.get("head_dim")) is None:
            dim = self.hparams["hidden_size"] // self.hparams["num_attention_heads"]
        f32 = np.float32
        exponent = np.arange(0, dim, 2, dtype=f32) / f32(dim)
        freqs = f32(1.0) / np.power(f32(base), exponent).astype(f32)
        factor = rope.get("factor", 8.0)
        low = rope.get("low_freq_factor", 1.0)
        high = rope.get("high_freq_factor", 4.0)
        old = rope.get("original_max_position_embeddings", 8192)
        low_wavelen = old / low
        high_wavelen = old / high
        # torch computes each step in float32 (a tensor element and a Python number)
        factors: list = []
        for freq in freqs:
            wavelen = f32(f32(2 * math.pi) / freq)
            if wavelen < high_wavelen:
                factors.append(1)
            elif wavelen > low_wavelen:
                factors.append(factor)
            else:
                smooth = f32(f32(f32(old) / wavelen) - f32(low)) / f32(high - low)
                factors.append(f32(1) / (f32(f32(1) - f32(smooth)) / f32(factor) + f32(smooth)))
        from tensorfs.runtime.libraries import gguf
        values = np.array(factors, dtype=np.float32)
        name = gguf.TENSOR_NAMES[gguf.MODEL_TENSOR.ROPE_FREQS] + ".weight"
        return [(name, OutTensor(name, 0, values.shape, None, values=values))]


class Qwen2(Arch):
    hf_names = ("Qwen2ForCausalLM", "Qwen2Model")
    gguf_arch = "QWEN2"

    def modify(self, name: str, t: OutTensor, bid: int | None) -> list[OutTensor]:
        if self.hf_arch == "Qwen2Model":
            name = f"model.{name}"
        return super().modify(name, t, bid)

    def set_gguf_parameters(self, w, ftype) -> None:
        super().set_gguf_parameters(w, ftype)
        self.pooling_type(w)


class Qwen3(Qwen2):
    hf_names = ("Qwen3ForCausalLM", "Qwen3Model")
    gguf_arch = "QWEN3"

    def check(self) -> None:
        super().check()
        readme = (self.read("README.md") or b"").decode("utf-8", "replace").lower()
        hints = [str(self.hparams.get("_name_or_path", "")), str(self.hparams.get("model_type", "")),
                 self.hf_arch]
        if "# qwen3-reranker" in readme or any("reranker" in h.lower() for h in hints):
            raise NoGguf("a Qwen3 reranker: not offered here")
        if "sequenceclassification" in self.hf_arch.lower():
            raise NoGguf("a Qwen3 classifier: not offered here")

    def modify(self, name: str, t: OutTensor, bid: int | None) -> list[OutTensor]:
        return Arch.modify(self, name, t, bid)


class Gemma3(Arch):
    hf_names = ("Gemma3ForCausalLM",)
    gguf_arch = "GEMMA3"
    n_vocab: int | None = None

    def check(self) -> None:
        super().check()
        if self.hparams.get("attn_logit_softcapping") is not None:
            raise NoGguf("config.json sets attn_logit_softcapping, which Gemma 3 has not")

    def set_vocab_count(self, fields) -> None:
        """``modify_tensors``: the rows of token_embd kept, the vocabulary's tokens (from
        tokenizer.model: the token list written; else tokenizer.json's vocab and added
        tokens)."""
        if self.read("tokenizer.model") is not None:
            self.n_vocab = self.vocab_count(fields)
            return
        raw = self.read("tokenizer.json")
        if raw is None:
            raise NoGguf("no tokenizer.model nor tokenizer.json")
        doc = json.loads(raw)
        self.n_vocab = len(doc["model"]["vocab"]) + len(doc["added_tokens"])

    def modify(self, name: str, t: OutTensor, bid: int | None) -> list[OutTensor]:
        if "embed_tokens.weight" in name and self.n_vocab is not None:
            n = self.n_vocab
            rows = t.shape[0]
            keep = rows if n == -1 else min(max(0, n if n >= 0 else rows + n), rows)
            t.shape = (keep,) + t.shape[1:]
        if name.endswith("norm.weight"):
            t.shift = 1.0
        return super().modify(name, t, bid)

    def set_gguf_parameters(self, w, ftype) -> None:
        super().set_gguf_parameters(w, ftype)
        h = self.hparams
        w.add_context_length(h.get("max_position_embeddings", 131072))
        w.add_head_count(h.get("num_attention_heads", 8))
        w.add_layer_norm_rms_eps(h.get("rms_norm_eps", 1e-6))
        w.add_key_length(h.get("head_dim", 256))
        w.add_value_length(h.get("head_dim", 256))
        w.add_rope_freq_base(self.rope_parameters.get("full_attention", self.rope_parameters)
                             .get("rope_theta", 1_000_000.0))
        if (softcap := h.get("final_logit_softcapping")):
            w.add_final_logit_softcapping(softcap)
        if h.get("sliding_window_pattern") != 1:
            w.add_sliding_window(h["sliding_window"])
        w.add_head_count_kv(h.get("num_key_value_heads", 4))


class Bert(Arch):
    hf_names = ("BertModel", "BertForMaskedLM", "BertForSequenceClassification")
    gguf_arch = "BERT"

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        labels = self.hparams.get("id2label")
        self.labels: dict[int, str] | None = None
        if isinstance(labels, dict) and labels:
            labels = {int(k): v for k, v in labels.items()}
            if not (len(labels) == 2 and labels.get(0) == "LABEL_0"):
                self.labels = labels

    def filter_tensor(self, name: str) -> str | None:
        if name.startswith("bert."):
            name = name[5:]
        if name.endswith(".gamma"):
            name = name[:-6] + ".weight"
        if name.endswith(".beta"):
            name = name[:-5] + ".bias"
        if name in ("embeddings.position_ids", "pooler.dense.weight", "pooler.dense.bias"):
            return None
        if name.startswith(("cls.predictions", "cls.seq_relationship")):
            return None
        return super().filter_tensor(name)

    def modify(self, name: str, t: OutTensor, bid: int | None) -> list[OutTensor]:
        if self.labels:
            if name == "classifier.weight":
                name = "classifier.out_proj.weight"
            if name == "classifier.bias":
                name = "classifier.out_proj.bias"
        return super().modify(name, t, bid)

    def set_gguf_parameters(self, w, ftype) -> None:
        super().set_gguf_parameters(w, ftype)
        w.add_causal_attention(False)
        self.pooling_type(w)
        if self.labels:
            w.add_classifier_output_labels([v for _, v in sorted(self.labels.items())])


ARCHS: dict[str, type[Arch]] = {}
for _cls in (Llama, Qwen2, Qwen3, Gemma3, Bert):
    for _name in _cls.hf_names:
        ARCHS[_name] = _cls


# -- the tensors -----------------------------------------------------------------------------

_F32_KEYS = ("FFN_GATE_INP", "FFN_GATE_INP_SHEXP", "POS_EMBD", "TOKEN_TYPES", "SSM_CONV1D",
             "SHORTCONV_CONV", "TIME_MIX_FIRST", "TIME_MIX_W1", "TIME_MIX_W2",
             "TIME_MIX_DECAY_W1", "TIME_MIX_DECAY_W2", "TIME_MIX_LERP_FUSED", "POSNET_NORM1",
             "POSNET_NORM2", "V_ENC_EMBD_POS", "A_ENC_EMBD_POS", "ALTUP_CORRECT_COEF",
             "ALTUP_PREDICT_COEF", "SSM_CONV1D_Q", "SSM_CONV1D_K", "SSM_CONV1D_V",
             "INDEXER_PROJ")


def _matches(arch: Arch, new_name: str, key: str, bid: int | None) -> bool:
    """``ModelBase.match_model_tensor_name`` (suffix ".weight")."""
    from tensorfs.runtime.libraries import gguf
    tensor = getattr(gguf.MODEL_TENSOR, key, None)
    if tensor is None or tensor not in gguf.MODEL_TENSORS[arch.model_arch]:
        return False
    key_name = gguf.TENSOR_NAMES[tensor]
    if "{bid}" in key_name:
        if bid is None:
            return False
        key_name = key_name.format(bid=bid)
    elif bid is not None:
        return False
    return new_name == key_name + ".weight"


def choose_qtype(arch: Arch, t: OutTensor, bid: int | None, ftype) -> int:
    """``prepare_tensors``: the type a tensor is written in."""
    from tensorfs.runtime.libraries import gguf
    Q = gguf.GGMLQuantizationType
    F = gguf.LlamaFileType
    n_dims = len(t.shape)
    qtype: Any = False
    if n_dims <= 1 or t.name.endswith("_norm.weight"):
        qtype = Q.F32
    if qtype is False and (any(_matches(arch, t.name, k, bid) for k in _F32_KEYS)
                           or t.name[-7:] not in (".weight", ".lora_a", ".lora_b")):
        qtype = Q.F32
    if qtype is False:
        qtype = {F.ALL_F32: Q.F32, F.MOSTLY_F16: Q.F16, F.MOSTLY_BF16: Q.BF16,
                 F.MOSTLY_Q8_0: Q.Q8_0}[ftype]
    if qtype not in (Q.F32, Q.F16):
        block = gguf.GGML_QUANT_SIZES[qtype][0]
        cols = t.shape[-1] if t.shape else 1
        if cols % block:            # QuantError: "falling back to F16"
            qtype = Q.F16
    return int(qtype)


def own_outtype(ordered: list[tuple[str, TensorInfo]]) -> str:
    """The source's own float type: the first matrix's (as ``--outtype auto`` looks)."""
    for _, t in ordered:
        if len(t.shape) < 2:
            continue
        if t.dtype in FLOAT_DTYPES:
            return OWN_TYPES[t.dtype]
        raise NoGguf(f"the first matrix is {t.dtype}: no float type of its own to write")
    raise NoGguf("no matrix in the model")


def plan_tensors(arch: Arch, ordered: list[tuple[str, TensorInfo]], ftype,
                 n_vocab: int | None) -> list[OutTensor]:
    out: list[OutTensor] = []
    seen: set[str] = set()
    items: list[tuple[str, OutTensor]] = list(arch.extra_tensors())
    for name, info in ordered:
        items.append((name, OutTensor(name, 0, tuple(info.shape), info)))
    for name, t in items:
        if name.endswith((".attention.masked_bias", ".attention.bias", ".rotary_emb.inv_freq")):
            continue
        if t.source is not None and t.source.dtype not in FLOAT_DTYPES:
            raise NoGguf(f"{name} is {t.source.dtype}: the converter casts it to float")
        bid = None
        for part in name.split("."):
            if part.isdecimal():
                bid = int(part)
                break
        for new in arch.modify(name, t, bid):
            new.qtype = choose_qtype(arch, new, bid, ftype)
            if new.name in seen:
                raise NoGguf(f"two tensors map to {new.name}")
            seen.add(new.name)
            out.append(new)
    return out


# -- the metadata ----------------------------------------------------------------------------

def model_card(read: Read) -> dict:
    """``Metadata.load_model_card`` from README.md's bytes."""
    raw = read("README.md")
    if raw is None:
        return {}
    import yaml
    content = raw.decode("utf-8")
    lines = content.splitlines()
    if len(lines) == 0 or lines[0] != "---":
        return {}
    kept = []
    for line in lines[1:]:
        if line == "---":
            break
        kept.append(line)
    text = "\n".join(kept) + "\n"
    text = text.replace("- no\n", "- \"no\"\n").replace("\t", "  ")
    if not text:
        return {}
    data = yaml.safe_load(text)
    return data if isinstance(data, dict) else {}


def load_metadata(read: Read, hparams: dict, dir_name: str, total_params: int):
    """``gguf.Metadata.load(None, dir_model, None, total_params)`` from the files' bytes."""
    from tensorfs.runtime.libraries import gguf
    card = model_card(read)
    gen: dict = {}
    raw = read("generation_config.json")
    if raw is not None:
        try:
            gen = json.loads(raw)
        except ValueError:
            gen = {}
    metadata = gguf.Metadata.apply_metadata_heuristic(gguf.Metadata(), card, hparams,
                                                      Path(dir_name), total_params)
    if gen:
        for attr, key in (("sampling_sequence", "sequence"), ("sampling_top_k", "top_k"),
                          ("sampling_top_p", "top_p"), ("sampling_min_p", "min_p"),
                          ("sampling_xtc_probability", "xtc_probability"),
                          ("sampling_xtc_threshold", "xtc_threshold"),
                          ("sampling_temp", "temperature"),
                          ("sampling_penalty_last_n", "penalty_last_n"),
                          ("sampling_penalty_repeat", "penalty_repeat"),
                          ("sampling_mirostat", "mirostat"),
                          ("sampling_mirostat_tau", "mirostat_tau"),
                          ("sampling_mirostat_eta", "mirostat_eta")):
            setattr(metadata, attr, gen.get(key, getattr(metadata, attr)))
    return metadata


def vocab(read: Read, hparams: dict, hf_arch: str) -> list:
    try:
        from tensorfs.hfgguf.vocab import NoVocab, vocab_fields
    except ImportError:
        raise NoGguf("the tokenizer is not read by this build") from None
    try:
        return list(vocab_fields(read, hparams, hf_arch))
    except NoVocab as error:
        raise NoGguf(str(error)) from None


FTYPES = {"bf16": "MOSTLY_BF16", "f16": "MOSTLY_F16", "f32": "ALL_F32", "q8_0": "MOSTLY_Q8_0"}


def plan(read: Read, files: list[tuple[str, str, list[TensorInfo]]], dir_name: str,
         outtypes: Sequence[str] | None = None) -> list[Plan]:
    """The GGUF files offered for a model directory: ``read(name)`` gives a file of it (or
    None), ``files`` its model files as (path, format, tensors in the file's order),
    ``dir_name`` its name (the converter's name heuristics read it).  ``NoGguf`` says why
    there is none."""
    from tensorfs.runtime.libraries import gguf

    raw = load_hparams(read)
    hparams = as_transformers_reads(raw)
    hf_arch = model_architecture(hparams)
    cls = ARCHS.get(hf_arch)
    if cls is None:
        raise NoGguf(f"architecture {hf_arch}: not offered here (llama, qwen2, qwen3, "
                     "gemma3 and bert are)")
    model_type = raw.get("model_type")
    if model_type not in CONFIG_DEFAULTS:
        raise NoGguf(f"config.json's model_type {model_type!r}: the converter reads it through "
                     "a transformers config class not mirrored here")
    arch = cls(hf_arch, hparams, read)
    arch.check()
    # index_tensors: the parts sorted by name, each part's tensors sorted by name (a
    # checkpoint's in its own order), each name through filter_tensors
    ordered: list[tuple[str, TensorInfo]] = []
    names: set[str] = set()
    for _path, fmt, infos in sorted(files, key=lambda f: PurePosixPath(f[0]).name):
        if fmt not in ("safetensors", "pytorch"):
            raise NoGguf(f"a {fmt} model: the converter reads safetensors and checkpoints")
        listed = infos if fmt == "pytorch" else sorted(infos, key=lambda t: t.name)
        for t in listed:
            name = arch.filter_tensor(t.name)
            if name is None:
                continue
            if name in names:       # a dict: the later part's tensor replaces it, in place
                ordered = [(n, x) for n, x in ordered if n != name]
            names.add(name)
            ordered.append((name, t))
    fields = vocab(read, arch.hparams, hf_arch)
    if isinstance(arch, Gemma3):
        arch.set_vocab_count(fields)
    own = own_outtype(ordered)
    plans = []
    for outtype in (outtypes or (own, "q8_0")):
        ftype = getattr(gguf.LlamaFileType, FTYPES[outtype])
        tensors = plan_tensors(arch, ordered, ftype, None)
        plans.append(_write_plan(arch, tensors, ftype, fields, read, raw, dir_name))
    return plans


def kv_bytes(w) -> bytes:
    """``GGUFWriter.write_kv_data_to_file``'s bytes (little-endian), each array packed in
    one ``struct.pack`` rather than an item at a time (a vocabulary of 150 000 tokens: a
    million calls there), the same bytes."""
    import struct

    from tensorfs.runtime.libraries import gguf
    T = gguf.GGUFValueType
    simple = gguf.GGUFWriter._simple_value_packing
    parts = []
    for key, val in w.kv_data[0].items():
        parts.append(w._pack_val(key, T.STRING, add_vtype=False))
        if val.type != T.ARRAY:
            parts.append(w._pack_val(val.value, val.type, add_vtype=True, sub_type=val.sub_type))
            continue
        items = val.value
        if not items:
            raise ValueError("Invalid GGUF metadata array. Empty array")
        ltype = val.sub_type if val.sub_type is not None else T.get_type(items[0])
        head = struct.pack("<IIQ", T.ARRAY, ltype, len(items))
        fmt = simple.get(ltype)
        if fmt is not None:
            body = struct.pack(f"<{len(items)}{fmt}", *items)
        elif ltype == T.STRING:
            encoded = [x.encode("utf-8") if isinstance(x, str) else x for x in items]
            body = b"".join(struct.pack("<Q", len(e)) + e for e in encoded)
        else:
            body = b"".join(w._pack_val(x, ltype, add_vtype=False) for x in items)
        parts.append(head + body)
    return b"".join(parts)


def _write_plan(arch: Arch, tensors: list[OutTensor], ftype, fields, read: Read,
                hparams: dict, dir_name: str) -> Plan:
    """``ModelBase.write``: the tensor infos (prepare_tensors), then prepare_metadata's
    keys, then set_vocab's, then the header bytes as ``GGUFWriter`` writes them."""
    from tensorfs.runtime.libraries import gguf, np

    # gguf-py says at INFO what it writes, and warns of the keys a model class sets twice
    # (Gemma 3's): the converter's output, not ours to log
    logging.getLogger("gguf.gguf_writer").setLevel(logging.ERROR)
    w = gguf.GGUFWriter(path=None, arch=gguf.MODEL_ARCH_NAMES[arch.model_arch])
    for t in tensors:
        w.add_tensor_info(t.name, t.shape, np.dtype(np.float32), t.nbytes,
                          raw_dtype=gguf.GGMLQuantizationType(t.qtype))
    total, shared, expert, count = w.get_total_parameter_count()
    metadata = load_metadata(read, hparams, dir_name, total)
    if metadata.name is None:
        metadata.name = dir_name
    if metadata.size_label is None and total > 0:
        metadata.size_label = gguf.size_label(total, shared, expert, count)
    w.add_type(gguf.GGUFType.MODEL)
    metadata.set_gguf_meta_model(w)
    arch.set_gguf_parameters(w, ftype)
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)
    output_type = ftype.name.partition("_")[2]
    name = gguf.naming_convention(metadata.name, metadata.basename, metadata.finetune,
                                  metadata.version, metadata.size_label, output_type,
                                  model_type="LoRA" if total < 0 else None)
    for key, vtype, value in fields:        # tensorfs.hfgguf.vocab's Field
        if vtype == gguf.GGUFValueType.ARRAY:
            element, items = value
            w.add_key_value(key, items, vtype, element)
        else:
            w.add_key_value(key, value, vtype)
    out = io.BytesIO()
    w.fout = [out]                          # type: ignore[list-item]
    w.state = gguf.gguf_writer.WriterState.EMPTY
    w.write_header_to_file()
    out.write(kv_bytes(w))                  # what write_kv_data_to_file writes, sooner
    w.state = gguf.gguf_writer.WriterState.KV_DATA
    w.write_ti_data_to_file()
    head = out.getvalue()
    alignment = w.data_alignment
    head += bytes(-len(head) % alignment)
    return Plan(f"{name}.gguf", head, alignment, tensors, arch=arch.gguf_arch)
