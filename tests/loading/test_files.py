"""files/ (docs/internals/design.md): the files a model was read from, whole, byte for byte, with their sizes
and mtimes, in every form a mount takes; the reference readers (safe_open with its memory
map, GGUFReader) read the mounted files as the local ones; a file changed under the mount is
refused at open; the mechanism that serves local files is logged (passthrough with libfuse
3.17 and later as root, splice before: tests/fuse/test_libfuse_matrix.py runs this file against
each libfuse)."""

from __future__ import annotations

import errno
import os
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from gguf import GGUFReader
from safetensors import safe_open
from safetensors.numpy import save_file

import tensorfs
from tests.support.models import write_gguf, write_safetensors
from tests.support.shards import write_hf_shards, write_split_gguf


def _model_dir(tmp_path: Path, form: str) -> tuple[Path, list[Path]]:
    """(what to mount, the local files files/ must hold) for each form."""
    d = tmp_path / form
    d.mkdir()
    if form == "safetensors":
        write_safetensors(d / "model.safetensors")
        return d / "model.safetensors", [d / "model.safetensors"]
    if form == "gguf":
        write_gguf(d / "model.gguf")
        return d / "model.gguf", [d / "model.gguf"]
    if form == "index":
        index, _, weight_map = write_hf_shards(d)
        (d / "config.json").write_text('{"model_type": "llama"}\n')     # not the index's
        return index, [index] + [d / s for s in sorted(set(weight_map.values()))]
    if form == "split":
        files, _ = write_split_gguf(d)
        return files[0], files
    if form == "directory":
        index, _, weight_map = write_hf_shards(d)
        (d / "config.json").write_text('{"model_type": "llama", "hidden_size": 8}\n')
        (d / "tokenizer.json").write_bytes(os.urandom(300_000))
        (d / "generation_config.json").write_text("{}\n")
        (d / ".hidden").write_text("not served\n")
        (d / "sub").mkdir()             # a subfolder: served as files/sub/x.json
        (d / "sub" / "x.json").write_text("in a subfolder\n")
        return d, sorted(p for p in d.iterdir() if p.is_file() and not p.name.startswith("."))
    raise AssertionError(form)


FORMS = ["safetensors", "gguf", "index", "split", "directory"]


@pytest.mark.parametrize("form", FORMS)
def test_files_holds_each_file_as_it_is_on_disk(tmp_path, mount, form):
    given, expected = _model_dir(tmp_path, form)
    mnt = mount(given)
    sub = ["sub"] if form == "directory" else []          # a directory's subfolder
    assert sorted(os.listdir(mnt / "files")) == sorted([p.name for p in expected] + sub)
    if sub:
        assert (mnt / "files" / "sub" / "x.json").read_bytes() == b"in a subfolder\n"
    for local in expected:
        served = mnt / "files" / local.name
        assert subprocess.run(["cmp", str(local), str(served)]).returncode == 0, local.name
        st, mine = os.stat(served), os.stat(local)
        assert (st.st_size, st.st_mtime_ns) == (mine.st_size, mine.st_mtime_ns), local.name
        assert st.st_mode & 0o777 == mine.st_mode & 0o444     # its own, read-only
        assert (st.st_uid, st.st_gid) == (mine.st_uid, mine.st_gid)
    # and the library gives the same list (docs/reference/api.md)
    with tensorfs.open(given) as m:
        assert list(m.files) == sorted([p.name for p in expected] + [f"{s}/x.json" for s in sub])
        for local in expected:
            entry = m.files[local.name]
            assert (entry.size, entry.mtime_ns) == (local.stat().st_size,
                                                    local.stat().st_mtime_ns)
            assert m.read_file(local.name) == local.read_bytes()
            assert m.read_file(local.name, 5, 17) == local.read_bytes()[5:22]


def test_the_reference_readers_read_the_mounted_files_as_the_local_ones(tmp_path, mount):
    given, expected = _model_dir(tmp_path, "directory")
    mnt = mount(given)
    shards = [p for p in expected if p.suffix == ".safetensors"]
    assert shards
    for local in shards:
        with safe_open(str(local), "np") as mine, \
                safe_open(str(mnt / "files" / local.name), "np") as served:
            assert sorted(served.keys()) == sorted(mine.keys())
            assert served.metadata() == mine.metadata()
            for key in mine.keys():
                a, b = served.get_tensor(key), mine.get_tensor(key)
                assert a.dtype == b.dtype and np.array_equal(a, b, equal_nan=True), key

    gguf_given, gguf_files = _model_dir(tmp_path, "split")
    gmnt = mount(gguf_given)
    for local in gguf_files:
        mine, served = GGUFReader(local), GGUFReader(gmnt / "files" / local.name)  # memory maps
        assert [t.name for t in served.tensors] == [t.name for t in mine.tensors]
        for a, b in zip(served.tensors, mine.tensors):
            assert a.tensor_type == b.tensor_type
            assert np.array_equal(np.asarray(a.data), np.asarray(b.data)), a.name
        assert {f.name for f in served.fields.values()} == {f.name for f in mine.fields.values()}


