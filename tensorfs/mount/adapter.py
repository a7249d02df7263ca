"""The FUSE adapter: answers the kernel's questions about a ``Tree`` by inode number.

It knows nothing of model formats; it could serve any tree of byte sources.  Errors from
below are mapped to errno in one place (``errno_of``).  The C side is ``tensorfs.fuse.session``.
"""

from __future__ import annotations

import errno
import itertools
import logging
import os
from collections.abc import Callable
from concurrent.futures import Future

from tensorfs.editing.session import EditRefused
from tensorfs.fuse.operations import Entry, FsError, Later, Operations
from tensorfs.fuse.options import MountOptions
from tensorfs.fuse.session import Session
from tensorfs.mount.editable import TYPE_XATTR, Editor
from tensorfs.mount.edithandles import OpenFile, WriteHandle
from tensorfs.sources.source import SourceError
from tensorfs.views.names import DirNode, FileNode, Tree

log = logging.getLogger("tensorfs")

# Readers such as cp and cat size their buffers from st_blksize.
BLOCK_SIZE = 1 << 20

# The kernel's read-ahead window on the mount: one libfuse 3 request (its largest), rather
# than the 128 KiB default (tensorfs.fuse.session.Session._raise_read_ahead; benchmark row 1).
READ_AHEAD_KIB = 1024

# TENSORFS_FD_REPLIES=1 turns on replies that name the model's descriptor (splice) where
# there is no passthrough.  Off by default: measured slower than copying through Python
# (docs/internals/benchmarks.md "Whole files": W1 0.09 vs 0.14, W3 0.07 vs 0.15 on libfuse 3.14).
FD_REPLIES = os.environ.get("TENSORFS_FD_REPLIES", "0") == "1"

# TENSORFS_PASSTHROUGH=1 lets the kernel read whole local files of files/ from the model's
# own descriptor (libfuse >= 3.17, as root).  Off by default: once the kernel reads the file
# itself, nothing checks it after the open, so a model rewritten in place under the mount
# would be served its new bytes, a truncated one short (docs/internals/reliability.md).  The copy path
# checks the file after every read.  Turn it on only for files nothing rewrites.
PASSTHROUGH = os.environ.get("TENSORFS_PASSTHROUGH", "0") == "1"

# The mount's root answers this with the serving process's pid: how ``tensorfs unmount`` finds
# the daemon from the mount itself, whatever runtime directory its files are in.  Not listed
# (``getfattr -d`` and copies of the tree do not carry it).
PID_XATTR = "user.tensorfs.pid"

# A directory with more entries than this keeps its listing between readdir calls (each call
# fills one buffer of the kernel's, a few dozen entries); smaller ones are listed anew.
KEEP_LISTING_ENTRIES = 64


