"""Hostile servers for the remote tests: small asyncio servers on 127.0.0.1 that answer
each request as a test says (``Hostile``, the ``hostile`` fixture), a Hub whose API answers
are relayed from nginx (``_hub_api``), and the one-line check of a refused command."""

from __future__ import annotations

import asyncio
import socket
import ssl
import threading

MiB = 1 << 20


class Hostile:
    """An HTTP/1.1 server on its own event loop thread; ``answer(method, path, headers)``
    is a coroutine function returning the response as bytes chunks (an async iterator)."""

    def __init__(self, answer, tls: ssl.SSLContext | None = None):
        self.answer = answer
        self.sent = 0
        self.requests: list[tuple[str, str, dict]] = []
        self._loop = asyncio.new_event_loop()
        self._sock = socket.socket()
        self._sock.bind(("127.0.0.1", 0))
        self._sock.listen(64)
        self.port = self._sock.getsockname()[1]
        self.tls = tls
        threading.Thread(target=self._run, daemon=True).start()

    @property
    def url(self) -> str:
        return f"{'https' if self.tls else 'http'}://127.0.0.1:{self.port}"

    def _run(self):
        asyncio.set_event_loop(self._loop)
        self._loop.run_until_complete(asyncio.start_server(self._client, sock=self._sock,
                                                           ssl=self.tls))
        self._loop.run_forever()

    async def _client(self, reader, writer):
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.decode("latin-1").split("\r\n")
                method, path, _ = lines[0].split(" ", 2)
                headers = {k.lower(): v.strip() for k, _, v in
                           (line.partition(":") for line in lines[1:] if line)}
                self.requests.append((method, path, headers))
                async for chunk in self.answer(method, path, headers):
                    writer.write(chunk)
                    await writer.drain()
                    self.sent += len(chunk)
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, OSError):
            pass
        finally:
            writer.close()

    def stop(self):
        """End every connection's coroutine, then the loop: one left pending would be
        finalized later by the garbage collector, in whatever the process runs then (inside
        a compile, CPython 3.11 fails with "AST constructor recursion depth mismatch")."""
        async def end():
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await self._loop.shutdown_asyncgens()

        try:
            asyncio.run_coroutine_threadsafe(end(), self._loop).result(timeout=10)
        except Exception:               # any: the loop is stopped below all the same
            pass
        self._loop.call_soon_threadsafe(self._loop.stop)


def _one_line(result) -> str:
    assert result.returncode == 1, result.stdout
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("tensorfs: error: "), result.stderr
    assert "internal error" not in lines[0] and "Traceback" not in result.stderr, lines[0]
    return lines[0]


def _hub_api(nginx, tree: bytes | None = None):
    """A Hub endpoint: the API answers relayed from nginx's Hub layout (the tree answered
    with ``tree`` when given); a file's resolve URL redirected to nginx by another name
    (localhost: another origin)."""

    async def answer(method, path, headers):
        if "/resolve/" in path:
            yield (f"HTTP/1.1 302 Found\r\nLocation: http://localhost:{nginx.port}{path}\r\n"
                   f"Content-Length: 0\r\n\r\n").encode()
            return
        if tree is not None and "/tree/" in path:
            yield _json_answer(tree)
        else:
            yield _json_answer(_from_nginx(nginx, path))
    return answer


def _from_nginx(nginx, path: str) -> bytes:
    import urllib.request

    with urllib.request.urlopen(f"{nginx.url}{path}") as r:
        return r.read()


def _json_answer(body: bytes) -> bytes:
    return (f"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n").encode() + body
