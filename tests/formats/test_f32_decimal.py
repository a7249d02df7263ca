"""A GGUF's float32 scalars are shown as the shortest decimal that reads back as the same
float32 (metadata.json, metadata/ files), decoded at parse without numpy
(``tensorfs.formats.gguf._f32_shortest``): the same number numpy's ``str`` of the float32
gives, for any float32.  The hard ones are those next to a decimal of few digits that lies
exactly halfway between two float32s (whether the halfway point reads back decides)."""

from __future__ import annotations

import random
from fractions import Fraction

import numpy as np
import pytest

from tensorfs.formats.gguf import _f32_json


def numpys(x: np.float32):
    return float(str(x)) if np.isfinite(x) else str(x)


def halfway_neighbours(count: int, seed: int = 3) -> list[np.float32]:
    """float32s next to a decimal of at most 8 digits that is exactly halfway between two."""
    rng = random.Random(seed)
    found: list[np.float32] = []
    while len(found) < count:
        k = rng.randint(-12, 30)
        if k >= 0:
            m = Fraction(rng.randint(1, 10**8) * 10**k)
        elif 5**-k <= 10**8:
            m = Fraction(rng.randint(1, 10**8 // 5**-k) * 5**-k, 10**-k)
        else:
            continue
        odd = m.numerator
        while odd % 2 == 0:
            odd //= 2
        if m.denominator & (m.denominator - 1) or odd.bit_length() != 25 or \
                not 1.2e-38 < float(m) < 3.4e38:
            continue                    # not halfway between two normal float32s
        near = np.float32(float(m))
        found += [near, np.nextafter(near, np.float32(np.inf)), np.nextafter(near, np.float32(0))]
    return found


def special() -> list[np.float32]:
    bits = [1, 2, 3, 0x007FFFFF, 0x00800000, 0x7F7FFFFE, 0x7F7FFFFF, 0x7F800000, 0x7FC00000]
    for exponent in range(1, 255):        # each power of two, whose lower gap is half the upper
        bits += [exponent << 23, (exponent << 23) + 1, (exponent << 23) - 1]
    values = np.array(bits, dtype=np.uint32).view(np.float32)
    return list(values) + list(-values) + [np.float32(0.0), np.float32(-0.0)]


@pytest.mark.parametrize("kind", ["random", "special", "halfway"])
def test_f32_decimal_is_numpys(kind):
    if kind == "random":
        rng = np.random.default_rng(37)
        values = list(rng.integers(0, 2**32, 4000, dtype=np.uint64).astype(np.uint32).view(np.float32))
        values += list(rng.standard_normal(1000).astype(np.float32))
    else:
        values = special() if kind == "special" else halfway_neighbours(600)
    wrong = [(float(v), numpys(v), _f32_json(float(v))) for v in values
             if repr(_f32_json(float(v))) != repr(numpys(v))]
    assert wrong == []
