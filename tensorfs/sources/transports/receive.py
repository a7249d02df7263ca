"""http(s) range reads received with Python's own ``http.client`` into reused buffers.

obstore hands each range over as a new ``bytes`` made from its own (docs/internals/copylimit.md: the
receive side alone ~0.5 CPU s/GiB, a new allocation per block).  Here the daemon's block
fetches of ``http://`` and ``https://`` files (the Hub's resolved URLs included) ask for the
range themselves and receive its body with ``HTTPResponse.readinto`` (``BufferedReader`` ->
``socket.recv_into`` / ``SSLSocket.recv_into``, the GIL released) into a buffer of
``Buffers``: one of the blocks the mount let go of, reused once nothing holds it any more.
``http.client`` parses the answers; nothing here parses HTTP.  What this adds to it:

- **one kept connection per fetch thread and origin** (and per proxy), made again after a
  failure; at most ``ORIGINS_PER_THREAD`` per thread; ``abort`` shuts every one down;
- **bounded answers**: a ``206`` whose ``Content-Range`` is not the range asked for, whose
  total is not the file's size (the file changed), or whose ``Content-Length`` is larger than
  the range is refused before its body is read; a chunked body is read into the buffer and
  one byte more must find its end; a shorter body is an error worth another try; a
  ``Content-Encoding`` other than identity is refused (``Accept-Encoding: identity`` is
  asked); a ``200`` to a range request is refused (the server ignores ranges);
- **redirects** (301, 302, 303, 307, 308), at most ``MAX_REDIRECTS``, a loop refused, a
  relative ``Location`` resolved against the URL asked; an ``https://`` URL never goes to
  ``http://``; ``Authorization``, ``Cookie`` and ``Proxy-Authorization`` are not sent to
  another origin (as reqwest does);
- **proxies** as curl reads them (``http_proxy``, ``HTTPS_PROXY``/``https_proxy``,
  ``ALL_PROXY``, ``NO_PROXY``: urllib's reading of the environment), a ``CONNECT`` tunnel for
  https;
- **TLS** through ``ssl.create_default_context`` (hostname checked, TLS 1.2 at least):
  SSL_CERT_FILE and SSL_CERT_DIR where set, else the system's store, and ``root_certificate``
  beside them (``trust_context``, shared with the Hub's API requests);
- **deadlines and the off switch**: each request ends at its timeout whatever the server
  trickles (its socket is shut down from the deadline thread), and a ``Cancel`` shuts it
  down from the thread that cancels (a killed reader's fetch stops at once).

Which receives a mount's reads: ``chosen`` (``TENSORFS_HTTP_TRANSPORT``).
"""

from __future__ import annotations

import errno
import logging
import os
import re
import socket
import sys
import threading
import time
from collections import OrderedDict
from typing import TYPE_CHECKING
from urllib.parse import urljoin, urlsplit

from tensorfs.sources.transports.base import Cancel, FetchError, status_error
from tensorfs.waits import Timers

if TYPE_CHECKING:       # imported where first used: not on the mount command's path
    import http.client
    import ssl

log = logging.getLogger("tensorfs")

ENV = "TENSORFS_HTTP_TRANSPORT"
HTTP_CLIENT, OBSTORE = "http.client", "obstore"
CHOICES = (HTTP_CLIENT, OBSTORE)
DEFAULT = OBSTORE                  # until http.client meets every goal side by side (copylimit.md)
# the storage options http.client honours; any other (an obstore client option) keeps obstore
OPTIONS = frozenset({"root_certificate"})
MAX_REDIRECTS = 10                  # reqwest's default
ORIGINS_PER_THREAD = 4
SMALL_BODY = 64 << 10               # a redirect's or refusal's body read to keep the connection
# headers that never go to another origin than the one named (reqwest's sensitive headers)
SENSITIVE = ("authorization", "cookie", "proxy-authorization")
_CONTENT_RANGE = re.compile(r"bytes (\d+)-(\d+)/(\d+|\*)")


