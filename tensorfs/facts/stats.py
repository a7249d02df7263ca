"""``tensorfs stats`` (docs/reference/facts.md): what is in each tensor.

Over the values of a tensor's ``.npy`` view (dequantized or widened to float32 as the mount
serves them; a native type's own values), in float64: ``count`` (every element), the numbers
of NaN, +Inf, -Inf and zeros (+0 and -0), and over the finite values ``min``, ``max``,
``mean``, ``std`` (population: divided by the number of finite values) and ``absmax``.

Each tensor is read once, in pieces of at most ``PIECE_ELEMENTS`` values worked on by every
core; the pieces' moments are merged with Chan et al.'s pairwise rule, so memory is a few
pieces per core whatever the tensor's size.
"""

from __future__ import annotations

import json
import math
import sys
from dataclasses import dataclass

from tensorfs.convert.workers import usable_cpus
from tensorfs.errors import printable
from tensorfs.facts.models import no_tensor_named, open_model, source_of, stored_order
from tensorfs.facts.output import NUMBER_WIDTH, Progress, Table, fmt, json_number, wants_aligned
from tensorfs.facts.pieces import Scratch, cut, run_ordered, tasks_of
from tensorfs.facts.plot import plot_stats
from tensorfs.facts.scaling import ZERO_SCALE, ldexp_or_inf, scale_down, scale_of
from tensorfs.facts.values import values_of
from tensorfs.runtime.libraries import np
from tensorfs.sources.urls import shown_name


@dataclass
class Moments:
    """A tensor's counts and moments so far.  The mean and the sum of squared deviations
    are kept divided by ``2**scale`` (``tensorfs.facts.scaling.scale_of``: 0 for values within
    2**±300, else a power of two at least the largest |value|), so that they neither
    overflow (values near 1e308, whose squares are past float64) nor underflow (values
    near 1e-300, whose squares are 0) for any finite input."""

    count: int = 0          # every element
    nan: int = 0
    posinf: int = 0
    neginf: int = 0
    zeros: int = 0
    finite: int = 0         # what min ... absmax are over
    min: float = math.inf
    max: float = -math.inf
    scale: int = ZERO_SCALE     # the power of two the next two are scaled by
    mean_s: float = 0.0     # mean / 2**scale
    m2_s: float = 0.0       # (sum of squared deviations from the mean) / 4**scale

    @property
    def mean(self) -> float:
        # within [min, max] as a mean is (rounding could step out, or past float64's range)
        return min(max(ldexp_or_inf(self.mean_s, self.scale), self.min), self.max)

    @property
    def std(self) -> float:
        # at most (max - min) / 2, so at most absmax
        return min(ldexp_or_inf(math.sqrt(self.m2_s / self.finite), self.scale),
                   max(abs(self.min), abs(self.max)))

    def merge(self, other: "Moments") -> None:
        """Chan et al.'s pairwise rule, at the larger of the two scales."""
        self.count += other.count
        self.nan += other.nan
        self.posinf += other.posinf
        self.neginf += other.neginf
        self.zeros += other.zeros
        if other.finite == 0:
            return
        self.min = min(self.min, other.min)
        self.max = max(self.max, other.max)
        if self.finite == 0:
            self.finite, self.scale = other.finite, other.scale
            self.mean_s, self.m2_s = other.mean_s, other.m2_s
            return
        scale = max(self.scale, other.scale)
        mean_a = math.ldexp(self.mean_s, self.scale - scale)
        mean_b = math.ldexp(other.mean_s, other.scale - scale)
        m2_a = math.ldexp(self.m2_s, 2 * (self.scale - scale))
        m2_b = math.ldexp(other.m2_s, 2 * (other.scale - scale))
        n = self.finite + other.finite
        delta = mean_b - mean_a             # |delta| <= 2**301: its square is finite
        self.mean_s = mean_a + delta * other.finite / n
        self.m2_s = m2_a + m2_b + delta * delta * (self.finite * other.finite / n)
        self.scale = scale
        self.finite = n

    def as_dict(self) -> dict:
        some = self.finite > 0
        return {"count": self.count,
                "min": float(self.min) if some else None,
                "max": float(self.max) if some else None,
                "mean": self.mean if some else None,
                "std": self.std if some else None,
                "absmax": max(abs(self.min), abs(self.max)) if some else None,
                "nan": self.nan, "posinf": self.posinf, "neginf": self.neginf,
                "zeros": self.zeros}


def moments(x: np.ndarray, scratch: Scratch) -> Moments:
    """The moments of one piece of values (any numeric dtype), accumulated in float64,
    scaled as its largest |value| asks (``Moments``)."""
    with np.errstate(all="ignore"):         # NaN/Inf are counted, never warned about
        return _moments(x, scratch)


def _moments(x: np.ndarray, scratch: Scratch) -> Moments:
    m = Moments(count=int(x.size))
    if x.size == 0:
        return m
    if x.dtype == np.bool_:
        x = x.view(np.uint8)
    m.zeros = int(x.size - np.count_nonzero(x))
    finite = x
    if x.dtype.kind == "f":
        lo, hi = x.min(), x.max()               # NaN if any is
        if not (np.isfinite(lo) and np.isfinite(hi)):
            nan = np.isnan(x)
            m.nan = int(np.count_nonzero(nan))
            m.posinf = int(np.count_nonzero(x == np.inf))
            m.neginf = int(np.count_nonzero(x == -np.inf))
            finite = x[np.isfinite(x)]
    m.finite = int(finite.size)
    if m.finite == 0:
        return m
    wide = scratch.get("f64", finite.size, np.float64)
    np.copyto(wide, finite, casting="unsafe")     # exact: every view dtype fits float64 but
    if finite is x and x.dtype.kind == "f":       # 64-bit integers past 2**53
        m.min, m.max = float(lo), float(hi)       # known already, and exact
    else:
        m.min, m.max = float(wide.min()), float(wide.max())
    m.scale = scale_of(max(abs(m.min), abs(m.max)))
    scale_down(wide, m.scale)
    m.mean_s = float(wide.sum()) / m.finite
    wide -= m.mean_s
    m.m2_s = float(np.dot(wide, wide))
    return m


