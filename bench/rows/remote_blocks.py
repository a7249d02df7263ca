"""Block size of the remote block cache, and fsspec's own file caches, against Debian's nginx
on 127.0.0.1 (tests/support/servers.py), directly and through a proxy adding 20 ms of round trip.

For each block size (1, 2, 4, 8 MiB): a sequential read of a 256 MiB tensor in 1 MiB reads
(what the kernel asks of a FUSE mount with its 1 MiB read-ahead), and 200 random 4 KiB reads
in it; MB/s, reads/s, requests and bytes fetched.  Then fsspec's HTTPFile with each of its
caches ("readahead", "blockcache", "bytes", "first"; block_size 4 MiB) on the same sequential
read: its MB/s, requests and bytes fetched (nginx's access log).  And curl of the whole range,
one stream: the reference.

    .venv/bin/python bench/rows/remote_blocks.py [--rtt 0.02] [--sizes 1,2,4,8]
"""

from __future__ import annotations

import argparse
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import numpy as np

MiB = 1 << 20


def _requests(nginx, mark):
    log = nginx.wait_quiet(mark, quiet=0.3)
    return len(log), sum(r["bytes"] for r in log)


def bench_blocks(nginx, url, block: int, rnd: random.Random) -> dict:
    from tensorfs.cache import ByteLRU
    from tensorfs.loading.loader import load_model
    from tensorfs.sources import blockcache
    from tensorfs.sources.remote import RemoteSettings

    blockcache.BLOCK_SIZE = block
    model = load_model(url, RemoteSettings(cache=ByteLRU(256 * MiB), timeout=60))
    try:
        source = next(iter(model.sources.values()))
        t = max(model.tensors, key=lambda t: t.nbytes)
        mark = nginx.log_mark()
        buf = bytearray(MiB)
        start = time.perf_counter()
        for pos in range(t.offset, t.offset + t.nbytes, MiB):
            n = min(MiB, t.offset + t.nbytes - pos)
            source.read_into(pos, memoryview(buf)[:n])
        seq_s = time.perf_counter() - start
        seq_req, seq_bytes = _requests(nginx, mark)
    finally:
        model.close()
    model = load_model(url, RemoteSettings(cache=ByteLRU(256 * MiB), timeout=60))
    try:
        source = next(iter(model.sources.values()))
        t = max(model.tensors, key=lambda t: t.nbytes)
        mark = nginx.log_mark()
        offsets = [t.offset + rnd.randrange(0, t.nbytes - 4096) for _ in range(200)]
        start = time.perf_counter()
        for off in offsets:
            source.read(off, 4096)
        rnd_s = time.perf_counter() - start
        rnd_req, rnd_bytes = _requests(nginx, mark)
    finally:
        model.close()
    return {"seq_MBps": t.nbytes / seq_s / 1e6, "seq_requests": seq_req,
            "seq_fetched_MiB": seq_bytes / MiB, "rand_reads_per_s": 200 / rnd_s,
            "rand_requests": rnd_req, "rand_fetched_MiB": rnd_bytes / MiB}


def bench_fsspec(nginx, url, cache_type: str, offset: int, nbytes: int) -> dict:
    import fsspec

    fs = fsspec.filesystem("http", skip_instance_cache=True)
    mark = nginx.log_mark()
    start = time.perf_counter()
    with fs.open(url, "rb", block_size=4 * MiB, cache_type=cache_type) as f:
        for pos in range(offset, offset + nbytes, MiB):
            f.seek(pos)
            f.read(min(MiB, offset + nbytes - pos))
    took = time.perf_counter() - start
    req, fetched = _requests(nginx, mark)
    return {"seq_MBps": nbytes / took / 1e6, "requests": req, "fetched_MiB": fetched / MiB}


def bench_curl(url, offset, nbytes) -> float:
    start = time.perf_counter()
    subprocess.run(["curl", "-s", "-o", "/dev/null", "-r", f"{offset}-{offset + nbytes - 1}", url],
                   check=True)
    return nbytes / (time.perf_counter() - start) / 1e6


def main() -> None:
    from tensorfs.sources.transports.objects import serve_here

    serve_here()        # this process never forks: obstore runs here, not in a helper
    from safetensors.numpy import save_file

    from tests.support.servers import Nginx, Proxy

    parser = argparse.ArgumentParser()
    parser.add_argument("--rtt", type=float, default=0.0, help="seconds of added round trip")
    parser.add_argument("--sizes", default="1,2,4,8", help="block sizes in MiB")
    parser.add_argument("--runs", type=int, default=2)
    args = parser.parse_args()

    base = Path(tempfile.mkdtemp(prefix="tensorfs-bench-blocks-"))
    nginx = Nginx(base / "srv", workers=2).start()
    proxy = None
    try:
        local = base / "big.safetensors"
        save_file({"norm": np.ones(64, np.float32),
                   "big": np.random.default_rng(0).standard_normal(64 * MiB).astype(np.float32)},
                  str(local))
        url = nginx.put("files/big.safetensors", local)
        if args.rtt:
            proxy = Proxy(nginx.port, rtt=args.rtt).start()
            url = url.replace(nginx.url, proxy.url)
        from tensorfs.loading.loader import load_model
        from tensorfs.sources.remote import RemoteSettings

        model = load_model(url, RemoteSettings())
        t = max(model.tensors, key=lambda t: t.nbytes)
        model.close()
        print(f"# rtt {args.rtt * 1000:.0f} ms, tensor {t.nbytes // MiB} MiB, {args.runs} runs (best)")
        curl = max(bench_curl(url, t.offset, t.nbytes) for _ in range(args.runs))
        print(f"curl, one stream: {curl:.0f} MB/s")
        rnd = random.Random(1)
        print("| block | sequential MB/s | vs curl | requests | fetched MiB | random 4 KiB reads/s | "
              "random: fetched MiB |")
        print("|---|---|---|---|---|---|---|")
        for size in [int(s) for s in args.sizes.split(",")]:
            runs = [bench_blocks(nginx, url, size * MiB, rnd) for _ in range(args.runs)]
            best = max(runs, key=lambda r: r["seq_MBps"])
            fastest_rand = max(r["rand_reads_per_s"] for r in runs)
            print(f"| {size} MiB | {best['seq_MBps']:.0f} | {best['seq_MBps'] / curl:.2f} | "
                  f"{best['seq_requests']} | {best['seq_fetched_MiB']:.0f} | {fastest_rand:.0f} | "
                  f"{best['rand_fetched_MiB']:.0f} |")
        print()
        print("| fsspec cache_type (block_size 4 MiB) | sequential MB/s | requests | fetched MiB |")
        print("|---|---|---|---|")
        for cache_type in ("readahead", "blockcache", "bytes", "first"):
            r = max((bench_fsspec(nginx, url, cache_type, t.offset, t.nbytes)
                     for _ in range(args.runs)), key=lambda r: r["seq_MBps"])
            print(f"| {cache_type} | {r['seq_MBps']:.0f} | {r['requests']} | {r['fetched_MiB']:.0f} |")
    finally:
        if proxy is not None:
            proxy.stop()
        nginx.stop()
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
