"""The tensors' files of an editable mount (``--edits DIR``, docs/reference/editing.md): a tensor's raw
file and ``.npy`` view showing its new bytes (``_set_views``), a raw file or an ``.npy``
written made the tensor's bytes (``keep_raw``, ``keep_npy``), and a tensor's files placed
under a name (``_place_tensor``), the kept edits shown in a fresh tree (``_replay``)."""

from __future__ import annotations

import errno

from tensorfs.convert.plan import plan_view
from tensorfs.editing.session import EditRefused
from tensorfs.editing.store import EditState, PendingData
from tensorfs.mount.editbase import EditorBase
from tensorfs.mount.edithandles import (
    NpyWrite,
    RawWrite,
)
from tensorfs.mount.tree import TensorXattrs
from tensorfs.views.byteviews import ConvertedView, NpyView, RawView
from tensorfs.views.names import DirNode, FileNode, tensor_paths


class TensorEdits(EditorBase):
    """The tensors' files (a part of ``Editor``)."""

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

    def new_data(self) -> PendingData:
        return self.store.new_data()

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
