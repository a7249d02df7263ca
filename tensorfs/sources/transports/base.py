"""What every transport shares: the one failure type, the base class, the bounded call."""

from __future__ import annotations

import errno
import logging
import os
import threading
from concurrent.futures import Future
from typing import NamedTuple

from tensorfs.errors import ModelError
from tensorfs.sources.urls import display_url

log = logging.getLogger("tensorfs")

EXTRA = "tensorfs-fuse[remote]"
PROBE_BYTES = 64 << 10          # the first request of a file: its size, version and header

# Loggers of the libraries under the transports.  Their DEBUG records carry request headers
# (Authorization, X-Amz-Security-Token), signed URLs and credentials: ``--debug`` is
# tensorfs's own detail, never theirs (``quiet_libraries``).
LIBRARY_LOGGERS = ("botocore", "boto3", "s3fs", "aiobotocore", "fsspec", "aiohttp", "urllib3",
                   "requests", "httpx", "httpcore", "huggingface_hub", "filelock", "gcsfs",
                   "adlfs", "azure", "google", "obstore")


class FetchError(OSError):
    """One failed request.  ``kind``: not_found, denied, no_range, version, unreachable,
    untrusted (the server's certificate), timeout, too_long, encoding, http, closing,
    cancelled (no one waits for it any more: ``Cancel``), not_a_file.  ``transient``: worth another
    try."""

    def __init__(self, kind: str, message: str, *, status: int | None = None,
                 transient: bool = False, hint: str = ""):
        super().__init__(errno.EIO, message)
        self.kind = kind
        self.message = message
        self.status = status
        self.transient = transient
        self.hint = hint

    def __reduce__(self):
        # across the helper process's pipe (tensorfs.sources.transports.objects): OSError's own
        # pickling would rebuild it from (errno, strerror)
        return (_fetch_error, (self.kind, self.message, self.status, self.transient, self.hint))


def _fetch_error(kind, message, status, transient, hint) -> FetchError:
    return FetchError(kind, message, status=status, transient=transient, hint=hint)


class Cancel:
    """A request's off switch: ``cancel()`` (any thread; once counts) ends the request it
    was given to, before it starts or while it is in flight, where no one waits for its
    answer any more.  A transport that can end a request in flight says how with
    ``on_cancel(hook)`` (the hook runs at once if it is cancelled already); ``check()``
    before each try of a request (``RemoteSource._retry``) drops one cancelled before it
    starts."""

    def __init__(self):
        self._lock = threading.Lock()
        self.cancelled = False
        self._hooks: list = []

    def cancel(self) -> None:
        with self._lock:
            if self.cancelled:
                return
            self.cancelled = True
            hooks, self._hooks = self._hooks, []
        for hook in hooks:
            hook()

    def on_cancel(self, hook) -> None:
        with self._lock:
            if not self.cancelled:
                self._hooks.append(hook)
                return
        hook()

    def check(self) -> None:
        if self.cancelled:
            raise FetchError("cancelled", "no one waits for it any more")


def status_error(status: int, hint_401: str = "") -> FetchError:
    """What an HTTP status other than 200/206 means for a read."""
    if status == 404:
        return FetchError("not_found", "not found (HTTP 404)", status=status)
    if status in (401, 403):
        return FetchError("denied", f"access denied (HTTP {status})", status=status,
                          hint=hint_401)
    if status == 412:
        return FetchError("version", "the file changed: its ETag is no longer the one pinned at "
                          "mount (HTTP 412)", status=status)
    return FetchError("http", f"HTTP {status}", status=status,
                      transient=status >= 500 or status in (408, 429))


class Pin(NamedTuple):
    """What the first answer for a file said of it (``Transport.probe``), which every later
    answer must say again: a file that changed under the mount is never served as the one
    mounted.  ``size``: its length (a ranged answer's Content-Range total); ``version``: what
    pins its bytes, the disk cache's key (an ETag, an object's version id, the Hub's commit,
    a filesystem's own mark), or None; ``etag``: the ETag every answer must carry again;
    ``modified``: its Last-Modified time (seconds), where the server gives one that holds
    for the file (not a CDN's)."""

    size: int
    version: str | None
    etag: str | None = None
    modified: float | None = None


def check_answer(pin: Pin, *, size: int | None = None, etag: str | None = None,
                 modified: float | None = None, version: str | None = None) -> None:
    """Raise FetchError "version" (the file changed: it fails for good) where one of an
    answer's validators differs from what the first answer said: ``size`` (the total its
    Content-Range names, or the filesystem's size), ``etag`` (checked where one was pinned:
    an answer without one differs), ``modified`` and ``version`` (each where both sides
    give one)."""
    if size is not None and size != pin.size:
        raise FetchError("version", f"the file changed: it is {size} bytes now, {pin.size} "
                         "at mount (the answer's Content-Range)")
    if pin.etag is not None and etag != pin.etag:
        raise FetchError("version", f"the file changed: ETag {etag} is not {pin.etag}, the one "
                         "pinned at mount")
    if pin.modified is not None and modified is not None and modified != pin.modified:
        raise FetchError("version", "the file changed: its Last-Modified is "
                         f"{_when(modified)} now, {_when(pin.modified)} at mount")
    if pin.version is not None and version is not None and version != pin.version:
        raise FetchError("version", f"the file changed: version {version} is not "
                         f"{pin.version}, the one pinned at mount")


