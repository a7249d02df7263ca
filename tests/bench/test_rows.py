"""bench/run.py, the one entry point of the benchmark: every row is a module of bench/rows/
that runs (here: imports, parses its options), and a tiny run of a few rows lands in one
results file."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
RUN = REPO / "bench" / "run.py"


def _rows() -> list[str]:
    done = subprocess.run([sys.executable, str(RUN), "--list"], capture_output=True, text=True,
                          timeout=60, cwd=REPO)
    assert done.returncode == 0, done.stderr
    return [line.split()[0] for line in done.stdout.splitlines()]


def test_every_row_is_a_module_of_bench_rows_and_no_script_is_left_beside_run():
    rows = _rows()
    assert len(rows) >= 20
    for name in rows:
        assert (REPO / "bench" / "rows" / f"{name}.py").exists() or name in (
            "mount",), name                     # the local "mount" row is rows/mount_time.py
    left = sorted(p.name for p in (REPO / "bench").glob("*.py"))
    assert left == ["compare.py", "passthrough.py", "run.py"]   # the guard and a reference daemon


@pytest.mark.parametrize("name", ["remote", "clients", "facts", "fleet", "peers", "files", "kernels",
                                  "diskcache", "scale", "worker_pool", "receive", "remote_blocks",
                                  "hfgguf"])
def test_a_row_program_starts_and_reads_its_options(name):
    done = subprocess.run([sys.executable, str(REPO / "bench" / "rows" / f"{name}.py"), "--help"],
                          capture_output=True, text=True, timeout=120, cwd=REPO)
    assert done.returncode == 0, done.stderr
    assert "usage:" in done.stdout


def test_an_unknown_row_is_one_line():
    done = subprocess.run([sys.executable, str(RUN), "no_such_row"], capture_output=True,
                          text=True, timeout=60, cwd=REPO)
    assert done.returncode == 2
    assert "no such row: no_such_row" in done.stderr and "Traceback" not in done.stderr


@pytest.mark.slow
def test_a_quick_run_of_rows_writes_one_results_file(tmp_path):
    """A local row and two program rows, tiny: one results file holds them all."""
    results = tmp_path / "results.json"
    done = subprocess.run([sys.executable, str(RUN), "--quick", "--no-report", "tree", "kernels",
                           "diskcache", "--tree-sizes", "200", "--workdir", str(tmp_path / "work"),
                           "--json", str(results)],
                          capture_output=True, text=True, timeout=600, cwd=REPO)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    got = json.loads(results.read_text())
    assert got["program_kernels"]["returncode"] == 0 and "Q4_K" in got["program_kernels"]["output"]
    assert got["program_diskcache"]["returncode"] == 0
    assert "7_tree_200" in got, sorted(got)
