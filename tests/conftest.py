"""Shared fixtures: run the real ``tensorfs`` command and mount for real."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

# The suite's own runtime directory (pid files, status files, default logs): not the user's
# /run/tensorfs, where a few hundred test mounts' logs would pile up.  Set before any test
# runs, so the tests' own lookups (tensorfs.runtime.pid_file) and every tensorfs they start
# agree on it.
# This file is imported twice, as pytest's conftest and as tests.conftest (the tests import
# helpers from it): the second import finds this process's directory instead of making (and
# leaking) another.  Tagged with the pid: a pytest started by a test makes its own.
_pid, _, _made = os.environ.get("TENSORFS_TEST_RUNTIME_DIR", "").partition(":")
if _pid == str(os.getpid()) and os.path.isdir(_made):
    RUNTIME_DIR = _made
else:
    RUNTIME_DIR = tempfile.mkdtemp(prefix="tensorfs-test-run-")
    os.environ["TENSORFS_TEST_RUNTIME_DIR"] = f"{os.getpid()}:{RUNTIME_DIR}"
os.environ["XDG_RUNTIME_DIR"] = RUNTIME_DIR


def pytest_unconfigure(config):
    shutil.rmtree(RUNTIME_DIR, ignore_errors=True)


_SCRIPT = Path(sys.executable).with_name("tensorfs")
TENSORFS = [str(_SCRIPT)] if _SCRIPT.exists() else [sys.executable, "-m", "tensorfs"]


def run_tensorfs(*args, timeout: float = 120, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run([*TENSORFS, *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, stdin=subprocess.DEVNULL, **kwargs)


def fuse_mounts_under(path: Path) -> list[str]:
    real = os.path.realpath(path)
    found = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            fields = line.split()
            if fields[4].startswith(real) and " - fuse" in line:
                found.append(fields[4])
    return found


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


@pytest.fixture
def mount(tmp_path):
    """mount(model, *options) -> mount point; everything mounted is unmounted afterwards."""
    yield from mounts_in(tmp_path)
    assert fuse_mounts_under(tmp_path) == []
