"""An editable mount (``--edits DIR``), the tree side: the files a user may change, placed in
the mount's tree and kept true to the edits (docs/editing.md).

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
"""

from __future__ import annotations

import contextlib
import errno
import itertools
import logging
import os
import re
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future

from tensorfs.convert.plan import plan_view
from tensorfs.editing.compose import ComposedFile, typed_value
from tensorfs.editing.session import Committed, EditRefused, EditSession
from tensorfs.editing.store import EditState, EditStore, PendingData
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
from tensorfs.mount.metadata_files import DIRECTORY, metadata_file_name, metadata_view
from tensorfs.mount.metadata_json import metadata_json_pieces
from tensorfs.mount.tree import TENSOR_VIEWS, TensorXattrs, describe
from tensorfs.views.base import View
from tensorfs.views.byteviews import ConvertedView, GeneratedView, NpyView, RawView
from tensorfs.views.names import DirNode, FileNode, entry_name, tensor_paths

log = logging.getLogger("tensorfs")

TYPE_XATTR = "user.tensorfs.type"
# A metadata file's new text is held in memory until it is closed: at most this much (or
# twice the current text, for a large vocabulary).
MAX_METADATA_TEXT = 16 << 20
# An .npy written over a view: its data in float64 at most, plus a header.
NPY_SLACK = 1 << 16
# Versions of a file of files/ replaced by an edit and not open, kept all the same: the
# kernel opens what a lookup answered, which an edit in between may have replaced.
OLD_VERSIONS_KEPT = 16
READ_ONLY_TOP = frozenset({"files", "headers", "header.bin", "metadata.json"})

#: what ``Editor.on_change`` is: called with the nodes an edit changed, once the edit is
#: done (the FUSE adapter's ``TensorFS._changed``, which has the kernel drop what it cached)
ChangeListener = Callable[[list], None]


def _unescape(name: str) -> str:
    """A file name back to the text it stands for (the escaping of tensorfs.views.names)."""
    if "%~" in name:
        raise EditRefused(errno.EINVAL, f"{name!r}: a shortened name cannot be given")
    if name == "%":
        return ""
    raw = re.sub(rb"%([0-9A-Fa-f]{2})", lambda m: bytes([int(m.group(1), 16)]),
                 name.encode("utf-8", "surrogateescape"))
    return raw.decode("utf-8", "surrogateescape")


# the temporary names of sed -i (sedXXXXXX), perl -pi (XXXXXXXX) and Python's tempfile, and
# the suffixes of a temporary or backup copy (KEY.tmp renamed over KEY)
_TOOL_TEMPORARY = re.compile(r"sed[A-Za-z0-9]{6}|XX[A-Za-z0-9]{6}|tmp[a-z0-9_]{8}"
                             r"|.*\.(tmp|temp|new|old|bak|orig|part|swp|swo|swx)")


def is_key_name(name: str, fmt: str) -> bool:
    """Whether a new file of metadata/ named ``name`` is a key once it is closed, or a
    scratch file of the mount (docs/editing.md): a name that starts with ``.`` (vim's
    ``.KEY.swp``), ends with ``~`` (a backup), is only digits (vim's ``4913``), is a
    tool's temporary name (sed's ``sedAbC123``, perl's ``XXwdnW4t``, Python's
    ``tmpk2j3x9ab``) or ends with ``.tmp``, ``.new``, ``.bak`` ... (``KEY.tmp``) is scratch,
    and so, in a GGUF model, whose keys are dotted (``general.name``), is a name without a
    dot inside it."""
    if not name or name.startswith(".") or name.endswith("~") or name.isdigit() \
            or _TOOL_TEMPORARY.fullmatch(name):
        return False
    return fmt != "gguf" or "." in name.strip(".")


