"""Inputs bounded by kind before they are read, remote side (the audit's instances beyond
the review's): JSON nested deeper than Python's parser recurses is one line, never
``internal error: RecursionError``, whether a hostile Hub answers it or a user types it."""

from __future__ import annotations

from tests.remote.test_hostile_servers import _hub_api, _one_line, hostile  # noqa: F401
from tests.support import run_tensorfs

DEEP = b"[" * 100_000        # 100 KB, far under every size bound; json recurses per level


def test_a_hub_tree_nested_deeper_than_json_recurses_is_one_line(nginx, hostile, remote_env):  # noqa: F811
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
            assert result.returncode == 2, result.stderr
            assert result.stderr.splitlines() == [(
                "tensorfs: error: argument --storage-option: headers: the value nests deeper "
                "than JSON is read here")], result.stderr[:300]
