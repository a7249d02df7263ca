"""The worker pool, measured two ways.

    python bench/rows/worker_pool.py mount [--mib 64] [--repeat 5] [--types Q4_K,Q8_0]
    python bench/rows/worker_pool.py convert [--model M.gguf] [--types Q4_K,Q8_0] [--workers 1,2] [--repeat 3]

``mount`` (goal T4, issue 23): what a user sees.  Each figure is one fresh process: gguf-py's
``GGUFReader`` + ``gguf.quants.dequantize`` of the tensor (the dequantize call timed), and
``numpy.load`` of the tensor's ``.npy`` view on a fresh ``tensorfs mount`` (the load timed;
the mount is made just before, as a user would, with the model file in the page cache), with
the default options and with ``--workers 0``.  Then one and two readers at once (two fresh
processes, each loading its own Q4_K view, started together; aggregate MB/s).  The variants
take turns, best of ``--repeat``; the ratios are of the same run.

``convert``: conversion throughput in one process, no FUSE: in-thread vs the worker pool
(tensorfs.convert.workers), MB/s of float32 output, a whole tensor converted in 1 MiB chunks.
Variants, per type:

* ``thread xN``: N threads of this process convert chunks (as ``--workers 0`` does);
* ``pool W``: W worker processes, W+1 threads submitting (as the read-ahead does), the daemon
  reading each chunk's stored bytes into the arena (``source.read_into``, as served);
* ``pool W, no read``: the same with the stored bytes left where they are: the most that
  reading in the workers instead (their own ``pread``) could gain;
* ``pread us``: the daemon's read of one chunk's stored bytes into the arena, per chunk;
  ``convert us``: one chunk's conversion in-thread.

The ``convert`` model defaults to bench/run.py's row 4 model (build it with ``bench/run.py
--rows converted``); ``mount`` writes its own (build/bench/models/t4-MIB.gguf).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))   # bench/
sys.path.insert(0, os.path.dirname(HERE))

from tensorfs.convert import conversion_for  # noqa: E402 (after the sys.path line above)
from tensorfs.convert.workers import WorkerPool  # noqa: E402 (after the sys.path line above)
from tensorfs.loading.loader import load_model  # noqa: E402 (after the sys.path line above)
from tensorfs.sources.local import ModelSource  # noqa: E402 (after the sys.path line above)
from tensorfs.views.byteviews import CHUNK_OUTPUT_BYTES  # noqa: E402 (after the sys.path line above)


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
        fill = (lambda buf: source.read_into(offset, buf)) if read else (lambda buf: None)
        pool.convert(conv, fill, n_in, n_out).release()
    t0 = time.perf_counter()
    with ThreadPoolExecutor(pool.size + 1) as ex:
        list(ex.map(one, work))
    return time.perf_counter() - t0



# -- mount: goal T4 ----------------------------------------------------------------------------

MiB = 1 << 20

_GGUF_PY = """
import sys, time, numpy as np, gguf, gguf.quants
reader = gguf.GGUFReader(sys.argv[1])
t = next(t for t in reader.tensors if t.name == sys.argv[2])
rows = np.array(t.data)
with np.errstate(all="ignore"):
    t0 = time.monotonic()
    out = gguf.quants.dequantize(rows, t.tensor_type)
    t1 = time.monotonic()
print(out.nbytes, t0, t1)
"""

_LOAD = """
import mmap, os, sys, time, numpy as np
sys.stdout.write("ready\\n"); sys.stdout.flush()
sys.stdin.readline()
t0 = time.monotonic()
if sys.argv[2] == "load":
    n = np.load(sys.argv[1]).nbytes
else:                      # O_DIRECT 1 MiB reads: the daemon's rate, no page cache
    buf, n = mmap.mmap(-1, 1 << 20), 0
    fd = os.open(sys.argv[1], os.O_RDONLY | os.O_DIRECT)
    while (got := os.readv(fd, [buf])):
        n += got
t1 = time.monotonic()
print(n, t0, t1)
"""

# The daemon's part alone: the view read in 1 MiB steps in one process, no FUSE, no kernel.
_IN_PROCESS = """
import sys, time, numpy as np
from tensorfs.budget import MemoryBudget
from tensorfs.loading.loader import load_model
from tensorfs.mount.tree import build_mount
m = build_mount(load_model(sys.argv[1]), MemoryBudget(256 << 20), workers=0)
view = m.tree.lookup("/" + sys.argv[2]).view
buf = memoryview(bytearray(1 << 20))
t0 = time.monotonic()
n = 0
while (got := view.read_into(n, buf)):
    n += got
