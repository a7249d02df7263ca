"""Remote model files (SPEC §8, docs/remote.md): one factory from a URL to a location, and the
remote source that serves a file's bytes through the block cache (``tensorfs.blockcache``).

Transport is fsspec's, chosen in one place (``_transport``): ``fsspec.url_to_fs`` gives the
filesystem; HTTP(S) is read with ranged GETs through the aiohttp session fsspec's HTTP
filesystem opens (so that each answer's status, ``ETag`` and ``Content-Range`` are checked:
``cat_file`` hides them), S3 with s3fs's ``GetObject`` (``IfMatch``/``VersionId``), ``hf://``
by resolving the revision and listing with huggingface_hub and reading the commit's files
over HTTP, and any other protocol with its own ``info``/``ls``/``cat_file``.  fsspec's
``isdir``/``open`` are never called on HTTP (fsspec#1707: they may download the whole file).

A URL is shown (errors, logs, metadata.json, the fsname) without credentials: no
``user:password@`` and no ``?query``.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import posixpath
import threading
import time
import types
from concurrent.futures import CancelledError
from dataclasses import dataclass, field
from urllib.parse import quote, urlsplit, urlunsplit

from tensorfs import blockcache
from tensorfs.blockcache import BlockReader, DiskCache
from tensorfs.errors import ModelError
from tensorfs.location import DIRECTORY, FILE, Location, display_url
from tensorfs.source import SourceError

log = logging.getLogger("tensorfs")

EXTRA = "tensorfs-fuse[remote]"
PROBE_BYTES = 64 << 10          # the first request of a file: its size, version and header
MAX_TRIES = 5
FIRST_BACKOFF_S = 0.1
PARALLEL_SHARDS = 8


@dataclass
class RemoteSettings:
    storage_options: dict = field(default_factory=dict)
    timeout: float = 60.0                   # the longest wait of one read, retries included
    cache: object = None                    # the mount's tensorfs.cache.ByteLRU
    cache_bytes: int = 256 << 20            # when no cache is given
    disk_cache: tuple[str, int] | None = None       # (directory, bytes)


# ---------------------------------------------------------------------------------------
# URLs as shown
# ---------------------------------------------------------------------------------------

def url_secrets(url: str) -> list[str]:
    """The parts of ``url`` that may be credentials: a password, a query (a signature)."""
    parts = urlsplit(url)
    out = []
    if parts.password:
        out.append(parts.password)
    if parts.query:
        out.append(parts.query)
    return out


def hide_from_cmdline(secrets: list[str]) -> None:
    """Overwrite ``secrets`` with ``*`` where ``/proc/PID/cmdline`` reads the command line
    from: this process's own argument memory (``arg_start``..``arg_end`` in
    ``/proc/self/stat``), as setproctitle does.  The daemon is a fork of this process and
    shows what it shows; done right after the arguments are parsed, before any request.
    Best effort: where the memory is not what cmdline shows, nothing is touched."""
    import ctypes

    wanted = [s.encode("utf-8", "surrogateescape") for s in secrets if s]
    if not wanted:
        return
    try:
        with open("/proc/self/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        start, end = int(fields[45]), int(fields[46])      # fields 48, 49: arg_start, arg_end
        with open("/proc/self/cmdline", "rb") as f:
            shown = f.read()
        if end <= start or ctypes.string_at(start, end - start) != shown:
            return
        for secret in wanted:
            at = shown.find(secret)
            while at >= 0:
                ctypes.memmove(start + at, b"*" * len(secret), len(secret))
                at = shown.find(secret, at + len(secret))
    except (OSError, ValueError, IndexError):
        pass


# ---------------------------------------------------------------------------------------
# Faults, classified once
# ---------------------------------------------------------------------------------------

class FetchError(OSError):
    """One failed request.  ``kind``: not_found, denied, no_range, version, unreachable,
    timeout, http.  ``transient``: worth another try."""

    def __init__(self, kind: str, message: str, *, status: int | None = None,
                 transient: bool = False, hint: str = ""):
        super().__init__(errno.EIO, message)
        self.kind = kind
        self.message = message
        self.status = status
        self.transient = transient
        self.hint = hint


def _status_error(status: int, hint_401: str = "") -> FetchError:
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


def _connection_error(error: BaseException) -> FetchError:
    host = getattr(error, "host", None)
    cause = getattr(error, "os_error", None)
    if host is not None and cause is not None:
        why = getattr(cause, "strerror", None) or str(cause) or type(cause).__name__
        return FetchError("unreachable", f"cannot connect to {host}:{error.port}: {why}",
                          transient=True)
    text = str(error) or type(error).__name__
    return FetchError("unreachable", f"connection failed: {text}", transient=True)


def _os_error(error: OSError) -> FetchError:
    """What a filesystem's own error says (fsspec raises the builtin kinds)."""
    if isinstance(error, FileNotFoundError):
        return FetchError("not_found", "not found")
    if isinstance(error, PermissionError):
        return FetchError("denied", f"access denied ({error})")
    return FetchError("http", str(error) or type(error).__name__, transient=True)


