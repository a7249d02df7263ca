"""``tensorfs stats`` against numpy over the oracles' values (gguf.quants.dequantize,
the project's references, ml_dtypes, the written arrays): every type, NaN/Inf/zeros, pieces
and threads, the table, tensor selection, --plot."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from tests.support import run_tensorfs
from tests.support.facts_models import (
    write_every_type_gguf,
    write_every_type_safetensors,
    write_hand_gguf,
)


def oracle_stats(values: np.ndarray) -> dict:
    """What stats must say, by numpy over the whole array in float64."""
    x = np.asarray(values)
    if x.dtype == np.bool_:
        x = x.astype(np.uint8)
    wide = x.astype(np.float64).reshape(-1)
    finite = wide[np.isfinite(wide)]
    d = {"count": int(x.size),
         "nan": int(np.isnan(wide).sum()), "posinf": int((wide == np.inf).sum()),
         "neginf": int((wide == -np.inf).sum()), "zeros": int((x.reshape(-1) == 0).sum())}
    if finite.size:
        d.update(min=float(finite.min()), max=float(finite.max()), mean=float(finite.mean()),
                 std=float(finite.std()), absmax=float(np.abs(finite).max()))
    else:
        d.update(min=None, max=None, mean=None, std=None, absmax=None)
    return d


def assert_matches(got: dict, values: np.ndarray, name: str) -> None:
    want = oracle_stats(values)
    for key in ("count", "nan", "posinf", "neginf", "zeros", "min", "max", "absmax"):
        assert got[key] == want[key], (name, key, got[key], want[key])
    for key in ("mean", "std"):
        if want[key] is None:
            assert got[key] is None, (name, key)
        else:
            assert math.isclose(got[key], want[key], rel_tol=1e-9, abs_tol=1e-12 * (
                want["absmax"] or 1)), (name, key, got[key], want[key])


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    d = tmp_path_factory.mktemp("stats")
    return d, {"every.gguf": write_every_type_gguf(d / "every.gguf"),
               "hand.gguf": write_hand_gguf(d / "hand.gguf"),
               "every.safetensors": write_every_type_safetensors(d / "every.safetensors")}


@pytest.mark.parametrize("model", ["every.gguf", "hand.gguf", "every.safetensors"])
def test_every_type_equals_numpy_over_the_oracle(models, model):
    d, every = models
    written = every[model]
    result = run_tensorfs("stats", "--json", d / model)
    assert result.returncode == 0 and result.stderr == "", result.stderr
    doc = json.loads(result.stdout)
    assert doc["model"] == str(d / model)
    by_name = {t["name"]: t for t in doc["tensors"]}
    assert sorted(by_name) == sorted(written)
    specials = 0
    for name, e in written.items():
        got = by_name[name]
        assert got["dtype"] == e.dtype
        if e.values is None:
            assert got["values"] is None and "packing" in got["reason"]
            continue
        assert got["shape"] == list(e.values.shape)
        assert_matches(got, e.values, name)
        specials += got["nan"] + got["posinf"] + got["neginf"]
    assert specials > 0 or model == "hand.gguf"     # the corpus does hold NaN and Inf


def test_pieces_and_threads_change_nothing(models, monkeypatch):
    """Pieces of a few blocks, tasks of one piece, one to five threads: the merge of
    moments across pieces gives numpy's values."""
    import tensorfs
    from tensorfs.facts import pieces as facts
    from tensorfs.facts import stats

    d, written = models
    monkeypatch.setattr(facts, "TASK_BYTES", 1)
    for workers, piece in ((1, 1 << 20), (3, 256), (5, 4096)):
        with tensorfs.open(d / "every.gguf") as m:
            monkeypatch.setattr(stats, "cut", lambda *a, piece=piece: facts.cut(*a, max_elements=piece))
            seen = []
            results = stats.model_stats(m, workers=workers, on_tensor=seen.append)
        assert [s.name for s in seen] == [s.name for s in results] == list(written["every.gguf"])
        for s in results:
            e = written["every.gguf"][s.name]
            got = {k: v for k, v in s.moments.as_dict().items()}
            assert_matches(got, e.values, s.name)


