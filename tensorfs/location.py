"""Where the files of a model live: a local directory, or a remote prefix (``tensorfs.remote``,
chosen by ``tensorfs.loader.location_for``).

``tensorfs.shards`` resolves what the user named (a file, an index, a directory, a split
GGUF's first shard) through a location only, so that every local form has a remote twin with
the same rules and the same errors.  A location lists a directory's files, joins a sibling
name, says what a path is, and opens a path as a source (``tensorfs.source``).  Every source
it opens is recorded: ``attach`` gives the model the ones its files were parsed from and
closes the rest (an index, a rejected candidate).
"""

from __future__ import annotations

import dataclasses
import os
import stat
from concurrent.futures import ThreadPoolExecutor
from urllib.parse import urlsplit, urlunsplit

from tensorfs.errors import ModelError
from tensorfs.model import Model, ModelFile

# what ``kind`` answers
FILE, DIRECTORY, OTHER = "file", "directory", "other"


def display_url(url: str) -> str:
    """``url`` without ``user:password@``, ``?query`` or ``#fragment``."""
    parts = urlsplit(url)
    host = parts.netloc.rpartition("@")[2]
    return urlunsplit((parts.scheme, host, parts.path, "", ""))


def is_url(text: str) -> bool:
    scheme, sep, _ = text.partition("://")
    return bool(sep) and scheme.replace("+", "").replace("-", "").isalnum() and "/" not in scheme


class Location:
    """What ``tensorfs.shards`` needs of the place the model's files are in."""

    parallel = 1                # shards whose headers are fetched at once

    def __init__(self):
        self.opened: dict[str, object] = {}

    # -- to be given by each kind of place -------------------------------------------------
    def normalize(self, path: str) -> str:
        return path

    def kind(self, path: str) -> str | None:
        """FILE, DIRECTORY, OTHER (a FIFO, a device ...) or None when nothing is there."""
        raise NotImplementedError

    def files(self, directory: str) -> list[str]:
        """Sorted names of the regular files in ``directory`` (not hidden ones)."""
        raise NotImplementedError

    def _open(self, path: str):
        raise NotImplementedError

    def join(self, directory: str, name: str) -> str:
        raise NotImplementedError

    def dirname(self, path: str) -> str:
        raise NotImplementedError

    @staticmethod
    def basename(path: str) -> str:
        return path.rstrip("/").rsplit("/", 1)[-1]

    # -- common ----------------------------------------------------------------------------
    def isdir(self, path: str) -> bool:
        return self.kind(path) == DIRECTORY

    def kinds(self, paths: list[str]) -> list[str | None]:
        if self.parallel > 1 and len(paths) > 1:
            with ThreadPoolExecutor(min(self.parallel, len(paths))) as pool:
                return list(pool.map(self.kind, paths))
        return [self.kind(p) for p in paths]

    def open(self, path: str):
        """The source of ``path`` (kept until ``attach`` or ``close_all``)."""
        source = self.opened.get(path)
        if source is None:
            source = self.opened[path] = self._open(path)
        return source

    def parse(self, path: str) -> ModelFile:
        from tensorfs.modelfile import parse_source

        return parse_source(self.open(path))

    def parse_all(self, paths: list[str]) -> list[ModelFile]:
        """Every path parsed (concurrently where the place is remote); the first error in
        the order of ``paths`` is the one raised."""
        if self.parallel > 1 and len(paths) > 1:
            with ThreadPoolExecutor(min(self.parallel, len(paths))) as pool:
                futures = [pool.submit(self.parse, p) for p in paths]
                return [f.result() for f in futures]
        return [self.parse(p) for p in paths]

    def read_all(self, path: str, limit: int) -> bytes | None:
        """A whole (small) file: an index.  None, before any byte is read, when it is larger
        than ``limit`` (its size is known at open)."""
        source = self.open(path)
        if source.size > limit:
            return None
        return source.read(0, source.size)

    def attach(self, model: Model) -> Model:
        keep = {f.path for f in model.files}
        for path in list(self.opened):
            if path not in keep:
                self.opened.pop(path).close()
        return dataclasses.replace(model, sources={f.path: self.opened[f.path]
                                                   for f in model.files})

    def close_all(self) -> None:
        while self.opened:
            self.opened.popitem()[1].close()


class LocalLocation(Location):
    def kind(self, path: str) -> str | None:
        try:
            mode = os.stat(path).st_mode        # symlinks followed (a Hugging Face snapshot)
        except OSError:
            return None
        if stat.S_ISREG(mode):
            return FILE
        return DIRECTORY if stat.S_ISDIR(mode) else OTHER

    def files(self, directory: str) -> list[str]:
        try:
            names = sorted(n for n in os.listdir(directory) if not n.startswith("."))
        except OSError as error:
            raise ModelError("unreadable", f"cannot list directory: {error.strerror}",
                             file=directory) from None
        return [n for n in names if os.path.isfile(os.path.join(directory, n))]

    def _open(self, path: str):
        from tensorfs.source import ModelSource

        return ModelSource(path)

    def join(self, directory: str, name: str) -> str:
        return os.path.join(directory, name)

    def dirname(self, path: str) -> str:
        return os.path.dirname(path)

    @staticmethod
    def basename(path: str) -> str:
        return os.path.basename(path)


LOCAL = LocalLocation
