"""Faults under a live mount (issue 5; docs/internals/reliability.md): the model file truncated, rewritten in place,
replaced by a rename or deleted while mounted, and sources on read-only and slow filesystems.

What a user sees in each case is documented in docs/internals/reliability.md; each test below is one
row of that table.  The daemon must stay up through all of them (no SIGBUS), a read of bytes
the mount can no longer vouch for fails with EIO (never a short file: ``st_size`` promised
more), and the log says what happened.

Reads here only touch files (or ranges) the test has not read before the fault: with
``kernel_cache`` the kernel keeps serving what it already has, which is the old, consistent
content and not what these tests are about.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import NamedTuple

import numpy as np
import pytest

from tests.support import (
    EIO,
    alive,
    daemon_pid,
    direct_read,
    fuse_mounts_under,
    read_errno,
    run_tensorfs,
    wait_for,
    waiting_on_fuse,
)
from tests.support.models import write_safetensors
from tests.support.reliability_models import npy_bytes, slow_filesystem, write_mixed_gguf


def _log(path) -> str:
    return path.read_text() if path.exists() else ""


def _assert_serves(mnt, exp, npy: bool = True) -> None:
    assert read_errno(mnt / exp.path) == exp.raw, exp.name
    if npy:
        assert read_errno(mnt / (exp.path + ".npy")) == npy_bytes(exp.values), exp.name + ".npy"


def _assert_eio(mnt, exp) -> None:
    assert read_errno(mnt / exp.path) == EIO, exp.name
    assert read_errno(mnt / (exp.path + ".npy")) == EIO, exp.name + ".npy"


@pytest.fixture
def mixed(tmp_path):
    model = tmp_path / "model.gguf"
    return model, write_mixed_gguf(model)


class LiveMount(NamedTuple):
    model: Path         # the mounted file, for the test to damage
    exp: dict           # what write_mixed_gguf wrote, tensor by tensor
    mnt: Path
    log: Path           # the daemon's log
    pid: int


@pytest.fixture
def live(tmp_path, mount, mixed):
    """The mixed model mounted with a log: the starting point of each fault below."""
    model, exp = mixed
    log = tmp_path / "daemon.log"
    mnt = mount(model, "--log", log)
    return LiveMount(model, exp, mnt, log, daemon_pid(mnt))


def test_truncated_model_fails_every_read(live):
    """docs/internals/reliability.md: a truncated model serves nothing, not even the bytes before the cut: a
    shrunk file cannot be told from one rewritten in place and then shrunk."""
    model, exp, mnt, log, pid = live
    a, b, c, d, e = exp.values()
    cut = c.offset + 600_000                   # inside the BF16 tensor
    os.truncate(model, cut)

    for t in (a, b, c, d, e):                  # before, across and past the cut alike
        _assert_eio(mnt, t)
    assert read_errno(mnt / c.path, 0, 4096) == EIO
    assert os.stat(mnt / c.path).st_size == len(c.raw)        # the promise stands
    # generated files and the tree describe the mounted header and keep serving
    assert json.loads((mnt / "metadata.json").read_bytes())["file_size"] > cut
    assert sorted(os.listdir(mnt / "c" / "bf16")) == ["weight", "weight.npy"]
    assert alive(pid) and fuse_mounts_under(mnt)
    text = _log(log)
    assert "truncated or rewritten shorter" in text and f"{cut} bytes now" in text
    assert text.count("every read of it now fails with EIO") == 1          # said once
    assert "Traceback" not in text


def _rewrite_keeping_the_start(path: Path, keep: int, new_size: int, fill: bytes) -> None:
    """In place (same inode): the first ``keep`` bytes stay, the rest is new, then cut."""
    with open(path, "r+b") as f:
        f.seek(keep)
        f.write(fill * (new_size - keep))
        f.truncate(new_size)


def test_rewritten_shorter_keeping_the_first_bytes_serves_nothing(tmp_path, mount):
    """The review's case: a model rewritten in place that keeps its first 64 KiB and more
    (header and a big first tensor), new bytes after them, then shrunk.  Before, the prefix
    hashes vouched for it as "truncated" and ``b_x`` read 666.0 instead of 0..7."""
    model = tmp_path / "m.safetensors"
    from safetensors.numpy import save_file

    save_file({"a_big": np.ones(32768, np.float32), "b_x": np.arange(8, dtype=np.float32),
               "c_pad": np.zeros(64, np.float32)}, str(model))
    log = tmp_path / "daemon.log"
    mnt = mount(model, "--log", log)
    doc = json.loads((mnt / "metadata.json").read_bytes())
    x, pad = doc["tensors"]["b_x"], doc["tensors"]["c_pad"]
    assert x["offset"] > 64 << 10 and pad["offset"] > x["offset"]
    _rewrite_keeping_the_start(model, x["offset"], pad["offset"] + 16,
                               np.float32(666.0).tobytes())
    got = read_errno(mnt / x["path"])
    assert got == EIO, np.frombuffer(got, np.float32) if isinstance(got, bytes) else got
    assert read_errno(mnt / (x["path"] + ".npy")) == EIO
    assert read_errno(mnt / "a_big", 0, 4096) == EIO
    assert "every read of it now fails with EIO" in _log(log)


@pytest.mark.parametrize("change", ["shrink_same_start", "shrink_new_start", "grow", "same_size",
                                    "touch", "to_zero_and_back"])
def test_a_small_model_changed_in_any_way_serves_nothing(tmp_path, mount, change):
    """A model under 4 KiB (the old rule had no prefix check at all below that): every
    change of size or mtime makes every read of it fail."""
    model = tmp_path / "small.safetensors"
    from safetensors.numpy import save_file

    save_file({"t": np.arange(64, dtype=np.float32)}, str(model))
    size = os.path.getsize(model)
    assert size < 4096
    log = tmp_path / "daemon.log"
    mnt = mount(model, "--log", log)
    data_at = size - 256
    if change == "shrink_same_start":
        _rewrite_keeping_the_start(model, data_at, size - 4, b"\x42")
    elif change == "shrink_new_start":
        os.truncate(model, size - 4)
        with open(model, "r+b") as f:
            f.write(b"\x00" * 8)
    elif change == "grow":
        with open(model, "ab") as f:
            f.write(b"\x00" * 16)
    elif change == "same_size":
        _rewrite_keeping_the_start(model, data_at, size, b"\x42")
    elif change == "touch":
        st = os.stat(model)
        os.utime(model, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))
    else:
        content = model.read_bytes()
        os.truncate(model, 0)
        with open(model, "r+b") as f:      # the same bytes again: still not vouched for
            f.write(content)
    assert read_errno(mnt / "t") == EIO
    assert read_errno(mnt / "t.npy") == EIO
    assert read_errno(mnt / "header.bin") == EIO
    json.loads((mnt / "metadata.json").read_bytes())          # generated: still served
    assert _log(log).count("every read of it now fails with EIO") == 1


def test_rewritten_in_place_same_size_fails_every_read(live):
    model, exp, mnt, log, pid = live
    a, b, c, d, e = exp.values()
    with open(model, "r+b") as f:              # one tensor's bytes changed, size kept
        f.seek(d.offset + 1000)
        f.write(b"\x55" * 64)
    size = os.path.getsize(model)
    # no byte can be vouched for any more: every tensor, raw and converted, fails
    for t in (a, b, c, d, e):
        _assert_eio(mnt, t)
    assert os.path.getsize(model) == size
    json.loads((mnt / "metadata.json").read_bytes())           # generated: still served
    assert alive(pid)
    text = _log(log)
    assert "rewritten in place (same size, but its mtime changed)" in text
    assert text.count("every read of it now fails with EIO") == 1


def test_copied_over_with_another_model_fails_every_read(tmp_path, live):
    """``cp other.gguf model.gguf`` while mounted: truncate to 0, then new bytes."""
    model, exp, mnt, log, pid = live
    other = tmp_path / "other.gguf"
    write_mixed_gguf(other, seed=1)
    subprocess.run(["cp", str(other), str(model)], check=True)
    for t in exp.values():
        _assert_eio(mnt, t)
    assert alive(pid)
    assert "every read of it now fails with EIO" in _log(log)


def test_replaced_by_rename_keeps_serving_the_mounted_file(tmp_path, live):
    """The daemon's descriptor holds the old inode: old, consistent bytes; the log says so."""
    model, exp, mnt, log, pid = live
    a, b, c, d, e = exp.values()
    _assert_serves(mnt, a)
    new = tmp_path / "model.gguf.new"
    write_mixed_gguf(new, seed=1)
    os.rename(new, model)
    # the path is checked at most once a second, on a read: read (O_DIRECT: each read
    # reaches the daemon) until the log says it saw the new file
    assert wait_for(lambda: direct_read(mnt / a.path)
                    and "another file was renamed over it" in _log(log), 10)
    for t in (b, c, d, e):                     # the old bytes, though the path has new ones
        _assert_serves(mnt, t)
    assert alive(pid)
    assert "EIO" not in _log(log)


