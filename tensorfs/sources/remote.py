"""Remote model files (docs/reference/remote.md): the location of a URL and the remote source
that serves a file's bytes through the block cache (``tensorfs.sources.blockcache``).

The requests themselves are the transports' (``tensorfs.sources.transports``: obstore for HTTP(S),
the Hub's files and object stores, fsspec for any other protocol); here a file's size and
version are pinned at open, reads are retried within their deadline, and a change of version
fails the file for good.

A URL is shown (errors, logs, metadata.json, the fsname) without credentials: no
``user:password@`` and no ``?query``.
"""

from __future__ import annotations

import errno
import logging
import os
import threading
import time
import types

from tensorfs import status as mount_status
from tensorfs.cache import ByteLRU
from tensorfs.errors import ModelError
from tensorfs.sources import blockcache
from tensorfs.sources.blockcache import BlockReader, Fetcher
from tensorfs.sources.diskcache import DiskCache
from tensorfs.sources.location import DIRECTORY, FILE, Location
from tensorfs.sources.source import Source, SourceError
from tensorfs.sources.transports import transport_for
from tensorfs.sources.transports.base import Cancel, FetchError, Pin, Transport
from tensorfs.sources.urls import RemoteSettings, display_url

log = logging.getLogger("tensorfs")

MAX_TRIES = 5
FIRST_BACKOFF_S = 0.1
PARALLEL_SHARDS = 8


# ---------------------------------------------------------------------------------------
# The location and the source
# ---------------------------------------------------------------------------------------

class RemoteLocation(Location):
    parallel = PARALLEL_SHARDS

    def __init__(self, url: str, settings: RemoteSettings):
        super().__init__()
        self.settings = settings
        self.transport = transport_for(url, settings)
        self.fetcher = Fetcher()            # the mount's requests in flight
        self._missing: dict[str, ModelError] = {}
        # the mount's LRU, or one of this location's own: the settings stay as given
        self.cache = settings.cache if settings.cache is not None else ByteLRU(settings.cache_bytes)
        self.disk = None
        if settings.disk_cache:
            try:
                self.disk = DiskCache(*settings.disk_cache)
            except OSError as error:
                raise ModelError("disk_cache", str(error), file=display_url(url)) from None

    def normalize(self, path: str) -> str:
        return self.transport.normalize(path)

    def kind(self, path: str) -> str | None:
        if not self.transport.listable:
            if path.endswith("/"):
                return DIRECTORY
            if path in self._missing:
                return None
            try:
                self.open(path)         # the probe opens it: the parse reads that source
            except ModelError as error:
                if error.kind == "remote_not_found":
                    self._missing[path] = error
                    return None
                raise
            return FILE
        try:
            return self.transport.kind(path)
        except FetchError as error:
            raise _mount_error(error, path) from None

    def files(self, directory: str) -> list[str]:
        try:
            return self.transport.files(directory)
        except FetchError as error:
            raise _mount_error(error, directory) from None

    def sizes(self, directory: str) -> dict[str, int]:
        try:
            return self.transport.sizes(directory)
        except FetchError as error:
            raise _mount_error(error, directory) from None

    def _open(self, path: str):
        if path in self._missing:       # asked already (kind): not asked twice
            raise self._missing[path]
        return RemoteSource(self.transport, path, self.settings, self.disk, self.fetcher,
                            cache=self.cache)

    def join(self, directory: str, name: str) -> str:
        return directory.rstrip("/") + "/" + name

    def dirname(self, path: str) -> str:
        return path.rstrip("/").rsplit("/", 1)[0]

    def attach(self, model):
        model = super().attach(model)
        by_file: dict[str, list] = {}
        for t in model.tensors:
            by_file.setdefault(t.file, []).append((t.offset, t.nbytes))
        for path, source in model.sources.items():
            source.end_parse(by_file.get(path, []))
        return model


def _mount_error(error: FetchError, path: str) -> ModelError:
    kinds = {"not_found": "remote_not_found", "denied": "remote_denied",
             "no_range": "remote_no_range", "unreachable": "remote_unreachable",
             "timeout": "remote_timeout", "not_a_file": "not_a_file",
             "untrusted": "remote_untrusted",
             "too_long": "remote_error", "encoding": "remote_error"}
    message = error.message + (f": {error.hint}" if error.hint else "")
    return ModelError(kinds.get(error.kind, "remote_error"), message, file=path)


_log_lock = threading.Lock()


def _logged(error: SourceError) -> SourceError:
    error.logged = True
    return error


