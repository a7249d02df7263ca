"""files/ of a remote mount (docs/internals/design.md) over http and the Hub's layout (nginx): the bytes equal
the served files, and the files share the block cache with the tensors: a block fetched for
a tensor is not fetched again for the whole file, nor the reverse (counted in nginx's access
log)."""

from __future__ import annotations

import os

import numpy as np
import pytest
from safetensors import safe_open

from tests.remote.conftest import folder_files
from tests.support.remote_checks import doc_of
from tests.support.servers import parse_range


def _fetched_ranges(log, uri_part: str) -> list[tuple[int, int]]:
    out = []
    for r in log:
        if r["method"] == "GET" and uri_part in r["uri"]:
            start, end = parse_range(r["range"])
            out.append((start, end))
    return out


def _covered(ranges) -> int:
    """Bytes covered by ``ranges`` (inclusive ends), overlaps counted once."""
    total, reach = 0, -1
    for start, end in sorted(ranges):
        if end > reach:
            total += end - max(start, reach + 1) + 1
            reach = end
    return total


@pytest.mark.parametrize("transport", ["http", "hf"])
def test_remote_files_hold_the_served_bytes(transport, nginx, corpus, rmount):
    model = corpus.models["sharded"]
    if transport == "http":
        url = f"{nginx.url}/files/sharded/{model.entry}"
        expected = {p.name: p for p in model.files}         # an index: it and its shards
    else:
        url = "hf://tfs/sharded"
        expected = folder_files(model)                      # a repo: all its top-level files
    rmnt = rmount(url)
    assert sorted(os.listdir(rmnt / "files")) == sorted(expected)
    for name, local in expected.items():
        assert (rmnt / "files" / name).read_bytes() == local.read_bytes(), name
        assert os.stat(rmnt / "files" / name).st_size == local.stat().st_size
    for local in model.files[1:]:           # safe_open maps the mounted shard
        with safe_open(str(rmnt / "files" / local.name), "np") as served, \
                safe_open(str(local), "np") as mine:
            for key in mine.keys():
                assert np.array_equal(served.get_tensor(key), mine.get_tensor(key)), key


@pytest.mark.parametrize("order", ["tensor_first", "file_first"])
def test_a_block_is_fetched_once_for_the_tensor_and_the_whole_file(order, nginx, corpus,
                                                                     rmount):
    model = corpus.models["big"]
    local = model.local
    rmnt = rmount(f"{nginx.url}/files/big/big.safetensors", "--cache-size", "512M")
    entry = doc_of(rmnt)["tensors"]["b.big"]            # 9 MiB + 1: three 4 MiB blocks
    whole = rmnt / "files" / "big.safetensors"
    mark = nginx.log_mark()
    if order == "tensor_first":
        assert (rmnt / entry["path"]).read_bytes() == \
            local.read_bytes()[entry["offset"]:entry["offset"] + entry["nbytes"]]
        nginx.wait_quiet(mark)
        assert whole.read_bytes() == local.read_bytes()
    else:
        assert whole.read_bytes() == local.read_bytes()
        nginx.wait_quiet(mark)
        assert (rmnt / entry["path"]).read_bytes() == \
            local.read_bytes()[entry["offset"]:entry["offset"] + entry["nbytes"]]
    log = nginx.wait_quiet(mark)
    ranges = _fetched_ranges(log, "/files/big/big.safetensors")
    fetched = sum(end - start + 1 for start, end in ranges)
    # every byte of the file fetched once at most (what the mount fetched of the header
    # before `mark` is served from memory and not fetched again either)
    assert fetched == _covered(ranges), ranges
    assert fetched <= local.stat().st_size, ranges


@pytest.mark.parametrize("blocks", ["fetched", "from_disk_cache"])
def test_many_concurrent_readers_of_a_mount_get_the_files_bytes(blocks, nginx, rmount, tmp_path,
                                                               remote_env):
    """Sixteen readers at once, of the whole file and of its tensors' files, through a cache
    of four blocks fetched (or read from --disk-cache): blocks are shared by the readers,
    pushed out and fetched again under them, and every read is the file's bytes."""
    import random
    import subprocess
    import threading

    from safetensors.numpy import save_file

    from tests.support import TENSORFS

    rng = np.random.default_rng(37)
    local = tmp_path / "pool.safetensors"
    save_file({f"t{i}": rng.integers(0, 255, (5 << 20) + 4099 * i, dtype=np.uint8)
               for i in range(5)}, str(local))
    data = local.read_bytes()
    url = nginx.put(f"files/pool-{blocks}/pool.safetensors", local)
    options = ["--cache-size", "16M"]
    if blocks == "from_disk_cache":
        options += ["--disk-cache", str(tmp_path / "cache")]
        first = rmount(url, *options)
        assert (first / "files" / "pool.safetensors").read_bytes() == data
        subprocess.run([*TENSORFS, "unmount", str(first)], env=remote_env, check=True)
    rmnt = rmount(url, *options)
    files = [(rmnt / "files" / "pool.safetensors", 0, len(data))]
    for entry in doc_of(rmnt)["tensors"].values():
        files.append((rmnt / entry["path"], entry["offset"], entry["nbytes"]))
    mark = nginx.log_mark()
    wrong: list = []

    def reader(i):
        pick = random.Random(i)
        path, base, size = files[i % len(files)]
        fd = os.open(path, os.O_RDONLY)
        try:
            for _ in range(12):
                at = pick.randrange(0, size)
                n = pick.randrange(1, min(3 << 20, size - at) + 1)
                if os.pread(fd, n, at) != data[base + at:base + at + n]:
                    wrong.append((path.name, at, n))
        except OSError as error:
            wrong.append(error)
        finally:
            os.close(fd)

    threads = [threading.Thread(target=reader, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert wrong == []
    assert (rmnt / "files" / "pool.safetensors").read_bytes() == data
    if blocks == "from_disk_cache":             # every block from the disk, none fetched
        assert [r for r in nginx.wait_quiet(mark) if r["method"] == "GET"] == []

