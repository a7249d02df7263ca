"""Inputs bounded by kind before they are read, remote side (the audit's instances beyond
the review's): JSON nested deeper than Python's parser recurses is one line, never
``internal error: RecursionError``, whether a hostile Hub answers it or a user types it."""

from __future__ import annotations

import os

import pytest

from tests.support import run_tensorfs, usage_error
from tests.support.hostile import _hub_api, _one_line

DEEP = b"[" * 100_000        # 100 KB, far under every size bound; json recurses per level


def test_a_hub_tree_nested_deeper_than_json_recurses_is_one_line(nginx, hostile, remote_env):
    """[before: `tensorfs: error: internal error: RecursionError: maximum recursion depth
    exceeded while decoding a JSON array`]"""
    server = hostile(_hub_api(nginx, tree=DEEP))
    line = _one_line(run_tensorfs("inspect", "hf://tfs/safetensors",
                                  env={**remote_env, "HF_ENDPOINT": server.url}, timeout=120))
    assert "not the Hub's JSON (RecursionError)" in line, line


def test_a_storage_option_nested_too_deep_is_one_line(nginx):
    value = DEEP.decode()
    for command in ("inspect", "hash"):
        for spelling in (["--storage-option", f"headers={value}"], [f"--stor=headers={value}"]):
            result = run_tensorfs(command, f"{nginx.url}/files/none.safetensors", *spelling)
            assert usage_error(result) == (
                "tensorfs: error: argument --storage-option: headers: the value nests deeper "
                "than JSON is read here"), result.stderr[:300]


@pytest.mark.parametrize("kind", ["huge", "fifo", "dev-zero"])
def test_a_netrc_that_is_no_netrc_is_passed_over_unread(nginx, remote_env, tmp_path, kind):
    """[found by the audit: ~/.netrc was read whole by Python's netrc, a character at a
    time, whatever its size (a sparse 1 GiB file held `inspect` for minutes); $NETRC naming
    /dev/zero the same]  A netrc is read only if it is a regular file of at most 1 MiB;
    otherwise it is passed over, as an unreadable one is."""
    home = tmp_path / "home"
    home.mkdir()
    env = {**remote_env, "HOME": str(home)}
    netrc = home / ".netrc"
    if kind == "huge":
        with open(netrc, "wb") as f:
            f.truncate(1 << 30)
    elif kind == "fifo":
        os.mkfifo(netrc)
    else:
        env["NETRC"] = "/dev/zero"
    result = run_tensorfs("inspect", f"{nginx.url}/files/safetensors/model.safetensors",
                          env=env, timeout=60)
    assert result.returncode == 0, result.stderr
    assert "format:     safetensors" in result.stdout
