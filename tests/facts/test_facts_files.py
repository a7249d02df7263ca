"""What the fact commands read and write besides the model: a manifest is read only once it
is known to be a regular file of bounded size and text (never /dev/zero, a FIFO, a binary
blob); a --plot FILE is written as a new file renamed over the name, never through a link
another user planted; --plot's needs are checked before the model is read; a manifest
without the algorithm asked for, or a tensor name the model lacks, is one line that says
what is there."""

from __future__ import annotations

import os
import stat
import tempfile
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save_file

from tensorfs.facts.files import MANIFEST_LIMIT
from tests.support import run_tensorfs
from tests.support.users import IS_ROOT, needs_users  # noqa: F401 (users: a conftest fixture)

PNG = b"\x89PNG\r\n\x1a\n"


def small_model(path: Path, scale: float = 1.0) -> Path:
    save_file({"blk.0.attn_q.weight": (np.arange(12, dtype=np.float32) * scale).reshape(3, 4),
               "blk.0.attn_k.weight": np.ones(8, np.float32),
               "output.weight": np.linspace(-1, 1, 16).astype(np.float32)}, str(path))
    return path


def one_error_line(result, status: int) -> str:
    assert result.returncode == status, (result.returncode, result.stdout, result.stderr)
    assert result.stderr.count("\n") == 1 and result.stderr.startswith("tensorfs: error: "), \
        result.stderr
    assert "Traceback" not in result.stderr
    return result.stderr


# -- manifests -------------------------------------------------------------------------------

def test_a_device_a_fifo_and_a_directory_are_refused_unread(tmp_path):
    model = small_model(tmp_path / "m.safetensors")
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    for manifest, kind in (("/dev/zero", "a character device"), (fifo, "a FIFO"),
                           (tmp_path, "a directory")):
        # a FIFO with no writer would block a plain open() for ever: the timeout says so
        result = run_tensorfs("hash", "--check", manifest, model, timeout=30)
        line = one_error_line(result, 1)
        assert f"the manifest is {kind}, not a regular file" in line, line


def test_a_manifest_past_the_limit_is_refused_unread(tmp_path):
    model = small_model(tmp_path / "m.safetensors")
    big = tmp_path / "big.txt"
    with open(big, "wb") as f:          # sparse: the size is what is checked, not the bytes
        f.truncate(MANIFEST_LIMIT + 1)
    line = one_error_line(run_tensorfs("hash", "--check", big, model), 1)
    assert f"more than a manifest can be ({MANIFEST_LIMIT:,})" in line, line


@pytest.mark.parametrize("content, said", [
    (b"xxh64  0123  m\x00\x01\x02binary", "holds NUL bytes: not a text file"),
    (b"xxh64  0123  m\nsha1  \xff\xfe  m\n", "line 2 of the manifest is not UTF-8 text"),
])
def test_a_manifest_that_is_not_text_is_one_line(tmp_path, content, said):
    model = small_model(tmp_path / "m.safetensors")
    manifest = tmp_path / "manifest"
    manifest.write_bytes(content)
    assert said in one_error_line(run_tensorfs("hash", "--check", manifest, model), 1)


def test_a_manifest_without_the_algorithm_asked_for_says_what_it_has(tmp_path):
    model = small_model(tmp_path / "m.safetensors")
    written = run_tensorfs("hash", model, cwd=tmp_path)
    manifest = tmp_path / "manifest"
    manifest.write_text(written.stdout)
    result = run_tensorfs("hash", "--sha256", "--check", manifest, model)
    line = one_error_line(result, 1)
    assert "the manifest has no sha256 lines (it has xxh64)" in line, line
    assert result.stdout == ""              # said before the model is read
    assert run_tensorfs("hash", "--check", manifest, model).returncode == 0


# -- tensor names ----------------------------------------------------------------------------

def test_an_unknown_tensor_names_the_close_ones(tmp_path):
    model = small_model(tmp_path / "m.safetensors")
    line = one_error_line(run_tensorfs("stats", model, "blk.0.attn_q"), 1)
    assert line == (f"tensorfs: error: {model}: no tensor named 'blk.0.attn_q' "
                    f"(did you mean 'blk.0.attn_q.weight'?)\n"), line
    line = one_error_line(run_tensorfs("stats", model, "blk.0.atn_k.weight"), 1)
    assert "(did you mean 'blk.0.attn_k.weight'" in line, line
    line = one_error_line(run_tensorfs("stats", model, "nothing_like_it"), 1)
    assert line.endswith("no tensor named 'nothing_like_it'\n"), line


# -- --plot FILE -----------------------------------------------------------------------------

