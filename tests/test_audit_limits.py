"""Resources bounded by the process's limits (the audit's instances beyond the review's): a
descriptor limit reached anywhere, before the fork included, is one line naming the limit
and the remedy, never ``internal error: OSError: [Errno 24]``."""

from __future__ import annotations

import resource
import subprocess

import pytest

from tests.models import write_safetensors
from tests.support import fuse_mounts_under, run_tensorfs


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
        subprocess.run(["fusermount3", "-uz", mnt], capture_output=True)
        assert fuse_mounts_under(tmp_path) == []


def test_the_line_names_the_limit_and_the_way_out(tmp_path):
    model = tmp_path / "model.safetensors"
    write_safetensors(model)
    (tmp_path / "mnt").mkdir()
    result = run_tensorfs("mount", model, tmp_path / "mnt", preexec_fn=_limited(8))
    if result.returncode == 0:
        subprocess.run(["fusermount3", "-uz", tmp_path / "mnt"], capture_output=True)
        pytest.skip("this build of the mount needs fewer than 8 descriptors")
    assert result.stderr.splitlines() == [
        "tensorfs: error: too many open files: the limit of this process is 8 (ulimit -n); "
        "raise it, e.g. ulimit -n 4096"], result.stderr
