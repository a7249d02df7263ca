"""A remote file that changed is never served as the one mounted (issue 43 class 8): every
validator a server sends is checked on every answer, on every transport
(``tensorfs.sources.transports.base.check_answer``).  Each test has a server whose answers to
the reads after the mount differ in one validator only, the bytes of the range asked for
being the same: the read is EIO, for good, and ``list`` says the file changed."""

from __future__ import annotations

import errno
import json
import os

import numpy as np
import pytest
from safetensors.numpy import save

from tests.support import read_errno, run_tensorfs
from tests.support.hostile import _from_nginx, _json_answer

BIG = np.arange(4 << 20, dtype=np.float32)         # 16 MiB: its last block is read after the mount
DATA = save({"w": BIG})
WHEN = "Mon, 01 Jan 2024 00:00:00 GMT"
LATER = "Tue, 02 Jan 2024 00:00:00 GMT"


def _row(mnt) -> dict:
    rows = json.loads(run_tensorfs("list", "--json").stdout)
    return next(r for r in rows if r["mountpoint"] == str(mnt.resolve()))


def _server(lie: dict, etag: bool, modified: bool):
    """Ranged answers of ``DATA`` with ETag "e1" (``etag``) and a Last-Modified
    (``modified``); once ``lie["now"]`` names a lie, the answers past the first MiB tell it:
    "total" (a Content-Range total other than the size at mount), "modified" (another
    Last-Modified), "etag" (another ETag), "no-etag" (none), "short" (a Content-Length and a
    body shorter than the range asked for)."""

    async def answer(method, path, headers):
        first, _, last = headers["range"].removeprefix("bytes=").partition("-")
        start, end = int(first), min(int(last), len(DATA) - 1)
        body = DATA[start:end + 1]
        total, tag, when = len(DATA), '"e1"' if etag else None, WHEN if modified else None
        now = lie["now"] if start >= 1 << 20 else None
        if now == "total":
            total += 4096
        elif now == "modified":
            when = LATER
        elif now == "etag":
            tag = '"e2"'
        elif now == "no-etag":
            tag = None
        elif now == "short":
            body = body[:len(body) // 2]
        head = (f"HTTP/1.1 206 Partial Content\r\nContent-Range: bytes {start}-{end}/{total}\r\n"
                f"Content-Length: {len(body)}\r\nAccept-Ranges: bytes\r\n")
        head += f"ETag: {tag}\r\n" if tag else ""
        head += f"Last-Modified: {when}\r\n" if when else ""
        yield (head + "\r\n").encode() + body
    return answer


@pytest.mark.parametrize("lie, etag, modified", [
    ("total", True, True),          # the issue's: same ETag, another size
    ("total", False, False),        # no ETag, no date: the size is all there is
    ("modified", True, True),       # same ETag, another Last-Modified
    ("modified", False, True),      # no ETag: the date is the version
    ("etag", True, True),           # (passed before: a guard)
    ("no-etag", True, True),        # (passed before: a guard)
])
def test_an_answer_whose_validator_changed_is_never_served(lie, etag, modified, hostile, rmount,
                                                           tmp_path):
    state = {"now": None}
    server = hostile(_server(state, etag, modified))
    log = tmp_path / "daemon.log"
    mnt = rmount(f"{server.url}/m.safetensors", "--timeout", "5", "--log", log)
    assert _row(mnt)["state"] == "serving"
    state["now"] = lie
    at = BIG.nbytes - 4096
    assert read_errno(mnt / "w", offset=at, size=4096) == errno.EIO
    state["now"] = None                 # honest again: the file stays failed, as it changed
    assert read_errno(mnt / "w", offset=at, size=4096) == errno.EIO
    row = _row(mnt)
    assert row["state"] == "source changed" and "the file changed" in row["reason"], row
    assert "the file changed" in log.read_text()


def test_a_hub_file_whose_size_changed_under_its_commit_is_never_served(nginx, hostile, rmount):
    """The Hub's commit pins the bytes, and its CDN's ETag and Last-Modified are not the
    file's: the size (the Content-Range total) is checked all the same."""
    state = {"now": None}
    files = _server(state, etag=False, modified=False)

    async def answer(method, path, headers):
        if "/resolve/" in path:
            async for chunk in files(method, path, headers):
                yield chunk
        else:
            yield _json_answer(_from_nginx(nginx, path))
    server = hostile(answer)
    mnt = rmount("hf://tfs/safetensors/model.safetensors", "--timeout", "5",
                 env={"HF_ENDPOINT": server.url})
    state["now"] = "total"
    assert read_errno(mnt / "w", offset=BIG.nbytes - 4096, size=4096) == errno.EIO
    row = _row(mnt)
    assert row["state"] == "source changed" and "bytes now" in row["reason"], row


def test_an_answer_shorter_than_the_range_asked_for_is_not_served(hostile, rmount):
    """A Content-Length (and body) short of the range: tried again, then EIO, never a short
    read served as the file's bytes (passed before: a guard)."""
    state = {"now": None}
    server = hostile(_server(state, True, True))
    mnt = rmount(f"{server.url}/m.safetensors", "--timeout", "3")
    state["now"] = "short"
    assert read_errno(mnt / "w", offset=BIG.nbytes - 4096, size=4096) == errno.EIO
    state["now"] = None
    assert read_errno(mnt / "w", offset=BIG.nbytes - 4096, size=4096) == \
        BIG[-1024:].tobytes()


def test_a_file_changed_under_an_fsspec_mount_is_never_served(tmp_path, mount):
    """fsspec's ranged ``cat_file`` names no version: each read is followed by the file's
    ``info``, whose size and version (its mtime for file://) must be the mount's.  Before,
    the new bytes were served as the file mounted."""
    pytest.importorskip("fsspec")
    model = tmp_path / "m.safetensors"
    model.write_bytes(DATA)
    mnt = mount(f"file://{model}")
    changed = save({"w": BIG + 1})
    assert len(changed) == len(DATA)
    model.write_bytes(changed)                              # rewritten in place, same size
    later = os.stat(model).st_mtime + 100
    os.utime(model, (later, later))
    assert read_errno(mnt / "w", offset=BIG.nbytes - 4096, size=4096) == errno.EIO
    assert _row(mnt)["state"] == "source changed"
