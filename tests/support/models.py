"""Model files for the integration tests, written by the reference writers."""

from __future__ import annotations

import gguf
import numpy as np
from safetensors.numpy import save_file

NUMPY_GGUF_DTYPES = [np.float32, np.float16, np.float64, np.int8, np.int16, np.int32, np.int64]

# One value of every GGUF metadata type (the writer picks the type from the Python value
# or from an explicit GGUFValueType).
GGUF_KV = [
    ("test.u8", 200, gguf.GGUFValueType.UINT8),
    ("test.i8", -100, gguf.GGUFValueType.INT8),
    ("test.u16", 60000, gguf.GGUFValueType.UINT16),
    ("test.i16", -30000, gguf.GGUFValueType.INT16),
    ("test.u32", 4_000_000_000, gguf.GGUFValueType.UINT32),
    ("test.i32", -2_000_000_000, gguf.GGUFValueType.INT32),
    ("test.f32", 0.1, gguf.GGUFValueType.FLOAT32),
    ("test.bool", True, gguf.GGUFValueType.BOOL),
    ("test.string", "héllo\nworld", gguf.GGUFValueType.STRING),
    ("test.u64", 2**64 - 1, gguf.GGUFValueType.UINT64),
    ("test.i64", -(2**63), gguf.GGUFValueType.INT64),
    ("test.f64", 1e-300, gguf.GGUFValueType.FLOAT64),
]
GGUF_ARRAYS = [
    ("test.array_i32", [1, -2, 3]),
    ("test.array_f32", [0.5, 1.25]),
    ("test.array_str", ["a", "", "b\nc", "ü"]),
    ("test.array_nested", [[1, 2], [3]]),
]


def write_gguf(path, *, big_endian: bool = False, seed: int = 0, tensors=None) -> dict:
    """A GGUF with one tensor of every numpy-native type; returns name -> array written."""
    rng = np.random.default_rng(seed)
    endian = gguf.GGUFEndian.BIG if big_endian else gguf.GGUFEndian.LITTLE
    writer = gguf.GGUFWriter(str(path), "llama", endianess=endian)
    for key, value, vtype in GGUF_KV:
        writer.add_key_value(key, value, vtype)
    for key, value in GGUF_ARRAYS:
        writer.add_array(key, value)
    if tensors is None:
        tensors = {}
        for i, dtype in enumerate(NUMPY_GGUF_DTYPES):
            shape = [(3, 5), (7,), (2, 3, 4), (1, 1, 2, 8)][i % 4]
            if np.issubdtype(dtype, np.floating):
                array = rng.standard_normal(shape).astype(dtype)
            else:
                info = np.iinfo(dtype)
                array = rng.integers(info.min, info.max, size=shape, dtype=dtype, endpoint=True)
            tensors[f"blk.{i}.{np.dtype(dtype).name}.weight"] = array
    finish_gguf(writer, tensors)
    return tensors


def finish_gguf(writer: "gguf.GGUFWriter", tensors: dict | None = None) -> None:
    """Add ``tensors`` (name -> array) and write the file out, as every GGUF test does."""
    for name, array in (tensors or {}).items():
        writer.add_tensor(name, array)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


SAFETENSORS_DTYPES = [np.bool_, np.uint8, np.int8, np.int16, np.uint16, np.int32, np.uint32,
                      np.int64, np.uint64, np.float16, np.float32, np.float64]


def write_safetensors(path, *, seed: int = 0, metadata=None) -> dict:
    rng = np.random.default_rng(seed)
    tensors = {}
    for i, dtype in enumerate(SAFETENSORS_DTYPES):
        shape = [(3, 5), (7,), (2, 3, 4), (), (0, 3)][i % 5]
        if dtype is np.bool_:
            array = rng.integers(0, 2, size=shape).astype(np.bool_)
        elif np.issubdtype(dtype, np.floating):
            array = rng.standard_normal(shape).astype(dtype)
        else:
            info = np.iinfo(dtype)
            array = rng.integers(info.min, info.max, size=shape, dtype=dtype, endpoint=True)
        tensors[f"model.layers.{i}.{np.dtype(dtype).name}"] = array
    tensors["lm_head.weight"] = rng.standard_normal((16, 8)).astype(np.float32)
    save_file(tensors, str(path), metadata=metadata if metadata is not None else
              {"format": "np", "note": "tensorfs test"})
    return tensors
