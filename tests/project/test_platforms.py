"""Only Linux is served (README): on any other system, or a Linux machine without a known
`struct stat` layout, `tensorfs mount` is one error line and nothing is mounted.  The
system is pretended by replacing `platform.system`/`machine` before tensorfs is imported."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.support import fuse_mounts_under
from tests.support.models import write_safetensors

PRETEND = ("import platform, sys; platform.system = lambda: {system!r}; "
           "platform.machine = lambda: {machine!r}; "
           "from tensorfs.cli.main import main; sys.exit(main())")


@pytest.mark.parametrize("system,machine,said", [
    ("Darwin", "arm64", "Linux only (Darwin here)"),
    ("FreeBSD", "amd64", "Linux only (FreeBSD here)"),
    ("Linux", "riscv64", "no struct stat layout for riscv64"),
])
@pytest.mark.parametrize("foreground", [False, True])
def test_another_system_is_one_line(tmp_path, system, machine, said, foreground):
    path = tmp_path / "model.safetensors"
    write_safetensors(path)
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    command = [sys.executable, "-c", PRETEND.format(system=system, machine=machine),
               "mount", str(path), str(mnt), *(["--foreground"] if foreground else [])]
    result = subprocess.run(command, capture_output=True, text=True, timeout=60,
                            stdin=subprocess.DEVNULL)
    assert result.returncode == 1
    last = result.stderr.splitlines()[-1]
    assert last.startswith("tensorfs: error: ") and said in last
    assert "Traceback" not in result.stderr
    if not foreground:
        assert result.stderr.count("\n") == 1
    assert fuse_mounts_under(tmp_path) == []
