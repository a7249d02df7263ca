"""``--plot FILE`` of ``stats`` and ``diff``: one PNG to look at instead of a table.

* stats: each tensor's absmax and std on a log scale, in stored order, so that an outlier
  tensor (or a dead one: std 0) stands out of its neighbours; NaN/Inf tensors marked.
* diff: nmse per layer, one line per kind of tensor (``attn_q.weight``, ``ffn_down.weight``
  ...), so that a layer that a quantization or a fine-tune hurt more stands out; tensors
  outside the numbered layers (embeddings, output) as points to the right.

Needs matplotlib (``pip install 'tensorfs-fuse[plot]'``).
"""

from __future__ import annotations

import math
import re

from tensorfs.facts import FactsError

# "blk.12.attn_q.weight" (GGUF), "model.layers.12.self_attn.q_proj.weight" (transformers)
_LAYER = re.compile(r"^(.*?)\b(?:blk|layers|h|layer|block|blocks)\.(\d+)\.(.+)$")


def _pyplot():
    try:
        import matplotlib       # the plot extra, for --plot only
    except ImportError:
        raise FactsError("--plot needs matplotlib: pip install 'tensorfs-fuse[plot]'") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt     # after the backend is chosen

    return plt


def layer_of(name: str) -> tuple[int, str] | None:
    """(layer number, the name's kind without the layer) of a layered tensor name."""
    m = _LAYER.match(name)
    if m is None:
        return None
    return int(m.group(2)), m.group(1) + m.group(3)


def _save(fig, path: str) -> None:
    try:
        fig.savefig(path, dpi=110, format="png")
    except OSError as error:
        raise FactsError(f"{path}: cannot write the plot: {error.strerror or error}") from None


def _short(text: str, limit: int = 60) -> str:
    return text if len(text) <= limit else "…" + text[-(limit - 1):]


def plot_stats(results, model: str, path: str) -> None:
    plt = _pyplot()
    rows = [(s.name, s.moments.as_dict()) for s in results if s.moments is not None]
    fig, ax = plt.subplots(figsize=(12, 5.5))
    xs = list(range(len(rows)))
    absmax = [d["absmax"] if d["absmax"] else math.nan for _, d in rows]
    std = [d["std"] if d["std"] else math.nan for _, d in rows]
    ax.plot(xs, absmax, ".", color="tab:red", label="absmax", markersize=5)
    ax.plot(xs, std, ".", color="tab:blue", label="std", markersize=5)
    bad = [i for i, (_, d) in enumerate(rows) if d["nan"] or d["posinf"] or d["neginf"]]
    if bad:
        ax.plot(bad, [absmax[i] if not math.isnan(absmax[i]) else 1 for i in bad], "x",
                color="black", markersize=9, label="has NaN/Inf")
    dead = [i for i, (_, d) in enumerate(rows) if d["std"] == 0]
    if dead:
        ax.plot(dead, [absmax[i] if absmax[i] and not math.isnan(absmax[i]) else 1 for i in dead],
                "s", mfc="none", color="tab:gray", markersize=8, label="constant (std 0)")
    if any(v > 0 for v in absmax + std if not math.isnan(v)):
        ax.set_yscale("log")
    # label a few of the tensors: the largest absmax ones
    top = sorted((i for i in xs if not math.isnan(absmax[i])), key=lambda i: -absmax[i])[:5]
    for i in top:
        ax.annotate(_short(rows[i][0], 40), (i, absmax[i]), fontsize=7,
                    xytext=(4, 4), textcoords="offset points")
    ax.set_xlabel("tensor (stored order)")
    ax.set_ylabel("value (log scale)")
    ax.set_title(f"tensorfs stats: {_short(model)} — {len(rows)} tensors")
    ax.grid(True, which="major", alpha=0.3)
    ax.legend(loc="upper right", fontsize=8)
    fig.tight_layout()
    _save(fig, path)
    plt.close(fig)


def plot_diff(results, a: str, b: str, path: str) -> None:
    plt = _pyplot()
    by_kind: dict[str, list[tuple[int, float]]] = {}
    others: list[tuple[str, float]] = []
    for d in results:
        if d.status not in ("values_differ", "values_equal", "identical") or d.sums is None:
            continue
        nmse = d.nmse
        if nmse is None or math.isnan(nmse):
            continue
        where = layer_of(d.name)
        if where is None:
            others.append((d.name, nmse))
        else:
            by_kind.setdefault(where[1], []).append((where[0], nmse))
    fig, ax = plt.subplots(figsize=(12, 6))
    positive = [v for pts in by_kind.values() for _, v in pts if v > 0] + \
        [v for _, v in others if v > 0]
    floor = min(positive) / 10 if positive else 1e-12
    last_layer = max((x for pts in by_kind.values() for x, _ in pts), default=-1)
    cmap = plt.get_cmap("tab20")
    for k, (kind, pts) in enumerate(sorted(by_kind.items())):
        pts.sort()
        ax.plot([x for x, _ in pts], [max(v, floor) for _, v in pts], "-o", markersize=3,
                linewidth=1.2, color=cmap(k % 20), label=_short(kind, 40))
    for j, (name, v) in enumerate(others):
        x = last_layer + 2 + j
        ax.plot([x], [max(v, floor)], "D", color="black", markersize=5)
        label = _short(name, 30) + (" (nmse 0)" if v == 0 else "")
        ax.annotate(label, (x, max(v, floor)), fontsize=7, rotation=60,
                    xytext=(3, 3), textcoords="offset points")
    if positive:
        ax.set_yscale("log")
    ax.set_xlabel("layer" + ("   (◆ tensors outside the layers)" if others else ""))
    ax.set_ylabel("nmse = Σ(a−b)² / Σa²" + ("  (0 drawn at the bottom)" if floor else ""))
    counts: dict[str, int] = {}
    for d in results:
        counts[d.status] = counts.get(d.status, 0) + 1
    summary = ", ".join(f"{n} {s}" for s, n in sorted(counts.items()))
    ax.set_title(f"tensorfs diff  A={_short(a, 45)}  B={_short(b, 45)}\n{summary}", fontsize=10)
    ax.grid(True, which="major", alpha=0.3)
    if by_kind:
        ax.legend(loc="center left", bbox_to_anchor=(1.01, 0.5), fontsize=7, frameon=False)
    fig.tight_layout()
    _save(fig, path)
    plt.close(fig)
