"""The opens of an editable mount's files (``--edits DIR``, docs/reference/editing.md): what the FUSE
adapter keeps under a handle number and calls by type.  ``OpenFile`` is the interface;
``ReadHandle`` reads a version of a file of ``files/`` or the file as it is, and a
``WriteHandle`` per kind of file holds the bytes being written (``MetadataWrite``: a key's
new text or a scratch file's bytes; ``NpyWrite``: an ``.npy`` written over a tensor;
``RawWrite``: a tensor's new raw bytes in a file of the edit store) and hands them to its
``owner`` when they are to become the edit (``flush``, ``fsync``, the last ``release``).

``HandleOwner`` declares every call a handle makes back: the tree-side editor
(``tensorfs.mount.editable.Editor``) implements it and passes itself to each handle it
makes; this module imports nothing of it.  Scratch files of ``metadata/`` (``Scratch``,
``ScratchView``) are here too: their bytes are a handle's buffer, written in place.
"""

from __future__ import annotations

import errno
import threading
import time
from abc import ABC, abstractmethod
from concurrent.futures import Future
from contextlib import AbstractContextManager
from typing import Protocol

from tensorfs.editing.session import EditRefused
from tensorfs.editing.store import PendingData
from tensorfs.formats.metadata_text import TextError, parse_text
from tensorfs.views.base import View
from tensorfs.views.names import FileNode

# Files of metadata/ not yet keys (a tool's temporary, swap and backup files): at most this
# many (``Editor.create``), holding at most this much in all.
MAX_SCRATCH_FILES = 64
MAX_SCRATCH_BYTES = 64 << 20
# held while a scratch file grows: the check of what all of them hold and the growth are one
# step, whichever of their handles grow at once (each handle's own lock covers only itself)
_SCRATCH_GROWTH = threading.Lock()


class HandleOwner(Protocol):
    """What a handle calls back on: the editor that made it (``Editor``, passed as
    ``owner``).  Each call is a request of the handle's own open reaching the tree side."""

    def editing(self) -> AbstractContextManager[None]:
        """One change at a time (the edits' lock), the changed nodes told afterwards."""

    def size_now(self, node: FileNode) -> int:
        """A file's size as every open sees it."""

    def read_now(self, node: FileNode, offset: int, buf: memoryview) -> int:
        """A file's bytes as every open sees them."""

    def closed(self, handle: ReadHandle) -> None:
        """A reader let go (FUSE_RELEASE of a ``ReadHandle``)."""

    def release(self, handle: WriteHandle) -> None:
        """One open of a write session let go (FUSE_RELEASE of a ``WriteHandle``)."""

    def refused(self, handle: WriteHandle, closing: bool) -> None:
        """A write session's bytes refused (a write, or ``closing``, a close;
        ``WriteHandle.discard`` done): what any reader or the kernel holds of them goes
        (the editor's lock held)."""

    def scratch_bytes(self) -> int:
        """The bytes every scratch file of metadata/ holds."""

    def new_data(self) -> PendingData:
        """A new file of the edit store for a tensor's bytes being written."""

    def keep_metadata(self, handle: MetadataWrite) -> None:
        """A metadata file's text made the key's value (or a scratch file a key)."""

    def keep_npy(self, handle: NpyWrite) -> None:
        """An ``.npy`` written made the tensor's bytes."""

    def keep_raw(self, handle: RawWrite) -> None:
        """A raw file's bytes written made the tensor's bytes."""


def copy_into(view: View, pending: PendingData) -> None:
    """A view's bytes into a file of the edit store (a raw file written in part)."""
    at, step = 0, 1 << 20
    while at < view.size:
        data = view.read(at, step)
        if not data:
            break
        pending.pwrite(at, data)
        at += len(data)


class OpenFile(ABC):
    """One open of a file of an editable mount: what the FUSE adapter holds under the
    handle number it gives the kernel, and calls for every request on that open."""

    #: the node opened
    node: FileNode

    @property
    @abstractmethod
    def size(self) -> int:
        """The file's size as this open sees it."""

    @abstractmethod
    def read_into(self, offset: int, buf: memoryview) -> int:
        """The bytes at ``offset`` as this open sees them, into ``buf``: how many (fewer
        only at the end)."""

    def read_or_wait(self, offset: int, buf: memoryview) -> int | Future[int]:
        """``read_into``, or a ``Future`` of the count where the bytes are on their way
        (``View.read_or_wait``)."""
        return self.read_into(offset, buf)

    def flush(self) -> None:
        """A ``close()`` of a descriptor of this open (FUSE_FLUSH)."""

    def fsync(self) -> None:
        """``fsync``/``msync`` of this open (FUSE_FSYNC)."""

    def release(self) -> None:
        """The last descriptor and map of this open are gone (FUSE_RELEASE)."""


