"""``files/`` (SPEC §11): the files a model was read from, whole and byte-identical, under
their own names, so that the programs people run (llama.cpp, ``safe_open``,
``from_pretrained``) load the model from the mount.

Which files: every model file (the one file, every shard, every split of a split GGUF) and,
where the user named an index, a directory or a repository, its *companions*: the index, and
a directory's other regular top-level files (config.json, tokenizer files ...; hidden files
and subdirectories are not served, as a directory mount never searches them either).

What serves each one:

- a model file: its own source, the very one its tensors are read from: what was parsed is
  what is served, and a remote file's blocks are shared (a block fetched for a tensor is not
  fetched again for the whole file, nor the reverse);
- a local companion: opened at load time, read from that descriptor and watched for change
  as a model file is (``tensorfs.source.ModelSource``);
- a remote companion: opened the first time it is looked up or read (one request: its size,
  version and first 64 KiB, all of a config file), then read through the block cache, which
  fetches one of at most ``blockcache.SMALL_TENSOR`` bytes whole at its first read.

How a local file's bytes reach the reader (FUSE passthrough, splice, copy) is
``tensorfs.fuse3``'s business; a view here only says which descriptor holds them.
"""

from __future__ import annotations

import errno
import logging
import threading

from tensorfs.errors import ModelError
from tensorfs.location import DIRECTORY, LocalLocation
from tensorfs.source import Source, SourceError
from tensorfs.views import RawView

log = logging.getLogger("tensorfs")

# Files of a directory served besides the model's, at most: each local one holds a
# descriptor from mount to unmount.  A model repository has a dozen.
MAX_COMPANIONS = 1000

_opening = threading.Lock()         # one Location opens every companion


def _basename(path: str) -> str:
    return path.rstrip("/").rsplit("/", 1)[-1]


class Companion:
    """A file served whole beside the model's files: an index, a config or tokenizer file."""

    def __init__(self, name: str, path: str, source=None, opener=None):
        self.name = name
        self.path = path
        self._source = source
        self._opener = opener
        self._lock = threading.Lock()
        self._started = False
        if source is not None:
            self._ready(source)

    @property
    def opened(self) -> bool:
        return self._source is not None

    def source(self):
        """The file's source, opened now if it was not at load time (a remote one);
        ``SourceError`` (EIO in the mount) if it cannot be."""
        source = self._source
        if source is not None:
            return source
        with self._lock:
            if self._source is None:
                try:
                    with _opening:
                        source = self._opener()
                except ModelError as error:
                    raise SourceError(errno.EIO, f"{self.path}: {error.message}") from None
                self._ready(source)
                if self._started:
                    source.start()
                self._source = source
            return self._source

    @staticmethod
    def _ready(source) -> None:
        source.end_parse([(0, source.size)])     # a remote file: read-ahead may run over all of it

    def start(self) -> None:
        """Called where the mount serves (tensorfs.mounttree.MountedModel.start)."""
        with self._lock:
            self._started = True
            if self._source is not None:
                self._source.start()

    def close(self) -> None:
        with self._lock:
            if self._source is not None:
                self._source.close()


def find_companions(named: str, model, location) -> tuple[Companion, ...]:
    """The companions of ``model``, loaded from ``named`` through ``location``: none for a
    model file given directly (a split GGUF's splits are all model files); the index for an
    index; a directory's regular top-level files that are not model files.  Called before
    ``location.attach``: a source the parse read (the index) is taken over, not reopened."""
    model_paths = {f.path for f in model.files}
    if named in model_paths:
        return ()
    if location.kind(named) == DIRECTORY:
        paths = [(name, location.join(named, name)) for name in location.files(named)]
    else:
        paths = [(_basename(named), named)]
    paths = [(name, path) for name, path in paths if path not in model_paths]
    if len(paths) > MAX_COMPANIONS:
        log.warning("%s: %d files besides the model's: files/ serves the first %d",
                    named, len(paths), MAX_COMPANIONS)
        del paths[MAX_COMPANIONS:]
    local = isinstance(location, LocalLocation)
    companions = []
    for name, path in paths:
        try:
            source = location.take(path, open_it=local)     # a remote one: at first use
        except ModelError as error:
            log.info("%s: not served in files/: %s", path, error.message)
            continue
        if source is not None:
            companions.append(Companion(name, path, source=source))
        else:
            companions.append(Companion(name, path, opener=_remote_opener(location, path)))
    return tuple(companions)


def _remote_opener(location, path: str):
    def open_it():
        return location.take(path, open_it=True)      # this companion owns it now
    return open_it


class WholeFileView(RawView):
    """One file of ``files/``: every byte of its source, with the source's mtime.

    ``open()`` says whether the file may be read (a changed file: ``SourceError``) and which
    descriptor holds it whole, for the kernel to read itself (FUSE passthrough);
    ``read_fd`` names the descriptor and offset of a range (splice); ``read_into`` copies,
    with read-ahead over the whole file (a remote file), not one tensor."""

    offset = 0

    def __init__(self, source: Source | None = None, companion: Companion | None = None):
        self._source = source
        self._companion = companion
        self._mtime_ns: int | None = None

    @property
    def source(self) -> Source:
        return self._source if self._source is not None else self._companion.source()

    @property
    def cheap_size(self) -> bool:
        return self._source is not None or self._companion.opened

    @property
    def size(self) -> int:
        return self.source.size

    @property
    def _span(self) -> tuple[int, int]:
        return 0, self.size

    @property
    def mtime_ns(self) -> int:
        if self._mtime_ns is None:
            self._mtime_ns = int(self.source.stat().st_mtime_ns)
        return self._mtime_ns

    def open(self) -> int | None:
        source = self.source
        source.vouch()
        return source.local_fd


def whole_file_views(model, sources: dict | None = None) -> dict[str, WholeFileView]:
    """File name -> its view, for every file of ``files/``, sorted by name.  ``sources``:
    the model files' sources, by path (default ``model.sources``)."""
    sources = model.sources if sources is None else sources
    views = {_basename(f.path): WholeFileView(source=sources[f.path]) for f in model.files}
    for companion in model.companions:
        views.setdefault(companion.name, WholeFileView(companion=companion))
    return dict(sorted(views.items()))