def choice() -> str:
    """The transport ``TENSORFS_HTTP_TRANSPORT`` names (``DEFAULT`` where unset); a
    ``ValueError`` naming the choices for anything else."""
    value = os.environ.get(ENV, "").strip().lower() or DEFAULT
    if value not in CHOICES:
        raise ValueError(f"{ENV}={os.environ.get(ENV)}: not one of {', '.join(CHOICES)}")
    return value


def chosen(options: dict) -> bool:
    """Whether a mount with these storage options (``headers`` taken out) receives its
    http(s) reads through http.client: where chosen, and where every option is one it
    honours."""
    if choice() != HTTP_CLIENT:
        return False
    if not set(options) <= OPTIONS:
        log.info("http(s) reads through obstore: storage options %s are obstore's",
                 ", ".join(sorted(set(options) - OPTIONS)))
        return False
    return True


def trust_context(root_certificate: str | None) -> "ssl.SSLContext":
    """The certificates trusted, as the file reads through obstore (rustls) trust them:
    SSL_CERT_FILE and SSL_CERT_DIR where either is set (both, if both are), else the
    system's store; and ``root_certificate``'s PEM text beside them."""
    import ssl

    cafile, capath = os.environ.get("SSL_CERT_FILE"), os.environ.get("SSL_CERT_DIR")
    cafile = cafile if cafile and os.path.isfile(cafile) else None
    capath = capath if capath and os.path.isdir(capath) else None
    if cafile or capath:
        context = ssl.create_default_context(cafile=cafile, capath=capath)
    else:
        context = ssl.create_default_context()      # the system's store, as OpenSSL finds it
    if root_certificate:
        context.load_verify_locations(cadata=root_certificate)
    context.minimum_version = max(context.minimum_version, ssl.TLSVersion.TLSv1_2)
    return context


# -- buffers --------------------------------------------------------------------------------

class Buffers:
    """Buffers to receive blocks into, reused: a buffer given out is free again once
    nothing but this pool refers to it (the block cache let go of the block, every view of
    it released; CPython's reference count says so exactly, and no new reference can appear
    without one held).  At most ``limit`` bytes are kept; past that a buffer is new and not
    kept.  A kept buffer's pages were touched once (the kernel's zeroing paid once)."""

    # references to a free buffer while ``take`` looks at it: the pool's list, the loop's
    # name and getrefcount's argument
    _FREE = 3

    def __init__(self, limit: int):
        self.limit = limit
        self._lock = threading.Lock()
        self._kept: dict[int, list[bytearray]] = {}
        self._bytes = 0
        self.made = 0                   # buffers made (tests, bench)

    def take(self, size: int) -> bytearray:
        with self._lock:
            kept = self._kept.setdefault(size, [])
            for buffer in kept:
                if sys.getrefcount(buffer) == self._FREE:
                    return buffer
            self.made += 1
            if self._bytes + size > self.limit:
                self._make_room(size)
            if self._bytes + size > self.limit:
                return bytearray(size)
            buffer = bytearray(size)
            kept.append(buffer)
            self._bytes += size
            return buffer


    def _make_room(self, size: int) -> None:
        """Let go of free buffers of other sizes (a random reader's pieces) until ``size``
        more fits: the sizes read now are the ones kept."""
        for other, kept in self._kept.items():
            if other == size:
                continue
            for buffer in list(kept):
                # the pool's list, the copy's, the loop's name and getrefcount's argument
                if sys.getrefcount(buffer) == self._FREE + 1:
                    kept.remove(buffer)
                    self._bytes -= other
                    if self._bytes + size <= self.limit:
                        return


# -- deadlines ------------------------------------------------------------------------------

_deadlines = Timers("tensorfs-receive-deadlines")


# -- requests -------------------------------------------------------------------------------

