"""An edit DIR stays loadable whatever its disk does (issue 43 class 1): with ``--edits DIR`` on
a small tmpfs filled to its last page, each kind of edit a user makes (a key by ``echo`` and
by ``sed -i``, a tensor's raw bytes by ``dd conv=notrunc``, an ``.npy`` by numpy, a rename, a
removal) either succeeds or fails with ENOSPC and leaves DIR exactly as it was; space is
freed a page at a time and the edit tried again, so that the disk fills at each point of its
writes (the data file, the log line, the journal).  Afterwards the mount is remounted and
every edit that was answered reads back through the views.  Root only (it mounts a tmpfs)."""

from __future__ import annotations

import errno
import io
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest

from tests.support import run_tensorfs
from tests.support.edit_models import write_kv_gguf

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(os.geteuid() != 0, reason="mounts a small tmpfs: root only")]

PAGE = 4096
TRIES = 12          # pages freed, one at a time, before an edit must have succeeded


@pytest.fixture
def small_disk(tmp_path):
    disk = tmp_path / "disk"
    disk.mkdir()
    made = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k,mode=0700", "tensorfs-test",
                           str(disk)], capture_output=True, text=True)
    if made.returncode:
        pytest.skip(f"cannot mount a tmpfs: {made.stderr.strip()}")
    try:
        yield disk
    finally:
        if subprocess.run(["umount", str(disk)], capture_output=True).returncode:
            subprocess.run(["umount", "-l", str(disk)], capture_output=True)


@pytest.fixture
def model(tmp_path):
    from tests.editing.test_edits import base_kvs, base_tensors

    return write_kv_gguf(tmp_path / "model.gguf", base_kvs(), base_tensors())


def _fill(disk: Path) -> Path:
    """The disk filled to its last byte."""
    filler = disk / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        for block in (PAGE, 512, 1):
            try:
                while True:
                    os.write(fd, bytes(block))
            except OSError as error:
                assert error.errno == errno.ENOSPC
    finally:
        os.close(fd)
    return filler


def _free_a_page(filler: Path) -> None:
    os.truncate(filler, max(0, filler.stat().st_size - PAGE))


def _snapshot(edits: Path) -> dict:
    """Every file of DIR: its kind and bytes."""
    out = {}
    for path in sorted(edits.rglob("*")):
        rel = str(path.relative_to(edits))
        out[rel] = path.read_bytes() if path.is_file() and not path.is_symlink() else "dir"
    return out


def _sh(command: str) -> tuple[bool, str]:
    result = subprocess.run(["sh", "-c", command], capture_output=True, text=True, check=False)
    return result.returncode == 0, result.stderr


def _npy_bytes(array) -> bytes:
    out = io.BytesIO()
    np.save(out, array)
    return out.getvalue()


def _python(action) -> tuple[bool, str]:
    try:
        action()
    except OSError as error:
        return False, f"{error.strerror} ({os.strerror(error.errno or 0)})"
    return True, ""


def _steps(kind: str, here: list, scratch: Path):
    """(the edit, a check that it reads back) for each step of a kind of edit, on the mount
    ``here[0]`` (a remount changes it)."""
    def m() -> Path:
        return here[0]

    if kind == "echo":                  # the shell ignores close: its status says nothing
        for i in range(60):
            text = f"name number {i} " + "x" * (i % 7) * 13
            yield (lambda t=text: _sh(f"echo '{t}' > {m()}/metadata/general.name"),
                   lambda t=text: (m() / "metadata" / "general.name").read_text() == t + "\n")
    elif kind == "write":
        for i in range(60):
            text = f"name number {i} " + "x" * (i % 7) * 13 + "\n"
            yield (lambda t=text: _python(
                       lambda: (m() / "metadata" / "general.name").write_text(t)),
                   lambda t=text: (m() / "metadata" / "general.name").read_text() == t)
    elif kind == "sed":
        for i in range(30):
            yield (lambda i=i: _sh(f"sed -i 's/^.*$/tiny{i}/' {m()}/metadata/general.name"),
                   lambda i=i: (m() / "metadata" / "general.name").read_text() == f"tiny{i}\n")
    elif kind == "dd":
        for i in range(8):
            data = bytes([i + 1]) * 24
            (scratch / f"part{i}").write_bytes(data)
            yield (lambda i=i: _sh(f"dd if={scratch}/part{i} of={m()}/token_embd/weight bs=24 "
                                   f"seek={i} conv=notrunc status=none"),
                   lambda d=data, i=i:
                   (m() / "token_embd" / "weight").read_bytes()[i * 24:(i + 1) * 24] == d)
    elif kind == "npy":
        for i in range(8):
            array = np.full(8, i + 0.5, np.float32)
            yield (lambda a=array: _python(lambda: np.save(m() / "output_norm" / "weight.npy", a)),
                   lambda a=array: np.array_equal(np.load(m() / "output_norm" / "weight.npy"), a))
    elif kind == "mv":
        names = ["weight", "scale", "gain", "weight"]
        for old, new in zip(names, names[1:]):
            yield (lambda o=old, n=new: _sh(f"mv {m()}/output_norm/{o} {m()}/output_norm/{n}"),
                   lambda o=old, n=new: (m() / "output_norm" / n).exists()
                   and not (m() / "output_norm" / o).exists())
    elif kind == "rm":
        for key in ("general.source.url", "test.scores", "tokenizer.chat_template"):
            yield (lambda k=key: _sh(f"rm {m()}/metadata/{k}"),
                   lambda k=key: not (m() / "metadata" / k).exists())
        yield (lambda: _sh(f"rm -r {m()}/blk/0/attn_q"),
               lambda: not (m() / "blk" / "0" / "attn_q" / "weight").exists())