def test_deleted_model_keeps_serving(live):
    model, exp, mnt, log, _ = live
    os.unlink(model)
    for t in exp.values():
        _assert_serves(mnt, t)
    assert wait_for(lambda: "(it was deleted" in _log(log), 5)


def test_truncated_safetensors_too(tmp_path, mount):
    model = tmp_path / "m.safetensors"
    write_safetensors(model)
    log = tmp_path / "daemon.log"
    mnt = mount(model, "--log", log)
    doc = json.loads((mnt / "metadata.json").read_bytes())
    entries = sorted(doc["tensors"].items(), key=lambda kv: kv[1]["offset"])
    last_name, last = entries[-1]
    assert last["nbytes"] > 8
    os.truncate(model, last["offset"] + 4)
    for _, entry in (entries[0], entries[-1]):
        assert read_errno(mnt / entry["path"]) == EIO
        assert read_errno(mnt / (entry["path"] + ".npy")) == EIO
    assert "truncated or rewritten shorter" in _log(log)


# -- where the source lives -----------------------------------------------------------------

def test_source_on_a_read_only_filesystem(tmp_path, mount, mixed):
    model, exp = mixed
    ro = tmp_path / "ro"
    ro.mkdir()
    bind = subprocess.run(["mount", "--bind", str(tmp_path), str(ro)], capture_output=True)
    if bind.returncode != 0:
        pytest.skip(f"cannot bind-mount here: {bind.stderr.decode().strip()}")
    try:
        subprocess.run(["mount", "-o", "remount,bind,ro", str(ro)], check=True)
        with pytest.raises(OSError):
            open(ro / "model.gguf", "r+b")     # really read-only
        mnt = mount(ro / "model.gguf", name="mnt-ro")
        for t in exp.values():
            _assert_serves(mnt, t)
        assert run_tensorfs("unmount", mnt).returncode == 0
    finally:
        subprocess.run(["umount", "-l", str(ro)], capture_output=True)