def _exact(data: bytes, start: int, end: int) -> bytes:
    """``data`` if it is all of ``[start, end)``; a short answer is worth another try."""
    if len(data) != end - start:
        raise FetchError("http", f"short read: {len(data)} of {end - start} bytes",
                         transient=True)
    return data


# ---------------------------------------------------------------------------------------
# Transports
# ---------------------------------------------------------------------------------------

def _missing_extra(module: str, url: str) -> ModelError:
    return ModelError("remote_extra", f"reading a URL needs the optional packages of {EXTRA}: "
                      f"pip install '{EXTRA}' (missing: {module})", file=display_url(url))


class Transport:
    """Requests for the files of one place.  Made again in the daemon after the fork
    (``reopen``): an fsspec filesystem holds an event loop thread and sessions that a fork
    does not carry over."""

    etag_checked = False

    def __init__(self, url: str, settings: RemoteSettings):
        self.url = url
        self.settings = settings
        self._pid = os.getpid()
        self._lock = threading.Lock()
        self._inflight: set = set()
        self.closing = False
        self._connect()

    def _connect(self) -> None:
        raise NotImplementedError

    def abort(self) -> None:
        """End every request in flight and refuse new ones (the mount is going away)."""
        with self._lock:
            self.closing = True
            futures = list(self._inflight)
        for future in futures:
            future.cancel()

    def _track(self, future):
        with self._lock:
            if self.closing:
                future.cancel()
            self._inflight.add(future)
        return future

    def _untrack(self, future) -> None:
        with self._lock:
            self._inflight.discard(future)

    def reopen(self) -> None:
        with self._lock:
            if self._pid != os.getpid():
                self._pid = os.getpid()
                self._connect()

    def real(self, path: str) -> str:
        """The URL to request for the displayed ``path`` (credentials put back)."""
        return path

    def probe(self, path: str, deadline: float) -> tuple[int, str | None, bytes, float | None]:
        """(size, version, first bytes, mtime) of a file, in one request where possible."""
        raise NotImplementedError

    def fetch(self, path: str, start: int, end: int, version: str | None, timeout: float) -> bytes:
        raise NotImplementedError

    def kind(self, path: str) -> str | None:
        raise NotImplementedError

    def files(self, directory: str) -> list[str]:
        raise NotImplementedError