class _Request:
    """One request's connection, shut down from another thread where it is cancelled or
    its deadline passes."""

    def __init__(self):
        self.conn: "http.client.HTTPConnection | None" = None
        self.why = ""                   # "cancelled" or "timeout", once shut down
        self._lock = threading.Lock()

    def stop(self, why: str) -> None:
        with self._lock:
            if self.why:
                return
            self.why = why
            conn = self.conn
        _shut(conn)

    def use(self, conn) -> None:
        with self._lock:
            self.conn = conn
            stopped = bool(self.why)
        if stopped:
            _shut(conn)


def _shut(conn) -> None:
    sock = getattr(conn, "sock", None) if conn is not None else None
    if sock is not None:
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass


class Receiver:
    """The http.client side of ``tensorfs.sources.transports.http.HttpTransport``: ranged
    GETs received into ``Buffers``."""

    def __init__(self, settings, headers: dict, root_certificate: str | None, https_only: bool):
        self.settings = settings
        self.headers = dict(headers)
        self.root_certificate = root_certificate
        self.https_only = https_only
        self.buffers = Buffers(settings.cache_bytes + (64 << 20))
        self._context: "ssl.SSLContext | None" = None
        self._local = threading.local()
        self._lock = threading.Lock()
        self._open: set = set()         # every connection kept, for abort and the tests
        self._proxies: dict = {}        # (scheme, host) -> _proxy_for's answer
        self.closing = False

    # -- connections ------------------------------------------------------------------------
    def context(self) -> "ssl.SSLContext":
        if self._context is None:
            self._context = trust_context(self.root_certificate)
        return self._context

    def _conns(self) -> OrderedDict:
        conns = getattr(self._local, "conns", None)
        if conns is None or self._local.pid != os.getpid():
            conns = self._local.conns = OrderedDict()
            self._local.pid = os.getpid()
        return conns

    def _connection(self, scheme: str, host: str, port: int, proxy, timeout: float):
        """(the thread's kept connection to the origin, whether it was used before, its
        key)."""
        key = (scheme, host, port, proxy)
        conns = self._conns()
        conn = conns.get(key)
        if conn is not None:
            conns.move_to_end(key)
            conn.timeout = timeout
            if conn.sock is not None:
                conn.sock.settimeout(timeout)
                return conn, True, key
            self._drop(key, conns)
        conn = self._make(scheme, host, port, proxy, timeout)
        conns[key] = conn
        with self._lock:
            self._open.add(conn)
        while len(conns) > ORIGINS_PER_THREAD:
            self._drop(next(iter(conns)), conns)
        return conn, False, key

    def _make(self, scheme, host, port, proxy, timeout):
        import http.client
        if proxy is not None:
            p_host, p_port, _ = proxy
            if scheme == "https":
                conn = http.client.HTTPSConnection(p_host, p_port, timeout=timeout,
                                                   context=self.context())
                conn.set_tunnel(host, port, headers=_proxy_headers(proxy))
                return conn
            return http.client.HTTPConnection(p_host, p_port, timeout=timeout)
        if scheme == "https":
            return http.client.HTTPSConnection(host, port, timeout=timeout,
                                               context=self.context())
        return http.client.HTTPConnection(host, port, timeout=timeout)

    def _drop(self, key, conns) -> None:
        conn = conns.pop(key, None)
        if conn is not None:
            with self._lock:
                self._open.discard(conn)
            conn.close()

    def abort(self) -> None:
        """The mount is going away: every connection is shut down (readers in flight end)."""
        self.closing = True
        with self._lock:
            conns = list(self._open)
        for conn in conns:
            _shut(conn)

    def warm(self, https: bool) -> None:
        """What the first read would otherwise wait for, done now (the daemon, in a thread):
        http.client imported, the certificates to trust loaded where they will be needed
        (loading the system's store is ~20 ms of CPU a plain http mount does not spend)."""
        import http.client  # noqa: F401

        if not https:
            return
        try:
            self.context()
        except Exception:               # a bad trust setting: said by the first read
            pass

    def open_connections(self) -> int:
        with self._lock:
            return sum(1 for conn in self._open if conn.sock is not None)

    # -- one ranged read --------------------------------------------------------------------
    def get(self, url: str, start: int, end: int, timeout: float, *, size: int | None,
            if_match: str | None = None, hint_401: str = "",
            cancel: Cancel | None = None) -> tuple[bytearray, dict]:
        """Exactly ``[start, end)`` of ``url`` in a buffer of ``buffers``, and the answer's
        headers that matter (``etag``, ``last_modified``)."""
        import http.client
        request = _Request()
        entry = _deadlines.add(time.monotonic() + timeout, lambda: request.stop("timeout"))
        if cancel is not None:
            cancel.on_cancel(lambda: request.stop("cancelled"))
        try:
            return self._get(request, url, start, end, timeout, size, if_match, hint_401)
        except FetchError:
            if request.why:
                raise self._stopped(request.why) from None
            raise
        except (OSError, http.client.HTTPException, ValueError) as error:
            if request.why:
                raise self._stopped(request.why) from None
            raise self._classify(error, url, self.settings.timeout) from None
        finally:
            _deadlines.cancel(entry)

    def _stopped(self, why: str) -> FetchError:
        if why == "cancelled":
            return FetchError("cancelled", "no one waits for it any more")
        return FetchError("timeout", f"no answer within {self.settings.timeout:g} s",
                          transient=True)

    def _get(self, request: _Request, url: str, start: int, end: int, timeout: float,
             size: int | None, if_match: str | None, hint_401: str):
        headers = dict(self.headers)
        headers["Range"] = f"bytes={start}-{end - 1}"
        headers["Accept-Encoding"] = "identity"
        headers.setdefault("User-Agent", "tensorfs")
        if if_match:
            headers["If-Match"] = if_match
        origin = _origin(url)
        seen = {url}
        for _ in range(MAX_REDIRECTS + 1):
            if self.closing:
                raise FetchError("closing", "the mount is closing")
            response, conn, key = self._ask(request, url, headers, timeout)
            status = response.status
            if status in (301, 302, 303, 307, 308) and response.getheader("Location"):
                target = urljoin(url, response.getheader("Location", "").strip())
                self._finish(response, conn, key)
                parts = urlsplit(target)
                if parts.scheme not in ("http", "https") or (
                        self.https_only and parts.scheme != "https"):
                    raise FetchError("http", "the server redirected to a URL tensorfs does not "
                                     "follow (an https:// URL is never read over plain http://)")
                if target in seen:
                    raise FetchError("http", "the server redirected in a loop")
                seen.add(target)
                if _origin(target) != origin:
                    headers = {k: v for k, v in headers.items() if k.lower() not in SENSITIVE}
                url = target
                continue
            return self._body(response, conn, key, status, start, end, size, hint_401)
        raise FetchError("http", f"the server redirected more than {MAX_REDIRECTS} times")

    def _ask(self, request: _Request, url: str, headers: dict, timeout: float):
        """Send the GET on the thread's connection to ``url``'s origin and read the answer's
        head; once again on a new connection where a kept one was closed by the server
        before answering."""
        import http.client

        parts = urlsplit(url)
        scheme = parts.scheme
        host = parts.hostname or ""
        port = parts.port or (443 if scheme == "https" else 80)
        target = parts.path or "/"
        if parts.query:
            target += "?" + parts.query
        proxy = self._proxies.get((scheme, host), False)
        if proxy is False:              # the environment read once per scheme and host
            proxy = self._proxies[(scheme, host)] = _proxy_for(scheme, host)
        sent = headers
        if scheme == "http" and proxy is not None:     # a plain request through the proxy
            target = f"http://{parts.netloc.rpartition('@')[2]}{target}"
            sent = {**headers, **_proxy_headers(proxy)}
        for again in (True, False):
            conn, reused, key = self._connection(scheme, host, port, proxy, timeout)
            request.use(conn)
            try:
                conn.request("GET", target, headers=sent)
                response = conn.getresponse()
            except (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError):
                self._drop(key, self._conns())
                if reused and again and not request.why:
                    continue            # the server closed a kept connection: a new one
                raise
            except BaseException:
                self._drop(key, self._conns())
                raise
            if conn.sock is not None and hasattr(socket, "TCP_QUICKACK"):
                try:                    # no delayed ACK holding the next answer back
                    conn.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_QUICKACK, 1)
                except OSError:
                    pass
            return response, conn, key
        raise AssertionError("unreachable")

    def _finish(self, response, conn, key) -> None:
        """Done with an answer not wanted (a redirect, a refusal): its small body read so
        that the connection is kept, else the connection closed."""
        import http.client
        length = response.length
        if not response.chunked and length is not None and length <= SMALL_BODY \
                and not response.will_close:
            try:
                response.read()
                return
            except (OSError, http.client.HTTPException):
                pass
        self._drop(key, self._conns())

    def _body(self, response, conn, key, status: int, start: int, end: int,
              size: int | None, hint_401: str):
        want = end - start
        if status != 206:
            self._finish(response, conn, key)
            if status == 200:
                from tensorfs.sources.transports.objects import NO_RANGE
                raise FetchError("no_range", NO_RANGE, status=200)
            raise status_error(status, hint_401)
        try:
            self._check_head(response, start, end, size)
        except FetchError:
            self._drop(key, self._conns())
            raise
        buffer = self.buffers.take(want)
        view = memoryview(buffer)
        try:
            got = response.readinto(view)
            if got < want:
                while got < want:       # a chunked body: readinto stops at a chunk's end
                    n = response.readinto(view[got:])
                    if not n:
                        break
                    got += n
            if got < want:
                raise FetchError("http", f"short read: {got} of {want} bytes", transient=True)
            if response.chunked and response.read(1):
                raise FetchError("too_long", f"the server sent more than the {want} bytes "
                                 "asked for")
        except BaseException:
            view.release()
            self._drop(key, self._conns())
            raise
        view.release()
        if response.will_close or not response.isclosed():
            self._drop(key, self._conns())
        return buffer, {"etag": response.getheader("ETag"),
                        "last_modified": response.getheader("Last-Modified")}

    @staticmethod
    def _check_head(response, start: int, end: int, size: int | None) -> None:
        want = end - start
        found = _CONTENT_RANGE.fullmatch((response.getheader("Content-Range") or "").strip())
        if not found:
            raise FetchError("http", "the server's Content-Range is not a valid byte range of "
                             "the file (RFC 9110)")
        first, last, total = int(found[1]), int(found[2]), found[3]
        if last < first or (total != "*" and last >= int(total)):
            raise FetchError("http", "the server's Content-Range is not a valid byte range of "
                             "the file (RFC 9110)")
        if first != start or last + 1 != end:
            raise FetchError("http", f"an answer for bytes {first}-{last + 1} to a read of "
                             f"{start}-{end}", transient=True)
        if size is not None and total != "*" and int(total) != size:
            raise FetchError("version", f"the file changed: it is {total} bytes now, not "
                             f"{size}, as at mount")
        encoding = (response.getheader("Content-Encoding") or "").strip().lower()
        if encoding not in ("", "identity"):
            raise FetchError("encoding", f"the server sent the bytes encoded ({encoding}) "
                             "although asked for them as they are (Accept-Encoding: identity)")
        if response.length is not None and response.length > want:
            raise FetchError("too_long", f"the server sent more than the {want} bytes asked for")
        if response.length is not None and response.length < want:
            raise FetchError("http", f"short read: {response.length} of {want} bytes",
                             transient=True)

    @staticmethod
    def _classify(error: BaseException, url: str, timeout: float) -> FetchError:
        import http.client
        import ssl
        where = urlsplit(url).netloc.rpartition("@")[2]
        if isinstance(error, ssl.SSLCertVerificationError):
            why = error.verify_message or str(error)
            return FetchError("untrusted", f"cannot connect to {where}: the server's certificate "
                              f"is not trusted (OpenSSL: {why})")
        if isinstance(error, ssl.SSLError):
            return FetchError("unreachable", f"cannot connect to {where}: the TLS handshake "
                              f"failed (OpenSSL: {error.reason or error}): does the server "
                              "speak https on this port?")
        if isinstance(error, TimeoutError):
            return FetchError("timeout", f"no answer within {timeout:g} s", transient=True)
        if isinstance(error, socket.gaierror):
            return FetchError("unreachable", f"cannot connect to {where}: the host name does not "
                              f"resolve ({error.strerror})", transient=True)
        if isinstance(error, OSError) and error.errno == errno.EMFILE:
            from tensorfs.sources.local import too_many_open_files  # the limit, not the server
            return FetchError("http", too_many_open_files())
        if isinstance(error, (ConnectionRefusedError, ConnectionAbortedError)) or (
                isinstance(error, OSError) and error.errno in (errno.EHOSTUNREACH,
                                                               errno.ENETUNREACH)):
            return FetchError("unreachable", f"cannot connect to {where}: "
                              f"{error.strerror or error}", transient=True)
        if isinstance(error, (http.client.LineTooLong, http.client.BadStatusLine,
                              http.client.UnknownProtocol)) or (
                isinstance(error, http.client.HTTPException) and "headers" in str(error)):
            return FetchError("http", f"the server's answer is not HTTP/1.1 "
                              f"({type(error).__name__})", transient=True)
        return FetchError("http", "the connection broke during the answer", transient=True)