t1 = time.monotonic()
print(n, t0, t1)
"""


def t4_model(workdir: str, mib: int, types: list[str]) -> str:
    """One tensor of each type, an F32 one (the transport's ceiling) and two more Q4_K ones
    (the two readers), ``mib`` MiB of float32 each, written by gguf-py's writer (bench/run.py's
    helpers)."""
    sys.path.insert(0, HERE)
    from rows.models import _blocks, _cached, _write_gguf

    path = os.path.join(workdir, "models", f"t4-{mib}-{'-'.join(types)}-F32.gguf")
    os.makedirs(os.path.dirname(path), exist_ok=True)

    def build(tmp):
        rng = np.random.default_rng(23)
        tensors = {f"one.{q}.weight": (q, _blocks(q, mib * MiB, rng)) for q in types}
        tensors["one.F32.weight"] = ("F32", rng.random(mib * MiB // 4, dtype=np.float32).reshape(-1, 4096))
        for i in range(2):
            tensors[f"two.{i}.weight"] = ("Q4_K", _blocks("Q4_K", mib * MiB, rng))
        _write_gguf(tmp, tensors)

    return _cached(path, build)


def _in_page_cache(path: str) -> None:
    with open(path, "rb") as f:
        while f.read(8 * MiB):
            pass


def gguf_py_once(model: str, name: str) -> tuple[int, float]:
    done = subprocess.run([sys.executable, "-c", _GGUF_PY, model, name], capture_output=True,
                          text=True, check=True)
    n, t0, t1 = done.stdout.split()
    return int(n), float(t1) - float(t0)


def mounted_loads(model: str, views: list[str], options: list[str], workdir: str,
                  how: str = "load", ready: bool = False) -> tuple[int, float]:
    """A fresh mount, then one fresh process per view, all loading at once once every one
    has started: (bytes, wall seconds from the first start to the last end).  ``ready``:
    the readers start once the mount's conversion workers are ready."""
    mnt = tempfile.mkdtemp(prefix="t4-", dir=workdir)
    env = dict(os.environ, PYTHONPATH=os.path.dirname(HERE))
    log = mnt + ".log"
    subprocess.run([sys.executable, "-m", "tensorfs", "mount", model, mnt, *options,
                    "--log", log], check=True, env=env, capture_output=True)
    try:
        if ready:
            deadline = time.monotonic() + 60
            while "conversion workers ready" not in open(log).read():
                if time.monotonic() > deadline:
                    raise RuntimeError("the conversion workers did not start")
                time.sleep(0.01)
        procs = [subprocess.Popen([sys.executable, "-c", _LOAD, os.path.join(mnt, v), how],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
                 for v in views]
        for p in procs:
            assert p.stdout.readline() == "ready\n"
        for p in procs:
            p.stdin.write("go\n")
            p.stdin.flush()
        results = [p.communicate()[0].split() for p in procs]
        if any(p.returncode for p in procs):
            raise RuntimeError("a reader failed")
    finally:
        subprocess.run([sys.executable, "-m", "tensorfs", "unmount", mnt], env=env,
                       capture_output=True)
        os.rmdir(mnt)
        os.unlink(log)
    total = sum(int(r[0]) for r in results)
    return total, max(float(r[2]) for r in results) - min(float(r[1]) for r in results)


def in_process(model: str, view: str) -> tuple[int, float]:
    done = subprocess.run([sys.executable, "-c", _IN_PROCESS, model, view], capture_output=True,
                          text=True, check=True, env=dict(os.environ, PYTHONPATH=os.path.dirname(HERE)))
    n, t0, t1 = done.stdout.split()
    return int(n), float(t1) - float(t0)


def mount_main(a) -> int:
    types = a.types.split(",")
    model = t4_model(a.workdir, a.mib, types)
    _in_page_cache(model)
    w = ["--workers", "0"]
    pool = ["--workers", str(a.pool)]
    variants = {}
    for q in types:
        view = f"one/{q}/weight.npy"
        variants[f"{q} gguf-py"] = lambda q=q: gguf_py_once(model, f"one.{q}.weight")
        variants[f"{q} default"] = lambda v=view: mounted_loads(model, [v], [], a.workdir)
        variants[f"{q} --workers 0"] = lambda v=view: mounted_loads(model, [v], w, a.workdir)
        variants[f"{q} {' '.join(pool)}, started ahead"] = \
            lambda v=view: mounted_loads(model, [v], pool, a.workdir)
        variants[f"{q} {' '.join(pool)}, ready"] = \
            lambda v=view: mounted_loads(model, [v], pool, a.workdir, ready=True)
        variants[f"{q} O_DIRECT, --workers 0"] = \
            lambda v=view: mounted_loads(model, [v], w, a.workdir, how="direct")
        variants[f"{q} in one process, no FUSE"] = lambda v=view: in_process(model, v)
    variants["F32 (no conversion)"] = \
        lambda: mounted_loads(model, ["one/F32/weight.npy"], w, a.workdir)
    two = ["two/0/weight.npy", "two/1/weight.npy"]
    for label, opts in (("default", []), ("--workers 0", w), (" ".join(pool) + ", ready", pool)):
        ready = opts is pool
        variants[f"one reader, {label}"] = \
            lambda o=opts, r=ready: mounted_loads(model, two[:1], o, a.workdir, ready=r)
        variants[f"two readers, {label}"] = \
            lambda o=opts, r=ready: mounted_loads(model, two, o, a.workdir, ready=r)
    load = os.getloadavg()[0]
    t_start = time.time()
    times: dict[str, list] = {k: [] for k in variants}
    for _ in range(a.repeat):
        for k, fn in variants.items():          # interleaved: load changes hit all alike
            times[k].append(fn())
    best = {k: max(n / t / 1e6 for n, t in v) for k, v in times.items()}
    spread = {k: max(t for _, t in v) / min(t for _, t in v) for k, v in times.items()}
    print(f"{time.strftime('%Y-%m-%d %H:%M', time.gmtime(t_start))}-"
          f"{time.strftime('%H:%M UTC', time.gmtime())}; CPUs {len(os.sched_getaffinity(0))}; "
          f"load average {load:.2f} before, {os.getloadavg()[0]:.2f} after; {a.mib} MiB views; "
          f"best of {a.repeat} (spread: worst/best time)")
    print("| figure | MB/s (best) | spread | ratio |")
    print("|---|---:|---:|---|")

    def row(k, ratio=""):
        print(f"| {k} | {best[k]:,.0f} | {spread[k]:.2f} | {ratio} |")

    for q in types:
        ref = best[f"{q} gguf-py"]
        row(f"{q} gguf-py")
        for k in [k for k in variants if k.startswith(q + " ") and k != f"{q} gguf-py"]:
            extra = (f"; {best[k] / best[f'{q} --workers 0']:.2f} of `--workers 0`"
                     if k == f"{q} default" else "")
            row(k, f"{best[k] / ref:.2f} of gguf-py{extra}")
    row("F32 (no conversion)", "the transport's ceiling: " + ", ".join(
        f"{best['F32 (no conversion)'] / best[f'{q} gguf-py']:.2f} of {q} gguf-py" for q in types))
    for label in ("default", "--workers 0", " ".join(pool) + ", ready"):
        row(f"one reader, {label}")
        row(f"two readers, {label}", f"{best[f'two readers, {label}'] / best[f'one reader, {label}']:.2f} of one")
    return 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="mode", required=True)
    m = sub.add_parser("mount", help="goal T4: fresh mounts, fresh processes")
    m.add_argument("--mib", type=int, default=64, help="float32 MiB of each view")
    m.add_argument("--types", default="Q4_K,Q8_0")
    m.add_argument("--repeat", type=int, default=5)
    m.add_argument("--pool", type=int, default=2, help="the --workers N variants")
    m.add_argument("--workdir", default=os.path.join(os.path.dirname(HERE), "build", "bench"))
    c = sub.add_parser("convert", help="in one process, no FUSE")
    c.add_argument("--model", default=os.path.join(os.path.dirname(HERE), "build", "bench", "models",
                                                   "conv-256-64.gguf"))
    c.add_argument("--types", default="Q4_K,Q6_K,Q8_0,Q4_0")
    c.add_argument("--workers", default="1,2")
    c.add_argument("--repeat", type=int, default=3)
    a = p.parse_args()
    return mount_main(a) if a.mode == "mount" else convert_main(a)


def convert_main(a) -> int:
    model = load_model(a.model)
    source = ModelSource(model.files[0].path, model.files[0].file_size)
    pools = {}
    for w in map(int, a.workers.split(",")):
        pools[w] = WorkerPool(w, CHUNK_OUTPUT_BYTES)
        pools[w].start(ahead=True)
    for pool in pools.values():
        assert pool.wait_ready(60)
    print(f"load average {os.getloadavg()[0]:.2f}; CPUs {len(os.sched_getaffinity(0))}; "
          f"best of {a.repeat} (spread: worst/best)")
    print("| type | variant | MB/s (best) | spread |")
    print("|---|---|---:|---:|")
    for name in a.types.split(","):
        tensor = next(t for t in model.tensors if t.dtype == name)      # the first: conv.*
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
