"""``http://`` and ``https://`` through obstore's HTTPStore (``tensorfs.sources.transports.objects``).

Each file has a store whose base URL is the file's URL itself, requested with the empty
path: the URL is sent as the user spelled it (no decoding and re-encoding of its path), the
query only with the URL named (a pre-signed URL's signature), never with its siblings.

- Credentials: a URL's ``user:password@`` becomes an ``Authorization: Basic`` header (the
  URL requested has none); without one, ``~/.netrc`` (or ``$NETRC``) is read for the host,
  as curl's ``--netrc-optional`` and requests do.  reqwest drops ``Authorization`` on a
  redirect to another origin.  ``--storage-option headers={...}`` adds headers; any other
  key is an obstore client option (``root_certificate``: a PEM file's path or its text,
  ``proxy_url`` ...).  The certificates trusted are the system's, or SSL_CERT_FILE's and
  SSL_CERT_DIR's, and ``root_certificate``'s (``tensorfs.sources.transports.objects``, TLS trust).
- An ``https://`` URL is read over https only: a redirect to ``http://`` is refused.
- Pinning: the ETag of the first answer, sent as ``If-Match`` on every later read (a strong
  one); every answer's ETag, Last-Modified and Content-Range total must be the first
  answer's (``base.check_answer``), with or without an ETag.
"""

from __future__ import annotations

import base64
import logging
import netrc
import os
import threading
from urllib.parse import unquote, urlsplit, urlunsplit

from tensorfs.errors import ModelError
from tensorfs.sources.transports import receive
from tensorfs.sources.transports.base import PROBE_BYTES, FetchError, Pin, Transport, check_answer
from tensorfs.sources.transports.objects import (
    NO_RETRIES,
    check_meta,
    client_options,
    get_exact,
    head,
    modified_of,
    obstore,
    serve_here,
    store_problem,
    store_spec,
    trusted_roots,
)
from tensorfs.sources.urls import display_url

log = logging.getLogger("tensorfs")


