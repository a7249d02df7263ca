"""What every part of an editable mount's tree side shares (``--edits DIR``, docs/reference/editing.md):
``EditorBase`` holds the state (the edit session, the tree's nodes of keys, tensors and
scratch files, the write sessions, the versions of files/ open), shows each edit kept
(``_shown``: new versions of files/ and metadata.json, the kernel told what changed) and
answers which key or tensor a node is of.  The parts of ``tensorfs.mount.editable.Editor``
build on it: the keys and scratch files of metadata/ (``tensorfs.mount.editkeys``), the
tensors' files (``tensorfs.mount.edittensors``), removing and renaming
(``tensorfs.mount.editrenames``); what one part asks of another is declared here."""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator

from tensorfs.editing.session import Committed, EditSession
from tensorfs.editing.store import EditState, EditStore
from tensorfs.loading.wholefiles import Companions
from tensorfs.mount.edithandles import Scratch, WriteHandle
from tensorfs.mount.editversions import ComposedView, GeneratedVersion, GgufVersion, IndexView
from tensorfs.mount.metadata_files import DIRECTORY, metadata_file_name
from tensorfs.mount.metadata_json import metadata_json_pieces
from tensorfs.mount.tree import TENSOR_VIEWS, TensorXattrs, describe
from tensorfs.views.names import DirNode, FileNode, entry_name

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
# why an editable mount offers none of the converter's GGUF files while a tensor is renamed
# or removed (tensorfs.hfgguf: the GGUF follows edits of tensors' bytes only)
GGUF_NOT_FOLLOWED = ("a tensor is renamed or removed by an edit: the converter's GGUF files "
                     "follow edits of tensors' bytes only")

log = logging.getLogger("tensorfs")

#: what ``Editor.on_change`` is: called with the nodes an edit changed, once the edit is
#: done (the FUSE adapter's ``TensorFS._changed``, which has the kernel drop what it cached)
ChangeListener = Callable[[list], None]


class EditorBase(ABC):
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
        # a Hugging Face directory's GGUF files (tensorfs.hfgguf): [source, name, node or
        # None while not offered, xattrs], composed from the model as edited
        self._gguf: list[list] = []
        companions = model.companions
        if files is not None and isinstance(companions, Companions):
            for gguf in companions.gguf_files:
                name = entry_name(gguf.name)
                node = files.children.get(name)
                if node is not None:
                    self._gguf.append([gguf, name, node, node.xattrs])
            if self._gguf:
                self._new_gguf_versions(store.state, None)
                if self._gguf[0][2] is None:        # what list says of the mount
                    companions.gguf_files, companions.gguf_note = (), GGUF_NOT_FOLLOWED

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
        self._new_gguf_versions(state, composed)
        if self.metadata_json is not None:      # its view: _refresh_generated
            new = self.tree.new_node(self.metadata_json.view, self.metadata_json.xattrs)
            self._replace_node(self.tree.root, self.metadata_json, new)
            self.metadata_json = new
        self._forget_old()
        self._touch(directory, self.tree.root)

    def _new_gguf_versions(self, state: EditState, composed: dict | None) -> None:
        """The converter's GGUF files as ``state`` makes the model (``GgufVersion``), each a
        new inode like the model files; none while an edit renames or removes a tensor (the
        converter's output is then another plan's), back once none does."""
        directory = self._files_dir
        if not self._gguf or directory is None:
            return
        followed = all(edit.name == original for original, edit in state.tensors.items())
        if followed != (self._gguf[0][2] is not None):
            log.info("GGUF: %s", "offered again: no tensor is renamed or removed" if followed
                     else f"none offered now: {GGUF_NOT_FOLLOWED}")
        for entry in self._gguf:
            gguf, name, node, xattrs = entry
            if followed:
                new = self.tree.new_node(GgufVersion(self.session, gguf, state, self.mtime_ns,
                                                     composed), xattrs)
                if node is not None:
                    self._replace_node(directory, node, new)
                else:
                    directory.children[name] = new
                entry[2] = new
            elif node is not None:
                if directory.children.get(name) is node:
                    del directory.children[name]
                self._old[node.ino] = None
                entry[2] = None

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
        self.metadata_json.view = GeneratedVersion(self.cache, ("metadata.json", version),
                                                    produce)

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

    # -- what one part asks of another (each implemented by the part named) -----------------
    @abstractmethod
    def _show_key(self, key: str, typed) -> None:
        """metadata/KEY as ``typed`` makes it (None: gone): ``editkeys``."""

    @abstractmethod
    def _become_key(self, node, key: str, typed) -> None:
        """A scratch file's node now the file of ``key``: ``editkeys``."""

    @abstractmethod
    def _canonical(self, name: str, key: str) -> None:
        """Refuse another spelling of a key's file name: ``editkeys``."""

    @abstractmethod
    def _leave_type(self, name: str, node) -> None:
        """A key's type left to a file made again under ``name``: ``editkeys``."""

    @abstractmethod
    def _place_tensor(self, original: str, name: str, nodes, placed: list | None = None) -> None:
        """A tensor's files placed at the paths of ``name``: ``edittensors``."""