def select(opened, names: list[str] | None) -> list:
    """The tensors named (all when none is), in stored order; a name the model lacks is a
    ``FactsError`` before anything is read."""
    tensors = stored_order(opened.model)
    if not names:
        return tensors
    known = {t.name for t in tensors}
    missing = [n for n in names if n not in known]
    if missing:
        raise no_tensor_named(shown_name(opened.model.source), missing[0], known)
    wanted = set(names)
    return [t for t in tensors if t.name in wanted]


@dataclass
class TensorStats:
    name: str
    dtype: str
    shape: tuple
    moments: Moments | None          # None: no values (a type without a .npy view)
    reason: str | None = None

    def as_dict(self) -> dict:
        d = {"name": self.name, "dtype": self.dtype, "shape": list(self.shape)}
        if self.moments is None:
            d["values"] = None
            d["reason"] = self.reason
        else:
            d.update({k: json_number(v) for k, v in self.moments.as_dict().items()})
        return d


def model_stats(opened, names: list[str] | None = None, workers: int | None = None,
                progress: Progress | None = None, on_tensor=None) -> list[TensorStats]:
    """Stats of the tensors named (all by default), in stored order; ``on_tensor(stats)``
    is called as each one is done, in that order."""
    workers = workers or usable_cpus()
    tensors = select(opened, names)
    how = [values_of(t) for t in tensors]
    results: list[TensorStats] = [TensorStats(t.name, t.dtype, t.shape, Moments() if v.exists
                                              else None, None if v.exists else v.plan.reason)
                                  for t, v in zip(tensors, how)]
    pieces = [piece for i, (t, v) in enumerate(zip(tensors, how)) if v.exists
              for piece in cut(i, t.n_elements, v.unit_elems, v.unit_bytes)]
    remaining = [0] * len(tensors)
    for piece in pieces:
        remaining[piece.index] += 1
    scratch = Scratch()

    def work(task):
        out = []
        for piece in task:
            t, v = tensors[piece.index], how[piece.index]
            raw = scratch.get("raw", piece.nbytes, np.uint8)
            source_of(opened, t).read_into(t.offset + piece.start, memoryview(raw))
            with np.errstate(all="ignore"):     # a conversion's Inf/NaN is counted, not warned
                values = v.of(raw, scratch.get("f32", piece.count, np.float32))[:piece.count]
            out.append((piece, moments(values, scratch)))
        return out

    done_upto = 0

    def emit_done() -> None:
        nonlocal done_upto
        while done_upto < len(tensors) and remaining[done_upto] == 0:
            if on_tensor is not None:
                on_tensor(results[done_upto])
            done_upto += 1

    def take(out) -> None:
        for piece, m in out:
            results[piece.index].moments.merge(m)
            remaining[piece.index] -= 1
            if progress is not None:
                progress.update(piece.nbytes)
        emit_done()

    run_ordered(work, tasks_of(pieces), take, workers)
    emit_done()
    return results


COLUMNS = ("name", "dtype", "count", "min", "max", "mean", "std", "absmax", "nan", "+inf",
           "-inf", "zeros")


def row(s: TensorStats) -> list[str]:
    if s.moments is None:
        return [printable(s.name), s.dtype, "-", f"no values: {s.reason}"]
    d = s.moments.as_dict()
    return [printable(s.name), s.dtype, str(d["count"])] + \
        [fmt(d[k]) for k in ("min", "max", "mean", "std", "absmax")] + \
        [str(d[k]) for k in ("nan", "posinf", "neginf", "zeros")]


def run(args, out=None) -> int:
    out = out or sys.stdout
    if args.plot:
        from tensorfs.facts.plot import check_plot

        check_plot(args.plot)           # before anything is read
    with open_model(args.model, dict(args.storage_options or []), args.timeout) as opened:
        chosen = select(opened, args.tensors)
        total = sum(t.nbytes for t in chosen)
        with Progress(total, "stats") as progress:
            on_tensor = None
            if not args.json:
                table = Table(out, COLUMNS, widths(chosen), wants_aligned(args, out), progress)
                table.header()
                on_tensor = lambda s: table.row(row(s))  # noqa: E731
            results = model_stats(opened, args.tensors or None, progress=progress,
                                  on_tensor=on_tensor)
    if args.json:
        json.dump({"model": shown_name(args.model), "tensors": [s.as_dict() for s in results]},
                  out, indent=1, ensure_ascii=True, allow_nan=False)
        out.write("\n")
    out.flush()
    if args.plot:
        plot_stats(results, shown_name(args.model), args.plot)
    return 0


def widths(tensors) -> dict[str, int]:
    """The table's column widths, known before any tensor is read."""
    w = {"name": max((len(printable(t.name)) for t in tensors), default=0),
         "dtype": max((len(t.dtype) for t in tensors), default=0),
         "count": max((len(str(t.n_elements)) for t in tensors), default=0)}
    for column in ("min", "max", "mean", "std", "absmax"):
        w[column] = NUMBER_WIDTH
    for column in ("nan", "+inf", "-inf", "zeros"):
        w[column] = min(w["count"], 8)
    return w