def _within(view: View, offset: int, buf: memoryview) -> memoryview:
    """The part of ``buf`` a read at ``offset`` of ``view`` fills: none past its end."""
    return buf[:max(0, min(len(buf), view.size - offset))]


class ReadHandle(OpenFile):
    """A file opened for reading.  ``snapshot``: the bytes this open reads for its life (a
    version of a file of files/, ``View.snapshot``), or None: the file as it is at each
    read, a write session's bytes included (``HandleOwner.read_now``)."""

    def __init__(self, owner: HandleOwner, node: FileNode, snapshot: View | None):
        self.owner = owner
        self.node = node
        self.snapshot = snapshot

    @property
    def size(self) -> int:
        if self.snapshot is not None:
            return self.snapshot.size
        return self.owner.size_now(self.node)

    def read_into(self, offset: int, buf: memoryview) -> int:
        held = self.snapshot
        if held is None:
            return self.owner.read_now(self.node, offset, buf)
        return held.read_into(offset, _within(held, offset, buf))

    def read_or_wait(self, offset: int, buf: memoryview) -> int | Future[int]:
        held = self.snapshot
        if held is None:
            return self.owner.read_now(self.node, offset, buf)
        return held.read_or_wait(offset, _within(held, offset, buf))

    def release(self) -> None:
        self.owner.closed(self)


class WriteHandle(OpenFile):
    """A file open for writing: one per file, shared by every open of it for writing (as a
    disk file's bytes are), and read by every open of it until the last one is released
    (``HandleOwner.read_now``).  Each ``close`` makes the bytes written so far the edit
    (``flush``, ``fsync``); so does the last release, for writes that came after the last
    close (a shared memory map written after ``close``, written back at ``munmap``).
    ``limit``: the most bytes the file may hold.

    A refused edit is never seen.  A write refused (text that does not read, the disk full)
    leaves the bytes as they were before it (``_undo``), and every later close of the
    session fails with it (``refusal``) until the file is truncated to nothing (a new
    start).  A close refused (``flush``: the edit not kept) leaves the bytes to this
    session's opens where they were refused for what they are (a later close tries them
    again: ``sh`` closes a ``dup`` before it writes), and lets go of them where the store
    could not keep them (the disk full: DIR is as it was when the close answers); either
    way no other open sees them from the moment it answers, whenever this session's
    FUSE_RELEASE comes (``HandleOwner.refused``)."""

    def __init__(self, owner: HandleOwner, node: FileNode, limit: int):
        self.owner = owner
        self.node = node
        self.limit = limit
        self.opens = 1
        self.dirty = False
        self.refusal: OSError | None = None     # a write refused (until a new start)
        self.reported = False       # the last close was refused, and said so
        self.lock = threading.Lock()

    # -- what each kind of file does -------------------------------------------------------
    @abstractmethod
    def _write(self, offset: int, data: bytes) -> None:
        """Put ``data`` at ``offset`` (inside ``limit``)."""

    @abstractmethod
    def _truncate(self, size: int) -> None:
        """Make the file ``size`` bytes long (inside ``limit``)."""

    @abstractmethod
    def _keep(self) -> None:
        """Make the bytes written the edit (the editor's lock held): ``EditRefused`` if
        they cannot be."""

    @abstractmethod
    def _undo(self, state: object) -> None:
        """Back to ``state`` (what ``_mark`` gave before a write that failed)."""

    def _mark(self) -> object:
        """What ``_undo`` needs to put the bytes back as they are now (before a write)."""
        return None

    def discard(self) -> None:
        """Let go of the bytes written and not kept (the handle's lock held): at the last
        release."""

    # -- the calls -------------------------------------------------------------------------
    def write(self, offset: int, data: bytes) -> int:
        end = offset + len(data)
        if end > self.limit:
            raise EditRefused(errno.EFBIG, f"a write past the end ({end} > {self.limit} bytes)")
        with self.lock:
            mark = self._mark()
            try:
                self._write(offset, data)
            except OSError as error:
                self._undo(mark)
                self.refusal, self.dirty = error, True
                refused = error
            else:
                self.dirty, self.reported = True, False
                return len(data)
        self._said_refused()
        raise refused

    def truncate(self, size: int) -> None:
        if size > self.limit:
            raise EditRefused(errno.EFBIG, f"{size} bytes: more than the file may hold")
        with self.lock:
            mark = self._mark()
            try:
                self._truncate(size)
            except OSError as error:
                self._undo(mark)
                self.refusal, self.dirty = error, True
                refused = error
            else:
                if size == 0:
                    self.refusal = None             # a new start
                self.dirty, self.reported = True, False
                return
        self._said_refused()
        raise refused

    def _said_refused(self) -> None:
        """A write refused: the kernel drops what it holds of the file (the editor's lock
        is not held while writing: a tensor's first write copies its bytes)."""
        with self.owner.editing():
            self.owner.refused(self, False)

    def flush(self) -> None:
        if not self.dirty:
            return
        with self.owner.editing(), self.lock:
            if not self.dirty:
                return
            refusal = self.refusal
            try:
                if refusal is not None:
                    raise EditRefused(refusal.errno or errno.EIO,
                                      f"{refusal.strerror or refusal} (a write was refused)")
                self._keep()
            except OSError as error:
                if not isinstance(error, EditRefused):
                    # the store could not keep them (the disk full): the bytes go now, so
                    # that DIR is as it was when the close answers, and every later close
                    # of the session says so
                    self.discard()
                    self.refusal = error
                # no other open sees what the close refused, from now on
                self.reported = True
                self.owner.refused(self, True)
                raise
            self.dirty = False

    def fsync(self) -> None:
        self.flush()

    def release(self) -> None:
        self.owner.release(self)


