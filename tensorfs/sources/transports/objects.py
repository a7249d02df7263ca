"""Ranged reads through obstore, shared by the HTTP(S), Hub and cloud transports.

obstore (Rust ``object_store`` and reqwest) receives the body with the GIL released.  What
this module adds to its ``get``:

- **bounded answers**: ``get_exact`` asks for ``[start, end)`` and reads at most about twice
  that before it refuses the answer: ``obstore``'s own ``GetResult.bytes()`` would take a
  ``206`` claiming 64 KiB and sending 1000 MiB whole (so would ``get_range``; obstore does
  not show ``Content-Length``).  The body is taken as the stream's one chunk of at least the
  range's length (``min_chunk_size``): obstore receives it outside Python and hands it over
  as one ``bytes``, made with the GIL held (``bytes()`` read R1 ~30 % faster, unbounded:
  docs/internals/benchmarks.md "Wire speed"); one more step of the stream must then find its end.  A body in a
  ``Content-Encoding`` other than identity is refused (reqwest here does not decode one, so
  its bytes would not be the file's);
- **an off switch**: a request given a ``Cancel`` (the daemon's block fetches) runs through
  obstore's async API on one event loop thread, so that cancelling it drops the request in
  flight and its connection closes (the blocking call cannot be ended from another thread);
- **no retries of its own** (``max_retries`` 0): ``tensorfs.sources.remote`` retries, within the
  read's deadline, and each request is bounded by the store's ``timeout`` (``--timeout``);
- **one classification** of obstore's errors into ``FetchError``, from the exception class
  and the status or error kind obstore reports; obstore's own text (which holds the URL
  requested, a signed query with it) is never shown.
"""

from __future__ import annotations

import concurrent.futures
import errno
import json
import os
import pickle
import re
import stat
import struct
import subprocess
import sys
import threading
from concurrent.futures import Future, ThreadPoolExecutor

from tensorfs.sources.transports.base import (
    FetchError,
    Pin,
    check_answer,
    exact,
    missing_extra,
    status_error,
)


def obstore(url: str):
    try:
        import obstore as module  # the remote extra: checked when first needed
    except ImportError:
        raise missing_extra("obstore", url) from None
    return module


def client_options(settings, *, allow_http: bool, headers: dict | None = None,
                   extra: dict | None = None) -> dict:
    """obstore's ClientConfig for a mount: ``--timeout`` bounds each request (connect and
    body included); plain ``http://`` only where the URL the user named is plain http, so
    that an ``https://`` URL never follows a redirect to ``http://`` (reqwest's
    https_only)."""
    timeout = f"{max(1, int(round(settings.timeout * 1000)))}ms"
    options = {"timeout": timeout, "connect_timeout": timeout, "allow_http": allow_http,
               "pool_idle_timeout": "30s"}
    if headers:
        options["default_headers"] = {str(k): str(v) for k, v in headers.items()}
    for key, value in (extra or {}).items():
        if key in ("allow_http", "timeout", "connect_timeout"):
            continue                    # tensorfs's rules, not an option
        options[key] = value
    return options


NO_RETRIES = {"max_retries": 0}

# python3 -m http.server answers every GET with the whole file: what does answer a range
# (each one tried: nginx in the tests, npx http-server 14 by hand)
NO_RANGE = ("the server ignores Range requests (it answered the whole file, as python3 -m "
            "http.server does): tensorfs reads only byte ranges: serve the file with a server "
            "that answers them, such as nginx or npx http-server")


# -- where obstore runs ---------------------------------------------------------------------
#
# obstore's tokio runtime is one per process and its threads do not survive a fork: a process
# that used it and forks leaves a child whose every request hangs.  So until a process says it
# serves (``serve_here``: a background mount's daemon, which forks first and reads the headers
# itself, cli.cmd_mount; RemoteSource.start), obstore runs in a helper process started fresh
# (``_Helper``), never in this one: a foreground mount, inspect, hash.  The helper is used for
# the headers only
# (at most header + 1 MiB per file); the tensors' bytes are received in the daemon itself.

