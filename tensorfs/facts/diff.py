"""``tensorfs diff A B`` (docs/reference/facts.md): what differs between two models, tensor
by tensor name.

Each name is one of:

* ``only_in_a`` / ``only_in_b``;
* ``shape_differs``: both have it, in other shapes (nothing more is compared);
* ``identical``: same type, same shape, same stored bytes;
* ``values_equal``: bytes differ (another type, say F32 against F16) but every value of
  the two ``.npy`` views is equal;
* ``values_differ``: with ``max_abs_diff`` = max |a - b|, ``nmse`` = sum((a - b)^2) /
  sum(a^2) and ``cosine`` = sum(a b) / sqrt(sum(a^2) sum(b^2)), over the views' values in
  float64 (a Q4_K tensor against its F16: its dequantized values against the F16 ones);
* ``type_differs``: other types, and one has no values to compare (a type without a
  ``.npy`` view); ``bytes_differ``: the same such type, other bytes.

A NaN on either side makes the measures NaN; nmse is inf when a is all zeros and b is not,
cosine is NaN when either side is all zeros.  Exit status as diff(1)'s: 0 when every
tensor is identical and both have the same names, 1 otherwise, 2 on error.
"""

from __future__ import annotations

import json
import math
import sys
from dataclasses import dataclass, field

from tensorfs.convert.workers import usable_cpus
from tensorfs.errors import printable
from tensorfs.facts.models import open_model, source_of, stored_order
from tensorfs.facts.output import NUMBER_WIDTH, Progress, Table, fmt, json_number, wants_aligned
from tensorfs.facts.pieces import PIECE_ELEMENTS, Piece, Scratch, lcm, run_ordered, tasks_of
from tensorfs.facts.plot import plot_diff
from tensorfs.facts.scaling import ZERO_SCALE, ldexp_or_inf, scale_down, scale_of
from tensorfs.facts.values import values_of
from tensorfs.runtime.libraries import np
from tensorfs.sources.urls import shown_name

STATUSES = ("identical", "values_equal", "values_differ", "bytes_differ", "type_differs",
            "shape_differs", "only_in_a", "only_in_b")


@dataclass
class Sums:
    """What the measures are made of, added up piece by piece.  The four sums are kept
    divided by ``4**scale`` (``tensorfs.facts.scaling.scale_of``: 0 for values within 2**±300, else
    a power of two at least the largest |value|), so that they neither overflow nor
    underflow for any finite input; the measures are their ratios, where the scale
    cancels."""

    sse: float = 0.0
    saa: float = 0.0
    sbb: float = 0.0
    sab: float = 0.0
    scale: int = ZERO_SCALE
    max_abs: float = 0.0        # not scaled
    bytes_equal: bool = True

    def merge(self, o: "Sums") -> None:
        scale = max(self.scale, o.scale)
        mine, theirs = 2 * (self.scale - scale), 2 * (o.scale - scale)
        self.sse = math.ldexp(self.sse, mine) + math.ldexp(o.sse, theirs)
        self.saa = math.ldexp(self.saa, mine) + math.ldexp(o.saa, theirs)
        self.sbb = math.ldexp(self.sbb, mine) + math.ldexp(o.sbb, theirs)
        self.sab = math.ldexp(self.sab, mine) + math.ldexp(o.sab, theirs)
        self.scale = scale
        # NaN wins, as it does within a piece
        self.max_abs = o.max_abs if math.isnan(o.max_abs) else \
            self.max_abs if math.isnan(self.max_abs) else max(self.max_abs, o.max_abs)
        self.bytes_equal = self.bytes_equal and o.bytes_equal


@dataclass
class TensorDiff:
    name: str
    status: str
    a: tuple | None = None      # (dtype, shape)
    b: tuple | None = None
    sums: Sums | None = field(default=None, repr=False)

    @property
    def max_abs_diff(self) -> float | None:
        return None if self.sums is None else self.sums.max_abs

    @property
    def nmse(self) -> float | None:
        s = self.sums
        if s is None:
            return None
        if s.saa == 0:
            return math.nan if math.isnan(s.sse) else 0.0 if s.sse == 0 else math.inf
        return s.sse / s.saa

    @property
    def cosine(self) -> float | None:
        s = self.sums
        if s is None:
            return None
        norm = math.sqrt(s.saa) * math.sqrt(s.sbb)
        if not norm > 0:
            return math.nan
        # within [-1, 1] as a cosine is (rounding can step out by an ulp)
        return max(-1.0, min(1.0, s.sab / norm)) if math.isfinite(s.sab) else s.sab / norm

    def as_dict(self) -> dict:
        d: dict = {"name": self.name, "status": self.status}
        for side, info in (("a", self.a), ("b", self.b)):
            if info is not None:
                d[side] = {"dtype": info[0], "shape": list(info[1])}
        if self.sums is not None:
            d.update(max_abs_diff=json_number(self.max_abs_diff), nmse=json_number(self.nmse),
                     cosine=json_number(self.cosine))
        return d


