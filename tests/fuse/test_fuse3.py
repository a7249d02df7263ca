"""What the libfuse 3 binding (tensorfs/fuse/) promises, seen through real mounts:
listings that span many readdir pages, attributes given with a listing, `-o` options it
answers itself, the read-ahead window it sets, and errors it refuses with."""

from __future__ import annotations

import io
import json
import os
import subprocess

import numpy as np
import pytest
from safetensors import safe_open
from safetensors.numpy import save_file

from tests.support import run_tensorfs, usage_error
from tests.support.models import write_safetensors


def _many_tensors(path, n: int) -> dict:
    tensors = {f"t{i}.w": np.full((i % 7 + 1,), i, dtype=np.float32) for i in range(n)}
    save_file(tensors, str(path))
    return tensors


def test_a_directory_of_thousands_lists_each_entry_once(tmp_path, mount):
    # 2 x 3000 flat entries: dozens of READDIRPLUS pages, and a listing kept between them.
    path = tmp_path / "many.safetensors"
    _many_tensors(path, 3000)
    mnt = mount(path, "--layout", "flat")
    doc = json.loads((mnt / "metadata.json").read_bytes())
    expected = {"header.bin", "metadata.json", "metadata", "files"}
    for entry in doc["tensors"].values():
        expected |= {entry["path"], entry["path"] + ".npy"}
    listed = subprocess.run(["ls", "-f", "-a", str(mnt)], capture_output=True, text=True,
                            check=True).stdout.split("\n")[:-1]
    assert sorted(listed) == sorted(expected | {".", ".."})


def test_ls_l_sizes_are_the_oracles(tmp_path, mount):
    # Sizes a listing gives unasked (READDIRPLUS) must be the ones stat gives later.
    path = tmp_path / "model.safetensors"
    write_safetensors(path)
    mnt = mount(path)
    doc = json.loads((mnt / "metadata.json").read_bytes())
    with safe_open(str(path), "numpy") as reference:
        for name, entry in doc["tensors"].items():
            array = reference.get_tensor(name)
            saved = io.BytesIO()
            np.save(saved, array)
            raw = mnt / entry["path"]
            with os.scandir(raw.parent) as listing:
                sizes = {e.name: e.stat().st_size for e in listing if e.is_file()}
            assert sizes[raw.name] == array.nbytes
            assert sizes[raw.name + ".npy"] == len(saved.getvalue())


def test_nothreads_serves(tmp_path, mount):
    # Single-threaded, the daemon must never wait on its own mount (it once did, resolving
    # the mount point for its read-ahead setting).
    path = tmp_path / "model.safetensors"
    tensors = write_safetensors(path)
    mnt = mount(path, "-o", "nothreads")
    doc = json.loads((mnt / "metadata.json").read_bytes())
    for name, array in tensors.items():
        out = subprocess.run(["cat", str(mnt / doc["tensors"][name]["path"])], capture_output=True,
                             timeout=20, check=True).stdout
        assert out == array.tobytes()


@pytest.mark.skipif(os.geteuid() != 0, reason="the read-ahead window is set as root only")
def test_the_mount_reads_ahead_one_mib(tmp_path, mount):
    from tensorfs.mount.adapter import READ_AHEAD_KIB
    from tensorfs.runtime import mount_device

    path = tmp_path / "model.safetensors"
    write_safetensors(path)
    mnt = mount(path)
    os.listdir(mnt)                                 # a first request after INIT
    with open(f"/sys/class/bdi/{mount_device(os.path.realpath(mnt))}/read_ahead_kb") as f:
        assert int(f.read()) == READ_AHEAD_KIB == 1024


def test_a_missing_name_stays_missing(tmp_path, mount):
    path = tmp_path / "model.safetensors"
    write_safetensors(path)
    mnt = mount(path)
    for _ in range(2):                              # the second answer is the kernel's cached miss
        with pytest.raises(FileNotFoundError):
            os.stat(mnt / "no-such-tensor")
    with pytest.raises(NotADirectoryError):
        os.listdir(mnt / "metadata.json")


def test_a_mount_option_libfuse_refuses_is_one_line(tmp_path):
    path = tmp_path / "model.safetensors"
    write_safetensors(path)
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    result = run_tensorfs("mount", path, mnt, "-o", "no_such_option")
    # refused before mounting: a usage error
    assert "no_such_option" in usage_error(result)
    assert not os.path.ismount(mnt)


def test_timeouts_and_always_on_options_are_accepted(tmp_path, mount):
    path = tmp_path / "model.safetensors"
    tensors = write_safetensors(path)
    mnt = mount(path, "-o", "attr_timeout=1,entry_timeout=1,negative_timeout=0,kernel_cache,use_ino")
    doc = json.loads((mnt / "metadata.json").read_bytes())
    name, array = next(iter(tensors.items()))
    assert (mnt / doc["tensors"][name]["path"]).read_bytes() == array.tobytes()


def test_every_listing_page_comes_with_attributes(tmp_path, mount):
    # READDIRPLUS_AUTO off (tensorfs.fuse.session.Session._unset_want, a different field per libfuse
    # version): with it on, the kernel asks for the pages after a listing's first without
    # attributes, and `find` then looks up every entry on them.
    path = tmp_path / "many.safetensors"
    _many_tensors(path, 1000)
    log_file = tmp_path / "daemon.log"
    mnt = mount(path, "--layout", "flat", "--debug", "--log", log_file)
    listed = subprocess.run(["ls", "-f", str(mnt)], capture_output=True, text=True, check=True)
    assert len(listed.stdout.split()) == 2 * 1000 + 6     # . .. header.bin metadata.json metadata files
    log_text = log_file.read_text()
    assert "libfuse 3." in log_text
    assert "READDIR without attributes" not in log_text
