"""Removing and renaming in an editable mount (``--edits DIR``, docs/reference/editing.md): every rule
of ``rm`` and ``mv`` in one place.  In metadata/ (``_rename_key``): onto a key, the moved
file's text is that key's new value in its type (``sed -i``); a key to a new key name is
renamed; a scratch file to a key name becomes the key; a key to a scratch name (vim's
backup) leaves the model.  A tensor's file (``_rename_tensor``): the tensor renamed (its
raw file and ``.npy`` together); a directory of the tree (``_rename_dir``): every tensor
below renamed.  ``rm`` of a key deletes it, of a tensor's file removes the tensor (the other
file stays found by name until removed too: ``ghost``)."""

from __future__ import annotations

import errno

from tensorfs.editing.session import EditRefused
from tensorfs.mount.editbase import READ_ONLY_TOP, TYPE_XATTR, EditorBase
from tensorfs.mount.edithandles import (
    Scratch,
    ScratchView,
)
from tensorfs.mount.editkeys import is_key_name, unescape
from tensorfs.views.names import DirNode


class Renames(EditorBase):
    """Removing and renaming (a part of ``Editor``)."""

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
        """``mv`` inside metadata/ (docs/reference/editing.md): onto a key, the moved file's text is
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
        new_key = unescape(new_name)
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
        old_prefix = ".".join(unescape(p) for p in old_path.split("/"))
        new_prefix = ".".join(unescape(p) for p in new_path.split("/"))
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
            new_tensor = ".".join(unescape(p) for p in parts)
        else:
            if directory:
                raise EditRefused(errno.EPERM, "the flat layout has no directories")
            new_tensor = unescape(leaf)
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