class Editor:
    """The edits of one mounted model (one file, shards or splits), placed in its tree: the
    ``HandleOwner`` of the handles it makes (``tensorfs.mount.edithandles``).  ``session``
    (``EditSession``) makes each edit in model terms; this class finds what a node is of
    (a key, a tensor, a scratch file), and shows each edit kept (``_shown``)."""

    def __init__(self, mounted, store: EditStore, layout: str):
        model = mounted.model
        self.model = model
        self.session = session = EditSession(
            model, {f.path: mounted.sources[f.path] for f in model.files}, store)
        self.model_file = session.model_file
        self.format = session.format
        self.metadata_editable = session.metadata_editable
        self.tree = mounted.tree
        self.cache = mounted.cache
        self.budget = mounted.budget
        self.pool = mounted.pool
        self.long_work = mounted.long_work      # an edited tensor's sha256, as the model's
        self.layout = layout
        self.store = store
        self.lock = session.lock
        self.mtime_ns = time.time_ns()
        self.version = itertools.count(1)
        # set by the FUSE adapter (``TensorFS.__init__``): see ``ChangeListener``
        self.on_change: ChangeListener | None = None
        self._changed: list = []
        self._depth = 0
        self._ghost: tuple | None = None    # (directory, name, node): see ``ghost``
        self._dir_paths: dict[int, str] = {1: ""}
        self._tensor_of: dict[int, str] = {}        # a moved file's inode -> original name
        self._writers: dict[int, WriteHandle] = {}      # inode -> its write session
        self._readers: dict[int, int] = {}      # a version of files/ -> its open readers
        self._old: dict[int, None] = {}         # versions of files/ no longer current, oldest first
        # Whether the kernel may still name an inode (the session's count of its lookups):
        # an old version it holds is kept, so that an open of it is never ENOENT
        self.kernel_holds: Callable[[int], bool] = lambda ino: False
        self._scratch: dict[int, Scratch] = {}      # a scratch file's inode -> it
        # name -> type of a key removed or renamed to a scratch name: a file made again under
        # that name is read in that type (mv from another file system: unlink, then create;
        # vim's backup by rename: KEY to KEY~, then a new KEY)
        self._left_types: dict[str, str] = {}
        self.meta_dir = self.tree.lookup("/" + DIRECTORY)
        self._key_of: dict[int, str] = {}
        if self.metadata_editable:
            for key, value in self.model_file.metadata.items():
                node = self.meta_dir.children.get(metadata_file_name(key))
                if node is not None:
                    self._key_of[node.ino] = key
                    node.xattrs = {TYPE_XATTR: value.type_name.encode()}
                    # a key's time is its own last change: an edit of another key or a
                    # tool's scratch file is no change of this file (vim checks)
                    node.view.mtime_ns = self.mtime_ns
        self.metadata_json = self.tree.lookup("/metadata.json")
        self.whole_files: list = []
        self._whole_paths: list[str] = []
        self.index_node = None
        self._files_dir = files = self.tree.lookup("/files")
        if files is not None:
            for f in model.files:
                node = files.children.get(entry_name(os.path.basename(f.path)))
                if node is not None:
                    node.view = ComposedView(session, f.path, store.state, self.mtime_ns)
                    self.whole_files.append(node)
                    self._whole_paths.append(f.path)
            if session.index is not None:
                self._serve_index(files)
        self._replay(store.state)
        self._refresh_generated()

    def _serve_index(self, files) -> None:
        """A sharded safetensors model's index in files/: its weight_map follows the
        removed and renamed tensors (``EditSession.index_bytes``)."""
        for companion in self.model.companions:
            if companion.name.endswith(".index.json"):
                node = files.children.get(entry_name(companion.name))
                if node is not None:
                    self.index_node = node
                    node.view = IndexView(self.session, self.store.state, self.mtime_ns)
                return

    @contextlib.contextmanager
    def editing(self) -> Iterator[None]:
        """One change at a time; afterwards the FUSE adapter is told what changed (so that
        the kernel drops what it cached of those files and directories)."""
        with self.lock:
            self._depth += 1
            try:
                yield
            finally:
                self._depth -= 1
                if not self._depth:
                    changed, self._changed = self._changed, []
                    if changed and self.on_change is not None:
                        nodes = {id(n): n for n in changed if n is not None}
                        self.on_change(list(nodes.values()))

    def _touch(self, *nodes) -> None:
        self._changed.extend(nodes)

    # -- the edited model --------------------------------------------------------------------
    @property
    def state(self) -> EditState:
        return self.store.state

    def _shown(self, committed: Committed) -> None:
        """An edit kept by the session, shown: new versions of files/ and metadata.json."""
        self._ghost = None
        self.mtime_ns = time.time_ns()
        self._new_versions(committed.state, committed.files)
        self._refresh_generated()
        self._touch(self.tree.root, self.meta_dir, self.metadata_json, self.index_node,
                    *self.whole_files)

    def _new_versions(self, state: EditState, composed: dict) -> None:
        """Each file of files/, and metadata.json, a new inode after a commit, as a file
        replaced by rename: an open (and a map) of the old one keeps reading the old version
        whole, the kernel's pages of it included; the next lookup finds the new one.  An old version is kept
        while a reader holds it, and the last ``OLD_VERSIONS_KEPT`` besides (a lookup just
        answered may still be opened)."""
        directory = self._files_dir
        replaced = []
        for i, (node, path) in enumerate(zip(self.whole_files, self._whole_paths)):
            view = ComposedView(self.session, path, state, self.mtime_ns, composed[path])
            new = self.tree.new_node(view, node.xattrs)
            self.whole_files[i] = new
            replaced.append((node, new))
        if self.index_node is not None:
            index = IndexView(self.session, state, self.mtime_ns)
            new = self.tree.new_node(index, self.index_node.xattrs)
            replaced.append((self.index_node, new))
            self.index_node = new
        for node, new in replaced:
            self._replace_node(directory, node, new)
        if self.metadata_json is not None:      # its view: _refresh_generated
            new = self.tree.new_node(self.metadata_json.view, self.metadata_json.xattrs)
            self._replace_node(self.tree.root, self.metadata_json, new)
            self.metadata_json = new
        self._forget_old()
        self._touch(directory, self.tree.root)

    def _replace_node(self, directory: DirNode, node: FileNode, new: FileNode) -> None:
        children = directory.children
        for name, child in list(children.items()):
            if child is node:
                children[name] = new
        self._old[node.ino] = None

    def _refresh_generated(self) -> None:
        if self.metadata_json is None:
            return
        version = next(self.version)
        state = self.state

        def produce():
            model = self.session.edited_model(state)
            paths, plans = describe(model, self.layout)
            return metadata_json_pieces(model, paths, plans, TENSOR_VIEWS)
        self.metadata_json.view = _GeneratedVersion(self.cache, ("metadata.json", version),
                                                    produce)

    # -- the tree ----------------------------------------------------------------------------
    def saw(self, parent_ino: int, name: str, node) -> None:
        """A directory the kernel was told of: its path, for a rename into it."""
        if isinstance(node, DirNode) and node.ino not in self._dir_paths:
            parent = self._dir_paths.get(parent_ino)
            if parent is not None:
                self._dir_paths[node.ino] = f"{parent}/{name}" if parent else name

    def writable(self, node) -> bool:
        if isinstance(node, DirNode):
            return node is self.tree.root or node is self.meta_dir or node.ino in self._dir_paths \
                and self._dir_paths[node.ino].split("/")[0] not in READ_ONLY_TOP
        return node.ino in self._key_of or node.ino in self._scratch \
            or self._original(node) is not None

    def _original(self, node) -> str | None:
        """The original name of the tensor a file is of, or None."""
        if not isinstance(node, FileNode):
            return None
        moved = self._tensor_of.get(node.ino)
        if moved is not None:
            return moved
        xattrs = node.xattrs
        return xattrs.tensor.name if isinstance(xattrs, TensorXattrs) else None

    def _is_raw(self, node: FileNode) -> bool:
        xattrs = node.xattrs
        return isinstance(xattrs, TensorXattrs) and xattrs.raw is not None

    def _sibling(self, node: FileNode):
        other = self.tree.node(node.ino + (1 if self._is_raw(node) else -1))
        if other is not None and self._original(other) == self._original(node):
            return other
        return None

    def _tensor_views(self, original: str, data_name: str):
        t = self.session.tensor(original)
        data = self.store.data(data_name)
        raw = RawView(data, 0, t.nbytes)
        plan = plan_view(t)
        if plan.kind == "native":
            view = NpyView(plan.npy_dtype, t.shape, raw)
        elif plan.kind == "converted":
            view = NpyView("<f4", t.shape, ConvertedView(
                data, 0, t.nbytes, plan.conversion, self.budget, ("chunk", t.name, data_name),
                t.n_elements, pool=self.pool))
        else:
            view = None
        return raw, view

    def _set_views(self, node: FileNode, original: str, data_name: str) -> None:
        raw, view = self._tensor_views(original, data_name)
        sibling = self._sibling(node)
        for n in (node, sibling):
            if n is not None:
                is_raw = self._is_raw(n)
                n.view = raw if is_raw else view
                # the raw file's sha256 is of its bytes now, not of the model's, hashed
                # as the model's are (a large one by the mount's long work, no thread held)
                n.xattrs = TensorXattrs(self.session.tensor(original), raw if is_raw else None,
                                        self.long_work)
                self._touch(n)

    def _place_dir(self, path: str) -> DirNode:
        node = self.tree.root
        done = []
        for part in path.split("/") if path else []:
            done.append(part)
            child = node.children.get(part)
            if child is None:
                child = node.children[part] = self.tree.new_node(directory=True)
                self._touch(node)
            elif not isinstance(child, DirNode):
                raise EditRefused(errno.EEXIST, f"{'/'.join(done)}: is a file")
            self._dir_paths.setdefault(child.ino, "/".join(done))
            node = child
        return node

    def _replay(self, state: EditState) -> None:
        """Show the kept edits in a freshly built tree."""
        for key, typed in state.metadata.items():
            self._show_key(key, typed)
        if not state.tensors:
            return
        paths = tensor_paths([t.name for t in self.model.tensors], self.layout)
        moving = []
        for original, edit in state.tensors.items():
            if original not in paths:
                continue
            nodes = []
            for path in paths[original]:
                parent_path, _, leaf = path.rpartition("/")
                parent = self.tree.lookup("/" + parent_path)
                if parent is not None and leaf in parent.children:
                    nodes.append((parent, leaf, parent.children[leaf]))
            if edit.data is not None and nodes:
                self._set_views(nodes[0][2], original, edit.data)
            if edit.name != original:
                for parent, leaf, _ in nodes:
                    del parent.children[leaf]
                if edit.name is not None:
                    moving.append((original, edit.name, [n for _, _, n in nodes]))
        for original, name, nodes in moving:
            self._place_tensor(original, name, nodes)

    def _place_tensor(self, original: str, name: str, nodes, placed: list | None = None) -> None:
        """A tensor's files at the paths of ``name``; each placed is added to ``placed``
        (directory, leaf), for a rename to undo them."""
        path = tensor_paths([name], self.layout)[name]
        for node in nodes:
            target = path.raw if self._is_raw(node) else path.npy
            parent_path, _, leaf = target.rpartition("/")
            parent = self._place_dir(parent_path)
            if leaf in parent.children:
                raise EditRefused(errno.EEXIST, f"{target}: exists already")
            parent.children[leaf] = node
            if placed is not None:
                placed.append((parent, leaf))
            self._tensor_of[node.ino] = original
            self._touch(parent)

    def _show_key(self, key: str, typed) -> None:
        children = self.meta_dir.children
        name = metadata_file_name(key)
        if typed is None:
            node = children.pop(name, None)
            if node is not None:
                self._key_of.pop(node.ino, None)
            self._touch(self.meta_dir)
            return
        value = typed_value(*typed)
        view = metadata_view(self.cache, key, value, next(self.version))
        view.mtime_ns = time.time_ns()
        node = children.get(name)
        if node is None:
            node = children[name] = self.tree.new_node(view)
        else:
            node.view = view
        node.xattrs = {TYPE_XATTR: typed[0].encode()}
        self._key_of[node.ino] = key
        self._touch(node, self.meta_dir)

    # -- opening for writing -----------------------------------------------------------------
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

    def kernel_forgot(self, ino: int) -> None:
        """The kernel let go of ``ino``: an old version no reader holds may go now."""
        with self.lock:
            if ino in self._old:
                self._forget_old()

    def _forget_old(self) -> None:
        """Forget the versions of files/ and metadata.json that no reader and not the
        kernel holds (a name it looked up, an O_PATH descriptor, a cwd: an open of it may
        come), but the last ``OLD_VERSIONS_KEPT`` of them (a lookup being answered)."""
        unread = [ino for ino in self._old
                  if not self._readers.get(ino) and not self.kernel_holds(ino)]
        for ino in unread[:max(0, len(unread) - OLD_VERSIONS_KEPT)]:
            del self._old[ino]
            self.tree.forget(ino)

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

    def new_data(self) -> PendingData:
        return self.store.new_data()

    def create(self, parent, name: str) -> tuple[FileNode, MetadataWrite]:
        with self.editing():
            if parent is not self.meta_dir:
                raise EditRefused(errno.EPERM, "new files are made in metadata/ only (a new key)")
            if not self.metadata_editable:
                raise EditRefused(errno.EPERM, "a sharded safetensors model's metadata is its "
                                  "index's: not edited here")
            if name in parent.children:
                raise EditRefused(errno.EEXIST, f"metadata/{name}: exists already")
            key = _unescape(name)
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

    def _new_scratch(self, name: str, view: ScratchView, type_name: str | None) -> Scratch:
        """A scratch file ``name`` of metadata/ (in the tree; not a key)."""
        node = self.tree.new_node(view)
        scratch = Scratch(name, node, view, type_name)
        node.xattrs = {TYPE_XATTR: (type_name or "string").encode()}
        self.meta_dir.children[name] = node
        self._scratch[node.ino] = scratch
        self._touch(self.meta_dir, node)
        return scratch

    def _scratch_handle(self, scratch: Scratch, truncate: bool) -> MetadataWrite:
        """A write session of a scratch file (a ``MetadataWrite`` of no key yet) that writes
        the file's bytes in place (a rename or a read before the close sees them)."""
        handle = MetadataWrite(self, scratch.node, MAX_METADATA_TEXT, True, None,
                               scratch.type_name or "string", created=True)
        if truncate:
            del scratch.view.data[:]
        handle.buf = scratch.view.data
        return handle

    # -- writing -----------------------------------------------------------------------------
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

    def set_type(self, node, type_name: str) -> None:
        """``user.tensorfs.type``: the GGUF type a new key is read in, or a key re-typed."""
        with self.editing():
            self.session.check_type(type_name)
            scratch = self._scratch.get(node.ino)
            if scratch is not None:
                scratch.type_name = type_name
                if scratch.handle is not None:
                    scratch.handle.type_name = type_name
                node.xattrs = {TYPE_XATTR: type_name.encode()}
                return
            key = self._key_of.get(node.ino)
            if key is None:
                raise EditRefused(errno.EPERM, f"{TYPE_XATTR} is set on metadata/ files only")
            committed = self.session.retype_key(key, type_name, node.view.read(0, node.view.size))
            self._shown(committed)
            self._show_key(key, committed.state.metadata[key])

    # -- closing: the edit takes effect (WriteHandle.flush calls these) ---------------------
    def keep_metadata(self, handle: MetadataWrite) -> None:
        if handle.key is None:
            self._keep_scratch(handle)
            return
        typed = self.session.parsed(handle.key, handle.type_name, bytes(handle.buf),
                                    "the key keeps its value")
        if handle.node.ino not in self._key_of:
            raise EditRefused(errno.ENOENT, f"metadata/{handle.key}: removed meanwhile")
        self._set_key(handle.key, typed)

    def _keep_scratch(self, handle: MetadataWrite) -> None:
        """A scratch file closed: under a key name it becomes that key (in the type set on
        it, else a string); under a scratch name it stays what it is."""
        scratch = self._scratch.get(handle.node.ino)
        if scratch is None:         # renamed over a key, or removed, while open
            return
        scratch.view.mtime_ns = time.time_ns()
        if not is_key_name(scratch.name, self.format):
            return
        key = _unescape(scratch.name)
        typed = self.session.parsed(key, scratch.type_name or "string",
                                    bytes(scratch.view.data), "the key is not made")
        shown = self.meta_dir.children.setdefault(scratch.name, handle.node)
        if shown is not handle.node:        # hidden by a close refused, and taken since
            raise EditRefused(errno.EEXIST, f"metadata/{scratch.name}: made meanwhile")
        self._shown(self.session.set_key(key, typed))
        self._become_key(handle.node, key, typed)
        handle.key, handle.buf, handle.created = key, bytearray(handle.buf), False

    def _become_key(self, node, key: str, typed) -> None:
        """A scratch file's node is now the file of ``key`` (committed already)."""
        scratch = self._scratch.pop(node.ino, None)
        if scratch is not None and scratch.handle is not None:
            scratch.handle.created = False
        self._key_of[node.ino] = key
        self._show_key(key, typed)

    def _canonical(self, name: str, key: str) -> None:
        """A key name is the one metadata/ shows for its key: another spelling of it
        (``a%2Eb`` for ``a.b``) would make a second file of one key."""
        if is_key_name(name, self.format) and metadata_file_name(key) != name:
            raise EditRefused(errno.EINVAL, f"metadata/{name}: the file of key {key!r} is "
                              f"metadata/{metadata_file_name(key)}")

    def _leave_type(self, name: str, node) -> None:
        self._left_types.pop(name, None)
        self._left_types[name] = node.xattrs[TYPE_XATTR].decode()
        while len(self._left_types) > MAX_SCRATCH_FILES:
            del self._left_types[next(iter(self._left_types))]

    def scratch_bytes(self) -> int:
        return sum(len(s.view.data) for s in self._scratch.values())

    def _set_key(self, key: str, typed) -> None:
        self._shown(self.session.set_key(key, typed))
        self._show_key(key, typed)

    def keep_raw(self, handle: RawWrite) -> None:
        pending = handle.pending
        if pending is None:         # nothing written since the bytes were last kept
            return
        committed, data_name = self.session.replace_raw(handle.tensor, pending)
        handle.pending = None           # a later write starts from the bytes kept now
        self._shown(committed)
        self._set_views(handle.node, handle.tensor, data_name)

    def keep_npy(self, handle: NpyWrite) -> None:
        committed, data_name = self.session.replace_npy(handle.tensor, bytes(handle.buf))
        self._shown(committed)
        self._set_views(handle.node, handle.tensor, data_name)

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

    def _unmade(self, scratch: Scratch) -> None:
        """A scratch file under a key name that was never closed with a value it reads as:
        not made (gone from metadata/)."""
        if not is_key_name(scratch.name, self.format):
            return
        node = scratch.node
        self._scratch.pop(node.ino, None)
        if self.meta_dir.children.get(scratch.name) is node:
            del self.meta_dir.children[scratch.name]
        self._touch(self.meta_dir, node)

    # -- removing and renaming ---------------------------------------------------------------
    def ghost(self, parent, name: str):
        """The other file of the tensor removed last, still found by name (not listed)
        until it is removed too or another edit comes: ``rm -r`` lists a directory first,
        then removes each name it saw, the second file of a tensor included."""
        ghost = self._ghost
        if ghost is not None and ghost[0] is parent and ghost[1] == name:
            return ghost[2]
        return None

    def unlink(self, parent, name: str) -> None:
        with self.editing():
            ghost, self._ghost = self._ghost, None
            node = parent.children.get(name)
            if node is None and ghost is not None and ghost[0] is parent and ghost[1] == name:
                return                      # the tensor went with its other file
            if node is None:
                raise EditRefused(errno.ENOENT, name)
            if isinstance(node, DirNode):
                raise EditRefused(errno.EISDIR, name)
            if node.ino in self._scratch:
                del self._scratch[node.ino]
                del parent.children[name]
                self._touch(parent)
                return
            key = self._key_of.get(node.ino)
            if key is not None and parent is self.meta_dir:
                self._shown(self.session.delete_key(key))
                self._leave_type(name, node)
                self._show_key(key, None)
                return
            original = self._original(node)
            if original is None:
                raise EditRefused(errno.EPERM, f"{name}: only metadata/ files and tensors "
                                  "can be removed")
            self._shown(self.session.remove_tensor(original))
            sibling = self._sibling(node)
            for n in (node, sibling):
                for leaf, child in list(parent.children.items()):
                    if child is n:
                        del parent.children[leaf]
                        if n is sibling:
                            self._ghost = (parent, leaf, n)
            self._touch(parent)

    def rmdir(self, parent, name: str) -> None:
        with self.editing():
            node = parent.children.get(name)
            if node is None:
                raise EditRefused(errno.ENOENT, name)
            if not isinstance(node, DirNode):
                raise EditRefused(errno.ENOTDIR, name)
            if node is self.meta_dir or not self.writable(node) or parent is self.tree.root \
                    and name in READ_ONLY_TOP:
                raise EditRefused(errno.EPERM, f"{name}: not removable")
            if node.children:
                raise EditRefused(errno.ENOTEMPTY, name)
            del parent.children[name]
            self._touch(parent)

    def rename(self, parent, name: str, new_parent, new_name: str) -> None:
        with self.editing():
            node = parent.children.get(name)
            if node is None:
                raise EditRefused(errno.ENOENT, name)
            if parent is self.meta_dir or new_parent is self.meta_dir:
                if parent is not new_parent:
                    raise EditRefused(errno.EXDEV, "metadata keys stay in metadata/")
                self._rename_key(node, name, new_name)
            elif isinstance(node, DirNode):
                self._rename_dir(node, parent, name, new_parent, new_name)
            else:
                self._rename_tensor(node, parent, new_parent, new_name)
            self._touch(parent, new_parent)

    def _rename_key(self, node, name: str, new_name: str) -> None:
        """``mv`` inside metadata/ (docs/editing.md): onto a key, the moved file's text is
        that key's new value, read in that key's type (sed -i, perl -pi, an atomic
        write's rename); a key to a new key name is renamed, type and all; a scratch file to
        a key name becomes that key; a key to a scratch name (vim's backup) leaves the model
        and is a scratch file holding its text, and the type goes to a file made again
        under the key's name."""
        fmt = self.format
        if new_name == name:
            return
        children = self.meta_dir.children
        key = self._key_of.get(node.ino)
        scratch = self._scratch.get(node.ino)
        if key is None and scratch is None:
            raise EditRefused(errno.EPERM, f"metadata/{name}: not a key nor a new file")
        new_key = _unescape(new_name)
        self.session.check_key_name(new_key, new_name)
        self._canonical(new_name, new_key)
        target = children.get(new_name)
        target_key = self._key_of.get(target.ino) if target is not None else None
        text = bytes(scratch.view.data) if scratch is not None else node.view.read(0, node.view.size)
        if target_key is not None:
            # a replace: the key keeps its type
            typed = self.session.parsed(target_key, target.xattrs[TYPE_XATTR].decode(), text,
                                 "the key keeps its value")
            new_key = target_key
        elif is_key_name(new_name, fmt):
            typed = self.session.key_typed(key) if key is not None else self.session.parsed(
                new_key, (scratch.type_name if scratch is not None else None) or "string", text,
                "the key is not made")
        else:
            typed = None                    # a scratch file afterwards
        committed = self.session.move_key(key, new_key, typed)
        if committed is not None:
            self._shown(committed)
        # the tree: the moved node is now at new_name, whatever was there goes
        if target is not None:
            self._key_of.pop(target.ino, None)
            self._scratch.pop(target.ino, None)
        del children[name]
        children[new_name] = node
        if key is not None:
            self._key_of.pop(node.ino, None)
            self._touch(node)
        if typed is not None:
            self._become_key(node, new_key, typed)
        elif scratch is not None:
            scratch.name = new_name
        else:                               # a key moved to a scratch name
            view = ScratchView(bytearray(text))
            node.view = view
            scratch = self._scratch[node.ino] = Scratch(new_name, node, view, None)
            self._leave_type(name, node)
        self._touch(self.meta_dir)

    def _tensor_dir(self, directory: DirNode) -> str:
        path = self._dir_paths.get(directory.ino)
        if path is None or path.split("/")[0] in READ_ONLY_TOP or self.layout != "tree":
            raise EditRefused(errno.EPERM, "not a directory of tensors")
        return path

    def _rename_dir(self, node: DirNode, parent, name: str, new_parent, new_name: str) -> None:
        """``mv a/b a/c``: every tensor below renamed (``a.b.x`` to ``a.c.x``)."""
        old_path = "/".join(p for p in (self._tensor_dir(parent), name) if p)
        new_path = "/".join(p for p in (self._tensor_dir(new_parent), new_name) if p)
        if "." in new_name or not new_name:
            raise EditRefused(errno.EINVAL, f"{new_name!r}: a directory name has no dots")
        if new_name in new_parent.children:
            raise EditRefused(errno.EEXIST, f"{new_path}: exists already")
        if (new_path + "/").startswith(old_path + "/"):
            raise EditRefused(errno.EINVAL, "a directory cannot move into itself")
        old_prefix = ".".join(_unescape(p) for p in old_path.split("/"))
        new_prefix = ".".join(_unescape(p) for p in new_path.split("/"))
        files, dirs = [], []
        pending = [(node, old_path)]
        while pending:
            directory, path = pending.pop()
            dirs.append((directory, path))
            for leaf, child in directory.children.items():
                if isinstance(child, DirNode):
                    pending.append((child, f"{path}/{leaf}"))
                elif self._original(child) is not None:
                    files.append(child)
        mapping = {}
        for original in {self._original(f) for f in files}:
            assert original is not None
            name_now = self.session.current_name(original)
            if name_now is None or not name_now.startswith(old_prefix + "."):
                raise EditRefused(errno.EPERM, f"{name_now!r} is not named after {old_path}")
            mapping[original] = new_prefix + name_now[len(old_prefix):]
        self._shown(self.session.commit(self.session.renamed(mapping)))
        del parent.children[name]
        new_parent.children[new_name] = node
        for directory, path in dirs:
            self._dir_paths[directory.ino] = new_path + path[len(old_path):]
        for f in files:
            self._tensor_of[f.ino] = self._original(f)
        self._touch(node)

    def _rename_tensor(self, node, parent, new_parent, new_name: str) -> None:
        original = self._original(node)
        if original is None:
            raise EditRefused(errno.EPERM, "only tensor files can be renamed here")
        directory = self._dir_paths.get(new_parent.ino)
        if directory is None or directory.split("/")[0] in READ_ONLY_TOP:
            raise EditRefused(errno.EPERM, "not a directory of tensors")
        leaf = new_name
        for suffix in (".npy", ".raw"):
            if leaf.endswith(suffix):
                leaf = leaf[:-len(suffix)]
                break
        if self.layout == "tree":
            if "." in leaf:
                raise EditRefused(errno.EINVAL, f"{new_name!r}: a name in the tree is a "
                                  "directory path (no dots)")
            parts = (directory.split("/") if directory else []) + [leaf]
            new_tensor = ".".join(_unescape(p) for p in parts)
        else:
            if directory:
                raise EditRefused(errno.EPERM, "the flat layout has no directories")
            new_tensor = _unescape(leaf)
        state = self.session.renamed({original: new_tensor})
        nodes = [n for n in (node, self._sibling(node)) if n is not None]
        removed = []
        for n in nodes:
            for leaf_name, child in list(parent.children.items()):
                if child is n:
                    del parent.children[leaf_name]
                    removed.append((leaf_name, n))
        placed: list = []
        try:
            self._place_tensor(original, new_tensor, nodes, placed)
            committed = self.session.commit(state)      # refused (the disk full): undone
        except OSError:
            for where, leaf_name in placed:
                del where.children[leaf_name]
            for leaf_name, n in removed:
                parent.children[leaf_name] = n
            raise
        self._shown(committed)


