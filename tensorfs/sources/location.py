"""Where the files of a model live: a local directory, or a remote prefix (``tensorfs.sources.remote``,
chosen by ``tensorfs.loading.loader.location_for``).

``tensorfs.loading.shards`` resolves what the user named (a file, an index, a directory, a split
GGUF's first shard) through a location only, so that every local form has a remote twin with
the same rules and the same errors.  A location lists a directory's files, joins a sibling
name, says what a path is, and opens a path as a source (``tensorfs.sources.local``).  Every source
it opens is recorded: ``attach`` gives the model the ones its files were parsed from and
closes the rest (an index, a rejected candidate).
"""

from __future__ import annotations

import dataclasses
import os
import re
import stat
import unicodedata
from concurrent.futures import ThreadPoolExecutor

from tensorfs.errors import ModelError
from tensorfs.model import Model, ModelFile
from tensorfs.sources.local import ModelSource, Source

# what ``kind`` answers
FILE, DIRECTORY, OTHER = "file", "directory", "other"


# Why a name a model's files give for a sibling file is refused (``name_problem``).
MAX_NAME_BYTES = 255            # NAME_MAX: no file system holds a longer name
_PERCENT_ESCAPE = re.compile(r"%[0-9A-Fa-f]{2}")


def name_problem(name: str) -> str | None:
    """Why ``name`` is not a plain file name in its directory, or None when it is one.

    One rule for every place (a local directory, an HTTP prefix, an S3 prefix, a Hub repo),
    since an index or a split GGUF moves from one to another: a sibling named by a model's
    own files, or listed by a directory, must name the same file in the same directory
    everywhere.  So what any transport or server would decode or normalize is refused
    before it is decoded: a percent-escape (``%2F``, ``%252F``: servers decode one or two
    levels), a backslash (a separator to some servers), a character that Unicode
    compatibility folds into ``/``, ``\\`` or ``.`` (a fullwidth solidus), a control or
    other non-printable character, ``.`` and ``..``, an empty or over-long name.  Real
    Hugging Face and llama.cpp shard names (``model-00001-of-00002.safetensors``) pass.
    """
    if not isinstance(name, str) or not name:
        return "an empty name"
    if name in (".", ".."):
        return "a name that is not a file in the directory"
    if not name.isprintable():
        return "a name with a control or non-printable character"
    folded = unicodedata.normalize("NFKC", name)
    if "/" in folded or "\\" in folded:
        return "a name with a path separator"
    if folded in (".", ".."):
        return "a name that is not a file in the directory"
    if _PERCENT_ESCAPE.search(name):
        return "a name with a percent-escape (servers decode it, to another file)"
    if len(name.encode("utf-8", "surrogatepass")) > MAX_NAME_BYTES:
        return f"a name longer than {MAX_NAME_BYTES} bytes"
    return None


class Location:
    """What ``tensorfs.loading.shards`` needs of the place the model's files are in."""

    parallel = 1                # shards whose headers are fetched at once

    def __init__(self):
        self.opened: dict[str, Source] = {}
        # path -> the directory whose listing or index named it (``sibling``): such a file
        # must lie in that directory (a local one: ``tensorfs.sources.local.contained_problem``)
        self.named_beside: dict[str, str] = {}

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

    def sizes(self, directory: str) -> dict[str, int]:
        """Name -> size of the files ``directory``'s listing gave with their sizes (none
        where a listing gives names only): what ``stat`` answers without a request."""
        return {}

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

    def each(self, fn, items: list) -> list:
        """``[fn(item) for item in items]``, at most ``parallel`` at a time (the bound on
        requests in flight, and on shards' bytes held at once, while a model loads); the
        first error in the order of ``items`` is the one raised."""
        if self.parallel > 1 and len(items) > 1:
            with ThreadPoolExecutor(min(self.parallel, len(items))) as pool:
                futures = [pool.submit(fn, item) for item in items]
                return [f.result() for f in futures]
        return [fn(item) for item in items]

    def kinds(self, paths: list[str]) -> list[str | None]:
        return self.each(self.kind, paths)

    def sibling(self, directory: str, name: str) -> str:
        """The path of the file ``name`` in ``directory``; ``ValueError`` saying why when
        ``name`` is not a plain file name there (``name_problem``): nothing outside the
        directory is ever opened through a name a model or a listing gave."""
        problem = name_problem(name)
        if problem is not None:
            raise ValueError(problem)
        path = self.join(directory, name)
        self.named_beside.setdefault(path, directory)
        return path

    def listed(self, directory: str, refused: dict | None = None) -> list[str]:
        """``files(directory)`` without the names that are not plain file names there (a
        listing is the server's word, read like a model's): nothing is ever asked for
        under such a name.  ``refused``: filled with each name left out and why."""
        names = []
        for name in self.files(directory):
            problem = name_problem(name)
            if problem is None:
                names.append(name)
            elif refused is not None:
                refused[name] = problem
        return names

    def take(self, path: str, open_it: bool = False):
        """The source of ``path``, handed over: the caller owns (and closes) it from now on,
        and ``attach`` and ``close_all`` leave it alone.  None if it is not open here,
        unless ``open_it``."""
        source = self.opened.pop(path, None)
        if source is None and open_it:
            source = self._open(path)
        return source

    def open(self, path: str):
        """The source of ``path`` (kept until ``attach`` or ``close_all``)."""
        source = self.opened.get(path)
        if source is None:
            source = self.opened[path] = self._open(path)
        return source

    def parse(self, path: str) -> ModelFile:
        """``path`` parsed from its source; a source that kept the bytes it read for the
        parse (a remote file's first answer) lets them go at once: what a shard costs
        until the mount ends is its parsed header, not its bytes."""
        # at the first parse: every command checks is_url here, few need the parsers
        from tensorfs.sources.modelfile import parse_source

        source = self.open(path)
        model_file = parse_source(source)
        source.end_parse([(t.offset, t.nbytes) for t in model_file.tensors])
        return model_file

    def parse_all(self, paths: list[str]) -> list[ModelFile]:
        """Every path parsed (concurrently where the place is remote); the first error in
        the order of ``paths`` is the one raised."""
        return self.each(self.parse, paths)

    def kind_and_parse(self, path: str) -> tuple[str | None, ModelFile | Exception | None]:
        """(kind, the parsed file or why it was refused; None when not a regular file):
        one shard's whole load in one step, so that a remote shard's first answer (which
        ``kind`` gets) is parsed and let go at once rather than held until every shard
        has answered."""
        kind = self.kind(path)
        if kind != FILE:
            return kind, None
        try:
            return kind, self.parse(path)
        except ModelError as error:
            return kind, error

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
            mode = os.stat(path).st_mode        # links followed; where to: checked at open
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
        return ModelSource(path, within=self.named_beside.get(path))

    def join(self, directory: str, name: str) -> str:
        return os.path.join(directory, name)

    def dirname(self, path: str) -> str:
        return os.path.dirname(path)

    @staticmethod
    def basename(path: str) -> str:
        return os.path.basename(path)


LOCAL = LocalLocation
