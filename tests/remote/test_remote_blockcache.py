"""The block cache of remote files (tensorfs.sources.blockcache, docs/reference/remote.md), against a real nginx
on 127.0.0.1 (tests/support/servers.py): the requests it makes are read from nginx's access log, the
bytes it returns compared with the file's.  One request per block however many readers want
it, adjacent missing blocks in one request, a small tensor whole, read-ahead that stays in
the tensor, and the disk cache: bounded, private, reused by a later mount of the same
version and never by another version."""

from __future__ import annotations

import importlib.util
import os
import threading

import numpy as np
import pytest
from safetensors.numpy import save_file

from tests.support.servers import Nginx, parse_range

pytestmark = pytest.mark.skipif(importlib.util.find_spec("obstore") is None,
                                reason="the remote extra is not installed")

MiB = 1 << 20


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    base = tmp_path_factory.mktemp("blockcache")
    rng = np.random.default_rng(7)
    tensors = {
        "big": rng.standard_normal(10 * MiB).astype(np.float32),      # 40 MiB: 10 blocks
        "mid": rng.standard_normal(3 * MiB // 2).astype(np.float32),   # 6 MiB: fetched whole
        "tiny": np.arange(5, dtype=np.float32),
    }
    local = base / "m.safetensors"
    save_file(tensors, str(local))
    nginx = Nginx(base / "srv").start()
    nginx.put("files/m.safetensors", local)
    yield nginx, local
    nginx.stop()


def _open(nginx, tmp_path, **settings):
    from tensorfs.cache import ByteLRU
    from tensorfs.loading.loader import load_model
    from tensorfs.sources.remote import RemoteSettings

    settings.setdefault("cache", ByteLRU(256 * MiB))
    model = load_model(f"{nginx.url}/files/m.safetensors", RemoteSettings(**settings))
    source = next(iter(model.sources.values()))
    return model, source, {t.name: t for t in model.tensors}


def _gets(nginx, mark) -> list[tuple[int, int]]:
    return [parse_range(r["range"]) for r in nginx.wait_quiet(mark, quiet=0.2)
            if r["method"] == "GET"]


def test_concurrent_readers_of_one_block_make_one_request(server, tmp_path):
    nginx, local = server
    model, source, tensors = _open(nginx, tmp_path)
    source.blocks.exact_reads = False   # in whole blocks (a sequential or disk-cached reader's)
    data = local.read_bytes()
    try:
        big = tensors["big"]
        at = big.offset + 5 * MiB + 123                 # inside the big tensor's 2nd block
        mark = nginx.log_mark()
        barrier = threading.Barrier(16)
        got, errors = [], []

        def reader(i):
            try:
                barrier.wait()
                got.append(source.read(at + 64 * i, 4096))
            except Exception as error:       # any exception: reported below
                errors.append(error)

        threads = [threading.Thread(target=reader, args=(i,)) for i in range(16)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert errors == []
        assert sorted(got) == sorted(data[at + 64 * i:at + 64 * i + 4096] for i in range(16))
        block = at // (4 * MiB)
        assert _gets(nginx, mark) == [(block * 4 * MiB, (block + 1) * 4 * MiB - 1)]
    finally:
        model.close()


def test_a_read_of_several_missing_blocks_is_one_request(server, tmp_path):
    nginx, local = server
    model, source, tensors = _open(nginx, tmp_path)
    try:
        big = tensors["big"]
        start = (big.offset // (4 * MiB) + 2) * 4 * MiB + 10
        mark = nginx.log_mark()
        assert source.read(start, 9 * MiB) == local.read_bytes()[start:start + 9 * MiB]
        first = start // (4 * MiB)
        last = (start + 9 * MiB - 1) // (4 * MiB)
        assert _gets(nginx, mark) == [(first * 4 * MiB, (last + 1) * 4 * MiB - 1)]
    finally:
        model.close()


def test_a_small_tensor_is_fetched_whole_at_its_first_read(server, tmp_path):
    nginx, local = server
    model, source, tensors = _open(nginx, tmp_path)
    try:
        mid = tensors["mid"]
        mark = nginx.log_mark()
        assert source.read(mid.offset + mid.nbytes // 2, 16) == \
            local.read_bytes()[mid.offset + mid.nbytes // 2:][:16]
        (a, b), = _gets(nginx, mark)
        assert a <= mid.offset and b >= mid.offset + mid.nbytes - 1
        assert b - a + 1 <= mid.nbytes + 8 * MiB           # its blocks, not the file
        mark = nginx.log_mark()
        whole = source.read(mid.offset, mid.nbytes)           # then: no request at all
        assert whole == local.read_bytes()[mid.offset:mid.offset + mid.nbytes]
        assert _gets(nginx, mark) == []
    finally:
        model.close()


def test_a_sequential_reader_gets_read_ahead_within_its_tensor(server, tmp_path):
    nginx, local = server
    model, source, tensors = _open(nginx, tmp_path)
    data = local.read_bytes()
    try:
        big = tensors["big"]
        mark = nginx.log_mark()
        for pos in range(big.offset, big.offset + big.nbytes, MiB):
            n = min(MiB, big.offset + big.nbytes - pos)
            assert source.read(pos, n) == data[pos:pos + n]
        gets = _gets(nginx, mark)
        # the first read, before the reader is known to be sequential: its bytes alone (past
        # what the mount's probe fetched of the file's start, kept)
        assert any(b == big.offset + MiB - 1 and a >= big.offset for a, b in gets), gets
        covered = sorted(gets)
        # every byte once: no byte fetched twice, none past the tensor's last block
        for (a, b), (c, _) in zip(covered, covered[1:]):
            assert b < c, covered
        last_block_end = ((big.offset + big.nbytes - 1) // (4 * MiB) + 1) * 4 * MiB - 1
        assert covered[-1][1] <= min(last_block_end, len(data) - 1)
        # read-ahead ran: more requests than the reads that found their block missing
        # would make alone, several of them one block each, fetched in parallel
        assert source.blocks.requests == len(gets) >= 3
    finally:
        model.close()


def test_the_disk_cache_is_reused_by_a_later_mount_of_the_same_version(server, tmp_path):
    nginx, local = server
    disk = tmp_path / "cache"
    big_range = None
    model, source, tensors = _open(nginx, tmp_path, disk_cache=(str(disk), 64 * MiB))
    try:
        big = tensors["big"]
        big_range = (big.offset + 3 * MiB, 6 * MiB)
        assert source.read(*big_range) == local.read_bytes()[big_range[0]:sum(big_range)]
    finally:
        model.close()
    assert oct(disk.stat().st_mode & 0o777) == "0o700"
    files = [p for p in disk.rglob("*") if p.is_file()]
    assert files and all(p.stat().st_mode & 0o077 == 0 for p in files)

    mark = nginx.log_mark()
    model, source, _ = _open(nginx, tmp_path, disk_cache=(str(disk), 64 * MiB))
    try:
        assert source.read(*big_range) == local.read_bytes()[big_range[0]:sum(big_range)]
        gets = _gets(nginx, mark)
        assert gets == [(0, 64 * 1024 - 1)]           # the header's probe only
    finally:
        model.close()


def test_another_version_does_not_see_the_disk_cache(server, tmp_path):
    nginx, local = server
    disk = tmp_path / "cache"
    model, source, tensors = _open(nginx, tmp_path, disk_cache=(str(disk), 64 * MiB))
    big = tensors["big"]
    try:
        source.read(big.offset, 4096)
    finally:
        model.close()
    # the same name, other bytes: a new ETag
    other = bytearray(local.read_bytes())
    other[big.offset:big.offset + 4] = b"\x00\x00\x80\x7f"
    nginx.put("files/m.safetensors", bytes(other))
    os.utime(nginx.www / "files/m.safetensors", (1, 1))
    try:
        model, source, _ = _open(nginx, tmp_path, disk_cache=(str(disk), 64 * MiB))
        try:
            assert source.read(big.offset, 4) == b"\x00\x00\x80\x7f"
        finally:
            model.close()
    finally:
        nginx.put("files/m.safetensors", local)


def test_the_disk_cache_stays_within_its_size(server, tmp_path):
    nginx, local = server
    disk = tmp_path / "cache"
    model, source, tensors = _open(nginx, tmp_path, disk_cache=(str(disk), 9 * MiB))
    try:
        big = tensors["big"]
        for k in range(5):
            source.read(big.offset + k * 8 * MiB, 16)
    finally:
        model.close()
    held = sum(p.stat().st_size for p in disk.rglob("*") if p.is_file())
    assert 0 < held <= 9 * MiB


@pytest.mark.parametrize("problem", ["others_write", "symlink_elsewhere", "another_owner"])
def test_a_disk_cache_others_control_is_refused(server, tmp_path, problem):
    from tensorfs.errors import ModelError

    nginx, _ = server
    disk = tmp_path / "cache"
    if problem == "others_write":
        disk.mkdir(mode=0o700)
        disk.chmod(0o777)
    elif problem == "symlink_elsewhere":
        target = tmp_path / "shared"
        target.mkdir()
        target.chmod(0o777)
        disk.symlink_to(target)
    else:
        if os.geteuid() != 0:
            pytest.skip("needs root to give the directory to another user")
        disk.mkdir(mode=0o700)
        os.chown(disk, 65534, 65534)
    with pytest.raises(ModelError) as refused:
        _open(nginx, tmp_path, disk_cache=(str(disk), 64 * MiB))
    assert str(disk) in str(refused.value)


def test_a_long_header_is_fetched_with_at_most_1_mib_more(server, tmp_path):
    """A GGUF whose vocabulary makes a header of megabytes: the loader's growing prefix
    reads the header and at most 1 MiB past it (docs/reference/remote.md), in a few requests."""
    import gguf

    from tensorfs.loading.loader import load_model
    from tensorfs.sources.remote import RemoteSettings
    from tests.support.models import finish_gguf

    nginx, _ = server
    path = tmp_path / "vocab.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_array("tokenizer.ggml.tokens", [f"token-{i:06d}" for i in range(300_000)])
    finish_gguf(writer, {"w": np.arange(6 * MiB // 4, dtype=np.float32)})
    url = nginx.put("files/vocab.gguf", path)
    mark = nginx.log_mark()
    model = load_model(url, RemoteSettings())
    try:
        header = model.files[0].header_size
        assert header > 4 * MiB
        fetched = sum(r["bytes"] for r in nginx.wait_quiet(mark, quiet=0.2))
        assert header <= fetched <= header + MiB
        assert len(model.metadata["tokenizer.ggml.tokens"].value()) == 300_000
    finally:
        model.close()


def test_in_a_mount_served_blocks_leave_memory_and_a_held_block_never_changes(server, tmp_path):
    """A mount (``start``) lets a block go once FUSE served all of it; a block someone still
    holds keeps its bytes while later blocks are received: bytes read stay the file's."""
    from tensorfs.cache import ByteLRU
    from tensorfs.sources import blockcache

    nginx, local = server
    # a small cache: one block of read-ahead, so blocks are received after the held one
    model, source, tensors = _open(nginx, tmp_path, cache=ByteLRU(16 * MiB))
    data = local.read_bytes()
    block = blockcache.BLOCK_SIZE
    try:
        source.start()                          # what the mounted daemon does
        big = tensors["big"]
        index = big.offset // block + 1         # a block wholly inside the tensor
        source.blocks.exact_reads = False       # a block, not just the byte...
        source.read(index * block, 1)           # fetched and kept...
        source.blocks.exact_reads = True
        held = source.blocks.memory.lookup((source.blocks.key, index))
        assert held is not None
        for pos in range(big.offset, big.offset + big.nbytes, MiB):
            n = min(MiB, big.offset + big.nbytes - pos)
            assert source.read(pos, n) == data[pos:pos + n]
        # ...still the block's bytes after every later block was received
        assert bytes(held) == data[index * block:(index + 1) * block]
        # served in full: no longer in memory (the kernel's page cache has them)
        inner = range(big.offset // block + 1, (big.offset + big.nbytes) // block)
        assert all(source.blocks.memory.lookup((source.blocks.key, i)) is None for i in inner)
    finally:
        model.close()


def _fetched(nginx, mark) -> int:
    return sum(r["bytes"] for r in nginx.wait_quiet(mark, quiet=0.2) if r["method"] == "GET")


@pytest.mark.parametrize("piece", [MiB, 128 << 10], ids=["one-read", "kernel-sized-reads"])
def test_random_readers_fetch_at_most_twice_what_they_ask_for(server, tmp_path, piece):
    """1 MiB reads at random places (as one read, or as the kernel sends it: a run of
    128 KiB reads): what is fetched stays within 2x what was read, every byte right."""
    nginx, local = server
    model, source, tensors = _open(nginx, tmp_path)
    data = local.read_bytes()
    rng = np.random.default_rng(3)
    try:
        big = tensors["big"]
        mark = nginx.log_mark()
        asked = 0
        for _ in range(8):          # a few: 4 MiB per read would not reach the whole tensor
            at = big.offset + int(rng.integers(0, (big.nbytes - MiB) // 4096)) * 4096
            for pos in range(at, at + MiB, piece):
                assert source.read(pos, piece) == data[pos:pos + piece]
                asked += piece
        assert 0 < _fetched(nginx, mark) <= 2 * asked
    finally:
        model.close()


def test_a_sequential_reader_still_makes_whole_block_requests(server, tmp_path):
    """An mmap'd load's page faults in order (1 MiB at a time): after its first MiB the
    reader is sequential, and the tensor is fetched in whole blocks, about once."""
    nginx, local = server
    model, source, tensors = _open(nginx, tmp_path)
    data = local.read_bytes()
    try:
        big = tensors["big"]
        mark = nginx.log_mark()
        for pos in range(big.offset, big.offset + big.nbytes, MiB):
            n = min(MiB, big.offset + big.nbytes - pos)
            assert source.read(pos, n) == data[pos:pos + n]
        gets = [r for r in nginx.wait_quiet(mark, quiet=0.2) if r["method"] == "GET"]
        whole = [r for r in gets if r["bytes"] == 4 * MiB]
        assert len(whole) >= big.nbytes // (4 * MiB) - 1
        assert sum(r["bytes"] for r in gets) <= big.nbytes + 2 * 4 * MiB
    finally:
        model.close()



def test_the_header_the_mount_parsed_is_not_fetched_again(server, tmp_path):
    """The header (what a reader of files/ or header.bin reads first) comes from the probe
    that read it at mount, not from another request."""
    nginx, local = server
    model, source, _ = _open(nginx, tmp_path)
    try:
        header = model.files[0].header_size
        mark = nginx.log_mark()
        assert source.read(0, header) == local.read_bytes()[:header]
        assert _gets(nginx, mark) == []
        assert source.read(0, 4096) == local.read_bytes()[:4096]    # the rest: its bytes only
        assert _gets(nginx, mark) == [(header, 4095)]
    finally:
        model.close()