@pytest.mark.parametrize("kind", ["echo", "write", "sed", "dd", "npy", "mv", "rm"])
def test_a_full_disk_refuses_the_edit_and_leaves_dir_loadable(tmp_path, small_disk, model,
                                                              mount, kind):
    edits = small_disk / "fixes"
    here = [mount(model, "--edits", edits, "--log", tmp_path / "daemon.log")]
    filler = _fill(small_disk)
    checks = []
    failures = 0
    for edit, check in _steps(kind, here, tmp_path):
        for _ in range(TRIES):
            before = _snapshot(edits)
            ok, why = edit()
            if ok and (kind != "echo" or check()):
                break
            failures += 1
            # refused in one clear errno, DIR as it was, every edit before it still read
            # (the shell ignores close: an echo's redirection is closed first with the key
            # emptied, which may be kept, and is answered)
            assert ok or "No space left on device" in why, (kind, why)
            if kind != "echo":
                assert _snapshot(edits) == before, (kind, why)
                assert all(c() for c in checks), kind
            _free_a_page(filler)
        else:
            raise AssertionError(f"{kind}: still refused with {TRIES} pages free")
        assert check(), kind
        checks = [c for c in checks if not _supersedes(kind)] + [check]
        _fill(small_disk)
    assert failures, f"{kind}: the disk never filled"
    assert run_tensorfs("unmount", here[0]).returncode == 0
    here[0] = mount(model, "--edits", edits)        # the disk still full
    assert all(c() for c in checks), kind


def _supersedes(kind: str) -> bool:
    """Whether a step's edit replaces the one before it (its check then no longer holds)."""
    return kind in ("echo", "write", "sed", "npy", "mv")


def test_a_fresh_dir_on_a_full_disk_is_refused_in_one_line_and_mounts_later(tmp_path, small_disk,
                                                                            model, mount):
    from tests.support import mount_expecting_refusal

    edits = small_disk / "fixes"
    filler = _fill(small_disk)
    target = tmp_path / "refused"
    target.mkdir()
    result, mounted = mount_expecting_refusal(model, target, "--edits", edits)
    assert (result.returncode, mounted) == (1, False), result.stderr
    assert result.stderr.count("\n") == 1 and "No space left on device" in result.stderr
    assert "Traceback" not in result.stderr and "internal error" not in result.stderr
    filler.unlink()
    mnt = mount(model, "--edits", edits)
    (mnt / "metadata" / "general.name").write_text("later\n")
    assert (mnt / "metadata" / "general.name").read_text() == "later\n"


def test_the_owner_record_rewritten_on_a_full_disk_is_the_old_one_or_the_new_one(small_disk):
    """The owner record is rewritten in place (its file holds the lock): a rewrite that the
    disk cuts short puts the old record back."""
    from tensorfs.editing.store import ROOT, EditStore
    from tensorfs.runtime import claims

    store = EditStore(str(small_disk / "fixes"), [])
    try:
        owner = small_disk / "fixes" / ROOT / "owner"
        claims.serving("/short")
        old = owner.read_bytes()
        assert b'"/short"' in old
        _fill(small_disk)
        claims.serving("/" + "long" * 2000)     # past the page the record holds: ENOSPC
        assert owner.read_bytes() == old
    finally:
        store.close()
        claims._mountpoint = None