class HttpTransport(Transport):
    etag_checked = True             # the ETag and Last-Modified are the file's (not a CDN's)
    listable = False                # no listing: a path is asked by opening it
    hint_401 = ""
    # the daemon's block fetches through http.client (``receive``), where chosen: made by
    # ``_choose_receiver``, used once this process serves (``serve``)
    _receiver: receive.Receiver | None = None
    _serving = False

    def serve(self):
        serve_here()
        if self._receiver is not None and not self._serving:
            # an https URL (or Hub endpoint) loads its trust now; a plain one never needs it
            threading.Thread(target=self._receiver.warm, args=(self._receiver.https_only,),
                             name="tensorfs-receive-warm", daemon=True).start()
        self._serving = True

    def _choose_receiver(self, https_only: bool) -> None:
        """Whether this mount's reads are received through http.client
        (``TENSORFS_HTTP_TRANSPORT``; obstore where options only it honours are given)."""
        try:
            use = receive.chosen(self._extra) and receive.proxies_supported()
        except ValueError as error:
            raise ModelError("remote_options", str(error), file=display_url(self.url)) from None
        self._receiver = (receive.Receiver(self.settings, self._headers,
                                           self._extra.get("root_certificate"), https_only)
                          if use else None)

    def abort(self) -> None:
        super().abort()
        if self._receiver is not None:
            self._receiver.abort()

    def reopen(self):
        """Nothing here belongs to one process: a store is made where it is first used."""

    def _connect(self) -> None:
        obstore(self.url)
        self._stores: dict[str, object] = {}
        parts = urlsplit(self.url)
        self._query = (display_url(self.url), parts.query)
        options = dict(self.settings.storage_options)
        self._headers = dict(options.pop("headers", None) or {})
        self._extra = trusted_roots(options, display_url(self.url))
        login = _userinfo(parts) or _netrc(parts.hostname)
        if login is not None and not any(k.lower() == "authorization" for k in self._headers):
            token = base64.b64encode(f"{login[0]}:{login[1]}".encode()).decode()
            self._headers["Authorization"] = f"Basic {token}"
        self._choose_receiver(https_only=parts.scheme.lower() == "https")

    def real(self, path: str) -> str:
        """The URL to request for the displayed ``path``: the named URL's query put back
        (credentials travel as a header, never in the URL)."""
        parts = urlsplit(path)
        query = self._query[1] if path == self._query[0] else ""
        return urlunsplit((parts.scheme, parts.netloc.rpartition("@")[2], parts.path, query, ""))

    def identity(self, path):
        parts = urlsplit(self.real(path))
        return urlunsplit((parts.scheme.lower(), parts.netloc.lower(), parts.path, parts.query, ""))

    def located(self, path: str) -> tuple[str, str]:
        """(the URL a store is made for, the path asked of that store) for ``path``: one
        store (one client, one pool of kept-alive connections) per endpoint, whatever the
        number of files asked of it.  A URL with a query (the named one's signature) or
        with percent-escapes of its own keeps a store of its own: asked as it is, never
        decoded and encoded again."""
        url = self.real(path)
        parts = urlsplit(url)
        if parts.query or "%" in parts.path:
            return url, ""
        return urlunsplit((parts.scheme, parts.netloc, "/", "", "")), parts.path.lstrip("/")

    def _store(self, path: str) -> tuple[tuple, str]:
        """(the store's spec, the path to ask it for)."""
        url, relative = self.located(path)
        store = self._stores.get(url)
        if store is None:
            parts = urlsplit(url)
            try:
                store = store_spec(
                    "HTTPStore", url, retry_config=NO_RETRIES,
                    client_options=client_options(self.settings, allow_http=parts.scheme == "http",
                                                  headers=self._headers, extra=self._extra))
            except FetchError:
                raise
            except Exception as error:      # any exception: obstore's configuration errors
                raise ModelError("remote_options", f"cannot use this URL: {store_problem(error)}",
                                 file=display_url(self.url)) from None
            self._stores[url] = store
        return store, relative

    def _where(self, path: str) -> str:
        parts = urlsplit(path)
        return parts.netloc.rpartition("@")[2]

    def probe(self, path, timeout):
        store, relative = self._store(path)
        try:
            body, meta = get_exact(store, relative, 0, PROBE_BYTES, timeout=timeout,
                                   hint_401=self.hint_401, probe=True, where=self._where(path))
        except FetchError as error:
            if error.status != 416:
                raise
            meta = head(store, relative, timeout=timeout, hint_401=self.hint_401,
                        where=self._where(path))    # an empty file
            if meta["size"] != 0:
                raise
            body = b""
        modified = meta.get("last_modified")
        etag = meta.get("e_tag")
        pin = Pin(meta["size"], etag, etag=etag if self.etag_checked else None,
                  modified=modified_of(meta) if self.etag_checked else None)
        return pin, body, modified.timestamp() if modified is not None else None

    def fetch(self, path, start, end, pin, timeout, cancel=None):
        if end <= start:
            return b""
        etag = pin.etag
        if self._receiver is not None and self._serving:
            return self._receive(path, start, end, pin, timeout, cancel)
        store, relative = self._store(path)
        body, meta = get_exact(store, relative, start, end, timeout=timeout,
                               if_match=etag if etag and not etag.startswith("W/") else None,
                               hint_401=self.hint_401, where=self._where(path), cancel=cancel)
        check_meta(pin, meta)
        return body

    def _receive(self, path, start, end, pin: Pin, timeout, cancel):
        """``fetch`` through http.client, into a reused buffer (``receive``), every answer
        checked against what the probe pinned (``check_answer``): its size (Content-Range's
        total), ETag and Last-Modified."""
        assert self._receiver is not None
        etag = pin.etag
        body, meta = self._receiver.get(
            self.real(path), start, end, timeout, size=pin.size,
            if_match=etag if etag and not etag.startswith("W/") else None,
            hint_401=self.hint_401, cancel=cancel)
        modified = None
        if meta["last_modified"]:
            from email.utils import parsedate_to_datetime

            try:
                modified = parsedate_to_datetime(meta["last_modified"]).timestamp()
            except (TypeError, ValueError):
                modified = None
        check_answer(pin, etag=meta["etag"], modified=modified)
        return body

    def kind(self, path):
        raise NotImplementedError       # tensorfs.sources.remote asks a plain URL by opening it

    def files(self, directory):
        raise ModelError("remote_listing", "an http(s) URL has no listing: name the model "
                         "file, the index or a split GGUF's first shard", file=directory)


def _userinfo(parts) -> tuple[str, str] | None:
    if parts.username is None and parts.password is None:
        return None
    return unquote(parts.username or ""), unquote(parts.password or "")


MAX_NETRC_BYTES = 1 << 20       # a netrc of a thousand hosts is 100 KB; it is read per URL


def _netrc_to_read(path: str) -> bool:
    """Whether ``path`` is a netrc worth reading: a regular file (not a FIFO that would
    block, not /dev/zero) of at most ``MAX_NETRC_BYTES`` (``netrc`` parses a character at a
    time: a sparse 1 GiB file held ``inspect`` for minutes).  Passed over, logged, else."""
    import stat

    try:
        st = os.stat(path)
    except OSError:
        return False
    if not stat.S_ISREG(st.st_mode):
        return False
    if st.st_size > MAX_NETRC_BYTES:
        log.info("%s: not read: %d bytes, more than a netrc (%d)", path, st.st_size,
                 MAX_NETRC_BYTES)
        return False
    return True


def _netrc(host: str | None) -> tuple[str, str] | None:
    """The login ``~/.netrc`` (or ``$NETRC``) holds for ``host``, if any; a netrc that
    cannot be read is passed over (logged), as curl's --netrc-optional does."""
    if not host:
        return None
    path = os.environ.get("NETRC") or os.path.join(os.path.expanduser("~"), ".netrc")
    if not _netrc_to_read(path):
        return None
    try:
        entry = netrc.netrc(path).authenticators(host)
    except (OSError, netrc.NetrcParseError) as error:
        log.info("%s: not read: %s", path, getattr(error, "msg", None) or error)
        return None
    if not entry:
        return None
    login, _, password = entry
    return login or "", password or ""
