"""Tensor names -> paths inside the mount, and the tree of nodes those paths make.

The escaping rule (docs/reference/names.md has the user's version):

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
   ``metadata``, ``files``) gets its first character written as %XX: in the tree layout the first
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

import bisect
import hashlib
import logging
import re
import threading
from typing import NamedTuple

RESERVED_TOP_LEVEL = frozenset({"header.bin", "headers", "metadata.json", "metadata", "files"})
MAX_COMPONENT_BYTES = 200
KEEP_BYTES_WHEN_HASHED = 180


def _utf8(text: str) -> bytes:
    """``text``'s bytes: an undecodable byte (U+DC80-U+DCFF, surrogateescape) as that byte,
    any other lone surrogate (none comes from a parser that refuses them, but a name is
    never a reason to fail) as its 3-byte encoding."""
    try:
        return text.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:
        return text.encode("utf-8", "surrogatepass")


def _percent(ch: str) -> str:
    return "".join(f"%{b:02X}" for b in _utf8(ch))


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
    digest = hashlib.sha256(_utf8(original)).hexdigest()[:16]
    return raw[:KEEP_BYTES_WHEN_HASHED].decode("utf-8", "ignore") + "%~" + digest


def entry_name(text: str) -> str:
    """Any string as one directory entry with its dots kept (a metadata key in metadata/, a
    shard's file name in headers/): rules 2 and 3, and "." / ".." with their dots as %2E.
    At most ``MAX_COMPONENT_BYTES``, so a suffix of a few bytes (".bin") stays within the
    kernel's 255 (NAME_MAX)."""
    name = escape_component(text)
    if name in (".", ".."):
        name = name.replace(".", "%2E")
    return _fit(name, text)


def _escape_reserved(first: str) -> str:
    return _percent(first[0]) + first[1:]


class TensorPaths(NamedTuple):
    raw: str        # the tensor's bytes as stored
    npy: str        # its .npy view (if it has one)


def tree_component(component: str, top: bool, memo: dict | None = None) -> str:
    """One component of a name as a file or directory name in the tree layout (rules 2-4)."""
    part = memo.get(component) if memo is not None else None
    if part is None:
        part = _fit(escape_component(component), component)
        if memo is not None:
            memo[component] = part
    if top and part in RESERVED_TOP_LEVEL:
        part = _escape_reserved(part)
    return part


def flat_path(name: str) -> str:
    """A whole name as one file name in the flat layout (rules 2-4 and 6)."""
    path = ".".join(escape_component(c) for c in name.split("."))
    if path.endswith(".npy"):
        path = path[:-4] + "%2Enpy"
    path = _fit(path, name)
    if path in RESERVED_TOP_LEVEL:
        path = _escape_reserved(path)
    return path


def tensor_paths(names, layout: str = "tree") -> dict[str, TensorPaths]:
    """name -> paths of the tensor's files, relative to the mount, for every name.

    Time and memory are linear in the names' total length, whatever their shape: rule 5
    asks whether another name continues this one (``name + "."`` is a prefix of it), which
    a bisection of the sorted names answers, instead of keeping every parent path of every
    name (a set of all prefixes, quadratic in a name's depth: a 40,000-dot name cost 1.6 GB).
    Escaping is injective per component, so "a path is a directory" and "a name continues
    this one" are the same question."""
    if layout not in ("tree", "flat"):
        raise ValueError(f"unknown layout {layout!r}")
    names = list(names)
    paths: dict[str, str] = {}
    escaped_parts: dict[str, str] = {}       # models repeat "weight", "layers", "0" ...
    for name in names:
        if layout == "flat":
            paths[name] = flat_path(name)
        else:
            components = name.split(".")
            paths[name] = "/".join([tree_component(components[0], True, escaped_parts)]
                                   + [tree_component(c, False, escaped_parts)
                                      for c in components[1:]])
    continued = _continued(names) if layout == "tree" else frozenset()
    return {name: TensorPaths(path + ".raw" if name in continued else path, path + ".npy")
            for name, path in paths.items()}


def _continued(names: list[str]) -> set[str]:
    """The names that another name continues with a "." (``a.b`` when ``a.b.c`` exists)."""
    ordered = sorted(names)
    out = set()
    for name in names:
        prefix = name + "."
        i = bisect.bisect_left(ordered, prefix)
        if i < len(ordered) and ordered[i].startswith(prefix):
            out.add(name)
    return out


# -- the tree -------------------------------------------------------------------------------

class FileNode:
    """A file: its view (anything with .size and .read(offset, size)) and extended
    attributes (a mapping name -> bytes, which may compute its values lazily)."""

    __slots__ = ("view", "xattrs", "ino")

    def __init__(self, view, xattrs, ino: int):
        self.view = view
        self.xattrs = xattrs if xattrs is not None else {}
        self.ino = ino


# One lock for every directory's first expansion: FUSE threads may ask for the same
# directory at once, and an expansion must happen exactly once.
log = logging.getLogger("tensorfs")

_EXPANDING = threading.Lock()


class DirNode:
    """A directory.  Its entries may be placed when first asked for (``expand``, a function
    that fills ``_entries``); ``children`` is the complete mapping either way."""

    __slots__ = ("_entries", "ino", "_expand")

    def __init__(self, ino: int, expand=None):
        self._entries: dict[str, FileNode | DirNode] = {}
        self.ino = ino
        self._expand = expand

    @property
    def placed(self) -> bool:
        """Whether the entries are made (reading ``children`` makes them)."""
        return self._expand is None

    @property
    def children(self) -> dict:
        if self._expand is not None:
            with _EXPANDING:
                expand = self._expand
                if expand is not None:
                    expand(self)
                    self._expand = None     # only now: a reader never sees half the entries
                    log.debug("directory inode %d: %d entries placed", self.ino,
                              len(self._entries))
        return self._entries


class TreeConflict(ValueError):
    pass


class Tree:
    """Directories and files addressed by "/"-separated paths relative to the root.

    Two ways in.  ``add_file``/``add_dir`` place a few generated files at once; their inode
    numbers are handed out in the order they are added.  ``add_tensors`` (called after
    them) places a model's tensors lazily: a directory's entries are made the first time
    the directory is looked into, so a mount costs nothing per tensor, and inode numbers
    are a function of the names alone (``_TensorPlacer``), the same however and whenever
    the tree is walked, and at every mount of the same model.
    """

    def __init__(self):
        self.root = DirNode(1)
        self._dirs: dict[str, DirNode] = {"": self.root}
        self._by_ino: dict[int, FileNode | DirNode] = {1: self.root}
        self._next_ino = 2

    def _new_ino(self) -> int:
        ino = self._next_ino
        self._next_ino += 1
        return ino

    def add_dir(self, path: str) -> DirNode:
        node = self._dirs.get(path)
        if node is None:
            parent_path, _, name = path.rpartition("/")
            parent = self.add_dir(parent_path)
            if name in parent._entries:
                raise TreeConflict(f"{path}: is a file")
            node = parent._entries[name] = self._dirs[path] = DirNode(self._new_ino())
            self._by_ino[node.ino] = node
        return node

    def add_file(self, path: str, view, xattrs=None) -> FileNode:
        parent_path, _, leaf = path.rpartition("/")
        parent = self._dirs.get(parent_path) or self.add_dir(parent_path)
        entries = parent._entries
        if leaf in entries:
            raise TreeConflict(f"{path}: exists already")
        node = entries[leaf] = FileNode(view, xattrs, self._new_ino())
        self._by_ino[node.ino] = node
        return node

    def add_tensors(self, names: list[str], layout: str, make_files) -> None:
        """Place tensor ``i``'s files where ``tensor_paths`` says, when first asked for.
        ``make_files(i)`` gives ``(raw_view, npy_view or None, xattrs)``; ``xattrs`` may be
        a pair (the raw file's, the view's)."""
        if layout not in ("tree", "flat"):
            raise ValueError(f"unknown layout {layout!r}")
        placer = _TensorPlacer(self, names, layout, make_files)
        self.root._expand = placer.expand_root

    def new_node(self, view=None, xattrs=None, directory: bool = False):
        """A node with a fresh inode number, placed nowhere yet: the caller puts it in a
        directory's ``children`` (an edited mount, tensorfs.mount.editable)."""
        node = DirNode(self._new_ino()) if directory else FileNode(view, xattrs, self._new_ino())
        self._by_ino[node.ino] = node
        return node

    def forget(self, ino: int) -> None:
        """A node given by ``new_node`` that no directory holds and no reader needs any
        more: its inode number no longer finds it."""
        self._by_ino.pop(ino, None)

    def node(self, ino: int):
        """The node with this inode number, or None."""
        return self._by_ino.get(ino)

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


class _TensorPlacer:
    """Makes one directory's tensor entries at a time, by the rules of ``tensor_paths``.

    A directory still to be expanded holds the indices of the names below it and where, in
    each name, its next component starts.  Inode numbers: tensor ``i``'s raw file is
    ``first + 2i``, its view ``first + 2i + 1``; a directory whose first name (in model
    order) is ``i`` and which is component ``d`` of that name is
    ``first + 2n + i * depth_limit + d`` — distinct, and known without the rest of the tree.
    """

    def __init__(self, tree: Tree, names: list[str], layout: str, make_files):
        self.tree, self.names, self.flat, self.make_files = tree, names, layout == "flat", make_files
        self.first_file_ino = tree._next_ino
        self.first_dir_ino = self.first_file_ino + 2 * len(names)
        self.depth_limit = 1 + max((name.count(".") for name in names), default=0)
        tree._next_ino = self.first_dir_ino + len(names) * self.depth_limit
        self.memo: dict[str, str] = {}       # models repeat "weight", "layers", "0" ...

    def expand_root(self, root: DirNode) -> None:
        self._expand(root, range(len(self.names)), None, 0)

    def _expand(self, directory: DirNode, members, starts, depth: int) -> None:
        names, flat = self.names, self.flat
        groups: dict[str, list] = {}     # component -> [its own tensor, [deeper], [starts]]
        for k, i in enumerate(members):
            name = names[i]
            start = 0 if starts is None else starts[k]
            dot = -1 if flat else name.find(".", start)
            component = name[start:] if dot < 0 else name[start:dot]
            group = groups.get(component)
            if group is None:
                group = groups[component] = [None, [], []]
            if dot < 0:
                group[0] = i
            else:
                group[1].append(i)
                group[2].append(dot + 1)
        entries, by_ino = directory._entries, self.tree._by_ino
        top = depth == 0
        for component, (own, deeper, deeper_starts) in groups.items():
            part = flat_path(component) if flat else tree_component(component, top, self.memo)
            if deeper and (own is None or deeper[0] < own):
                self._add_dir(entries, by_ino, part, deeper, deeper_starts, depth)
            if own is not None:
                raw_name = part + ".raw" if deeper else part     # rule 5
                self._add_files(entries, by_ino, raw_name, part + ".npy", own)
            if deeper and own is not None and own < deeper[0]:
                self._add_dir(entries, by_ino, part, deeper, deeper_starts, depth)

    def _add_dir(self, entries, by_ino, part, members, starts, depth) -> None:
        if part in entries:
            raise TreeConflict(f"{part}: exists already")
        ino = self.first_dir_ino + members[0] * self.depth_limit + depth
        entries[part] = by_ino[ino] = DirNode(
            ino, lambda d: self._expand(d, members, starts, depth + 1))

    def _add_files(self, entries, by_ino, raw_name, npy_name, i) -> None:
        raw_view, npy_view, xattrs = self.make_files(i)
        # one mapping for both files, or a pair: the raw file's, the view's
        raw_xattrs, npy_xattrs = xattrs if isinstance(xattrs, tuple) else (xattrs, xattrs)
        ino = self.first_file_ino + 2 * i
        for name, view, node_ino, attrs in ((raw_name, raw_view, ino, raw_xattrs),
                                            (npy_name, npy_view, ino + 1, npy_xattrs)):
            if view is None:
                continue
            if name in entries:
                raise TreeConflict(f"{name}: exists already")
            entries[name] = by_ino[node_ino] = FileNode(view, attrs, node_ino)
