"""Open what the user named: a path or a URL, one file or the shards of one model
(``tensorfs.loading.shards``), each file parsed from the source that will serve it
(``tensorfs.sources.modelfile``).  The top of the loading layers: nothing below imports it.
"""

from __future__ import annotations

import dataclasses

from tensorfs.cache import ByteLRU
from tensorfs.loading import checkpoints, shards
from tensorfs.loading.wholefiles import find_companions
from tensorfs.model import Model
from tensorfs.sources.location import LocalLocation
from tensorfs.sources.urls import is_url


def location_for(path: str, remote=None):
    """The location of what the user named: a URL's (``tensorfs.sources.remote``, read as ``remote``,
    a ``RemoteSettings``, says) or the local filesystem's."""
    if is_url(path):
        # a URL only: the transports and their extras cost a mount of a local file nothing
        from tensorfs.sources.remote import RemoteLocation, RemoteSettings

        return RemoteLocation(path, remote or RemoteSettings())
    return LocalLocation()


def load_model(path: str, remote=None, cache: ByteLRU | None = None) -> Model:
    """The model a mount of ``path`` serves: one file, or the shards an index, a split
    GGUF's first shard or a directory stands for (``tensorfs.loading.shards``); ``path`` may be a
    URL, read as ``remote`` (a ``tensorfs.sources.remote.RemoteSettings``) says.  ``Model.sources``
    holds each file's source, opened once and parsed from: the mount serves from them
    (``Model.close()`` when done).  ``cache``: what a checkpoint's gathered tensors are kept
    in (a mount's, ``--cache-size``)."""
    location = location_for(path, remote)
    named = location.normalize(path)
    try:
        model = shards.load(named, location)
        # before attach, which closes what is not a model file (an index read by the parse)
        companions = find_companions(named, model, location)
    except BaseException:
        location.close_all()
        raise
    model = location.attach(model)
    try:
        model = checkpoints.served(model, cache)    # a PyTorch checkpoint: as safetensors
    except BaseException:
        model.close()
        for companion in companions:
            companion.close()
        raise
    # a directory with config.json: the GGUF files llama.cpp's converter would write (the
    # planner imported only then: ~12 ms of the mount command's imports otherwise)
    if any(c.name == "config.json" for c in companions):
        from tensorfs.hfgguf.offer import offers

        companions.gguf_files, companions.gguf_note = offers(model, companions, named)
    model = dataclasses.replace(model, companions=companions)
    if named != path or "://" in path:
        model = dataclasses.replace(model, url=named)
    return model
