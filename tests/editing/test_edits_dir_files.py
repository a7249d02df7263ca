"""Everything in ``--edits DIR`` is input, its files' types included (issue 43 class 5): each
file the store opens (its marker, the journal, the log, a data file, the owner record) is
checked without blocking (a regular file, not a link, the user's, of the size recorded) and
anything else is refused at mount in one line; a FIFO in place of a data file hung the mount.
And a mount refused for DIR (it holds another model's edits) leaves DIR as it was, its owner
record included (issue 43, "Also")."""

from __future__ import annotations

import os
import shutil
import stat

import numpy as np
import pytest

from tests.support import mount_expecting_refusal, run_tensorfs
from tests.support.edit_models import tool_kvs, tool_tensors, write_kv_gguf

ROOT = "tensorfs-edits.v1"


@pytest.fixture
def model(tmp_path):
    return write_kv_gguf(tmp_path / "model.gguf", tool_kvs(), tool_tensors())


def _edited_dir(tmp_path, model, mount):
    """DIR holding a key edit (journal and log) and a tensor's new bytes (a data file)."""
    edits = tmp_path / "fixes"
    mnt = mount(model, "--edits", edits)
    (mnt / "metadata" / "general.name").write_text("small\n")
    np.save(mnt / "output_norm" / "weight.npy", np.ones(8, np.float32))
    (mnt / "metadata" / "general.name").write_text("smaller\n")
    assert run_tensorfs("unmount", mnt).returncode == 0
    return edits


def _replacements(is_root: bool):
    """(what, how to put it in place of the file at ``path`` holding ``data``)."""
    def fifo(path, data):
        os.mkfifo(path, 0o600)

    def link(path, data):
        path.with_name("elsewhere").write_bytes(data)
        os.symlink("elsewhere", path)

    def directory(path, data):
        path.mkdir(mode=0o700)

    def device(path, data):
        os.mknod(path, 0o600 | stat.S_IFCHR, os.makedev(1, 3))      # as /dev/null

    def someone_elses(path, data):
        path.write_bytes(data)
        os.chown(path, 4242, 4242)

    out = [("a FIFO", fifo, "FIFO"), ("a link", link, "symbolic link"),
           ("a directory", directory, "directory")]
    if is_root:
        out += [("a device", device, "character device"),
                ("another user's file", someone_elses, "uid 4242")]
    return out


@pytest.mark.slow
def test_every_file_of_dir_that_is_not_a_regular_file_of_the_users_is_refused(tmp_path, model,
                                                                              mount):
    edits = _edited_dir(tmp_path, model, mount)
    root = edits / ROOT
    names = sorted(os.listdir(root))
    kinds = {"TENSORFS-EDITS", "edits.json", "owner"}
    files = [n for n in names if n in kinds or n.startswith(("edits-", "data-"))]
    assert len(files) == 5, names          # marker, journal, log, one data file, owner
    target = tmp_path / "refused"
    target.mkdir()
    for name in files:
        path = root / name
        data = path.read_bytes()
        for what, put, words in _replacements(os.geteuid() == 0):
            path.unlink()
            put(path, data)
            try:
                result, mounted = mount_expecting_refusal(model, target, "--edits", edits,
                                                          timeout=60)
            finally:
                if path.is_dir() and not path.is_symlink():
                    path.rmdir()
                else:
                    path.unlink()
                path.with_name("elsewhere").unlink(missing_ok=True)
                path.write_bytes(data)
                path.chmod(0o600)
            assert (result.returncode, mounted) == (1, False), (name, what, result.stderr)
            assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr, \
                (name, what, result.stderr)
            assert name in result.stderr and words in result.stderr, (name, what, result.stderr)
    # a data file of another size than its tensor's, longer or shorter
    data_name = next(n for n in files if n.startswith("data-"))
    path = root / data_name
    data = path.read_bytes()
    for wrong in (data + b"\0", data[:-1]):
        path.write_bytes(wrong)
        result, mounted = mount_expecting_refusal(model, target, "--edits", edits, timeout=60)
        assert (result.returncode, mounted) == (1, False), result.stderr
        assert result.stderr.count("\n") == 1 and data_name in result.stderr, result.stderr
        assert f"not the {len(data)} recorded" in result.stderr, result.stderr
    path.write_bytes(data)
    # and as it was, it mounts with its edits
    mnt = mount(model, "--edits", edits)
    assert (mnt / "metadata" / "general.name").read_text() == "smaller\n"
    assert np.array_equal(np.load(mnt / "output_norm" / "weight.npy"), np.ones(8, np.float32))


def test_a_mount_refused_for_another_models_dir_leaves_it_untouched(tmp_path, model, mount):
    edits = _edited_dir(tmp_path, model, mount)
    root = edits / ROOT
    before = {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in root.iterdir()}
    other = write_kv_gguf(tmp_path / "other.gguf", tool_kvs(eos=7), tool_tensors())
    target = tmp_path / "refused"
    target.mkdir()
    result, mounted = mount_expecting_refusal(other, target, "--edits", edits)
    assert (result.returncode, mounted) == (1, False), result.stderr
    assert "another model" in result.stderr and result.stderr.count("\n") == 1
    after = {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in root.iterdir()}
    assert after == before
    shutil.rmtree(target)


@pytest.mark.slow
def test_a_log_line_after_the_beginning_of_one_never_answered_is_read(tmp_path, model, mount):
    """A disk that filled in the middle of an append (before appends were made whole or
    nothing) left the beginning of a line, and the next edit was appended after it: the
    mount reads the answered line and drops the beginning, and the next edit writes the
    journal whole, a new log without it (issue 43 class 1)."""
    edits = _edited_dir(tmp_path, model, mount)
    root = edits / ROOT
    log = next(root.glob("edits-*.log"))
    lines = log.read_bytes().splitlines(keepends=True)
    assert lines and all(line.startswith(b'{"unset":') for line in lines)
    last = lines[-1]
    for cut in (5, len(last) // 2, len(last) - 2):
        log.write_bytes(b"".join(lines[:-1]) + last[:cut] + last[:cut + 1] + last)
        mnt = mount(model, "--edits", edits)
        assert (mnt / "metadata" / "general.name").read_text() == "smaller\n", cut
        assert np.array_equal(np.load(mnt / "output_norm" / "weight.npy"), np.ones(8, np.float32))
        (mnt / "metadata" / "general.name").write_text(f"cut {cut}\n")
        assert run_tensorfs("unmount", mnt).returncode == 0
        for kept in root.glob("edits-*.log"):   # the journal written whole: no beginning left
            assert all(line.startswith(b'{"unset":') for line in kept.read_bytes().splitlines())
        mnt = mount(model, "--edits", edits)
        assert (mnt / "metadata" / "general.name").read_text() == f"cut {cut}\n"
        (mnt / "metadata" / "general.name").write_text("smaller\n")
        assert run_tensorfs("unmount", mnt).returncode == 0
        log = next(root.glob("edits-*.log"))
        lines = log.read_bytes().splitlines(keepends=True)
        last = lines[-1]
    # anything else on a line is still refused in one line
    log.write_bytes(b"".join(lines[:-1]) + b"garbage" + last)
    target = tmp_path / "refused"
    target.mkdir()
    result, mounted = mount_expecting_refusal(model, target, "--edits", edits)
    assert (result.returncode, mounted) == (1, False) and "cannot be read" in result.stderr
