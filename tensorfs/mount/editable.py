"""An editable mount (``--edits DIR``), the tree side: the files a user may change, placed in
the mount's tree and kept true to the edits (docs/reference/editing.md).

- ``metadata/KEY``: rewritten whole, its new text read in the key's type when the file is
  closed; a new file is a scratch file of the mount (in memory, never in the model: a
  tool's temporary, swap or backup file) until it is closed under a key name
  (``is_key_name``: then a new key, a string or the type given by the ``user.tensorfs.type``
  extended attribute) or renamed onto a key (its text read in that key's type: ``sed -i``);
  ``rm`` deletes the key, ``mv`` renames it.  Only ``user.tensorfs.type`` changes a key's
  type.
- a tensor's raw file: overwritten with bytes of its size; its ``.npy`` view: overwritten
  with a ``numpy.save`` file of its shape, stored in its type; ``rm`` of either removes the
  tensor, ``mv`` renames it.
- ``files/<model file>``: the edited model, a new version (a new inode) at each edit, so
  that an open reads one version whole.

An edit's route, top-down: the FUSE adapter (``tensorfs.mount.adapter``) calls ``Editor``
with nodes and keeps the opens it gives (``tensorfs.mount.edithandles``); ``Editor``
translates a node into model names and calls the edit session
(``tensorfs.editing.session.EditSession``), which checks the edit, keeps it in the store and
composes the files; ``Editor`` then shows it in the tree and tells the adapter which nodes
changed (``on_change``).  Nothing here knows about FUSE; errors are ``EditRefused(errno,
why)``: the why is logged, the errno answered.

``Editor`` is put together from its parts, one concern each: ``tensorfs.mount.editbase``
(the state, each edit shown, which key or tensor a node is of), ``editkeys`` (metadata/: keys,
scratch files, the naming rules), ``edittensors`` (the tensors' files), ``editrenames``
(every rule of ``rm`` and ``mv``), ``editversions`` (the versions of files/ and
metadata.json); this module holds the opens (``open_read``, ``create``, ``open_write`` ... ``release``:
what the handles of ``tensorfs.mount.edithandles`` call back, ``Editor`` being their
``HandleOwner``).
"""

from __future__ import annotations

import errno
import logging

from tensorfs.editing.session import EditRefused
from tensorfs.editing.store import EditStore
from tensorfs.mount.editbase import (
    MAX_METADATA_TEXT,
    NPY_SLACK,
    OLD_VERSIONS_KEPT,
    READ_ONLY_TOP,
    TYPE_XATTR,
    ChangeListener,
)
from tensorfs.mount.edithandles import (
    MAX_SCRATCH_FILES,
    MetadataWrite,
    NpyWrite,
    RawWrite,
    ReadHandle,
    Scratch,
    ScratchView,
    WriteHandle,
)
from tensorfs.mount.editkeys import KeyEdits, is_key_name, unescape
from tensorfs.mount.editrenames import Renames
from tensorfs.mount.edittensors import TensorEdits
from tensorfs.mount.editversions import ComposedView, GeneratedVersion, IndexView
from tensorfs.views.names import DirNode, FileNode

__all__ = ["MAX_METADATA_TEXT", "NPY_SLACK", "OLD_VERSIONS_KEPT", "READ_ONLY_TOP", "TYPE_XATTR",
           "ChangeListener", "ComposedView", "Editor", "GeneratedVersion", "IndexView",
           "is_key_name", "unescape"]

log = logging.getLogger("tensorfs")