class TensorFS(Operations):
    """The ``Operations`` of a mount: a ``Tree``'s nodes by inode number."""

    def __init__(self, tree: Tree, editor: Editor | None = None):
        self.tree = tree
        self._nlink: dict[int, int] = {}
        self._listings: dict[int, list] = {}
        # --edits: the tree then changes, and the caches of what it holds are dropped at
        # every change
        self.editor = editor
        self._handles: dict[int, OpenFile] = {}     # an editable mount's opens
        self.invalidate: Callable[[list[int]], None] | None = None  # Session's, once serving
        self._next_handle = itertools.count(1)
        if editor is not None:
            editor.on_change = self._changed

    def _changed(self, nodes) -> None:
        """An edit changed ``nodes``: what this adapter and the kernel keep of them goes."""
        self._nlink = {}
        self._listings = {}
        if self.invalidate is not None:
            self.invalidate([node.ino for node in nodes])

    def forget(self, ino: int) -> None:
        if self.editor is not None:
            self.editor.kernel_forgot(ino)

    # -- the one errno mapping -----------------------------------------------------------------
    def errno_of(self, exc: BaseException) -> int:
        if isinstance(exc, SourceError):
            if not exc.logged:      # a source that said it already (once)
                log.error("%s", exc)
            return errno.EIO
        if isinstance(exc, EditRefused):
            log.warning("edit refused: %s", exc.strerror)
            return exc.errno
        if isinstance(exc, OSError):
            log.error("%s", exc)
            return exc.errno or errno.EIO
        log.error("request failed", exc_info=exc)
        return errno.EIO

    def _node(self, ino: int):
        node = self.tree.node(ino)
        if node is None:
            raise FsError(errno.ENOENT)
        return node

    def _dir(self, ino: int) -> DirNode:
        node = self._node(ino)
        if not isinstance(node, DirNode):
            raise FsError(errno.ENOTDIR)
        return node

    def _entry(self, node, listing: bool = False) -> Entry:
        editor = self.editor
        if editor is not None:
            entry = self._plain_entry(node, listing)
            # a file being written is the size written (the kernel takes the size of every
            # answer, a lookup's too); every node's time is the last edit's: the kernel then
            # drops the pages and listings it cached of a file or directory an edit may
            # have changed
            writing = editor.writer(node) if isinstance(node, FileNode) else None
            if writing is not None:
                entry = entry._replace(size=writing.size)
            return entry._replace(writable=editor.writable(node),
                                  mtime_ns=entry.mtime_ns or editor.mtime_ns)
        return self._plain_entry(node, listing)

    def _plain_entry(self, node, listing: bool = False) -> Entry:
        if isinstance(node, DirNode):
            nlink = self._nlink.get(node.ino)
            if nlink is None and listing and not node.placed:
                # counting would place all its entries inside the parent's READDIR (every
                # tensor of a 300k-tensor model at once): its own LOOKUP counts them
                return Entry(node.ino, True, None, 2)
            if nlink is None:     # the tree never changes: count a directory's subdirectories once
                nlink = self._nlink[node.ino] = 2 + sum(
                    isinstance(c, DirNode) for c in node.children.values())
            return Entry(node.ino, True, 0, nlink)
        view = node.view
        if listing and not view.cheap_size:
            return Entry(node.ino, False, None, 1, owner=view.owner)
        return Entry(node.ino, False, view.size, 1, view.mtime_ns, view.owner)

    # -- the calls -----------------------------------------------------------------------------
    def lookup(self, parent: int, name: str) -> Entry:
        directory = self._dir(parent)
        child = directory.children.get(name)
        if child is None and self.editor is not None:
            child = self.editor.ghost(directory, name)
        if child is None:
            raise FsError(errno.ENOENT)
        if self.editor is not None:
            self.editor.saw(parent, name, child)
        return self._entry(child)

    def getattr(self, ino: int, fh: int = 0) -> Entry:
        node = self._node(ino)
        entry = self._entry(node)
        handle = self._handles.get(fh) if fh else None
        if handle is not None:                  # the size that open sees
            return entry._replace(size=handle.size)
        return entry

    def listing(self, ino: int) -> list:
        kept = self._listings.get(ino)
        if kept is not None:
            return kept
        children = self._dir(ino).children
        if self.editor is not None:
            with self.editor.lock:
                children = dict(children)
            for name, child in children.items():
                self.editor.saw(ino, name, child)
        entries = [(name, self._entry(child, listing=True)) for name, child in children.items()]
        if len(entries) > KEEP_LISTING_ENTRIES:
            self._listings[ino] = entries
        return entries

    def _file_view(self, ino: int):
        node = self._node(ino)
        if isinstance(node, DirNode):
            raise FsError(errno.EISDIR)
        return node.view

    def open(self, ino: int) -> int | None:
        """A view that can say so refuses a file changed since the mount (EIO) here, and may
        name the descriptor holding all of it (tensorfs.fuse.session: passthrough)."""
        return self._file_view(ino).open()

    def read_fd(self, ino: int, offset: int, size: int):
        return self._file_view(ino).read_fd(offset, size) if FD_REPLIES else None

    def read_into(self, ino: int, offset: int, buf: memoryview) -> int | Later:
        """A read whose bytes are on their way (a remote file's) is answered later, holding
        no thread: ``View.read_or_wait``."""
        node = self._node(ino)
        if isinstance(node, DirNode):
            raise FsError(errno.EISDIR)
        return _later(node.view.read_or_wait(offset, buf))

    def getxattr(self, ino: int, name: str) -> bytes | Later:
        if ino == self.tree.root.ino and name == PID_XATTR:
            return str(os.getpid()).encode()    # the serving process: what unmount waits for
        xattrs = self._xattrs(self._node(ino))
        if name in xattrs:
            return xattrs[name]     # a Later where it needs long work (the sha256)
        if not name.startswith("user."):
            # "Not supported here", not "no such attribute": ls -l remembers it and stops
            # asking every file for its SELinux label and ACLs (a round trip each).
            raise FsError(errno.EOPNOTSUPP)
        raise FsError(errno.ENODATA)

    def listxattr(self, ino: int) -> list:
        return list(self._xattrs(self._node(ino)))     # PID_XATTR: asked for, never listed

    @staticmethod
    def _xattrs(node):
        return node.xattrs if isinstance(node, FileNode) else {}

    # -- an editable mount (--edits): tensorfs.mount.editable says what each change means -----
    def _editor(self) -> Editor:
        if self.editor is None:
            raise FsError(errno.EROFS)
        return self.editor

    def _keep(self, handle: OpenFile) -> int:
        fh = next(self._next_handle)
        self._handles[fh] = handle
        return fh

    def _writing(self, fh: int) -> WriteHandle:
        handle = self._handles.get(fh)
        if not isinstance(handle, WriteHandle):
            raise FsError(errno.EBADF)
        return handle

    def open_read(self, ino: int) -> int:
        """A reader's handle: a version of a file of files/ for its life, else the file as
        it is at each read (a write session's bytes while one is open)."""
        node = self._node(ino)
        if isinstance(node, DirNode):
            raise FsError(errno.EISDIR)
        return self._keep(self._editor().open_read(node))

    def read_handle(self, ino: int, fh: int, offset: int, buf: memoryview) -> int | Later:
        handle = self._handles.get(fh) if fh else None
        if handle is None:
            return self.read_into(ino, offset, buf)
        return _later(handle.read_or_wait(offset, buf))

    def open_write(self, ino: int, truncate: bool) -> int:
        return self._keep(self._editor().open_write(self._node(ino), truncate))

    def create(self, parent: int, name: str) -> tuple[Entry, int]:
        node, handle = self._editor().create(self._dir(parent), name)
        return self._entry(node), self._keep(handle)

    def write(self, ino: int, fh: int, offset: int, data: bytes) -> int:
        return self._writing(fh).write(offset, data)

    def flush(self, ino: int, fh: int) -> None:
        handle = self._handles.get(fh)
        if handle is not None:
            handle.flush()

    def fsync(self, ino: int, fh: int) -> None:
        handle = self._handles.get(fh)
        if handle is not None:
            handle.fsync()

    def release(self, ino: int, fh: int) -> None:
        handle = self._handles.pop(fh, None)
        if handle is not None:
            handle.release()

    def truncate(self, ino: int, size: int, fh: int) -> None:
        handle = self._handles.get(fh) if fh else None
        if isinstance(handle, WriteHandle):
            handle.truncate(size)
        else:
            self._editor().truncate(self._node(ino), size)

    def unlink(self, parent: int, name: str) -> None:
        self._editor().unlink(self._dir(parent), name)

    def rmdir(self, parent: int, name: str) -> None:
        self._editor().rmdir(self._dir(parent), name)

    def rename(self, parent: int, name: str, new_parent: int, new_name: str) -> None:
        self._editor().rename(self._dir(parent), name, self._dir(new_parent), new_name)

    def setxattr(self, ino: int, name: str, value: bytes) -> None:
        if name != TYPE_XATTR:
            raise FsError(errno.EPERM if name.startswith("user.") else errno.EOPNOTSUPP)
        self._editor().set_type(self._node(ino), value.decode("utf-8", "replace").strip())


