"""Names reach the terminal escaped on every path, the warnings printed before a daemon's
log exists included (the audit's instance of "every name passes one rule" for output: a
directory name carrying ESC reached stderr raw through logging's last-resort handler)."""

from __future__ import annotations

import subprocess

from tests.support import fuse_mounts_under, run_tensorfs
from tests.support.models import write_safetensors


def test_a_warning_before_the_log_exists_escapes_the_names_it_quotes(tmp_path):
    from tensorfs.loading.wholefiles import MAX_COMPANIONS

    directory = tmp_path / "model\x1b[31m\u202edir"
    directory.mkdir()
    write_safetensors(directory / "model.safetensors")
    for i in range(MAX_COMPANIONS + 1):         # past the bound: a warning naming the directory
        (directory / f"f{i}.txt").touch()
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    for args in (["inspect", directory], ["mount", directory, mnt]):
        result = run_tensorfs(*args)
        try:
            assert result.returncode == 0, result.stderr
            assert "files/ serves the first" in result.stderr, result.stderr
            assert "\x1b" not in result.stderr and "\u202e" not in result.stderr, result.stderr
            assert "model\\x1b[31m\\u202edir" in result.stderr, result.stderr
        finally:
            if args[0] == "mount":
                subprocess.run(["fusermount3", "-uz", mnt], capture_output=True, check=False)
    assert fuse_mounts_under(tmp_path) == []