_direct = False
_helper = None
_helper_lock = threading.Lock()
LENGTH = struct.Struct("<Q")
# what the helper may be asked to run
HELPER_CALLS = {"get_exact": "_get_exact", "head": "_head", "listing": "_listing",
                "check_spec": "_check_spec"}


_specs_made: list = []              # the stores this process named (store_spec), in order


def serve_here() -> None:
    """This process (the daemon, or a program that never forks) runs obstore itself.  The
    stores the headers were read through are made again here at once, in a thread: obstore's
    runtime and a store (the system's CA certificates read) cost ~15-30 ms, which a mount's
    first read would otherwise wait for; this overlaps them with the kernel mount."""
    global _direct
    _direct = True
    if _specs_made:
        specs = list(_specs_made)
        threading.Thread(target=_make_stores, args=(specs,), name="tensorfs-stores",
                         daemon=True).start()


def _make_stores(specs: list) -> None:
    import asyncio  # noqa: F401  (the cancellable requests' loops, warmed here: ~30 ms)

    for spec in specs:
        try:
            _store(spec)
        except Exception:
            pass


def start_helper() -> None:
    """Start the helper now, if this process will need one, without waiting for it: its
    interpreter and obstore start while this process imports and checks what it must (the
    mount command calls this first thing for a URL)."""
    global _helper
    if _direct:
        return
    with _helper_lock:
        if _helper is None or not _helper.alive:
            _helper = _Helper()


def _run(fn, *args, timeout: float, **kwargs):
    if _direct:
        return fn(*args, **kwargs)
    with _helper_lock:
        global _helper
        if _helper is None or not _helper.alive:
            _helper = _Helper()
        helper = _helper
    name = next(k for k, v in HELPER_CALLS.items() if v == fn.__name__)
    return helper.call(name, args, kwargs, timeout + 5)     # its start, then obstore's bound


class _Helper:
    """``python -m tensorfs.sources.transports.helper``, started fresh (never forked from here, so
    obstore's runtime is its own); requests and answers are length-prefixed pickles on its
    stdin and stdout.  A fork of this process closes its copies of the pipes, so that the
    helper ends (stdin closed) when this process does, not when the daemon does."""

    def __init__(self):
        self.proc = subprocess.Popen([sys.executable, "-m", "tensorfs.sources.transports.helper"],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.DEVNULL, close_fds=True)
        self.pid = os.getpid()
        self.alive = True
        self._lock = threading.Lock()
        self._waiting: dict[int, Future] = {}
        self._next = 0
        os.register_at_fork(after_in_child=self._forget)
        threading.Thread(target=self._answers, name="tensorfs-helper", daemon=True).start()

    def _forget(self) -> None:
        if self.pid != os.getpid() and self.alive:
            self.alive = False
            for stream in (self.proc.stdin, self.proc.stdout):
                try:
                    os.close(stream.fileno())
                except OSError:
                    pass

    def call(self, name: str, args, kwargs, timeout: float):
        future: Future = Future()
        with self._lock:
            self._next += 1
            request_id = self._next
            self._waiting[request_id] = future
            try:
                write_message(self.proc.stdin, (request_id, name, args, kwargs))
            except (OSError, ValueError):
                self._waiting.pop(request_id, None)
                self.alive = False
                raise FetchError("unreachable", "the request helper process ended") from None
        try:
            ok, value = future.result(timeout=timeout)
        except TimeoutError:
            raise FetchError("timeout", f"no answer within {timeout - 5:g} s",
                             transient=True) from None
        finally:
            with self._lock:
                self._waiting.pop(request_id, None)
        if ok:
            return value
        raise value

    def _answers(self) -> None:
        try:
            while True:
                message = read_message(self.proc.stdout)
                if message is None:
                    break
                request_id, ok, value = message
                with self._lock:
                    future = self._waiting.get(request_id)
                if future is not None and not future.done():
                    future.set_result((ok, value))
        except (OSError, ValueError, EOFError):
            pass
        self.alive = False
        with self._lock:
            waiting = list(self._waiting.values())
        for future in waiting:
            if not future.done():
                future.set_result((False, FetchError("unreachable", "the request helper "
                                                     "process ended")))