class FsspecTransport(Transport):
    """Any fsspec filesystem: ``info``, ``ls`` and ranged ``cat_file``."""

    def _connect(self) -> None:
        try:
            import fsspec
        except ImportError:
            raise _missing_extra("fsspec", self.url) from None
        try:
            self.fs, _ = fsspec.url_to_fs(self.url, skip_instance_cache=True,
                                          **self._options())
        except ImportError as error:
            raise _missing_extra(getattr(error, "name", None) or str(error), self.url) from None
        except (ValueError, TypeError) as error:
            raise ModelError("remote_options", f"cannot use this URL: {error}",
                             file=display_url(self.url)) from None

    def _options(self) -> dict:
        return dict(self.settings.storage_options)

    def _path(self, path: str) -> str:
        return self.fs._strip_protocol(self.real(path))

    def _call(self, fn, *args, timeout: float, **kwargs):
        """A blocking filesystem call, bounded by ``timeout``: run in a thread whose result
        is waited for that long (a hung call is left to finish on its own)."""
        future = _calls().submit(fn, *args, **kwargs)
        try:
            return future.result(timeout=timeout)
        except TimeoutError:
            raise FetchError("timeout", f"no answer within {timeout:g} s", transient=True) from None
        except OSError as error:
            raise _os_error(error) from None

    def _on_loop(self, coro, timeout: float):
        """Run ``coro`` on the filesystem's event loop (an async fsspec filesystem's),
        bounded by ``timeout`` and ended by ``abort``; what it raises is classified by
        ``_request_error``."""
        try:
            future = asyncio.run_coroutine_threadsafe(asyncio.wait_for(coro, timeout),
                                                      self.fs.loop)
        except RuntimeError as error:       # the loop is gone (after close)
            coro.close()
            raise FetchError("unreachable", str(error)) from None
        self._track(future)
        try:
            return future.result(timeout + 1)
        except FetchError:
            raise
        except (asyncio.TimeoutError, TimeoutError):
            future.cancel()
            raise FetchError("timeout", f"no answer within {timeout:g} s", transient=True) from None
        except CancelledError:
            raise FetchError("closing", "the mount is closing") from None
        except Exception as error:
            raise self._request_error(error) from None
        finally:
            self._untrack(future)

    def _request_error(self, error: Exception) -> Exception:
        """The FetchError a failed request on the loop stands for (or ``error`` itself)."""
        return _os_error(error) if isinstance(error, OSError) else error

    def _info(self, path: str, timeout: float) -> dict:
        return self._call(self.fs.info, self._path(path), timeout=timeout)

    def probe(self, path, deadline):
        info = self._info(path, max(0.1, deadline - time.monotonic()))
        if info.get("type") == "directory":
            raise FetchError("not_a_file", "is a directory")
        size = int(info.get("size") or 0)
        version = _version_of(info)
        first = self.fetch(path, 0, min(size, PROBE_BYTES), version,
                           max(0.1, deadline - time.monotonic())) if size else b""
        return size, version, first, _mtime_of(info)

    def fetch(self, path, start, end, version, timeout):
        if end <= start:
            return b""
        return _exact(self._call(self.fs.cat_file, self._path(path), start=start, end=end,
                                 timeout=timeout), start, end)

    def kind(self, path):
        try:
            info = self._info(path, self.settings.timeout)
        except FetchError as error:
            if error.kind == "not_found":
                return None
            raise
        return DIRECTORY if info.get("type") == "directory" else FILE

    def files(self, directory):
        entries = self._call(self.fs.ls, self._path(directory), detail=True,
                             timeout=self.settings.timeout)
        return sorted(posixpath.basename(e["name"].rstrip("/")) for e in entries
                      if e.get("type") == "file"
                      and not posixpath.basename(e["name"].rstrip("/")).startswith("."))


_call_pool = None
_call_pool_pid = 0
_call_pool_lock = threading.Lock()


def _calls():
    """Threads for blocking filesystem calls, apart from the read-ahead threads (which make
    such calls and wait for them: one pool for both could wait on itself)."""
    global _call_pool, _call_pool_pid
    from concurrent.futures import ThreadPoolExecutor

    with _call_pool_lock:
        if _call_pool is None or _call_pool_pid != os.getpid():
            _call_pool = ThreadPoolExecutor(64, thread_name_prefix="tensorfs-call")
            _call_pool_pid = os.getpid()
        return _call_pool


def _version_of(info: dict) -> str | None:
    for key in ("VersionId", "version_id", "ETag", "etag", "e_tag", "checksum", "md5",
                "generation", "mtime", "LastModified", "last_modified"):
        value = info.get(key)
        if value not in (None, "", "null"):
            return str(value)
    return None


