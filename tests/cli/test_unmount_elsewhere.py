"""``tensorfs unmount`` returns once the daemon has exited, also from a shell whose
XDG_RUNTIME_DIR is not the mount's (issue 35 class 13; docs/reference/cli.md "unmount"): the daemon
is found from the mount itself (its root's ``user.tensorfs.pid``), not only from the
runtime files."""

from __future__ import annotations

import errno
import os
import subprocess

import pytest

from tests.support import TENSORFS, alive, daemon_pid, fuse_mounts_under, wait_for
from tests.support.models import write_safetensors


def _private(path):
    path.mkdir(mode=0o700)
    return path


def _fill(fifo) -> None:
    """Fill the pipe behind ``fifo`` to the brim: the daemon's next log line (the one it
    writes once unmounted) waits until someone reads, so its exit takes as long as the test
    wants, and an unmount that does not wait for it is seen."""
    fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
    try:
        while True:
            os.write(fd, b"x" * 4096)
    except BlockingIOError:
        pass
    finally:
        os.close(fd)


def test_unmount_from_a_shell_with_another_runtime_dir_waits_for_the_daemon(tmp_path):
    model = tmp_path / "m.safetensors"
    write_safetensors(model)
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    fifo = tmp_path / "log.fifo"
    os.mkfifo(fifo, 0o600)
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
    mounted_from = {**os.environ, "XDG_RUNTIME_DIR": str(_private(tmp_path / "run-a"))}
    elsewhere = {**os.environ, "XDG_RUNTIME_DIR": str(_private(tmp_path / "run-b")),
                 "TENSORFS_UNMOUNT_WAIT_S": "1"}
    pid = None
    try:
        result = subprocess.run([*TENSORFS, "mount", model, mnt, "--log", fifo],
                                env=mounted_from, capture_output=True, text=True, timeout=120)
        assert result.returncode == 0, result.stderr
        pid = int(next((tmp_path / "run-a" / "tensorfs").glob("*.pid")).read_text())
        (mnt / "lm_head" / "weight").read_bytes()
        _fill(fifo)
        result = subprocess.run([*TENSORFS, "unmount", mnt], env=elsewhere,
                                capture_output=True, text=True, timeout=120)
        assert result.returncode == 0, result.stderr
        assert not alive(pid), "unmount returned while the daemon still ran"
        # it waited, then ended the daemon stuck on its log, and said so naming its pid
        assert f"the daemon (pid {pid}) did not exit within 1 s" in result.stderr
        assert fuse_mounts_under(mnt) == []
    finally:
        os.close(reader)                # a daemon still writing gets EPIPE and goes
        if fuse_mounts_under(mnt):
            subprocess.run(["fusermount", "-uz", mnt], capture_output=True)
        if pid is not None:
            wait_for(lambda: not alive(pid), 30)


def test_the_root_of_a_mount_names_its_daemon(tmp_path, mount):
    model = tmp_path / "m.safetensors"
    write_safetensors(model)
    mnt = mount(model)
    assert int(os.getxattr(mnt, "user.tensorfs.pid")) == daemon_pid(mnt)
    assert os.listxattr(mnt) == []                  # asked for, never listed
    with pytest.raises(OSError) as caught:
        os.getxattr(mnt / "lm_head", "user.tensorfs.pid")
    assert caught.value.errno == errno.ENODATA
