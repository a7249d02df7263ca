"""8 processes reading random ranges of random files of one mount for 30 s (issue 5).

Raw files and .npy views of every kind — native (F32, F16) and converted (Q8_0, Q4_K, BF16)
— each byte compared with what it must be: the model's bytes for raw files, and for .npy
views ``numpy.save`` of the oracle's values (``gguf.quants.dequantize``; the BF16 shift).
Readers drop the kernel's cached pages of their files now and then
(``POSIX_FADV_DONTNEED``), so the reads keep reaching the daemon instead of the page cache.

Meanwhile the daemon's anonymous RSS (``RssAnon`` in /proc/PID/status) is sampled: it must
stay within ``--cache-size`` plus a fixed overhead.  The converted views total 43 MiB, well
over the 16 MiB cache, so the cache evicts all the time.

``TENSORFS_CONCURRENCY_S`` changes the 30 s.
"""

from __future__ import annotations

import multiprocessing
import os
import random
import time

import pytest

from tests.support import fuse_mounts_under
from tests.support.reliability_models import alive, daemon_pid, npy_bytes, write_mixed_gguf

pytestmark = pytest.mark.slow     # every test here runs for seconds

DURATION_S = float(os.environ.get("TENSORFS_CONCURRENCY_S", "30"))
READERS = 8
CACHE_SIZE = int(os.environ.get("TENSORFS_CONCURRENCY_CACHE", 16 << 20))
# What the daemon holds besides the cache: the interpreter with numpy and gguf-py loaded,
# libfuse's threads and their buffers, the converted chunks in flight and the recycled
# chunk buffers (docs/internals/reliability.md has the measured figures).
FIXED_OVERHEAD = 128 << 20


def _rss_anon(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no RssAnon")


def _reader(index: int, mnt: str, files: dict, deadline: float, queue) -> None:
    rng = random.Random(index)
    names = sorted(files)
    fds = {name: os.open(os.path.join(mnt, name), os.O_RDONLY) for name in names}
    stats = {"reads": 0, "bytes": 0, "mismatches": 0, "errors": 0, "first_bad": None}
    try:
        while time.monotonic() < deadline:
            name = rng.choice(names)
            want = files[name]
            kind = rng.random()
            if kind < 0.3:                  # small, anywhere
                size = rng.randint(1, 4096)
            elif kind < 0.8:                # a few kernel requests
                size = rng.randint(1, 512 << 10)
            else:                           # big, crossing converted chunks
                size = rng.randint(1 << 20, 3 << 20)
            offset = rng.randrange(len(want))
            if rng.random() < 0.3:
                offset -= offset % 4096
            try:
                got = os.pread(fds[name], size, offset)
            except OSError as error:
                stats["errors"] += 1
                stats["first_bad"] = stats["first_bad"] or (name, offset, size, repr(error))
                continue
            stats["reads"] += 1
            stats["bytes"] += len(got)
            if got != want[offset:offset + size]:
                stats["mismatches"] += 1
                stats["first_bad"] = stats["first_bad"] or (name, offset, size, "mismatch")
            if rng.random() < 0.05:
                os.posix_fadvise(fds[name], 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        for fd in fds.values():
            os.close(fd)
        queue.put(stats)


def test_eight_readers_for_30_seconds(tmp_path, mount, capsys):
    model = tmp_path / "model.gguf"
    exp = write_mixed_gguf(model, scale=8)
    files = {}
    for t in exp.values():
        files[t.path] = t.raw
        files[t.path + ".npy"] = npy_bytes(t.values)
    mnt = mount(model, "--cache-size", str(CACHE_SIZE))
    pid = daemon_pid(mnt)
    baseline = _rss_anon(pid)

    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    deadline = time.monotonic() + DURATION_S
    procs = [ctx.Process(target=_reader, args=(i, str(mnt), files, deadline, queue))
             for i in range(READERS)]
    for p in procs:
        p.start()
    peak, samples = baseline, 0
    while any(p.is_alive() for p in procs):
        peak = max(peak, _rss_anon(pid))
        samples += 1
        time.sleep(0.1)
    results = [queue.get(timeout=30) for _ in procs]
    for p in procs:
        p.join(10)
    after = _rss_anon(pid)

    reads = sum(r["reads"] for r in results)
    total = sum(r["bytes"] for r in results)
    mismatches = sum(r["mismatches"] for r in results)
    errors = sum(r["errors"] for r in results)
    with capsys.disabled():
        print(f"\n[concurrency] {READERS} readers x {DURATION_S:.0f} s: {reads} reads, "
              f"{total / 2**20:.0f} MiB compared, {mismatches} mismatches, {errors} errors; "
              f"daemon RssAnon {baseline / 2**20:.1f} MiB after mount, peak "
              f"{peak / 2**20:.1f} MiB ({samples} samples), {after / 2**20:.1f} MiB after; "
              f"--cache-size {CACHE_SIZE / 2**20:.0f} MiB")
    assert mismatches == 0 and errors == 0, [r["first_bad"] for r in results if r["first_bad"]]
    assert reads > 100 * READERS
    assert peak <= CACHE_SIZE + FIXED_OVERHEAD, (peak, baseline)
    assert alive(pid) and fuse_mounts_under(mnt)