def _mtime_of(info: dict) -> float | None:
    for key in ("LastModified", "last_modified", "mtime", "created"):
        value = info.get(key)
        if hasattr(value, "timestamp"):
            return value.timestamp()
        if isinstance(value, (int, float)):
            return float(value)
    return None


class HttpTransport(FsspecTransport):
    """fsspec's HTTP filesystem; each read a ranged GET on its aiohttp session, with
    ``If-Match`` the pinned ETag, the answer's status, ETag and Content-Range checked."""

    etag_checked = True
    hint_401 = ""

    def _connect(self) -> None:
        try:
            import aiohttp  # noqa: F401  (fsspec's HTTP filesystem needs it)
        except ImportError:
            raise _missing_extra("aiohttp", self.url) from None
        super()._connect()
        parts = urlsplit(self.url)
        self._userinfo = parts.netloc.rpartition("@")[0]
        self._query = (display_url(self.url), parts.query)

    def _options(self) -> dict:
        return _http_options(self.settings.storage_options)

    def real(self, path):
        parts = urlsplit(path)
        netloc = f"{self._userinfo}@{parts.netloc}" if self._userinfo else parts.netloc
        query = self._query[1] if path == self._query[0] else ""
        return urlunsplit((parts.scheme, netloc, parts.path, query, ""))

    def _headers(self) -> dict:
        return {}

    async def _get(self, url: str, start: int, end: int, etag: str | None, probe: bool):
        fs = self.fs
        session = await fs.set_session()
        kw = dict(fs.kwargs)
        headers = dict(kw.pop("headers", None) or {})
        headers.update(self._headers())
        headers["Range"] = f"bytes={start}-{end - 1}"
        headers["Accept-Encoding"] = "identity"
        if etag and not etag.startswith("W/"):
            headers["If-Match"] = etag
        async with session.get(fs.encode_url(url), headers=headers, **kw) as r:
            if r.status == 200:
                length = r.content_length
                if not (start == 0 and length is not None and length <= end):
                    raise FetchError("no_range", "the server ignores Range requests (it answered "
                                     "the whole file): tensorfs reads only byte ranges",
                                     status=200)
                total = length
            elif r.status == 206:
                total = _content_range(r.headers.get("Content-Range"), start)
            elif probe and r.status == 416:
                return 0, r.headers.get("ETag"), b"", r.headers.get("Last-Modified")
            else:
                raise _status_error(r.status, self._hint(r))
            got = r.headers.get("ETag")
            if etag and got != etag:
                raise FetchError("version", f"the file changed: ETag {got} is not {etag}, the "
                                 f"one pinned at mount")
            if probe:
                data = await r.read()
            else:
                data = await _body_into(r.content, end - start)
            return total, got, data, r.headers.get("Last-Modified")

    def _hint(self, response) -> str:
        return self.hint_401

    def _request_error(self, error):
        import aiohttp

        if isinstance(error, aiohttp.ClientResponseError):
            return _status_error(error.status)
        if isinstance(error, (aiohttp.ClientError, ConnectionError, OSError)):
            return _connection_error(error)
        return error

    def probe(self, path, deadline):
        from email.utils import parsedate_to_datetime

        total, etag, data, modified = self._on_loop(
            self._get(self.real(path), 0, PROBE_BYTES, None, True),
            max(0.1, deadline - time.monotonic()))
        if total is None:
            raise FetchError("no_range", "the server gives no size (no Content-Range / "
                             "Content-Length)")
        try:
            mtime = parsedate_to_datetime(modified).timestamp() if modified else None
        except (TypeError, ValueError):
            mtime = None
        return total, etag, data[:total], mtime

    def fetch(self, path, start, end, version, timeout):
        if end <= start:
            return b""
        _, _, data, _ = self._on_loop(self._get(self.real(path), start, end,
                                                version if self.etag_checked else None, False),
                                      timeout)
        return _exact(data, start, end)

    def files(self, directory):
        return super().files(directory.rstrip("/") + "/")


