"""``tensorfs diff`` against numpy over the oracles' values: a Q4_K model against
its F16, every type against another draw of itself, every status, exit codes like diff(1)'s,
pieces and threads, --plot."""

from __future__ import annotations

import json
import math
import shutil

import gguf
import numpy as np
import pytest

from tests.support import run_tensorfs, safetensors_corpus
from tests.support.facts_models import write_every_type_gguf
from tests.support.quant_blocks import oracle, random_blocks

LAYERS = 4
KINDS = ("attn_q", "attn_k", "ffn_down")


def oracle_measures(a: np.ndarray, b: np.ndarray) -> dict:
    a = np.asarray(a).astype(np.float64).reshape(-1)
    b = np.asarray(b).astype(np.float64).reshape(-1)
    with np.errstate(all="ignore"):
        d = a - b
        saa, sbb = float(a @ a), float(b @ b)
        sse, sab = float(d @ d), float(a @ b)
        return {"max_abs_diff": float(np.max(np.abs(d))) if d.size else 0.0,
                "nmse": sse / saa if saa else (0.0 if sse == 0 else math.inf),
                "cosine": sab / (math.sqrt(saa) * math.sqrt(sbb)) if saa and sbb else math.nan}


def same(got, want) -> bool:
    if got in ("nan", "inf", "-inf"):
        got = float(got)
    if isinstance(want, float) and math.isnan(want):
        return isinstance(got, float) and math.isnan(got)
    return math.isclose(got, want, rel_tol=1e-9, abs_tol=1e-15)


def write_pair(directory):
    """The main case: a model's F16 tensors (A) and their Q4_K quantization (B): the Q4_K
    blocks are random, the F16 values are what they dequantize to plus a little noise."""
    rng = np.random.default_rng(11)
    a = gguf.GGUFWriter(str(directory / "model-f16.gguf"), "llama")
    b = gguf.GGUFWriter(str(directory / "model-q4_k.gguf"), "llama")
    values = {}
    for layer in range(LAYERS):
        for kind in KINDS:
            name = f"blk.{layer}.{kind}.weight"
            blocks = random_blocks("Q4_K", 8 * 4, rng, raw_tail=0).reshape(8, -1)
            q = oracle("Q4_K", blocks.reshape(-1)).reshape(8, 1024)
            f = (q + rng.standard_normal(q.shape) * np.abs(q).mean() * 0.01 * (layer + 1))
            f = f.astype(np.float16)
            a.add_tensor(name, f)
            b.add_tensor(name, blocks, raw_dtype=gguf.GGMLQuantizationType.Q4_K)
            values[name] = (f, q)
    norm = rng.standard_normal(64).astype(np.float32)
    for w in (a, b):
        w.add_tensor("output_norm.weight", norm)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
    values["output_norm.weight"] = (norm, norm)
    return directory / "model-f16.gguf", directory / "model-q4_k.gguf", values


def test_a_q4_k_model_against_its_f16(tmp_path):
    fa, fb, values = write_pair(tmp_path)
    result = run_tensorfs("diff", "--json", fa, fb)
    assert result.returncode == 1, result.stderr
    doc = json.loads(result.stdout)
    assert doc["a"] == str(fa) and doc["b"] == str(fb)
    assert doc["summary"] == {"identical": 1, "values_differ": LAYERS * len(KINDS)}
    rows = {r["name"]: r for r in doc["tensors"]}
    assert list(rows) == list(values)
    for name, (a, b) in values.items():
        row = rows[name]
        if name == "output_norm.weight":
            assert row["status"] == "identical"
            continue
        assert row["status"] == "values_differ"
        assert row["a"] == {"dtype": "F16", "shape": [8, 1024]}
        assert row["b"] == {"dtype": "Q4_K", "shape": [8, 1024]}
        for key, want in oracle_measures(a, b).items():
            assert same(row[key], want), (name, key, row[key], want)
    # the table: a header, one row per name, a summary
    table = run_tensorfs("diff", fa, fb)
    assert table.returncode == 1
    lines = table.stdout.splitlines()
    assert lines[0].split("\t") == ["name", "status", "a", "b", "max_abs_diff", "nmse", "cosine"]
    assert len(lines) == len(values) + 2
    assert lines[-1] == f"# {len(values)} names: 1 identical, {LAYERS * len(KINDS)} values_differ"


