"""PyTorch checkpoints (issue 38): written by real torch, mounted through the real command,
read as a user would (cat, numpy.load, safe_open, cmp), every value checked against
``torch.load(weights_only=True)``; the composed ``files/`` safetensors beside the original."""

from __future__ import annotations

import gc
import json
import os

import numpy as np
import pytest

from tests.support import run_tensorfs
from tests.support.pytorch_models import tricky_state_dict, write_transformers_bin

torch = pytest.importorskip("torch")
safetensors_torch = pytest.importorskip("safetensors.torch")

import tensorfs  # noqa: E402


@pytest.fixture
def mount(tmp_path):
    from tests.support import mounts_in

    yield from mounts_in(tmp_path)


def _bytes(t) -> bytes:
    t = t.detach().contiguous().reshape(-1)
    return t.view(torch.uint8).numpy().tobytes() if t.numel() else b""


def _numpy(t):
    t = t.detach()
    if t.dtype in (torch.bfloat16, torch.float8_e4m3fn):
        return t.float().numpy()
    return t.numpy()


@pytest.mark.parametrize("protocol", [2, 3])
def test_tree_serves_what_torch_load_gives(tmp_path, mount, protocol):
    """Views (a storage offset), transposed and strided tensors, tied keys, BF16, FP8, a
    scalar and an empty tensor: each key's raw file and .npy hold torch.load's values; the
    composed safetensors loads with safe_open; the checkpoint is served unchanged."""
    path = tmp_path / "model.pt"
    torch.save(tricky_state_dict(), path, pickle_protocol=protocol)
    expected = torch.load(path, weights_only=False)      # the writer's own view of it
    for name, t in torch.load(path, weights_only=True).items():
        assert torch.equal(t.float(), expected[name].float()), name
    mnt = mount(path)
    for name, t in expected.items():
        parts = name.split(".")
        raw = mnt.joinpath(*parts)
        assert raw.read_bytes() == _bytes(t), name
        npy = np.load(str(raw) + ".npy")
        assert npy.shape == tuple(t.shape), name
        np.testing.assert_array_equal(npy, _numpy(t), err_msg=name)
    files = mnt / "files"
    assert sorted(os.listdir(files)) == ["model.pt", "model.safetensors"]
    assert (files / "model.pt").read_bytes() == path.read_bytes()
    composed = safetensors_torch.load_file(files / "model.safetensors")
    # tied: one view of one storage is written once, under its first name in sorted order
    assert "layer.weight" not in composed and "head.weight" in composed
    from safetensors import safe_open

    with safe_open(files / "model.safetensors", "pt") as f:
        assert f.metadata() == {"format": "pt", "layer.weight": "head.weight"}
    for name, t in composed.items():
        assert _bytes(t) == _bytes(expected[name]), name


@pytest.mark.parametrize("protocol", [1, 4, 5])
def test_protocols_torchs_safe_reader_refuses_are_refused(tmp_path, protocol):
    """torch.load(weights_only=True) refuses a checkpoint saved with pickle_protocol=1, 4
    or 5 (opcodes its reader does not take): so does tensorfs, in one line naming the
    opcode."""
    import warnings

    path = tmp_path / "model.pt"
    torch.save(tricky_state_dict(), path, pickle_protocol=protocol)
    with warnings.catch_warnings(), pytest.raises(Exception):
        warnings.simplefilter("ignore")
        torch.load(path, weights_only=True)
    result = run_tensorfs("inspect", path)
    assert result.returncode == 1 and len(result.stderr.splitlines()) == 1, result.stderr
    assert "which torch.load(weights_only=True) refuses too" in result.stderr


def test_python_api_and_inspect(tmp_path):
    path = tmp_path / "ckpt.pth"
    state = tricky_state_dict()
    torch.save({"model": state, "epoch": 7, "note": "hello"}, path)
    with tensorfs.open(path) as m:
        assert m.format == "pytorch"
        assert set(m.tensors) == {f"model.{k}" for k in state}
        assert dict(m.metadata) == {"epoch": 7, "note": "hello"}
        np.testing.assert_array_equal(m.array("model.layer.weight_t"),
                                      state["layer.weight_t"].numpy())
        assert m.read("model.layer.column") == _bytes(state["layer.column"])
        assert set(m.files) == {"ckpt.pth", "ckpt.safetensors"}
    result = run_tensorfs("inspect", path)
    assert result.returncode == 0, result.stderr
    assert "format:     pytorch" in result.stdout
    assert "model.layer.weight_t" in result.stdout


