"""The binding (tensorfs/fuse/) against each libfuse 3 that users run, not only the one
installed: upstream 3.10.5 (Ubuntu 22.04), 3.17.2 (Debian 13; the first libfuse3.so.4) and
3.18.2 (Ubuntu 26.04, Fedora 44), built from the tarballs in ../shared/libfuse/ with its
build.sh (cached under build/libfuse/), and a directory holding nothing but a libfuse3.so.4.

For each: one mount through the real CLI with LD_LIBRARY_PATH, where /proc/PID/maps of the
daemon must name the intended library and its log the version; then the binding's mount tests
(listings, reads, xattrs, options, readiness, shutdown) re-run in a subprocess against it."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save_file

from tests.support import run_tensorfs
from tests.support.libfuse import ROOT, SOURCES

pytestmark = pytest.mark.slow     # every test here runs for seconds

BUILD = ROOT / "build" / "libfuse"

# (name, version built, file the daemon must map)
CASES = [("3.10.5", "3.10.5", "3.10.5/libfuse3.so.3.10.5"),
         ("3.17.2", "3.17.2", "3.17.2/libfuse3.so.3.17.2"),
         ("3.18.2", "3.18.2", "3.18.2/libfuse3.so.3.18.2"),
         ("so4-only", "3.17.2", "so4-only/libfuse3.so.4")]

# The focused subset: every callback the binding has, every allowed -o option (an option
# one libfuse refuses must not pass the allow-list: atime did, on 3.17), its ending.
SUBSET = ["tests/fuse/test_fuse3.py", "tests/mount/test_xattrs.py",
          "tests/fuse/test_mountoptions.py", "tests/loading/test_files.py",
          "tests/loading/test_files_trust.py::test_an_open_file_changed_under_it_reads_eio",
          "tests/fuse/test_mount_readiness.py::test_max_read_mounts_and_serves_the_oracles_bytes",
          "tests/cli/test_shutdown.py::test_signal_to_the_daemon_with_readers_active",
          "tests/cli/test_shutdown.py::test_unmount_waits_for_readers_to_be_answered"]


def _build(version: str) -> Path:
    if not (SOURCES / "build.sh").exists():
        pytest.skip(f"no libfuse sources at {SOURCES} (../shared/libfuse/ beside the clone)")
    for tool in ("cc", "meson", "ninja"):
        if not shutil.which(tool, path=f"{Path(sys.executable).parent}:{os.environ['PATH']}"):
            pytest.skip(f"{tool} not found: `make test` installs it")
    dest = BUILD / version
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}:{os.environ['PATH']}")
    subprocess.run(["bash", str(SOURCES / "build.sh"), version, str(dest)], check=True, env=env,
                   capture_output=True, timeout=600)
    return dest


def _library_dir(name: str, version: str) -> Path:
    built = _build(version)
    if name != "so4-only":
        return built
    only = BUILD / "so4-only"             # a copy, so that the daemon's maps name this file
    only.mkdir(parents=True, exist_ok=True)
    target = only / "libfuse3.so.4"
    if not target.exists():
        shutil.copyfile(built / f"libfuse3.so.{version}", target)
    return only


@pytest.mark.parametrize("name,version,mapped", CASES, ids=[c[0] for c in CASES])
def test_the_binding_on_each_libfuse(tmp_path, name, version, mapped):
    libdir = _library_dir(name, version)
    env = dict(os.environ, LD_LIBRARY_PATH=str(libdir))
    model = tmp_path / "model.safetensors"
    array = np.arange(1 << 18, dtype=np.float32)
    save_file({"a.b": array}, str(model))
    mnt, log = tmp_path / "mnt", tmp_path / "daemon.log"
    mnt.mkdir()
    result = run_tensorfs("mount", model, mnt, "--log", log, env=env)
    assert result.returncode == 0, result.stderr
    try:
        listed = json.loads(run_tensorfs("list", "--json", env=env).stdout)
        pid = next(row["pid"] for row in listed if row["mountpoint"] == str(mnt.resolve()))
        with open(f"/proc/{pid}/maps") as f:
            libraries = {os.path.realpath(line.split()[-1]) for line in f if "libfuse3.so" in line}
        assert libraries == {os.path.realpath(BUILD / mapped)}
        assert (mnt / "a" / "b").read_bytes() == array.tobytes()
        assert f"libfuse {version} ({os.path.realpath(BUILD / mapped)})" in log.read_text()
    finally:
        assert run_tensorfs("unmount", mnt, env=env).returncode == 0

    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                          "-W", "ignore::pytest.PytestWarning", *SUBSET],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
