"""The FUSE adapter: resolves a path in a ``Tree`` and answers from the node found.

It knows nothing of model formats; it could serve any tree of byte sources.  Errors from
below are mapped to errno in one place (``__call__``).
"""

from __future__ import annotations

import ctypes
import errno
import logging
import os
import stat
import threading

from fuse import FUSE, FuseOSError

from tensorfs.namespace import DirNode, Tree
from tensorfs.source import SourceError
from tensorfs.views import fill_from

log = logging.getLogger("tensorfs")

# Readers such as cp and cat size their buffers from st_blksize; the kernel still splits
# reads into requests of at most 128 KiB (libfuse 2's limit).
BLOCK_SIZE = 1 << 20

WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_TRUNC


class TensorFS:
    # Not a subclass of fusepy's Operations: fusepy registers every FUSE call the object
    # has, and Operations has them all.  Left out here, opendir, releasedir, flush and
    # release are answered by libfuse without a trip into Python: two fewer callbacks per
    # directory a `find` walks (docs/serving.md).

    use_ns = True

    def __init__(self, tree: Tree, mtime_ns: int, uid: int, gid: int, on_ready=None):
        self.tree = tree
        self.mtime_ns = mtime_ns
        self.uid = uid
        self.gid = gid
        self.on_ready = on_ready
        self._open_files: dict[int, object] = {}
        self._nlink: dict[int, int] = {}

    # -- dispatch and the one errno mapping ---------------------------------------------------
    def __call__(self, op, *args):
        try:
            return getattr(self, op)(*args)
        except FuseOSError:
            raise
        except SourceError as error:
            log.error("%s: %s", op, error)
            raise FuseOSError(errno.EIO) from None
        except OSError as error:
            log.error("%s %r: %s", op, args[:1], error)
            raise FuseOSError(error.errno or errno.EIO) from None
        except Exception:
            log.exception("%s %r failed", op, args[:1])
            raise FuseOSError(errno.EIO) from None

    def _node(self, path: str):
        node = self.tree.lookup(path)
        if node is None:
            raise FuseOSError(errno.ENOENT)
        return node

    def _attrs(self, node) -> dict:
        times = dict(st_mtime=self.mtime_ns, st_ctime=self.mtime_ns, st_atime=self.mtime_ns)
        if isinstance(node, DirNode):
            nlink = self._nlink.get(node.ino)
            if nlink is None:     # the tree never changes: count a directory's subdirectories once
                nlink = self._nlink[node.ino] = 2 + sum(
                    isinstance(c, DirNode) for c in node.children.values())
            return dict(st_mode=stat.S_IFDIR | 0o555, st_nlink=nlink, st_size=0,
                        st_ino=node.ino, st_uid=self.uid, st_gid=self.gid,
                        st_blksize=BLOCK_SIZE, **times)
        size = node.view.size
        return dict(st_mode=stat.S_IFREG | 0o444, st_nlink=1, st_size=size,
                    st_blocks=(size + 511) // 512, st_ino=node.ino, st_uid=self.uid,
                    st_gid=self.gid, st_blksize=BLOCK_SIZE, **times)

    # -- the calls ---------------------------------------------------------------------------
    def init(self, path):
        if self.on_ready is not None:
            self.on_ready()

    def getattr(self, path, fh=None):
        return self._attrs(self._node(path))

    def readdir(self, path, fh):
        node = self._node(path)
        if not isinstance(node, DirNode):
            raise FuseOSError(errno.ENOTDIR)
        # Entries carry only the file type: sizes would force generated files to be built.
        entries = [".", ".."]
        for name, child in node.children.items():
            mode = stat.S_IFDIR if isinstance(child, DirNode) else stat.S_IFREG
            entries.append((name, {"st_mode": mode, "st_ino": child.ino}, 0))
        return entries

    def open(self, path, flags):
        if flags & WRITE_FLAGS:
            raise FuseOSError(errno.EROFS)
        node = self._node(path)
        if isinstance(node, DirNode):
            raise FuseOSError(errno.EISDIR)
        self._open_files[node.ino] = node
        return node.ino

    def read(self, path, size, offset, fh):
        node = self._open_files.get(fh) or self._node(path)
        return node.view.read(offset, size)

    def read_into(self, path, buf, offset, fh):
        """``read`` into the reply buffer (``ZeroCopyFUSE``): returns the byte count."""
        node = self._open_files.get(fh) or self._node(path)
        return fill_from(node.view, offset, buf)

    def getxattr(self, path, name, position=0):
        node = self._node(path)
        xattrs = getattr(node, "xattrs", {})
        if name not in xattrs:
            raise FuseOSError(errno.ENODATA)
        return xattrs[name]

    def listxattr(self, path):
        return list(getattr(self._node(path), "xattrs", {}))

    def statfs(self, path):
        return dict(f_bsize=BLOCK_SIZE, f_frsize=BLOCK_SIZE, f_namemax=255)

    def access(self, path, amode):
        self._node(path)
        if amode & os.W_OK:
            raise FuseOSError(errno.EROFS)
        return 0

    # -- a read-only filesystem --------------------------------------------------------------
    def _read_only(self, *args):
        raise FuseOSError(errno.EROFS)

    chmod = chown = create = link = mkdir = mknod = rename = rmdir = symlink = _read_only
    truncate = unlink = utimens = write = setxattr = removexattr = _read_only


class ZeroCopyFUSE(FUSE):
    """fusepy's ``FUSE`` with a read that fills libfuse's reply buffer in place, and Python
    thread states that outlive a callback.

    - fusepy's own read calls ``Operations.read``, which must return a bytes object that it
      then ``memmove``s into the buffer libfuse sends to the kernel: a fresh 128 KiB object and
      two copies per request.  Here the buffer itself is handed to ``Operations.read_into`` as
      a memoryview, and a raw file is ``preadv``'d straight into it — one copy, made by the
      kernel with the GIL released.  Operations without ``read_into`` get fusepy's path.
    - libfuse calls in from its own threads; ctypes then creates a Python thread state for
      each callback and destroys it on return.  The first callback on each libfuse thread
      takes one more ``PyGILState_Ensure`` that is never released, so the thread keeps its
      state.  A libfuse thread that exits (it keeps at most 10 idle) leaves its few-KiB
      state behind, so nothing big may hang off a thread (no ``threading.local`` buffers).
    docs/serving.md gives the before/after of each (benchmark rows 1c and 6).
    """

    _pinned = threading.local()

    @staticmethod
    def _wrapper(func, *args, **kwargs):
        if not getattr(ZeroCopyFUSE._pinned, "yes", False):
            ctypes.pythonapi.PyGILState_Ensure()
            ZeroCopyFUSE._pinned.yes = True
        return FUSE._wrapper(func, *args, **kwargs)

    def read(self, path, buf, size, offset, fip):
        if not hasattr(self.operations, "read_into"):
            return super().read(path, buf, size, offset, fip)
        # A view of libfuse's buffer; nothing keeps it past this call (libfuse frees the
        # buffer once the reply is sent).
        target = memoryview((ctypes.c_char * size).from_address(ctypes.addressof(buf.contents))).cast("B")
        return self.operations("read_into", path.decode(self.encoding) if path else None,
                               target, offset, fip.contents.fh)