def test_hash_and_stats_of_a_checkpoint(tmp_path):
    path = tmp_path / "w.pt"
    state = tricky_state_dict()
    torch.save(state, path)
    result = run_tensorfs("stats", path, "layer.weight_t", "--json")
    assert result.returncode == 0, result.stderr
    stats = json.loads(result.stdout)
    found = json.dumps(stats)
    assert str(round(float(state["layer.weight_t"].max()), 3))[:5] in found
    safe = tmp_path / "w.safetensors"
    safetensors_torch.save_file({k: v.detach().contiguous().clone() for k, v in state.items()
                                 if k != "head.weight"}, safe)
    ours = run_tensorfs("hash", "--sha256", path)
    theirs = run_tensorfs("hash", "--sha256", safe)
    assert ours.returncode == 0 and theirs.returncode == 0, ours.stderr + theirs.stderr

    def per_tensor(out):
        return {line.split()[2].rsplit(":", 1)[1]: line.split()[1]
                for line in out.splitlines() if ":" in line.split()[-1]}
    ours, theirs = per_tensor(ours.stdout), per_tensor(theirs.stdout)
    assert ours.pop("head.weight") == ours["layer.weight"]
    assert ours == theirs


@pytest.mark.parametrize("shards", [1, 3])
def test_transformers_directory_files(tmp_path, mount, shards):
    """A directory as save_pretrained(safe_serialization=False) leaves it: files/ serves
    model.safetensors (or the model-0000N-of-0000M shards and their index) beside the
    checkpoint, and each composed file holds torch.load's tensors."""
    pytest.importorskip("transformers")
    d = write_transformers_bin(tmp_path / "repo", shards=shards)
    mnt = mount(d)
    names = sorted(os.listdir(mnt / "files"))
    originals = sorted(n for n in os.listdir(d))
    for name in originals:
        assert (mnt / "files" / name).read_bytes() == (d / name).read_bytes(), name
    if shards == 1:
        composed = ["model.safetensors"]
    else:
        composed = [f"model-{i:05d}-of-{shards:05d}.safetensors" for i in range(1, shards + 1)]
        index = json.loads((mnt / "files" / "model.safetensors.index.json").read_text())
        assert sorted(set(index["weight_map"].values())) == composed
        composed = composed + ["model.safetensors.index.json"]
    assert names == sorted(originals + composed)
    loaded = {}
    for name in composed:
        if name.endswith(".safetensors"):
            loaded.update(safetensors_torch.load_file(mnt / "files" / name))
    checkpoints = [n for n in originals if n.endswith(".bin")]
    for name in checkpoints:
        for key, t in torch.load(d / name, weights_only=True).items():
            if key in loaded:
                assert torch.equal(loaded[key], t), key
            assert (mnt.joinpath(*key.split("."))).read_bytes() == _bytes(t), key


def test_non_model_bins_beside_a_checkpoint(tmp_path):
    """training_args.bin and optimizer.pt (Trainer's) do not make a directory ambiguous; a
    directory with model.safetensors too is mounted from that (as transformers loads it)."""
    d = tmp_path / "run"
    d.mkdir()
    torch.save({"w": torch.ones(2)}, d / "pytorch_model.bin")
    torch.save({"lr": 0.1}, d / "optimizer.pt")
    (d / "training_args.bin").write_bytes(b"not read")
    with tensorfs.open(d) as m:
        assert m.format == "pytorch" and list(m.tensors) == ["w"]
    safetensors_torch.save_file({"v": torch.zeros(3)}, d / "model.safetensors")
    with tensorfs.open(d) as m:
        assert m.format == "safetensors" and list(m.tensors) == ["v"]


@pytest.mark.clients
@pytest.mark.parametrize("shards", [1, 2])
def test_transformers_logits_from_the_composed_files(tmp_path, mount, shards):
    """from_pretrained(MNT/files) loads the composed safetensors (tied embeddings, one file
    or shards) and gives the logits the original directory gives, bit for bit."""
    pytest.importorskip("transformers")
    from transformers import AutoModelForCausalLM

    from tests.support.tiny_models import PROMPT_IDS

    d = write_transformers_bin(tmp_path / "repo", shards=shards, tied=True)
    mnt = mount(d)
    ids = torch.tensor([PROMPT_IDS])
    logits = []
    for where in (d, mnt / "files"):
        model = AutoModelForCausalLM.from_pretrained(where).eval()
        with torch.no_grad():
            logits.append(model(ids).logits)
        del model                   # its memory maps of MNT/files: gone before the unmount
        gc.collect()
    assert torch.equal(logits[0], logits[1])
    assert logits[0].abs().sum() > 0


