"""Element-wise float formats numpy lacks: BF16 and the 8-bit floats, each to float32.

Every value of these formats is exactly representable in float32, so the conversion is exact:
BF16 is the top half of a float32 (``u16 << 16``); an 8-bit float has only 256 codes, so it
is a 256-entry float32 table built once from the format's definition and applied with
``np.take``.  NaN codes become the quiet float32 NaN carrying the code's sign bit
(``0x7fc00000`` / ``0xffc00000``), which is also what ``ml_dtypes`` gives.

Sources for the 8-bit formats: E4M3 / E5M2 as in "FP8 Formats for Deep Learning"
(arXiv 2209.05433, the reference safetensors' ``Dtype`` cites): E4M3 is the "fn" variant (bias
7, no infinities, S.1111.111 is NaN); E5M2 is IEEE-like (bias 15, infinities, NaNs).  The
FNUZ variants (bias 8 / 16, no infinities, no negative zero, 0x80 is the only NaN) are the
ones ``ml_dtypes.float8_e4m3fnuz`` / ``float8_e5m2fnuz`` define.  E8M0 is the OCP MX scale
format: ``2**(e - 127)``, 0xFF is NaN.
"""

from __future__ import annotations

import math

from tensorfs.runtime.libraries import np

_QNAN = 0x7FC00000
_SIGN = 0x80000000


def _f32_bits(value: float) -> int:
    return int(np.array(value, dtype=np.float32).view(np.uint32))


def _minifloat_table(exp_bits: int, man_bits: int, bias: int, *, ieee_specials: bool,
                     nan_codes: frozenset[int], signed: bool = True) -> np.ndarray:
    """A 256-entry float32 table for an 8-bit float code, computed from its definition."""
    table = np.empty(256, dtype=np.uint32)
    exp_max = (1 << exp_bits) - 1
    for code in range(256):
        sign = (code >> (exp_bits + man_bits)) & 1 if signed else 0
        exp = (code >> man_bits) & exp_max
        man = code & ((1 << man_bits) - 1)
        if code in nan_codes or (ieee_specials and exp == exp_max and man != 0):
            table[code] = _QNAN | (_SIGN if sign else 0)
            continue
        if ieee_specials and exp == exp_max:
            magnitude = math.inf
        elif exp == 0:
            magnitude = math.ldexp(man, 1 - bias - man_bits)          # subnormal
        else:
            magnitude = math.ldexp((1 << man_bits) | man, exp - bias - man_bits)
        table[code] = _f32_bits(-magnitude if sign else magnitude)
    return table.view(np.float32)


def _e8m0_table() -> np.ndarray:
    table = np.empty(256, dtype=np.uint32)
    for code in range(255):
        table[code] = _f32_bits(math.ldexp(1.0, code - 127))         # 2**-127 is a float32 subnormal
    table[255] = _QNAN
    return table.view(np.float32)


FP8_TABLES: dict[str, np.ndarray] = {
    "F8_E4M3": _minifloat_table(4, 3, 7, ieee_specials=False, nan_codes=frozenset({0x7F, 0xFF})),
    "F8_E5M2": _minifloat_table(5, 2, 15, ieee_specials=True, nan_codes=frozenset()),
    "F8_E4M3FNUZ": _minifloat_table(4, 3, 8, ieee_specials=False, nan_codes=frozenset({0x80})),
    "F8_E5M2FNUZ": _minifloat_table(5, 2, 16, ieee_specials=False, nan_codes=frozenset({0x80})),
    "F8_E8M0": _e8m0_table(),
}
for _table in FP8_TABLES.values():
    _table.flags.writeable = False


def as_bytes(data) -> np.ndarray:
    """The input as a flat uint8 array, without copying (ndarray, bytes, memoryview, mmap)."""
    if isinstance(data, np.ndarray):
        return data.reshape(-1).view(np.uint8)
    return np.frombuffer(data, dtype=np.uint8)


def _output(count: int, out: np.ndarray | None) -> np.ndarray:
    if out is None:
        return np.empty(count, dtype=np.float32)
    if out.dtype != np.float32 or out.shape != (count,) or not out.flags.c_contiguous:
        raise ValueError(f"out must be a contiguous float32 array of {count} elements")
    return out


def bf16_converter(byte_order: str):
    """BF16 -> float32: the 16 bits become the high half of the float32 (exact)."""
    lane = np.dtype(byte_order + "u2")

    def convert(data: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        codes = as_bytes(data).view(lane)
        result = _output(codes.size, out)
        # One pass: numpy casts u16 -> u32 (swapping bytes for ">u2") and shifts in the loop.
        np.left_shift(codes, 16, out=result.view(np.uint32), dtype=np.uint32)
        return result

    return convert


def fp8_converter(dtype: str):
    """An 8-bit float -> float32 through its 256-entry table."""
    table = FP8_TABLES[dtype]

    def convert(data: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        data = as_bytes(data)
        result = _output(data.size, out)
        np.take(table, data, out=result, mode="clip")   # uint8 indexes are always in range
        return result

    return convert
