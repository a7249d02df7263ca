"""MOUNTPOINT = /dev/fd/N, as libfuse (3.3 on) takes it: a privileged mounter opens
/dev/fuse, mounts the descriptor with mount(2) and hands it to tensorfs, which serves it
without mounting anything itself (containers: docs/containers.md).  The test plays the
mounter: it opens /dev/fuse and calls mount(2) itself."""

from __future__ import annotations

import ctypes
import json
import os
import subprocess

import pytest

from tests.support import TENSORFS, alive, run_tensorfs, wait_for
from tests.models import write_safetensors

MS_NOSUID, MS_NODEV = 2, 4
libc = ctypes.CDLL(None, use_errno=True)

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or not os.path.exists("/dev/fuse"),
                                reason="mount(2) of a FUSE descriptor needs root and /dev/fuse")


def _mount_descriptor(directory) -> int:
    """What a privileged mounter does: /dev/fuse opened, mounted at ``directory``."""
    fd = os.open("/dev/fuse", os.O_RDWR)
    data = f"fd={fd},rootmode=40000,user_id={os.geteuid()},group_id={os.getegid()}"
    if libc.mount(b"tensorfs", os.fsencode(directory), b"fuse.tensorfs",
                  MS_NOSUID | MS_NODEV, data.encode()) != 0:
        err = ctypes.get_errno()
        os.close(fd)
        pytest.skip(f"mount(2) of a FUSE descriptor: {os.strerror(err)}")
    return fd


def _unmount(directory) -> None:
    libc.umount2(os.fsencode(directory), 2)           # MNT_DETACH: never hangs the test


def test_a_descriptor_mounted_by_another_process_is_served(tmp_path):
    from safetensors.numpy import load_file

    model = tmp_path / "m.safetensors"
    write_safetensors(model)
    directory = tmp_path / "mnt"
    directory.mkdir()
    fd = _mount_descriptor(directory)
    mountpoint = f"/dev/fd/{fd}"
    try:
        result = subprocess.run([*TENSORFS, "mount", str(model), mountpoint], pass_fds=(fd,),
                                capture_output=True, text=True, timeout=120,
                                stdin=subprocess.DEVNULL)
        os.close(fd)                                   # the daemon holds its own copy
        fd = -1
        assert result.returncode == 0, result.stderr
        expected = load_file(str(model))
        for name, array in expected.items():
            path = directory / (name.replace(".", "/"))
            assert path.read_bytes() == array.tobytes(), name
        listed = json.loads(run_tensorfs("list", "--json").stdout)
        row = next(r for r in listed if r["mountpoint"] == mountpoint)
        assert row["state"] == "serving" and row["source"] == str(model)
        pid = row["pid"]
        assert alive(pid)
    finally:
        if fd >= 0:
            os.close(fd)
        _unmount(directory)
    # the mounter unmounts: the daemon's session ends, and it exits and cleans up
    assert wait_for(lambda: not alive(pid), 30)
    assert all(r["mountpoint"] != mountpoint
               for r in json.loads(run_tensorfs("list", "--json").stdout))


def test_a_descriptor_that_is_not_dev_fuse_is_refused(tmp_path):
    model = tmp_path / "m.safetensors"
    write_safetensors(model)
    with open(model, "rb") as f:
        fd = f.fileno()
        result = subprocess.run([*TENSORFS, "mount", str(model), f"/dev/fd/{fd}"],
                                pass_fds=(fd,), capture_output=True, text=True,
                                timeout=60, stdin=subprocess.DEVNULL)
    assert result.returncode == 1
    assert result.stderr.startswith(f"tensorfs: error: /dev/fd/{fd}: descriptor")
    assert "is not /dev/fuse" in result.stderr and result.stderr.count("\n") == 1
    closed = run_tensorfs("mount", model, "/dev/fd/97")
    assert closed.returncode == 1 and "descriptor 97 is not open" in closed.stderr
