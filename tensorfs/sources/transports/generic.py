"""Any other protocol fsspec knows and has installed (``file://``, ``sftp://``, ``webdav://``
...): its ``info``, ``ls`` and ranged ``cat_file``.  fsspec's ``isdir``/``open`` are never
called (fsspec#1707: on some filesystems they download the whole file).  Every call is
waited for at most ``--timeout`` (``tensorfs.sources.transports.base.bounded``); what the filesystem
raises is classified by the builtin kind it is (fsspec raises ``FileNotFoundError``,
``PermissionError`` ...); an answer longer than the range asked for is refused, as on every
transport (how much such a filesystem receives before it returns is its own affair).  Each
read is followed by the file's ``info``, whose size and version must be the ones of the
mount (``base.check_answer``): a ranged read names neither."""

from __future__ import annotations

import json
import posixpath
import time

from tensorfs.errors import ModelError
from tensorfs.sources.location import DIRECTORY, FILE
from tensorfs.sources.transports.base import (
    PROBE_BYTES,
    FetchError,
    Pin,
    Transport,
    bounded,
    check_answer,
    exact,
    missing_extra,
)
from tensorfs.sources.urls import display_url


class FsspecTransport(Transport):
    def _connect(self) -> None:
        try:
            import fsspec  # the remote extra: any other protocol's mount only
        except ImportError:
            raise missing_extra("fsspec", self.url) from None
        try:
            self.fs, _ = fsspec.url_to_fs(self.url, skip_instance_cache=True,
                                          **dict(self.settings.storage_options))
        except ImportError as error:
            raise missing_extra(getattr(error, "name", None) or str(error), self.url) from None
        except (ValueError, TypeError) as error:
            raise ModelError("remote_options", f"cannot use this URL: {error}",
                             file=display_url(self.url)) from None

    def _path(self, path: str) -> str:
        return self.fs._strip_protocol(path)

    def identity(self, path):
        # any option may name the endpoint (endpoint_url, project, account_name ...): all
        # of them, hashed with the rest
        options = json.dumps(getattr(self.fs, "storage_options", {}), sort_keys=True, default=str)
        protocol = self.fs.protocol if isinstance(self.fs.protocol, str) else self.fs.protocol[0]
        return f"{protocol}+{options}/{self._path(path)}"

    def _call(self, fn, *args, timeout: float, **kwargs):
        try:
            return bounded(fn, timeout, *args, **kwargs)
        except FetchError:
            raise
        except OSError as error:
            raise _os_error(error) from None

    def _info(self, path: str, timeout: float) -> dict:
        return self._call(self.fs.info, self._path(path), timeout=timeout)

    def probe(self, path, timeout):
        deadline = time.monotonic() + timeout
        info = self._info(path, timeout)
        if info.get("type") == "directory":
            raise FetchError("not_a_file", "is a directory")
        size = info.get("size")
        if not isinstance(size, int) or size < 0:
            raise FetchError("http", f"the filesystem gives no valid size ({size!r})")
        pin = Pin(size, _version_of(info))
        first = self.fetch(path, 0, min(size, PROBE_BYTES), pin,
                           max(0.1, deadline - time.monotonic())) if size else b""
        return pin, first, _mtime_of(info)

    def fetch(self, path, start, end, pin, timeout, cancel=None):
        """The bytes, then the file's ``info`` again: a ranged ``cat_file`` says nothing of
        the file it read, so the size and version seen after it are the ones it read from
        (a change before or during the read shows in them)."""
        if end <= start:
            return b""
        deadline = time.monotonic() + timeout
        data = self._call(self.fs.cat_file, self._path(path), start=start, end=end,
                          timeout=timeout)
        info = self._info(path, max(0.1, deadline - time.monotonic()))
        size = info.get("size")
        check_answer(pin, size=size if type(size) is int else None, version=_version_of(info))
        return exact(data, start, end)

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

    def sizes(self, directory):
        entries = self._call(self.fs.ls, self._path(directory), detail=True,
                             timeout=self.settings.timeout)
        return {posixpath.basename(e["name"].rstrip("/")): e["size"] for e in entries
                if e.get("type") == "file" and type(e.get("size")) is int and e["size"] >= 0}


def _os_error(error: OSError) -> FetchError:
    """What a filesystem's own error says (fsspec raises the builtin kinds)."""
    if isinstance(error, FileNotFoundError):
        return FetchError("not_found", "not found")
    if isinstance(error, PermissionError):
        return FetchError("denied", f"access denied ({error})")
    if isinstance(error, (ConnectionError, TimeoutError)):
        return FetchError("unreachable", f"connection failed: {error}", transient=True)
    return FetchError("http", str(error) or type(error).__name__, transient=True)


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
