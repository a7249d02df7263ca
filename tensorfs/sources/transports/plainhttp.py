"""A block's bytes over plain ``http://``, received straight into the block's buffer.

obstore receives a body in Rust (a tokio thread per socket wakeup, each handing over to
the waiting Python thread), then pyo3 makes a Python ``bytes`` of it: a new buffer zeroed
and copied into.  For the common case of a mount's reads, a ``206`` from a plain ``http://``
server, this module asks for the range on a kept-alive connection of the fetch thread's own
and reads the body with ``recv_into`` into the block's buffer: one copy (the kernel's), a
third of the context switches (bench/bench_receive.py, docs/copylimit.md).

It serves only what it can serve exactly as obstore would, and hands everything else back
(``None``: the caller asks obstore, which answers or refuses it as ever):

- only ``http://`` stores with no options but tensorfs's own (no headers, no proxy in the
  environment, no credentials in the URL), and paths of plain characters;
- only a ``206`` whose ``Content-Range`` is the range asked for, whose ``Content-Length`` is
  its length (so the body is bounded before a byte of it is read), in no transfer or content
  encoding; any other answer (an error status, a redirect, ``200``, a lie) closes the
  connection unread.
- a connection that breaks is closed and the request handed back; one that stalls past the
  store's ``timeout`` (the whole request, as obstore's) is a timeout, as obstore's would be.
"""

from __future__ import annotations

import ctypes
import os
import re
import socket
import struct
import threading
import time
from urllib.parse import urlsplit

from tensorfs import __version__
from tensorfs.sources.transports.base import FetchError

_OWN_OPTIONS = {"timeout", "connect_timeout", "allow_http", "pool_idle_timeout"}
_PROXIES = ("http_proxy", "HTTP_PROXY", "all_proxy", "ALL_PROXY")
_PLAIN_PATH = re.compile(r"[A-Za-z0-9._~/+=,-]*")
_FRAMING = {"content-length", "content-range", "transfer-encoding", "content-encoding", "etag",
            "connection"}
HEAD_STEP = 16 << 10             # the status line and headers are received in steps of this
MAX_HEAD = 64 << 10             # and refused past this

USER_AGENT = f"tensorfs/{__version__}"

_local = threading.local()


def usable(url: str, options: dict, path: str) -> bool:
    """Whether a request of ``path`` in the store of ``url`` with client ``options`` may be
    served here (else obstore serves it)."""
    if set(options) - _OWN_OPTIONS or any(os.environ.get(name) for name in _PROXIES):
        return False
    parts = urlsplit(url)
    return (parts.scheme == "http" and "@" not in parts.netloc and parts.path in ("", "/")
            and not parts.query and not parts.fragment and parts.hostname is not None
            and _PLAIN_PATH.fullmatch(path) is not None and "//" not in path
            and not path.startswith("/"))


def get_range(url: str, path: str, start: int, end: int, timeout: float,
              timeout_text: str, if_match: str | None = None):
    """(body, meta) of ``[start, end)`` (``0 <= start < end``): body a ``bytearray`` of
    exactly that length, meta ``{"e_tag": the ETag or None}``; None where the answer is not
    a plain ``206`` of that range (its body not read); ``FetchError`` (timeout) when the
    server stalls past ``timeout`` s (the whole request)."""
    parts = urlsplit(url)
    key = (parts.hostname, parts.port or 80)
    conns = _local.__dict__.setdefault("conns", {})
    deadline = time.monotonic() + timeout
    for reused in (True, False):
        sock = conns.pop(key, None) if reused else None
        if reused and sock is None:
            continue
        try:
            if sock is None:
                sock = socket.create_connection(key, timeout=timeout)
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                sock.settimeout(None)       # blocking: the kernel's own timeouts (_bound)
            answer = _ask(sock, reused, parts.netloc, path, start, end, if_match, deadline)
        except (TimeoutError, BlockingIOError):    # connect, or SO_RCVTIMEO/SO_SNDTIMEO
            _close(sock)
            raise FetchError("timeout", timeout_text, transient=True) from None
        except _Stale:
            _close(sock)        # the server closed a kept connection while it was idle:
            continue            # once more on a new one
        except (OSError, ValueError):
            _close(sock)
            return None
        if answer is None:
            _close(sock)
            return None
        body, etag, keep = answer
        if keep:
            conns[key] = sock
        else:
            _close(sock)
        return body, {"e_tag": etag}
    return None