class _BufferedWrite(WriteHandle):
    """A file whose new bytes are held in memory until kept (a metadata file's text, an
    ``.npy``).  ``unread``: opened without O_TRUNC, its current bytes not read yet (read at
    the first write)."""

    def __init__(self, owner: HandleOwner, node: FileNode, limit: int, truncate: bool):
        super().__init__(owner, node, limit)
        self.buf = bytearray()
        self.unread = not truncate

    def discard(self) -> None:
        self.buf = bytearray()
        self.unread = True

    def _undo(self, state: object) -> None:
        # only a metadata file's write is refused once it changed the bytes (its scalar's
        # text): nothing to undo here (``MetadataWrite._mark``)
        pass

    def _read_now(self, upto: int | None = None) -> None:
        if self.unread:
            view = self.node.view
            self.buf = bytearray(view.read(0, view.size if upto is None else min(upto, view.size)))
            self.unread = False

    def _write(self, offset: int, data: bytes) -> None:
        self._read_now()
        if offset > len(self.buf):
            self.buf.extend(bytes(offset - len(self.buf)))
        self.buf[offset:offset + len(data)] = data

    def _truncate(self, size: int) -> None:
        self._read_now(size)
        del self.buf[size:]
        self.buf.extend(bytes(size - len(self.buf)))

    @property
    def size(self) -> int:
        return self.node.view.size if self.unread else len(self.buf)

    def read_into(self, offset: int, buf: memoryview) -> int:
        with self.lock:
            if self.unread:
                return self.node.view.read_into(offset, buf)
            part = memoryview(self.buf)[offset:offset + len(buf)]
            buf[:len(part)] = part
            return len(part)


_UNREAD = object()          # a write session's bytes not read yet (``MetadataWrite._mark``)