def read_message(stream):
    """One pickled message from ``stream``, or None at its end."""
    head = stream.read(LENGTH.size)
    if len(head) < LENGTH.size:
        return None
    (n,) = LENGTH.unpack(head)
    body = stream.read(n)
    if len(body) < n:
        return None
    return pickle.loads(body)


def write_message(stream, message) -> None:
    body = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    stream.write(LENGTH.pack(len(body)) + body)
    stream.flush()


def helper_main() -> None:
    """The helper's loop: each request in a thread of its own pool, answered when done."""
    serve_here()
    try:
        import obstore.store  # noqa: F401  (now: the first request should not wait for it)
    except ImportError:
        pass                        # said by the first request (missing_extra)
    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    lock = threading.Lock()

    def answer(request_id, name, args, kwargs):
        try:
            value = (request_id, True, globals()[HELPER_CALLS[name]](*args, **kwargs))
        except BaseException as error:      # any exception: handed back to the caller
            value = (request_id, False, error)
        with lock:
            try:
                write_message(stdout, value)
            except Exception:               # any exception: an answer that does not pickle
                write_message(stdout, (request_id, False,
                                       FetchError("http", without_urls(str(value[2])))))

    with ThreadPoolExecutor(16) as pool:
        while True:
            request = read_message(stdin)
            if request is None:
                break
            pool.submit(answer, *request)


_stores: dict = {}


def _store(spec: tuple):
    """The store ``spec`` names, made once per process."""
    store = _stores.get(spec)
    if store is None:
        import obstore.store  # the remote extra: a URL's mount only

        kind, first, kwargs = spec
        store = _stores[spec] = getattr(obstore.store, kind)(first, **json.loads(kwargs))
    return store


def store_spec(kind: str, first, **kwargs) -> tuple:
    """A hashable, picklable name of a store: (class name, first argument, keywords as
    JSON); ``_store`` makes the store in the process that uses it.  The store is made once
    here, so that a bad option is one line at mount."""
    spec = (kind, first, json.dumps({k: v for k, v in kwargs.items() if v is not None},
                                    sort_keys=True))
    _run(_check_spec, spec, timeout=30)
    if spec not in _specs_made:
        _specs_made.append(spec)
    return spec


def _check_spec(spec: tuple) -> None:
    _store(spec)


def get_exact(spec: tuple, path: str, start: int, end: int, *, timeout: float, **kwargs):
    """(body, meta) of ``[start, end)`` of ``path`` in the store ``spec`` names (``end``
    past the object's end: up to its end, when ``probe``).  ``body`` is ``bytes`` of exactly
    the range's length.  Keywords: ``if_match``, ``version``, ``hint_401``, ``probe``,
    ``where``, ``cancel`` (a ``tensorfs.sources.transports.base.Cancel``: in this process
    only, not through the helper)."""
    if not _direct:
        kwargs.pop("cancel", None)
    return _run(_get_exact, spec, path, start, end, timeout=timeout, **kwargs)


_loop = None
_loop_pid = 0


def _event_loop():
    """The event loop thread of the requests that may be cancelled: one per process (made
    again after a fork), so that they cost two sockets (its wake-up pair), not two per
    fetch thread."""
    import asyncio  # in the daemon only, and warmed there (_make_stores): ~30 ms

    global _loop, _loop_pid
    with _helper_lock:
        if _loop is None or _loop_pid != os.getpid():
            loop = asyncio.new_event_loop()
            threading.Thread(target=loop.run_forever, name="tensorfs-requests",
                             daemon=True).start()
            _loop, _loop_pid = loop, os.getpid()
        return _loop


