"""Conversion throughput in one process, no FUSE: in-thread vs the worker pool
(tensorfs.workers), MB/s of float32 output, a whole tensor converted in 1 MiB chunks.

    python bench/bench_workers.py [--model M.gguf] [--types Q4_K,Q8_0] [--workers 1,2] [--repeat 3]

Variants, per type:

* ``thread xN``: N threads of this process convert chunks (as ``--workers 0`` does);
* ``pool W``: W worker processes, W+1 threads submitting (as the read-ahead does), the daemon
  reading each chunk's stored bytes into the arena (``source.read_into``, as served);
* ``pool W, no read``: the same with the stored bytes left where they are: the most that
  reading in the workers instead (their own ``pread``) could gain;
* ``pread us``: the daemon's read of one chunk's stored bytes into the arena, per chunk;
  ``convert us``: one chunk's conversion in-thread.

The model defaults to bench/run.py's row 4 model (build it with ``bench/run.py --rows converted``).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from tensorfs.convert import conversion_for          # noqa: E402
from tensorfs.loader import load_model               # noqa: E402
from tensorfs.source import ModelSource              # noqa: E402
from tensorfs.views import CHUNK_OUTPUT_BYTES        # noqa: E402
from tensorfs.workers import WorkerPool              # noqa: E402


def chunks(tensor, conv):
    per = CHUNK_OUTPUT_BYTES // (conv.block_elems * 4)
    n_blocks = tensor.nbytes // conv.block_bytes
    for first in range(0, n_blocks, per):
        count = min(per, n_blocks - first)
        yield tensor.offset + first * conv.block_bytes, count * conv.block_bytes, count * conv.block_elems * 4


def in_threads(source, conv, work, n_threads):
    def run(part):
        scratch = bytearray(CHUNK_OUTPUT_BYTES)
        out = np.empty(CHUNK_OUTPUT_BYTES // 4, dtype=np.float32)
        for offset, n_in, n_out in part:
            source.read_into(offset, memoryview(scratch)[:n_in])
            conv.convert(np.frombuffer(scratch, np.uint8, n_in), out=out[:n_out // 4])
    parts = [work[i::n_threads] for i in range(n_threads)]
    t0 = time.perf_counter()
    with ThreadPoolExecutor(n_threads) as ex:
        list(ex.map(run, parts))
    return time.perf_counter() - t0


def in_pool(pool, source, conv, work, read=True):
    def one(item):
        offset, n_in, n_out = item
        slot = pool.take_slot()
        try:
            fill = (lambda buf: source.read_into(offset, buf)) if read else (lambda buf: None)
            pool.convert(conv, fill, n_in, slot, n_out)
        finally:
            pool.give_slot(slot)
    t0 = time.perf_counter()
    with ThreadPoolExecutor(pool.read_ahead_chunks) as ex:
        list(ex.map(one, work))
    return time.perf_counter() - t0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default=os.path.join(os.path.dirname(HERE), "build", "bench", "models",
                                                   "conv-256-64.gguf"))
    p.add_argument("--types", default="Q4_K,Q6_K,Q8_0,Q4_0")
    p.add_argument("--workers", default="1,2")
    p.add_argument("--repeat", type=int, default=3)
    a = p.parse_args()
    model = load_model(a.model)
    source = ModelSource(model.files[0].path, model.files[0].file_size)
    pools = {}
    for w in map(int, a.workers.split(",")):
        pools[w] = WorkerPool(w, 64 << 20)
        pools[w].start()
    for w, pool in pools.items():          # wait until every worker has answered once
        t = next(t for t in model.tensors if t.dtype == "Q8_0")
        in_pool(pool, source, conversion_for(t), list(chunks(t, conversion_for(t)))[:4 * w])
    print(f"load average {os.getloadavg()[0]:.2f}; CPUs {len(os.sched_getaffinity(0))}; "
          f"best of {a.repeat} (spread: worst/best)")
    print("| type | variant | MB/s (best) | spread |")
    print("|---|---|---:|---:|")
    for name in a.types.split(","):
        tensor = next(t for t in model.tensors if t.dtype == name and t.name.startswith("conv."))
        conv = conversion_for(tensor)
        work = list(chunks(tensor, conv))
        out_bytes = sum(c[2] for c in work)
        variants = {"thread x1": lambda: in_threads(source, conv, work, 1),
                    "thread x2": lambda: in_threads(source, conv, work, 2)}
        for w, pool in pools.items():
            variants[f"pool {w}"] = lambda pool=pool: in_pool(pool, source, conv, work)
            variants[f"pool {w}, no read"] = lambda pool=pool: in_pool(pool, source, conv, work, False)
        times = {k: [] for k in variants}
        for _ in range(a.repeat):
            for k, fn in variants.items():      # interleaved: load changes hit all alike
                times[k].append(fn())
        for k, ts in times.items():
            print(f"| {name} | {k} | {out_bytes / min(ts) / 1e6:,.0f} | {max(ts) / min(ts):.2f} |")
        buf = bytearray(CHUNK_OUTPUT_BYTES)
        out = np.empty(CHUNK_OUTPUT_BYTES // 4, dtype=np.float32)
        reads, convs = [], []
        for offset, n_in, n_out in work[:64]:
            t0 = time.perf_counter()
            source.read_into(offset, memoryview(buf)[:n_in])
            t1 = time.perf_counter()
            conv.convert(np.frombuffer(buf, np.uint8, n_in), out=out[:n_out // 4])
            reads.append(t1 - t0)
            convs.append(time.perf_counter() - t1)
        print(f"| {name} | pread us / convert us per chunk (median) | "
              f"{np.median(reads) * 1e6:.0f} / {np.median(convs) * 1e6:.0f} | |")
    for pool in pools.values():
        pool.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
