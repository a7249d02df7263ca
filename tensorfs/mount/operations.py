"""What a filesystem answers to be served by ``tensorfs.mount.fuse3.Session``: one method per
request of the kernel's, by inode number, as pyfuse3's ``Operations`` has.

The session calls these from libfuse's threads, several at once.  A handler answers with
its return value; ``FsError(errno)`` raised by one is answered as that errno, and any other
exception goes through ``errno_of``, which maps it (and may log it).  The defaults here
answer as a filesystem without the feature would: no such entry, no extended attributes,
no descriptor to hand the kernel.
"""

from __future__ import annotations

import errno

from tensorfs.mount.fuse3 import Entry, FsError


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

    def getxattr(self, ino: int, name: str) -> bytes:
        """The extended attribute ``name`` of ``ino``: ``FsError(ENODATA)`` if it has none
        of that name, ``FsError(EOPNOTSUPP)`` for a namespace it does not serve."""
        raise FsError(errno.ENODATA)

    def listxattr(self, ino: int) -> list[str]:
        """The names of the extended attributes of ``ino``."""
        return []
