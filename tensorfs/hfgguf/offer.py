"""Which GGUF files a directory model's ``files/`` offers (``tensorfs.hfgguf``), or the
line that says why none: called once the model is loaded, its companions found."""

from __future__ import annotations

import logging
import os
from urllib.parse import urlsplit

from tensorfs.hfgguf.convert import NoGguf, plan
from tensorfs.hfgguf.served import GgufSource, compose
from tensorfs.model import Model
from tensorfs.sources.source import SourceError

log = logging.getLogger("tensorfs")

# a file of the directory read for the metadata (config.json, a tokenizer) at most this big
MAX_READ_BYTES = 64 << 20


def directory_name(named: str) -> str:
    """The name the converter's heuristics read: a local directory's own name; a
    repository's last path part (``hf://org/name`` -> ``name``)."""
    if "://" in named:
        path = urlsplit(named).path.rstrip("/")
        return path.rsplit("/", 1)[-1] or "model"
    return os.path.basename(os.path.abspath(named).rstrip("/")) or "model"


def reader(companions):
    by_name = {c.name: c for c in companions}

    def read(name: str) -> bytes | None:
        companion = by_name.get(name)
        if companion is None:
            return None
        with companion.using() as source:
            size = source.size
            if size > MAX_READ_BYTES:
                raise NoGguf(f"{name} is {size} bytes: too big to be read for the metadata")
            return source.read(0, size) if size else b""
    return read


def offers(model: Model, companions, named: str) -> tuple[tuple[GgufSource, ...], str | None]:
    """(the GGUF files offered, why none is): none for a model not named by its directory
    (no config.json beside it)."""
    if not any(c.name == "config.json" for c in companions):
        return (), None
    try:
        files = [(f.path, f.format, list(f.tensors)) for f in model.files]
        plans = plan(reader(companions), files, directory_name(named))
        sources = dict(model.sources)
        like = sources[model.files[0].path]
        out = []
        for p in plans:
            composed = compose(p, sources, p.name)
            out.append(GgufSource(p.name, composed, like, p))
        return tuple(out), None
    except NoGguf as error:
        return (), str(error)
    except SourceError as error:
        return (), f"a file could not be read: {error.strerror or error}"
    except Exception as error:          # a file the converter would fail on, said in one line
        log.debug("no GGUF offered", exc_info=True)
        text = str(error).splitlines()[0] if str(error) else type(error).__name__
        return (), f"the converter would fail: {type(error).__name__}: {text}"
