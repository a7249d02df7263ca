"""Scalar references for the GGML types gguf-py cannot dequantize, written straight from ggml.

One Python loop per element, float32 scalars, in the order the C code computes.  Sources
(ggml-org/llama.cpp, ggml/src): ggml-common.h for the block structs; ggml-quants.c for
dequantize_row_q1_0, dequantize_row_q2_0 and dequantize_row_q8_K; Q8_1 has no
dequantize_row_q8_1 in ggml (its prototype is commented out in ggml-quants.h), so its
reference is the inverse of quantize_row_q8_1_ref (qs = roundf(x / d)), i.e. qs[j] * d.
"""

from __future__ import annotations

import numpy as np

F32 = np.float32


def _fp16(b: np.ndarray, off: int) -> np.float32:
    # GGML_FP16_TO_FP32
    return F32(b[off:off + 2].view("<f2")[0])


def q1_0(data: np.ndarray) -> np.ndarray:
    # #define QK1_0 128; typedef struct { ggml_half d; uint8_t qs[QK1_0 / 8]; } block_q1_0;
    # d = FP16_TO_FP32(x[i].d); neg_d = -d;
    # bit = (x[i].qs[j / 8] >> (j % 8)) & 1; y[i*qk + j] = bit ? d : neg_d;
    out = []
    for b in data.reshape(-1, 18):
        d = _fp16(b, 0)
        neg_d = -d
        for j in range(128):
            bit = (int(b[2 + j // 8]) >> (j % 8)) & 1
            out.append(d if bit else neg_d)
    return np.array(out, dtype=F32)


def q2_0(data: np.ndarray) -> np.ndarray:
    # #define QK2_0 64; typedef struct { ggml_half d; uint8_t qs[QK2_0 / 4]; } block_q2_0;
    # q = (x[i].qs[j / 4] >> ((j % 4) * 2)) & 0x03; y[i*qk + j] = ((int)q - 1) * d;
    out = []
    for b in data.reshape(-1, 18):
        d = _fp16(b, 0)
        for j in range(64):
            q = (int(b[2 + j // 4]) >> ((j % 4) * 2)) & 3
            out.append(F32(q - 1) * d)
    return np.array(out, dtype=F32)


def q8_1(data: np.ndarray) -> np.ndarray:
    # typedef struct { ggml_half d; ggml_half s; int8_t qs[QK8_1]; } block_q8_1;  (36 bytes)
    out = []
    for b in data.reshape(-1, 36):
        d = _fp16(b, 0)
        qs = b[4:36].view(np.int8)
        for j in range(32):
            out.append(F32(qs[j]) * d)
    return np.array(out, dtype=F32)


def q8_k(data: np.ndarray) -> np.ndarray:
    # typedef struct { float d; int8_t qs[QK_K]; int16_t bsums[QK_K/16]; } block_q8_K; (292)
    # *y++ = x[i].d * x[i].qs[j];
    out = []
    for b in data.reshape(-1, 292):
        d = F32(b[0:4].view("<f4")[0])
        qs = b[4:260].view(np.int8)
        for j in range(256):
            out.append(d * F32(qs[j]))
    return np.array(out, dtype=F32)


REFERENCES = {"Q1_0": q1_0, "Q2_0": q2_0, "Q8_1": q8_1, "Q8_K": q8_k}
