"""One owner of a directory: a store's own directory in a DIR (``--edits DIR``) that one
mount at a time may use (docs/reference/editing.md "Safety").

``claim`` takes an ``flock`` on the file ``OWNER`` in the directory, opened through the
descriptor of the directory itself, so the lock is on that directory's file however the path
to it was spelled (a symbolic link, ``..``, a bind mount).  The lock belongs to the open
file: a daemon forked after the store was opened holds it with the file it inherited, for
its whole life, and the kernel lets go of it when the last holder exits, SIGKILL included:
a dead mount never holds a directory.  The file records who holds it, one line of JSON
(``{"pid": …, "mountpoint": …}``), rewritten by the serving process once it knows both
(``serving``, called where the daemon starts): a second mount is refused in one line
naming the mount point and the pid of the one that holds the directory.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import stat
import threading

OWNER = "owner"
_RECORD_LIMIT = 4096

_lock = threading.Lock()
_held: list[int] = []               # this process's claims (inherited over a fork)
_mountpoint: str | None = None      # what this process serves, once it is known


def claim(dir_fd: int, shown: str, refused) -> int:
    """Hold the directory ``dir_fd`` (shown as ``shown``) for this process and those it
    forks; returns the descriptor that holds it (``release`` lets go).  A directory held by
    another live process is refused: ``refused(shown, why)`` makes the exception raised,
    ``why`` names the holder (``in use by the mount at /m (pid 123): …``)."""
    try:
        fd = os.open(OWNER, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NOCTTY
                     | os.O_NONBLOCK, 0o600, dir_fd=dir_fd)
    except OSError as error:
        raise refused(shown, f"cannot open its {OWNER} file: {error.strerror}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
            raise refused(shown, f"its {OWNER} file is not a file of the user's own")
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise refused(shown, _holder(fd)) from None
        except OSError as error:
            if error.errno not in (errno.ENOLCK, errno.EOPNOTSUPP):
                raise refused(shown, f"cannot lock it: {error.strerror}") from None
            # a filesystem without locks (some network ones): nothing to hold, nothing held
        with _lock:
            _held.append(fd)
            _record(fd)
        return fd
    except BaseException:
        if fd not in _held:
            os.close(fd)
        raise


def release(fd: int) -> None:
    """Let go of a claim of this process (its forks' copies let go when they close or
    exit)."""
    with _lock:
        if fd in _held:
            _held.remove(fd)
        else:
            return
    try:
        os.close(fd)
    except OSError:
        pass


def serving(mountpoint: str) -> None:
    """This process serves ``mountpoint``: each claim it holds says so, with its pid (the
    daemon's, after the fork), and later claims will too."""
    global _mountpoint
    with _lock:
        _mountpoint = mountpoint
        for fd in _held:
            _record(fd)


def _record(fd: int) -> None:
    """Write who holds the claim (the lock held)."""
    data = json.dumps({"pid": os.getpid(), "mountpoint": _mountpoint},
                      ensure_ascii=True).encode() + b"\n"
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, data, 0)
    except OSError:
        pass                        # the lock still holds: only the refusal's words are less


def _holder(fd: int) -> str:
    """Who holds the claim, in words, from the file's record."""
    try:
        record = json.loads(os.pread(fd, _RECORD_LIMIT, 0) or b"null")
    except (OSError, ValueError):
        record = None
    record = record if isinstance(record, dict) else {}
    pid = record.get("pid") if type(record.get("pid")) is int else None
    mountpoint = record.get("mountpoint") if isinstance(record.get("mountpoint"), str) else None
    who = (f"the mount at {mountpoint}" if mountpoint else "another tensorfs process") + \
        (f" (pid {pid})" if pid is not None else "")
    return (f"in use by {who}: one mount at a time uses a directory (unmount it first, or "
            "give this mount another directory)")