def _sums(a: np.ndarray, b: np.ndarray, scratch: Scratch, bytes_equal: bool) -> Sums:
    """The sums of one piece; ``a`` and ``b`` the same number of values."""
    with np.errstate(all="ignore"):     # NaN and Inf give NaN/inf measures, not warnings
        return _piece_sums(a, b, scratch, bytes_equal)


def _largest(x: np.ndarray) -> float:
    """max |x|, NaN if any is NaN."""
    hi, lo = x.max(), x.min()
    return math.nan if np.isnan(hi) or np.isnan(lo) else float(max(hi, -lo))


def _piece_sums(a: np.ndarray, b: np.ndarray, scratch: Scratch, bytes_equal: bool) -> Sums:
    n = a.size
    s = Sums(bytes_equal=bytes_equal)
    if n == 0:
        return s
    wa = scratch.get("a64", n, np.float64)
    np.copyto(wa, a.view(np.uint8) if a.dtype == np.bool_ else a, casting="unsafe")
    largest = _largest(wa)
    if bytes_equal:                     # same values: nothing else to compute
        s.scale = scale_of(largest) if math.isfinite(largest) else 0
        scale_down(wa, s.scale)
        s.saa = float(np.dot(wa, wa))
        s.sbb = s.sab = s.saa
        if not math.isfinite(s.saa):    # NaN - NaN, inf - inf: NaN, as computed below
            s.sse = s.max_abs = math.nan
        return s
    wb = scratch.get("b64", n, np.float64)
    np.copyto(wb, b.view(np.uint8) if b.dtype == np.bool_ else b, casting="unsafe")
    largest = max(largest, _largest(wb)) if not math.isnan(largest) else largest
    s.scale = scale_of(largest) if math.isfinite(largest) else 0
    scale_down(wa, s.scale)
    scale_down(wb, s.scale)
    s.saa = float(np.dot(wa, wa))
    s.sbb = float(np.dot(wb, wb))
    s.sab = float(np.dot(wa, wb))
    np.subtract(wb, wa, out=wb)         # |b - a| <= 2**301 once scaled: no overflow
    s.sse = float(np.dot(wb, wb))
    s.max_abs = ldexp_or_inf(_largest(wb), s.scale)
    return s


