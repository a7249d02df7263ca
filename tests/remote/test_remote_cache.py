"""--disk-cache (SPEC §8): a second mount of the same object version reads the blocks the
first fetched from disk (counted from nginx's access log: no block fetched twice), another
version never sees them, and the directory stays within its size."""

from __future__ import annotations

import os
import time
from pathlib import Path


from tests.conftest import run_tensorfs
from tests.remote.remote_checks import (
    MiB, assert_matches_reference, doc_of, header_size)
from tests.servers import parse_range


def _read_all(mnt: Path) -> None:
    for entry in doc_of(mnt)["tensors"].values():
        (mnt / entry["path"]).read_bytes()


def _unmount(mnt: Path, env) -> None:
    result = run_tensorfs("unmount", mnt, env=env)
    assert result.returncode == 0, result.stderr


def _du(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def _intervals(log: list[dict]) -> list[tuple[int, int]]:
    out = []
    for r in log:
        rng = parse_range(r["range"]) if r["method"] == "GET" and r["status"] == 206 else None
        if rng:
            out.append((rng[0], rng[0] + r["bytes"]))
    return out


def test_a_second_mount_with_disk_cache_fetches_no_block_twice(nginx, corpus, rmount, remote_env,
                                                              tmp_path):
    model = corpus.models["big"]
    url = f"{nginx.url}/files/big/big.safetensors"
    cache = tmp_path / "cache"
    mark = nginx.log_mark()
    first = rmount(url, "--disk-cache", cache)
    _read_all(first)
    _unmount(first, remote_env)
    fetched = _intervals(nginx.wait_quiet(mark))
    assert sum(b - a for a, b in fetched) >= model.local.stat().st_size - header_size(model.local)
    mark = nginx.log_mark()
    second = rmount(url, "--disk-cache", cache)
    at_mount = nginx.requests(mark)
    mark = nginx.log_mark()
    _read_all(second)
    assert_matches_reference(second, model.files)
    reads = nginx.wait_quiet(mark)
    assert reads == [], reads                                 # every block from disk
    assert sum(r["bytes"] for r in at_mount) <= header_size(model.local) + MiB


def test_the_disk_cache_is_keyed_by_version(fresh_nginx, corpus, rmount, remote_env, tmp_path):
    server = fresh_nginx()
    old, new = corpus.models["big"], corpus.models["safetensors"]
    url = server.put("files/swap/model.safetensors", old.local)
    cache = tmp_path / "cache"
    first = rmount(url, "--disk-cache", cache)
    _read_all(first)
    _unmount(first, remote_env)
    server.put("files/swap/model.safetensors", new.local)
    later = time.time() + 100
    os.utime(server.www / "files/swap/model.safetensors", (later, later))
    second = rmount(url, "--disk-cache", cache)
    assert_matches_reference(second, new.files)


def test_the_disk_cache_stays_within_its_size(nginx, corpus, rmount, tmp_path):
    cache = tmp_path / "cache"
    mnt = rmount(f"{nginx.url}/files/big/big.safetensors", "--disk-cache", f"{cache}:9M")
    _read_all(mnt)
    assert_matches_reference(mnt, corpus.models["big"].files)
    assert 0 < _du(cache) <= 9 * MiB


def test_a_disk_cache_others_can_write_is_refused(nginx, remote_env, tmp_path):
    cache = tmp_path / "cache"
    cache.mkdir()
    cache.chmod(0o777)
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    result = run_tensorfs("mount", f"{nginx.url}/files/big/big.safetensors", mnt,
                          "--disk-cache", cache, env=remote_env)
    assert result.returncode == 1
    assert len(result.stderr.splitlines()) == 1 and str(cache) in result.stderr, result.stderr
