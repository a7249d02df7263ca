"""The document behind metadata.json and ``tensorfs inspect --json`` (SPEC §3)."""

from __future__ import annotations

import json
import os

from tensorfs.location import is_url
from tensorfs.model import Model
from tensorfs.plan import ViewPlan


def metadata_document(model: Model, paths: dict, plans: dict[str, ViewPlan],
                      views: tuple[str, ...] = ("raw", "npy")) -> dict:
    first = model.files[0]
    doc: dict = {
        "format": first.format,
        "version": first.version,
        "file": os.path.basename(model.source),
        "file_size": sum(f.file_size for f in model.files),
        "endianness": first.endianness,
        "alignment": first.alignment,
        "data_offset": first.data_offset,
        "metadata": {key: value.value() for key, value in model.metadata.items()},
        "metadata_types": {key: value.type_name for key, value in model.metadata.items()},
    }
    remote = model.url is not None or is_url(model.source)
    if remote:      # SPEC §8: the URL as named (no credentials), the version each file had
        doc["source"] = model.url or model.source
        if not model.sharded:       # "version" is the format's (GGUF 3)
            doc["source_version"] = _version(model, first)
    if model.sharded:
        doc["shards"] = [{"file": os.path.basename(f.path), "size": f.file_size,
                          "format": f.format, "data_offset": f.data_offset}
                         for f in model.files]
        if remote:
            for entry, f in zip(doc["shards"], model.files):
                entry["version"] = _version(model, f)
    tensors = {}
    for tensor in model.tensors:
        plan = plans[tensor.name]
        entry = {
            "dtype": tensor.dtype,
            "shape": list(tensor.shape),
            "offset": tensor.offset,
            "nbytes": tensor.nbytes,
            "path": paths[tensor.name].raw,
            "npy_dtype": plan.npy_dtype,
            "converted": plan.kind == "converted",
        }
        if plan.kind is None:
            entry["raw_only"] = plan.reason
        if model.sharded:
            entry["shard"] = os.path.basename(tensor.file)
        tensors[tensor.name] = entry
    doc["tensors"] = tensors
    if tuple(views) != ("raw", "npy"):      # a mount --views raw or npy says what it serves
        doc["views"] = list(views)
    return doc


def _version(model: Model, f) -> str | None:
    source = model.sources.get(f.path)
    return getattr(source, "version", None)


def metadata_json_bytes(doc: dict) -> bytes:
    try:
        return (json.dumps(doc, indent=2, ensure_ascii=False) + "\n").encode("utf-8")
    except UnicodeEncodeError:
        # Undecodable bytes in a vocabulary (lone surrogates) cannot be UTF-8; as \u escapes
        # the JSON stays valid and json.loads gives back the same strings.
        return (json.dumps(doc, indent=2, ensure_ascii=True) + "\n").encode("ascii")
