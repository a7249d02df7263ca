"""``--plot FILE`` of ``stats`` and ``diff``: one PNG to look at instead of a table.

* stats: each tensor's absmax and std on a log scale, in stored order, so that an outlier
  tensor (or a dead one: std 0) stands out of its neighbours; NaN/Inf tensors marked.
* diff: nmse per layer, one series per kind of tensor (``attn_q.weight``,
  ``ffn_down.weight`` ...), so that a layer that a quantization or a fine-tune hurt more
  stands out; tensors outside the numbered layers to the right.  What a log axis cannot
  hold is drawn on bands of its own: nmse 0 (identical, values_equal) below, inf and NaN
  above; nothing sits at an edge pretending to be a small number.

Both are checked before the model is read (``check_plot``: matplotlib is there, FILE can
be written) and written as a new file renamed over FILE (``tensorfs.facts.files.write_output``).
Needs matplotlib, the plot extra (in a tensorfs checkout: ``pip install -e '.[plot]'``).
"""

from __future__ import annotations

import math
import re
import sys

from tensorfs.errors import printable
from tensorfs.facts.files import output_problem, write_output
from tensorfs.facts.models import FactsError

# "blk.12.attn_q.weight" (GGUF), "model.layers.12.self_attn.q_proj.weight" (transformers)
_LAYER = re.compile(r"^(.*?)\b(?:blk|layers|h|layer|block|blocks)\.(\d+)\.(.+)$")

# series styles: 10 colours × 10 markers, so that 100 kinds are told apart
_MARKERS = ("o", "s", "^", "v", "D", "P", "X", "<", ">", "h")
_NAMED_OTHERS = 30          # tensors outside the layers named on the x axis, at most
_CROWDED = 400              # tensors past which the series are points without lines


def check_plot(path: str) -> None:
    """What ``--plot`` needs, checked before any tensor is read: matplotlib, and a FILE
    that can be written (not a link, not a directory)."""
    _pyplot()
    problem = output_problem(path, "plot")
    if problem is not None:
        raise FactsError(problem)


def _pyplot():
    try:
        import matplotlib  # the plot extra, for --plot only
    except ImportError:
        raise FactsError("--plot needs matplotlib, the optional package of the plot extra: in a "
                         "tensorfs checkout, pip install -e '.[plot]' (make test installs it "
                         "into .venv)") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # after the backend is chosen

    return plt


def note(text: str) -> None:
    """One line on stderr that is not an error (the command's exit status stands)."""
    sys.stderr.write(f"tensorfs: note: {text}\n")
    sys.stderr.flush()


def layer_of(name: str) -> tuple[int, str] | None:
    """(layer number, the name's kind without the layer) of a layered tensor name."""
    m = _LAYER.match(name)
    if m is None:
        return None
    return int(m.group(2)), m.group(1) + m.group(3)


def _save(fig, path: str) -> None:
    write_output(path, lambda f: fig.savefig(f, dpi=110, format="png", bbox_inches="tight"),
                 "plot")


def _short(text: str, limit: int = 60) -> str:
    text = printable(text)
    return text if len(text) <= limit else "…" + text[-(limit - 1):]


