"""Block reads over plain http:// received by tensorfs itself (tensorfs.sources.transports.plainhttp,
docs/remote.md): a mount's reads are its own requests on kept connections, byte for byte the
file's, whatever the server does with the connection; every answer that is not a plain 206
of the range asked for is handed back to obstore unread, and a stall is a timeout."""

from __future__ import annotations

import asyncio
import gzip
import importlib.util

import numpy as np
import pytest
from safetensors.numpy import save_file

from tests.support.servers import parse_range

pytestmark = pytest.mark.skipif(importlib.util.find_spec("obstore") is None,
                                reason="the remote extra is not installed")

MiB = 1 << 20


def _model(tmp_path) -> bytes:
    rng = np.random.default_rng(37)
    path = tmp_path / "m.safetensors"
    save_file({"w": rng.standard_normal(3 * MiB).astype(np.float32),      # 12 MiB: 3 blocks
               "b": np.arange(7, dtype=np.float32)}, str(path))
    return path.read_bytes()


def _ranged(data: bytes, connection: str = "kept"):
    """Honest 206 answers to ranged GETs of ``data``; ``connection``: kept open, closed
    after each answer saying so (``Connection: close``), or closed without a word."""
    async def answer(method, path, headers):
        start, last = parse_range(headers["range"])
        last = min(len(data) - 1, len(data) - 1 if last is None else last)
        body = data[start:last + 1]
        said = "Connection: close\r\n" if connection == "close" else ""
        yield (f"HTTP/1.1 206 Partial Content\r\nContent-Range: bytes {start}-{last}/{len(data)}"
               f"\r\nContent-Length: {len(body)}\r\nETag: \"v1\"\r\n{said}\r\n").encode() + body
        if connection != "kept":
            raise ConnectionResetError      # the server ends the connection (tests/support/hostile)
    return answer


@pytest.mark.parametrize("connection", ["kept", "close", "stale"])
def test_a_mounts_reads_over_plain_http_are_its_own_and_exact(connection, tmp_path, hostile,
                                                               rmount):
    data = _model(tmp_path)
    server = hostile(_ranged(data, connection))
    mnt = rmount(f"{server.url}/m.safetensors")
    assert (mnt / "files" / "m.safetensors").read_bytes() == data
    agents = [headers.get("user-agent") for _, _, headers in server.requests]
    # the header is read by the mount command (obstore, in its helper); the blocks by the
    # daemon, each on a connection of its own fetch thread, kept where the server keeps it
    # and made again where the server closed it (a word said or not), never handed to obstore
    assert agents[1:] and all(agent.startswith("tensorfs/") for agent in agents[1:]), agents


def _not_plain(kind: str, data: bytes):
    async def answer(method, path, headers):
        start, last = parse_range(headers["range"])
        body = data[start:last + 1]
        head = f"Content-Range: bytes {start}-{last}/{len(data)}\r\n"
        if kind == "whole":         # Range ignored
            yield f"HTTP/1.1 200 OK\r\nContent-Length: {len(data)}\r\n\r\n".encode() + data
        elif kind == "long":        # a 206 for the range with 1000 MiB behind it
            yield f"HTTP/1.1 206 Partial Content\r\n{head}Content-Length: {1000 * MiB}\r\n\r\n".encode()
            for _ in range(1000 * 16):
                yield b"\0" * (64 << 10)
        elif kind == "chunked":
            yield (f"HTTP/1.1 206 Partial Content\r\n{head}Transfer-Encoding: chunked\r\n\r\n"
                   f"{len(body):x}\r\n").encode() + body + b"\r\n0\r\n\r\n"
        elif kind == "gzip":
            packed = gzip.compress(body)
            yield (f"HTTP/1.1 206 Partial Content\r\n{head}Content-Encoding: gzip\r\n"
                   f"Content-Length: {len(packed)}\r\n\r\n").encode() + packed
        elif kind == "other-range":
            yield (f"HTTP/1.1 206 Partial Content\r\nContent-Range: bytes {start + 1}-{last + 1}/"
                   f"{len(data)}\r\nContent-Length: {len(body)}\r\n\r\n").encode() + body
        elif kind == "two-lengths":
            yield (f"HTTP/1.1 206 Partial Content\r\n{head}Content-Length: {len(body)}\r\n"
                   f"Content-Length: {len(body) + 10}\r\n\r\n").encode() + body
        elif kind in ("404", "412", "302"):
            where = "Location: http://127.0.0.1:9/elsewhere\r\n" if kind == "302" else ""
            yield f"HTTP/1.1 {kind} No\r\n{where}Content-Length: 0\r\n\r\n".encode()
        elif kind == "not-http":
            yield b"SSH-2.0-OpenSSH_9.2\r\n" + b"\0" * MiB
    return answer


