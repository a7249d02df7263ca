"""Random GGML blocks for tests, and the oracle that says what they dequantize to."""

from __future__ import annotations

import gguf.quants
import ml_dtypes
import numpy as np
from gguf import GGMLQuantizationType

from tensorfs.dtypes import GGML_TYPES_BY_NAME
from tests.support import convert_reference

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


# The types the converted-view tests write, each in ROWS rows of blocks
WRITER_TYPES = ["BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K",
                "Q6_K", "Q8_K", "IQ1_S", "IQ1_M", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS",
                "IQ3_S", "IQ4_NL", "IQ4_XS", "TQ1_0", "TQ2_0", "MXFP4", "NVFP4", "Q1_0"]
# gguf-py's writer has no (or a wrong) size for these: written with our own encoder
HAND_TYPES = ["Q8_1", "Q2_0"]
ROWS = 3


def type_blocks(name: str, blocks_per_row: int) -> np.ndarray:
    """``ROWS`` rows of ``blocks_per_row`` random blocks of the type ``name`` (seeded by it)."""
    rng = np.random.default_rng(sum(map(ord, name)))
    if name == "BF16":
        values = rng.standard_normal(ROWS * blocks_per_row).astype(ml_dtypes.bfloat16)
        return values.view(np.uint8).reshape(ROWS, -1)
    return random_blocks(name, ROWS * blocks_per_row, rng, raw_tail=0).reshape(ROWS, -1)


def expected_values(name: str, blocks: np.ndarray, shape) -> np.ndarray:
    """The float32 values of ``blocks`` as the oracle decodes them."""
    if name == "BF16":
        return (blocks.reshape(-1).view("<u2").astype(np.uint32) << 16).view(np.float32).reshape(shape)
    return oracle(name, blocks.reshape(-1)).reshape(shape)