async def _body_into(content, size: int) -> bytearray:
    """The body, ``size`` bytes, received into a buffer of the block cache's pool rather
    than joined into a new object: no fresh memory to fault in per block, and a shorter
    hold of the GIL by the event loop thread (docs/remote.md "Measured")."""
    buf = blockcache.buffer_pool().take(size)
    pos = 0
    with memoryview(buf) as view:
        async for chunk in content.iter_any():
            n = len(chunk)
            if pos + n > size:
                raise FetchError("http", f"the server sent more than the {size} bytes asked for",
                                 transient=True)
            view[pos:pos + n] = chunk
            pos += n
    if pos != size:
        raise FetchError("http", f"short read: {pos} of {size} bytes", transient=True)
    return buf


def _http_options(options: dict) -> dict:
    """aiohttp reads a body in 64 KiB steps by default; 1 MiB steps move a 4 MiB block with
    less Python per byte (bench/bench_remote_blocks.py: ~+30 % for one 4 MiB request)."""
    options = dict(options)
    client = dict(options.get("client_kwargs") or {})
    client.setdefault("read_bufsize", 1 << 20)
    options["client_kwargs"] = client
    return options


def _content_range(header: str | None, start: int) -> int:
    """The total size from ``bytes START-END/TOTAL``, checking START."""
    try:
        unit, _, rest = (header or "").partition(" ")
        span, _, total = rest.partition("/")
        first = int(span.partition("-")[0])
        if unit != "bytes" or first != start:
            raise ValueError
        return int(total)
    except ValueError:
        raise FetchError("http", f"a partial answer with a Content-Range of {header!r} for a "
                         f"read at {start}", transient=True) from None


