"""The disk cache's cost per block (issue 21): ``DiskCache.put`` and ``get_into`` of 4 MiB
blocks (header, SHA-256, link, ledger under flock) against the plain file write and read of
the same bytes in the same directory, in the same run (ratios, not absolute figures).

    python bench/rows/diskcache.py [--blocks 64] [--repeat 3] [--dir DIR]

D1  put: a 4 MiB block kept (checksum, write, link, ledger) vs write+rename of the bytes
D2  get_into: a 4 MiB block served (read, header and checksum verified) vs pread of the bytes
The page cache holds the files (what a second mount of a recent model finds); the ratio
is the checksum's and the bookkeeping's share.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from tensorfs.sources.diskcache import DiskCache  # noqa: E402 (after the sys.path line above)

BLOCK = 4 << 20


def best(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        os.sync()                   # no writeback of the last run's pages during this one
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--blocks", type=int, default=64)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--dir", default=None)
    args = parser.parse_args()
    base = Path(tempfile.mkdtemp(prefix="bench-diskcache-", dir=args.dir))
    data = [os.urandom(BLOCK) for _ in range(4)]
    n = args.blocks
    plain = base / "plain"
    plain.mkdir()
    cache = DiskCache(str(base / "cache"), 4 * (args.repeat + 2) * n * BLOCK)   # no eviction
    round_ = [0]

    def put_cache():
        round_[0] += 1
        key = DiskCache.object_key("http://127.0.0.1/bench", f"v{round_[0]}", BLOCK)
        for i in range(n):
            cache.put(key, i, data[i % 4])

    def put_plain():
        round_[0] += 1
        for i in range(n):          # fresh names, as the cache's: the same dirty pages
            tmp = plain / f".{round_[0]}.{i}.tmp"
            with open(tmp, "wb") as f:
                f.write(data[i % 4])
            os.rename(tmp, plain / f"{round_[0]}.{i}")

    buf = bytearray(BLOCK)
    key_read = DiskCache.object_key("http://127.0.0.1/bench", "read", BLOCK)
    for i in range(n):
        cache.put(key_read, i, data[i % 4])
    put_plain()                     # round 1: what get_plain reads

    def get_cache():
        for i in range(n):
            assert cache.get_into(key_read, i, buf)

    def get_plain():
        for i in range(n):
            fd = os.open(plain / f"1.{i}", os.O_RDONLY)
            try:
                os.preadv(fd, [buf], 0)
            finally:
                os.close(fd)

    mib = n * BLOCK / (1 << 20)
    rows = []
    for name, ours, theirs in (("D1 put", put_cache, put_plain), ("D2 get_into", get_cache, get_plain)):
        t_plain, t_ours = float("inf"), float("inf")
        for _ in range(args.repeat):            # alternated: the same load for both
            t_plain = min(t_plain, best(theirs, 1))
            t_ours = min(t_ours, best(ours, 1))
        rows.append((name, mib / t_ours, mib / t_plain, t_plain / t_ours))
    print(f"{n} blocks of 4 MiB, best of {args.repeat}, load {os.getloadavg()[0]:.1f}, "
          f"{os.cpu_count()} CPUs, {base}")
    print("| row | disk cache MiB/s | plain file MiB/s | ratio |")
    print("|---|---|---|---|")
    for name, ours, theirs, ratio in rows:
        print(f"| {name} | {ours:.0f} | {theirs:.0f} | {ratio:.2f} |")
    cache.close()
    import shutil

    shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