class _Stale(Exception):
    """A kept connection gave no answer (the server closed it while it was idle)."""


def _close(sock) -> None:
    if sock is not None:
        try:
            sock.close()
        except OSError:
            pass


_TIMEVAL = struct.Struct("@ll")


def _bound(sock: socket.socket, deadline: float) -> None:
    """The next send or receive ends by ``deadline`` (EAGAIN: a timeout).  The socket
    blocks: a body is received by one ``recv_into`` (MSG_WAITALL), the GIL released once,
    not once per segment as with Python's own timeouts (poll, then a partial receive)."""
    left = deadline - time.monotonic()
    if left <= 0:
        raise TimeoutError()
    value = _TIMEVAL.pack(int(left), max(1, int(left % 1 * 1e6)))
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, value)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, value)


def _unfilled(size: int) -> bytearray:
    """A new ``bytearray`` of ``size`` bytes not zeroed first (CPython's
    ``PyByteArray_FromStringAndSize(NULL, size)``): every byte is received into it before
    anyone reads it, or it is dropped."""
    return _new_bytearray(None, size)


_new_bytearray = ctypes.pythonapi.PyByteArray_FromStringAndSize
_new_bytearray.argtypes = [ctypes.c_void_p, ctypes.c_ssize_t]
_new_bytearray.restype = ctypes.py_object


def _quick_ack(sock: socket.socket) -> None:
    """ACK what arrives at once (Linux; it lasts until the stack's next choice, so it is set
    before each receive).  A connection of request then answer is taken for an interactive
    one, whose ACKs wait up to 40 ms for data to ride on: a server whose window is full then
    waits for them (6 reads in 200 took 40-70 ms, 16 connections on loopback)."""
    if _QUICKACK is not None:
        sock.setsockopt(socket.IPPROTO_TCP, _QUICKACK, 1)


_QUICKACK = getattr(socket, "TCP_QUICKACK", None)      # Linux only


def _ask(sock: socket.socket, reused: bool, host: str, path: str, start: int, end: int,
         if_match: str | None, deadline: float):
    request = (f"GET /{path} HTTP/1.1\r\nHost: {host}\r\nRange: bytes={start}-{end - 1}\r\n"
               f"Accept-Encoding: identity\r\nUser-Agent: {USER_AGENT}\r\n")
    if if_match:
        request += f"If-Match: {if_match}\r\n"
    _bound(sock, deadline)
    head = bytearray()
    step = bytearray(HEAD_STEP)
    try:
        sock.sendall((request + "\r\n").encode("latin-1"))
        while True:
            _quick_ack(sock)
            n = sock.recv_into(step)
            if n == 0:
                raise ConnectionResetError("closed before an answer")
            head += memoryview(step)[:n]
            stop = head.find(b"\r\n\r\n")
            if stop >= 0:
                break
            if len(head) > MAX_HEAD:
                return None
            _bound(sock, deadline)
    except (ConnectionError, BrokenPipeError):
        if reused and not head:
            raise _Stale() from None
        raise
    lines = bytes(head[:stop]).split(b"\r\n")
    words = lines[0].split(None, 2)
    if len(words) < 2 or not words[0].startswith(b"HTTP/1.") or words[1] != b"206":
        return None
    headers: dict[str, str] = {}
    for line in lines[1:]:
        name, colon, value = line.decode("latin-1").partition(":")
        name = name.strip().lower()
        if not colon or (name in headers and name in _FRAMING):   # told twice: not plain
            return None
        headers[name] = value.strip()
    want = end - start
    range_ = headers.get("content-range", "")
    if (headers.get("content-length") != str(want) or "transfer-encoding" in headers
            or headers.get("content-encoding", "identity").lower() != "identity"
            or not range_.startswith(f"bytes {start}-{end - 1}/")):
        return None
    early = memoryview(head)[stop + 4:]
    if len(early) > want:
        return None                     # more than it said it would send
    body = _unfilled(want)
    view = memoryview(body)
    view[:len(early)] = early
    got = len(early)
    while got < want:
        _bound(sock, deadline)
        _quick_ack(sock)
        n = sock.recv_into(view[got:], want - got, socket.MSG_WAITALL)
        if n == 0:
            raise ConnectionResetError("the connection broke during the answer")
        got += n
    view.release()
    keep = (headers.get("connection", "").lower() != "close" and words[0] != b"HTTP/1.0")
    return body, headers.get("etag"), keep