class HubTransport(HttpTransport):
    """``hf://[datasets/|spaces/]ORG/REPO[@REVISION][/PATH]``: huggingface_hub resolves the
    revision to its commit and lists directories; files are read from the commit's resolve
    URLs over fsspec's HTTP filesystem, with the token huggingface_hub finds."""

    etag_checked = False            # the commit pins the bytes (a CDN's ETag may differ)
    hint_401 = "a gated or private repo: set HF_TOKEN to a token with access"

    def _connect(self) -> None:
        try:
            import huggingface_hub
        except ImportError:
            raise _missing_extra("huggingface_hub", self.url) from None
        options = dict(self.settings.storage_options)
        self.token = options.pop("token", None) or huggingface_hub.get_token()
        self.endpoint = (options.pop("endpoint", None)
                         or huggingface_hub.constants.ENDPOINT).rstrip("/")
        self.api = huggingface_hub.HfApi(endpoint=self.endpoint, token=self.token)
        rest = self.url.split("://", 1)[1]
        self.repo_type, self.type_prefix = "model", ""
        for kind in ("datasets", "spaces"):
            if rest.startswith(kind + "/"):
                self.repo_type, self.type_prefix, rest = kind[:-1], kind + "/", rest[len(kind) + 1:]
        parts = rest.split("/")
        if len(parts) < 2 or not parts[0] or not parts[1]:
            raise ModelError("remote_url", "an hf:// URL is hf://ORG/REPO[@REVISION][/PATH]",
                             file=display_url(self.url))
        repo, _, revision = parts[1].partition("@")
        self.repo_id = f"{parts[0]}/{repo}"
        self.root = f"hf://{self.type_prefix}{parts[0]}/{parts[1]}"
        self.revision = revision or "main"
        if not hasattr(self, "commit"):
            self.commit = self._resolve()
        self._listings: dict[str, tuple[set, set]] = {}
        # the file reads: fsspec's HTTP filesystem on the endpoint
        import fsspec

        self.fs = fsspec.filesystem("http", skip_instance_cache=True, **_http_options(options))
        self._userinfo = ""
        self._query = ("", "")

    def _resolve(self) -> str:
        """The revision's commit, at mount: every read names it."""
        from huggingface_hub.utils import (GatedRepoError, HfHubHTTPError,
                                           RepositoryNotFoundError, RevisionNotFoundError)

        shown = display_url(self.url)
        try:
            return self.api.repo_info(self.repo_id, revision=self.revision,
                                      repo_type=self.repo_type, timeout=self.settings.timeout).sha
        except GatedRepoError:
            raise ModelError("remote_denied", f"access denied: {self.hint_401}", file=shown) from None
        except RepositoryNotFoundError:
            raise ModelError("remote_not_found", f"repository {self.repo_id} not found (or private: "
                             "set HF_TOKEN)", file=shown) from None
        except RevisionNotFoundError:
            raise ModelError("remote_not_found", f"revision {self.revision!r} not found in "
                             f"{self.repo_id}", file=shown) from None
        except HfHubHTTPError as error:
            status = getattr(getattr(error, "response", None), "status_code", None)
            raise ModelError("remote_error", f"the Hub answered HTTP {status}", file=shown) from None
        except Exception as error:      # no network: requests / httpx connection errors
            raise ModelError("remote_unreachable", f"cannot connect to {self.endpoint}: "
                             f"{type(error).__name__}", file=shown) from None

    def probe(self, path, deadline):
        size, _, first, mtime = super().probe(path, deadline)
        return size, self.commit, first, mtime

    def _in_repo(self, path: str) -> str:
        if path == self.root:
            return ""
        if not path.startswith(self.root + "/"):
            raise ModelError("shard_path", "outside the repository", file=path)
        return path[len(self.root) + 1:].strip("/")

    def _headers(self):
        return {"Authorization": f"Bearer {self.token}"} if self.token else {}

    def real(self, path):
        return (f"{self.endpoint}/{self.type_prefix}{self.repo_id}/resolve/{self.commit}/"
                f"{quote(self._in_repo(path))}")

    def _listing(self, directory: str) -> tuple[set, set]:
        if directory not in self._listings:
            from huggingface_hub.utils import EntryNotFoundError, HfHubHTTPError

            files, dirs = set(), set()
            try:
                for entry in self.api.list_repo_tree(self.repo_id, path_in_repo=directory or None,
                                                     revision=self.commit,
                                                     repo_type=self.repo_type):
                    name = entry.path.rsplit("/", 1)[-1]
                    (dirs if type(entry).__name__ == "RepoFolder" else files).add(name)
            except EntryNotFoundError:
                pass
            except HfHubHTTPError as error:
                status = getattr(getattr(error, "response", None), "status_code", None)
                if status != 404:
                    raise ModelError("remote_error", f"listing failed: HTTP {status}",
                                     file=f"{self.root}/{directory}") from None
            self._listings[directory] = (files, dirs)
        return self._listings[directory]

    def kind(self, path):
        in_repo = self._in_repo(path)
        if not in_repo:
            return DIRECTORY
        parent, _, name = in_repo.rpartition("/")
        files, dirs = self._listing(parent)
        return FILE if name in files else DIRECTORY if name in dirs else None

    def files(self, directory):
        return sorted(n for n in self._listing(self._in_repo(directory))[0]
                      if not n.startswith("."))


