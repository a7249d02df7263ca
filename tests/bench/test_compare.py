"""The regression guard (bench/compare.py, ``make bench-compare``): its flagging rule on
figures given here, and a tiny real run of it (two sides, real mounts) that prints every row
with figures."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "bench"))

from rows.compare import ROWS, Side, compare  # noqa: E402 (the path above)


def _side(name: str, runs: dict[str, list[float]]) -> Side:
    side = Side.__new__(Side)
    side.name = name
    side.runs = {row.key: list(runs.get(row.key, [1.0, 1.0])) for row in ROWS}
    return side


def test_a_row_worse_by_the_threshold_in_best_and_median_is_flagged():
    base = _side("base", {"raw_fresh": [1000, 1000, 1000], "mount": [0.20, 0.20, 0.20],
                          "q4_k_npy_1": [900, 900, 900], "first_byte": [0.2, 0.2, 0.2],
                          "raw_warm": [3000, 3000, 3000]})
    head = _side("head", {"raw_fresh": [880, 890, 850],          # 11% worse: flagged
                          "mount": [0.23, 0.24, 0.23],           # a time 15% longer: flagged
                          "q4_k_npy_1": [1000, 700, 700],        # best better, median worse: not
                          "first_byte": [0.17, 0.18, 0.18],      # shorter: better, not flagged
                          "raw_warm": [2800, 2850, 2900]})       # 5% worse: not
    lines, flagged = compare(base, head, 0.10)
    assert flagged == ["mount", "raw_fresh"]
    assert len(lines) == len(ROWS) + 1
    shown = [line for line in lines if line.startswith("raw_fresh ")]
    assert shown and "1000" in shown[0] and "880" in shown[0] and "WORSE" in shown[0]


def test_a_base_that_is_not_a_revision_is_one_line():
    done = subprocess.run([sys.executable, str(REPO / "bench" / "compare.py"), "no-such-rev-xyz"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert done.stderr.strip().count("\n") == 0 and "not a revision" in done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.slow
def test_a_tiny_run_measures_every_row_of_both_sides(tmp_path):
    """HEAD against the working tree, tiny models, one round: every row has figures."""
    done = subprocess.run([sys.executable, str(REPO / "bench" / "compare.py"), "HEAD", "--quick",
                           "--rounds", "1", "--workdir", str(tmp_path / "work")],
                          capture_output=True, text=True, timeout=600,
                          env={**os.environ, "TMPDIR": str(tmp_path)})   # the base's checkout
    assert done.returncode in (0, 1), done.stdout + done.stderr
    table = {line.split()[0]: line for line in done.stdout.splitlines() if line.split()}
    for row in ROWS:
        assert row.key in table, done.stdout
        figures = table[row.key].split()[2:4] + table[row.key].split()[5:7]   # best, median
        assert "nan" not in figures, table[row.key]
    assert "load averages" in done.stdout
    listed = subprocess.run(["git", "-C", str(REPO), "worktree", "list"], capture_output=True, text=True)
    assert str(tmp_path) not in listed.stdout            # the base's checkout is removed
    assert [p.name for p in tmp_path.iterdir()] == ["work"]
