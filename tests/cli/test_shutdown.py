"""Ending a mount (issue 5): signals, ``tensorfs unmount`` with users, a killed daemon.

Every way out must leave the mount point as it was before the mount — an empty directory,
not in /proc/self/mountinfo, no "Transport endpoint is not connected" — and a daemon that
has exited.  docs/internals/reliability.md has what a user sees in each case.
"""

from __future__ import annotations

import errno
import multiprocessing
import os
import random
import signal
import subprocess
import threading
import time

import pytest

from tests.support import (
    TENSORFS,
    alive,
    daemon_pid,
    fuse_mounts_under,
    in_fuse_request,
    run_tensorfs,
    wait_for,
    waiting_on_fuse,
)
from tests.support.bigmodels import write_sparse_safetensors
from tests.support.reliability_models import slow_filesystem, write_mixed_gguf

pytestmark = pytest.mark.slow     # every test here runs for seconds


def _clean(mnt) -> None:
    """The mount point is a plain empty directory again."""
    assert fuse_mounts_under(mnt) == []
    assert os.listdir(mnt) == []           # ENOTCONN would raise here
    os.stat(mnt)


def _files(mnt) -> list[str]:
    out = []
    for root, _, names in os.walk(mnt):
        out += [os.path.join(root, n) for n in names]
    return out


def _read_loop(paths: list[str], stop_after: float, hold_open: bool, reading=None) -> None:
    """A reader: random ranges of random files until told, or until the mount goes;
    ``reading`` (an Event) is set once its first read was answered."""
    rng = random.Random(os.getpid())
    deadline = time.monotonic() + stop_after
    fds = {}
    try:
        while time.monotonic() < deadline:
            path = rng.choice(paths)
            fd = fds.get(path) if hold_open else None
            if fd is None:
                fd = os.open(path, os.O_RDONLY)
                if hold_open:
                    fds[path] = fd
            os.pread(fd, rng.randint(1, 1 << 20), rng.randrange(os.fstat(fd).st_size or 1))
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            if reading is not None:
                reading.set()
            if not hold_open:
                os.close(fd)
    except OSError:
        os._exit(3)                        # the mount went away under the reader: expected
    os._exit(0)


def _start_readers(mnt, n: int = 4, seconds: float = 60, hold_open: bool = False):
    paths = _files(mnt)
    ctx = multiprocessing.get_context("fork")
    reading = [ctx.Event() for _ in range(n)]
    procs = [ctx.Process(target=_read_loop, args=(paths, seconds, hold_open, event))
             for event in reading]
    for p in procs:
        p.start()
    assert all(event.wait(30) for event in reading), "a reader never got an answer"
    assert all(p.is_alive() for p in procs)
    return procs


def _stop(procs) -> list[int]:
    for p in procs:
        p.join(20)
        if p.is_alive():
            p.kill()
            p.join()
            raise AssertionError("a reader hung after the mount went away")
    return [p.exitcode for p in procs]


@pytest.fixture
def model(tmp_path):
    path = tmp_path / "model.gguf"
    write_mixed_gguf(path)
    return path


@pytest.fixture
def mnt(tmp_path):
    """An empty mount point; whatever a failed test leaves mounted there is cleaned up."""
    path = tmp_path / "mnt"
    path.mkdir()
    yield path
    if fuse_mounts_under(path):
        from tensorfs.cli.daemon import daemon_pid

        pid = daemon_pid(str(path))
        if pid is not None:
            os.kill(pid, signal.SIGCONT)
            os.kill(pid, signal.SIGKILL)
        subprocess.run(["fusermount", "-uz", str(path)], capture_output=True)
        pytest.fail(f"{path} was left mounted")


# -- signals ------------------------------------------------------------------------------