class S3Transport(FsspecTransport):
    """s3fs: ``HeadObject`` at mount; ranged ``GetObject`` with ``IfMatch`` the pinned ETag
    (and the ``VersionId`` when the bucket versions the object)."""

    etag_checked = True

    def probe(self, path, deadline):
        info = self._info(path, max(0.1, deadline - time.monotonic()))
        if info.get("type") == "directory":
            raise FetchError("not_a_file", "is a directory")
        size = int(info.get("size") or 0)
        etag, version_id = info.get("ETag"), info.get("VersionId")
        self._versions = getattr(self, "_versions", {})
        self._versions[path] = version_id if version_id not in (None, "null") else None
        version = etag if not self._versions[path] else f"{version_id}"
        self._etags = getattr(self, "_etags", {})
        self._etags[path] = etag
        first = self.fetch(path, 0, min(size, PROBE_BYTES), version,
                           max(0.1, deadline - time.monotonic())) if size else b""
        return size, version, first, _mtime_of(info)

    async def _get(self, path, start, end):
        bucket, key, _ = self.fs.split_path(self._path(path))
        kwargs = {"Bucket": bucket, "Key": key, "Range": f"bytes={start}-{end - 1}"}
        etag = getattr(self, "_etags", {}).get(path)
        version_id = getattr(self, "_versions", {}).get(path)
        if etag:
            kwargs["IfMatch"] = etag
        if version_id:
            kwargs["VersionId"] = version_id
        response = await self.fs._call_s3("get_object", **kwargs)
        try:
            if etag and response.get("ETag") not in (None, etag):
                raise FetchError("version", f"the object changed: ETag {response.get('ETag')} "
                                 f"is not {etag}, the one pinned at mount")
            return await response["Body"].read()
        finally:
            response["Body"].close()

    def fetch(self, path, start, end, version, timeout):
        if end <= start:
            return b""
        return _exact(self._on_loop(self._get(path, start, end), timeout), start, end)

    def _request_error(self, error):
        if (isinstance(error, OSError) and not isinstance(error, (FileNotFoundError,
                                                                   PermissionError))
                and _precondition_failed(error)):
            return FetchError("version", "the object changed: its ETag is no longer the one "
                              "pinned at mount (PreconditionFailed)")
        return super()._request_error(error)


def _precondition_failed(error: BaseException) -> bool:
    """s3fs turns botocore's ClientError into an OSError whose text varies (EINVAL, "At least
    one of the pre-conditions you specified did not hold"): the error code is on the cause."""
    seen = 0
    while error is not None and seen < 5:
        response = getattr(error, "response", None)
        if isinstance(response, dict):
            code = str((response.get("Error") or {}).get("Code", ""))
            status = (response.get("ResponseMetadata") or {}).get("HTTPStatusCode")
            if code == "PreconditionFailed" or status == 412:
                return True
        text = str(error)
        if "PreconditionFailed" in text or "pre-conditions you specified" in text:
            return True
        error = error.__cause__ or error.__context__
        seen += 1
    return False


def _transport(url: str, settings: RemoteSettings) -> Transport:
    """The one place a URL becomes a transport (ratarmount's factory, STYLE.md)."""
    scheme = url.split("://", 1)[0].lower()
    if scheme in ("http", "https"):
        return HttpTransport(url, settings)
    if scheme == "hf":
        return HubTransport(url, settings)
    if scheme in ("s3", "s3a"):
        try:
            import s3fs  # noqa: F401
        except ImportError:
            raise _missing_extra("s3fs", url) from None
        return S3Transport(url, settings)
    return FsspecTransport(url, settings)


# ---------------------------------------------------------------------------------------
# The location and the source
# ---------------------------------------------------------------------------------------

class RemoteLocation(Location):
    parallel = PARALLEL_SHARDS

    def __init__(self, url: str, settings: RemoteSettings):
        super().__init__()
        self.settings = settings
        self.transport = _transport(url, settings)
        self._missing: dict[str, ModelError] = {}
        if settings.cache is None:
            from tensorfs.cache import ByteLRU

            settings.cache = ByteLRU(settings.cache_bytes)
        self.disk = None
        if settings.disk_cache:
            try:
                self.disk = DiskCache(*settings.disk_cache)
            except OSError as error:
                raise ModelError("disk_cache", str(error), file=display_url(url)) from None

    def normalize(self, path: str) -> str:
        shown = display_url(path)
        if isinstance(self.transport, HubTransport):
            return shown.rstrip("/") if shown.rstrip("/") != "hf:" else shown
        return shown

    def kind(self, path: str) -> str | None:
        if isinstance(self.transport, HttpTransport) and not isinstance(self.transport, HubTransport):
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

    def _open(self, path: str):
        if path in self._missing:       # asked already (kind): not asked twice
            raise self._missing[path]
        return RemoteSource(self.transport, path, self.settings, self.disk)

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
             "timeout": "remote_timeout", "not_a_file": "not_a_file"}
    message = error.message + (f": {error.hint}" if error.hint else "")
    return ModelError(kinds.get(error.kind, "remote_error"), message, file=path)


_log_lock = threading.Lock()