def _timeout_text(spec: tuple) -> str:
    """"no answer within N s", N the store's own bound (its client ``timeout``)."""
    value = str((json.loads(spec[2]).get("client_options") or {}).get("timeout", ""))
    if value.endswith("ms") and value[:-2].isdigit():
        return f"no answer within {int(value[:-2]) / 1000:g} s"
    return "no answer in time"


def head(spec: tuple, path: str, *, timeout: float, hint_401: str = "", where: str = "") -> dict:
    return _run(_head, spec, path, hint_401, where, timeout=timeout)


def listing(spec: tuple, prefix: str, *, timeout: float, where: str = "") -> dict:
    """obstore's ``list_with_delimiter``: {"common_prefixes": [...], "objects": [meta]}."""
    return _run(_listing, spec, prefix, where, timeout=timeout)


def _get_exact(spec, path, start, end, *, if_match=None, version=None, hint_401="", probe=False,
               where="", cancel=None):
    import obstore as obs  # the remote extra: a URL's mount only

    options: dict = {"range": (start, end)}
    if if_match:
        options["if_match"] = if_match
    if version:
        options["version"] = version
    try:
        if cancel is not None:
            import asyncio  # imported already (_event_loop)

            running = asyncio.run_coroutine_threadsafe(
                _get_cancellable(spec, path, start, end, options, probe), _event_loop())
            cancel.on_cancel(running.cancel)
            try:
                return running.result()
            except concurrent.futures.CancelledError:
                raise FetchError("cancelled", "no one waits for it any more") from None
        result = obs.get(_store(spec), path, options=options)
        want = _range_checked(result, start, end, probe)
        if want == 0:
            return b"", result.meta
        stream = result.stream(min_chunk_size=want)
        body = next(stream, b"")
        if len(body) == want and next(stream, None) is not None:
            body = body + b"?"              # more than asked: refused below
        return exact(body, start, start + want), result.meta
    except FetchError:
        raise
    except Exception as error:          # any exception: classified, or raised as it is
        raise classify(error, hint_401, where, _timeout_text(spec)) from None


async def _get_cancellable(spec, path, start, end, options, probe):
    """``_get_exact``'s request through obstore's async API: a cancelled task drops it, and
    once nothing here holds the answer's stream, obstore drops its connection."""
    import obstore as obs  # the remote extra: a URL's mount only

    result = stream = None
    try:
        result = await obs.get_async(_store(spec), path, options=options)
        want = _range_checked(result, start, end, probe)
        if want == 0:
            return b"", result.meta
        # one step: a chunk of at least want + 1 bytes unless the body ends first, so a
        # body longer than asked comes back longer (refused by exact), bounded all the same
        stream = result.stream(min_chunk_size=want + 1)
        body = await anext(stream, b"")
        return exact(body, start, start + want), result.meta
    finally:
        result = stream = None          # a cancelled task's frame is kept: let go of them


def modified_of(meta: dict) -> float | None:
    """An answer's Last-Modified in seconds, or None where the server sent none (obstore
    puts the epoch there then)."""
    value = meta.get("last_modified")
    seconds = value.timestamp() if value is not None else 0.0
    return seconds or None


def check_meta(pin: Pin, meta: dict, version: str | None = None) -> None:
    """``check_answer`` for one of obstore's answers: its Content-Range total (obstore's
    ``size`` of a ranged answer), ETag and Last-Modified; ``version``: the object version
    the answer names, where the store has them."""
    size = meta.get("size")
    check_answer(pin, size=size if type(size) is int else None, etag=meta.get("e_tag"),
                 modified=modified_of(meta), version=version)


