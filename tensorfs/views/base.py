"""The base of every view (a file of the mount): ``View``, the interface each view
implements, with the defaults its callers rely on, and the two helpers every view's reads
share.  The views themselves: ``tensorfs.views.byteviews`` (a source's bytes, generated
content, .npy files, converted tensors); elsewhere, those made where their content is known
(``tensorfs.loading.wholefiles``: a file of files/; ``tensorfs.mount``: an edited model's)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from concurrent.futures import Future
from typing import TYPE_CHECKING


def _clip(offset: int, size: int, total: int) -> tuple[int, int]:
    if offset >= total or size <= 0:
        return total, 0
    return offset, min(size, total - offset)


def _copy_into(buf: memoryview, data) -> int:
    n = min(len(buf), len(data))
    buf[:n] = memoryview(data)[:n]
    return n


class View(ABC):
    """What every file of the mount is: ``size`` bytes, read by ``read``.  The rest has a
    default here, which a view overrides where it can do more."""

    # Each of these is a class attribute, an attribute set by the view (declared at class
    # level: ``size: int``) or a property: the type checker reads them as properties.
    if TYPE_CHECKING:
        @property
        @abstractmethod
        def size(self) -> int:
            """How many bytes the file has."""

        @property
        def cheap_size(self) -> bool:
            """``size`` costs next to nothing (a listing then gives it unasked); False
            where it may have to generate content first."""

        @property
        def mtime_ns(self) -> int | None:
            """The file's own mtime, or None for the mount's."""

        @property
        def owner(self) -> tuple[int, int, int] | None:
            """The file's own (mode bits, uid, gid) -- a local file of files/ keeps its
            source's -- or None for the mount's."""
    else:
        cheap_size = True
        mtime_ns = None
        owner = None

    @abstractmethod
    def read(self, offset: int, size: int) -> bytes:
        """At most ``size`` bytes at ``offset`` (fewer past the end)."""

    def read_into(self, offset: int, buf: memoryview) -> int:
        """The same bytes written into the writable buffer ``buf``; how many."""
        return _copy_into(buf, self.read(offset, len(buf)))

    def read_or_wait(self, offset: int, buf: memoryview) -> int | Future[int]:
        """``read_into``, or a ``Future`` of the count where the bytes are on their way
        (``Source.read_or_wait``: a remote tensor's, a whole remote file's): done once they
        are in ``buf``; cancelling it stops the work no other read waits for.  A view that
        makes its bytes (converted, generated) reads them here, waiting."""
        return self.read_into(offset, buf)

    def open(self) -> int | None:
        """Called at each open: raise to refuse it (a file changed since the mount: EIO);
        a descriptor holding all of the file's bytes at their own offsets, for the kernel
        to read itself (FUSE passthrough), or None."""
        return None

    def read_fd(self, offset: int, size: int) -> tuple[int, int, int] | None:
        """(descriptor, offset in it, count) of the bytes at ``offset``, checked as a read
        would be, for a reply that names them rather than copying them (splice); None
        where they are not in a local file."""
        return None

    def snapshot(self) -> View | None:
        """What an open of this file reads for its whole life, where that is fixed at open
        (a version of an edited model file: ``tensorfs.mount.editversions.ComposedView``);
        None: each read reads the file as it is then."""
        return None
