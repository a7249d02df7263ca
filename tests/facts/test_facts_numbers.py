"""stats' and diff's sums cannot overflow or underflow for finite input: every finite
F64/F32/F16 array, values near 1e±308 (F64), 1e±38 (F32) and F16's ends included, gives
the exact answer (Python fractions over the same float64 values) to a few ulps, in any
cut into pieces, and numpy says nothing on stderr."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from safetensors.numpy import save_file

from tensorfs.facts.diff import Sums, TensorDiff, _sums
from tensorfs.facts.pieces import Scratch
from tensorfs.facts.stats import Moments, moments
from tests.support import run_tensorfs

DTYPES = (np.float64, np.float32, np.float16)


def extreme_floats(dtype):
    """Finite values of ``dtype``, most of them near its smallest or largest exponents."""
    info = np.finfo(dtype)
    width = {np.float64: 64, np.float32: 32, np.float16: 16}[dtype]
    near = st.sampled_from([float(info.max), float(info.tiny), float(info.smallest_subnormal),
                            float(info.max) / 3, float(info.tiny) * 3])
    any_finite = st.floats(allow_nan=False, allow_infinity=False, width=width)
    scaled = st.builds(lambda m, s: m * s, st.floats(-1, 1, width=width), near)
    return st.one_of(any_finite, near, near.map(lambda x: -x), scaled).filter(
        lambda x: math.isfinite(x) and math.isfinite(float(dtype(x))))


def arrays():
    return st.sampled_from(DTYPES).flatmap(
        lambda dtype: hnp.arrays(dtype, st.integers(1, 40), elements=extreme_floats(dtype)))


def exact_sqrt(q: Fraction) -> float:
    """sqrt(q) as a float, without q itself passing through float64 (it may be past it)."""
    if q == 0:
        return 0.0
    k = (q.numerator.bit_length() - q.denominator.bit_length()) // 2
    return math.ldexp(math.sqrt(float(q / Fraction(4) ** k)), k)


def exact_stats(x: np.ndarray) -> tuple[float, float]:
    values = [Fraction(float(v)) for v in x.astype(np.float64)]
    mean = sum(values) / len(values)
    var = sum((v - mean) ** 2 for v in values) / len(values)
    return float(mean), exact_sqrt(var)


def pieces_of(x: np.ndarray, cuts: list[int]) -> list[np.ndarray]:
    points = sorted({c % (x.size + 1) for c in cuts} | {0, x.size})
    return [x[i:j] for i, j in zip(points, points[1:]) if j > i]


def close(got: float, want: float, scale: float, n: int) -> bool:
    """Within float64 rounding of sums of ``n`` values of magnitude ``scale``."""
    return abs(got - want) <= 1e-12 * abs(want) + 8 * n * np.finfo(np.float64).eps * scale


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(x=arrays(), cuts=st.lists(st.integers(0, 40), max_size=4))
def test_stats_of_finite_values_are_finite_and_exact(x, cuts):
    with np.errstate(all="raise"):      # a warning would raise here: none may be given
        m = Moments()
        for piece in pieces_of(x, cuts):
            m.merge(moments(piece, Scratch()))
    d = m.as_dict()
    mean, std = exact_stats(x)
    absmax = float(np.max(np.abs(x.astype(np.float64))))
    assert math.isfinite(d["mean"]) and math.isfinite(d["std"]), d
    assert close(d["mean"], mean, absmax, x.size), (d["mean"], mean)
    assert close(d["std"], std, absmax, x.size), (d["std"], std)


def exact_measures(a: np.ndarray, b: np.ndarray) -> tuple[float, float]:
    fa = [Fraction(float(v)) for v in a.astype(np.float64)]
    fb = [Fraction(float(v)) for v in b.astype(np.float64)]
    sse = sum((y - x) ** 2 for x, y in zip(fa, fb))
    saa = sum(x * x for x in fa)
    sbb = sum(y * y for y in fb)
    sab = sum(x * y for x, y in zip(fa, fb))
    nmse = math.inf if saa == 0 and sse else float(sse / saa) if saa else 0.0
    cosine = (1 if sab >= 0 else -1) * exact_sqrt(sab * sab / (saa * sbb)) if saa and sbb \
        else math.nan
    return nmse, cosine


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(a=arrays(), factor=st.sampled_from([1 + 1e-9, 1 - 1e-6, -1.0, 0.5, 3.0]),
       cuts=st.lists(st.integers(0, 40), max_size=4))
def test_diff_measures_of_finite_values_are_finite_and_exact(a, factor, cuts):
    with np.errstate(all="ignore"):
        b = (a.astype(np.float64) * factor).astype(a.dtype)
    if not np.all(np.isfinite(b)):
        b = a[::-1].copy()
    with np.errstate(all="raise"):
        total = Sums(bytes_equal=False)
        for pa, pb in zip(pieces_of(a, cuts), pieces_of(b, cuts)):
            total.merge(_sums(pa, pb, Scratch(), False))
    d = TensorDiff("t", "values_differ", sums=total)
    nmse, cosine = exact_measures(a, b)
    if math.isnan(cosine):
        assert math.isnan(d.cosine)
    else:
        assert abs(d.cosine - cosine) <= 1e-9, (d.cosine, cosine)
    if math.isinf(nmse):
        assert d.nmse == math.inf
    else:
        assert math.isfinite(d.nmse), d.nmse
        assert abs(d.nmse - nmse) <= 1e-9 * nmse + 1e-15, (d.nmse, nmse)


@pytest.mark.parametrize("scale", [1e200, 1e-200, 1e-310])
def test_the_issue_arrays_at_the_command_line(tmp_path, scale):
    """F64 [1, -1, 0.3] × scale against the same × (1 + 1e-9): nmse 1e-18, cosine 1, std as
    exact arithmetic says, and nothing on stderr."""
    x = np.array([1.0, -1.0, 0.3]) * scale
    save_file({"t": x}, str(tmp_path / "a.safetensors"))
    save_file({"t": x * (1 + 1e-9)}, str(tmp_path / "b.safetensors"))
    result = run_tensorfs("diff", "--json", tmp_path / "a.safetensors", tmp_path / "b.safetensors")
    assert result.returncode == 1 and result.stderr == "", result.stderr
    import json
    t = json.loads(result.stdout)["tensors"][0]
    nmse, cosine = exact_measures(x, x * (1 + 1e-9))
    assert t["status"] == "values_differ"
    assert math.isclose(t["nmse"], nmse, rel_tol=1e-6), (t["nmse"], nmse)
    assert math.isclose(t["cosine"], cosine, rel_tol=1e-12), (t["cosine"], cosine)
    stats = run_tensorfs("stats", "--json", tmp_path / "a.safetensors")
    assert stats.returncode == 0 and stats.stderr == "", stats.stderr
    s = json.loads(stats.stdout)["tensors"][0]
    mean, std = exact_stats(x)
    assert math.isclose(s["std"], std, rel_tol=1e-9) and math.isclose(s["mean"], mean,
                                                                       rel_tol=1e-9), s


def test_nan_and_inf_give_no_warning_on_stderr(tmp_path):
    a = np.array([np.nan, np.inf, -np.inf, 1.0], np.float32)
    save_file({"t": a}, str(tmp_path / "a.safetensors"))
    save_file({"t": a[::-1].copy()}, str(tmp_path / "b.safetensors"))
    for args in (("stats", tmp_path / "a.safetensors"),
                 ("diff", tmp_path / "a.safetensors", tmp_path / "b.safetensors")):
        result = run_tensorfs(*args)
        assert result.returncode in (0, 1) and result.stderr == "", result.stderr