def _range_checked(result, start: int, end: int, probe: bool) -> int:
    """How many bytes the answer holds, once its range and encoding are the ones asked for."""
    got_start, got_end = result.range
    if got_start != start or got_end > end or (got_end != end and not probe):
        raise FetchError("http", f"an answer for bytes {got_start}-{got_end} to a read of "
                         f"{start}-{end}", transient=True)
    encoding = (result.attributes.get("Content-Encoding") or "").strip().lower()
    if encoding not in ("", "identity"):
        raise FetchError("encoding", f"the server sent the bytes encoded ({encoding}) "
                         f"although asked for them as they are (Accept-Encoding: identity)")
    return got_end - got_start


def _head(spec, path, hint_401, where) -> dict:
    import obstore as obs  # the remote extra: a URL's mount only

    try:
        return obs.head(_store(spec), path)
    except Exception as error:          # any exception: classified, as above
        raise classify(error, hint_401, where, _timeout_text(spec)) from None


def _listing(spec, prefix, where) -> dict:
    import obstore as obs  # the remote extra: a URL's mount only

    try:
        return obs.list_with_delimiter(_store(spec), prefix or None)
    except Exception as error:          # any exception: classified, as above
        raise classify(error, "", where, _timeout_text(spec)) from None


_STATUS = re.compile(r"status code: (\d{3})")
_OS_MESSAGE = re.compile(r'message: "([^"]*)"')
_DNS_MESSAGE = re.compile(r'"dns error",\s*Custom\s*\{[^}]*?error:\s*"([^"]*)"')


def classify(error: BaseException, hint_401: str = "", where: str = "",
             timeout_text: str = "no answer in time") -> BaseException:
    """The FetchError an obstore error stands for (or ``error`` itself: not obstore's);
    ``where``: the host and port, as a connection error names them."""
    from obstore import exceptions as ox  # the remote extra

    if isinstance(error, FileNotFoundError):       # obstore's NotFound is the builtin one
        return FetchError("not_found", "not found (HTTP 404)", status=404)
    if not isinstance(error, ox.BaseError):
        return error
    text = str(error)
    status = _STATUS.search(text)
    if isinstance(error, ox.NotFoundError):
        return FetchError("not_found", "not found (HTTP 404)", status=404)
    if isinstance(error, ox.UnauthenticatedError):
        return status_error(int(status.group(1)) if status else 401, hint_401)
    if isinstance(error, ox.PermissionDeniedError):
        return status_error(int(status.group(1)) if status else 403, hint_401)
    if isinstance(error, ox.PreconditionError):
        return FetchError("version", "the object changed: it is no longer the version pinned "
                          "at mount (HTTP 412)", status=412)
    if isinstance(error, ox.NotSupportedError) and "Range" in text:
        return FetchError("no_range", NO_RANGE, status=200)
    if status:
        return status_error(int(status.group(1)), hint_401)
    if "Too many open files" in text or "os error 24" in text:
        from tensorfs.sources.local import too_many_open_files  # no server at fault: the limit
        return FetchError("http", too_many_open_files())
    if "kind: Timeout" in text or "TimedOut" in text:
        return FetchError("timeout", timeout_text, transient=True)
    if "InvalidCertificate(" in text:
        return untrusted_certificate(text, where)
    handshake = _TLS_FAILURE.search(re.sub(r"\s+", "", text))
    if handshake:
        to = f" to {where}" if where else ""
        return FetchError("unreachable", f"cannot connect{to}: the TLS handshake failed (rustls: "
                          f"{handshake.group(1)}({handshake.group(2)})): does the server speak "
                          "https on this port?")
    if "kind: Connect" in text:
        why = _OS_MESSAGE.search(text)
        dns = _DNS_MESSAGE.search(text)
        to = f" to {where}" if where else ""
        said = (why.group(1) if why else f"the host name does not resolve ({dns.group(1)})" if dns
                else "no connection")
        return FetchError("unreachable", f"cannot connect{to}: {said}", transient=True)
    if "Requested " in text and ", got " in text:
        return FetchError("http", "the server answered with other bytes than the range asked for "
                          "(its Content-Range)", transient=True)
    if "CONTENT_RANGE" in text or "Content-Range" in text:
        return FetchError("http", "the server's Content-Range is not a valid byte range of the "
                          "file (RFC 9110)")
    if "Content-Length" in text:
        return FetchError("http", "the server's answer has no Content-Length")
    if "redirect" in text.lower() or "URL scheme is not allowed" in text or "builder error" in text:
        return FetchError("http", "the server redirected to a URL tensorfs does not follow "
                          "(an https:// URL is never read over plain http://)")
    if "body" in text.lower() or "Interrupted" in text or "connection" in text.lower():
        return FetchError("http", "the connection broke during the answer", transient=True)
    first = text.split("\n", 1)[0]
    return FetchError("http", without_urls(first), transient=True)


