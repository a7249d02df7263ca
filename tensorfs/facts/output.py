"""What a fact command shows: a progress bar on a terminal, its table (aligned for a
person, tab-separated otherwise), numbers as a table and as JSON write them.
"""

from __future__ import annotations

import math
import sys

from tensorfs.runtime.libraries import np


class Progress:
    """A tqdm bar of bytes on stderr when stderr is a terminal; nothing otherwise."""

    def __init__(self, total: int, what: str):
        self.bar = None
        if total > 0 and _is_terminal(sys.stderr):
            try:
                from tqdm import tqdm  # optional: a terminal only
            except ImportError:         # a plain install has it; a bare one just shows nothing
                return
            self.bar = tqdm(total=total, desc=what, unit="B", unit_scale=True,
                            unit_divisor=1024, leave=False, file=sys.stderr,
                            dynamic_ncols=True)

    def update(self, n: int) -> None:
        if self.bar is not None and n:
            self.bar.update(n)

    def write_above(self, out, text: str) -> None:
        """``text`` (whole lines) on ``out`` with the bar cleared first and drawn again
        after, so that a row never lands on the bar's line when both go to one terminal."""
        if self.bar is None:
            out.write(text)
            out.flush()
            return
        with self.bar.get_lock():
            self.bar.clear()
            out.write(text)
            out.flush()
            self.bar.refresh()

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None

    def __enter__(self) -> "Progress":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _is_terminal(stream) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


def json_number(x):
    """A float as JSON can hold it: non-finite values as "nan", "inf", "-inf" (as
    metadata.json writes them); integers as they are."""
    if isinstance(x, (int, np.integer)) and not isinstance(x, bool):
        return int(x)
    if x is None:
        return None
    x = float(x)
    if math.isnan(x):
        return "nan"
    if math.isinf(x):
        return "inf" if x > 0 else "-inf"
    return x


class Table:
    """A table's rows as they come: aligned columns for a person (``aligned``: stdout is a
    terminal and ``--tsv`` was not given), tab-separated otherwise.  The widths are fixed
    before the first row from what is known then (``widths``: at least the header's), so
    rows can be printed as each tensor is done; a cell wider than its column pushes the
    rest of its row right rather than being cut."""

    def __init__(self, out, columns, widths=None, aligned: bool = False,
                 progress: "Progress | None" = None):
        self.out = out
        self.columns = list(columns)
        self.aligned = aligned
        self.progress = progress
        self.widths = [max(len(c), (widths or {}).get(c, 0)) for c in self.columns]

    def line(self, cells) -> str:
        cells = list(cells)
        if not self.aligned:
            return "\t".join(cells) + "\n"
        parts, owed = [], 0
        for i, cell in enumerate(cells):
            if i == len(cells) - 1:
                parts.append(cell)
                break
            width = max(0, self.widths[i] - owed) if i < len(self.widths) else 0
            parts.append(cell.ljust(width))
            owed = max(0, len(cell) - width)
        return "  ".join(parts).rstrip() + "\n"

    def write(self, text: str) -> None:
        if self.progress is not None:
            self.progress.write_above(self.out, text)
        else:
            self.out.write(text)
            self.out.flush()

    def header(self) -> None:
        self.write(self.line(self.columns))

    def row(self, cells) -> None:
        self.write(self.line(cells))


def wants_aligned(args, out) -> bool:
    """Aligned columns when the table goes to a terminal and ``--tsv`` was not asked for."""
    return not getattr(args, "tsv", False) and _is_terminal(out)


# a float cell of ``fmt``: "-1.23457e-308" at most
NUMBER_WIDTH = 13


def fmt(x) -> str:
    """A number in a table: integers exact, floats with 6 significant digits."""
    if x is None:
        return "-"
    if isinstance(x, (int, np.integer)):
        return str(int(x))
    return f"{float(x):.6g}"
