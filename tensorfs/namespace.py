"""Tensor names -> paths inside the mount, and the tree of nodes those paths make.

The escaping rule (docs/names.md has the user's version):

1. A name is split on "." into components.  So no component ever contains a ".", and every
   name with a "." in it is free for tensorfs's own files (``weight.npy``, ``weight.raw``).
2. In each component, "%", "/", control characters (U+0000-U+001F, U+007F) and anything that
   is not valid Unicode are written as %XX, one per UTF-8 byte.  An empty component (a name
   with a leading, trailing or doubled ".") is written as a lone "%".
3. A file or directory name longer than 200 bytes after rule 2 (a component in the tree
   layout, the whole joined name in the flat layout) keeps its first 180 bytes and gets
   "%~" plus 16 hex digits of the SHA-256 of what it stands for (the kernel allows 255
   bytes in a name, and ".npy" must still fit).
4. A top-level name that is reserved (``header.bin``, ``headers``, ``metadata.json``,
   ``metadata``) gets its first character written as %XX: in the tree layout the first
   component, in the flat layout the whole flat name.
5. tree layout: components are directories, the last one the raw file; the .npy view is the
   raw file's path plus ".npy".  When a tensor's raw path is also a directory (``a.b`` and
   ``a.b.c``), its raw file is ``PATH.raw`` beside the directory (its view stays
   ``PATH.npy``).
6. flat layout: the escaped components joined by "."; a name that then ends in ".npy" gets
   that last "." written as %2E, so a raw file is never mistaken for a view.

Every rule is a function of the name alone except 5's ".raw", which depends on whether the
other names make the path a directory — it is still deterministic for a given model.
Escaping is injective: %-decoding the components of a path gives back the name.
"""

from __future__ import annotations

import hashlib
import re
from typing import NamedTuple

RESERVED_TOP_LEVEL = frozenset({"header.bin", "headers", "metadata.json", "metadata"})
MAX_COMPONENT_BYTES = 200
KEEP_BYTES_WHEN_HASHED = 180


def _percent(ch: str) -> str:
    return "".join(f"%{b:02X}" for b in ch.encode("utf-8", "surrogateescape"))


def _needs_escape(ch: str) -> bool:
    code = ord(ch)
    return ch in "%/" or code < 0x20 or code == 0x7F or 0xD800 <= code <= 0xDFFF


_ANY_TO_ESCAPE = re.compile("[%/\x00-\x1f\x7f\ud800-\udfff]")


def escape_component(component: str) -> str:
    if component == "":
        return "%"
    if not _ANY_TO_ESCAPE.search(component):          # the common case, ~50x faster
        return component
    return "".join(_percent(ch) if _needs_escape(ch) else ch for ch in component)


def _fit(escaped: str, original: str) -> str:
    if len(escaped) <= MAX_COMPONENT_BYTES // 4:      # no 50 characters exceed 200 bytes
        return escaped
    raw = escaped.encode("utf-8")
    if len(raw) <= MAX_COMPONENT_BYTES:
        return escaped
    digest = hashlib.sha256(original.encode("utf-8", "surrogateescape")).hexdigest()[:16]
    return raw[:KEEP_BYTES_WHEN_HASHED].decode("utf-8", "ignore") + "%~" + digest


def _escape_reserved(first: str) -> str:
    return _percent(first[0]) + first[1:]


class TensorPaths(NamedTuple):
    raw: str        # the tensor's bytes as stored
    npy: str        # its .npy view (if it has one)


def tensor_paths(names, layout: str = "tree") -> dict[str, TensorPaths]:
    """name -> paths of the tensor's files, relative to the mount, for every name."""
    if layout not in ("tree", "flat"):
        raise ValueError(f"unknown layout {layout!r}")
    paths: dict[str, str] = {}
    escaped_parts: dict[str, str] = {}       # models repeat "weight", "layers", "0" ...
    for name in names:
        components = name.split(".")
        if layout == "flat":
            path = ".".join(escape_component(c) for c in components)
            if path.endswith(".npy"):
                path = path[:-4] + "%2Enpy"
            path = _fit(path, name)
            if path in RESERVED_TOP_LEVEL:
                path = _escape_reserved(path)
        else:
            parts = []
            for c in components:
                part = escaped_parts.get(c)
                if part is None:
                    part = escaped_parts[c] = _fit(escape_component(c), c)
                parts.append(part)
            if parts[0] in RESERVED_TOP_LEVEL:
                parts[0] = _escape_reserved(parts[0])
            path = "/".join(parts)
        paths[name] = path
    directories = set()
    if layout == "tree":
        for path in paths.values():
            parent = path.rpartition("/")[0]
            while parent and parent not in directories:
                directories.add(parent)
                parent = parent.rpartition("/")[0]
    return {name: TensorPaths(path + ".raw" if path in directories else path, path + ".npy")
            for name, path in paths.items()}


# -- the tree -------------------------------------------------------------------------------

class FileNode:
    """A file: its view (anything with .size and .read(offset, size)) and extended
    attributes (a mapping name -> bytes, which may compute its values lazily)."""

    __slots__ = ("view", "xattrs", "ino")

    def __init__(self, view, xattrs, ino: int):
        self.view = view
        self.xattrs = xattrs if xattrs is not None else {}
        self.ino = ino


class DirNode:
    __slots__ = ("children", "ino")

    def __init__(self, ino: int):
        self.children: dict[str, FileNode | DirNode] = {}
        self.ino = ino


class TreeConflict(ValueError):
    pass


class Tree:
    """Directories and files addressed by "/"-separated paths relative to the root.

    Inode numbers are handed out in the order nodes are added: the same model gives the
    same numbers at every mount.  Directories are found by their path in one dict, so
    adding a file costs the same however deep it lies; every node by its inode number in
    one list (8 bytes a node), which is how FUSE asks for them.
    """

    def __init__(self):
        self.root = DirNode(1)
        self._dirs: dict[str, DirNode] = {"": self.root}
        self._by_ino: list = [None, self.root]

    def add_dir(self, path: str) -> DirNode:
        node = self._dirs.get(path)
        if node is None:
            parent_path, _, name = path.rpartition("/")
            parent = self.add_dir(parent_path)
            if name in parent.children:
                raise TreeConflict(f"{path}: is a file")
            node = parent.children[name] = self._dirs[path] = DirNode(len(self._by_ino))
            self._by_ino.append(node)
        return node

    def add_file(self, path: str, view, xattrs=None) -> FileNode:
        parent_path, _, leaf = path.rpartition("/")
        parent = self._dirs.get(parent_path) or self.add_dir(parent_path)
        children = parent.children
        if leaf in children:
            raise TreeConflict(f"{path}: exists already")
        by_ino = self._by_ino
        node = children[leaf] = FileNode(view, xattrs, len(by_ino))
        by_ino.append(node)
        return node

    def node(self, ino: int):
        """The node with this inode number, or None."""
        return self._by_ino[ino] if 0 < ino < len(self._by_ino) else None

    def lookup(self, path: str):
        """The node at an absolute path ("/a/b"), or None."""
        node = self.root
        if path in ("/", ""):
            return node
        for part in path.strip("/").split("/"):
            if not isinstance(node, DirNode):
                return None
            node = node.children.get(part)
            if node is None:
                return None
        return node