def model_diff(a, b, workers: int | None = None, progress: Progress | None = None,
               on_tensor=None) -> list[TensorDiff]:
    """Every name of A (in A's stored order), then those only in B."""
    workers = workers or usable_cpus()
    ta = stored_order(a.model)
    tb = {t.name: t for t in stored_order(b.model)}
    results: list[TensorDiff] = []
    pairs = []          # (result index, tensor a, tensor b, values a, values b, unit)
    for t in ta:
        u = tb.get(t.name)
        if u is None:
            results.append(TensorDiff(t.name, "only_in_a", (t.dtype, t.shape)))
            continue
        d = TensorDiff(t.name, "", (t.dtype, t.shape), (u.dtype, u.shape))
        results.append(d)
        if t.shape != u.shape:
            d.status = "shape_differs"
            continue
        va, vb = values_of(t), values_of(u)
        same_type = (t.dtype, t.byte_order) == (u.dtype, u.byte_order)
        if not (va.exists and vb.exists):
            if not same_type or t.nbytes != u.nbytes:
                d.status = "type_differs"
                continue
            va = vb = va._replace(unit_elems=1, unit_bytes=1)     # bytes only
            d.status = "raw"
        d.sums = Sums()
        pairs.append((len(results) - 1, t, u, va, vb, same_type))
    names_a = {t.name for t in ta}
    results += [TensorDiff(u.name, "only_in_b", b=(u.dtype, u.shape))
                for u in stored_order(b.model) if u.name not in names_a]

    pieces = []
    for k, (index, t, u, va, vb, same_type) in enumerate(pairs):
        raw_only = results[index].status == "raw"
        n = t.nbytes if raw_only else t.n_elements
        unit = lcm(va.unit_elems, vb.unit_elems)
        per = max(1, PIECE_ELEMENTS // unit) * unit
        for first in range(0, n, per) if n else [0]:
            count = min(per, n - first)
            stored = -(-count // va.unit_elems) * va.unit_bytes + \
                -(-count // vb.unit_elems) * vb.unit_bytes
            pieces.append(Piece(k, first, count, 0, stored))
    remaining = [0] * len(pairs)
    for piece in pieces:
        remaining[piece.index] += 1
    scratch = Scratch()

    def side(tensor, v, piece, key):
        start = piece.first // v.unit_elems * v.unit_bytes
        nbytes = -(-piece.count // v.unit_elems) * v.unit_bytes
        raw = scratch.get(key, nbytes, np.uint8)
        source_of(a if key == "ra" else b, tensor).read_into(tensor.offset + start,
                                                             memoryview(raw))
        return raw

    def work(task):
        out = []
        for piece in task:
            index, t, u, va, vb, same_type = pairs[piece.index]
            ra = side(t, va, piece, "ra")
            rb = side(u, vb, piece, "rb")
            equal = same_type and ra.nbytes == rb.nbytes and np.array_equal(ra, rb)
            if results[index].status == "raw":
                out.append((piece, Sums(bytes_equal=equal), ra.nbytes + rb.nbytes))
                continue
            with np.errstate(all="ignore"):     # a conversion's Inf/NaN is measured, not warned
                xa = va.of(ra, scratch.get("fa", piece.count, np.float32))[:piece.count]
                xb = xa if equal else \
                    vb.of(rb, scratch.get("fb", piece.count, np.float32))[:piece.count]
            out.append((piece, _sums(xa, xb, scratch, equal), ra.nbytes + rb.nbytes))
        return out

    done_upto = 0

    def emit_done() -> None:
        nonlocal done_upto
        while done_upto < len(results) and (results[done_upto].sums is None or
                                             remaining_of(done_upto) == 0):
            _finish(results[done_upto])
            if on_tensor is not None:
                on_tensor(results[done_upto])
            done_upto += 1

    pair_of_result = {index: k for k, (index, *_rest) in enumerate(pairs)}

    def remaining_of(index: int) -> int:
        return remaining[pair_of_result[index]]

    def take(out) -> None:
        for piece, sums, nbytes in out:
            results[pairs[piece.index][0]].sums.merge(sums)
            remaining[piece.index] -= 1
            if progress is not None:
                progress.update(nbytes)
        emit_done()

    run_ordered(work, tasks_of(pieces), take, workers)
    emit_done()
    return results


def _finish(d: TensorDiff) -> None:
    """The status of a compared tensor, once all its pieces are in."""
    if d.status not in ("", "raw"):
        return
    s = d.sums
    if d.status == "raw":
        d.status = "identical" if s.bytes_equal else "bytes_differ"
        d.sums = None
        return
    if s.bytes_equal and d.a == d.b:
        d.status = "identical"
    elif s.max_abs == 0 and s.sse == 0:
        d.status = "values_equal"
    else:
        d.status = "values_differ"


def summary(results: list[TensorDiff]) -> dict[str, int]:
    counts = {s: 0 for s in STATUSES}
    for d in results:
        counts[d.status] += 1
    return {s: n for s, n in counts.items() if n}


COLUMNS = ("name", "status", "a", "b", "max_abs_diff", "nmse", "cosine")


def row(d: TensorDiff) -> list[str]:
    def kind(info):
        return "-" if info is None else f"{info[0]}{list(info[1])}"

    return [printable(d.name), d.status, kind(d.a), kind(d.b), fmt(d.max_abs_diff),
            fmt(d.nmse), fmt(d.cosine)]


def run(args, out=None) -> int:
    out = out or sys.stdout
    if args.plot:
        from tensorfs.facts.plot import check_plot

        check_plot(args.plot)           # before anything is read
    options = dict(args.storage_options or [])
    with open_model(args.a, options, args.timeout) as a, \
            open_model(args.b, options, args.timeout) as b:
        total = sum(t.nbytes for t in a.model.tensors) + sum(t.nbytes for t in b.model.tensors)
        with Progress(total, "diff") as progress:
            on_tensor = table = None
            if not args.json:
                table = Table(out, COLUMNS, widths(a.model.tensors, b.model.tensors),
                              wants_aligned(args, out), progress)
                table.header()
                on_tensor = lambda d: table.row(row(d))  # noqa: E731
            results = model_diff(a, b, progress=progress, on_tensor=on_tensor)
    counts = summary(results)
    if args.json:
        json.dump({"a": shown_name(args.a), "b": shown_name(args.b), "summary": counts,
                   "tensors": [d.as_dict() for d in results]},
                  out, indent=1, ensure_ascii=True, allow_nan=False)
        out.write("\n")
    else:
        out.write(f"# {len(results)} names: " +
                  ", ".join(f"{n} {s}" for s, n in counts.items()) + "\n")
    out.flush()
    if args.plot:
        plot_diff(results, shown_name(args.a), shown_name(args.b), args.plot)
    return 0 if set(counts) <= {"identical"} else 1


def widths(tensors_a, tensors_b) -> dict[str, int]:
    """The table's column widths, known before any tensor is read."""
    both = list(tensors_a) + list(tensors_b)
    kinds = [len(f"{t.dtype}{list(t.shape)}") for t in both]
    return {"name": max((len(printable(t.name)) for t in both), default=0),
            "status": max(len(s) for s in STATUSES),
            "a": max(kinds, default=0), "b": max(kinds, default=0),
            "max_abs_diff": NUMBER_WIDTH, "nmse": NUMBER_WIDTH}
