"""The FUSE adapter: answers the kernel's questions about a ``Tree`` by inode number.

It knows nothing of model formats; it could serve any tree of byte sources.  Errors from
below are mapped to errno in one place (``errno_of``).  The C side is ``tensorfs.fuse3``.
"""

from __future__ import annotations

import errno
import logging
import os

from tensorfs.fuse3 import Entry, FsError, Session
from tensorfs.mountoptions import MountOptions
from tensorfs.namespace import DirNode, FileNode, Tree
from tensorfs.operations import Operations
from tensorfs.source import SourceError

log = logging.getLogger("tensorfs")

# Readers such as cp and cat size their buffers from st_blksize.
BLOCK_SIZE = 1 << 20

# The kernel's read-ahead window on the mount: one libfuse 3 request (its largest), rather
# than the 128 KiB default (tensorfs.fuse3.Session._raise_read_ahead; benchmark row 1).
READ_AHEAD_KIB = 1024

# TENSORFS_FD_REPLIES=1 turns on replies that name the model's descriptor (splice) where
# there is no passthrough.  Off by default: measured slower than copying through Python
# (docs/benchmarks.md "Whole files": W1 0.09 vs 0.14, W3 0.07 vs 0.15 on libfuse 3.14).
FD_REPLIES = os.environ.get("TENSORFS_FD_REPLIES", "0") == "1"

# A directory with more entries than this keeps its listing between readdir calls (each call
# fills one buffer of the kernel's, a few dozen entries); smaller ones are listed anew.
KEEP_LISTING_ENTRIES = 64


class TensorFS(Operations):
    """The ``Operations`` of a mount: a ``Tree``'s nodes by inode number."""

    def __init__(self, tree: Tree):
        self.tree = tree
        self._nlink: dict[int, int] = {}
        self._listings: dict[int, list] = {}

    # -- the one errno mapping -----------------------------------------------------------------
    def errno_of(self, exc: BaseException) -> int:
        if isinstance(exc, SourceError):
            if not exc.logged:      # a source that said it already (once)
                log.error("%s", exc)
            return errno.EIO
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
        if isinstance(node, DirNode):
            nlink = self._nlink.get(node.ino)
            if nlink is None:     # the tree never changes: count a directory's subdirectories once
                nlink = self._nlink[node.ino] = 2 + sum(
                    isinstance(c, DirNode) for c in node.children.values())
            return Entry(node.ino, True, 0, nlink)
        view = node.view
        if listing and not view.cheap_size:
            return Entry(node.ino, False, None, 1)
        return Entry(node.ino, False, view.size, 1, view.mtime_ns)

    # -- the calls -----------------------------------------------------------------------------
    def lookup(self, parent: int, name: str) -> Entry:
        child = self._dir(parent).children.get(name)
        if child is None:
            raise FsError(errno.ENOENT)
        return self._entry(child)

    def getattr(self, ino: int) -> Entry:
        return self._entry(self._node(ino))

    def listing(self, ino: int) -> list:
        kept = self._listings.get(ino)
        if kept is not None:
            return kept
        children = self._dir(ino).children
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
        name the descriptor holding all of it (tensorfs.fuse3: passthrough)."""
        return self._file_view(ino).open()

    def read_fd(self, ino: int, offset: int, size: int):
        return self._file_view(ino).read_fd(offset, size) if FD_REPLIES else None

    def read_into(self, ino: int, offset: int, buf: memoryview) -> int:
        node = self._node(ino)
        if isinstance(node, DirNode):
            raise FsError(errno.EISDIR)
        return node.view.read_into(offset, buf)

    def getxattr(self, ino: int, name: str) -> bytes:
        xattrs = self._xattrs(self._node(ino))
        if name in xattrs:
            return xattrs[name]
        if not name.startswith("user."):
            # "Not supported here", not "no such attribute": ls -l remembers it and stops
            # asking every file for its SELinux label and ACLs (a round trip each).
            raise FsError(errno.EOPNOTSUPP)
        raise FsError(errno.ENODATA)

    def listxattr(self, ino: int) -> list:
        return list(self._xattrs(self._node(ino)))

    @staticmethod
    def _xattrs(node):
        return node.xattrs if isinstance(node, FileNode) else {}


def serve(tree: Tree, mountpoint: str, *, uid: int, gid: int, mtime_ns: int,
          options: MountOptions, on_ready=None) -> None:
    """Mount ``tree`` and serve it until unmounted; ``on_ready()`` is called once the mount
    answers requests (not before: libfuse may still refuse it after INIT), and a mount that
    never became live raises ``FuseUnavailable``.  ``options``: the mount's ``-o``, parsed
    once (``tensorfs.mountoptions``); the timeouts and the thread count are answered here,
    ``kernel_cache`` and ``use_ino`` are always in effect (docs/serving.md)."""
    fs = TensorFS(tree)
    session = Session(fs, uid=uid, gid=gid, mtime_ns=mtime_ns, block_size=BLOCK_SIZE,
                      read_ahead_kib=READ_AHEAD_KIB, errno_of=fs.errno_of, splice=FD_REPLIES,
                      attr_timeout=options.attr_timeout, entry_timeout=options.entry_timeout,
                      negative_timeout=options.negative_timeout)
    session.serve(mountpoint, options, on_ready=on_ready)