# -- TLS trust ------------------------------------------------------------------------------
#
# reqwest (rustls, rustls-platform-verifier) trusts what rustls-native-certs loads: the files
# SSL_CERT_FILE and SSL_CERT_DIR name where either is set, else the system's store
# (/etc/ssl/certs on Debian); ``root_certificate`` adds to those.  rustls (webpki) is stricter
# than OpenSSL about the server's own certificate: it must be an X.509 v3 end-entity
# certificate (not a CA's: ``openssl req -x509`` marks its certificate CA:TRUE) naming the host
# in its subjectAltName (the CN is not read).

MAX_CERTIFICATE_BYTES = 4 << 20         # a bundle of every public CA is ~200 KiB
TRUST_WAYS = ("--storage-option root_certificate=PATH (the CA's PEM file), SSL_CERT_FILE=PATH "
              "or SSL_CERT_DIR=DIR")


# obstore's client options that take PEM text; tensorfs takes a PEM file's path there too
PEM_OPTIONS = ("root_certificate", "proxy_ca_certificate")


def trusted_roots(options: dict, shown: str) -> dict:
    """``options`` with each of ``PEM_OPTIONS`` as PEM text: the option takes the PEM text
    or, as curl's --cacert and requests' verify do, the path of a PEM file (read here, once,
    by the command: the daemon that makes stores later runs elsewhere)."""
    for key in PEM_OPTIONS:
        value = options.get(key)
        if isinstance(value, str) and "-----BEGIN" not in value:
            options = {**options, key: _pem_file(key, value, shown)}
    return options


def _pem_file(key: str, value: str, shown: str) -> str:
    from tensorfs.errors import ModelError

    path = os.path.expanduser(value)
    try:
        # opened without blocking and checked through the descriptor: a FIFO would wait for a
        # writer, a device could be endless
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
        with open(fd, "rb") as f:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise IsADirectoryError(errno.EINVAL, "not a regular file")
            data = f.read(MAX_CERTIFICATE_BYTES + 1)
    except OSError as error:
        raise ModelError("remote_options", f"{key}={value}: neither PEM text nor a readable "
                         f"file ({error.strerror or error})", file=shown) from None
    if len(data) > MAX_CERTIFICATE_BYTES:
        raise ModelError("remote_options", f"{key}={value}: larger than "
                         f"{MAX_CERTIFICATE_BYTES >> 20} MiB, not a certificate file", file=shown)
    if b"-----BEGIN CERTIFICATE-----" not in data:
        der = (f": a DER file converts with openssl x509 -inform der -in {value} -out CA.pem"
               if data[:1] == b"\x30" else "")
        raise ModelError("remote_options", f"{key}={value}: holds no PEM certificate "
                         f"(-----BEGIN CERTIFICATE-----){der}", file=shown)
    return data.decode("ascii", errors="replace")


_TLS_FAILURE = re.compile(r"(InvalidMessage|AlertReceived|PeerIncompatible|PeerMisbehaved)"
                          r"\((\w+)")
_RUSTLS_REASON = re.compile(r"InvalidCertificate\((?:Other\(OtherError\()?(\w+)")
_PRESENTED = re.compile(r'(DnsName|IpAddress)\(\\*"([^"\\]+)')


