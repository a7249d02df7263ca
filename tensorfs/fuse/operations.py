"""What a filesystem answers to be served by ``tensorfs.fuse.session.Session``: one method per
request of the kernel's, by inode number, as pyfuse3's ``Operations`` has.  Every method the
session calls is declared here.

The session calls these from libfuse's threads, several at once.  A handler answers with
its return value; ``FsError(errno)`` raised by one is answered as that errno, and any other
exception goes through ``errno_of``, which maps it (and may log it).  The defaults here
answer as a read-only filesystem would: no such entry, no extended attributes, no
descriptor to hand the kernel, and EROFS to every change.

A mount without ``--edits`` is served by the first group (``lookup`` to ``listxattr``); an
editable one (``Session(editable=True)``) opens with a handle number instead
(``open_read``, ``open_write``, ``create``), reads through it (``read_handle``) and takes
the changes (``write`` to ``setxattr``).  ``fh`` is a handle number this filesystem gave at
open (0: none); the kernel sends it back with every request on that open.

A handler whose answer needs work that must not hold a libfuse thread (``getxattr``, and
the reads ``read_into`` and ``read_handle`` whose bytes are on their way) may return a
``Later`` instead: the session keeps the request and answers it when the ``Later`` is
settled, from whichever thread settles it; it gives the ``Later`` up when the caller is
interrupted or gone, or the session ends.
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

    # -- every mount ---------------------------------------------------------------------------
    def lookup(self, parent: int, name: str) -> Entry:
        """The entry ``name`` in directory ``parent`` (FUSE_LOOKUP); ``FsError(ENOENT)`` if
        there is none.  The kernel keeps the answer for the session's entry timeout."""
        raise FsError(errno.ENOENT)

    def getattr(self, ino: int, fh: int = 0) -> Entry:
        """The attributes of ``ino`` (FUSE_GETATTR, and the answer to FUSE_SETATTR): what
        ``stat`` shows; ``fh``, where the kernel names an open, the size that open sees
        (a file being written)."""
        raise FsError(errno.ENOENT)

    def listing(self, ino: int) -> list[tuple[str, Entry]]:
        """The entries of directory ``ino`` after "." and "..", as ``(name, Entry)``
        (FUSE_READDIRPLUS).  An ``Entry`` of size None is listed without attributes (the
        kernel asks ``getattr`` when it needs them).  ``FsError(ENOTDIR)`` for a file."""
        raise FsError(errno.ENOTDIR)

    def open(self, ino: int) -> int | None:
        """May file ``ino`` be opened (FUSE_OPEN, read-only mount)?  Raise to refuse
        (``FsError(EISDIR)``, EIO for a file changed under the mount).  A descriptor holding
        all of its bytes at their own offsets lets the kernel read it itself (FUSE
        passthrough, where the kernel and libfuse have it); None: reads come here."""
        return None

    def read_fd(self, ino: int, offset: int, size: int) -> tuple[int, int, int] | None:
        """``(fd, pos, n)``: the bytes of ``ino`` at ``offset`` are ``n`` bytes of ``fd`` at
        ``pos``, for a reply that names them (splice) rather than copying them through
        Python; None: the read goes to ``read_into``."""
        return None

    def read_into(self, ino: int, offset: int, buf: memoryview) -> int | Later:
        """Copy the bytes of ``ino`` at ``offset`` into ``buf`` (FUSE_READ): how many; fewer
        than ``len(buf)`` only at the end of the file.  A ``Later`` settled with the count
        where the bytes are on their way: ``buf`` is the session's until then (it is filled
        before the ``Later`` is answered, and not reused if it is given up)."""
        raise FsError(errno.EIO)

    def getxattr(self, ino: int, name: str) -> bytes | Later:
        """The extended attribute ``name`` of ``ino`` (FUSE_GETXATTR): ``FsError(ENODATA)``
        if it has none of that name, ``FsError(EOPNOTSUPP)`` for a namespace it does not
        serve; a ``Later`` settled with the bytes where they need long work."""
        raise FsError(errno.ENODATA)

    def listxattr(self, ino: int) -> list[str]:
        """The names of the extended attributes of ``ino`` (FUSE_LISTXATTR)."""
        return []

    # -- an editable mount: opens with a handle ------------------------------------------------
    def open_read(self, ino: int) -> int:
        """Open file ``ino`` for reading (FUSE_OPEN, O_RDONLY): the handle number its reads
        come with, 0 for none.  Refused as ``open`` refuses."""
        self.open(ino)
        return 0

    def read_handle(self, ino: int, fh: int, offset: int, buf: memoryview) -> int | Later:
        """FUSE_READ through the open ``fh``: as ``read_into`` (a ``Later`` included), the
        bytes that open sees (its version of a file, a write session's bytes)."""
        return self.read_into(ino, offset, buf)

    def open_write(self, ino: int, truncate: bool) -> int:
        """Open file ``ino`` for writing (FUSE_OPEN, O_WRONLY or O_RDWR; ``truncate``:
        O_TRUNC): its handle number.  ``FsError(EROFS)`` where nothing is writable,
        EACCES for a file that is not, EISDIR for a directory."""
        raise FsError(errno.EROFS)

    def create(self, parent: int, name: str) -> tuple[Entry, int]:
        """Make file ``name`` in directory ``parent``, open for writing (FUSE_CREATE): its
        entry and handle number.  EEXIST if it exists, EPERM where no file may be made."""
        raise FsError(errno.EROFS)

    def write(self, ino: int, fh: int, offset: int, data: bytes) -> int:
        """Write ``data`` at ``offset`` through the open ``fh`` (FUSE_WRITE): how many bytes
        were taken (all of them).  EFBIG past what the file may hold, EINVAL for text its
        key cannot hold, EBADF for an open not for writing."""
        raise FsError(errno.EROFS)

    def flush(self, ino: int, fh: int) -> None:
        """A ``close()`` of a descriptor of the open ``fh`` (FUSE_FLUSH); what it raises is
        what ``close`` returns.  A file being written takes effect here."""

    def fsync(self, ino: int, fh: int) -> None:
        """``fsync``, ``fdatasync`` or ``msync`` of the open ``fh`` (FUSE_FSYNC); what it
        raises is what the call returns."""

    def release(self, ino: int, fh: int) -> None:
        """The open ``fh`` is gone: no descriptor and no memory map holds it (FUSE_RELEASE).
        Nobody hears its answer."""

    def truncate(self, ino: int, size: int, fh: int) -> None:
        """Make ``ino`` ``size`` bytes long (FUSE_SETATTR with a size; ``fh``: the open it
        came through, 0 for ``truncate PATH``).  EINVAL where the size cannot change."""
        raise FsError(errno.EROFS)

    def unlink(self, parent: int, name: str) -> None:
        """Remove file ``name`` of directory ``parent`` (FUSE_UNLINK): ENOENT, EISDIR, EPERM
        as a disk filesystem answers."""
        raise FsError(errno.EROFS)

    def rmdir(self, parent: int, name: str) -> None:
        """Remove the empty directory ``name`` of ``parent`` (FUSE_RMDIR): ENOTEMPTY,
        ENOTDIR, EPERM."""
        raise FsError(errno.EROFS)

    def rename(self, parent: int, name: str, new_parent: int, new_name: str) -> None:
        """Move ``name`` of ``parent`` to ``new_name`` of ``new_parent`` (FUSE_RENAME, no
        flags): EEXIST, EXDEV, EPERM, EINVAL where it cannot."""
        raise FsError(errno.EROFS)

    def forget(self, ino: int) -> None:
        """The kernel holds ``ino`` no more (an editable mount's: every lookup of it was
        forgotten, FUSE_FORGET): no request names it again until a lookup answers it anew.
        ``Session.kernel_holds(ino)`` says whether it still may."""

    def setxattr(self, ino: int, name: str, value: bytes) -> None:
        """Set the extended attribute ``name`` of ``ino`` (FUSE_SETXATTR): EPERM for a
        ``user.`` name it does not take, EOPNOTSUPP for another namespace."""
        raise FsError(errno.EROFS)