def test_some_tensors_and_the_table(models):
    d, written = models
    names = ["blk.7.q4_k.weight", "f32.weight"]
    result = run_tensorfs("stats", d / "every.gguf", *names)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].split("\t") == ["name", "dtype", "count", "min", "max", "mean", "std",
                                    "absmax", "nan", "+inf", "-inf", "zeros"]
    assert [line.split("\t")[0] for line in lines[1:]] == ["blk.7.q4_k.weight", "f32.weight"]
    row = lines[2].split("\t")
    want = oracle_stats(written["every.gguf"]["f32.weight"].values)
    assert row[1] == "F32" and int(row[2]) == want["count"]
    assert float(row[3]) == pytest.approx(want["min"], rel=1e-5)
    assert [int(v) for v in row[8:]] == [want["nan"], want["posinf"], want["neginf"], want["zeros"]]


def test_an_unknown_tensor_is_one_line(models):
    d, _ = models
    result = run_tensorfs("stats", d / "every.gguf", "f32.weight", "no\x1b.such")
    assert result.returncode == 1 and result.stdout == ""
    assert result.stderr == f"tensorfs: error: {d}/every.gguf: no tensor named 'no\\x1b.such'\n"


def test_a_name_that_is_not_printable_is_escaped_in_the_table(tmp_path):
    from safetensors.numpy import save_file

    save_file({"evil\x1b[31m\nname": np.arange(3, dtype=np.float32)}, str(tmp_path / "m.safetensors"))
    result = run_tensorfs("stats", tmp_path / "m.safetensors")
    assert result.returncode == 0
    assert "\x1b" not in result.stdout and result.stdout.count("\n") == 2
    assert result.stdout.splitlines()[1].startswith("evil\\x1b[31m\\nname\tF32\t3\t0\t2\t1\t")


def test_plot_writes_a_png(models, tmp_path):
    pytest.importorskip("matplotlib")
    d, _ = models
    png = tmp_path / "stats.png"
    result = run_tensorfs("stats", d / "every.gguf", "--plot", png)
    assert result.returncode == 0, result.stderr
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert result.stdout.startswith("name\tdtype")
    unwritable = run_tensorfs("stats", d / "every.gguf", "--plot", tmp_path / "no" / "x.png")
    assert unwritable.returncode == 1 and unwritable.stderr.count("\n") == 1
    assert "cannot write the plot" in unwritable.stderr


def test_plot_draws_zero_on_a_band_not_at_a_made_up_height(tmp_path):
    """An all-zero tensor's absmax and std and a constant one's std are 0: drawn on the 0
    band, every tensor drawn once; nothing to draw is no file and one note."""
    pytest.importorskip("matplotlib")
    from safetensors.numpy import save_file

    from tensorfs.facts.models import open_model
    from tensorfs.facts.plot import plot_stats
    from tensorfs.facts.stats import model_stats

    save_file({"a": np.linspace(-1, 1, 8).astype(np.float32), "zeros": np.zeros(4, np.float32),
               "constant": np.full(4, 3, np.float32)}, str(tmp_path / "m.safetensors"))
    with open_model(str(tmp_path / "m.safetensors")) as opened:
        results = model_stats(opened)
    drawn = plot_stats(results, "m", str(tmp_path / "s.png"))
    assert (tmp_path / "s.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert drawn == {"main": ["a"], "zero": ["constant", "zeros"]}     # stored order
    save_file({"n": np.array([np.nan], np.float32)}, str(tmp_path / "nan.safetensors"))
    result = run_tensorfs("stats", tmp_path / "nan.safetensors", "--plot", tmp_path / "n.png")
    assert result.returncode == 0
    assert result.stderr == (f"tensorfs: note: {tmp_path}/n.png: not drawn: no tensor has "
                             f"finite values to plot\n")
    assert not (tmp_path / "n.png").exists()