def untrusted_certificate(text: str, where: str) -> FetchError:
    """The server's certificate was refused: what rustls says, why in words, and what to do
    (not worth another try)."""
    compact = re.sub(r"\s+", "", text)
    found = _RUSTLS_REASON.search(compact)
    reason = found.group(1) if found else "InvalidCertificate"
    for suffix in ("Context",):
        reason = reason.removesuffix(suffix)
    to = f" to {where}" if where else ""
    verdict = "not trusted" if reason == "UnknownIssuer" else "refused"
    head = f"cannot connect{to}: the server's certificate is {verdict} (rustls: {reason})"
    if reason == "UnknownIssuer":
        why = f"no certificate authority trusted here signed it: trust its CA with {TRUST_WAYS}"
        why += _unreadable_trust_paths()
    elif reason == "CaUsedAsEndEntity":
        why = ("it is a CA certificate serving as the server's own (openssl req -x509 makes one), "
               "which rustls refuses even when trusted: make it with -addext "
               "basicConstraints=critical,CA:FALSE, or make a CA and a server certificate it "
               "signs, then trust that certificate or the CA with root_certificate=PATH "
               "(docs/reference/remote.md)")
    elif reason == "UnsupportedCertVersion":
        why = ("it is an X.509 v1 certificate, which rustls refuses: make a v3 one with a "
               "subjectAltName (docs/reference/remote.md)")
    elif reason == "NotValidForName":
        names = [f"{'DNS' if kind == 'DnsName' else 'IP'}:{name}"
                 for kind, name in _PRESENTED.findall(compact.split("presented:", 1)[-1])]
        why = (f"it is not for {where.rsplit(':', 1)[0] or 'this host'} "
               f"(its subjectAltName: {', '.join(names) if names else 'none'}; rustls does not "
               "read the CN): make one whose subjectAltName names the host")
    elif reason == "Expired":
        why = "it has expired"
    elif reason == "NotValidYet":
        why = "it is not valid yet (is this machine's clock right?)"
    else:
        why = f"trust its CA with {TRUST_WAYS}"
    return FetchError("untrusted", f"{head}: {why}")


def python_tls_problem(error: BaseException) -> str | None:
    """What a certificate refused by Python's ssl (huggingface_hub's HTTP client) means, from
    anywhere in ``error``'s chain, or None.  That client trusts what rustls does
    (``tensorfs.sources.transports.receive.trust_context``)."""
    import ssl

    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if isinstance(error, ssl.SSLCertVerificationError):
            why = error.verify_message or str(error)
            return (f"the server's certificate is not trusted (OpenSSL: {why}): trust its CA "
                    f"with {TRUST_WAYS}, or in the system's store")
        error = error.__cause__ or error.__context__ or (error.args[0] if error.args and
                                                         isinstance(error.args[0], BaseException)
                                                         else None)
    return None


def store_problem(error: BaseException) -> str:
    """What obstore's refusal to make a store (a bad option, no certificates to trust) says,
    in one line without URLs."""
    text = str(error)
    if "No CA certificates were loaded" in text:
        return ("no certificate authority to trust could be loaded" + (_unreadable_trust_paths()
                or " (none in the system's store)") + f": trust one with {TRUST_WAYS}")
    return without_urls(text.split("\n", 1)[0])


def _unreadable_trust_paths() -> str:
    """SSL_CERT_FILE or SSL_CERT_DIR naming nothing readable (rustls-native-certs then loads
    nothing from it, silently)."""
    notes = []
    for name, ok in (("SSL_CERT_FILE", os.path.isfile), ("SSL_CERT_DIR", os.path.isdir)):
        value = os.environ.get(name)
        if value and not (ok(value) and os.access(value, os.R_OK)):
            notes.append(f"{name}={value} cannot be read")
    return f" ({'; '.join(notes)})" if notes else ""


def without_urls(text: str) -> str:
    """obstore's first line with every URL cut to its scheme and host."""
    return re.sub(r"(\w+://[^/\s?#]+)[^\s]*", r"\1/...", text)
