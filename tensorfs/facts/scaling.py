"""Sums that cannot overflow: the power-of-two scale a piece's values are divided by before
their squares are summed, and the merge of scaled sums (``stats``' moments, ``diff``'s
norms).
"""

from __future__ import annotations

import math

from tensorfs.runtime.libraries import np


def ldexp_or_inf(x: float, e: int) -> float:
    """``x * 2**e``, an infinity where that is past float64 (``math.ldexp`` raises)."""
    try:
        return math.ldexp(x, e)
    except OverflowError:
        return math.copysign(math.inf, x)


# The scale of values that are all zero: below every float64's exponent (a subnormal's is
# -1073 at least), so that merging with any other scale keeps the other.
ZERO_SCALE = -1100


# Values whose largest |value| lies within 2**±SAFE_EXPONENT need no scaling: their squares
# and the sums of a piece's squares (2**20 values at most) are far from float64's range,
# and a value too small to count beside the largest one underflows harmlessly.  Scale 0
# then, which skips a pass over the piece (the usual case: weights are near 1).
SAFE_EXPONENT = 300


def scale_of(absmax: float) -> int:
    """The power of two a piece's values are divided by (``absmax``: their largest |value|,
    finite): 0 within the safe range, else the power of two at least ``absmax``, so that
    the values divided are within [-1, 1] and their squares' sums far from overflow and
    underflow."""
    if absmax == 0:
        return ZERO_SCALE
    exponent = math.frexp(absmax)[1]
    return 0 if -SAFE_EXPONENT <= exponent <= SAFE_EXPONENT else exponent


def scale_down(x: np.ndarray, scale: int) -> None:
    """``x /= 2**scale`` in place, exactly (a power of two), for any scale a float64 has."""
    if scale == 0:
        return
    if -1022 <= -scale <= 1023:
        np.multiply(x, math.ldexp(1.0, -scale), out=x)
    else:                       # 2**-scale itself is not a normal float64
        np.ldexp(x, -scale, out=x)
