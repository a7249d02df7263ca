"""MOUNTPOINT = /dev/fd/N, as libfuse (3.3 on) takes it: a privileged mounter opens
/dev/fuse, mounts the descriptor with mount(2) and hands it to tensorfs, which serves it
without mounting anything itself (containers: docs/guide/containers.md).  The test plays the
mounter: it opens /dev/fuse and calls mount(2) itself."""

from __future__ import annotations

import ctypes
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from tests.support import TENSORFS, alive, run_tensorfs, wait_for
from tests.support.models import write_safetensors
from tests.support.users import needs_users

ROOT = Path(__file__).resolve().parents[2]

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
        refused = run_tensorfs("unmount", mountpoint)
        assert refused.returncode == 1 and f"served by daemon {pid}" in refused.stderr
        assert "umount DIR" in refused.stderr and alive(pid)
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


@pytest.mark.skipif(not shutil.which("mount.fuse3"), reason="needs mount.fuse3 (fuse3)")
def test_mount_fuse3_drop_privileges_runs_tensorfs_without_capabilities(tmp_path):
    """libfuse's own mounter: mount.fuse3 opens /dev/fuse, mounts it, drops every capability
    and runs ``tensorfs MODEL /dev/fd/N -o …`` (the fuse(8) convention)."""
    from safetensors.numpy import load_file

    model = tmp_path / "m.safetensors"
    write_safetensors(model)
    directory = tmp_path / "mnt"
    directory.mkdir()
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    wrapper = bin_dir / "tensorfs"          # the suite's tensorfs, as mount.fuse3 finds it
    wrapper.write_text("#!/bin/sh\nexec " + " ".join(map(shlex.quote, TENSORFS)) + ' "$@"\n')
    wrapper.chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    result = subprocess.run(["mount.fuse3", f"tensorfs#{model}", str(directory), "-o",
                             "ro,nosuid,nodev,drop_privileges"], env=env, capture_output=True,
                            text=True, timeout=120, stdin=subprocess.DEVNULL)
    try:
        assert result.returncode == 0, result.stderr
        row = next(r for r in json.loads(run_tensorfs("list", "--json").stdout)
                   if r["mountpoint"].startswith("/dev/fd/") and r["source"] == str(model))
        with open(f"/proc/{row['pid']}/status") as f:
            caps = dict(line.split(":\t") for line in f if line.startswith("Cap"))
        assert int(caps["CapEff"], 16) == 0 and int(caps["CapBnd"], 16) == 0, caps
        tensors = load_file(str(model))
        assert (directory / "lm_head" / "weight").read_bytes() == \
            tensors["lm_head.weight"].tobytes()
    finally:
        unmounted = run_tensorfs("unmount", directory)
    assert unmounted.returncode == 0, unmounted.stderr
    assert wait_for(lambda: not alive(row["pid"]), 30)


def _processes_of(uid: int, word: str) -> list[int]:
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if os.stat(f"/proc/{pid}").st_uid != uid:
                continue
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if word.encode() in f.read():
                    found.append(int(pid))
        except OSError:
            continue
    return found


@needs_users
def test_a_privileged_mounter_passes_the_descriptor_to_an_unprivileged_user(users, tmp_path):
    """examples/fdpass.py, the pattern of docs/guide/containers.md: root mounts and sends the
    descriptor over a unix socket; a real non-root user receives it and runs tensorfs."""
    from safetensors.numpy import load_file

    user, _ = users
    shared = Path(tempfile.mkdtemp(prefix="tensorfs-fdpass-"))
    shared.chmod(0o755)
    model = shared / "m.safetensors"
    write_safetensors(model)
    model.chmod(0o644)
    directory = shared / "mnt"
    directory.mkdir()
    sock = shared / "fuse.sock"
    example = ROOT / "examples" / "fdpass.py"
    mounter = subprocess.Popen([sys.executable, str(example), "mount", str(directory),
                                str(sock), str(user.uid)], stdout=subprocess.PIPE, text=True)
    try:
        assert mounter.stdout.readline().strip() == "listening"
        served = user.run(sys.executable, example, "serve", sock, "--", *TENSORFS, "mount", model,
                          env={"PYTHONPATH": str(ROOT)})      # this checkout's tensorfs
        assert served.returncode == 0, served.stderr
        daemons = _processes_of(user.uid, "/dev/fd/")
        assert daemons, "no daemon of the user's"
        tensors = load_file(str(model))
        for name, array in tensors.items():
            assert (directory / name.replace(".", "/")).read_bytes() == array.tobytes(), name
    finally:
        mounter.terminate()                 # the mounter unmounts: the daemon's session ends
        mounter.wait(30)
        libc.umount2(os.fsencode(directory), 2)
    assert wait_for(lambda: not _processes_of(user.uid, "/dev/fd/"), 30)
    shutil.rmtree(shared, ignore_errors=True)
    shutil.rmtree(f"/tmp/tensorfs-{user.uid}", ignore_errors=True)


def test_two_mounts_served_through_the_same_descriptor_number_are_both_listed(tmp_path):
    """Two daemons each given ``/dev/fd/9`` (each its own /dev/fuse, mounted by the test as a
    mounter would): their runtime files do not share a name, ``list`` shows both, and each
    one's files go when it stops, not the other's (issue 35 class 9)."""
    model = tmp_path / "m.safetensors"
    write_safetensors(model)
    directories, pids = [], []
    try:
        for k in range(2):
            directory = tmp_path / f"mnt{k}"
            directory.mkdir()
            fd = _mount_descriptor(directory)
            directories.append(directory)
            # the descriptor as number 9 in the command, as fdpass.py hands it over
            result = subprocess.run(["bash", "-c", 'exec "$@" 9<&' + str(fd), "bash", *TENSORFS,
                                     "mount", str(model), "/dev/fd/9"], pass_fds=(fd,),
                                    capture_output=True, text=True, timeout=120,
                                    stdin=subprocess.DEVNULL)
            os.close(fd)
            assert result.returncode == 0, result.stderr
            assert (directory / "lm_head" / "weight").exists()
        rows = [r for r in json.loads(run_tensorfs("list", "--json").stdout)
                if r["mountpoint"] == "/dev/fd/9"]
        assert len(rows) == 2, rows
        pids = [r["pid"] for r in rows]
        assert len(set(pids)) == 2 and all(alive(p) for p in pids)
        assert all(r["state"] == "serving" and r["source"] == str(model) for r in rows), rows
        _unmount(directories.pop(0))
        assert wait_for(lambda: sum(alive(p) for p in pids) == 1, 30)
        rows = [r for r in json.loads(run_tensorfs("list", "--json").stdout)
                if r["mountpoint"] == "/dev/fd/9"]
        assert [r["state"] for r in rows] == ["serving"] and alive(rows[0]["pid"]), rows
    finally:
        for directory in directories:
            _unmount(directory)
    assert wait_for(lambda: not any(alive(p) for p in pids), 30)