def test_identical_models_exit_0(tmp_path):
    fa, _, values = write_pair(tmp_path)
    copy = tmp_path / "copy.gguf"
    shutil.copy(fa, copy)
    result = run_tensorfs("diff", fa, copy)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[-1] == f"# {len(values)} names: {len(values)} identical"


def test_every_type_against_another_draw_of_itself(tmp_path):
    a = write_every_type_gguf(tmp_path / "a.gguf", seed=0)
    b = write_every_type_gguf(tmp_path / "b.gguf", seed=5)
    result = run_tensorfs("diff", "--json", tmp_path / "a.gguf", tmp_path / "b.gguf")
    assert result.returncode == 1, result.stderr
    rows = {r["name"]: r for r in json.loads(result.stdout)["tensors"]}
    assert list(rows) == list(a)
    for name in a:
        row = rows[name]
        if name == "empty.weight":
            assert row["status"] == "identical"
            continue
        assert row["status"] == "values_differ", name
        for key, want in oracle_measures(a[name].values, b[name].values).items():
            assert same(row[key], want), (name, key, row[key], want)


def test_every_status(tmp_path):
    f4 = b"\x12\x34"

    def model(path, tensors):
        entries, data = [], bytearray()
        for name, dtype, shape, raw in tensors:
            entries.append((name, safetensors_corpus.tensor(dtype, shape, len(data),
                                                            len(data) + len(raw))))
            data += raw
        path.write_bytes(safetensors_corpus.build(entries, data=bytes(data)))

    halves = np.array([0.5, -2.0, 0.0, 1024.0], np.float32)
    ones = np.ones(4, np.float32)
    model(tmp_path / "a.safetensors", [
        ("same", "F32", [4], ones.tobytes()),
        ("widened", "F32", [4], halves.tobytes()),
        ("changed", "F32", [4], ones.tobytes()),
        ("reshaped", "F32", [4], ones.tobytes()),
        ("f4.same", "F4", [4], f4),
        ("f4.changed", "F4", [4], f4),
        ("f4.retyped", "F4", [4], f4),
        ("only.a", "I8", [2], b"\x01\x02"),
    ])
    model(tmp_path / "b.safetensors", [
        ("only.b", "I8", [2], b"\x01\x02"),
        ("same", "F32", [4], ones.tobytes()),
        ("widened", "F16", [4], halves.astype(np.float16).tobytes()),
        ("changed", "F32", [4], (ones * 2).tobytes()),
        ("reshaped", "F32", [2, 2], ones.tobytes()),
        ("f4.same", "F4", [4], f4),
        ("f4.changed", "F4", [4], b"\x12\x35"),
        ("f4.retyped", "F8_E4M3", [4], b"\x01\x02\x03\x04"),
    ])
    result = run_tensorfs("diff", "--json", tmp_path / "a.safetensors", tmp_path / "b.safetensors")
    assert result.returncode == 1, result.stderr
    rows = {r["name"]: r for r in json.loads(result.stdout)["tensors"]}
    assert {n: r["status"] for n, r in rows.items()} == {
        "same": "identical", "widened": "values_equal", "changed": "values_differ",
        "reshaped": "shape_differs", "f4.same": "identical", "f4.changed": "bytes_differ",
        "f4.retyped": "type_differs", "only.a": "only_in_a", "only.b": "only_in_b"}
    assert list(rows)[-1] == "only.b"
    assert rows["changed"]["max_abs_diff"] == 1.0 and rows["changed"]["nmse"] == 1.0
    assert rows["changed"]["cosine"] == 1.0
    assert rows["widened"]["max_abs_diff"] == 0.0
    assert "nmse" not in rows["reshaped"] and "nmse" not in rows["f4.changed"]
    assert rows["only.b"] == {"name": "only.b", "status": "only_in_b",
                              "b": {"dtype": "I8", "shape": [2]}}


def test_errors_exit_2_in_one_line(tmp_path):
    fa, _, _ = write_pair(tmp_path)
    missing = run_tensorfs("diff", fa, tmp_path / "nope.gguf")
    assert missing.returncode == 2 and missing.stdout == ""
    assert missing.stderr.startswith("tensorfs: error: ") and missing.stderr.count("\n") == 1
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(b"\x05\x00\x00\x00\x00\x00\x00\x00{}")
    refused = run_tensorfs("diff", bad, fa)
    assert refused.returncode == 2 and refused.stderr == run_tensorfs("inspect", bad).stderr
    assert run_tensorfs("diff", fa).returncode == 2          # usage


