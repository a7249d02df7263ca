"""The keys of an editable mount's metadata/ (``--edits DIR``, docs/reference/editing.md): a key's file
shown as its value (``_show_key``), a key written (``keep_metadata``) or re-typed
(``set_type``), and the scratch files a tool makes there (a temporary, swap or backup file:
``Editor.create``), which become a key when closed under a key name (``is_key_name``).  The naming
rules of metadata/ are here: which new name is a key, and a file name back to its key
(``unescape``)."""

from __future__ import annotations

import errno
import re
import time

from tensorfs.editing.compose import typed_value
from tensorfs.editing.session import EditRefused
from tensorfs.mount.editbase import TYPE_XATTR, EditorBase
from tensorfs.mount.edithandles import (
    MAX_SCRATCH_FILES,
    MetadataWrite,
    Scratch,
    ScratchView,
)
from tensorfs.mount.metadata_files import metadata_file_name, metadata_view


def unescape(name: str) -> str:
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
    scratch file of the mount (docs/reference/editing.md): a name that starts with ``.`` (vim's
    ``.KEY.swp``), ends with ``~`` (a backup), is only digits (vim's ``4913``), is a
    tool's temporary name (sed's ``sedAbC123``, perl's ``XXwdnW4t``, Python's
    ``tmpk2j3x9ab``) or ends with ``.tmp``, ``.new``, ``.bak`` ... (``KEY.tmp``) is scratch,
    and so, in a GGUF model, whose keys are dotted (``general.name``), is a name without a
    dot inside it."""
    if not name or name.startswith(".") or name.endswith("~") or name.isdigit() \
            or _TOOL_TEMPORARY.fullmatch(name):
        return False
    return fmt != "gguf" or "." in name.strip(".")


class KeyEdits(EditorBase):
    """The keys and scratch files of metadata/ (a part of ``Editor``)."""

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

    def _new_scratch(self, name: str, view: ScratchView, type_name: str | None) -> Scratch:
        """A scratch file ``name`` of metadata/ (in the tree; not a key)."""
        node = self.tree.new_node(view)
        scratch = Scratch(name, node, view, type_name)
        node.xattrs = {TYPE_XATTR: (type_name or "string").encode()}
        self.meta_dir.children[name] = node
        self._scratch[node.ino] = scratch
        self._touch(self.meta_dir, node)
        return scratch

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
        key = unescape(scratch.name)
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
        return sum(len(s.view.data) for s in list(self._scratch.values()))

    def _set_key(self, key: str, typed) -> None:
        self._shown(self.session.set_key(key, typed))
        self._show_key(key, typed)

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