def test_large_non_contiguous_tensors_are_gathered_per_read(tmp_path, monkeypatch):
    """A non-contiguous tensor too large to keep gathered is gathered per read from the
    rows the read asks for, a few storage bytes at a time: any range of it, at any offset,
    holds torch's values (here the limits are made tiny so that every tensor takes that
    path)."""
    from tensorfs.loading import checkpoints

    monkeypatch.setattr(checkpoints, "GATHER_KEEP_BYTES", 0)
    monkeypatch.setattr(checkpoints, "GATHER_SPAN_BYTES", 8)
    path = tmp_path / "views.pt"
    state = tricky_state_dict()
    state["cube"] = torch.randn(5, 4, 3).permute(2, 0, 1)
    state["every_other"] = torch.arange(40, dtype=torch.int16).reshape(8, 5)[::2, 1::2]
    torch.save(state, path)
    import random

    rng = random.Random(38)
    with tensorfs.open(path) as m:
        for name, t in state.items():
            want = _bytes(t)
            assert m.read(name) == want, name
            for _ in range(20):
                a = rng.randrange(len(want) + 1)
                b = rng.randrange(a, len(want) + 1)
                assert m.read(name, a, b - a) == want[a:b], (name, a, b)


def test_edits_are_refused_in_one_line(tmp_path):
    """--edits would serve an edited safetensors file under the checkpoint's name: refused,
    saying what to do instead, and nothing mounted."""
    from tests.support import mount_expecting_refusal

    path = tmp_path / "w.pt"
    torch.save({"w": torch.ones(2)}, path)
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    result, mounted = mount_expecting_refusal(path, mnt, "--edits", tmp_path / "edits")
    assert result.returncode == 1 and not mounted
    assert len(result.stderr.splitlines()) == 1
    assert "--edits does not apply to a PyTorch checkpoint" in result.stderr


def test_zip64_entries_are_read(tmp_path):
    """torch writes zip64 records for large checkpoints: the same entries with zip64
    extra fields read the same tensors."""
    import zipfile

    path = tmp_path / "small.pt"
    state = tricky_state_dict()
    torch.save(state, path)
    big = tmp_path / "zip64.pt"
    with zipfile.ZipFile(path) as zin, zipfile.ZipFile(big, "w") as zout:
        for info in zin.infolist():
            with zout.open(zipfile.ZipInfo(info.filename), "w", force_zip64=True) as f:
                f.write(zin.read(info.filename))
    with tensorfs.open(big) as m:
        for name, t in state.items():
            assert m.read(name) == _bytes(t), name


def test_an_index_mixing_formats_is_refused(tmp_path):
    d = tmp_path / "mixed"
    d.mkdir()
    torch.save({"a": torch.ones(2)}, d / "pytorch_model-00001-of-00002.bin")
    safetensors_torch.save_file({"b": torch.ones(2)}, d / "pytorch_model-00002-of-00002.bin")
    (d / "pytorch_model.bin.index.json").write_text(json.dumps({"weight_map": {
        "a": "pytorch_model-00001-of-00002.bin", "b": "pytorch_model-00002-of-00002.bin"}}))
    result = run_tensorfs("inspect", d)
    assert result.returncode == 1 and len(result.stderr.splitlines()) == 1
    assert "is safetensors, not pytorch" in result.stderr


def test_a_checkpoint_changed_under_the_mount_reads_eio(tmp_path, mount):
    """The composed file and the tensors read through it vouch for the checkpoint as the
    original does: rewritten under the mount, each reads EIO, never the new bytes."""
    import errno

    path = tmp_path / "w.pt"
    state = tricky_state_dict()
    torch.save(state, path)
    mnt = mount(path)
    assert (mnt / "layer" / "weight_t").read_bytes() == _bytes(state["layer.weight_t"])
    with open(path, "r+b") as f:
        f.seek(path.stat().st_size // 2)
        f.write(b"changed!")
    for served in (mnt / "layer" / "rows", mnt / "files" / "w.safetensors", mnt / "files" / "w.pt"):
        with pytest.raises(OSError) as caught:
            served.read_bytes()
        assert caught.value.errno == errno.EIO, served
