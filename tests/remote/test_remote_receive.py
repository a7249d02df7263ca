"""The two receivers of a mount's http(s) reads (docs/internals/receive.md):
``http.client`` into reused buffers (``tensorfs.sources.transports.receive``) and obstore,
chosen by ``TENSORFS_HTTP_TRANSPORT``.  Each is held to the same answers, at read time (the
probe at mount is obstore's either way): the bytes right; an answer that is not the range
asked for (shorter, a 200 for the whole file, another file's size) refused with EIO and the
daemon alive; a relative redirect followed, a redirect loop refused, a login never sent to
another origin; a plain proxy named by ``http_proxy`` used and ``no_proxy`` obeyed; and the
daemon's connections bounded by its fetch threads however many readers."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from tests.support.processes import alive, daemon_pid, read_errno
from tests.support.remote_checks import doc_of

MiB = 1 << 20
ENV = "TENSORFS_HTTP_TRANSPORT"
TRANSPORTS = ["http.client", "obstore"]


def _range(headers: dict) -> tuple[int, int]:
    first, _, last = headers["range"].removeprefix("bytes=").partition("-")
    return int(first), int(last)


def _honest(data: bytes, start: int, last: int, etag: str = '"e1"', total: int | None = None,
            extra: str = "") -> bytes:
    last = min(last, len(data) - 1)
    body = data[start:last + 1]
    return (f"HTTP/1.1 206 Partial Content\r\nContent-Range: bytes {start}-{last}/"
            f"{len(data) if total is None else total}\r\nETag: {etag}\r\n{extra}"
            f"Content-Length: {len(body)}\r\n\r\n").encode() + body


def _serving(data: bytes, lie=None):
    """Ranged answers of ``data``; every answer after the first (the probe) made by
    ``lie(path, start, last)`` where it returns bytes."""
    state = {"n": 0}

    async def answer(method, path, headers):
        state["n"] += 1
        start, last = _range(headers)
        told = lie(path, start, last) if lie is not None and state["n"] > 1 else None
        yield told if told is not None else _honest(data, start, last)
    return answer


@pytest.fixture(scope="module")
def data(corpus) -> bytes:
    return corpus.models["big"].local.read_bytes()


def _big(mnt: Path) -> Path:
    return mnt / doc_of(mnt)["tensors"]["b.big"]["path"]


def _expected(data: bytes) -> bytes:
    import safetensors.numpy

    return safetensors.numpy.load(data)["b.big"].tobytes()


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_reads_are_received_by_the_transport_chosen(transport, data, hostile, rmount):
    server = hostile(_serving(data))
    mnt = rmount(f"{server.url}/m.safetensors", env={ENV: transport})
    assert _big(mnt).read_bytes() == _expected(data)
    agents = {h.get("user-agent") for _, _, h in server.requests[1:]}
    assert (agents == {"tensorfs"}) == (transport == "http.client"), agents
    assert all(h.get("accept-encoding") == "identity" for _, _, h in server.requests[1:]
               if transport == "http.client")


def test_a_transport_that_is_not_one_is_one_line(data, hostile, remote_env, tmp_path):
    from tests.support import run_tensorfs
    from tests.support.hostile import _one_line

    server = hostile(_serving(data))
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    result = run_tensorfs("mount", f"{server.url}/m.safetensors", mnt,
                          env={**remote_env, ENV: "curl"})
    if result.returncode == 0:          # not refused: not left mounted
        run_tensorfs("unmount", mnt)
    line = _one_line(result)
    assert f"{ENV}=curl" in line and "http.client" in line and "obstore" in line, line


def _short(data, start, last):        # says the range's length, sends half, closes
    whole = _honest(data, start, last)
    return whole[:len(whole) - (last - start + 1) // 2]


def _whole_file(data, start, last):   # a 200: the server ignores ranges
    return (f"HTTP/1.1 200 OK\r\nContent-Length: {len(data)}\r\n\r\n").encode() + data


def _other_size(data, start, last):   # the file is another size now
    return _honest(data, start, last, total=len(data) + 1)


LIES = {"short": _short, "whole-file": _whole_file, "other-size": _other_size}


@pytest.mark.parametrize("transport", TRANSPORTS)
@pytest.mark.parametrize("kind", sorted(LIES))
def test_an_answer_that_is_not_the_range_is_eio(kind, transport, data, hostile, rmount):
    lie = LIES[kind]
    server = hostile(_serving(data, lambda path, start, last: lie(data, start, last)))
    mnt = rmount(f"{server.url}/m.safetensors", "--timeout", "5", env={ENV: transport})
    assert read_errno(_big(mnt)) == 5
    assert server.sent < 100 * MiB, server.sent
    assert alive(daemon_pid(mnt))


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_a_chunked_answer_of_the_range_is_read_or_refused(transport, data, hostile, rmount):
    def chunked(path, start, last):
        body = data[start:last + 1]
        half = len(body) // 2
        return (f"HTTP/1.1 206 Partial Content\r\nContent-Range: bytes {start}-{last}/{len(data)}"
                f"\r\nETag: \"e1\"\r\nTransfer-Encoding: chunked\r\n\r\n").encode() + b"".join(
            b"%x\r\n%s\r\n" % (len(part), part) for part in (body[:half], body[half:]) if part
        ) + b"0\r\n\r\n"
    server = hostile(_serving(data, chunked))
    mnt = rmount(f"{server.url}/m.safetensors", "--timeout", "5", env={ENV: transport})
    if transport == "http.client":      # http.client reads a chunked body, bounded
        assert _big(mnt).read_bytes() == _expected(data)
    else:                               # obstore wants a Content-Length: refused
        assert read_errno(_big(mnt)) == 5
        assert alive(daemon_pid(mnt))


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_a_trickling_answer_ends_within_the_timeout(transport, data, hostile, rmount):
    """A byte every 0.1 s never lets one receive wait out a socket timeout: the request's
    own deadline ends it (EIO within --timeout and the retries' pauses), the daemon alive."""
    import asyncio
    import time

    state = {"n": 0}

    async def answer(method, path, headers):
        state["n"] += 1
        start, last = _range(headers)
        if state["n"] == 1:
            yield _honest(data, start, last)
            return
        whole = _honest(data, start, last)
        head = whole[:whole.index(b"\r\n\r\n") + 4]
        yield head
        for i in range(80):             # 8 s of it, then the connection closes
            await asyncio.sleep(0.1)
            yield whole[len(head) + i:len(head) + i + 1]
    server = hostile(answer)
    mnt = rmount(f"{server.url}/m.safetensors", "--timeout", "3", env={ENV: transport})
    t0 = time.monotonic()
    assert read_errno(_big(mnt)) == 5
    assert time.monotonic() - t0 < 15
    assert alive(daemon_pid(mnt))


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_a_relative_redirect_is_followed_and_a_loop_refused(transport, data, hostile, rmount):
    def redirect(path, start, last):
        if path.startswith("/real/"):
            return None                 # the honest answer
        to = {"/m.safetensors": "/real/m.safetensors", "/loop/a": "/loop/b",
              "/loop/b": "a"}[path]
        return f"HTTP/1.1 302 Found\r\nLocation: {to}\r\nContent-Length: 0\r\n\r\n".encode()
    server = hostile(_serving(data, redirect))
    mnt = rmount(f"{server.url}/m.safetensors", env={ENV: transport})
    assert _big(mnt).read_bytes() == _expected(data)
    assert any(p == "/real/m.safetensors" for _, p, _ in server.requests)

    looping = hostile(_serving(data, redirect))
    mnt = rmount(f"{looping.url}/loop/a", "--timeout", "5", env={ENV: transport})
    assert read_errno(_big(mnt)) == 5
    assert alive(daemon_pid(mnt))
    assert len(looping.requests) < 100, len(looping.requests)


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_a_login_is_not_sent_to_another_origin(transport, data, hostile, rmount):
    elsewhere = hostile(_serving(data))
    # localhost and 127.0.0.1: another origin, the same server

    def redirect(path, start, last):
        return (f"HTTP/1.1 307 Temporary Redirect\r\nLocation: http://localhost:{elsewhere.port}"
                f"/m.safetensors\r\nContent-Length: 0\r\n\r\n").encode()
    server = hostile(_serving(data, redirect))
    url = f"http://user:secret@127.0.0.1:{server.port}/m.safetensors"
    mnt = rmount(url, env={ENV: transport})
    assert _big(mnt).read_bytes() == _expected(data)
    assert all("authorization" in h for _, _, h in server.requests), server.requests
    assert elsewhere.requests
    assert all("authorization" not in h for _, _, h in elsewhere.requests), elsewhere.requests


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_http_proxy_is_used_and_no_proxy_obeyed(transport, data, hostile, rmount):
    """A forward proxy (absolute URIs) named by http_proxy, as curl reads it; a host in
    no_proxy asked directly."""
    proxy = hostile(_serving(data))
    origin = hostile(_serving(data))
    url = f"http://127.0.0.1:{origin.port}/m.safetensors"
    mnt = rmount(url, env={ENV: transport, "http_proxy": proxy.url, "no_proxy": ""})
    assert _big(mnt).read_bytes() == _expected(data)
    assert len(proxy.requests) > 1 and not origin.requests
    assert all(p == url for _, p, _ in proxy.requests), proxy.requests

    asked = len(proxy.requests)
    mnt = rmount(url, env={ENV: transport, "http_proxy": proxy.url, "no_proxy": "127.0.0.1"})
    assert _big(mnt).read_bytes() == _expected(data)
    assert len(proxy.requests) == asked and len(origin.requests) > 1


def _connections(pid: int, port: int) -> int:
    """The TCP connections of ``pid`` to ``port`` on 127.0.0.1 that are established."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            link = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if link.startswith("socket:["):
            inodes.add(link[8:-1])
    n = 0
    with open("/proc/net/tcp") as f:
        for line in f.readlines()[1:]:
            fields = line.split()
            if fields[3] == "01" and int(fields[2].split(":")[1], 16) == port \
                    and fields[9] in inodes:
                n += 1
    return n


def test_the_daemons_connections_are_bounded_by_its_fetch_threads(fresh_nginx, tmp_path, rmount):
    """Eight readers of 32 tensors, twice: the daemon keeps at most one connection per
    fetch thread (16), and no more on the second round than the first."""
    import numpy as np
    from safetensors.numpy import save_file

    from tensorfs.sources.blockcache import IN_FLIGHT

    rng = np.random.default_rng(3)
    path = tmp_path / "many.safetensors"
    save_file({f"t{i:02d}": rng.integers(0, 255, 3 * MiB, dtype=np.uint8) for i in range(32)},
              str(path))
    server = fresh_nginx()
    server.put("files/many/many.safetensors", path)
    mnt = rmount(f"{server.url}/files/many/many.safetensors", env={ENV: "http.client"})
    pid = daemon_pid(mnt)
    tensors = sorted(doc_of(mnt)["tensors"].values(), key=lambda t: t["path"])
    counts = []
    for round_ in range(2):
        errors: list = []

        def read(part):
            for t in part:
                if read_errno(mnt / t["path"]) == 5:
                    errors.append(t["path"])
        threads = [threading.Thread(target=read, args=(tensors[i::8],)) for i in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert not errors
        counts.append(_connections(pid, server.port))
    # one per fetch thread, and obstore's from the probe (kept alive 30 s by its pool)
    assert 0 < counts[0] <= IN_FLIGHT + 1 and counts[1] <= counts[0], counts


def test_a_buffer_is_reused_only_once_nothing_holds_it():
    from tensorfs.sources.transports.receive import Buffers

    pool = Buffers(64 * MiB)
    first = pool.take(MiB)
    view = memoryview(first)[10:20]
    held = [first]
    del first
    second = pool.take(MiB)
    assert second is not held[0]                # a plain reference holds it
    held.clear()
    third = pool.take(MiB)
    assert third is not view.obj                # a view holds it
    view.release()
    del view
    fourth = pool.take(MiB)
    assert pool.made == 3 and fourth is not second and fourth is not third
    small = Buffers(MiB)
    a, b = small.take(MiB), small.take(MiB)
    assert a is not b and small.made == 2       # past the limit: a new one, not kept
    del a, b
    pieces = Buffers(4 * MiB)
    for size in (MiB + 1, MiB + 2, MiB + 3):    # a random reader's pieces, each let go
        pieces.take(size)
    block = pieces.take(4 * MiB)                # room made: the pieces' buffers let go
    kept = id(block)
    assert pieces.take(4 * MiB) is not block    # held: a new one, not kept (no room)
    del block
    again = pieces.take(4 * MiB)
    assert id(again) == kept and pieces.made == 5