class MetadataWrite(_BufferedWrite):
    """``metadata/KEY`` open for writing: its new text, read in ``type_name`` when kept.
    ``key`` None: a scratch file of metadata/ (``Editor._scratch_handle``: its ``buf`` is
    the scratch file's bytes, written in place), a key only once closed under a key name.
    ``created``: a key that exists only once this text is kept."""

    def __init__(self, owner: HandleOwner, node: FileNode, limit: int, truncate: bool,
                 key: str | None, type_name: str, created: bool = False):
        super().__init__(owner, node, limit, truncate)
        self.key = key
        self.type_name = type_name
        self.created = created

    def _write(self, offset: int, data: bytes) -> None:
        end = offset + len(data)
        if self.key is None and end > len(self.buf):
            with _SCRATCH_GROWTH:
                self._room_for(end)
                super()._write(offset, data)
        else:
            super()._write(offset, data)
        if self._scalar() and self.buf.endswith(b"\n"):
            # a scalar's one line is complete: text that does not read fails the write
            # itself, which the shell reports (`echo two > KEY`: it ignores close)
            try:
                parse_text(self.type_name, bytes(self.buf))
            except TextError as error:
                what = "the key keeps its value" if self.key is not None else "not a key"
                raise EditRefused(errno.EINVAL, f"metadata/{self.key or 'file'}: {error} "
                                  f"({what})") from None

    def _truncate(self, size: int) -> None:
        if self.key is None and size > len(self.buf):
            with _SCRATCH_GROWTH:           # a truncate that lengthens is a write of zeros
                self._room_for(size)
                super()._truncate(size)
        else:
            super()._truncate(size)

    def _room_for(self, end: int) -> None:
        """ENOSPC unless this scratch file may grow to ``end`` bytes (``_SCRATCH_GROWTH``
        held)."""
        if self.owner.scratch_bytes() + end - len(self.buf) > MAX_SCRATCH_BYTES:
            raise EditRefused(errno.ENOSPC, f"files of metadata/ not yet keys hold "
                              f"{MAX_SCRATCH_BYTES >> 20} MiB at most")

    def discard(self) -> None:
        if self.key is not None:        # a scratch file's bytes are the file's, kept
            super().discard()

    def _scalar(self) -> bool:
        return self.type_name != "string" and not self.type_name.startswith("array")

    def _mark(self) -> object:
        # a scalar's text, refused once its line is complete: kept to be put back (it is
        # short); any other text is never refused after it changed
        if not self._scalar():
            return None
        return _UNREAD if self.unread else bytes(self.buf)

    def _undo(self, state: object) -> None:
        if state is _UNREAD:
            self.discard()
        elif isinstance(state, bytes):
            self.buf[:] = state                 # in place: a scratch file's bytes are its

    def _keep(self) -> None:
        self.owner.keep_metadata(self)


class NpyWrite(_BufferedWrite):
    """A tensor's ``.npy`` open for writing: a ``numpy.save`` file, stored in the tensor's
    type when kept.  ``tensor``: the tensor's original name."""

    def __init__(self, owner: HandleOwner, node: FileNode, limit: int, truncate: bool,
                 tensor: str):
        super().__init__(owner, node, limit, truncate)
        self.tensor = tensor

    def _keep(self) -> None:
        self.owner.keep_npy(self)


class RawWrite(WriteHandle):
    """A tensor's raw file open for writing: its new bytes in a file of the edit store
    (``PendingData``), a copy of its bytes made at the first write that does not replace
    them all; kept at its size only.  ``tensor``: the tensor's original name."""

    def __init__(self, owner: HandleOwner, node: FileNode, limit: int, truncate: bool,
                 tensor: str):
        super().__init__(owner, node, limit)
        self.tensor = tensor
        self.pending: PendingData | None = owner.new_data() if truncate else None

    def _started(self, copy_upto: int) -> PendingData:
        pending = self.pending
        if pending is None:
            pending = self.pending = self.owner.new_data()
            if copy_upto:
                copy_into(self.node.view, pending)
        return pending

    def _write(self, offset: int, data: bytes) -> None:
        self._started(1).pwrite(offset, data)

    def _truncate(self, size: int) -> None:
        self._started(size).truncate(size)

    def _keep(self) -> None:
        self.owner.keep_raw(self)

    def _undo(self, state: object) -> None:
        # the bytes of a write cut short by the disk, or of a copy, cannot be taken back:
        # all go (the close fails: ``refusal``); the next write starts again from a copy
        self.discard()

    def discard(self) -> None:
        if self.pending is not None:
            self.pending.drop()
            self.pending = None

    @property
    def size(self) -> int:
        pending = self.pending
        return self.node.view.size if pending is None else pending.size

    def read_into(self, offset: int, buf: memoryview) -> int:
        with self.lock:
            pending = self.pending
            if pending is None:
                return self.node.view.read_into(offset, buf)
            return pending.read_into(offset, buf)


class ScratchView(View):
    """A scratch file of metadata/: its bytes, in memory, changed in place by its writers."""

    cheap_size = True

    def __init__(self, data: bytearray | None = None):
        self.data = bytearray() if data is None else data
        self.mtime_ns = time.time_ns()

    @property
    def size(self) -> int:
        return len(self.data)

    def read(self, offset: int, size: int) -> bytes:
        return bytes(self.data[offset:offset + size])


class Scratch:
    """A file made in metadata/ that is not a key (yet): its name, its bytes (``view``), the
    type given by ``user.tensorfs.type`` (None: a string, or the type of the key it replaces),
    and the handle that created it while that is open."""

    def __init__(self, name: str, node: FileNode, view: ScratchView, type_name: str | None):
        self.name = name
        self.node = node
        self.view = view
        self.type_name = type_name
        self.handle: MetadataWrite | None = None
