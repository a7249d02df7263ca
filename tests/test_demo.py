"""`make demo` (examples/demo.sh) runs with what a minimal Debian has, and prints each command
exactly as it can be pasted into a shell: a build directory whose name needs quoting must
come back as one word."""

from __future__ import annotations

import shlex
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_the_demo_prints_commands_a_shell_reads_back(tmp_path):
    build = tmp_path / "it's a build"
    result = subprocess.run(["bash", "examples/demo.sh", str(Path(sys.executable).parent), str(build)],
                            cwd=ROOT, capture_output=True, text=True, timeout=300,
                            stdin=subprocess.DEVNULL)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    commands = [shlex.split(line[2:]) for line in result.stdout.splitlines() if line.startswith("$ ")]
    assert [c[:2] for c in commands[:2]] == [["tensorfs", "inspect"], ["tensorfs", "mount"]]
    assert commands[0][2] == str(build / "sample.gguf")
    assert commands[1][2:] == [str(build / "sample.gguf"), str(build / "mnt")]
    python = [c for c in commands if c[0] == "python"]
    assert len(python) == 2 and all(len(c) == 3 and c[1] == "-c" for c in python)
    assert "xxd" not in {c[0] for c in commands}          # not in a minimal Debian
    assert commands[-1] == ["tensorfs", "unmount", str(build / "mnt")]