def _style(k: int, cmap) -> dict:
    return {"color": cmap(k % 10), "marker": _MARKERS[(k // 10) % len(_MARKERS)]}


def plot_stats(results, model: str, path: str) -> dict[str, list[str]] | None:
    """absmax and std per tensor on a log axis; a value 0 (an all-zero tensor's absmax, a
    constant one's std) on a band of its own below, never at a made-up height.  Where
    each tensor's std was drawn: "main" or "zero" -> names."""
    rows = [(s.name, s.moments.as_dict()) for s in results
            if s.moments is not None and s.moments.finite > 0]
    if not rows:
        note(f"{printable(path)}: not drawn: no tensor has finite values to plot")
        return None
    plt = _pyplot()
    xs = list(range(len(rows)))
    absmax = [d["absmax"] for _, d in rows]
    std = [d["std"] for _, d in rows]
    zero = any(v == 0 for v in absmax + std)
    positive = any(v > 0 for v in absmax + std)
    panels = (["main"] if positive else []) + (["zero"] if zero else [])
    ratios = {"main": 6, "zero": 0.75}
    fig, axes = plt.subplots(len(panels), 1, sharex=True, squeeze=False,
                             figsize=(12, 1.5 + sum(ratios[p] for p in panels) * 0.75),
                             gridspec_kw={"height_ratios": [ratios[p] for p in panels],
                                          "hspace": 0.08})
    ax = {p: axes[i][0] for i, p in enumerate(panels)}
    drawn: dict[str, list[str]] = {}
    # on the 0 band absmax a little above std, so that neither hides the other
    for values, color, label, band_y in ((absmax, "tab:red", "absmax", 0.2),
                                         (std, "tab:blue", "std", -0.2)):
        for panel in panels:
            here = [i for i in xs if (values[i] == 0) == (panel == "zero")]
            if here:
                ax[panel].plot(here, [values[i] if panel == "main" else band_y for i in here],
                               ".", color=color, label=label, markersize=5)
        if label == "std":
            for i in xs:
                drawn.setdefault("zero" if std[i] == 0 else "main", []).append(rows[i][0])
    bad = [i for i, (_, d) in enumerate(rows) if d["nan"] or d["posinf"] or d["neginf"]]
    for panel in panels:
        here = [i for i in bad if (absmax[i] == 0) == (panel == "zero")]
        if here:
            ax[panel].plot(here, [absmax[i] if panel == "main" else 0.2 for i in here], "x",
                           color="black", markersize=9, label="has NaN/Inf")
    if "main" in ax:
        ax["main"].set_yscale("log")
        ax["main"].set_ylabel("value (log scale)")
        ax["main"].grid(True, which="major", alpha=0.3)
    if "zero" in ax:
        band = ax["zero"]
        band.set_ylim(-0.6, 0.6)
        band.set_yticks([0], ["0"])
        band.set_facecolor("#f0f5ff")
        band.grid(True, axis="x", alpha=0.3)
    bottom = ax[panels[-1]]
    top = sorted(xs, key=lambda i: -absmax[i])[:5]
    bottom.set_xlabel("tensor (stored order)\nlargest absmax: " + ",  ".join(
        f"#{i} {_short(rows[i][0], 40)} ({absmax[i]:.3g})" for i in top), fontsize=9)
    ax[panels[0]].set_title(f"tensorfs stats: {_short(model)} — {_count(len(rows), 'tensor')}")
    handles: dict = {}
    for panel in panels:
        for h, label in zip(*ax[panel].get_legend_handles_labels()):
            handles.setdefault(label, h)
    ax[panels[0]].legend(list(handles.values()), list(handles), loc="upper left",
                         bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False)
    _save(fig, path)
    plt.close(fig)
    return drawn


def plot_diff(results, a: str, b: str, path: str) -> dict[str, list[str]] | None:
    """nmse per tensor (module docstring); nothing comparable: no file and one note.
    Where each tensor was drawn: panel ("top": inf/NaN, "main", "zero") -> names."""
    compared = [d for d in results if d.sums is not None and d.nmse is not None]
    counts: dict[str, int] = {}
    for d in results:
        counts[d.status] = counts.get(d.status, 0) + 1
    summary = ", ".join(f"{n} {s}" for s, n in counts.items())
    if not compared:
        note(f"{printable(path)}: not drawn: no tensor of A and B has values to compare "
             f"({summary})")
        return None
    plt = _pyplot()

    # x: a layer's tensors around its number, each kind at its own offset (so that no
    # series hides another), tensors outside the layers one slot each to the right
    kinds: dict[str, int] = {}
    placed = []             # (x, nmse, kind index or None, name)
    others = []
    for d in compared:
        where = layer_of(d.name)
        if where is None:
            others.append(d)
            continue
        kinds.setdefault(where[1], len(kinds))
        placed.append((where[0], d.nmse, kinds[where[1]], d.name))
    width = 0.8 / max(1, len(kinds))
    placed = [(layer - 0.4 + width * (k + 0.5), v, k, name) for layer, v, k, name in placed]
    last_layer = max((int(round(x)) for x, *_ in placed), default=-2)
    start = last_layer + 2 if placed else 0
    for j, d in enumerate(others):
        placed.append((start + j, d.nmse, None, d.name))

    finite = [v for _, v, _, _ in placed if math.isfinite(v) and v > 0]
    zero = any(v == 0 for _, v, _, _ in placed)
    inf = any(math.isinf(v) for _, v, _, _ in placed)
    nan = any(math.isnan(v) for _, v, _, _ in placed)
    top_rows = [label for label, present in (("NaN", nan), ("inf", inf)) if present]
    panels = (["top"] if top_rows else []) + (["main"] if finite else []) + \
        (["zero"] if zero else [])
    ratios = {"top": 0.5 + 0.25 * len(top_rows), "main": 6, "zero": 0.75}
    fig, axes = plt.subplots(len(panels), 1, sharex=True, squeeze=False,
                             figsize=(12, 2 + sum(ratios[p] for p in panels) * 0.75),
                             gridspec_kw={"height_ratios": [ratios[p] for p in panels],
                                          "hspace": 0.08})
    ax = {p: axes[i][0] for i, p in enumerate(panels)}
    cmap = plt.get_cmap("tab10")

    def y_of(v):
        if math.isnan(v):
            return "top", top_rows.index("NaN")
        if math.isinf(v):
            return "top", top_rows.index("inf")
        if v == 0:
            return "zero", 0
        return "main", v

    drawn: dict[str, list[str]] = {}
    for _, v, _, name in placed:
        drawn.setdefault(y_of(v)[0], []).append(name)
    handles = {}
    crowded = len(placed) > _CROWDED     # lines would hide the points: points only
    for k in list(range(len(kinds))) + [None]:
        pts = sorted((x, v) for x, v, kind, _ in placed if kind == k)
        if not pts:
            continue
        style = _style(k, cmap) if k is not None else {"color": "black", "marker": "D"}
        label = _short(next(n for n, i in kinds.items() if i == k), 40) if k is not None \
            else "outside the layers" if kinds else "tensor"
        for panel in panels:
            here: list[tuple[float, float]] = [(x, y_of(v)[1]) for x, v in pts
                                               if y_of(v)[0] == panel]
            if not here:
                continue
            if panel == "main":     # a line joins neighbouring layers only
                joined = [here[0]]
                for (x0, _), (x1, y1) in zip(here, here[1:]):
                    if x1 - x0 > 1.5:
                        joined.append((x0 + 0.5, math.nan))
                    joined.append((x1, y1))
                here = joined
            line_style = "-" if panel == "main" and k is not None and not crowded else "none"
            (h,) = ax[panel].plot([x for x, _ in here], [y for _, y in here], linestyle=line_style,
                                  linewidth=0.8, markersize=2.5 if crowded else 4, alpha=0.8,
                                  label=label,
                                  markeredgewidth=0.6, **style)
            handles.setdefault(label, h)

    if "main" in ax:
        ax["main"].set_yscale("log")
        ax["main"].set_ylabel("nmse = Σ(a−b)² / Σa²  (log)")
        ax["main"].grid(True, which="major", alpha=0.3)
    if "top" in ax:
        band = ax["top"]
        band.set_ylim(-0.6, len(top_rows) - 0.4)
        labels = {"NaN": "nmse NaN\n(a NaN in A or B)", "inf": "nmse inf\n(A all zeros)"}
        band.set_yticks(range(len(top_rows)), [labels[r] for r in top_rows])
        band.set_facecolor("#fff0f0")
        band.grid(True, axis="x", alpha=0.3)
    if "zero" in ax:
        band = ax["zero"]
        band.set_ylim(-0.6, 0.6)
        band.set_yticks([0], ["nmse 0"])
        band.set_facecolor("#f0f5ff")
        band.grid(True, axis="x", alpha=0.3)

    bottom = ax[panels[-1]]
    ticks, labels = [], []
    if kinds:
        step = max(1, math.ceil((last_layer + 1) / 20))
        ticks = list(range(0, last_layer + 1, step))
        labels = [str(t) for t in ticks]
    layer_ticks = len(ticks)
    if others:
        if len(others) <= _NAMED_OTHERS:
            ticks += [start + j for j in range(len(others))]
            labels += [_short(d.name, 28) for d in others]
        for panel in panels if kinds else ():
            ax[panel].axvspan(start - 0.6, start + len(others) - 0.4, color="0.93", zorder=0)
    bottom.set_xticks(ticks, labels)
    for t in bottom.get_xticklabels()[layer_ticks:]:
        t.set_rotation(90)
        t.set_fontsize(7)
    what = []
    if kinds:
        what.append("layer (each kind of tensor at its own offset)")
    if others and kinds:
        what.append(f"{_count(len(others), 'tensor')} outside the layers, shaded"
                    + ("" if len(others) <= _NAMED_OTHERS else ", in stored order"))
    elif others:
        what.append("tensor (stored order)")
    worst = [d for d in sorted(compared, key=lambda d: _rank(d.nmse))[:5] if d.nmse != 0]
    if worst:
        what.append("\nlargest nmse: " + ",  ".join(f"{_short(d.name, 40)} ({d.nmse:.3g})"
                                                    for d in worst))
    bottom.set_xlabel(";  ".join(what).replace(";  \n", "\n"), fontsize=9)
    ax[panels[0]].set_title(f"tensorfs diff  A={_short(a, 45)}  B={_short(b, 45)}\n{summary}",
                            fontsize=10)
    ax[panels[0]].legend(list(handles.values()), list(handles.keys()), loc="upper left",
                         bbox_to_anchor=(1.01, 1.0), fontsize=7, frameon=False,
                         ncol=1 if len(handles) <= 24 else 2, title="kind of tensor",
                         title_fontsize=8, markerscale=2 if crowded else 1)
    _save(fig, path)
    plt.close(fig)
    return drawn


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" + ("" if n == 1 else "s")


def _rank(v: float) -> tuple:
    """inf first, then NaN, then the largest."""
    if math.isinf(v):
        return (0, 0.0)
    if math.isnan(v):
        return (1, 0.0)
    return (2, -v)
