"""``files/`` (docs/internals/design.md): the files a model was read from, whole and byte-identical, under
their own names, so that the programs people run (llama.cpp, ``safe_open``,
``from_pretrained``) load the model from the mount.

Which files: every model file (the one file, every shard, every split of a split GGUF) and,
where the user named an index, a directory or a repository, its *companions*: the index, and
a directory's other regular files (config.json, tokenizer files ...; hidden ones are not
served).  A local directory's subfolders are served too, at most ``MAX_SUBFOLDER_DEPTH``
deep (sentence-transformers keeps ``1_Pooling/config.json`` and an empty ``2_Normalize/``
beside ``modules.json``), each file under the same rules as a top-level one, contained in
the directory; a remote one's are not (a listing gives its top level only).

What serves each one:

- a model file: its own source, the very one its tensors are read from: what was parsed is
  what is served, and a remote file's blocks are shared (a block fetched for a tensor is not
  fetched again for the whole file, nor the reverse);
- a local companion: checked at load time (a regular file, inside the directory: below),
  its identity (device, inode, size, mtime) and owner kept, and closed again; opened when
  read, and again only if it is still that very file (else EIO: it changed).  At most
  ``MAX_OPEN_COMPANIONS`` stay open at once, the least recently read closed first, so that
  a directory of a thousand files costs a thousand descriptors at no moment;
- a remote companion: its size is the listing's (a LOOKUP, GETATTR or READDIR asks the
  network nothing); opened at its first open or read (one request: its size, version and
  first 64 KiB, all of a config file), then read through the block cache, which fetches one
  of at most ``blockcache.SMALL_TENSOR`` bytes whole at its first read.  A size the listing
  does not give is asked at the first lookup, once: a failure is remembered, not asked
  again at every lookup.

Every name comes through ``location.name_problem`` first: a listed name that is not a plain
file name is never asked for, and is logged once.  What a served file grants: a local one
keeps its source's owner and group and its mode masked read-only (``st_mode & 0o444``), so
that with ``default_permissions`` (always on) and ``allow_other`` the kernel refuses whom
the source refuses.  A local file reached through a symbolic link is served only if it lies
inside the directory, or in a Hugging Face cache snapshot's own ``blobs/``
(``tensorfs.sources.local.contained_problem``); anything but a regular file is not served.

How a local file's bytes reach the reader (FUSE passthrough, splice, copy) is
``tensorfs.fuse.session``'s business; a view here only says which descriptor holds them.
"""

from __future__ import annotations

import collections
import contextlib
import errno
import logging
import os
import threading
import time
from concurrent.futures import Future
from typing import NamedTuple

from tensorfs import status as mount_status
from tensorfs.errors import ModelError
from tensorfs.loading.checkpoints import BytesSource, ComposedSource
from tensorfs.sources.local import ModelSource
from tensorfs.sources.location import DIRECTORY, LocalLocation, name_problem
from tensorfs.sources.source import Source, SourceError
from tensorfs.views.base import View

log = logging.getLogger("tensorfs")

# Files of a directory served besides the model's, at most.  A model repository has a dozen.
MAX_COMPANIONS = 1000
# Folders below a directory model served, at most this deep (sentence-transformers: one)
MAX_SUBFOLDER_DEPTH = 4

# Local companions open at once, at most: one descriptor each while open.  Fewer under a
# low descriptor limit (a sixteenth of it), which the model's shards need more.
MAX_OPEN_COMPANIONS = 64


