"""files/ of a remote repo: every name its listing gives passes the one name rule before any
request (a hostile listing's names are never asked for, with or without the token), and a
LOOKUP, GETATTR or READDIR in files/ asks the network nothing: ``stat`` answers from the
listing while one companion's server stalls."""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import threading

from tests.support.hostile import _from_nginx, _json_answer
from tests.support.remote_checks import HF_TOKEN

HOSTILE_NAMES = ["nul%00byte.txt", "a%252F..%252Fb", "esc\x1b[31mred.txt", "rtl\u202etxt.exe",
                 "x" * 300, "\uff0e\uff0e", "back\\slash.txt"]
EXTRA = {"a.json": b'{"a": 1}\n', "b.json": b'{"b": 22}\n', "stall.json": b"{}\n"}
EXTRA.update({f"many{i:03d}.txt": b"file %d\n" % i for i in range(300)})


def _hub_with_extra_files(nginx, names: list[str], stall: str | None = None):
    """A Hub endpoint relaying nginx's Hub layout for tfs/safetensors, whose tree listing
    also lists ``names`` (with sizes); a file's resolve URL is answered by relaying nginx's,
    except ``stall``, which never answers, and the extra ones, answered here."""

    async def answer(method, path, headers):
        if "/tree/" in path:
            tree = json.loads(_from_nginx(nginx, path))
            for name in names:
                size = len(EXTRA.get(name, b"x"))
                tree.append({"type": "file", "oid": "0" * 40, "size": size, "path": name})
            yield _json_answer(json.dumps(tree).encode())
            return
        if "/resolve/" in path:
            name = path.rsplit("/", 1)[-1]
            if name == stall:
                await asyncio.Event().wait()
            if name == "gone.json":
                yield b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n"
                return
            if name in EXTRA:
                body = EXTRA[name]
                first, _, last = headers["range"].removeprefix("bytes=").partition("-")
                first, last = int(first), min(int(last), len(body) - 1)
                yield (f"HTTP/1.1 206 Partial Content\r\nContent-Length: {last - first + 1}\r\n"
                       f"Content-Range: bytes {first}-{last}/{len(body)}\r\nETag: \"e\"\r\n\r\n"
                       ).encode() + body[first:last + 1]
                return
            yield (f"HTTP/1.1 302 Found\r\nLocation: {nginx.url}{path}\r\n"
                   f"Content-Length: 0\r\n\r\n").encode()
            return
        yield _json_answer(_from_nginx(nginx, path))
    return answer


def test_names_of_a_hostile_listing_are_never_requested(nginx, hostile, rmount, tmp_path):
    server = hostile(_hub_with_extra_files(nginx, HOSTILE_NAMES + ["a.json"]))
    log = tmp_path / "daemon.log"
    mnt = rmount("hf://tfs/safetensors", "--log", log,
                 env={"HF_ENDPOINT": server.url, "HF_TOKEN": HF_TOKEN})
    served = sorted(os.listdir(mnt / "files"))
    assert "a.json" in served and not set(served) & set(HOSTILE_NAMES), served
    assert (mnt / "files" / "a.json").read_bytes() == EXTRA["a.json"]
    for name in served:
        (mnt / "files" / name).read_bytes()
    asked = [p for _, p, _ in server.requests if "/resolve/" in p]
    for bad in ("nul", "%2525", "esc", "rtl", "xxxxxxxx", "%EF%BC%8E", "back"):
        assert not [p for p in asked if bad in p.rsplit("/", 1)[-1]], (bad, asked)
    text = log.read_text()
    assert text.count("not served in files/") == len(HOSTILE_NAMES), text


def test_stat_in_files_answers_from_the_listing_while_a_server_stalls(nginx, hostile, rmount):
    server = hostile(_hub_with_extra_files(nginx, list(EXTRA), stall="stall.json"))
    mnt = rmount("hf://tfs/safetensors", "--timeout", "20", env={"HF_ENDPOINT": server.url})
    stalled = threading.Thread(target=subprocess.run, daemon=True,
                               args=(["cat", str(mnt / "files" / "stall.json")],),
                               kwargs={"capture_output": True, "timeout": 60, "check": False})
    stalled.start()
    try:
        # answered while the read above waits on its server (and without asking it)
        result = subprocess.run(["stat", "-c", "%n %s", *(str(mnt / "files" / n) for n in EXTRA)],
                                check=False, capture_output=True, text=True, timeout=15)
        assert result.returncode == 0, result.stderr
        sizes = dict(line.rsplit(" ", 1) for line in result.stdout.splitlines())
        assert {os.path.basename(k): int(v) for k, v in sizes.items()} == \
            {n: len(b) for n, b in EXTRA.items()}
        asked = [p for _, p, _ in server.requests if "/resolve/" in p]
        assert not [p for p in asked if p.endswith(("/a.json", "/b.json"))], asked
        assert (mnt / "files" / "b.json").read_bytes() == EXTRA["b.json"]
    finally:
        stalled.join(60)


def _sockets(pid: int) -> int:
    return sum(os.readlink(f"/proc/{pid}/fd/{fd}").startswith("socket:")
               for fd in os.listdir(f"/proc/{pid}/fd"))


def test_one_client_per_endpoint_not_per_file(nginx, hostile, rmount, tmp_path):
    """300 files of one repo read: the daemon holds a few sockets, not one per file."""
    many = [n for n in EXTRA if n.startswith("many")]
    server = hostile(_hub_with_extra_files(nginx, many))
    log = tmp_path / "daemon.log"
    mnt = rmount("hf://tfs/safetensors", "--log", log, env={"HF_ENDPOINT": server.url})
    for name in many:
        assert (mnt / "files" / name).read_bytes() == EXTRA[name], name
    pid = int(re.search(r"tensorfs\[(\d+)\]", log.read_text())[1])
    assert _sockets(pid) < 20, _sockets(pid)


def test_a_failed_open_is_not_asked_again_at_each_lookup(nginx, hostile, rmount):
    server = hostile(_hub_with_extra_files(nginx, ["gone.json", "a.json"]))
    mnt = rmount("hf://tfs/safetensors", env={"HF_ENDPOINT": server.url})
    gone = mnt / "files" / "gone.json"

    def asked() -> int:
        return sum(p.endswith("/gone.json") for _, p, _ in server.requests)

    assert gone.stat().st_size == 1 and asked() == 0        # the listing's size
    for _ in range(3):
        result = subprocess.run(["cat", str(gone)], check=False, capture_output=True, text=True,
                                timeout=60)
        assert result.returncode != 0 and "Input/output error" in result.stderr
        gone.stat()
    assert asked() == 1
    assert (mnt / "files" / "a.json").read_bytes() == EXTRA["a.json"]