def _when(seconds: float) -> str:
    import time

    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(seconds))


def exact(data, start: int, end: int):
    """``data`` if it is all of ``[start, end)``: fewer bytes are worth another try, more are
    refused (the answer is bounded by the range asked for)."""
    n = len(data)
    if n > end - start:
        raise FetchError("too_long", f"the server sent more than the {end - start} bytes asked for")
    if n < end - start:
        raise FetchError("http", f"short read: {n} of {end - start} bytes", transient=True)
    return data


def missing_extra(module: str, url: str) -> ModelError:
    return ModelError("remote_extra", f"reading a URL needs the optional packages of {EXTRA} "
                      f"(missing: {module}): in a tensorfs checkout, pip install -e '.[remote]' "
                      f"(make test installs them into .venv)", file=display_url(url))


def quiet_libraries() -> None:
    """Keep the libraries' own DEBUG records out of the log whatever the root level is."""
    for name in LIBRARY_LOGGERS:
        logger = logging.getLogger(name)
        if logger.level == logging.NOTSET or logger.level < logging.WARNING:
            logger.setLevel(logging.WARNING)


def bounded(fn, timeout: float, *args, **kwargs):
    """``fn(*args, **kwargs)``, waited for at most ``timeout`` seconds: for the calls whose
    library has no deadline of its own (huggingface_hub's listing, an fsspec filesystem's
    ``info``).  It runs in a daemon thread, so that a call that never returns is left behind
    without holding up the process's exit."""
    future: Future = Future()

    def run():
        try:
            future.set_result(fn(*args, **kwargs))
        except BaseException as error:      # any exception: handed to the waiting caller
            future.set_exception(error)

    threading.Thread(target=run, name="tensorfs-call", daemon=True).start()
    try:
        return future.result(timeout=max(0.0, timeout))
    except TimeoutError:
        raise FetchError("timeout", f"no answer within {timeout:g} s", transient=True) from None


class Transport:
    """Requests for the files of one place (a URL prefix, a bucket, a repo's commit).
    Made again in the daemon after the fork where the library holds threads or sessions
    (``reopen``)."""

    etag_checked = False

    def __init__(self, url: str, settings):
        self.url = url
        self.settings = settings            # tensorfs.sources.remote.RemoteSettings
        self._pid = os.getpid()
        self._lock = threading.Lock()
        self.closing = False
        quiet_libraries()
        self._connect()

    listable = True                     # a directory can be listed (not plain HTTP)

    def normalize(self, path: str) -> str:
        """How ``path`` is shown and keyed: without credentials."""
        return display_url(path)

    def serve(self) -> None:
        """This process serves the mount from now on (the daemon, after the fork)."""
        self.reopen()

    def _connect(self) -> None:
        raise NotImplementedError

    def abort(self) -> None:
        """Refuse new requests: the mount is going away (the block cache wakes the readers
        waiting for requests in flight)."""
        self.closing = True

    def reopen(self) -> None:
        with self._lock:
            if self._pid != os.getpid():
                self._pid = os.getpid()
                self._connect()

    def identity(self, path: str) -> str | None:
        """What the disk cache keys ``path``'s blocks by, with the version: the endpoint and
        the path, unambiguously (a mirror holding the same version is another identity).  It
        may hold a secret (a signed query): hashed, never shown.  None: not kept on disk."""
        return None

    def probe(self, path: str, timeout: float) -> tuple[Pin, bytes, float | None]:
        """(what pins the file, its first bytes, its mtime) in one request where possible."""
        raise NotImplementedError

    def fetch(self, path: str, start: int, end: int, pin: Pin, timeout: float,
              cancel: Cancel | None = None):
        """Exactly the bytes ``[start, end)`` of ``path`` as ``pin`` says it is (each
        answer's validators checked: ``check_answer``; a change is FetchError "version"):
        ``bytes`` or the
        library's own buffer (anything with the buffer protocol), never copied again here.
        ``cancel``: ends the request in flight where the transport can (FetchError
        "cancelled") once no one waits for it any more; the caller
        (``RemoteSource._retry``) checks it before each try, so one that cannot (fsspec's
        call) runs to its end only if cancelled while in flight."""
        raise NotImplementedError

    def kind(self, path: str) -> str | None:
        raise NotImplementedError

    def files(self, directory: str) -> list[str]:
        raise NotImplementedError

    def sizes(self, directory: str) -> dict[str, int]:
        """Name -> size, for the files whose size ``directory``'s listing gave (asked after
        ``files``: a transport that keeps its listing asks nothing again)."""
        return {}