class RemoteSource(Source):
    """A remote file as served: size and version pinned by the first request, the header
    kept from the parse, every other byte read through the block cache."""

    # the parser's growing prefix grows by at most this much past what it asked for: a mount
    # fetches at most header + 1 MiB of each file (docs/reference/remote.md)
    prefix_step = 1 << 20
    remote = True
    name: str
    size: int

    def __init__(self, transport: Transport, path: str, settings: RemoteSettings,
                 disk: DiskCache | None, fetcher: Fetcher | None = None, cache=None):
        self.transport = transport
        self.name = self.path = path
        self.timeout = settings.timeout
        self.broken: str | None = None
        self._broken_logged = False
        deadline = time.monotonic() + settings.timeout
        try:
            pin, head, mtime = self._retry(lambda timeout: transport.probe(path, timeout),
                                           deadline)
        except FetchError as error:
            raise _mount_error(error, path) from None
        self.pin: Pin = pin                 # what every later answer must say again
        self.size, self.version = pin.size, pin.version
        if not isinstance(self.size, int) or self.size < 0:
            raise ModelError("remote_error", f"the server gives no valid size ({self.size!r})",
                             file=path)
        self.mtime = mtime if mtime is not None else time.time()
        self._head = bytearray(head)        # the header, as parsed: kept to serve header.bin
        self._parsing = True
        if self.version is None:
            # INFO, and again once the daemon serves (start): the daemon's log, never the
            # terminal, where the mount prints nothing but its one error line
            log.info("%s: the server gives no version (ETag) for it: a change of the file "
                     "under the mount is told only by its size and Last-Modified; not kept in "
                     "the disk cache", path)
            if disk is not None and path not in settings.unkept:
                settings.unkept.append(path)
        key = (path, self.version)
        block = blockcache.BLOCK_SIZE           # looked up here: bench/ varies it
        identity = transport.identity(path) if disk is not None and self.version else None
        # the size too: a server that kept the ETag of a file whose size changed (a 206 with
        # another total) must not be served another mount's blocks of the old one
        disk_key = disk.key(identity, f"{self.version}\0{self.size}", block,
                            label=path) if identity else None
        cache = cache if cache is not None else settings.cache
        self.blocks = BlockReader(key, self.size, self._fetch, cache, disk, disk_key,
                                  block_size=block, fetcher=fetcher)

    # -- the source interface ----------------------------------------------------------------
    def stat(self):
        return types.SimpleNamespace(st_uid=os.getuid(), st_gid=os.getgid(), st_mtime=self.mtime,
                                     st_mtime_ns=int(self.mtime * 1e9), st_size=self.size)

    def start(self, served_once: bool = True) -> None:
        """In the serving process (the daemon, after the fork): reads go through FUSE.  A
        block served in full leaves the memory cache (the page cache keeps it) only where
        no other file of the mount serves it again: a block served through a tensor's file
        is in that file's page cache, not in the whole file's of files/ (nor the reverse),
        and stays in the memory cache so that it is not fetched again for the other."""
        self.transport.serve()
        blockcache.reuse_freed_blocks()
        self.blocks.page_cached = served_once
        if self.version is None:
            log.warning("%s: the server gives no version (ETag) for it: a change of the file "
                        "under the mount is told only by its size and Last-Modified; not kept "
                        "in the disk cache", self.path)

    def vouch(self, offset: int = 0, size: int = 0) -> None:
        """A file whose version changed is refused at open too (its error logged once)."""
        if self.broken is not None:
            raise _logged(SourceError(errno.EIO, f"{self.path}: {self.broken}"))

    def end_parse(self, extents: list[tuple[int, int]]) -> None:
        """The parse is over: later reads go through the block cache."""
        self._parsing = False
        # the header itself (what lies before the first tensor) is not fetched again; the
        # rest of the probe's answer is not kept: shards by the thousand each have one
        header = min((o for o, n in extents if n > 0), default=0)
        self.blocks.keep_piece(0, bytes(self._head[:header]))
        self._head = bytearray()    # parsed: not kept per shard (reads go through the cache)
        self.blocks.set_extents(extents)

    def read_into(self, offset: int, buf, span: tuple[int, int] | None = None) -> int:
        """``span``: the extent the reader reads in, for read-ahead (BlockReader.read_into)."""
        return self._read(offset, buf, span, wait=True)

    def read_or_wait(self, offset: int, buf, span: tuple[int, int] | None = None):
        """As ``read_into``, or a ``Future`` where the blocks are on their way
        (``BlockReader.read_or_wait``): failed with the same ``SourceError`` as a read that
        waited, logged and shown in ``tensorfs list`` alike."""
        return self._read(offset, buf, span, wait=False)

    def _read(self, offset: int, buf, span, wait: bool):
        size = len(buf)
        if size <= 0:
            return 0
        if offset < 0 or offset + size > self.size:
            raise SourceError(errno.EIO, f"{self.path}: read of {size} bytes at {offset} past "
                              f"the end ({self.size} bytes)")
        if self.broken is not None:
            raise _logged(SourceError(errno.EIO, f"{self.path}: {self.broken}"))
        end = offset + size
        if end <= len(self._head):
            buf[:] = memoryview(self._head)[offset:end]
            return size
        deadline = time.monotonic() + self.timeout
        try:
            if self._parsing and offset <= len(self._head):
                # the parser's growing prefix: exactly the bytes it lacks, nothing more
                more = self._fetch(len(self._head), end, deadline)
                self._head += more
                buf[:] = memoryview(self._head)[offset:end]
                return size
            if wait:
                return self.blocks.read_into(offset, buf, deadline, span=span)
            return self.blocks.read_or_wait(offset, buf, deadline, span=span,
                                            failed=lambda error: self._mapped(error, offset, size))
        except BaseException as error:
            raise self._mapped(error, offset, size) from None

    def _mapped(self, error: BaseException, offset: int, size: int) -> BaseException:
        """What a read that failed with ``error`` raises: a ``SourceError`` (EIO), logged."""
        if isinstance(error, FetchError):
            return self._failed(error, offset, size)
        if isinstance(error, TimeoutError):
            return self._failed(FetchError("timeout", f"no answer within {self.timeout:g} s"),
                                offset, size)
        if isinstance(error, SourceError) or not isinstance(error, OSError):
            return error
        return self._failed(FetchError("http", str(error.strerror or error)), offset, size)

    def _failed(self, error: FetchError, offset: int, size: int) -> SourceError:
        """The read's EIO, logged here (the FUSE layer does not log it again): a change of
        version once for the file, any other failure once per read."""
        if error.kind == "version" and self.broken is None:
            self.broken = (f"{error.message}; every read of it now fails with EIO (mount again "
                           f"to serve the new version)")
        if self.broken is not None:
            with _log_lock:
                first = not self._broken_logged
                self._broken_logged = True
            if first:
                log.error("%s: %s", self.path, self.broken)
                mount_status.report(mount_status.SOURCE_CHANGED, f"{self.path}: {self.broken}")
            return _logged(SourceError(errno.EIO, f"{self.path}: {self.broken}"))
        log.error("%s: read of %d bytes at %d failed: %s", self.path, size, offset, error.message)
        mount_status.read_failed(self.path, error.message)          # what `list` shows
        return _logged(SourceError(errno.EIO, f"{self.path}: read of {size} bytes at {offset}: "
                                   f"{error.message}"))

    # -- requests ------------------------------------------------------------------------------
    def _fetch(self, start: int, end: int, deadline: float, cancel: Cancel | None = None) -> bytes:
        if self.broken is not None:
            raise FetchError("version", self.broken)
        data = self._retry(lambda timeout: self.transport.fetch(self.path, start, end,
                                                                self.pin, timeout, cancel),
                           deadline, cancel)
        mount_status.read_ok(self.path)             # list: serving again, if it was degraded
        return data

    def _retry(self, attempt, deadline: float, cancel: Cancel | None = None):
        """``attempt(timeout)``, again after a transient fault (connection, timeout, 5xx,
        429) with doubling pauses, at most ``MAX_TRIES`` times, never past ``deadline`` and
        never once ``cancel`` is cancelled."""
        pause = FIRST_BACKOFF_S
        for tries in range(1, MAX_TRIES + 1):
            if self.transport.closing:
                raise FetchError("closing", "the mount is closing")
            if cancel is not None:
                cancel.check()
            left = min(deadline - time.monotonic(), self.timeout)
            if left <= 0:
                raise FetchError("timeout", f"no answer within {self.timeout:g} s")
            try:
                return attempt(left)
            except FetchError as error:
                if not error.transient or tries == MAX_TRIES:
                    raise
                if deadline - time.monotonic() <= pause:
                    raise
                # INFO: at mount nothing but the one error line reaches the terminal
                log.info("%s: %s; trying again in %.1f s", self.path, error.message, pause)
                time.sleep(pause)
                pause *= 2
        raise AssertionError("unreachable")

    def abort(self) -> None:
        """End this file's waiting reads and requests now (EIO): the mount is detached."""
        self.blocks.close()
        self.transport.abort()

    def close(self) -> None:
        self.blocks.close()