def _logged(error: SourceError) -> SourceError:
    error.logged = True
    return error


class RemoteSource:
    """A remote file as served: size and version pinned by the first request, the header
    kept from the parse, every other byte read through the block cache."""

    # the parser's growing prefix grows by at most this much past what it asked for: a mount
    # fetches at most header + 1 MiB of each file (SPEC §8)
    prefix_step = 1 << 20

    def __init__(self, transport: Transport, path: str, settings: RemoteSettings,
                 disk: DiskCache | None):
        self.transport = transport
        self.name = self.path = path
        self.timeout = settings.timeout
        self.broken: str | None = None
        self._broken_logged = False
        deadline = time.monotonic() + settings.timeout
        try:
            self.size, self.version, head, mtime = self._retry(
                lambda timeout: transport.probe(path, time.monotonic() + timeout), deadline)
        except FetchError as error:
            raise _mount_error(error, path) from None
        self.mtime = mtime if mtime is not None else time.time()
        self._head = bytearray(head)        # the header, as parsed: kept to serve header.bin
        self._parsing = True
        if self.version is None:
            log.warning("%s: the server gives no version (ETag) for it: a change of the file "
                        "under the mount cannot be told; not kept in the disk cache", path)
        key = (path, self.version)
        block = blockcache.BLOCK_SIZE           # looked up here: bench/ varies it
        disk_key = (DiskCache.object_key(path, self.version, block)
                    if disk is not None and self.version else None)
        self.blocks = BlockReader(key, self.size, self._fetch, settings.cache, disk, disk_key,
                                  block_size=block)

    # -- the source interface ----------------------------------------------------------------
    def stat(self):
        return types.SimpleNamespace(st_uid=os.getuid(), st_gid=os.getgid(), st_mtime=self.mtime,
                                     st_mtime_ns=int(self.mtime * 1e9), st_size=self.size)

    def start(self) -> None:
        self.transport.reopen()
        self.blocks.page_cached = True      # start() is the mount's: reads go through FUSE

    def end_parse(self, extents: list[tuple[int, int]]) -> None:
        """The parse is over: later reads go through the block cache."""
        self._parsing = False
        self.blocks.set_extents(extents)

    def read(self, offset: int, size: int) -> bytes:
        if size <= 0:
            return b""
        buf = bytearray(size)
        self.read_into(offset, buf)
        return bytes(buf)

    def read_into(self, offset: int, buf, span: tuple[int, int] | None = None) -> int:
        """``span``: the extent the reader reads in, for read-ahead (BlockReader.read_into)."""
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
            return self.blocks.read_into(offset, buf, deadline, span=span)
        except FetchError as error:
            raise self._failed(error, offset, size) from None
        except TimeoutError:
            raise self._failed(FetchError("timeout", f"no answer within {self.timeout:g} s"),
                               offset, size) from None
        except SourceError:
            raise
        except OSError as error:
            raise self._failed(FetchError("http", str(error.strerror or error)), offset,
                               size) from None

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
            return _logged(SourceError(errno.EIO, f"{self.path}: {self.broken}"))
        log.error("%s: read of %d bytes at %d failed: %s", self.path, size, offset, error.message)
        return _logged(SourceError(errno.EIO, f"{self.path}: read of {size} bytes at {offset}: "
                                   f"{error.message}"))

    # -- requests ------------------------------------------------------------------------------
    def _fetch(self, start: int, end: int, deadline: float) -> bytes:
        if self.broken is not None:
            raise FetchError("version", self.broken)
        return self._retry(lambda timeout: self.transport.fetch(self.path, start, end,
                                                                self.version, timeout), deadline)

    def _retry(self, attempt, deadline: float):
        """``attempt(timeout)``, again after a transient fault (connection, timeout, 5xx,
        429) with doubling pauses, at most ``MAX_TRIES`` times and never past ``deadline``."""
        pause = FIRST_BACKOFF_S
        for tries in range(1, MAX_TRIES + 1):
            if self.transport.closing:
                raise FetchError("closing", "the mount is closing")
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