@pytest.mark.parametrize("kind", ["whole", "long", "chunked", "gzip", "other-range",
                                  "two-lengths", "404", "412", "302", "not-http"])
def test_an_answer_that_is_not_a_plain_206_of_the_range_is_handed_back_unread(kind, hostile):
    from tensorfs.sources.transports import plainhttp

    data = bytes(range(256)) * (16 * 1024)              # 4 MiB
    server = hostile(_not_plain(kind, data))
    assert plainhttp.get_range(server.url + "/", "m.bin", 4096, 4096 + MiB, 10, "late") is None
    assert server.sent < 64 * MiB, server.sent          # the body was not taken


@pytest.mark.parametrize("how", ["stalls", "drips"])
def test_an_answer_that_stalls_or_drips_past_the_timeout_is_a_timeout(how, hostile):
    """The timeout bounds the whole request, as obstore's does: a body dripping a byte at a
    time is a timeout too, not a read that never ends."""
    from tensorfs.sources.transports import plainhttp
    from tensorfs.sources.transports.base import FetchError

    async def slow(method, path, headers):
        yield (b"HTTP/1.1 206 Partial Content\r\nContent-Range: bytes 0-99/100\r\n"
               b"Content-Length: 100\r\n\r\n" + b"x" * 10)
        for _ in range(60):                 # ends once the client is gone (a write fails)
            await asyncio.sleep(0.05)
            yield b"y" if how == "drips" else b""

    server = hostile(slow)
    with pytest.raises(FetchError) as caught:
        plainhttp.get_range(server.url + "/", "m.bin", 0, 100, 1.0, "no answer within 1 s")
    assert caught.value.kind == "timeout" and caught.value.transient
    assert caught.value.message == "no answer within 1 s"


@pytest.mark.parametrize("url, options, path, usable", [
    ("http://127.0.0.1:8/", {"timeout": "5000ms", "allow_http": True}, "m/a-1.safetensors", True),
    ("https://127.0.0.1:8/", {"timeout": "5000ms"}, "m.safetensors", False),
    ("http://u:p@127.0.0.1:8/", {"timeout": "5000ms"}, "m.safetensors", False),
    ("http://127.0.0.1:8/", {"timeout": "5000ms", "default_headers": {"A": "b"}}, "m", False),
    ("http://127.0.0.1:8/", {"timeout": "5000ms"}, "a b.safetensors", False),
    ("http://127.0.0.1:8/", {"timeout": "5000ms"}, "a%20b", False),
    ("http://127.0.0.1:8/x/", {"timeout": "5000ms"}, "m.safetensors", False),
    ("http://127.0.0.1:8/", {"timeout": "5000ms"}, "/m.safetensors", False),
    ("http://127.0.0.1:8/", {"timeout": "5000ms"}, "a//m.safetensors", False),
])
def test_only_plain_stores_are_asked_directly(url, options, path, usable, monkeypatch):
    from tensorfs.sources.transports import plainhttp

    for name in ("http_proxy", "HTTP_PROXY", "all_proxy", "ALL_PROXY"):
        monkeypatch.delenv(name, raising=False)
    assert plainhttp.usable(url, options, path) is usable
    monkeypatch.setenv("HTTP_PROXY", "http://127.0.0.1:3128")     # reqwest would use it
    assert plainhttp.usable(url, options, path) is False


def test_a_file_whose_answer_was_handed_back_is_read_by_obstore_from_then_on(tmp_path, hostile,
                                                                             rmount):
    """A URL that redirects: its first block read is handed back to obstore (which follows
    the redirect), and its later ones go to obstore at once, not two requests each."""
    data = _model(tmp_path)
    honest = _ranged(data)

    async def answer(method, path, headers):
        if path == "/m.safetensors":
            yield b"HTTP/1.1 302 Found\r\nLocation: /real/m.safetensors\r\nContent-Length: 0\r\n\r\n"
            return
        async for chunk in honest(method, path, headers):
            yield chunk

    server = hostile(answer)
    mnt = rmount(f"{server.url}/m.safetensors")
    assert (mnt / "files" / "m.safetensors").read_bytes() == data
    ours = [path for path, agent in ((p, h.get("user-agent", "")) for _, p, h in server.requests)
            if agent.startswith("tensorfs/")]
    assert len(ours) == 1 and ours[0] == "/m.safetensors", ours
