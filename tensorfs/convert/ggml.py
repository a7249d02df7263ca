"""Our own vectorized numpy kernels for GGML block-quantized types.

Block layouts and the element order follow ggml's ``ggml-common.h`` (block_* structs) and
``ggml-quants.c`` (dequantize_row_*); the float32 arithmetic is done in the same order as
gguf-py's ``gguf.quants`` (f16 scale widened to f32 first, then ``d * q``, ``d * q - m``,
``(d * q) + m`` ...), so the results are the same bits.

How the kernels are made fast in numpy (measured with bench/rows/kernels.py):

* A call converts a contiguous run of whole blocks, processed in steps of about 256k elements
  (1 MiB of output): long enough that numpy's per-call overhead is amortized, short enough
  that the temporaries stay in the CPU cache (bench: 64k and 1M steps are both slower).
* Bit fiddling (nibble split, 2-bit fields) runs on the *whole* sub-chunk as one flat byte
  array, scale bytes included (their results are simply ignored): one long contiguous loop
  instead of one short loop per block.
* Per-block / per-group scales are expanded to one float per element with ``np.repeat`` and
  applied with flat in-place float32 ufuncs: numpy's broadcasting loops (``(n, 32) * (n,
  1)``) run at a fraction of the speed of flat ones.
* The only per-block work left is the strided copy that puts the quants in element order.
* numpy's uint8 ``<<`` is not vectorized (15x slower than ``*``): shifts left are multiplies;
  array-by-array shifts are replaced by scalar shifts; Q4_K/Q5_K scale unpacking runs on
  uint32 words four bytes at a time, as ggml's kmask code does.
"""

from __future__ import annotations

from typing import Callable

from tensorfs.convert.floats import as_bytes
from tensorfs.runtime.libraries import np

QK_K = 256
CHUNK_ELEMS = 1 << 18     # elements converted per inner step (1 MiB of float32 output)

Kernel = Callable[[np.ndarray, np.ndarray], None]   # (blocks (m, type_size) u8, out (m, block) f32)

_F32 = np.float32


def _half(blocks: np.ndarray, offset: int, half: np.dtype) -> np.ndarray:
    """The fp16 field at ``offset`` of every block, widened to float32, shape (m,)."""
    return blocks[:, offset:offset + 2].view(half)[:, 0].astype(_F32)


def _repeat(values: np.ndarray, times: int) -> np.ndarray:
    """Per-group values (m, g) or (m,) -> one per element, flat."""
    return np.repeat(values.reshape(-1), times)


