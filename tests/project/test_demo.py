"""`make demo` (examples/demo.sh) runs with what a minimal Debian has, and prints each command
exactly as it can be pasted into a shell: a build directory whose name needs quoting must
come back as one word.  The README's quick start runs as written in a new shell."""

from __future__ import annotations

import glob
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


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


# -- the README's quick start, as written, in a new shell -------------------------------------


def quick_start_block(readme: str) -> str:
    """The first ```sh block after the "quick start" marker of README.md."""
    marker = readme.index("<!-- quick start")
    match = re.search(r"```sh\n(.*?)```", readme[marker:], re.DOTALL)
    assert match, "README.md: no ```sh block after the quick start marker"
    return match.group(1)


def _checkout_after_make_venv(target: Path) -> None:
    """A copy of the checkout as `make venv` leaves it, without installing anything: its
    .venv is a virtualenv of its own (activate, python, tensorfs) that imports the copy's
    tensorfs and this suite's installed dependencies; its .installed stamp is newer than
    pyproject.toml, so the quick start's `make venv` only checks the system (fuse3)."""
    shutil.copytree(ROOT, target, symlinks=True, ignore=shutil.ignore_patterns(
        ".git", ".venv", "build", "__pycache__", ".pytest_cache", ".hypothesis", "*.egg-info",
        "sample.gguf", "mnt"))
    venv = target / ".venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True,
                   capture_output=True)
    site = glob.glob(str(venv / "lib" / "python3*" / "site-packages"))[0]
    ours = [p for p in sys.path if p.endswith("site-packages") and os.path.isdir(p)]
    Path(site, "quickstart.pth").write_text("\n".join([str(target), *ours]) + "\n")
    script = venv / "bin" / "tensorfs"
    script.write_text(f"#!{venv}/bin/python\nimport sys\nfrom tensorfs.cli.main import main\n"
                      "sys.exit(main())\n")
    script.chmod(0o755)
    (venv / ".installed").touch()


def test_the_readme_quick_start_runs_as_written_in_a_new_shell(tmp_path):
    checkout = tmp_path / "tensorfs"
    _checkout_after_make_venv(checkout)
    assert quick_start_block((checkout / "README.md").read_text())
    # tools/readme-quickstart.sh runs the block in a new shell that knows nothing of this
    # session (env -i, the standard PATH, no profile): no venv on PATH, no variables
    try:
        result = subprocess.run(["bash", "tools/readme-quickstart.sh"], cwd=checkout,
                                env={"HOME": str(tmp_path), "PATH": "/usr/bin:/bin"},
                                capture_output=True, text=True, timeout=300,
                                stdin=subprocess.DEVNULL)
    finally:
        subprocess.run(["fusermount3", "-uz", str(checkout / "mnt")], capture_output=True)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    out = result.stdout
    assert "attn_q" in out and "float32 (64, 64)" in out, out
    assert str(checkout / "mnt") in out                      # tensorfs list showed it
    assert os.listdir(checkout / "mnt") == []                # and it was unmounted


def test_the_quick_start_test_fails_on_a_readme_without_the_set_up(tmp_path):
    """The check above can fail: without the activation line `tensorfs` is not found."""
    block = quick_start_block((ROOT / "README.md").read_text())
    assert ". .venv/bin/activate" in block or ".venv/bin:$PATH" in block
    broken = "\n".join(line for line in block.splitlines() if ".venv/bin" not in line)
    result = subprocess.run(["env", "-i", "PATH=/usr/bin:/bin", "bash", "--noprofile", "--norc",
                             "-e", "-c", broken.split("tensorfs mount")[0] + "tensorfs --version"],
                            cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert result.returncode != 0