def _origin(url: str) -> tuple:
    parts = urlsplit(url)
    return (parts.scheme, parts.hostname, parts.port or (443 if parts.scheme == "https" else 80))


def _proxy_headers(proxy) -> dict:
    """The proxy's login, where its URL has one, as ``Proxy-Authorization``."""
    if proxy[2] is None:
        return {}
    import base64

    return {"Proxy-Authorization": "Basic " + base64.b64encode(proxy[2].encode()).decode()}


def _proxy_for(scheme: str, host: str) -> tuple[str, int, str | None] | None:
    """(host, port, login) of the proxy the environment names for ``scheme`` and ``host``, as curl
    reads it (urllib's reading: ``http_proxy``, ``https_proxy``/``HTTPS_PROXY``,
    ``all_proxy``, ``no_proxy``), or None."""
    from urllib.request import getproxies_environment, proxy_bypass

    proxies = getproxies_environment()
    url = proxies.get(scheme) or proxies.get("all")
    if not url or proxy_bypass(host):      # no_proxy read from the environment
        return None
    parts = urlsplit(url if "://" in url else "http://" + url)
    if parts.scheme != "http" or not parts.hostname:
        return None                     # chosen() keeps obstore for these
    login = None
    if parts.username is not None:
        from urllib.parse import unquote

        login = f"{unquote(parts.username)}:{unquote(parts.password or '')}"
    return parts.hostname, parts.port or 80, login


def proxies_supported() -> bool:
    """Whether every proxy the environment names is one http.client reaches (plain http).
    Read without urllib.request (its imports are not the mount command's to pay): the
    variables urllib reads, in either case."""
    for name, value in os.environ.items():
        if name.lower().endswith("_proxy") and name.lower() != "no_proxy" and value.strip():
            scheme = value.strip().split("://", 1)[0].lower() if "://" in value else "http"
            if scheme != "http":
                return False
    return True