@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_signal_to_the_daemon_with_readers_active(tmp_path, mnt, model, sig):
    assert run_tensorfs("mount", model, mnt).returncode == 0
    pid = daemon_pid(mnt)
    readers = _start_readers(mnt)
    os.kill(pid, sig)
    assert wait_for(lambda: not alive(pid), 20), "the daemon did not exit"
    codes = _stop(readers)
    _clean(mnt)
    assert set(codes) <= {0, 3}
    from tensorfs.runtime import pid_file

    assert not os.path.exists(pid_file(str(mnt)))


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_signal_to_a_foreground_mount_with_readers_active(tmp_path, mnt, model, sig):
    proc = subprocess.Popen([*TENSORFS, "mount", "--foreground", str(model), str(mnt)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert wait_for(lambda: fuse_mounts_under(mnt), 30)
        readers = _start_readers(mnt, hold_open=True)
        proc.send_signal(sig)
        assert proc.wait(timeout=30) == 0
        _stop(readers)
        _clean(mnt)
    finally:
        if proc.poll() is None:
            proc.kill()
            subprocess.run(["fusermount", "-uz", str(mnt)])


# -- tensorfs unmount with users --------------------------------------------------------------

def test_unmount_of_a_mount_with_files_open_says_busy_and_lazy_detaches(tmp_path, mnt, model):
    assert run_tensorfs("mount", model, mnt).returncode == 0
    pid = daemon_pid(mnt)
    readers = _start_readers(mnt, hold_open=True, seconds=3)
    result = run_tensorfs("unmount", mnt)
    assert result.returncode == 1
    assert result.stderr.startswith(f"tensorfs: error: {mnt}: mount point is busy")
    assert "--lazy" in result.stderr and len(result.stderr.splitlines()) == 1
    assert fuse_mounts_under(mnt) and alive(pid)       # nothing changed ...
    assert all(p.is_alive() for p in readers)            # ... for anyone
    started = time.monotonic()
    result = run_tensorfs("unmount", "--lazy", mnt)
    assert result.returncode == 0, result.stderr
    assert time.monotonic() - started < 5
    _clean(mnt)                                          # detached at once
    assert set(_stop(readers)) == {0}                    # the open files kept working
    assert wait_for(lambda: not alive(pid), 20)          # and the daemon went after them


def test_unmount_of_a_mount_that_is_a_cwd_says_busy(tmp_path, mnt, model):
    assert run_tensorfs("mount", model, mnt).returncode == 0
    pid = daemon_pid(mnt)
    sleeper = subprocess.Popen(["sleep", "60"], cwd=mnt / "a" / "f32")
    try:
        result = run_tensorfs("unmount", mnt)
        assert result.returncode == 1 and "busy" in result.stderr
        assert fuse_mounts_under(mnt)
        assert run_tensorfs("unmount", "--lazy", mnt).returncode == 0
        _clean(mnt)
        assert alive(pid)                   # still serving the sleeper's cwd
    finally:
        sleeper.kill()
        sleeper.wait()
    assert wait_for(lambda: not alive(pid), 20)


def test_unmount_waits_for_readers_to_be_answered(tmp_path, mnt, model):
    """Readers that open, read and close: unmount succeeds between two of their reads (or
    says busy, and then succeeds once they stop); the daemon is gone when it returns."""
    assert run_tensorfs("mount", model, mnt).returncode == 0
    pid = daemon_pid(mnt)
    readers = _start_readers(mnt, hold_open=False, seconds=4)
    deadline = time.monotonic() + 30
    while True:
        result = run_tensorfs("unmount", mnt)
        if result.returncode == 0 or time.monotonic() > deadline:
            break
        assert "busy" in result.stderr, result.stderr
        time.sleep(0.2)
    assert result.returncode == 0, result.stderr
    assert not alive(pid)                   # unmount returns once the daemon has exited
    _stop(readers)
    _clean(mnt)


# -- a daemon that died ---------------------------------------------------------------------

def test_sigkilled_daemon_leaves_a_mount_that_unmount_cleans_up(tmp_path, mnt, model):
    assert run_tensorfs("mount", model, mnt).returncode == 0
    pid = daemon_pid(mnt)
    os.kill(pid, signal.SIGKILL)
    assert wait_for(lambda: not alive(pid), 10)
    with pytest.raises(OSError) as error:
        os.listdir(mnt)
    assert error.value.errno in (errno.ENOTCONN, errno.ECONNABORTED)   # a dead daemon's
    again = run_tensorfs("mount", model, mnt)
    assert again.returncode == 1 and "already a mount point" in again.stderr
    started = time.monotonic()
    result = run_tensorfs("unmount", mnt)
    assert result.returncode == 0, result.stderr
    assert time.monotonic() - started < 5
    _clean(mnt)
    assert run_tensorfs("mount", model, mnt).returncode == 0      # and it mounts again
    assert run_tensorfs("unmount", mnt).returncode == 0
    _clean(mnt)


@pytest.fixture
def slow_model(tmp_path_factory):
    with slow_filesystem(tmp_path_factory.mktemp("slowfs"), 0.0) as (src, slow):
        write_mixed_gguf(src / "model.gguf")
        yield src, slow / "model.gguf"


def _blocked_reader(path, result: dict):
    try:
        with open(path, "rb", buffering=0) as f:
            result["data"] = f.read(1 << 20)
    except OSError as error:
        result["errno"] = error.errno
    result["at"] = time.monotonic()


def test_a_reader_blocked_in_a_read_when_the_daemon_is_killed(tmp_path, slow_model, mnt):
    src, model = slow_model
    assert run_tensorfs("mount", model, mnt).returncode == 0
    pid = daemon_pid(mnt)
    (src / "DELAY").write_text("5")                   # from now on each source read: 5 s
    result: dict = {}
    reader = threading.Thread(target=_blocked_reader, args=(mnt / "c/bf16/weight", result))
    reader.start()
    assert wait_for(lambda: waiting_on_fuse(pid), 30)  # the daemon's pread of the slow source
    assert reader.is_alive()                           # blocked in the daemon's pread
    killed = time.monotonic()
    os.kill(pid, signal.SIGKILL)
    # The daemon is gone only once its own read of the source returns: a thread waiting on
    # a FUSE request that the (slow) server already took cannot be killed before the answer,
    # up to 5 s here.  Then the reader is answered at once, with an error.
    reader.join(15)
    assert not reader.is_alive(), "the reader stayed blocked after the daemon died"
    assert result.get("errno") in (errno.ENOTCONN, errno.ECONNABORTED), result.keys()
    assert result["at"] - killed < 5 + 2
    (src / "DELAY").unlink()
    assert run_tensorfs("unmount", mnt).returncode == 0
    _clean(mnt)


def test_a_reader_waiting_on_a_hung_daemon_that_is_killed(tmp_path, mnt, model):
    """The daemon hangs (SIGSTOP); a read waits for it; SIGKILL: the read fails at once."""
    assert run_tensorfs("mount", model, mnt).returncode == 0
    pid = daemon_pid(mnt)
    os.kill(pid, signal.SIGSTOP)
    result: dict = {}
    reader = threading.Thread(target=_blocked_reader, args=(mnt / "c/bf16/weight", result))
    reader.start()
    assert wait_for(lambda: in_fuse_request(reader.native_id), 30)
    assert reader.is_alive()                    # waiting for the stopped daemon
    killed = time.monotonic()
    os.kill(pid, signal.SIGKILL)
    reader.join(10)
    assert not reader.is_alive()
    assert result.get("errno") in (errno.ENOTCONN, errno.ECONNABORTED), result.keys()
    assert result["at"] - killed < 1
    assert run_tensorfs("unmount", mnt).returncode == 0
    _clean(mnt)


def test_a_reader_blocked_in_a_read_when_the_daemon_is_told_to_stop(tmp_path, slow_model, mnt):
    """SIGTERM: the request in flight is answered first, then the mount goes."""
    src, model = slow_model
    assert run_tensorfs("mount", model, mnt).returncode == 0
    pid = daemon_pid(mnt)
    (src / "DELAY").write_text("2")
    result: dict = {}
    reader = threading.Thread(target=_blocked_reader, args=(mnt / "c/bf16/weight", result))
    reader.start()
    assert wait_for(lambda: waiting_on_fuse(pid), 30)  # the request is in the daemon's hands
    os.kill(pid, signal.SIGTERM)
    reader.join(30)
    assert not reader.is_alive()
    assert wait_for(lambda: not alive(pid), 30)
    # the read in flight got an answer: its data, or an error once the mount went
    assert "data" in result or result.get("errno") in (errno.ENOTCONN, errno.ECONNABORTED,
                                                         errno.EIO)
    (src / "DELAY").unlink()
    _clean(mnt)


# -- long work in flight: the sha256 xattr of a large tensor ------------------------------

def _ask_sha256(path, outcome: dict) -> None:
    try:
        outcome["value"] = os.getxattr(path, "user.tensorfs.sha256")
    except OSError as error:
        outcome["errno"] = error.errno


@pytest.mark.slow
@pytest.mark.parametrize("how", ["SIGTERM", "SIGINT", "unmount", "unmount --lazy"])
def test_the_mount_ends_at_once_while_a_large_tensor_is_hashed(tmp_path, mnt, how):
    """The review's case: the sha256 of a 32 GiB tensor is being computed (a minute of CPU
    here), its asker waiting for it, when the mount is told to end.  The hash is cancelled:
    the asker is answered (ECANCELED), the daemon is gone within the wait's bound, the mount
    point is clean."""
    model = tmp_path / "huge.safetensors"
    write_sparse_safetensors(model, {"t": 32 << 30})
    log = tmp_path / "daemon.log"
    assert run_tensorfs("mount", model, mnt, "--log", log, "--debug").returncode == 0
    pid = daemon_pid(mnt)
    outcome: dict = {}
    asker = threading.Thread(target=_ask_sha256, args=(mnt / "t", outcome))
    asker.start()
    assert wait_for(lambda: "sha256 of tensor 't': started" in log.read_text(), 30)
    assert asker.is_alive(), outcome            # waiting for the value
    if how == "unmount":
        # the asker is in the mount, as a cwd would be: busy, and nothing changes
        result = run_tensorfs("unmount", mnt)
        assert result.returncode == 1 and "busy" in result.stderr, result.stderr
        assert asker.is_alive() and alive(pid)
        how = "unmount --lazy"
    if how.startswith("unmount"):
        result = run_tensorfs(*how.split(), mnt)
        assert result.returncode == 0, result.stderr
    else:
        os.kill(pid, getattr(signal, how))
    assert wait_for(lambda: not alive(pid), 20), "the daemon went on hashing"
    asker.join(20)
    assert not asker.is_alive()
    assert outcome == {"errno": errno.ECANCELED}
    assert "sha256 of tensor 't': cancelled (the mount is ending)" in log.read_text()
    _clean(mnt)


@pytest.mark.slow
def test_unmount_ends_a_daemon_that_does_not_exit_and_says_so(tmp_path, mnt, model):
    """A daemon that cannot exit by itself (stopped here with SIGSTOP) once its mount is
    gone serves nothing: unmount stops it (SIGTERM, then SIGKILL) and says so in one line,
    naming its pid, instead of leaving it running."""
    assert run_tensorfs("mount", model, mnt).returncode == 0
    pid = daemon_pid(mnt)
    os.kill(pid, signal.SIGSTOP)
    try:
        result = run_tensorfs("unmount", mnt, env={**os.environ, "TENSORFS_UNMOUNT_WAIT_S": "1"})
    finally:
        if alive(pid):
            os.kill(pid, signal.SIGCONT)
    assert result.returncode == 0, result.stderr
    assert result.stderr == (f"tensorfs: {mnt}: the daemon (pid {pid}) did not exit within 1 s "
                             f"after unmount: stopped it with SIGKILL\n")
    assert not alive(pid)
    _clean(mnt)


@pytest.mark.slow
def test_ctrl_c_on_a_foreground_mount_while_a_large_tensor_is_hashed(tmp_path, mnt):
    """SIGINT (Ctrl-C) to `mount --foreground` while a 32 GiB tensor is being hashed: the
    command exits 0 within the wait, the hash cancelled, the mount point clean."""
    model = tmp_path / "huge.safetensors"
    write_sparse_safetensors(model, {"t": 32 << 30})
    log = tmp_path / "daemon.log"
    proc = subprocess.Popen([*TENSORFS, "mount", "--foreground", "--debug", "--log", str(log),
                             str(model), str(mnt)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        assert wait_for(lambda: log.exists() and "serving" in log.read_text(), 30)
        outcome: dict = {}
        asker = threading.Thread(target=_ask_sha256, args=(mnt / "t", outcome))
        asker.start()
        assert wait_for(lambda: "sha256 of tensor 't': started" in log.read_text(), 30)
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=20) == 0
        asker.join(20)
        assert outcome == {"errno": errno.ECANCELED}
        assert "sha256 of tensor 't': cancelled (the mount is ending)" in log.read_text()
        _clean(mnt)
    finally:
        if proc.poll() is None:
            proc.kill()
            subprocess.run(["fusermount", "-uz", str(mnt)], check=False)
