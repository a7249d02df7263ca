"""Mounting for real, and seeing what is mounted."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from tests.support.commands import run_tensorfs


def fuse_mounts_under(path: Path) -> list[str]:
    real = os.path.realpath(path)
    found = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            fields = line.split()
            if fields[4].startswith(real) and " - fuse" in line:
                found.append(fields[4])
    return found


def mount_expecting_refusal(model, mountpoint: Path, *options, **kwargs):
    """``tensorfs mount MODEL MOUNTPOINT OPTIONS`` where the test expects a refusal:
    (the command's result, whether anything got mounted).  Whatever got mounted all the same
    is unmounted before returning, so that a test failing on it leaves no live mount."""
    result = run_tensorfs("mount", model, mountpoint, *options, **kwargs)
    mounted = fuse_mounts_under(mountpoint) != []
    if mounted:
        run_tensorfs("unmount", mountpoint)
    return result, mounted


def mounts_in(directory: Path, prefix: str = "mnt", base_env: dict | None = None):
    """A generator for a fixture: yields mount(model, *options, env=None, name=None) ->
    mount point under ``directory``, mounted by the real command (``base_env`` updated by
    ``env``, a None value removing a variable); after the test, everything it mounted is
    unmounted with the real command too, and a failed unmount fails the test."""
    mounted: list[Path] = []

    def _mount(model, *options, env: dict | None = None, name: str | None = None) -> Path:
        mnt = directory / (name or f"{prefix}{len(mounted)}")
        mnt.mkdir()
        full = None
        if base_env is not None or env is not None:
            full = {k: v for k, v in {**(os.environ if base_env is None else base_env),
                                      **(env or {})}.items() if v is not None}
        result = run_tensorfs("mount", model, mnt, *options, env=full)
        assert result.returncode == 0, result.stderr
        assert result.stderr == ""
        mounted.append(mnt)
        return mnt

    yield _mount
    for mnt in mounted:
        result = run_tensorfs("unmount", mnt, env=base_env)
        if result.returncode != 0 and fuse_mounts_under(mnt):
            subprocess.run(["fusermount", "-uz", str(mnt)], capture_output=True)
            pytest.fail(f"unmount of {mnt} failed: {result.stderr}")
    assert [m for m in mounted if fuse_mounts_under(m)] == []


def shared_directory(prefix: str = "tensorfs-shared-"):
    """A generator for a fixture (``shared_dir``): a new directory every user can enter and
    read (pytest's tmp_path is root's 0700), for tests that run commands as the second
    users; afterwards whatever is still mounted below it is detached and it is removed."""
    path = Path(tempfile.mkdtemp(prefix=prefix))
    path.chmod(0o755)
    yield path
    for mnt in fuse_mounts_under(path):
        subprocess.run(["fusermount", "-uz", mnt], capture_output=True, check=False)
    shutil.rmtree(path, ignore_errors=True)
