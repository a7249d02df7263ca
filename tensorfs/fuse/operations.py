"""What a filesystem answers to be served by ``tensorfs.fuse.session.Session``: one method per
request of the kernel's, by inode number, as pyfuse3's ``Operations`` has.

The session calls these from libfuse's threads, several at once.  A handler answers with
its return value; ``FsError(errno)`` raised by one is answered as that errno, and any other
exception goes through ``errno_of``, which maps it (and may log it).  The defaults here
answer as a filesystem without the feature would: no such entry, no extended attributes,
no descriptor to hand the kernel.

A handler whose answer needs work that must not hold a libfuse thread (``getxattr``) may
return a ``Later`` instead: the session keeps the request and answers it when the ``Later``
is settled, from whichever thread settles it.
"""

from __future__ import annotations

import errno
import os
import threading
from collections.abc import Callable
from typing import NamedTuple


class FsError(OSError):
    """A deliberate answer (ENOENT, ENOTDIR, ENODATA ...), sent as it is."""

    def __init__(self, code: int):
        super().__init__(code, os.strerror(code))


class Entry(NamedTuple):
    """What ``stat`` says of one node.  The rest (owner, times, block size) is the same for
    every node of a mount and given to ``Session``.  In a listing, ``size`` None means "not
    known without work": that entry goes without attributes and the kernel looks it up.
    ``mtime_ns``: the node's own mtime (a file of files/), else the mount's; ``owner``:
    the node's own (mode bits, uid, gid) (a local file of files/), else the mount's."""
    ino: int
    is_dir: bool
    size: int | None
    nlink: int
    mtime_ns: int | None = None
    owner: tuple[int, int, int] | None = None
    writable: bool = False          # an editable mount's file or directory: the owner may write


class Later:
    """An answer that comes later.  Whoever does the work calls ``answer(value)`` or
    ``fail(exc)`` (any thread, once; later calls do nothing).  The session hands it the
    delivery with ``deliver_to`` and calls ``give_up(errno)`` when the request ends
    without it: the caller was interrupted (EINTR: a signal, a killed process) or the
    session is ending (ECANCELED).  ``on_give_up(later, errno)`` (given by the work's
    owner) hears of that once, so that work no one waits for any more can stop."""

    def __init__(self, on_give_up: Callable[[Later, int], None] | None = None):
        self._lock = threading.Lock()
        self._outcome: tuple[bool, object] | None = None    # (ok, value or exception)
        self._deliver: Callable[[bool, object], None] | None = None
        self._on_give_up = on_give_up

    def answer(self, value) -> None:
        self._settle(True, value)

    def fail(self, exc: BaseException) -> None:
        self._settle(False, exc)

    def give_up(self, code: int) -> None:
        if self._settle(False, FsError(code)) and self._on_give_up is not None:
            self._on_give_up(self, code)

    def deliver_to(self, deliver: Callable[[bool, object], None]) -> None:
        """``deliver(ok, value_or_exception)`` once, now if settled already."""
        with self._lock:
            self._deliver, outcome = deliver, self._outcome
        if outcome is not None:
            deliver(*outcome)

    def _settle(self, ok: bool, value) -> bool:
        with self._lock:
            if self._outcome is not None:
                return False
            self._outcome, deliver = (ok, value), self._deliver
        if deliver is not None:
            deliver(ok, value)
        return True


class Operations:
    """The handlers a ``Session`` calls; a filesystem subclasses this and overrides what it
    serves.  ``ino`` is an inode number the filesystem gave out (1 is the root)."""

    def errno_of(self, exc: BaseException) -> int:
        """The errno to answer for ``exc``, an exception a handler raised that is not an
        ``FsError`` (which is answered as it is).  Logging it is the filesystem's choice."""
        return errno.EIO

    def lookup(self, parent: int, name: str) -> Entry:
        """The entry ``name`` in directory ``parent`` (FUSE_LOOKUP); ``FsError(ENOENT)`` if
        there is none.  The kernel keeps the answer for the session's entry timeout."""
        raise FsError(errno.ENOENT)

    def getattr(self, ino: int) -> Entry:
        """The attributes of ``ino`` (FUSE_GETATTR): what ``stat`` shows."""
        raise FsError(errno.ENOENT)

    def listing(self, ino: int) -> list[tuple[str, Entry]]:
        """The entries of directory ``ino`` after "." and "..", as ``(name, Entry)``
        (FUSE_READDIRPLUS).  An ``Entry`` of size None is listed without attributes (the
        kernel asks ``getattr`` when it needs them)."""
        raise FsError(errno.ENOTDIR)

    def open(self, ino: int) -> int | None:
        """May file ``ino`` be opened (FUSE_OPEN)?  Raise to refuse.  A descriptor holding
        all of its bytes at their own offsets lets the kernel read it itself (FUSE
        passthrough, where the kernel and libfuse have it); None: reads come here."""
        return None

    def read_fd(self, ino: int, offset: int, size: int) -> tuple[int, int, int] | None:
        """``(fd, pos, n)``: the bytes of ``ino`` at ``offset`` are ``n`` bytes of ``fd`` at
        ``pos``, for a reply that names them (splice) rather than copying them through
        Python; None: the read goes to ``read_into``."""
        return None

    def read_into(self, ino: int, offset: int, buf: memoryview) -> int:
        """Copy the bytes of ``ino`` at ``offset`` into ``buf`` (FUSE_READ): how many; fewer
        than ``len(buf)`` only at the end of the file."""
        raise FsError(errno.EIO)

    def getxattr(self, ino: int, name: str) -> bytes | Later:
        """The extended attribute ``name`` of ``ino``: ``FsError(ENODATA)`` if it has none
        of that name, ``FsError(EOPNOTSUPP)`` for a namespace it does not serve; a
        ``Later`` settled with the bytes where they need long work."""
        raise FsError(errno.ENODATA)

    def listxattr(self, ino: int) -> list[str]:
        """The names of the extended attributes of ``ino``."""
        return []
