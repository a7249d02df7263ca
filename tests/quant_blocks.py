"""Random GGML blocks for tests, and the oracle that says what they dequantize to."""

from __future__ import annotations

import numpy as np
import gguf.quants
from gguf import GGMLQuantizationType

from tensorfs.dtypes import GGML_TYPES_BY_NAME

import convert_reference

# Where each block keeps its float scale lanes: (byte offset, "f16" | "f32").
SCALE_FIELDS = {
    "Q4_0": [(0, "f16")], "Q4_1": [(0, "f16"), (2, "f16")], "Q5_0": [(0, "f16")],
    "Q5_1": [(0, "f16"), (2, "f16")], "Q8_0": [(0, "f16")], "Q8_1": [(0, "f16"), (2, "f16")],
    "Q2_K": [(80, "f16"), (82, "f16")], "Q3_K": [(108, "f16")], "Q4_K": [(0, "f16"), (2, "f16")],
    "Q5_K": [(0, "f16"), (2, "f16")], "Q6_K": [(208, "f16")], "Q8_K": [(0, "f32")],
    "IQ2_XXS": [(0, "f16")], "IQ2_XS": [(0, "f16")], "IQ2_S": [(0, "f16")],
    "IQ3_XXS": [(0, "f16")], "IQ3_S": [(0, "f16")], "IQ1_S": [(0, "f16")],
    "IQ4_NL": [(0, "f16")], "IQ4_XS": [(0, "f16")], "TQ1_0": [(52, "f16")],
    "TQ2_0": [(64, "f16")], "Q1_0": [(0, "f16")], "Q2_0": [(0, "f16")],
}


def random_blocks(name: str, n_blocks: int, rng: np.random.Generator, raw_tail: int = 3) -> np.ndarray:
    """Random blocks; scale lanes finite (random normal) except the last ``raw_tail`` blocks."""
    gt = GGML_TYPES_BY_NAME[name]
    blocks = rng.integers(0, 256, (n_blocks, gt.type_size), dtype=np.uint8)
    finite = max(0, n_blocks - raw_tail)
    for off, kind in SCALE_FIELDS.get(name, []):
        dtype = np.float16 if kind == "f16" else np.float32
        values = (rng.standard_normal(finite) * 2.0 ** rng.integers(-12, 4, finite)).astype(dtype)
        blocks[:finite, off:off + values.itemsize] = values.view(np.uint8).reshape(finite, values.itemsize)
    return blocks.reshape(-1)


def oracle(name: str, data: np.ndarray) -> np.ndarray:
    gt = GGML_TYPES_BY_NAME[name]
    if data.size == 0:                                     # gguf-py cannot reshape 0 blocks
        return np.empty(0, dtype=np.float32)
    if name in convert_reference.REFERENCES:
        with np.errstate(all="ignore"):
            return convert_reference.REFERENCES[name](data)
    with np.errstate(all="ignore"):
        return gguf.quants.dequantize(data.reshape(-1, gt.type_size),
                                      GGMLQuantizationType[name]).reshape(-1)