def test_a_tensor_named_files_is_escaped_like_any_reserved_name(tmp_path, mount):
    model = tmp_path / "m.safetensors"
    save_file({"files.x": np.arange(3, dtype=np.float32),
               "y": np.ones(2, dtype=np.int8)}, str(model))
    mnt = mount(model)
    assert os.listdir(mnt / "files") == ["m.safetensors"]
    assert (mnt / "%66iles" / "x").read_bytes() == np.arange(3, dtype=np.float32).tobytes()
    assert np.array_equal(np.load(mnt / "%66iles" / "x.npy"), np.arange(3, dtype=np.float32))


def test_views_files_alone_serves_files_and_no_tensor_tree(tmp_path, mount):
    given, expected = _model_dir(tmp_path, "safetensors")
    mnt = mount(given, "--views", "files")
    assert sorted(os.listdir(mnt)) == ["files", "header.bin", "metadata", "metadata.json"]
    assert (mnt / "files" / "model.safetensors").read_bytes() == given.read_bytes()
    mnt2 = mount(given, "--views", "raw,npy")
    assert not (mnt2 / "files").exists()


def _open_errno(path: Path) -> int | None:
    try:
        with open(path, "rb") as f:
            f.read(1)
    except OSError as error:
        return error.errno
    return None


@pytest.mark.parametrize("change", ["rewritten", "grown"])
def test_a_file_changed_under_the_mount_is_refused_at_open(tmp_path, mount, change):
    given, expected = _model_dir(tmp_path, "directory")
    log = tmp_path / "daemon.log"
    mnt = mount(given, "--log", log)
    shard = next(p for p in expected if p.suffix == ".safetensors")
    config = given / "config.json"
    assert (mnt / "files" / shard.name).read_bytes()[:8] == shard.read_bytes()[:8]
    for local in (shard, config):
        if change == "grown":
            with open(local, "ab") as f:
                f.write(b"more")
        else:
            data = local.read_bytes()
            with open(local, "r+b") as f:           # same size, new bytes, later mtime
                f.write(bytes([data[0] ^ 1]))
            os.utime(local, ns=(local.stat().st_atime_ns, local.stat().st_mtime_ns + 10**9))
        assert _open_errno(mnt / "files" / local.name) == errno.EIO, local.name
    assert "every read of it now fails with EIO" in log.read_text()
    # the other files are still served
    other = next(p for p in expected if p.suffix == ".safetensors" and p != shard)
    assert (mnt / "files" / other.name).read_bytes() == other.read_bytes()


@pytest.mark.parametrize("asked", [False, True])
def test_the_mechanism_serving_local_files_is_logged(tmp_path, mount, asked):
    """Copies by default; passthrough only where asked for (TENSORFS_PASSTHROUGH=1), libfuse
    >= 3.17 and root (this file runs against each libfuse in tests/fuse/test_libfuse_matrix.py);
    splice only when asked for (TENSORFS_FD_REPLIES=1)."""
    given = tmp_path / "big.safetensors"
    save_file({"w": np.arange(2 << 20, dtype=np.float32)}, str(given))        # 8 MiB
    log = tmp_path / "daemon.log"
    mnt = mount(given, "--log", log, env={"TENSORFS_PASSTHROUGH": "1" if asked else None})
    text = log.read_text()
    version = re.search(r"libfuse (\d+)\.(\d+)", text)
    assert version, text
    passthrough = (asked and (int(version[1]), int(version[2])) >= (3, 17)
                   and os.geteuid() == 0)
    pid = int(re.search(r"tensorfs\[(\d+)\]", text)[1])
    before = _bytes_read(pid)
    assert (mnt / "files" / given.name).read_bytes() == given.read_bytes()
    read_by_the_daemon = _bytes_read(pid) - before
    lines = re.findall(r"local files: (\w+)", text)
    assert lines == ["passthrough" if passthrough else "copy"], text
    assert "passthrough refused" not in text
    if passthrough:         # the kernel reads the backing file: the daemon reads none of it
        assert read_by_the_daemon < given.stat().st_size // 8, read_by_the_daemon
    else:                   # the daemon reads every byte it serves (what the check would miss)
        assert read_by_the_daemon >= given.stat().st_size, read_by_the_daemon


def _bytes_read(pid: int) -> int:
    """What ``pid`` has read(2)/pread(2) so far: the model's bytes, and FUSE's requests."""
    with open(f"/proc/{pid}/io") as f:
        return int(next(line for line in f if line.startswith("rchar")).split()[1])


def test_a_copy_of_files_is_a_copy_of_the_model_directory(tmp_path, mount):
    """cp -r of files/ gives back the directory (what from_pretrained reads)."""
    given, expected = _model_dir(tmp_path, "directory")
    mnt = mount(given)
    copy = tmp_path / "copy"
    shutil.copytree(mnt / "files", copy)
    assert sorted(p.name for p in copy.iterdir()) == sorted([p.name for p in expected] + ["sub"])
    for local in expected:
        assert (copy / local.name).read_bytes() == local.read_bytes()
    assert (copy / "sub" / "x.json").read_bytes() == (given / "sub" / "x.json").read_bytes()
