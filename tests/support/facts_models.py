"""Models for the tests of ``tensorfs hash``, ``stats`` and ``diff`` (tests/test_facts_*.py),
and what the oracles say each tensor holds.

* ``write_every_type_gguf``: one tensor of every GGML type the project reads (the writer's
  types, the numpy ones, NaN/Inf/zeros among them), one bigger than a stats piece and one
  bigger than a hash piece, written by gguf-py's writer.
* ``write_hand_gguf``: the types gguf-py's writer cannot write (Q8_1, Q2_0), by our encoder.
* ``write_every_type_safetensors``: every safetensors dtype, F4 (no view) included.

Each returns name -> ``Expected(raw, values)``: the stored bytes (from the reference reader)
and the values of the .npy view (from gguf.quants.dequantize, the project's oracles for
what gguf-py cannot dequantize, ml_dtypes), never from tensorfs.
"""

from __future__ import annotations

from dataclasses import dataclass

import gguf
import ml_dtypes
import numpy as np

from tensorfs.dtypes import GGML_TYPES_BY_NAME
from tests.support import gguf_corpus, safetensors_corpus
from tests.support.quant_blocks import oracle, random_blocks

# gguf-py's writer writes these as raw blocks (tests/mount/test_mount_converted.py's list)
WRITER_TYPES = ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K",
                "Q6_K", "Q8_K", "IQ1_S", "IQ1_M", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS",
                "IQ3_S", "IQ4_NL", "IQ4_XS", "TQ1_0", "TQ2_0", "MXFP4", "NVFP4", "Q1_0"]
HAND_TYPES = ["Q8_1", "Q2_0"]
NUMPY_TYPES = {"F32": np.float32, "F16": np.float16, "F64": np.float64, "I8": np.int8,
               "I16": np.int16, "I32": np.int32, "I64": np.int64}


@dataclass
class Expected:
    dtype: str
    raw: bytes
    values: np.ndarray | None       # None: the type has no .npy view


def _special(values: np.ndarray, rng) -> np.ndarray:
    """NaN, +Inf, -Inf and zeros (both signs) at a few places."""
    flat = values.reshape(-1)
    for v in (np.nan, np.inf, -np.inf, 0.0, -0.0, np.nan, 0.0):
        flat[rng.integers(0, flat.size)] = v
    return values


def _bf16(rng, n: int) -> tuple[np.ndarray, np.ndarray]:
    values = rng.standard_normal(n).astype(ml_dtypes.bfloat16)
    raw = values.view(np.uint8)
    return raw, (raw.view("<u2").astype(np.uint32) << 16).view(np.float32)


def write_every_type_gguf(path, seed: int = 0) -> dict[str, Expected]:
    rng = np.random.default_rng(seed)
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_uint32("test.seed", seed)
    out: dict[str, Expected] = {}
    rows = 3
    for layer, kind in enumerate(WRITER_TYPES + ["BF16"]):
        # Q4_K: more values than one stats piece (1 << 20)
        per_row = 1400 if kind == "Q4_K" else 2
        name = f"blk.{layer}.{kind.lower()}.weight"
        if kind == "BF16":
            raw, values = _bf16(rng, rows * per_row * 256)
            raw = raw.reshape(rows, -1)
        else:
            raw = random_blocks(kind, rows * per_row, rng).reshape(rows, -1)
            values = oracle(kind, raw.reshape(-1))
        writer.add_tensor(name, raw, raw_dtype=gguf.GGMLQuantizationType[kind])
        out[name] = Expected(kind, raw.tobytes(), values.reshape(rows, -1))
    for kind, dtype in NUMPY_TYPES.items():
        shape = (4, 5, 6)
        if kind == "F32":
            shape = (2_500_000,)            # more bytes than one hash piece (8 MiB)
        if np.dtype(dtype).kind == "f":
            array = _special(rng.standard_normal(shape).astype(dtype), rng)
        else:
            info = np.iinfo(dtype)
            array = rng.integers(info.min, info.max, size=shape, dtype=dtype, endpoint=True)
            array.reshape(-1)[:3] = 0
        name = f"{kind.lower()}.weight"
        writer.add_tensor(name, array)
        out[name] = Expected(kind, array.tobytes(), array)
    writer.add_tensor("empty.weight", np.zeros((0, 4), np.float32))
    out["empty.weight"] = Expected("F32", b"", np.zeros((0, 4), np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out


def write_hand_gguf(path, seed: int = 1) -> dict[str, Expected]:
    rng = np.random.default_rng(seed)
    infos, data, out = [], bytearray(), {}
    for kind in HAND_TYPES:
        gt = GGML_TYPES_BY_NAME[kind]
        blocks = random_blocks(kind, 3 * 2, rng)
        name = f"hand.{kind.lower()}.weight"
        data += bytes(-len(data) % 32)
        infos.append((name, (2 * gt.block_size, 3), gt.id, len(data)))
        data += blocks.tobytes()
        out[name] = Expected(kind, blocks.tobytes(), oracle(kind, blocks).reshape(3, -1))
    data += bytes(-len(data) % 32)      # ggml reads the data section padded to its end
    path.write_bytes(gguf_corpus.encode_gguf(tensors=infos, data=bytes(data)))
    return out


def write_every_type_safetensors(path, seed: int = 2) -> dict[str, Expected]:
    rng = np.random.default_rng(seed)
    entries, data, out = [], bytearray(), {}

    def add(name, dtype, shape, raw: bytes, values):
        entries.append((name, safetensors_corpus.tensor(dtype, list(shape), len(data),
                                                        len(data) + len(raw))))
        data.extend(raw)
        out[name] = Expected(dtype, raw, values)

    numpy_types = {"F64": np.float64, "F32": np.float32, "F16": np.float16, "I64": np.int64,
                   "I32": np.int32, "I16": np.int16, "I8": np.int8, "U64": np.uint64,
                   "U32": np.uint32, "U16": np.uint16, "U8": np.uint8, "BOOL": np.bool_}
    for dtype, np_type in numpy_types.items():
        shape = (7, 9)
        if np.dtype(np_type).kind == "f":
            array = _special(rng.standard_normal(shape).astype(np_type), rng)
        elif np_type is np.bool_:
            array = rng.integers(0, 2, shape).astype(np.bool_)
        else:
            info = np.iinfo(np_type)
            array = rng.integers(info.min, info.max, size=shape, dtype=np_type, endpoint=True)
            array.reshape(-1)[:2] = 0
        add(f"model.{dtype.lower()}", dtype, shape, array.astype(array.dtype.newbyteorder("<"))
            .tobytes(), array)
    raw, values = _bf16(rng, 64 * 33)
    add("model.bf16", "BF16", (64, 33), raw.tobytes(), values.reshape(64, 33))
    for dtype, ml in (("F8_E4M3", ml_dtypes.float8_e4m3fn), ("F8_E5M2", ml_dtypes.float8_e5m2)):
        raw = rng.integers(0, 256, 50, dtype=np.uint8).tobytes()
        add(f"model.{dtype.lower()}", dtype, (5, 10), raw,
            np.frombuffer(raw, dtype=ml).astype(np.float32).reshape(5, 10))
    add("model.f4", "F4", (8,), b"\x12\x34\x56\x78", None)
    add("model.empty", "F32", (0,), b"", np.zeros(0, np.float32))
    entries.reverse()           # the header lists them in another order than their bytes
    path.write_bytes(safetensors_corpus.build(entries, data=bytes(data)))
    return out