@pytest.fixture
def slow_dir(tmp_path_factory):
    """A directory whose file reads each take 0.05 s (a FUSE passthrough), and its source."""
    with slow_filesystem(tmp_path_factory.mktemp("slowfs"), 0.05) as dirs:
        yield dirs


@pytest.mark.slow
def test_source_on_a_slow_filesystem(tmp_path, slow_dir, mount):   # mount goes first
    src, slow = slow_dir
    exp = write_mixed_gguf(src / "model.gguf")
    started = time.monotonic()
    mnt = mount(slow / "model.gguf")
    mount_s = time.monotonic() - started
    a, b, c, d, e = exp.values()

    import threading

    results = {}

    def read_big():
        results["c"] = read_errno(mnt / (c.path + ".npy"))

    reader = threading.Thread(target=read_big)
    reader.start()                          # a long, slow read in flight ...
    assert wait_for(lambda: waiting_on_fuse(daemon_pid(mnt)), 30)
    started = time.monotonic()
    json.loads((mnt / "metadata.json").read_bytes())    # ... does not hold up the others
    assert read_errno(mnt / a.path, 0, 4096) == a.raw[:4096]
    other_s = time.monotonic() - started
    reader.join(60)
    assert results["c"] == npy_bytes(c.values)
    for t in (b, d, e):
        _assert_serves(mnt, t)
    assert other_s < 2.0, other_s
    assert mount_s < 20, mount_s


# -- what the change check costs (measured only: TENSORFS_MEASURE=1) ------------------------

_SERVE_WITHOUT_CHECK = (
    "import sys, tensorfs.sources.local as s\n"
    "if sys.argv[1] == 'off':\n"
    "    s.ModelSource._verify = lambda self, offset, size: None\n"
    "from tensorfs.cli.main import main\n"
    "sys.exit(main(sys.argv[2:]))\n")


@pytest.mark.skipif(os.environ.get("TENSORFS_MEASURE") != "1", reason="TENSORFS_MEASURE=1")
def test_cost_of_the_change_check(tmp_path, capsys):
    """Sequential reads of a 256 MiB raw tensor from a hot page cache, through fresh mounts
    (cold kernel cache of the mount), with the per-read fstat and without it."""
    from safetensors.numpy import save_file

    model = tmp_path / "big.safetensors"
    save_file({"w": np.frombuffer(os.urandom(256 << 20), np.float32)}, str(model))
    model.read_bytes()                                  # the source's page cache: hot
    rates = {"on": [], "off": []}
    for round_ in range(4):
        for mode in ("on", "off"):
            mnt = tmp_path / f"mnt-{mode}-{round_}"
            mnt.mkdir()
            proc = subprocess.Popen([sys.executable, "-c", _SERVE_WITHOUT_CHECK, mode, "mount",
                                     "--foreground", str(model), str(mnt)])
            try:
                assert wait_for(lambda: fuse_mounts_under(mnt), 20)
                fd = os.open(mnt / "w", os.O_RDONLY)
                started = time.perf_counter()
                total = 0
                while chunk := os.read(fd, 1 << 20):
                    total += len(chunk)
                rates[mode].append(total / (time.perf_counter() - started) / 2**20)
                os.close(fd)
            finally:
                subprocess.run(["fusermount", "-u", str(mnt)], check=True)
                proc.wait(30)
    on, off = max(rates["on"]), max(rates["off"])
    per_request_us = lambda rate: (128 << 10) / (rate * 2**20) * 1e6   # noqa: E731 (a one-line formula)
    with capsys.disabled():
        print(f"\n[change check] 256 MiB raw, sequential, best of 4: with fstat {on:.0f} MiB/s "
              f"({per_request_us(on):.1f} us per 128 KiB request), without {off:.0f} MiB/s "
              f"({per_request_us(off):.1f} us); cost {100 * (off - on) / off:.1f} %; "
              f"all runs on={[round(r) for r in rates['on']]} off={[round(r) for r in rates['off']]}")
