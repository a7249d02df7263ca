"""The source interface: what every source of a model's bytes is (``Source``), and the one
error a read of one raises when its bytes are gone (``SourceError``).

A *source* is one model file as served, opened once at mount and read by the parsers (the
header) and then by the views (the tensors), always the same object: what was parsed is what
is served.  ``Source`` declares what every source has and, with their defaults, the parts
only some sources have.  ``tensorfs.sources.local.ModelSource`` is the local file,
``tensorfs.sources.remote.RemoteSource`` the remote one.
"""

from __future__ import annotations

import errno
from abc import ABC, abstractmethod
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any


class SourceError(OSError):
    """The model file no longer holds the bytes it held at mount time."""

    logged = False      # True once the source has logged it (the FUSE layer then does not)



class Source(ABC):
    """One model file as served.  Every source has a ``name``, a ``size`` and the reads;
    the rest has a default here, which a source overrides where it can do more."""

    #: what pins the bytes: an ETag, S3 version id or Hub commit for a remote object; None
    #: for a local file, which is watched for changes instead
    version: str | None = None
    #: why no byte of it is served any more (it changed under the mount), or None
    broken: str | None = None
    #: a parser's growing prefix grows by at most this much per read (a remote file: what a
    #: mount fetches before the header is known), None for no limit
    prefix_step: int | None = None
    #: its bytes come over a network: a read may wait on a server, ``abort()`` ends the
    #: waits, ``blocks`` is its block cache (``tensorfs.sources.blockcache.BlockReader``)
    remote: bool = False
    blocks: Any = None

    if TYPE_CHECKING:       # an attribute or a property of each source (``size: int`` if set)
        @property
        @abstractmethod
        def name(self) -> str:
            """How it is shown: a path, or a URL without credentials."""

        @property
        @abstractmethod
        def size(self) -> int:
            """The bytes it has, as at open time."""

    @abstractmethod
    def read_into(self, offset: int, buf, span: tuple[int, int] | None = None) -> int:
        """Fill the writable buffer ``buf`` with exactly the bytes at ``offset`` (inside
        ``size``); anything else is a ``SourceError`` (EIO in the mount).  ``span``: the
        extent the reader reads in, a hint for read-ahead."""

    def read_or_wait(self, offset: int, buf, span: tuple[int, int] | None = None
                     ) -> int | Future[int]:
        """``read_into``, or, where the bytes are on their way (a remote file's blocks being
        fetched), a ``Future`` of the count, done once they came and were copied into
        ``buf`` by the thread that brought them: a read that waits without holding a
        thread.  It fails as ``read_into`` would (its deadline included); cancelling it
        (the reader is gone) stops the work no other read waits for."""
        return self.read_into(offset, buf, span)

    def read(self, offset: int, size: int) -> bytes:
        """Exactly ``size`` bytes at ``offset`` (``read_into`` into a new buffer)."""
        if size <= 0:
            return b""
        buf = bytearray(size)
        self.read_into(offset, buf)
        return bytes(buf)

    @abstractmethod
    def stat(self):
        """Owner, size and mtime to show on the mount's files (an ``os.stat_result`` or an
        object with its ``st_*`` fields)."""

    @property
    def local_fd(self) -> int | None:
        """The descriptor holding the file's bytes at their own offsets, for a reader that
        is given the descriptor rather than the bytes (splice, FUSE passthrough; a memory
        map): a local file's; None for any other source."""
        return None

    def vouch(self, offset: int = 0, size: int = 0) -> None:
        """Raise ``SourceError`` unless ``[offset, offset + size)`` still holds the bytes
        as at open time; called before ``local_fd`` is read from."""
        if self.broken:
            raise SourceError(errno.EIO, f"{self.name}: {self.broken}")

    def start(self, served_once: bool = True) -> None:
        """Called in the daemon after the fork (a remote source reopens its transport
        there: an event loop thread does not survive a fork).  ``served_once``: each byte
        is served through one file of the mount only, so the kernel's page cache keeps
        what was served; False where files/ serves the tensors' bytes again."""

    def end_parse(self, extents: list[tuple[int, int]]) -> None:
        """The parse is over; ``extents`` are the tensors' ``(offset, nbytes)``.  A source
        that kept the bytes the parse read lets them go."""

    def abort(self) -> None:
        """End the reads waiting on this source now (EIO): the mount is detached."""

    def close(self) -> None:
        """Let go of what it holds."""
