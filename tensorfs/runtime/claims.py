"""One owner of a directory: a store's own directory in a DIR (``--edits DIR``) that one
mount at a time may use (docs/reference/editing.md "Safety").

``claim`` takes an ``flock`` on the file ``OWNER`` in the directory, opened through the
descriptor of the directory itself, so the lock is on that directory's file however the path
to it was spelled (a symbolic link, ``..``, a bind mount).  The lock belongs to the open
file: a daemon forked after the store was opened holds it with the file it inherited, for
its whole life, and the kernel lets go of it when the last holder exits, SIGKILL included:
a dead mount never holds a directory.  The file records who holds it, one line of JSON
(``{"pid": …, "mountpoint": …}``), written by the serving process once it knows both
(``serving``, called where the daemon starts), never by a mount refused before that (it
holds another model's edits): a second mount is refused in one line naming the mount point
and the pid of the one that holds the directory.  The record is rewritten in place (the
lock is on that file: it cannot be replaced by rename), so a rewrite that fails part-way
(the disk full) puts the old record back.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import threading

from tensorfs.runtime.paths import NotOwnFile, open_own_file

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
        fd = open_own_file(dir_fd, OWNER, os.geteuid(), os.O_RDWR | os.O_CREAT)
    except NotOwnFile as why:
        raise refused(shown, f"its {why}") from None
    except OSError as error:
        raise refused(shown, f"cannot open its {OWNER} file: {error.strerror}") from None
    try:
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
            if _mountpoint is not None:     # a claim made while serving: said at once
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
        old = os.pread(fd, _RECORD_LIMIT, 0)
    except OSError:
        old = b""
    try:
        # written over the old one (padded to its length: nothing to cut first), then cut
        _write_all(fd, data + b" " * max(0, len(old) - len(data)))
        if len(old) > len(data):
            os.ftruncate(fd, len(data))
    except OSError:
        try:                        # the old record back: its bytes need no new space
            _write_all(fd, old)
            os.ftruncate(fd, len(old))
        except OSError:
            pass                    # the lock still holds: only the refusal's words are less


def _write_all(fd: int, data: bytes) -> None:
    view, at = memoryview(data), 0
    while at < len(view):
        at += os.pwrite(fd, view[at:], at)


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