def _open_companions_allowed() -> int:
    import resource

    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    if soft == resource.RLIM_INFINITY:
        return MAX_OPEN_COMPANIONS
    return max(4, min(MAX_OPEN_COMPANIONS, soft // 16))

# A remote companion whose open failed is not asked again for this long (a lookup answers
# EIO at once meanwhile): one stalled server is not asked again at every ``stat``.
FAILED_OPEN_RETRY_S = 30.0

READ_ONLY = 0o444

# Names a listing gives that are refused, each said in the log, at most (then one count).
MAX_REFUSED_SAID = 10


def _basename(path: str) -> str:
    return path.rstrip("/").rsplit("/", 1)[-1]


class Facts(NamedTuple):
    """What a local file was at load time: its identity (a later open must find the very
    same file) and what ``stat`` shows of it."""
    dev: int
    ino: int
    size: int
    mtime_ns: int
    mode: int
    uid: int
    gid: int

    @classmethod
    def of(cls, st) -> Facts:
        return cls(st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_mode & READ_ONLY,
                   st.st_uid, st.st_gid)


def owner_of(source) -> tuple[int, int, int] | None:
    """(mode, uid, gid) a served file of ``source`` shows, or None (the mount's own): a
    local file's, masked read-only (a composed one's: its checkpoint's); a remote one has
    no owner of its own."""
    if isinstance(source, ComposedSource):
        source = source.checkpoint
    elif isinstance(source, BytesSource):
        source = source.like
    if source.local_fd is None:
        return None
    st = source.stat()
    return st.st_mode & READ_ONLY, st.st_uid, st.st_gid


def read_bits(sources) -> int:
    """The read bits every local source grants (``st_mode & 0o444`` of each, together):
    what the mount's tensors, headers and metadata, made from them, may grant."""
    bits = READ_ONLY
    for source in sources:
        owner = owner_of(source)
        if owner is not None:
            bits &= owner[0]
    return bits


_open_lock = threading.Lock()                   # the open local companions and their users
_open_local: collections.OrderedDict = collections.OrderedDict()


class Companion:
    """A file served whole beside the model's files: an index, a config or tokenizer file.

    ``opener()`` opens its source; ``facts``: a local file's, taken at load (the file is
    not held open until read); ``listed_size``: a remote file's size as its listing gave
    it (the source's, once opened, must agree)."""

    def __init__(self, name: str, path: str, opener, *, facts: Facts | None = None,
                 listed_size: int | None = None, source=None):
        self.name = name
        self.path = path
        self._opener = opener
        self.facts = facts
        self.listed_size = listed_size
        self._local = facts is not None
        self._source = None
        self._users = 0
        self._lock = threading.Lock()           # one thread opens; the others wait for it
        self._started = False
        self._failed: tuple[float, SourceError] | None = None
        self._said = False
        if source is not None:
            self._opened(source)

    @property
    def opened(self) -> bool:
        return self._source is not None

    @property
    def size(self) -> int:
        if self.facts is not None:
            return self.facts.size
        if self.listed_size is not None:
            return self.listed_size
        with self.using() as source:
            return source.size

    @property
    def cheap_size(self) -> bool:
        return self.facts is not None or self.listed_size is not None or self.opened

    @property
    def mtime_ns(self) -> int | None:
        """A local file's; a remote one's once opened, else None (the mount's)."""
        if self.facts is not None:
            return self.facts.mtime_ns
        source = self._source
        return int(source.stat().st_mtime_ns) if source is not None else None

    @property
    def owner(self) -> tuple[int, int, int] | None:
        f = self.facts
        return (f.mode, f.uid, f.gid) if f is not None else None

    def source(self):
        """The source, opened if it is not (for a caller that holds it briefly: ``using``
        is the way for a read)."""
        with self.using() as source:
            return source

    @contextlib.contextmanager
    def using(self):
        """The file's source, open for the time of the ``with`` (not closed meanwhile to
        make room for another); ``SourceError`` (EIO in the mount) if it cannot be opened,
        or is not the file it was at load."""
        source = self._acquire()
        try:
            yield source
        finally:
            with _open_lock:
                self._users -= 1

    def _acquire(self):
        with _open_lock:
            source = self._source
            if source is not None:
                self._users += 1
                if self._local:
                    _open_local.move_to_end(self)
                return source
        with self._lock:
            if self._source is None:
                self._opened(self._open())
            with _open_lock:
                self._users += 1
                source = self._source
                if self._local:
                    _open_local[self] = None
                    _open_local.move_to_end(self)
                    _close_least_recent()
            return source

    def _open(self):
        """The companion's source, opened; else ``SourceError`` (EIO), which ``tensorfs
        list`` shows too, naming the file: "source changed" for a file that is no longer
        the one mounted (every read of it fails until the mount is made again), "degraded"
        for one that cannot be opened now (until an open works again)."""
        failed = self._failed
        if failed is not None and time.monotonic() < failed[0]:
            raise failed[1]
        changed = None
        try:
            source = self._opener()
        except (ModelError, OSError) as error:
            changed = self._gone(error)
            why = error.message if isinstance(error, ModelError) else error.strerror or error
            problem = SourceError(errno.EIO, f"{self.path}: {why}")
        else:
            changed = self._not_the_same(source)
            if changed is None:
                self._failed = None
                mount_status.read_ok(self.path)     # list: serving again, if it was degraded
                return source
            source.close()
        if changed is not None:
            problem = SourceError(errno.EIO, f"{self.path}: {changed}; every read of it now "
                                  "fails with EIO (unmount and mount again to serve it)")
        problem.logged = True
        if not self._said:                  # once: a reader may try again and again
            self._said = True
            log.error("%s", problem)
        if changed is not None:
            mount_status.report(mount_status.SOURCE_CHANGED, str(problem.strerror))
        else:
            mount_status.read_failed(self.path, str(problem.strerror)[len(self.path) + 2:])
        if not self._local:
            self._failed = (time.monotonic() + FAILED_OPEN_RETRY_S, problem)
        raise problem

    def _gone(self, error: ModelError | OSError) -> str | None:
        """Why a local companion that failed to open is no longer the file mounted (deleted,
        or something else at its path now), or None (it may open again: a mode, a limit)."""
        if not self._local:
            return None
        if not os.path.lexists(self.path):
            return "deleted or renamed away since it was mounted"
        if isinstance(error, ModelError) and error.kind in ("not_a_file", "outside"):
            return f"replaced since it was mounted ({error.message})"
        return None

    def _not_the_same(self, source) -> str | None:
        """Why ``source`` is not the file that was mounted (listed), or None."""
        if self.facts is not None:
            now = Facts.of(source.stat())
            if (now.dev, now.ino, now.size, now.mtime_ns) != self.facts[:4]:
                return ("replaced or rewritten since it was mounted (another file, or other "
                        "contents, at its path now)")
        elif self.listed_size is not None and source.size != self.listed_size:
            return (f"changed on the server since it was listed ({source.size} bytes now, "
                    f"{self.listed_size} then)")
        return None

    def _opened(self, source) -> None:
        source.end_parse([(0, source.size)])    # a remote file: read-ahead may run over all of it
        if self._started:
            source.start()
        self._source = source

    def start(self) -> None:
        """Called where the mount serves (tensorfs.mount.tree.MountedModel.start)."""
        with self._lock:
            self._started = True
            if self._source is not None:
                self._source.start()

    def close(self) -> None:
        with self._lock, _open_lock:
            source, self._source = self._source, None
            _open_local.pop(self, None)
        if source is not None:
            source.close()


class Companions(tuple):
    """The companions served, and (``refused``) the files left out, each (path, why): said
    in the daemon's log once the mount serves (``say_refused``; at load, nothing but one
    error line reaches the terminal); ``directories``: a directory model's subfolders
    ("1_Pooling", "2_Normalize": served even when empty)."""

    refused: tuple = ()
    directories: tuple = ()
    gguf_files: tuple = ()              # the converter's GGUF files (tensorfs.hfgguf)
    gguf_note: str | None = None        # why none is offered, one line

    def say_refused(self) -> None:
        for path, why in self.refused:
            log.warning("%s: not served in files/: %s", path, why)
        if self.gguf_note:
            log.info("GGUF: none offered: %s", self.gguf_note)


def _close_least_recent() -> None:
    """Under ``_open_lock``: close the least recently used local companions no read holds,
    until at most ``_open_companions_allowed()`` are open."""
    excess = len(_open_local) - _open_companions_allowed()
    if excess <= 0:
        return
    for companion in list(_open_local):
        if excess <= 0:
            break
        if companion._users == 0:
            source, companion._source = companion._source, None
            del _open_local[companion]
            excess -= 1
            if source is not None:
                source.close()


def find_companions(named: str, model, location) -> Companions:
    """The companions of ``model``, loaded from ``named`` through ``location``: none for a
    model file given directly (a split GGUF's splits are all model files); the index for an
    index; a directory's regular files that are not model files, each name passing
    ``location.name_problem`` first, and a local directory's subfolders (``_subfolders``).
    Called before ``location.attach``: a source the parse read (the index) is taken over,
    not reopened."""
    model_paths = {f.path for f in model.files}
    if named in model_paths:
        return Companions()
    sizes: dict = {}
    refused: dict = {}
    if location.kind(named) == DIRECTORY:
        names = location.listed(named, refused)
        sizes = location.sizes(named)
        paths = [(name, location.sibling(named, name)) for name in names]
    else:
        paths = [(_basename(named), named)]
    paths = [(name, path) for name, path in paths if path not in model_paths]
    if len(paths) > MAX_COMPANIONS:
        log.warning("%s: %d files besides the model's: files/ serves the first %d",
                    named, len(paths), MAX_COMPANIONS)
        del paths[MAX_COMPANIONS:]
    local = isinstance(location, LocalLocation)
    notes = [(named, f"the listed name {ascii(name)[:80]} is {why}: never asked for")
             for name, why in list(refused.items())[:MAX_REFUSED_SAID]]
    if len(refused) > MAX_REFUSED_SAID:
        more = len(refused) - MAX_REFUSED_SAID
        notes.append((named, f"{more} more listed names that are not plain file names"))
    directories: list[str] = []
    if local and location.kind(named) == DIRECTORY:
        # a directory model's subfolders (sentence-transformers' 1_Pooling/config.json ...)
        room = MAX_COMPANIONS - len(paths)
        sub_paths, directories = _subfolders(named, room, notes)
        paths += [(name, path) for name, path in sub_paths]
    companions = []
    for name, path in paths:
        source = location.take(path)
        if local:           # one in a subfolder: contained in the model's directory
            companion = _local_companion(location, name, path, source,
                                         within=named if "/" in name else None)
            if isinstance(companion, str):
                notes.append((path, companion))
            else:
                companions.append(companion)
            continue
        companions.append(Companion(name, path, _remote_opener(location, path),
                                    listed_size=sizes.get(name), source=source))
    served = Companions(companions)
    served.refused = tuple(notes)
    served.directories = tuple(directories)
    return served


def _subfolders(top: str, room: int, notes: list) -> tuple[list[tuple[str, str]], list[str]]:
    """(name, path) of the regular files in ``top``'s subfolders, their names relative to
    ``top`` ("1_Pooling/config.json"), and every subfolder's name (an empty one too:
    "2_Normalize"), at most ``MAX_SUBFOLDER_DEPTH`` deep and ``room`` files.  Hidden names,
    names that are not plain file names and links to folders are left out (a link to a
    file is checked where it is opened, as a top-level one is)."""
    files: list[tuple[str, str]] = []
    directories: list[str] = []
    pending = [("", top, 0)]
    while pending:
        rel, path, depth = pending.pop(0)
        try:
            entries = sorted(os.scandir(path), key=lambda e: e.name)
        except OSError as error:
            notes.append((path, f"cannot list: {error.strerror}"))
            continue
        for entry in entries:
            name = entry.name
            if name.startswith(".") or (not rel and not entry.is_dir(follow_symlinks=False)):
                continue                # the top level's files: listed by find_companions
            problem = name_problem(name)
            if problem is not None:
                notes.append((entry.path, f"the name is {problem}: not served"))
                continue
            inner = f"{rel}/{name}" if rel else name
            if entry.is_dir(follow_symlinks=False):
                if depth + 1 > MAX_SUBFOLDER_DEPTH:
                    notes.append((entry.path, f"more than {MAX_SUBFOLDER_DEPTH} folders deep: "
                                  "not served"))
                    continue
                directories.append(inner)
                pending.append((inner, entry.path, depth + 1))
            elif rel and entry.is_file():
                if len(files) >= room:
                    notes.append((entry.path, f"more than {MAX_COMPANIONS} files: not served"))
                    return files, directories
                files.append((inner, entry.path))
    return files, directories


def _local_companion(location, name: str, path: str, source, *,
                     within: str | None = None) -> Companion | str:
    """A local companion: opened now to check it (a regular file, where it may be: inside
    ``within`` or the directory that listed it) and note what it is, then closed: read, it
    is opened again (``Companion``).  Or why it is not served."""
    if within is None:
        within = location.named_beside.get(path)   # None: the user named it (an index)
    within = os.path.abspath(within) if within is not None else None
    path = os.path.abspath(path)                # the daemon works from "/"
    try:
        if source is None:
            source = ModelSource(path, within=within)
        facts = Facts.of(source.stat())
    except ModelError as error:
        return error.message
    finally:
        if source is not None:
            source.close()
    return Companion(name, path, lambda: ModelSource(path, within=within), facts=facts)


def _remote_opener(location, path: str):
    def open_it():
        return location.take(path, open_it=True)      # this companion owns it now
    return open_it


class WholeFileView(View):
    """One file of ``files/``: every byte of its source, with the source's mtime, and its
    owner and mode masked read-only where it has them (a local file).

    ``open()`` says whether the file may be read (a changed file: ``SourceError``) and,
    where passthrough is asked for, which descriptor holds it whole for the kernel to read
    itself; ``read_fd`` names the descriptor and offset of a range (splice); ``read_into``
    copies, checking the file after each read."""

    offset = 0

    def __init__(self, source: Source | None = None, companion: Companion | None = None):
        self._source = source
        self._companion = companion
        self._mtime_ns: int | None = None
        self._owner = owner_of(source) if source is not None else None

    @contextlib.contextmanager
    def _using(self):
        if self._source is not None:
            yield self._source
        else:
            with self._companion.using() as source:
                yield source

    @property
    def source(self) -> Source:
        return self._source if self._source is not None else self._companion.source()

    @property
    def cheap_size(self) -> bool:
        return self._source is not None or self._companion.cheap_size

    @property
    def size(self) -> int:
        return self._source.size if self._source is not None else self._companion.size

    @property
    def mtime_ns(self) -> int | None:
        if self._companion is not None:
            return self._companion.mtime_ns
        if self._mtime_ns is None:
            self._mtime_ns = int(self._source.stat().st_mtime_ns)
        return self._mtime_ns

    @property
    def owner(self) -> tuple[int, int, int] | None:
        """(mode, uid, gid) to show, or None for the mount's."""
        return self._companion.owner if self._companion is not None else self._owner

    def open(self) -> int | None:
        with self._using() as source:
            fd = source.local_fd
            if fd is None:
                if source.broken:
                    raise SourceError(errno.EIO, f"{source.name}: {source.broken}")
                return None
            source.vouch()
            # a companion's descriptor may be closed once no read holds it: only a model
            # file's stays open for the kernel to read from (passthrough)
            return fd if self._source is not None else None

    def read_fd(self, offset: int, size: int):
        if self._source is None:                # a companion: copied (its descriptor may
            return None                         # be closed under a reply naming it)
        source = self._source
        fd = source.local_fd
        if fd is None:
            return None
        total = source.size
        if offset >= total or size <= 0:
            return fd, total, 0
        size = min(size, total - offset)
        source.vouch(offset, size)
        return fd, offset, size

    def read_into(self, offset: int, buf) -> int:
        with self._using() as source:
            total = source.size
            if offset >= total or len(buf) == 0:
                return 0
            size = min(len(buf), total - offset)
            if source.blocks is not None:   # a remote file: read-ahead over the whole file,
                return source.read_into(offset, buf[:size], span=(0, total))    # not one tensor
            return source.read_into(offset, buf[:size])

    def read_or_wait(self, offset: int, buf) -> int | Future[int]:
        """A remote model file's bytes without holding a thread while they come (a
        companion, opened for the read only, waits)."""
        source = self._source
        if source is None or source.blocks is None:
            return self.read_into(offset, buf)
        total = source.size
        if offset >= total or len(buf) == 0:
            return 0
        return source.read_or_wait(offset, buf[:min(len(buf), total - offset)], span=(0, total))

    def read(self, offset: int, size: int) -> bytes:
        total = self.size
        if offset >= total or size <= 0:
            return b""
        out = bytearray(min(size, total - offset))
        n = self.read_into(offset, memoryview(out))
        return bytes(out[:n])


def whole_file_directories(model) -> tuple[str, ...]:
    """The folders of ``files/`` besides the top one: a directory model's subfolders."""
    companions = model.companions
    return companions.directories if isinstance(companions, Companions) else ()


def whole_file_views(model, sources: dict | None = None) -> dict[str, WholeFileView]:
    """File name -> its view, for every file of ``files/``, sorted by name (a file in a
    subfolder: "1_Pooling/config.json").  ``sources``:
    the model files' sources, by path (default ``model.sources``)."""
    sources = model.sources if sources is None else sources
    views = {}
    for path, source in sources.items():
        if isinstance(source, ComposedSource):      # a checkpoint: itself and its composition
            views[_basename(path)] = WholeFileView(source=source.checkpoint)
            views[_basename(source.name)] = WholeFileView(source=source)
        else:
            views[_basename(path)] = WholeFileView(source=source)
    for companion in model.companions:
        views.setdefault(companion.name, WholeFileView(companion=companion))
    if isinstance(model.companions, Companions):
        for gguf_file in model.companions.gguf_files:
            views.setdefault(gguf_file.name, WholeFileView(source=gguf_file))
    return dict(sorted(views.items()))