class Editor(Renames, KeyEdits, TensorEdits):
    """The edits of one mounted model (one file, shards or splits), placed in its tree: the
    ``HandleOwner`` of the handles it makes (``tensorfs.mount.edithandles``).  ``session``
    (``EditSession``) makes each edit in model terms; this class finds what a node is of
    (a key, a tensor, a scratch file), and shows each edit kept (``_shown``)."""


    def __init__(self, mounted, store: EditStore, layout: str):
        super().__init__(mounted, store, layout)
        self._replay(store.state)
        self._refresh_generated()

    def open_read(self, node) -> ReadHandle:
        """A reader's handle; a version of a file of files/ is counted while open."""
        if isinstance(node, DirNode):
            raise EditRefused(errno.EISDIR, "a directory")
        node.view.open()
        snapshot = node.view.snapshot()
        if snapshot is not None:
            with self.lock:
                self._readers[node.ino] = self._readers.get(node.ino, 0) + 1
        return ReadHandle(self, node, snapshot)

    def closed(self, handle: ReadHandle) -> None:
        """A reader let go: a version of files/ that is no longer the current one and has
        no reader left is forgotten."""
        if handle.snapshot is None:
            return
        with self.lock:
            ino = handle.node.ino
            left = self._readers[ino] = self._readers[ino] - 1
            if not left:
                del self._readers[ino]
                self._forget_old()

    def create(self, parent, name: str) -> tuple[FileNode, MetadataWrite]:
        with self.editing():
            if parent is not self.meta_dir:
                raise EditRefused(errno.EPERM, "new files are made in metadata/ only (a new key)")
            if not self.metadata_editable:
                raise EditRefused(errno.EPERM, "a sharded safetensors model's metadata is its "
                                  "index's: not edited here")
            if name in parent.children:
                raise EditRefused(errno.EEXIST, f"metadata/{name}: exists already")
            key = unescape(name)
            self.session.check_key_name(key, name)
            self._canonical(name, key)
            if len(self._scratch) >= MAX_SCRATCH_FILES:
                raise EditRefused(errno.ENOSPC, f"metadata/{name}: {MAX_SCRATCH_FILES} files "
                                  "not yet keys are open or left: remove some")
            scratch = self._new_scratch(name, ScratchView(), self._left_types.pop(name, None))
            handle = self._scratch_handle(scratch, True)
            handle.dirty = True
            scratch.handle = self._writers[scratch.node.ino] = handle
            return scratch.node, handle

    def _scratch_handle(self, scratch: Scratch, truncate: bool) -> MetadataWrite:
        """A write session of a scratch file (a ``MetadataWrite`` of no key yet) that writes
        the file's bytes in place (a rename or a read before the close sees them)."""
        handle = MetadataWrite(self, scratch.node, MAX_METADATA_TEXT, True, None,
                               scratch.type_name or "string", created=True)
        if truncate:
            del scratch.view.data[:]
        handle.buf = scratch.view.data
        return handle

    def open_write(self, node, truncate: bool) -> WriteHandle:
        """The file's write session: a new one, or the one already open (O_TRUNC empties
        it)."""
        with self.editing():
            if isinstance(node, DirNode):
                raise EditRefused(errno.EISDIR, "a directory")
            handle = self._writers.get(node.ino)
            if handle is not None:
                handle.opens += 1
                if truncate:
                    handle.truncate(0)
                return handle
            handle = self._new_writer(node, truncate)
            handle.dirty = truncate         # closing it is an edit even with nothing written
            self._writers[node.ino] = handle
            return handle

    def _new_writer(self, node: FileNode, truncate: bool) -> WriteHandle:
        """Opened with O_TRUNC: the file is empty now, and closing it is an edit (``cp
        /dev/null metadata/KEY`` sets the empty string) even with nothing written."""
        scratch = self._scratch.get(node.ino)
        if scratch is not None:
            return self._scratch_handle(scratch, truncate)
        key = self._key_of.get(node.ino)
        if key is not None:
            return MetadataWrite(self, node, max(MAX_METADATA_TEXT, 2 * node.view.size),
                                 truncate, key, node.xattrs[TYPE_XATTR].decode())
        original = self._original(node)
        if original is None:
            raise EditRefused(errno.EACCES, "only metadata/ files and tensor files can "
                              "be written")
        t = self.session.tensor(original)
        if self._is_raw(node):
            return RawWrite(self, node, t.nbytes, truncate, original)
        return NpyWrite(self, node, t.n_elements * 8 + NPY_SLACK, truncate, original)

    def writer(self, node) -> WriteHandle | None:
        """The write session open on ``node``, or None."""
        return self._writers.get(node.ino)

    def size_now(self, node) -> int:
        """A file's size as every open sees it: its write session's while one is open."""
        handle = self._writers.get(node.ino)
        return node.view.size if handle is None else handle.size

    def read_now(self, node, offset: int, buf: memoryview) -> int:
        """A file's bytes as every open sees them: its write session's while one is open (a
        read after a write sees it, before any close), else its view's."""
        handle = self._writers.get(node.ino)
        if handle is None:
            return node.view.read_into(offset, buf)
        return handle.read_into(offset, buf)

    def truncate(self, node, size: int) -> None:
        """``truncate PATH`` of a file no open of the caller's writes: its write session's
        if one is open; else only to the size it has."""
        handle = self._writers.get(node.ino) if isinstance(node, FileNode) else None
        if handle is not None:
            handle.truncate(size)
            return
        if isinstance(node, FileNode) and size == node.view.size:
            return
        raise EditRefused(errno.EINVAL, "truncate an open file (open with O_TRUNC)")

    def release(self, handle: WriteHandle) -> None:
        """One open of ``handle`` let go; at the last, bytes written since the last close
        are kept (or the refusal logged: no caller is left to tell), and the session ends."""
        with self.editing():
            handle.opens -= 1
            if handle.opens:
                return
            if self._writers.get(handle.node.ino) is handle:
                del self._writers[handle.node.ino]
            try:
                if handle.dirty and not handle.reported and handle.refusal is None:
                    handle.flush()
            except OSError as error:
                log.warning("edit refused at the last close: %s", error.strerror or error)
            finally:
                with handle.lock:
                    handle.discard()
            scratch = self._scratch.get(handle.node.ino)
            if scratch is not None and scratch.handle is handle:
                scratch.handle = None
                self._unmade(scratch)

    def refused(self, handle: WriteHandle, closing: bool) -> None:
        """A write or (``closing``) a close of ``handle`` refused: the kernel drops what it
        holds of the file.  A close refused ends the write session for every other open (its
        FUSE_RELEASE may come late: an open meanwhile reads, or writes anew, the file as it
        is kept; the session's own opens go on with their bytes), and a new key whose text
        it refused is not shown (unless a later close of the session makes it)."""
        self._touch(handle.node)
        if not closing:
            return
        if self._writers.get(handle.node.ino) is handle:
            del self._writers[handle.node.ino]
        scratch = self._scratch.get(handle.node.ino)
        if scratch is not None and scratch.handle is handle \
                and is_key_name(scratch.name, self.format) \
                and self.meta_dir.children.get(scratch.name) is handle.node:
            del self.meta_dir.children[scratch.name]     # until a close makes it a key
            self._touch(self.meta_dir)
