"""Resources bounded by the process's limits (the audit's instances beyond the review's): a
descriptor limit reached anywhere, before the fork included, is one line naming the limit
and the remedy, never ``internal error: OSError: [Errno 24]``."""

from __future__ import annotations

import os
import resource
import subprocess

import pytest

from tests.support import fuse_mounts_under, run_tensorfs
from tests.support.models import write_safetensors


def _limited(n: int):
    def set_limit():
        resource.setrlimit(resource.RLIMIT_NOFILE, (n, n))
    return set_limit


@pytest.mark.parametrize("limit", range(6, 15))
def test_a_descriptor_limit_anywhere_in_mount_is_one_line(tmp_path, limit):
    """[found by the audit: under `ulimit -n 8` the mount said `internal error: OSError:
    [Errno 24] Too many open files` (the readiness pipes before the fork)]  Each limit
    from 6 up stops the mount at another step, or lets it mount."""
    model = tmp_path / "model.safetensors"
    write_safetensors(model)
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    result = run_tensorfs("mount", model, mnt, preexec_fn=_limited(limit))
    try:
        if result.returncode == 0:
            return
        lines = result.stderr.splitlines()
        assert result.returncode == 1 and len(lines) == 1, result.stderr
        assert "internal error" not in lines[0] and "Errno" not in lines[0], lines[0]
        assert "Too many open files" in lines[0] or "too many open files" in lines[0], lines[0]
    finally:
        subprocess.run(["fusermount3", "-uz", mnt], capture_output=True, check=False)
        assert fuse_mounts_under(tmp_path) == []


def test_the_line_names_the_limit_and_the_way_out(tmp_path):
    model = tmp_path / "model.safetensors"
    write_safetensors(model)
    (tmp_path / "mnt").mkdir()
    result = run_tensorfs("mount", model, tmp_path / "mnt", preexec_fn=_limited(8))
    if result.returncode == 0:
        subprocess.run(["fusermount3", "-uz", tmp_path / "mnt"], capture_output=True, check=False)
        pytest.skip("this build of the mount needs fewer than 8 descriptors")
    assert result.stderr.splitlines() == [(
        "tensorfs: error: too many open files: the limit of this process is 8 (ulimit -n); "
        "raise it, e.g. ulimit -n 4096")], result.stderr


def test_listing_a_directory_places_only_that_directory(tmp_path, mount):
    """[found by the audit: READDIR of a directory counted each subdirectory's
    subdirectories for its link count, which placed every tensor below it in one request:
    the first `ls -f` of `layer/` of a 300k-tensor model took 4.5-12 s, holding the lock
    every other first lookup waits on]  A listing places the listed directory only; a
    subdirectory's entries are placed by its own LOOKUP (or listing)."""
    import numpy as np
    from safetensors.numpy import save_file

    tensors = {f"layer.{i}.{w}": np.full(2, i, np.float32) for i in range(50) for w in "abcd"}
    model = tmp_path / "layers.safetensors"
    save_file(tensors, model)
    log = tmp_path / "daemon.log"
    mnt = mount(model, "--debug", "--log", log)
    names = sorted(os.listdir(mnt / "layer"))
    assert names == sorted(str(i) for i in range(50)) + [], names[:5]
    placed = [line for line in log.read_text().splitlines() if "entries placed" in line]
    assert len(placed) <= 3, (len(placed), placed[:5])      # the root and layer/
    # and a subdirectory's own lookup still counts it right
    assert os.stat(mnt / "layer" / "7").st_nlink == 2
    assert sorted(os.listdir(mnt / "layer" / "7")) == sorted(
        [w for w in "abcd"] + [f"{w}.npy" for w in "abcd"])
    assert os.stat(mnt / "layer").st_nlink == 52