class ComposedView(View):
    """A model file in files/ of an editable mount, one version of it: the file composed
    for one ``EditState`` (composed when first read, unless given).  Its bytes never change:
    an edit makes a new node (``Editor._new_versions``), so an open reads one version."""

    cheap_size = True
    mtime_ns: int | None

    def __init__(self, session: EditSession, path: str, state: EditState, mtime_ns: int,
                 composed: ComposedFile | None = None):
        self.session = session
        self.path = path
        self.state = state
        self._file = composed
        self.mtime_ns = mtime_ns

    def file(self) -> ComposedFile:
        found = self._file
        if found is None:
            with self.session.lock:
                found = self._file = self.session.composed(self.path, self.state)
        return found

    @property
    def size(self) -> int:
        return self.file().size

    def snapshot(self) -> View:
        return self

    def read_into(self, offset: int, buf) -> int:
        return self.file().read_into(offset, buf)

    def read_or_wait(self, offset: int, buf) -> int | Future[int]:
        """A remote model's kept tensors' bytes without a thread (``ComposedFile``)."""
        return self.file().read_or_wait(offset, buf)

    def read(self, offset: int, size: int) -> bytes:
        return self.file().read(offset, size)


class _GeneratedVersion(GeneratedView):
    """metadata.json of an editable mount, one version of it (``Editor._new_versions``): a
    reader that opened it reads that version (its handle holds the view), not the next
    edit's bytes from the middle of the file on."""

    def snapshot(self) -> View:
        return self


class IndexView(View):
    """A sharded safetensors model's index in files/, its weight_map as edited: one version,
    as ``ComposedView``."""

    cheap_size = True
    mtime_ns: int | None

    def __init__(self, session: EditSession, state: EditState, mtime_ns: int):
        self.session = session
        self.state = state
        self._data: bytes | None = None
        self.mtime_ns = mtime_ns

    def _bytes(self) -> bytes:
        data = self._data
        if data is None:
            data = self._data = self.session.index_bytes(self.state)
        return data

    @property
    def size(self) -> int:
        return len(self._bytes())

    def snapshot(self) -> View:
        return self

    def read(self, offset: int, size: int) -> bytes:
        return self._bytes()[offset:offset + size]
