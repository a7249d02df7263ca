"""Daemons, readers and waits: on something observable (a process state, a log line, a
thread asleep in a FUSE request), never a fixed sleep."""

from __future__ import annotations

import errno
import os
import time

EIO = errno.EIO

# Where the kernel shows a thread waiting for a FUSE daemon's answer (fs/fuse/dev.c); not
# fuse_dev_do_read, where a daemon's idle threads wait for the next request.
_FUSE_WAITS = ("request_wait_answer", "__fuse_request_send", "fuse_simple_request",
               "fuse_request_send")


def daemon_pid(mnt) -> int:
    from tensorfs.runtime import pid_file

    with open(pid_file(str(mnt))) as f:
        return int(f.read().split()[0])


def alive(pid: int) -> bool:
    """Whether ``pid`` has not finished exiting.  A killed process's first thread shows as a
    zombie while its other threads are still exiting and holding its files (a daemon's
    /dev/fuse: its mount still connected); it is gone once no other thread is left."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            state = f.read().rsplit(b")", 1)[1].split()[0]
        if state not in (b"Z", b"X"):
            return True
        return len(os.listdir(f"/proc/{pid}/task")) > 1
    except OSError:
        return False


def read_errno(path, offset: int = 0, size: int | None = None) -> int | bytes:
    """The bytes read, or the errno the read failed with."""
    try:
        with open(path, "rb", buffering=0) as f:
            f.seek(offset)
            if size is None:
                chunks = []
                while chunk := f.read(1 << 20):
                    chunks.append(chunk)
                return b"".join(chunks)
            return f.read(size)
    except OSError as error:
        return error.errno


def direct_read(path, size: int = 4096, offset: int = 0) -> bytes:
    """One read that reaches the daemon whatever the page cache holds (O_DIRECT): what a
    wait on the daemon's own checks reads with."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
    try:
        return os.pread(fd, size, offset)
    finally:
        os.close(fd)


def wait_for(predicate, timeout: float = 10.0, step: float = 0.05):
    """``predicate()``'s first true value, asked every ``step`` seconds for at most
    ``timeout``; its last value (false) when it never became true."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(step)
    return predicate()


def _read(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return None


def in_fuse_request(tid: int, pid: int | None = None) -> bool:
    """Whether thread ``tid`` (of ``pid``, this process by default: a ``Thread.native_id``)
    is asleep waiting for a FUSE daemon's answer.  Where the kernel hides the wait channel
    (``0``), asleep in a system call is what can be told."""
    base = f"/proc/{pid or os.getpid()}/task/{tid}"
    wchan = _read(f"{base}/wchan")
    if wchan and wchan != "0":
        return wchan in _FUSE_WAITS
    stat = _read(f"{base}/stat")
    syscall = _read(f"{base}/syscall")
    return bool(stat and syscall) and stat.rsplit(")", 1)[1].split()[0] == "S" \
        and syscall.split()[0] not in ("running", "-1")


def waiting_on_fuse(pid: int) -> bool:
    """Whether a thread of process ``pid`` waits for a FUSE answer (a daemon whose own read
    of a slow FUSE source is in flight)."""
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return False
    return any(in_fuse_request(int(tid), pid) for tid in tids)


def worker_pids(pid: int) -> list[int]:
    """The conversion worker processes (tensorfs.convert.workers) of the daemon ``pid``: its
    children, as every one of its threads shows them, whose command line names the module."""
    found = []
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{task}/children") as f:
                found += [int(c) for c in f.read().split()]
        except OSError:
            pass
    return [c for c in found if b"tensorfs.convert.workers" in cmdline(c)]


def cmdline(pid: int) -> bytes:
    """``pid``'s command line (NUL-separated), or b"" once it is gone."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read()
    except OSError:
        return b""
