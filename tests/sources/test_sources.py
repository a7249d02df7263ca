"""The model is parsed from the source that serves it, and only a regular file is one
(issue 14): a FIFO as MODEL is refused before anything reads it, a shard that is a directory
is said to be one, and a file renamed over the path while the mount parses changes neither
the tree nor the bytes of what was parsed."""

from __future__ import annotations

import importlib.util as importlib_util
import os

import numpy as np
from safetensors.numpy import save_file

from tests.support import run_tensorfs
from tests.support.shards import INDEX, write_hf_shards


def _one_line(result) -> str:
    assert result.returncode == 1, (result.returncode, result.stderr)
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("tensorfs: error: "), result.stderr
    return lines[0]


def test_a_fifo_as_model_is_refused_without_blocking(tmp_path):
    fifo = tmp_path / "model.safetensors"
    os.mkfifo(fifo)
    (tmp_path / "mnt").mkdir()
    # No writer ever opens the FIFO: a blocking open or read would hang until the timeout.
    for args in (("inspect", fifo), ("mount", fifo, tmp_path / "mnt")):
        line = _one_line(run_tensorfs(*args, timeout=30))
        assert line == f"tensorfs: error: {fifo}: not a regular file (a FIFO)"


def test_a_fifo_as_shard_is_refused_without_blocking(tmp_path):
    index, _, weight_map = write_hf_shards(tmp_path / "hf", 2)
    shard = tmp_path / "hf" / sorted(set(weight_map.values()))[1]
    shard.unlink()
    os.mkfifo(shard)
    line = _one_line(run_tensorfs("inspect", index, timeout=30))
    assert f"shard '{shard.name}' named by the index is not a regular file" in line


def test_a_shard_that_is_a_directory_is_said_to_be_one(tmp_path):
    index, _, weight_map = write_hf_shards(tmp_path / "hf", 2)
    shard = tmp_path / "hf" / sorted(set(weight_map.values()))[0]
    shard.unlink()
    shard.mkdir()
    line = _one_line(run_tensorfs("inspect", index))
    assert line == (f"tensorfs: error: {index}: shard '{shard.name}' named by the index is a "
                    f"directory")


def test_an_index_that_is_a_directory_is_said_to_be_one(tmp_path):
    # a directory given as MODEL is a directory of models; one named by nothing else is
    # checked by kind before it is read
    (tmp_path / "d" / "x.safetensors").mkdir(parents=True)
    line = _one_line(run_tensorfs("inspect", tmp_path / "d"))
    assert "holds no" in line


def _model(path, value: float, names=("a.w", "b.w")):
    save_file({n: np.full((4, 4), value, np.float32) for n in names}, str(path))


def test_a_file_renamed_over_the_path_during_the_parse_is_not_mixed_in(tmp_path):
    """The loader opens the file, then parses and serves that descriptor: another file put
    at the path in between (here: right after the open) is never read."""
    from tensorfs.budget import MemoryBudget
    from tensorfs.loading import shards
    from tensorfs.mount.tree import build_mount
    from tensorfs.sources.location import LocalLocation

    path = tmp_path / "model.safetensors"
    _model(path, 1.0)
    other = tmp_path / "other.safetensors"
    _model(other, 2.0, names=("c.w",))

    location = LocalLocation()
    location.open(str(path))                 # the open the loader does first ...
    os.rename(other, path)                   # ... and the swap before it parses
    model = location.attach(shards.load(str(path), location))
    try:
        assert [t.name for t in model.tensors] == ["a.w", "b.w"]
        mounted = build_mount(model, MemoryBudget(1 << 20))
        source = mounted.sources[str(path)]
        tensor = model.tensors[0]
        data = np.frombuffer(source.read(tensor.offset, tensor.nbytes), np.float32)
        assert (data == 1.0).all()
    finally:
        model.close()


def test_a_file_rewritten_in_place_during_the_parse_is_refused(tmp_path):
    path = tmp_path / "model.safetensors"
    _model(path, 1.0)
    from tensorfs.errors import ModelError
    from tensorfs.loading import shards
    from tensorfs.sources.location import LocalLocation

    location = LocalLocation()
    location.open(str(path))
    data = bytearray(path.read_bytes())
    data[-4:] = np.float32(9.0).tobytes()
    with open(path, "r+b") as f:             # same inode, new bytes, new mtime
        f.write(data)
    os.utime(path, ns=(1, 1))
    try:
        shards.load(str(path), location)
    except ModelError as error:
        assert "rewritten" in str(error), str(error)
    else:
        raise AssertionError("a model rewritten while it was parsed was accepted")
    finally:
        location.close_all()


def test_load_model_keeps_the_sources_it_parsed_from(tmp_path):
    from tensorfs.loading.loader import load_model

    index, _, weight_map = write_hf_shards(tmp_path / "hf", 3)
    model = load_model(str(index))
    try:
        assert sorted(model.sources) == sorted(f.path for f in model.files)
        assert str(index) not in model.sources          # the index itself is closed
        assert all(s.size == f.file_size for f in model.files
                   for s in [model.sources[f.path]])
    finally:
        model.close()
    assert INDEX == index.name


def test_a_url_without_the_remote_extra_is_one_line_naming_it(tmp_path):
    """The packages of tensorfs-fuse[remote] hidden (a module of that name that fails to
    import comes first on the path): a URL is refused with one line saying what to install."""
    for module, url in (("obstore", "http://127.0.0.1:9/m.gguf"),
                        ("huggingface_hub", "hf://org/repo/m.gguf"),
                        ("obstore", "s3://bucket/m.gguf"),
                        ("fsspec", "sftp://host/m.gguf")):
        shadow = tmp_path / module
        (shadow / module).mkdir(parents=True, exist_ok=True)
        (shadow / module / "__init__.py").write_text(
            f"raise ImportError(\"No module named '{module}'\", name='{module}')\n")
        env = {**os.environ, "PYTHONPATH": str(shadow)}
        line = _one_line(run_tensorfs("inspect", url, env=env, timeout=60))
        assert line == (f"tensorfs: error: {url}: reading a URL needs the optional packages of "
                        f"tensorfs-fuse[remote] (missing: {module}): in a tensorfs checkout, "
                        f"pip install -e '.[remote]' (make test installs them into .venv)")


def test_any_other_fsspec_protocol_mounts_like_the_path(tmp_path, mount):
    """file:// goes through the generic transport (fsspec's info / ls / ranged cat_file)
    and the block cache: the mount's files are the local mount's, a directory included."""
    import json

    pytest = __import__("pytest")
    if importlib_util.find_spec("fsspec") is None:
        pytest.skip("the remote extra is not installed")
    index, _, _ = write_hf_shards(tmp_path / "hf", 3)
    local = mount(index, name="local")
    for url in (f"file://{index}", f"file://{index.parent}"):
        remote = mount(url, name=f"url{len(url)}")
        doc = json.loads((remote / "metadata.json").read_bytes())
        assert doc["source"] == url
        assert all(s["version"] for s in doc["shards"])
        for entry in doc["tensors"].values():
            for suffix in ("", ".npy"):
                assert (remote / (entry["path"] + suffix)).read_bytes() == \
                    (local / (entry["path"] + suffix)).read_bytes()