def blockwise(kernel: Kernel, type_size: int, block_size: int):
    """A ``convert(data, out=None)`` running ``kernel`` over cache-sized runs of blocks."""
    step = max(1, CHUNK_ELEMS // block_size)

    def convert(data: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        data = as_bytes(data)
        if data.size % type_size:
            raise ValueError(f"{data.size} bytes is not a whole number of {type_size}-byte blocks")
        n_blocks = data.size // type_size
        if out is None:
            out = np.empty(n_blocks * block_size, dtype=_F32)
        elif out.dtype != _F32 or out.shape != (n_blocks * block_size,) or not out.flags.c_contiguous:
            raise ValueError(f"out must be a contiguous float32 array of {n_blocks * block_size} elements")
        blocks = data.reshape(n_blocks, type_size)
        out2 = out.reshape(n_blocks, block_size)
        with np.errstate(all="ignore"):          # inf * 0 and NaN scales are data, not errors
            for start in range(0, n_blocks, step):
                kernel(blocks[start:start + step], out2[start:start + step])
        return out

    return convert


# --- 32-element "legacy" quants -------------------------------------------------------------

def q8_0(half: np.dtype) -> Kernel:
    # block_q8_0 {ggml_half d; int8_t qs[32]} (34 bytes); y[j] = qs[j] * d
    def kernel(blocks: np.ndarray, out: np.ndarray) -> None:
        d = _half(blocks, 0, half)
        out[...] = blocks[:, 2:34].view(np.int8)                 # the one strided copy (+ cast)
        flat = out.reshape(-1)
        np.multiply(flat, _repeat(d, 32), out=flat)               # gguf-py: x * d
    return kernel


def q8_1(blocks: np.ndarray, out: np.ndarray) -> None:
    # block_q8_1 {ggml_half d; ggml_half s; int8_t qs[32]} (36 bytes). ggml has no
    # dequantize_row_q8_1 (commented out in ggml-quants.h); the values are qs[j] * d, as in
    # quantize_row_q8_1_ref, which stores qs = round(x / d) and s = d * sum(qs).
    d = _half(blocks, 0, np.dtype("<f2"))
    out[...] = blocks[:, 4:36].view(np.int8)
    flat = out.reshape(-1)
    np.multiply(flat, _repeat(d, 32), out=flat)


def q8_k(blocks: np.ndarray, out: np.ndarray) -> None:
    # block_q8_K {float d; int8_t qs[256]; int16_t bsums[16]} (292 bytes);
    # dequantize_row_q8_K: y[j] = x.d * x.qs[j]
    d = blocks[:, 0:4].view("<f4")[:, 0].astype(_F32)
    out[...] = blocks[:, 4:260].view(np.int8)
    flat = out.reshape(-1)
    np.multiply(_repeat(d, QK_K), flat, out=flat)


def _nibbles(blocks: np.ndarray, minus: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Low and high nibble of every byte of the chunk (m, B), computed flat: uint8, or int8
    after subtracting ``minus``."""
    flat = blocks.reshape(-1)
    lo = np.bitwise_and(flat, 15)
    hi = np.right_shift(flat, 4)
    if minus:
        np.subtract(lo, minus, out=lo)
        np.subtract(hi, minus, out=hi)
    shape = blocks.shape
    kind = np.int8 if minus else np.uint8
    return lo.view(kind).reshape(shape), hi.view(kind).reshape(shape)


def q4_0(half: np.dtype) -> Kernel:
    # block_q4_0 {ggml_half d; uint8_t qs[16]} (18 bytes);
    # y[j] = ((qs[j] & 0xF) - 8) * d, y[j + 16] = ((qs[j] >> 4) - 8) * d
    def kernel(blocks: np.ndarray, out: np.ndarray) -> None:
        m = blocks.shape[0]
        d = _half(blocks, 0, half)
        lo, hi = _nibbles(blocks, 8)
        halves = out.reshape(m, 2, 16)
        halves[:, 0] = lo[:, 2:18]
        halves[:, 1] = hi[:, 2:18]
        flat = out.reshape(-1)
        np.multiply(_repeat(d, 32), flat, out=flat)             # gguf-py: d * q
    return kernel


def q4_1(blocks: np.ndarray, out: np.ndarray) -> None:
    # block_q4_1 {ggml_half d; ggml_half m; uint8_t qs[16]} (20 bytes); y = q * d + m
    m_ = blocks.shape[0]
    half = np.dtype("<f2")
    d = _half(blocks, 0, half)
    mn = _half(blocks, 2, half)
    lo, hi = _nibbles(blocks)
    halves = out.reshape(m_, 2, 16)
    halves[:, 0] = lo[:, 4:20]
    halves[:, 1] = hi[:, 4:20]
    flat = out.reshape(-1)
    np.multiply(_repeat(d, 32), flat, out=flat)                 # gguf-py: (d * q) + m
    np.add(flat, _repeat(mn, 32), out=flat)


def _q5(blocks: np.ndarray, qh_at: int, qs_at: int) -> np.ndarray:
    """The 5-bit quants of Q5_0 / Q5_1 in element order, uint8 (m, 32).

    ggml: qh is a little-endian uint32 whose bit j is the 5th bit of element j; element j < 16
    takes the low nibble of qs[j], element j + 16 the high nibble.
    """
    m = blocks.shape[0]
    lo, hi = _nibbles(blocks)
    q = np.empty((m, 2, 16), dtype=np.uint8)
    q[:, 0] = lo[:, qs_at:qs_at + 16]
    q[:, 1] = hi[:, qs_at:qs_at + 16]
    q = q.reshape(m, 32)
    bits = np.unpackbits(blocks[:, qh_at:qh_at + 4], axis=1, bitorder="little")   # bit j -> col j
    np.multiply(bits, 16, out=bits)          # (numpy's uint8 << is not vectorized; * is)
    np.bitwise_or(q, bits, out=q)
    return q


def q5_0(blocks: np.ndarray, out: np.ndarray) -> None:
    # block_q5_0 {ggml_half d; uint8_t qh[4]; uint8_t qs[16]} (22 bytes); y = (q - 16) * d
    d = _half(blocks, 0, np.dtype("<f2"))
    q = _q5(blocks, 2, 6).view(np.int8)
    np.subtract(q, 16, out=q)
    flat = out.reshape(-1)
    np.multiply(_repeat(d, 32), q.reshape(-1), out=flat)


def q5_1(blocks: np.ndarray, out: np.ndarray) -> None:
    # block_q5_1 {ggml_half d; ggml_half m; uint8_t qh[4]; uint8_t qs[16]} (24 bytes); y = q * d + m
    half = np.dtype("<f2")
    d = _half(blocks, 0, half)
    mn = _half(blocks, 2, half)
    q = _q5(blocks, 4, 8)
    flat = out.reshape(-1)
    np.multiply(_repeat(d, 32), q.reshape(-1), out=flat)
    np.add(flat, _repeat(mn, 32), out=flat)


def q1_0(blocks: np.ndarray, out: np.ndarray) -> None:
    # block_q1_0 {ggml_half d; uint8_t qs[16]} (18 bytes, QK1_0 = 128); dequantize_row_q1_0:
    # bit j (LSB-first, byte j / 8) set -> d, clear -> -d.  "-d" flips the sign bit (also of a
    # NaN), so this is done on the bits: d's bits XOR 0x80000000 where the bit is clear.
    d = _half(blocks, 0, np.dtype("<f2")).view(np.uint32)
    bits = np.unpackbits(blocks[:, 2:18], axis=1, bitorder="little")   # (m, 128), 1 = +d
    np.subtract(1, bits, out=bits)                                        # 1 = -d
    u = out.view(np.uint32)
    u[...] = bits
    flat = u.reshape(-1)
    np.left_shift(flat, 31, out=flat)
    np.bitwise_xor(flat, _repeat(d, 128), out=flat)


def q2_0(blocks: np.ndarray, out: np.ndarray) -> None:
    # block_q2_0 {ggml_half d; uint8_t qs[16]} (18 bytes, QK2_0 = 64); dequantize_row_q2_0:
    # q = (qs[j / 4] >> 2 * (j % 4)) & 3 (LSB-first), y = ((int)q - 1) * d
    d = _half(blocks, 0, np.dtype("<f2"))
    pairs = np.unpackbits(blocks[:, 2:18], axis=1, bitorder="little").reshape(-1, 2)
    code = np.multiply(pairs[:, 1], 2)                  # element j: bits 2j (low), 2j + 1 (high)
    np.add(code, pairs[:, 0], out=code)
    q = code.view(np.int8)
    np.subtract(q, 1, out=q)
    flat = out.reshape(-1)
    flat[...] = q
    np.multiply(flat, _repeat(d, 64), out=flat)


# --- K-quants (256-element super-blocks) ----------------------------------------------------

def _two_bit_fields(qs: np.ndarray) -> np.ndarray:
    """(qs >> 2*j) & 3 for j = 0..3 of (m, 2, 32) bytes -> uint8 (m, 2, 4, 32)."""
    m = qs.shape[0]
    packed = np.ascontiguousarray(qs)
    shifted = np.empty_like(packed)
    fields = np.empty((m, 2, 4, 32), dtype=np.uint8)
    for j in range(4):
        np.right_shift(packed, 2 * j, out=shifted)
        np.bitwise_and(shifted, 3, out=fields[:, :, j])
    return fields


def _per_group(scale: np.ndarray, factors: np.ndarray) -> np.ndarray:
    """scale (m,) times per-group integer factors (m, g) -> float32 (m * g,), as gguf-py's
    ``d * factor.astype(float32)``."""
    return np.multiply(_repeat(scale, factors.shape[1]), factors.reshape(-1).astype(_F32))


def q2_k(blocks: np.ndarray, out: np.ndarray) -> None:
    # block_q2_K {uint8_t scales[16]; uint8_t qs[64]; ggml_half d; ggml_half dmin} (84 bytes).
    # Element 128*h + 32*j + l (l < 32) is (qs[32*h + l] >> 2*j) & 3 with scale/min byte
    # scales[8*h + 2*j + l/16]: y = d*(sc & 0xF) * q - dmin*(sc >> 4).
    m = blocks.shape[0]
    half = np.dtype("<f2")
    d = _half(blocks, 80, half)
    dmin = _half(blocks, 82, half)
    sc = blocks[:, 0:16]
    dl = _per_group(d, np.bitwise_and(sc, 15))
    ml = _per_group(dmin, np.right_shift(sc, 4))
    codes = _two_bit_fields(blocks[:, 16:80].reshape(m, 2, 32))
    flat = out.reshape(-1)
    flat[...] = codes.reshape(-1)
    np.multiply(_repeat(dl, 16), flat, out=flat)
    np.subtract(flat, _repeat(ml, 16), out=flat)


# Q3_K scales: 16 6-bit values in 12 bytes.  From dequantize_row_q3_K's kmask shuffling:
# scale s has low 4 bits (b[s % 8] >> 4*(s // 8)) & 0xF and high 2 bits
# (b[8 + s % 4] >> 2*(s // 4)) & 3, and is used as (int8)(that) - 32.
_S = np.arange(16)
_Q3K_LO_COL, _Q3K_LO_SHIFT = _S % 8, (4 * (_S // 8)).astype(np.uint8)
_Q3K_HI_COL, _Q3K_HI_SHIFT = 8 + _S % 4, (2 * (_S // 4)).astype(np.uint8)


def q3_k(blocks: np.ndarray, out: np.ndarray) -> None:
    # block_q3_K {uint8_t hmask[32]; uint8_t qs[64]; uint8_t scales[12]; ggml_half d} (110).
    # Element 128*h + 32*j + l: low 2 bits (qs[32*h + l] >> 2*j) & 3, minus 4 unless bit
    # 4*h + j of hmask[l] is set; y = d * (scale - 32) * q.
    m = blocks.shape[0]
    d = _half(blocks, 108, np.dtype("<f2"))
    raw = blocks[:, 96:108]
    sc = np.bitwise_and(np.right_shift(raw[:, _Q3K_LO_COL], _Q3K_LO_SHIFT), 15)
    sc |= np.bitwise_and(np.right_shift(raw[:, _Q3K_HI_COL], _Q3K_HI_SHIFT), 3) * np.uint8(16)
    scale = sc.view(np.int8)
    np.subtract(scale, 32, out=scale)
    dl = _per_group(d, scale)
    q = _two_bit_fields(blocks[:, 32:96].reshape(m, 2, 32))           # (m, 2, 4, 32)
    # hmask bit 4*h + j of byte l, viewed as (m, h, j, l)
    high = np.unpackbits(blocks[:, 0:32, None], axis=2, bitorder="little")   # (m, 32, 8)
    high = high.transpose(0, 2, 1).reshape(m, 2, 4, 32)
    plus = np.multiply(high, 4)
    q_f = q.reshape(-1)
    np.add(q_f, plus.reshape(-1), out=q_f)              # q + 4
    qi = q_f.view(np.int8)
    np.subtract(qi, 4, out=qi)
    flat = out.reshape(-1)
    flat[...] = qi
    np.multiply(_repeat(dl, 16), flat, out=flat)


def _k_scales(raw: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """get_scale_min_k4 for j = 0..7 over (m, 12) bytes -> (scales, mins) uint8 (m, 8).

    Done four bytes at a time on uint32 words, as ggml's kmask code does: with the words
    a, b, c = bytes 0-3, 4-7, 8-11, scales 0-3 = a & 63, mins 0-3 = b & 63, scales 4-7 =
    (c & 0xF) | (a >> 6) << 4, mins 4-7 = (c >> 4) | (b >> 6) << 4, bytewise.
    """
    m = raw.shape[0]
    words = np.ascontiguousarray(raw).view("<u4")          # (m, 3)
    a, b, c = words[:, 0], words[:, 1], words[:, 2]
    sc = np.empty((m, 2), dtype="<u4")
    mn = np.empty((m, 2), dtype="<u4")
    np.bitwise_and(a, 0x3F3F3F3F, out=sc[:, 0])
    np.bitwise_and(b, 0x3F3F3F3F, out=mn[:, 0])
    t = np.right_shift(a, 2)                    # (a >> 6) << 4 bytewise == (a >> 2) & 0x30..
    np.bitwise_and(t, 0x30303030, out=t)
    np.bitwise_or(np.bitwise_and(c, 0x0F0F0F0F), t, out=sc[:, 1])
    np.right_shift(b, 2, out=t)
    np.bitwise_and(t, 0x30303030, out=t)
    u = np.right_shift(c, 4)
    np.bitwise_and(u, 0x0F0F0F0F, out=u)
    np.bitwise_or(u, t, out=mn[:, 1])
    return sc.view(np.uint8), mn.view(np.uint8)


def q4_k(half: np.dtype) -> Kernel:
    # block_q4_K {ggml_half d; ggml_half dmin; uint8_t scales[12]; uint8_t qs[128]} (144).
    # Element 64*j + 32*n + l is nibble n of qs[32*j + l], sub-block 2*j + n:
    # y = d*sc * q - dmin*m.
    def kernel(blocks: np.ndarray, out: np.ndarray) -> None:
        m = blocks.shape[0]
        d = _half(blocks, 0, half)
        dmin = _half(blocks, 2, half)
        sc, mn = _k_scales(blocks[:, 4:16])
        dsc = _per_group(d, sc)
        dmn = _per_group(dmin, mn)
        lo, hi = _nibbles(blocks)
        q = out.reshape(m, 4, 2, 32)
        q[:, :, 0] = lo[:, 16:].reshape(m, 4, 32)
        q[:, :, 1] = hi[:, 16:].reshape(m, 4, 32)
        flat = out.reshape(-1)
        np.multiply(_repeat(dsc, 32), flat, out=flat)
        np.subtract(flat, _repeat(dmn, 32), out=flat)
    return kernel


def q5_k(blocks: np.ndarray, out: np.ndarray) -> None:
    # block_q5_K {d; dmin; scales[12]; qh[32]; qs[128]} (176). As Q4_K, plus a 5th bit:
    # bit 2*j + n of qh[l] for element 64*j + 32*n + l.
    m = blocks.shape[0]
    half = np.dtype("<f2")
    d = _half(blocks, 0, half)
    dmin = _half(blocks, 2, half)
    sc, mn = _k_scales(blocks[:, 4:16])
    dsc = _per_group(d, sc)
    dmn = _per_group(dmin, mn)
    lo, hi = _nibbles(blocks)
    high = np.unpackbits(blocks[:, 16:48, None], axis=2, bitorder="little")   # (m, 32, 8)
    np.multiply(high, 16, out=high)
    high = high.transpose(0, 2, 1).reshape(m, 4, 2, 32)                     # (m, j, n, l)
    q = np.empty((m, 4, 2, 32), dtype=np.uint8)
    np.bitwise_or(lo[:, 48:].reshape(m, 4, 32), high[:, :, 0], out=q[:, :, 0])
    np.bitwise_or(hi[:, 48:].reshape(m, 4, 32), high[:, :, 1], out=q[:, :, 1])
    flat = out.reshape(-1)
    flat[...] = q.reshape(-1)
    np.multiply(_repeat(dsc, 32), flat, out=flat)
    np.subtract(flat, _repeat(dmn, 32), out=flat)


def q6_k(half: np.dtype) -> Kernel:
    # block_q6_K {uint8_t ql[128]; uint8_t qh[64]; int8_t scales[16]; ggml_half d} (210).
    # Element 128*h + 32*k + l: low 4 bits nibble k/2 of ql[64*h + 32*(k%2) + l], high 2 bits
    # (qh[32*h + l] >> 2*k) & 3, minus 32; y = d*scales[8*h + 2*k + l/16] * q.
    def kernel(blocks: np.ndarray, out: np.ndarray) -> None:
        m = blocks.shape[0]
        d = _half(blocks, 208, half)
        dsc = _per_group(d, blocks[:, 192:208].view(np.int8))
        lo, hi = _nibbles(blocks)
        lo = lo[:, 0:128].reshape(m, 2, 2, 32)             # (h, k % 2, l) for k = 0, 1
        hi = hi[:, 0:128].reshape(m, 2, 2, 32)             # ... for k = 2, 3
        qh = np.ascontiguousarray(blocks[:, 128:192])      # (m, 64) = (h, l)
        # ((qh >> 2k) & 3) << 4 == shift(qh) & 0x30 with shift = *16, *4, *1, >>2
        field = np.empty_like(qh)
        q = np.empty((m, 2, 4, 32), dtype=np.uint8)
        for k, nib in enumerate((lo[:, :, 0], lo[:, :, 1], hi[:, :, 0], hi[:, :, 1])):
            if k < 2:
                np.multiply(qh, 16 >> (2 * k), out=field)
            elif k == 2:
                field[...] = qh
            else:
                np.right_shift(qh, 2, out=field)
            np.bitwise_and(field, 0x30, out=field)
            np.bitwise_or(nib, field.reshape(m, 2, 32), out=q[:, :, k])
        qi = q.reshape(-1).view(np.int8)
        np.subtract(qi, 32, out=qi)
        flat = out.reshape(-1)
        flat[...] = qi
        np.multiply(_repeat(dsc, 16), flat, out=flat)
    return kernel
