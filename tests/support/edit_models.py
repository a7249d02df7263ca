"""Small models for the edit tests, written by gguf-py's ``GGUFWriter`` (the oracle the
composed file is compared with) from a list of key-value pairs and a dict of tensors."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np

GV = gguf.GGUFValueType


def write_kv_gguf(path, kvs, tensors, endian=gguf.GGUFEndian.LITTLE, alignment=None) -> Path:
    """A GGUF of ``kvs`` [(key, value, type, sub_type)] and ``tensors`` {name: array or
    (raw bytes array, shape, qtype)}, in order, as gguf-py writes it."""
    writer = gguf.GGUFWriter(str(path), "llama", endianess=endian)
    if alignment is not None:
        writer.add_custom_alignment(alignment)
    for key, value, vtype, sub in kvs:
        writer.add_key_value(key, value, vtype, sub_type=sub)
    for name, array in tensors.items():
        if isinstance(array, tuple):
            data, _, qtype = array
            writer.add_tensor(name, data, raw_dtype=qtype)
        else:
            writer.add_tensor(name, array)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return Path(path)


def tool_kvs(eos: int = 1, name: str = "tiny") -> list:
    return [("tokenizer.ggml.eos_token_id", eos, GV.UINT32, None),
            ("general.name", name, GV.STRING, None),
            ("tokenizer.ggml.tokens", ["<s>", "a", "c"], GV.ARRAY, GV.STRING)]


def tool_tensors() -> dict:
    rng = np.random.default_rng(5)
    return {"token_embd.weight": rng.standard_normal((6, 8)).astype(np.float32),
            "output_norm.weight": rng.standard_normal((8,)).astype(np.float32)}


def field_types(path) -> dict:
    """key -> (value, [GGUFValueType ...]) as GGUFReader reads them."""
    reader = gguf.GGUFReader(str(path))
    return {name: (f.contents(), list(f.types)) for name, f in reader.fields.items()}