def test_pieces_and_threads_change_nothing(tmp_path, monkeypatch):
    import tensorfs
    from tensorfs.facts import diff
    from tensorfs.facts import pieces as facts

    fa, fb, values = write_pair(tmp_path)
    monkeypatch.setattr(facts, "TASK_BYTES", 1)
    for workers, piece in ((1, 256), (4, 2048), (2, 1 << 20)):
        monkeypatch.setattr(diff, "PIECE_ELEMENTS", piece)
        seen = []
        with tensorfs.open(fa) as a, tensorfs.open(fb) as b:
            results = diff.model_diff(a, b, workers=workers, on_tensor=seen.append)
        assert [d.name for d in seen] == [d.name for d in results] == list(values)
        for d in results:
            if d.name == "output_norm.weight":
                assert d.status == "identical"
                continue
            want = oracle_measures(*values[d.name])
            assert same(d.max_abs_diff, want["max_abs_diff"]) and same(d.nmse, want["nmse"])
            assert same(d.cosine, want["cosine"])


def test_plot_writes_a_png(tmp_path):
    pytest.importorskip("matplotlib")
    fa, fb, _ = write_pair(tmp_path)
    png = tmp_path / "diff.png"
    result = run_tensorfs("diff", fa, fb, "--plot", png)
    assert result.returncode == 1, result.stderr
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_plot_draws_every_compared_tensor_on_the_band_it_belongs_to(tmp_path):
    """The tensor that changed most (nmse inf: A all zeros) and a NaN one are drawn on the
    top band, identical ones on the 0 band, none left out; the PNG is written."""
    pytest.importorskip("matplotlib")
    from safetensors.numpy import save_file

    from tensorfs.facts.diff import model_diff
    from tensorfs.facts.models import open_model
    from tensorfs.facts.plot import plot_diff

    rng = np.random.default_rng(5)
    a, b = {}, {}
    for layer in range(3):
        for kind in ("attn_q", "ffn_down"):
            x = rng.standard_normal(64).astype(np.float32)
            a[f"blk.{layer}.{kind}.weight"] = x
            b[f"blk.{layer}.{kind}.weight"] = x if layer == 1 else x * np.float32(1.01)
    a["blk.0.zeros.weight"], b["blk.0.zeros.weight"] = np.zeros(8, np.float32), np.ones(8, np.float32)
    a["blk.2.nan.weight"] = np.array([np.nan, 1], np.float32)
    b["blk.2.nan.weight"] = np.array([1, 1], np.float32)
    a["output.weight"] = b["output.weight"] = np.ones(4, np.float32)
    save_file(a, str(tmp_path / "a.safetensors"))
    save_file(b, str(tmp_path / "b.safetensors"))
    with open_model(str(tmp_path / "a.safetensors")) as ma, \
            open_model(str(tmp_path / "b.safetensors")) as mb:
        results = model_diff(ma, mb)
    drawn = plot_diff(results, "a", "b", str(tmp_path / "d.png"))
    assert (tmp_path / "d.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert sorted(drawn["top"]) == ["blk.0.zeros.weight", "blk.2.nan.weight"]
    assert sorted(drawn["zero"]) == sorted(["blk.1.attn_q.weight", "blk.1.ffn_down.weight",
                                            "output.weight"])
    assert len(drawn["main"]) == 4
    assert sum(map(len, drawn.values())) == len(results)


def test_plot_of_nothing_comparable_is_no_file_and_one_note(tmp_path):
    pytest.importorskip("matplotlib")
    from safetensors.numpy import save_file

    save_file({"x": np.ones(4, np.float32)}, str(tmp_path / "a.safetensors"))
    save_file({"x": np.ones(5, np.float32), "y": np.ones(1, np.float32)},
              str(tmp_path / "b.safetensors"))
    png = tmp_path / "d.png"
    result = run_tensorfs("diff", tmp_path / "a.safetensors", tmp_path / "b.safetensors",
                          "--plot", png)
    assert result.returncode == 1           # the models differ: that stands
    assert result.stderr == (f"tensorfs: note: {png}: not drawn: no tensor of A and B has "
                             f"values to compare (1 shape_differs, 1 only_in_b)\n")
    assert not png.exists()
