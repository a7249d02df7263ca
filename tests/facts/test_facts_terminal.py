"""``stats`` and ``diff`` at a real terminal (a pseudo-terminal as stdin, stdout and stderr):
the progress bar never shares a line with a row, every row appears whole on a line of its
own, in aligned columns; on a pipe the rows stay tab-separated (tests/facts/test_facts_stats.py,
tests/facts/test_facts_diff.py), and ``--tsv`` gives them at a terminal too."""

from __future__ import annotations

import os

import numpy as np
import pytest
from safetensors.numpy import save_file

from tests.support.commands import TENSORFS
from tests.support.terminal import run_at_terminal, seen_lines

TENSORS = 40


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    d = tmp_path_factory.mktemp("terminal")
    rng = np.random.default_rng(3)
    a = {f"blk.{i}.attn_q.weight": rng.standard_normal(1 << 16).astype(np.float32)
         for i in range(TENSORS)}
    b = {k: v * np.float32(1.001) if i % 3 else v for i, (k, v) in enumerate(a.items())}
    save_file(a, str(d / "a.safetensors"))
    save_file(b, str(d / "b.safetensors"))
    return d / "a.safetensors", d / "b.safetensors", list(a)


def at_terminal(*args) -> tuple[int, str]:
    return run_at_terminal([*TENSORFS, *map(str, args)], env=dict(os.environ))


def assert_rows_whole_and_aligned(output: str, names: list[str], header_start: str,
                                  command: str) -> None:
    assert f"{command}:" in output and "%|" in output, "no progress bar was drawn: " + output
    lines = seen_lines(output)
    header = [line for line in lines if line.startswith(header_start)]
    assert len(header) == 1, lines
    columns = header[0].split()
    starts, pos = [], 0
    for column in columns:
        pos = header[0].index(column, pos)
        starts.append(pos)
        pos += len(column)
    for name in names:
        rows = [line for line in lines if line.split()[:1] == [name]]
        assert len(rows) == 1, (name, lines)
        row = rows[0]
        assert "\t" not in row and "%|" not in row and "it/s" not in row and "B/s" not in row, row
        cells = row.split()
        assert len(cells) == len(columns), (row, columns)
        # each cell starts where its column's header does
        pos = 0
        for cell, start in zip(cells, starts):
            pos = row.index(cell, pos)
            assert pos == start, (row, header[0])
            pos += len(cell)


def test_stats_rows_never_share_the_bar_line(pair):
    a, _, names = pair
    status, output = at_terminal("stats", a)
    assert status == 0, output
    assert_rows_whole_and_aligned(output, names, "name ", "stats")


def test_diff_rows_never_share_the_bar_line(pair):
    a, b, names = pair
    status, output = at_terminal("diff", a, b)
    assert status == 1, output
    assert_rows_whole_and_aligned(output, names, "name ", "diff")
    assert any(line.startswith("# 40 names: ") for line in seen_lines(output))


def test_tsv_at_a_terminal_is_tab_separated(pair):
    a, _, names = pair
    status, output = at_terminal("stats", "--tsv", a)
    assert status == 0, output
    rows = [line for line in seen_lines(output) if line.split("\t")[0] in names]
    assert len(rows) == len(names) and all(len(r.split("\t")) == 12 for r in rows), rows
