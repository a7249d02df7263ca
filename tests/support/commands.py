"""The real ``tensorfs`` command, run against the suite's own runtime directory."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

# The suite's own runtime directory (pid files, status files, default logs): not the user's
# /run/tensorfs, where a few hundred test mounts' logs would pile up.  Set on import, before
# any test runs, so the tests' own lookups (tensorfs.runtime.pid_file) and every tensorfs
# they start agree on it.  Tagged with the pid: a pytest started by a test (the libfuse
# matrix) makes its own; tests/conftest.py removes it when the session ends.
_pid, _, _made = os.environ.get("TENSORFS_TEST_RUNTIME_DIR", "").partition(":")
if _pid == str(os.getpid()) and os.path.isdir(_made):
    RUNTIME_DIR = _made
else:
    RUNTIME_DIR = tempfile.mkdtemp(prefix="tensorfs-test-run-")
    os.environ["TENSORFS_TEST_RUNTIME_DIR"] = f"{os.getpid()}:{RUNTIME_DIR}"
os.environ["XDG_RUNTIME_DIR"] = RUNTIME_DIR

_SCRIPT = Path(sys.executable).with_name("tensorfs")
TENSORFS = [str(_SCRIPT)] if _SCRIPT.exists() else [sys.executable, "-m", "tensorfs"]


def usage_error(result) -> str:
    """The error line of a usage error: exit 2, the command's usage line, then the one error
    line (nothing else, no traceback)."""
    assert result.returncode == 2, (result.returncode, result.stderr)
    lines = result.stderr.splitlines()
    assert len(lines) == 2, result.stderr
    assert lines[0].startswith("usage: tensorfs") and lines[1].startswith("tensorfs: error: "), lines
    assert "Traceback" not in result.stderr
    return lines[1]


def run_tensorfs(*args, timeout: float = 120, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run([*TENSORFS, *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, stdin=subprocess.DEVNULL, **kwargs)
