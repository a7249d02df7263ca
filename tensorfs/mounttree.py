"""Assemble what one mount serves: the model's files opened, every tensor's views, the
generated files, all placed in a ``Tree`` by the naming rule.  FUSE is not involved."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass

from tensorfs.cache import ByteLRU
from tensorfs.metadata_files import add_metadata_files
from tensorfs.metadata_json import metadata_document, metadata_json_bytes
from tensorfs.model import Model
from tensorfs.namespace import TensorPaths, Tree, tensor_paths
from tensorfs.plan import ViewPlan, plan_view
from tensorfs.source import ModelSource
from tensorfs.views import ConvertedView, GeneratedView, NpyView, RawView


@dataclass
class MountedModel:
    model: Model
    tree: Tree
    sources: dict[str, ModelSource]
    paths: dict[str, TensorPaths]
    plans: dict[str, ViewPlan]
    cache: ByteLRU

    def close(self) -> None:
        for source in self.sources.values():
            source.close()


def tensor_xattrs(tensor) -> dict[str, bytes]:
    return {
        "user.tensorfs.dtype": tensor.dtype.encode(),
        "user.tensorfs.shape": json.dumps(list(tensor.shape)).encode(),
        "user.tensorfs.offset": str(tensor.offset).encode(),
        "user.tensorfs.shard": os.path.basename(tensor.file).encode("utf-8", "surrogateescape"),
    }


def describe(model: Model, layout: str = "tree") -> tuple[dict[str, TensorPaths], dict[str, ViewPlan]]:
    """Paths and view plans of every tensor: all that metadata.json needs besides the model."""
    paths = tensor_paths([t.name for t in model.tensors], layout)
    plans = {t.name: plan_view(t) for t in model.tensors}
    return paths, plans


def build_mount(model: Model, cache: ByteLRU, layout: str = "tree") -> MountedModel:
    paths, plans = describe(model, layout)
    sources = {f.path: ModelSource(f.path, f.file_size) for f in model.files}
    tree = Tree()

    if model.sharded:
        for f in model.files:
            tree.add_file(f"headers/{os.path.basename(f.path)}.bin",
                          RawView(sources[f.path], 0, f.header_size))
    else:
        f = model.files[0]
        tree.add_file("header.bin", RawView(sources[f.path], 0, f.header_size))

    def produce_metadata_json() -> bytes:
        return metadata_json_bytes(metadata_document(model, paths, plans))

    tree.add_file("metadata.json", GeneratedView(cache, "metadata.json", produce_metadata_json))
    add_metadata_files(tree, model, cache)

    for tensor in model.tensors:
        source = sources[tensor.file]
        raw = RawView(source, tensor.offset, tensor.nbytes)
        xattrs = tensor_xattrs(tensor)
        path = paths[tensor.name]
        tree.add_file(path.raw, raw, xattrs)
        plan = plans[tensor.name]
        if plan.kind == "native":
            view = NpyView(plan.npy_dtype, tensor.shape, raw)
        elif plan.kind == "converted":
            converted = ConvertedView(source, tensor.offset, tensor.nbytes, plan.conversion,
                                      cache, ("chunk", tensor.name), tensor.n_elements)
            view = NpyView("<f4", tensor.shape, converted)
        else:
            continue
        tree.add_file(path.npy, view, xattrs)

    tree.number_inodes()
    return MountedModel(model, tree, sources, paths, plans, cache)
