"""One owner for a mount's state (tensorfs.status, docs/reference/cli.md): a remote source whose object
changed under the mount says so in the status file, as a local one does, and ``tensorfs
list`` shows "source changed" with the reason (issue 21)."""

from __future__ import annotations

import errno
import json
import os
import re
import time

import numpy as np
import pytest
from safetensors.numpy import save

from tests.support import read_errno, run_tensorfs

TENSOR = np.arange(1 << 16, dtype=np.float32)


def _row(mnt) -> dict:
    rows = json.loads(run_tensorfs("list", "--json").stdout)
    return next(r for r in rows if r["mountpoint"] == str(mnt.resolve()))


def test_list_shows_a_changed_http_source(fresh_nginx, rmount):
    server = fresh_nginx()
    url = server.put("files/st/model.safetensors", save({"w": TENSOR}))
    mnt = rmount(url)
    assert _row(mnt)["state"] == "serving"
    server.put("files/st/model.safetensors", save({"w": TENSOR + 1}))
    later = time.time() + 100
    os.utime(server.www / "files/st/model.safetensors", (later, later))     # another ETag
    assert read_errno(mnt / "w") == errno.EIO
    row = _row(mnt)
    assert row["state"] == "source changed" and "changed" in row["reason"], row
    assert "source changed: " in run_tensorfs("list").stdout


def test_list_shows_a_changed_s3_source(s3, rmount):
    s3.mkdir("status")
    s3.pipe_file("status/model.safetensors", save({"w": TENSOR}))
    mnt = rmount("s3://status/model.safetensors")
    s3.pipe_file("status/model.safetensors", save({"w": TENSOR + 1}))
    assert read_errno(mnt / "w") == errno.EIO
    row = _row(mnt)
    assert row["state"] == "source changed" and "s3://status/model.safetensors" in row["reason"]


def test_list_shows_a_dead_servers_mount_degraded_with_the_reason(fresh_nginx, rmount):
    """The server of a remote mount went away: the mount still serves what it holds, and
    ``list`` says at once that it is degraded, why and when (before, it said "serving")."""
    server = fresh_nginx()
    big = np.arange(4 << 20, dtype=np.float32)          # 16 MiB: not fetched at mount
    url = server.put("files/dead/model.safetensors", save({"w": big}))
    mnt = rmount(url, "--timeout", "3")
    assert _row(mnt)["last_failure"] is None and _row(mnt)["state"] == "serving"
    server.stop()
    assert read_errno(mnt / "w", offset=big.nbytes - 4096, size=4096) == errno.EIO
    row = _row(mnt)
    assert row["state"] == "degraded" and row["reason"] == row["last_failure"]["what"], row
    assert "cannot connect" in row["reason"] and isinstance(row["last_failure"]["at"], float)
    assert re.search(r"  degraded: cannot connect.* \(\d\d:\d\d:\d\d\)$", _line(mnt)), _line(mnt)


def _line(mnt) -> str:
    return next(line for line in run_tensorfs("list").stdout.splitlines()
                if line.startswith(str(mnt.resolve()) + " "))


def _flaky(data: bytes, answers: dict):
    """A server of ``data`` (ranged GETs, ETag "e1") whose answer to a read past the first
    MiB is ``answers["now"]``: "ok", or a status line such as "503 Service Unavailable"."""

    async def answer(method, path, headers):
        first, _, last = headers.get("range", "bytes=0-").removeprefix("bytes=").partition("-")
        start = int(first)
        end = min(int(last) if last else len(data) - 1, len(data) - 1)
        if answers["now"] != "ok" and start >= 1 << 20:
            yield (f"HTTP/1.1 {answers['now']}\r\nContent-Length: 0\r\n\r\n").encode()
            return
        body = data[start:end + 1] if method == "GET" else b""
        yield (f"HTTP/1.1 206 Partial Content\r\nContent-Range: bytes {start}-{end}/{len(data)}"
               f"\r\nETag: \"e1\"\r\nAccept-Ranges: bytes\r\n"
               f"Content-Length: {end + 1 - start if method == 'GET' else 0}\r\n\r\n"
               ).encode() + body
    return answer


@pytest.mark.parametrize("status, said", [("503 Service Unavailable", "HTTP 503"),
                                          ("404 Not Found", "not found (HTTP 404)")])
def test_list_shows_a_mount_degraded_while_its_server_fails_and_serving_once_it_answers(
        hostile, rmount, status, said):
    big = np.arange(4 << 20, dtype=np.float32)
    data = save({"w": big})
    answers = {"now": "ok"}
    server = hostile(_flaky(data, answers))
    mnt = rmount(f"{server.url}/model.safetensors", "--timeout", "3")
    assert _row(mnt)["state"] == "serving"
    answers["now"] = status
    assert read_errno(mnt / "w", offset=big.nbytes - 4096, size=4096) == errno.EIO
    row = _row(mnt)
    assert row["state"] == "degraded" and said in row["reason"], row
    assert f"  degraded: {row['reason']} (" in _line(mnt)
    answers["now"] = "ok"                               # the server is back
    assert read_errno(mnt / "w", offset=big.nbytes - 4096, size=4096) == \
        big[-1024:].tobytes()
    row = _row(mnt)
    assert row["state"] == "serving" and row["reason"] is None, row
    assert said in row["last_failure"]["what"]          # what happened stays said, with when
    assert ", last read failed: " in _line(mnt)


def test_list_names_a_directorys_file_changed_on_the_server_before_its_first_read(s3, rmount):
    """A directory mount's companion is first asked for at its first read: a file that changed
    since the listing reads EIO for good, and ``list`` says which one (it said "serving").
    A file no GGUF plan reads (config.json is read at the mount, for files/'s GGUF)."""
    s3.mkdir("dirchanged")
    s3.pipe_file("dirchanged/model.safetensors", save({"w": TENSOR}))
    s3.pipe_file("dirchanged/notes.json", b'{"model_type": "llama"}')
    mnt = rmount("s3://dirchanged")
    assert _row(mnt)["state"] == "serving"
    assert _row(mnt)["source"] == "s3://dirchanged"          # as named, not the model file
    s3.pipe_file("dirchanged/notes.json", b'{"model_type": "mamba", "more": 1}')
    assert read_errno(mnt / "files" / "notes.json") == errno.EIO
    row = _row(mnt)
    assert row["state"] == "source changed", row
    assert row["reason"].startswith("s3://dirchanged/notes.json (files/notes.json) changed: "
                                    "changed on the server since it was listed"), row
    assert row["reason"].endswith("it reads EIO, the tensors serve"), row
    assert (mnt / "w").read_bytes() == TENSOR.tobytes()          # the tensors still serve
    assert _line(mnt).endswith("source changed: " + row["reason"])
