"""One owner of ``--edits DIR`` (docs/reference/editing.md "Safety"; issue 35 class 3): a DIR a live
mount uses is refused to a second mount, however its path is spelled, in one line naming the
mount that holds it; a daemon killed with SIGKILL holds nothing."""

from __future__ import annotations

import os
import signal
import subprocess

import numpy as np
import pytest
from safetensors.numpy import save_file

from tests.support import (
    TENSORFS,
    alive,
    fuse_mounts_under,
    mount_expecting_refusal,
    run_tensorfs,
    wait_for,
)
from tests.support.processes import daemon_pid


@pytest.fixture
def model(tmp_path):
    path = tmp_path / "m.safetensors"
    save_file({"a": np.arange(8, dtype=np.float32), "b": np.ones(4, dtype=np.float16)},
              str(path), metadata={"x": "1"})
    return path


def _spellings(tmp_path, edits):
    """The same DIR named other ways: through a link to its parent (DIR itself a link is
    refused anyway), through ``..``, and through a bind mount (root only)."""
    (tmp_path / "link").symlink_to(edits.parent)
    (tmp_path / "sub").mkdir()
    yield "a link", tmp_path / "link" / edits.name
    yield "..", tmp_path / "sub" / ".." / edits.name
    if os.geteuid() == 0:
        bound = tmp_path / "bound"
        bound.mkdir(mode=0o700)
        if subprocess.run(["mount", "--bind", edits, bound], capture_output=True).returncode == 0:
            yield "a bind mount", bound


def test_a_second_mount_of_a_dir_in_use_is_refused_however_it_is_spelled(tmp_path, model, mount):
    edits = tmp_path / "edits"
    first = mount(model, "--edits", edits)
    (first / "metadata" / "x").write_text("2")
    pid = daemon_pid(first)
    bound = tmp_path / "bound"
    try:
        for how, spelled in _spellings(tmp_path, edits):
            other = tmp_path / f"other-{how.replace(' ', '-')}"
            other.mkdir()
            result, mounted = mount_expecting_refusal(model, other, "--edits", spelled)
            assert result.returncode == 1 and not mounted, (how, result.stderr)
            assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr, how
            line = result.stderr
            assert line.startswith("tensorfs: error: ") and ": refused as the edits directory: " \
                "in use by the mount at " in line, (how, line)
            assert f"the mount at {first.resolve()} (pid {pid})" in line, (how, line)
    finally:
        if any(line.split()[4] == str(bound) for line in open("/proc/self/mountinfo")):
            subprocess.run(["umount", bound], check=True)
    # the first mount's edits are whole: nothing was loaded, nothing rewritten
    assert (first / "metadata" / "x").read_text().strip() == "2"


def test_a_killed_daemon_holds_nothing(tmp_path, model, mount):
    edits = tmp_path / "edits"
    mnt = tmp_path / "killed"
    mnt.mkdir()
    assert run_tensorfs("mount", model, mnt, "--edits", edits).returncode == 0
    (mnt / "metadata" / "x").write_text("3")
    pid = daemon_pid(mnt)
    os.kill(pid, signal.SIGKILL)
    assert wait_for(lambda: not alive(pid), 30)
    subprocess.run(["fusermount", "-uz", mnt], capture_output=True)
    assert fuse_mounts_under(mnt) == []
    again = mount(model, "--edits", edits)
    assert (again / "metadata" / "x").read_text().strip() == "3"
    # ... and the new daemon is the one named now
    other = tmp_path / "other"
    other.mkdir()
    result, mounted = mount_expecting_refusal(model, other, "--edits", edits)
    assert result.returncode == 1 and not mounted
    assert f"the mount at {again.resolve()} (pid {daemon_pid(again)})" in result.stderr


def test_a_foreground_mount_holds_the_dir_too(tmp_path, model):
    edits = tmp_path / "edits"
    mnt = tmp_path / "fg"
    mnt.mkdir()
    proc = subprocess.Popen([*TENSORFS, "mount", "--foreground", model, mnt, "--edits", edits],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            stdin=subprocess.DEVNULL)
    try:
        assert wait_for(lambda: fuse_mounts_under(mnt) != [] and (mnt / "metadata").exists(), 60)
        other = tmp_path / "other"
        other.mkdir()
        result, mounted = mount_expecting_refusal(model, other, "--edits", edits)
        assert result.returncode == 1 and not mounted
        assert f"the mount at {mnt.resolve()} (pid {proc.pid})" in result.stderr
    finally:
        run_tensorfs("unmount", mnt)
        proc.wait(timeout=60)
