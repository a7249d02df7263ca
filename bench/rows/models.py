"""The models the benchmark writes itself (cached in the work directory between runs)."""

from __future__ import annotations

import os

import numpy as np

from rows.common import Bench, MiB


def _cached(path: str, build) -> str:
    if not os.path.exists(path):
        tmp = path + ".tmp"
        build(tmp)
        os.replace(tmp, path)
    return path


def _f32(rng, n: int) -> np.ndarray:
    return rng.random(n, dtype=np.float32)


def raw_model(b: Bench) -> str:
    """safetensors: big.weight (F32, --big-mib), mid.weight (F32, 256 MiB), par.N.weight."""
    a = b.args
    path = os.path.join(b.models, f"raw-{a.big_mib}-{a.mid_mib}-{a.par_mib}.safetensors")

    def build(tmp):
        from safetensors.numpy import save_file

        rng = np.random.default_rng(1)
        tensors = {"big.weight": _f32(rng, a.big_mib * MiB // 4).reshape(-1, 4096),
                   "mid.weight": _f32(rng, a.mid_mib * MiB // 4).reshape(-1, 4096)}
        for i in range(8):
            tensors[f"par.{i}.weight"] = _f32(rng, a.par_mib * MiB // 4).reshape(-1, 4096)
        save_file(tensors, tmp)

    return _cached(path, build)


CONV_TYPES = ["BF16", "Q8_0", "Q4_0", "Q4_K", "Q6_K"]


def _blocks(name: str, out_bytes: int, rng) -> np.ndarray:
    """Random blocks of ``name`` holding ``out_bytes`` of float32 output, shaped as rows of 4096
    elements (rows, row_bytes) as GGUF stores them; finite scales."""
    from rows.kernels import random_blocks
    from tensorfs.dtypes import GGML_TYPES_BY_NAME

    gt = GGML_TYPES_BY_NAME[name]
    n_elems = out_bytes // 4
    rows = max(1, n_elems // 4096)
    row_bytes = 4096 // gt.block_size * gt.type_size
    if name == "BF16":                  # the top halves of normal float32 values
        data = _f32(rng, rows * 4096).view(np.uint16)[1::2].copy().view(np.uint8)
    else:
        data = random_blocks(name, rows * row_bytes, rng)
    return data[:rows * row_bytes].reshape(rows, row_bytes)


def _write_gguf(tmp: str, tensors: dict) -> None:
    import gguf

    writer = gguf.GGUFWriter(tmp, "llama")
    for name, (qname, data) in tensors.items():
        if qname == "F32":
            writer.add_tensor(name, data)
        else:
            writer.add_tensor(name, data, raw_dtype=gguf.GGMLQuantizationType[qname])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def conv_model(b: Bench) -> str:
    """GGUF: one tensor per converted type (--conv-mib of float32 output each), and 8 Q4_K
    tensors for the parallel rows."""
    a = b.args
    path = os.path.join(b.models, f"conv-{a.conv_mib}-{a.par_conv_mib}.gguf")

    def build(tmp):
        rng = np.random.default_rng(2)
        tensors = {f"conv.{q}.weight": (q, _blocks(q, a.conv_mib * MiB, rng)) for q in CONV_TYPES}
        for i in range(8):
            tensors[f"par.{i}.weight"] = ("Q4_K", _blocks("Q4_K", a.par_conv_mib * MiB, rng))
        _write_gguf(tmp, tensors)

    return _cached(path, build)


def rss_model(b: Bench) -> str:
    """GGUF of about --rss-mib of tensor data: Q4_K, Q6_K, Q8_0, BF16, F32 in equal parts,
    split in 16 tensors each (so every view kind is read, many chunks)."""
    a = b.args
    path = os.path.join(b.models, f"rss-{a.rss_mib}.gguf")

    def build(tmp):
        from tensorfs.dtypes import GGML_TYPES_BY_NAME

        rng = np.random.default_rng(3)
        share = a.rss_mib * MiB // 5 // 16 // (1 << 16) * (1 << 16)
        tensors = {}
        for q in ["Q4_K", "Q6_K", "Q8_0", "BF16"]:
            gt = GGML_TYPES_BY_NAME[q]
            out = share // gt.type_size * gt.block_size * 4
            for i in range(16):
                tensors[f"{q}.{i}.weight"] = (q, _blocks(q, out, rng))
        for i in range(16):
            tensors[f"F32.{i}.weight"] = ("F32", _f32(rng, share // 4).reshape(-1, 4096))
        _write_gguf(tmp, tensors)

    return _cached(path, build)


def vocab_models(b: Bench) -> tuple[str, str]:
    """A GGUF header with a --vocab-token vocabulary and --header-tensors tiny tensors, and a
    safetensors file with the same tensors."""
    a = b.args
    gpath = os.path.join(b.models, f"vocab-{a.vocab}-{a.header_tensors}.gguf")
    spath = os.path.join(b.models, f"header-{a.header_tensors}.safetensors")
    names = [f"blk.{i // 30}.t{i % 30}.weight" for i in range(a.header_tensors)]

    def build_gguf(tmp):
        import gguf

        rng = np.random.default_rng(4)
        writer = gguf.GGUFWriter(tmp, "llama")
        writer.add_tokenizer_model("gpt2")
        writer.add_token_list([f"tok{i}_{'x' * (i % 7)}".encode() for i in range(a.vocab)])
        writer.add_token_scores(rng.random(a.vocab, dtype=np.float32).tolist())
        writer.add_token_types([1] * a.vocab)
        writer.add_token_merges([f"t{i} k{i}" for i in range(a.vocab // 2)])
        for name in names:
            writer.add_tensor(name, _f32(rng, 64).reshape(8, 8))
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()

    def build_st(tmp):
        from safetensors.numpy import save_file

        rng = np.random.default_rng(5)
        save_file({n: _f32(rng, 64).reshape(8, 8) for n in names}, tmp,
                  metadata={"format": "pt"})

    return _cached(gpath, build_gguf), _cached(spath, build_st)


def tree_model(b: Bench, n: int) -> str:
    path = os.path.join(b.models, f"tree-{n}.safetensors")

    def build(tmp):
        from safetensors.numpy import save_file

        one = np.zeros(1, dtype=np.float32)
        save_file({f"model.layers.{i // 10}.p{i % 10}.weight": one for i in range(n)}, tmp)

    return _cached(path, build)