def _later(result: int | Future[int]) -> int | Later:
    """A view's read as the session answers it: the count, or a ``Later`` settled with it
    when the view's ``Future`` is done; a request given up (its reader interrupted or gone,
    the session ending) cancels the Future, and with it the work no other read waits for."""
    if not isinstance(result, Future):
        return result

    def given_up(_gone: Later, _code: int) -> None:
        result.cancel()

    later = Later(on_give_up=given_up)

    def settled(done: Future[int]) -> None:
        if done.cancelled():
            return
        error = done.exception()
        if error is not None:
            later.fail(error)
        else:
            later.answer(done.result())

    result.add_done_callback(settled)
    return later


def serve(tree: Tree, mountpoint: str, *, uid: int, gid: int, mtime_ns: int,
          options: MountOptions, on_ready=None, on_stop=None, editor=None,
          file_mode: int = 0o444) -> None:
    """Mount ``tree`` and serve it until unmounted; ``on_ready()`` is called once the mount
    answers requests (not before: libfuse may still refuse it after INIT), and a mount that
    never became live raises ``FuseUnavailable``.  ``options``: the mount's ``-o``, parsed
    once (``tensorfs.fuse.options``); the timeouts and the thread count are answered here,
    ``kernel_cache`` and ``use_ino`` are always in effect (docs/internals/serving.md).  ``on_stop()``
    is called as soon as the mount is told to end, requests still in flight (``Session``)."""
    fs = TensorFS(tree, editor)
    # an edited tree changes under the kernel: it keeps no names or misses, and the
    # attributes and pages of what an edit changed are dropped (``editor``: --edits)
    timeouts = (options.attr_timeout, options.entry_timeout, options.negative_timeout) \
        if editor is None else (options.attr_timeout, 0.0, 0.0)
    session = Session(fs, uid=uid, gid=gid, mtime_ns=mtime_ns, block_size=BLOCK_SIZE,
                      read_ahead_kib=READ_AHEAD_KIB, errno_of=fs.errno_of, splice=FD_REPLIES,
                      passthrough=PASSTHROUGH, file_mode=file_mode,
                      attr_timeout=timeouts[0], entry_timeout=timeouts[1],
                      negative_timeout=timeouts[2], editable=editor is not None)
    fs.invalidate = session.invalidate
    if editor is not None:
        editor.kernel_holds = session.kernel_holds
    session.serve(mountpoint, options, on_ready=on_ready, on_stop=on_stop)
