"""The model a fact command works on (docs/reference/facts.md): opened as a mount opens it, its
tensors in stored order, and the one line for a tensor name it lacks.

A model is opened with ``tensorfs.api.open`` (the loader, sources and block cache a mount
uses), so every MODEL form works and whatever a mount refuses is refused here with the same
error.
"""

from __future__ import annotations

import difflib

from tensorfs import api
from tensorfs.model import TensorInfo
from tensorfs.sources.urls import is_url


class FactsError(Exception):
    """Something the user named that a fact command cannot use (a manifest, a tensor name):
    one line, like a ``ModelError``."""


def open_model(model: str, storage_options: dict | None = None, timeout: float | None = None):
    """``tensorfs.api.open`` of what the user named: any MODEL form, with the remote options
    for a URL only."""
    if is_url(model):
        return api.open(model, storage_options=storage_options, timeout=timeout)
    return api.open(model)


def stored_order(model) -> list[TensorInfo]:
    """The tensors in the order their bytes are stored: file by file, a GGUF's in the order
    of its tensor infos (llama-gguf-hash's order), a safetensors file's by offset (so the
    whole-model hash of one file is that of its data section)."""
    out: list[TensorInfo] = []
    for f in model.files:
        tensors = list(f.tensors)
        if f.format == "safetensors":
            tensors.sort(key=lambda t: (t.offset, t.nbytes))
        out.extend(tensors)
    return out


def source_of(open_model_, tensor: TensorInfo):
    """The source a tensor's bytes are read from: the one its file was parsed from."""
    return open_model_.model.sources[tensor.file]


def close_names(name: str, known, limit: int = 3) -> list[str]:
    """The names of ``known`` a user who typed ``name`` may have meant: those that extend it
    by a dotted part (``blk.0.attn_q`` -> ``blk.0.attn_q.weight``), then difflib's."""
    known = list(known)
    extended = sorted(k for k in known if k.startswith(name + "."))
    close = [k for k in difflib.get_close_matches(name, known, n=limit, cutoff=0.75)
             if k not in extended]
    return (extended + close)[:limit]


def no_tensor_named(model: str, name: str, known) -> FactsError:
    """The one line for a tensor name the model lacks, naming the close ones."""
    from tensorfs.errors import printable

    close = close_names(name, known)
    hint = f" (did you mean {', '.join(repr(printable(c)) for c in close)}?)" if close else ""
    return FactsError(f"{model}: no tensor named '{printable(name)}'{hint}")
