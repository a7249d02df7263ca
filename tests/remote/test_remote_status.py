"""One owner for a mount's state (tensorfs.status, docs/cli.md): a remote source whose object
changed under the mount says so in the status file, as a local one does, and ``tensorfs
list`` shows "source changed" with the reason (issue 21)."""

from __future__ import annotations

import errno
import json
import os
import time

import numpy as np
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


def test_list_shows_a_dead_servers_last_failed_read(fresh_nginx, rmount):
    """The server of a remote mount went away: the mount still serves what it holds, and
    ``list`` says its last read failed, why and when (before, only the log said it)."""
    import re

    server = fresh_nginx()
    big = np.arange(4 << 20, dtype=np.float32)          # 16 MiB: not fetched at mount
    url = server.put("files/dead/model.safetensors", save({"w": big}))
    mnt = rmount(url, "--timeout", "3")
    assert _row(mnt)["last_failure"] is None
    server.stop()
    assert read_errno(mnt / "w", offset=big.nbytes - 4096, size=4096) == errno.EIO
    row = _row(mnt)
    assert row["state"] == "serving" and row["reason"] is None, row
    assert row["last_failure"]["what"] and isinstance(row["last_failure"]["at"], float)
    line = next(line for line in run_tensorfs("list").stdout.splitlines()
                if line.startswith(str(mnt.resolve()) + " "))
    assert re.search(r"  serving, last read failed: \S.* \(\d\d:\d\d:\d\d\)$", line), line
