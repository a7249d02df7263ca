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
from dataclasses import dataclass, field
from typing import NamedTuple

RESERVED_TOP_LEVEL = frozenset({"header.bin", "headers", "metadata.json", "metadata"})
MAX_COMPONENT_BYTES = 200
KEEP_BYTES_WHEN_HASHED = 180


def _percent(ch: str) -> str:
    return "".join(f"%{b:02X}" for b in ch.encode("utf-8", "surrogateescape"))


def _needs_escape(ch: str) -> bool:
    code = ord(ch)
    return ch in "%/" or code < 0x20 or code == 0x7F or 0xD800 <= code <= 0xDFFF


def escape_component(component: str) -> str:
    if component == "":
        return "%"
    return "".join(_percent(ch) if _needs_escape(ch) else ch for ch in component)


def _fit(escaped: str, original: str) -> str:
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
            parts = [_fit(escape_component(c), c) for c in components]
            if parts[0] in RESERVED_TOP_LEVEL:
                parts[0] = _escape_reserved(parts[0])
            path = "/".join(parts)
        paths[name] = path
    directories = set()
    if layout == "tree":
        for path in paths.values():
            parts = path.split("/")
            for i in range(1, len(parts)):
                directories.add("/".join(parts[:i]))
    return {name: TensorPaths(path + ".raw" if path in directories else path, path + ".npy")
            for name, path in paths.items()}


# -- the tree -------------------------------------------------------------------------------

@dataclass
class FileNode:
    view: object                       # anything with .size and .read(offset, size)
    xattrs: dict[str, bytes] = field(default_factory=dict)
    ino: int = 0


@dataclass
class DirNode:
    children: dict[str, "FileNode | DirNode"] = field(default_factory=dict)
    ino: int = 0


class TreeConflict(ValueError):
    pass


class Tree:
    """Directories and files addressed by "/"-separated paths relative to the root."""

    def __init__(self):
        self.root = DirNode()

    def add_file(self, path: str, view, xattrs: dict[str, bytes] | None = None) -> FileNode:
        *dirs, leaf = path.split("/")
        node = self.root
        for part in dirs:
            child = node.children.get(part)
            if child is None:
                child = node.children[part] = DirNode()
            elif not isinstance(child, DirNode):
                raise TreeConflict(f"{path}: {part} is a file")
            node = child
        if leaf in node.children:
            raise TreeConflict(f"{path}: exists already")
        file_node = node.children[leaf] = FileNode(view, xattrs or {})
        return file_node

    def number_inodes(self) -> None:
        """Stable inode numbers: root is 1, then every node in sorted path order."""
        counter = 1
        self.root.ino = counter
        stack = [self.root]
        while stack:
            node = stack.pop()
            for name in sorted(node.children, reverse=True):
                child = node.children[name]
                counter += 1
                child.ino = counter
                if isinstance(child, DirNode):
                    stack.append(child)

    def lookup(self, path: str):
        """The node at an absolute FUSE path ("/a/b"), or None."""
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

    def walk_files(self, prefix: str = ""):
        """(path, FileNode) for every file, sorted by path."""
        stack = [(prefix, self.root)]
        out = []
        while stack:
            base, node = stack.pop()
            for name, child in node.children.items():
                path = f"{base}/{name}" if base else name
                if isinstance(child, DirNode):
                    stack.append((path, child))
                else:
                    out.append((path, child))
        return sorted(out)