def test_plot_without_matplotlib_is_said_before_the_model_is_read(tmp_path):
    shadow = tmp_path / "shadow" / "matplotlib"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("raise ImportError('hidden by the test')\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(tmp_path / "shadow")] + [p for p in [os.environ.get("PYTHONPATH")] if p]))
    a = small_model(tmp_path / "a.safetensors")
    b = small_model(tmp_path / "b.safetensors", scale=2.0)
    for args, status in ((("stats", a), 1), (("diff", a, b), 2),
                         (("stats", tmp_path / "missing.gguf"), 1)):
        result = run_tensorfs(*args, "--plot", tmp_path / "x.png", env=env)
        line = one_error_line(result, status)
        assert "--plot needs matplotlib" in line, line
        # the install line that works in a checkout (the package is not published)
        assert "pip install -e '.[plot]'" in line and "tensorfs-fuse[plot]" not in line, line
        assert result.stdout == ""          # no table: nothing was read
    assert not (tmp_path / "x.png").exists()


def test_plot_is_a_new_file_with_the_umask_mode_and_no_temporary_left(tmp_path):
    pytest.importorskip("matplotlib")
    a = small_model(tmp_path / "a.safetensors")
    out = tmp_path / "out"
    out.mkdir()
    (out / "old.png").write_bytes(b"old")
    os.chmod(out / "old.png", 0o640)
    result = run_tensorfs("stats", a, "--plot", out / "old.png")
    assert result.returncode == 0, result.stderr
    assert (out / "old.png").read_bytes()[:8] == PNG
    assert stat.S_IMODE(os.stat(out / "old.png").st_mode) == 0o666 & ~_umask()
    assert sorted(os.listdir(out)) == ["old.png"]


@pytest.mark.parametrize("kind", ["fifo", "directory"])
def test_plot_onto_what_is_not_a_file_is_refused_before_reading(tmp_path, kind):
    pytest.importorskip("matplotlib")
    a = small_model(tmp_path / "a.safetensors")
    target = tmp_path / "target"
    os.mkfifo(target) if kind == "fifo" else target.mkdir()
    result = run_tensorfs("stats", a, "--plot", target, timeout=30)
    line = one_error_line(result, 1)
    assert "cannot write the plot: it is a" in line and result.stdout == ""


@needs_users
def test_a_link_another_user_planted_in_a_shared_directory_is_never_written_through(users):
    """The attacker plants ``plot.png -> root's 0600 file`` in a sticky world-writable
    directory; root's ``stats/diff --plot`` there refuses in one line and the file keeps
    its bytes.  A regular file the attacker planted is replaced, not written into (its
    other hard link keeps the attacker's bytes)."""
    pytest.importorskip("matplotlib")
    _victim, attacker = users
    private = Path(tempfile.mkdtemp(prefix="tensorfs-facts-private-"))
    shared = Path(tempfile.mkdtemp(prefix="tensorfs-facts-shared-"))
    try:
        os.chmod(shared, 0o1777)
        secret = private / "secret"
        secret.write_bytes(b"root's own\n")
        os.chmod(secret, 0o600)
        os.chmod(private, 0o755)
        a = small_model(private / "a.safetensors")
        b = small_model(private / "b.safetensors", scale=2.0)
        planted = attacker.run("ln", "-s", str(secret), str(shared / "plot.png"))
        assert planted.returncode == 0, planted.stderr
        for args, status in ((("stats", a), 1), (("diff", a, b), 2)):
            result = run_tensorfs(*args, "--plot", shared / "plot.png")
            line = one_error_line(result, status)
            assert "is a symbolic link, never written through" in line, line
            assert result.stdout == ""
            assert secret.read_bytes() == b"root's own\n"
            assert stat.S_IMODE(os.stat(secret).st_mode) == 0o600
        # a directory link of the attacker's on the way: root's file below it stays
        (private / "plot.png").write_bytes(b"root's plot\n")
        planted = attacker.run("ln", "-s", str(private), str(shared / "dir"))
        assert planted.returncode == 0, planted.stderr
        result = run_tensorfs("stats", a, "--plot", shared / "dir" / "plot.png")
        line = one_error_line(result, 1)
        assert f"{shared}/dir is a symbolic link of uid " in line, line
        assert (private / "plot.png").read_bytes() == b"root's plot\n"
        attacker.run("rm", "-f", str(shared / "dir"))
        # a regular file of the attacker's, with a second name the attacker keeps
        attacker.run("rm", "-f", str(shared / "plot.png"))
        made = attacker.run("sh", "-c", f"echo mine > {shared}/plot.png && "
                            f"ln {shared}/plot.png {shared}/kept.png")
        assert made.returncode == 0, made.stderr
        result = run_tensorfs("diff", a, b, "--plot", shared / "plot.png")
        assert result.returncode == 1, result.stderr
        assert (shared / "plot.png").read_bytes()[:8] == PNG
        assert os.stat(shared / "plot.png").st_uid == 0
        assert (shared / "kept.png").read_bytes() == b"mine\n"
        assert sorted(os.listdir(shared)) == ["kept.png", "plot.png"]
    finally:
        for d in (shared, private):
            for p in d.iterdir():
                p.unlink()
            d.rmdir()


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask
