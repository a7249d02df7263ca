"""The tensorfs benchmark (issue 6): every figure is a ratio against a reference measured in
the same run, on models this script writes itself.

    python bench/run.py [--quick] [--rows 1,2,...] [--big-mib 1024] [--conv-mib 128] ...

Run by ``make bench``.  Mounts go through the real command (``python -m tensorfs mount``,
daemonized, as a user runs it); the references are a minimal fusepy passthrough
(bench/passthrough.py), the smallest C daemon serving the same tree (bench/floor/treefs.c,
row 7), a direct ``os.preadv`` of the model file, ``numpy.fromfile``,
``gguf.quants.dequantize`` / ``gguf.GGUFReader`` / ``safetensors.safe_open`` in-process, and
``ls``/``find`` over the same tree of empty files on tmpfs.  Writes ``docs/benchmarks.md``
(between the results markers; the hand-kept history below them stays) and
``docs/benchmarks.png``.

"Cold" means: the source file's pages are dropped (``echo 1 > /proc/sys/vm/drop_caches`` as
root, else ``posix_fadvise(DONTNEED)`` on the file) and the mount is fresh, so neither the
source nor the FUSE file has a cached page.  "Fresh mount" alone leaves the source in the page
cache: that isolates the daemon's own cost.  Every figure is the best of ``--repeat`` runs.
"""

from __future__ import annotations

import argparse
import datetime
import json
import mmap
import os
import platform
import re
import shutil
import subprocess
import sys
import threading
import time
from contextlib import contextmanager

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, HERE)
sys.path.insert(0, REPO)

MiB = 1 << 20
READ_BUF = 1 << 20           # what the readers ask per read(2): 1 MiB, as cp / numpy do


# --- environment ----------------------------------------------------------------------------

class Bench:
    def __init__(self, args):
        self.args = args
        self.work = os.path.abspath(args.workdir)
        self.models = os.path.join(self.work, "models")
        self.mnts = os.path.join(self.work, "mnt")
        os.makedirs(self.models, exist_ok=True)
        os.makedirs(self.mnts, exist_ok=True)
        self.env = dict(os.environ)
        self.env["PYTHONPATH"] = os.path.abspath(args.tensorfs_path or REPO)
        self.tensorfs = [sys.executable, "-m", "tensorfs"]
        self.mount_opts = [o for text in args.option for o in ("-o", text)]
        if args.workers is not None:
            self.mount_opts += ["--workers", str(args.workers)]
        self.results: dict = {}
        self.notes: list[str] = []
        self._n = 0
        self.drop_method = None

    # -- mounts ------------------------------------------------------------------------------
    def _fresh_dir(self, tag: str) -> str:
        self._n += 1
        path = os.path.join(self.mnts, f"{tag}{self._n}")
        os.makedirs(path, exist_ok=True)
        return path

    @contextmanager
    def mount(self, model: str, *extra: str, cache_size: str | None = None,
              workers_ready: str | None = None):
        """A real ``tensorfs mount``; yields (mountpoint, daemon pid, seconds until ready).
        ``workers_ready``: a quantized .npy view in the mount (one the measurement does not
        read): a read of it starts the conversion workers, and the mount is handed over
        once they are ready (the daemon converts in its own threads until then), for
        figures of the steady state."""
        mnt = self._fresh_dir("t")
        cmd = [*self.tensorfs, "mount", model, mnt, *self.mount_opts, *extra]
        if cache_size:
            cmd += ["--cache-size", cache_size]
        log = mnt + ".log"
        if workers_ready:
            cmd += ["--log", log]
        t0 = time.perf_counter()
        done = subprocess.run(cmd, env=self.env, cwd=self.work, capture_output=True, text=True)
        ready = time.perf_counter() - t0
        if done.returncode != 0:
            raise RuntimeError(f"mount failed: {' '.join(cmd)}: {done.stderr.strip()}")
        last = len(cmd) - 1 - cmd[::-1].index("--workers") if "--workers" in cmd else None
        if workers_ready and (last is None or cmd[last + 1] != "0"):
            with open(os.path.join(mnt, workers_ready), "rb") as f:
                f.read(4096)
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                with open(log, errors="replace") as f:
                    if "conversion workers ready" in f.read():
                        break
                time.sleep(0.01)
        try:
            yield mnt, self._daemon_pid(mnt), ready
        finally:
            subprocess.run([*self.tensorfs, "unmount", mnt], env=self.env, cwd=self.work, capture_output=True)
            if _mounted(mnt):
                subprocess.run(["fusermount", "-uz", mnt], capture_output=True)
            os.rmdir(mnt)
            if workers_ready and os.path.exists(log):
                os.unlink(log)

    def _daemon_pid(self, mnt: str) -> int | None:
        from tensorfs.runtime import pid_file

        for _ in range(100):
            try:
                with open(pid_file(mnt)) as f:
                    return int(f.read())
            except (OSError, ValueError):
                time.sleep(0.01)
        return None

    @contextmanager
    def foreground_daemon(self, tag: str, argv: list[str], timeout: float = 60):
        """A reference daemon that serves in the foreground, mounted at ``argv``'s mount point
        (appended here); yields the mount point, unmounts and waits for the daemon."""
        mnt = self._fresh_dir(tag)
        proc = subprocess.Popen([*argv, mnt], env=self.env, cwd=self.work)
        deadline = time.monotonic() + timeout
        while not _mounted(mnt):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{' '.join(argv)}: did not mount")
            time.sleep(0.005)
        try:
            yield mnt
        finally:
            subprocess.run(["fusermount", "-u", mnt], capture_output=True)
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            os.rmdir(mnt)

    @contextmanager
    def passthrough(self, source: str, offset: int, size: int):
        argv = [sys.executable, os.path.join(HERE, "passthrough.py"), source, str(offset), str(size)]
        with self.foreground_daemon("p", argv) as mnt:
            yield os.path.join(mnt, "data")

    def drop_cache(self, path: str) -> None:
        fd = os.open(path, os.O_RDONLY)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        os.close(fd)
        try:
            with open("/proc/sys/vm/drop_caches", "w") as f:
                f.write("1\n")
            self.drop_method = "echo 1 > /proc/sys/vm/drop_caches"
        except OSError:
            self.drop_method = "posix_fadvise(POSIX_FADV_DONTNEED) on the model file"

    def record(self, key: str, **values) -> dict:
        self.results[key] = values
        shown = ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in values.items())
        print(f"  {key}: {shown}", flush=True)
        return values


def _mounted(path: str) -> bool:
    real = os.path.realpath(path)
    with open("/proc/self/mountinfo") as f:
        return any(line.split()[4] == real for line in f)


# --- readers ----------------------------------------------------------------------------------

def read_file(path: str, bufsize: int = READ_BUF, flags: int = 0) -> tuple[int, float]:
    """Read a whole file with read(2) into one reused buffer: (bytes, seconds)."""
    buf = mmap.mmap(-1, bufsize)                  # page-aligned, as O_DIRECT wants
    fd = os.open(path, os.O_RDONLY | flags)
    total = 0
    t0 = time.perf_counter()
    while True:
        n = os.readv(fd, [buf])
        if n == 0:
            break
        total += n
    dt = time.perf_counter() - t0
    os.close(fd)
    return total, dt


def pread_range(path: str, offset: int, size: int, bufsize: int = READ_BUF) -> tuple[int, float]:
    buf = bytearray(bufsize)
    view = memoryview(buf)
    fd = os.open(path, os.O_RDONLY)
    total = 0
    t0 = time.perf_counter()
    while total < size:
        n = os.preadv(fd, [view[:min(bufsize, size - total)]], offset + total)
        if n == 0:
            break
        total += n
    dt = time.perf_counter() - t0
    os.close(fd)
    return total, dt


def parallel(fn, items) -> tuple[int, float]:
    """Run fn(item) in one thread per item (read(2) releases the GIL); (total, wall seconds)."""
    out = [None] * len(items)
    barrier = threading.Barrier(len(items) + 1)

    def run(i, item):
        barrier.wait()
        out[i] = fn(item)

    threads = [threading.Thread(target=run, args=(i, it)) for i, it in enumerate(items)]
    for t in threads:
        t.start()
    barrier.wait()
    t0 = time.perf_counter()
    for t in threads:
        t.join()
    dt = time.perf_counter() - t0
    return sum(n for n, _ in out), dt


def mbps(nbytes: int, seconds: float) -> float:
    return nbytes / seconds / 1e6


def proc_status_kib(pid: int) -> dict:
    """RssAnon, RssShmem ... of a process, in KiB."""
    out = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("Rss"):
                key, value = line.split(":", 1)
                out[key] = int(value.split()[0])
    return out


def worker_pids(pid: int) -> list[int]:
    """The daemon's conversion worker processes (tensorfs.convert.workers)."""
    found = []
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{task}/children") as f:
                found += [int(c) for c in f.read().split()]
        except OSError:
            pass
    def is_worker(c):
        try:
            with open(f"/proc/{c}/cmdline", "rb") as f:
                return b"tensorfs.convert.workers" in f.read()
        except OSError:
            return False
    return [c for c in found if is_worker(c)]


def rss_anon_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("RssAnon:"):
                return int(line.split()[1])
    return -1


# --- models -----------------------------------------------------------------------------------

def _cached(path: str, build) -> str:
    if not os.path.exists(path):
        tmp = path + ".tmp"
        build(tmp)
        os.replace(tmp, path)
    return path


def _f32(rng, n: int) -> np.ndarray:
    return rng.random(n, dtype=np.float32)


def raw_model(b: Bench) -> str:
    """safetensors: big.weight (F32, --big-mib), mid.weight (F32, 256 MiB), par.N.weight."""
    a = b.args
    path = os.path.join(b.models, f"raw-{a.big_mib}-{a.mid_mib}-{a.par_mib}.safetensors")

    def build(tmp):
        from safetensors.numpy import save_file

        rng = np.random.default_rng(1)
        tensors = {"big.weight": _f32(rng, a.big_mib * MiB // 4).reshape(-1, 4096),
                   "mid.weight": _f32(rng, a.mid_mib * MiB // 4).reshape(-1, 4096)}
        for i in range(8):
            tensors[f"par.{i}.weight"] = _f32(rng, a.par_mib * MiB // 4).reshape(-1, 4096)
        save_file(tensors, tmp)

    return _cached(path, build)


CONV_TYPES = ["BF16", "Q8_0", "Q4_0", "Q4_K", "Q6_K"]


def _blocks(name: str, out_bytes: int, rng) -> np.ndarray:
    """Random blocks of ``name`` holding ``out_bytes`` of float32 output, shaped as rows of 4096
    elements (rows, row_bytes) as GGUF stores them; finite scales."""
    from bench_kernels import random_blocks

    from tensorfs.dtypes import GGML_TYPES_BY_NAME

    gt = GGML_TYPES_BY_NAME[name]
    n_elems = out_bytes // 4
    rows = max(1, n_elems // 4096)
    row_bytes = 4096 // gt.block_size * gt.type_size
    if name == "BF16":                  # the top halves of normal float32 values
        data = _f32(rng, rows * 4096).view(np.uint16)[1::2].copy().view(np.uint8)
    else:
        data = random_blocks(name, rows * row_bytes, rng)
    return data[:rows * row_bytes].reshape(rows, row_bytes)


def _write_gguf(tmp: str, tensors: dict) -> None:
    import gguf

    writer = gguf.GGUFWriter(tmp, "llama")
    for name, (qname, data) in tensors.items():
        if qname == "F32":
            writer.add_tensor(name, data)
        else:
            writer.add_tensor(name, data, raw_dtype=gguf.GGMLQuantizationType[qname])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def conv_model(b: Bench) -> str:
    """GGUF: one tensor per converted type (--conv-mib of float32 output each), and 8 Q4_K
    tensors for the parallel rows."""
    a = b.args
    path = os.path.join(b.models, f"conv-{a.conv_mib}-{a.par_conv_mib}.gguf")

    def build(tmp):
        rng = np.random.default_rng(2)
        tensors = {f"conv.{q}.weight": (q, _blocks(q, a.conv_mib * MiB, rng)) for q in CONV_TYPES}
        for i in range(8):
            tensors[f"par.{i}.weight"] = ("Q4_K", _blocks("Q4_K", a.par_conv_mib * MiB, rng))
        _write_gguf(tmp, tensors)

    return _cached(path, build)


def rss_model(b: Bench) -> str:
    """GGUF of about --rss-mib of tensor data: Q4_K, Q6_K, Q8_0, BF16, F32 in equal parts,
    split in 16 tensors each (so every view kind is read, many chunks)."""
    a = b.args
    path = os.path.join(b.models, f"rss-{a.rss_mib}.gguf")

    def build(tmp):
        from tensorfs.dtypes import GGML_TYPES_BY_NAME

        rng = np.random.default_rng(3)
        share = a.rss_mib * MiB // 5 // 16 // (1 << 16) * (1 << 16)
        tensors = {}
        for q in ["Q4_K", "Q6_K", "Q8_0", "BF16"]:
            gt = GGML_TYPES_BY_NAME[q]
            out = share // gt.type_size * gt.block_size * 4
            for i in range(16):
                tensors[f"{q}.{i}.weight"] = (q, _blocks(q, out, rng))
        for i in range(16):
            tensors[f"F32.{i}.weight"] = ("F32", _f32(rng, share // 4).reshape(-1, 4096))
        _write_gguf(tmp, tensors)

    return _cached(path, build)


def vocab_models(b: Bench) -> tuple[str, str]:
    """A GGUF header with a --vocab-token vocabulary and --header-tensors tiny tensors, and a
    safetensors file with the same tensors."""
    a = b.args
    gpath = os.path.join(b.models, f"vocab-{a.vocab}-{a.header_tensors}.gguf")
    spath = os.path.join(b.models, f"header-{a.header_tensors}.safetensors")
    names = [f"blk.{i // 30}.t{i % 30}.weight" for i in range(a.header_tensors)]

    def build_gguf(tmp):
        import gguf

        rng = np.random.default_rng(4)
        writer = gguf.GGUFWriter(tmp, "llama")
        writer.add_tokenizer_model("gpt2")
        writer.add_token_list([f"tok{i}_{'x' * (i % 7)}".encode() for i in range(a.vocab)])
        writer.add_token_scores(rng.random(a.vocab, dtype=np.float32).tolist())
        writer.add_token_types([1] * a.vocab)
        writer.add_token_merges([f"t{i} k{i}" for i in range(a.vocab // 2)])
        for name in names:
            writer.add_tensor(name, _f32(rng, 64).reshape(8, 8))
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()

    def build_st(tmp):
        from safetensors.numpy import save_file

        rng = np.random.default_rng(5)
        save_file({n: _f32(rng, 64).reshape(8, 8) for n in names}, tmp,
                  metadata={"format": "pt"})

    return _cached(gpath, build_gguf), _cached(spath, build_st)


def tree_model(b: Bench, n: int) -> str:
    path = os.path.join(b.models, f"tree-{n}.safetensors")

    def build(tmp):
        from safetensors.numpy import save_file

        one = np.zeros(1, dtype=np.float32)
        save_file({f"model.layers.{i // 10}.p{i % 10}.weight": one for i in range(n)}, tmp)

    return _cached(path, build)


# --- the rows -------------------------------------------------------------------------------

def best_of(n: int, fn) -> tuple:
    """fn() -> (nbytes, seconds); the fastest of n runs."""
    runs = [fn() for _ in range(n)]
    return min(runs, key=lambda r: r[1])


def _tensor_range(path: str, name: str) -> tuple[int, int]:
    from tensorfs.loading.loader import load_model

    for t in load_model(path).tensors:
        if t.name == name:
            return t.offset, t.nbytes
    raise KeyError(name)


def row_raw(b: Bench) -> None:
    """1 (cold raw vs passthrough), 2 (warm vs pread), 3 (numpy.load vs fromfile), issue 2's
    256 MiB figure."""
    a = b.args
    model = raw_model(b)
    off, size = _tensor_range(model, "big.weight")
    moff, msize = _tensor_range(model, "mid.weight")
    big = "big/weight"

    def cold_tensorfs():
        b.drop_cache(model)
        with b.mount(model) as (mnt, _, _):
            return read_file(os.path.join(mnt, big))

    def cold_pass():
        b.drop_cache(model)
        with b.passthrough(model, off, size) as data:
            return read_file(data)

    def cold_pread():
        b.drop_cache(model)
        return pread_range(model, off, size)

    print("row 1: cold raw read", flush=True)
    runs = {"tensorfs": [], "passthrough": [], "pread": []}
    for _ in range(a.repeat):                    # taking turns: drift hits all alike
        runs["tensorfs"].append(cold_tensorfs())
        runs["passthrough"].append(cold_pass())
        runs["pread"].append(cold_pread())
    best = {k: min(v, key=lambda r: r[1]) for k, v in runs.items()}
    b.record("1_cold_raw", tensorfs=mbps(*best["tensorfs"]), passthrough=mbps(*best["passthrough"]),
             pread=mbps(*best["pread"]), nbytes=size)

    # fresh mounts, the source in the page cache: the daemon's own cost
    pread_range(model, off, size)
    runs = {"tensorfs": [], "passthrough": [], "pread": [], "warm": [], "pass_warm": []}
    for _ in range(a.repeat):
        with b.mount(model) as (mnt, _, _):
            runs["tensorfs"].append(read_file(os.path.join(mnt, big)))
            runs["warm"].append(read_file(os.path.join(mnt, big)))      # row 2: page cache
        with b.passthrough(model, off, size) as data:
            runs["passthrough"].append(read_file(data))
            runs["pass_warm"].append(read_file(data))
        runs["pread"].append(pread_range(model, off, size))
        with b.mount(model, "-o", "nothreads") as (mnt, _, _):
            runs.setdefault("nothreads", []).append(read_file(os.path.join(mnt, big)))
    best = {k: min(v, key=lambda r: r[1]) for k, v in runs.items()}
    b.record("1_nothreads_raw", tensorfs=mbps(*best["nothreads"]), multithreaded=mbps(*best["tensorfs"]))
    b.record("1_fresh_raw", tensorfs=mbps(*best["tensorfs"]), passthrough=mbps(*best["passthrough"]),
             pread=mbps(*best["pread"]), nbytes=size)
    b.record("2_warm_raw", tensorfs=mbps(*best["warm"]), pread=mbps(*best["pread"]),
             passthrough=mbps(*best["pass_warm"]), nbytes=size)

    # issue 2: a 256 MiB tensor, mount time, first read, beside pread of the same bytes
    print("row 3: numpy.load of a native .npy", flush=True)
    pread_range(model, moff, msize)
    loads, froms, firsts, preads, readies = [], [], [], [], []
    for _ in range(a.repeat):
        with b.mount(model) as (mnt, _, ready):
            readies.append(ready)
            firsts.append(read_file(os.path.join(mnt, "mid/weight")))
            t0 = time.perf_counter()
            arr = np.load(os.path.join(mnt, "mid/weight.npy"))
            loads.append((arr.nbytes, time.perf_counter() - t0))
            del arr
        t0 = time.perf_counter()
        arr = np.fromfile(model, dtype=np.float32, count=msize // 4, offset=moff)
        froms.append((arr.nbytes, time.perf_counter() - t0))
        del arr
        preads.append(pread_range(model, moff, msize))
    b.record("3_npy_native", tensorfs=mbps(*min(loads, key=lambda r: r[1])),
             fromfile=mbps(*min(froms, key=lambda r: r[1])), nbytes=msize)
    b.record("issue2_256MiB", tensorfs=mbps(*min(firsts, key=lambda r: r[1])),
             pread=mbps(*min(preads, key=lambda r: r[1])), mount_s=min(readies), nbytes=msize)


def row_converted(b: Bench) -> None:
    """4: each converted .npy through the mount (numpy.load, first read of a fresh mount) vs
    gguf.quants.dequantize of the tensor's rows in memory; BF16 .npy vs the raw file."""
    import gguf
    import gguf.quants

    a = b.args
    model = conv_model(b)
    reader = gguf.GGUFReader(model)
    by_name = {t.name: t for t in reader.tensors}
    print("row 4: converted views", flush=True)
    ours = {q: [] for q in CONV_TYPES}
    bf16_raw = []
    for _ in range(a.repeat):
        pread_range(model, 0, os.path.getsize(model))                   # source in page cache
        with b.mount(model, workers_ready="par/7/weight.npy") as (mnt, _, _):
            for q in CONV_TYPES:
                path = os.path.join(mnt, f"conv/{q}/weight.npy")
                t0 = time.perf_counter()
                arr = np.load(path)
                ours[q].append((arr.nbytes, time.perf_counter() - t0))
                del arr
            bf16_raw.append(read_file(os.path.join(mnt, "conv/BF16/weight")))
        with b.mount(model, "--workers", "0") as (mnt, _, _):   # issue 16: in-thread, as before
            for q in CONV_TYPES:
                if q == "BF16":
                    continue
                t0 = time.perf_counter()
                arr = np.load(os.path.join(mnt, f"conv/{q}/weight.npy"))
                ours.setdefault(f"{q}_w0", []).append((arr.nbytes, time.perf_counter() - t0))
                del arr
        with b.mount(model) as (mnt, _, _):                                # same kind of read
            bf16_npy = read_file(os.path.join(mnt, "conv/BF16/weight.npy"))
            ours.setdefault("BF16_read", []).append(bf16_npy)
        with b.mount(model, workers_ready="par/7/weight.npy") as (mnt, _, _):   # the daemon alone: no page cache
            for q in CONV_TYPES:
                path = os.path.join(mnt, f"conv/{q}/weight.npy")
                ours.setdefault(f"{q}_direct", []).append(read_file(path, flags=os.O_DIRECT))
        with b.mount(model, "--workers", "0") as (mnt, _, _):    # the same, in-thread
            for q in CONV_TYPES:
                if q != "BF16":
                    path = os.path.join(mnt, f"conv/{q}/weight.npy")
                    ours.setdefault(f"{q}_direct_w0", []).append(read_file(path, flags=os.O_DIRECT))
    for q in CONV_TYPES:
        t = by_name[f"conv.{q}.weight"]
        rows = np.array(t.data)                       # the rows as stored, in memory
        qtype = gguf.GGMLQuantizationType[q]
        with np.errstate(all="ignore"):
            gguf.quants.dequantize(rows[:16], qtype)
            times = []
            for _ in range(a.repeat):
                t0 = time.perf_counter()
                out = gguf.quants.dequantize(rows, qtype)
                times.append(time.perf_counter() - t0)
        mine = min(ours[q], key=lambda r: r[1])
        direct = min(ours[f"{q}_direct"], key=lambda r: r[1])
        extra = {}
        if f"{q}_w0" in ours:
            extra["tensorfs_w0"] = mbps(*min(ours[f"{q}_w0"], key=lambda r: r[1]))
            extra["direct_w0"] = mbps(*min(ours[f"{q}_direct_w0"], key=lambda r: r[1]))
        b.record(f"4_{q}", tensorfs=mbps(*mine), gguf_py=mbps(out.nbytes, min(times)), nbytes=out.nbytes,
                 direct=mbps(*direct), spread=max(r[1] for r in ours[q]) / mine[1], **extra)
        del rows, out
    b.record("4_BF16_npy_vs_raw", npy=mbps(*min(ours["BF16_read"], key=lambda r: r[1])),
             raw=mbps(*min(bf16_raw, key=lambda r: r[1])))


def row_mount_time(b: Bench) -> None:
    """5: mount-ready time vs GGUFReader / safe_open."""
    import gguf
    from safetensors import safe_open

    a = b.args
    gpath, spath = vocab_models(b)
    print("row 5: mount-ready time", flush=True)
    startup = []
    for _ in range(a.repeat):
        t0 = time.perf_counter()
        subprocess.run([*b.tensorfs, "--version"], env=b.env, cwd=b.work, capture_output=True, check=True)
        startup.append(time.perf_counter() - t0)
    out = {}
    for label, path in (("gguf", gpath), ("safetensors", spath)):
        readies = []
        for _ in range(a.repeat):
            with b.mount(path) as (mnt, _, ready):
                readies.append(ready)
        parse = []
        for _ in range(a.repeat):
            code = ("import time,sys; from tensorfs.loading.loader import load_model; "
                    "from tensorfs.mount.tree import build_mount; from tensorfs.budget import MemoryBudget; "
                    f"t=time.perf_counter(); m=build_mount(load_model({path!r}), MemoryBudget(1<<28)); "
                    "print(time.perf_counter()-t)")
            done = subprocess.run([sys.executable, "-c", code], env=b.env, cwd=b.work, capture_output=True,
                                  text=True, check=True)
            parse.append(float(done.stdout.split()[-1]))
        refs = []
        for _ in range(a.repeat):
            if refs and refs[0] > 5:            # GGUFReader on a big vocabulary: once is enough
                break
            t0 = time.perf_counter()
            if label == "gguf":
                r = gguf.GGUFReader(path)
                del r
            else:
                with safe_open(path, "numpy") as f:
                    f.keys()
            refs.append(time.perf_counter() - t0)
        out[label] = b.record(f"5_mount_{label}", mount_s=min(readies), in_process_s=min(parse),
                              reference_s=min(refs), startup_s=min(startup))


def row_parallel(b: Bench) -> None:
    """6: 1, 4, 8 parallel readers, each reading its own tensor: raw files (fresh mount,
    source in page cache) and Q4_K .npy views; and a raw reader beside a Q6_K reader."""
    a = b.args
    model = raw_model(b)
    cmodel = conv_model(b)
    print("row 6: parallel readers", flush=True)
    pread_range(model, 0, os.path.getsize(model))
    pread_range(cmodel, 0, os.path.getsize(cmodel))
    raw_files = [f"par/{i}/weight" for i in range(8)]
    q_files = [f"par/{i}/weight.npy" for i in range(8)]
    for kind, path, files, opts in (("raw", model, raw_files, ()), ("Q4_K", cmodel, q_files, ()),
                                    ("raw_nothreads", model, raw_files, ("-o", "nothreads")),
                                    ("Q4_K_nothreads", cmodel, q_files, ("-o", "nothreads"))):
        speeds = {}
        for n in (1, 4, 8):
            runs = []
            for _ in range(a.repeat):
                with b.mount(path, *opts) as (mnt, _, _):
                    runs.append(parallel(read_file, [os.path.join(mnt, f) for f in files[:n]]))
            speeds[n] = mbps(*min(runs, key=lambda r: r[1]))
        b.record(f"6_parallel_{kind}", one=speeds[1], four=speeds[4], eight=speeds[8])
    # one costly conversion beside a raw reader: the raw reader must not wait for it
    for label, opts in (("", ()), ("_nothreads", ("-o", "nothreads"))):
        alone, beside = [], []
        for _ in range(a.repeat):
            with b.mount(cmodel, *opts) as (mnt, _, _):
                alone.append(read_file(os.path.join(mnt, "conv/BF16/weight")))
            with b.mount(cmodel, *opts) as (mnt, _, _):
                result = {}
                slow = threading.Thread(target=lambda: result.setdefault(
                    "q", read_file(os.path.join(mnt, "conv/Q6_K/weight.npy"))))
                slow.start()
                time.sleep(0.05)
                beside.append(read_file(os.path.join(mnt, "conv/BF16/weight")))
                slow.join()
        b.record(f"6_raw_beside_conversion{label}", alone=mbps(*min(alone, key=lambda r: r[1])),
                 beside=mbps(*min(beside, key=lambda r: r[1])))


def row_workers(b: Bench) -> None:
    """6w (issue 16): N parallel Q4_K .npy readers (N = the CPUs) against one reader, with
    --workers 0 (in-thread) and 1..N worker processes; fresh mount per measurement."""
    a = b.args
    cmodel = conv_model(b)
    cores = len(os.sched_getaffinity(0))
    print(f"row 6w: {cores} parallel Q4_K readers by --workers", flush=True)
    pread_range(cmodel, 0, os.path.getsize(cmodel))
    files = [f"par/{i}/weight.npy" for i in range(max(cores, 1))]
    for w in range(0, cores + 1):
        runs = {"one": [], "n": []}
        cpu = []
        for _ in range(a.repeat):
            with b.mount(cmodel, "--workers", str(w), workers_ready="conv/Q4_0/weight.npy") as (mnt, _, _):
                runs["one"].append(read_file(os.path.join(mnt, files[0])))
            with b.mount(cmodel, "--workers", str(w), workers_ready="conv/Q4_0/weight.npy") as (mnt, pid, _):
                procs = [pid] + worker_pids(pid)
                before = sum(cpu_seconds(p) for p in procs)
                runs["n"].append(parallel(read_file, [os.path.join(mnt, f) for f in files]))
                # CPU seconds of the daemon and its workers per GiB served: what the two
                # CPUs are spent on (the readers' own kernel time is not in it)
                cpu.append((sum(cpu_seconds(p) for p in procs) - before) / (runs["n"][-1][0] / (1 << 30)))
        best = {k: min(v, key=lambda r: r[1]) for k, v in runs.items()}
        b.record(f"6w_{w}", one=mbps(*best["one"]), n=mbps(*best["n"]), readers=cores,
                 one_spread=max(r[1] for r in runs["one"]) / best["one"][1],
                 n_spread=max(r[1] for r in runs["n"]) / best["n"][1],
                 cpu_s_per_gib=min(cpu))


def cpu_seconds(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _mirror_tree(src_mnt: str, dst: str, paths_file: str) -> int:
    """The mount's tree as empty files (same names, dirs) under dst, and their paths, one a
    line, in paths_file (the C floor's input); returns the file count."""
    count = 0
    with open(paths_file, "w", encoding="utf-8", errors="surrogateescape") as listing:
        for root, dirs, files in os.walk(src_mnt):
            rel = os.path.relpath(root, src_mnt)
            target = os.path.join(dst, rel)
            os.makedirs(target, exist_ok=True)
            for name in files:
                open(os.path.join(target, name), "wb").close()
                listing.write(os.path.normpath(os.path.join(rel, name)) + "\n")
                count += 1
    return count


def _floor_binary(b: Bench) -> str | None:
    """bench/floor/treefs.c compiled (row 7's floor), or None where the fuse3 headers or a
    compiler are missing (make bench installs them)."""
    out = os.path.join(b.work, "treefs-floor")
    flags = subprocess.run(["pkg-config", "--cflags", "--libs", "fuse3"], capture_output=True, text=True)
    if flags.returncode != 0:
        b.notes.append("row 7's C floor was not built: no fuse3 headers (apt-get install libfuse3-dev pkg-config)")
        return None
    done = subprocess.run(["cc", "-O2", "-o", out, os.path.join(HERE, "floor", "treefs.c"), *flags.stdout.split()],
                          capture_output=True, text=True)
    if done.returncode != 0:
        b.notes.append(f"row 7's C floor did not compile: {done.stderr.strip()[:200]}")
        return None
    return out


def _timed(cmd: list[str]) -> float:
    t0 = time.perf_counter()
    subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - t0


def row_tree(b: Bench) -> None:
    """7: ls -lR and find over 10k / 100k tensors (each has a raw file and a .npy), first run
    on a fresh mount and second run, vs the same tree of empty files on tmpfs, and vs the
    same tree served by the smallest C FUSE daemon (bench/floor/treefs.c: what FUSE round
    trips alone cost here)."""
    a = b.args
    shm = "/dev/shm" if os.path.isdir("/dev/shm") else b.work
    print("row 7: ls -lR / find", flush=True)
    floor = _floor_binary(b)
    for n in a.tree_sizes:
        model = tree_model(b, n)
        ref = os.path.join(shm, f"tensorfs-bench-tree-{n}")
        paths_file = os.path.join(b.work, f"tree-{n}.paths")
        shutil.rmtree(ref, ignore_errors=True)
        with b.mount(model) as (mnt, _, _):
            files = _mirror_tree(mnt, ref, paths_file)
        res = {"files": files}
        for tool, cmd in (("ls", ["ls", "-lR"]), ("find", ["find"])):
            firsts, seconds, refs = [], [], []
            for _ in range(max(1, a.repeat - 1) if n < 50_000 else 1):   # keep the run short
                with b.mount(model) as (mnt, _, _):
                    firsts.append(_timed([*cmd, mnt]))
                    seconds.append(_timed([*cmd, mnt]))
                refs.append(_timed([*cmd, ref]))
            res[f"{tool}_first_s"] = min(firsts)
            res[f"{tool}_second_s"] = min(seconds)
            res[f"{tool}_tmpfs_s"] = min(refs)
            with b.mount(model, "-o", "nothreads") as (mnt, _, _):
                res[f"{tool}_nothreads_first_s"] = _timed([*cmd, mnt])
            if floor:
                with b.foreground_daemon("f", [floor, paths_file]) as mnt:
                    res[f"{tool}_floor_first_s"] = _timed([*cmd, mnt])
                    res[f"{tool}_floor_second_s"] = _timed([*cmd, mnt])
        shutil.rmtree(ref, ignore_errors=True)
        b.record(f"7_tree_{n}", **res)


def row_rss(b: Bench) -> None:
    """8: daemon RssAnon after reading every file (raw and .npy) of a ~1 GiB model."""
    a = b.args
    model = rss_model(b)
    print("row 8: daemon memory", flush=True)
    pread_range(model, 0, os.path.getsize(model))
    for cache in a.cache_sizes:
        with b.mount(model, cache_size=cache) as (mnt, pid, _):
            before = rss_anon_kib(pid)
            total = 0
            t0 = time.perf_counter()
            for root, _, files in os.walk(mnt):
                for name in sorted(files):
                    total += read_file(os.path.join(root, name))[0]
            dt = time.perf_counter() - t0
            after = rss_anon_kib(pid)
            # issue 16: the workers' private memory, and the shared arena (RssShmem: the
            # daemon maps every slot a worker wrote, so its RssShmem counts the arena once)
            workers = worker_pids(pid)
            worker_anon = [proc_status_kib(w).get("RssAnon", 0) for w in workers]
            shmem = proc_status_kib(pid).get("RssShmem", 0)
            b.record(f"8_rss_{cache}", rss_before_mib=before / 1024, rss_after_mib=after / 1024,
                     read_gib=total / (1 << 30), mbps=mbps(total, dt), workers=len(workers),
                     worker_anon_mib=sum(worker_anon) / 1024, arena_mib=shmem / 1024,
                     total_mib=(after + shmem + sum(worker_anon)) / 1024)


ROWS = {"raw": row_raw, "converted": row_converted, "mount": row_mount_time,
        "parallel": row_parallel, "workers": row_workers, "tree": row_tree, "rss": row_rss}


# --- the report -------------------------------------------------------------------------------

def machine() -> dict:
    import numpy

    mem = "?"
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemTotal:"):
                mem = f"{int(line.split()[1]) / (1 << 20):.1f} GiB"
    cpu = platform.processor() or "?"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    try:
        fuse_ver = subprocess.run(["fusermount", "-V"], capture_output=True, text=True).stdout.strip()
    except OSError:
        fuse_ver = "?"
    try:
        import importlib.metadata as md
        fusepy = md.version("fusepy")
    except Exception:
        fusepy = "?"
    try:
        from tensorfs.fuse.loader import libfuse
        version = libfuse().version
        libfuse3 = f"{version // 100}.{version % 100}"
    except Exception:
        libfuse3 = "?"
    return {"nproc": os.cpu_count(), "cpu": cpu, "memory": mem, "kernel": platform.release(),
            "python": platform.python_version(), "numpy": numpy.__version__, "fusepy": fusepy,
            "libfuse3": libfuse3, "fusermount": fuse_ver}


def _ratio(x, y):
    return x / y if y else float("nan")


def table(r: dict) -> list[tuple]:
    """(row, measurement, tensorfs, reference, ratio, goal)."""
    rows = []

    def add(num, what, ours, ref, ratio, goal=""):
        rows.append((num, what, ours, ref, ratio, goal))

    if "1_cold_raw" in r:
        x = r["1_cold_raw"]
        n = x["nbytes"] / (1 << 30)
        add("1", f"cold raw read, {n:g} GiB tensor (source dropped, fresh mount) vs passthrough",
            f"{x['tensorfs']:,.0f} MB/s", f"{x['passthrough']:,.0f} MB/s",
            _ratio(x["tensorfs"], x["passthrough"]), "≥ 0.9")
        add("1b", "... same, vs direct pread of the dropped source (disk)", f"{x['tensorfs']:,.0f} MB/s",
            f"{x['pread']:,.0f} MB/s", _ratio(x["tensorfs"], x["pread"]))
        y = r["1_fresh_raw"]
        add("1c", "raw read, fresh mount, source in page cache, vs passthrough",
            f"{y['tensorfs']:,.0f} MB/s", f"{y['passthrough']:,.0f} MB/s",
            _ratio(y["tensorfs"], y["passthrough"]), "≥ 0.9")
        add("1d", "... same, vs direct pread (page cache)", f"{y['tensorfs']:,.0f} MB/s",
            f"{y['pread']:,.0f} MB/s", _ratio(y["tensorfs"], y["pread"]))
        if "1_nothreads_raw" in r:
            t = r["1_nothreads_raw"]
            add("1e", "... same, `-o nothreads` (single-threaded libfuse) vs the default (multithreaded)",
                f"{t['tensorfs']:,.0f} MB/s", f"{t['multithreaded']:,.0f} MB/s",
                _ratio(t["tensorfs"], t["multithreaded"]))
        z = r["2_warm_raw"]
        add("2", "warm (second) raw read vs direct pread", f"{z['tensorfs']:,.0f} MB/s",
            f"{z['pread']:,.0f} MB/s", _ratio(z["tensorfs"], z["pread"]), "≥ 0.8")
        add("2b", "... passthrough's second read (no kernel_cache: through the daemon again)",
            f"{z['tensorfs']:,.0f} MB/s", f"{z['passthrough']:,.0f} MB/s",
            _ratio(z["tensorfs"], z["passthrough"]))
        w = r["3_npy_native"]
        add("3", f"numpy.load of a native F32 .npy ({w['nbytes'] >> 20} MiB, fresh mount) vs numpy.fromfile",
            f"{w['tensorfs']:,.0f} MB/s", f"{w['fromfile']:,.0f} MB/s", _ratio(w["tensorfs"], w["fromfile"]))
        v = r["issue2_256MiB"]
        add("3b", f"issue 2: first read of a {v['nbytes'] >> 20} MiB raw tensor vs pread "
            f"(mount ready in {v['mount_s']:.2f} s)", f"{v['tensorfs']:,.0f} MB/s",
            f"{v['pread']:,.0f} MB/s", _ratio(v["tensorfs"], v["pread"]))
    for q in CONV_TYPES:
        if f"4_{q}" in r:
            x = r[f"4_{q}"]
            add("4", f"{q} .npy (numpy.load, fresh mount; MB/s of float32) vs gguf.quants.dequantize",
                f"{x['tensorfs']:,.0f} MB/s", f"{x['gguf_py']:,.0f} MB/s",
                _ratio(x["tensorfs"], x["gguf_py"]), "≥ 2" if q != "BF16" else "")
    for q in CONV_TYPES:
        if "direct" in r.get(f"4_{q}", {}):
            x = r[f"4_{q}"]
            add("4d", f"{q} .npy read with O_DIRECT in 1 MiB reads (the daemon's rate, no page cache) "
                "vs gguf.quants.dequantize", f"{x['direct']:,.0f} MB/s", f"{x['gguf_py']:,.0f} MB/s",
                _ratio(x["direct"], x["gguf_py"]))
    for q in CONV_TYPES:
        if "tensorfs_w0" in r.get(f"4_{q}", {}):
            x = r[f"4_{q}"]
            add("4w", f"{q} .npy, numpy.load: worker processes (default --workers) vs `--workers 0` "
                f"(in-thread; w0 / gguf-py = {x['tensorfs_w0'] / x['gguf_py']:.2f})",
                f"{x['tensorfs']:,.0f} MB/s", f"{x['tensorfs_w0']:,.0f} MB/s",
                _ratio(x["tensorfs"], x["tensorfs_w0"]))
    for q in CONV_TYPES:
        if "direct_w0" in r.get(f"4_{q}", {}):
            x = r[f"4_{q}"]
            add("4w", f"{q} .npy read with O_DIRECT (the daemon's rate): worker processes vs "
                f"`--workers 0` (w0 / gguf-py = {x['direct_w0'] / x['gguf_py']:.2f})",
                f"{x['direct']:,.0f} MB/s", f"{x['direct_w0']:,.0f} MB/s",
                _ratio(x["direct"], x["direct_w0"]))
    if "1_fresh_raw" in r and any(f"4_{q}" in r for q in CONV_TYPES):
        # A converted view moves as many float32 bytes through FUSE as a raw file of that size:
        # the raw rate of the same kind of read bounds it, before any conversion.
        ceiling = r["1_fresh_raw"]["tensorfs"]
        parts = ", ".join(f"{q} {ceiling / r[f'4_{q}']['gguf_py']:.2f}" for q in CONV_TYPES if f"4_{q}" in r)
        add("4c", f"ceiling for row 4: tensorfs's own raw read (row 1c) / gguf-py, per type: {parts}",
            f"{ceiling:,.0f} MB/s", "", float("nan"))
    if "4_BF16_npy_vs_raw" in r:
        x = r["4_BF16_npy_vs_raw"]
        add("4b", "BF16 .npy vs the raw file of the same mount (MB/s of file read, fresh mounts)",
            f"{x['npy']:,.0f} MB/s", f"{x['raw']:,.0f} MB/s", _ratio(x["npy"], x["raw"]), "≥ 0.7")
    for label, ref in (("gguf", "gguf.GGUFReader(path)"), ("safetensors", "safetensors.safe_open")):
        if f"5_mount_{label}" in r:
            x = r[f"5_mount_{label}"]
            add("5", f"{label}: `tensorfs mount` until ready (whole command) vs {ref}",
                f"{x['mount_s']:.3f} s", f"{x['reference_s']:.3f} s",
                _ratio(x["mount_s"], x["reference_s"]), "≤ 0.2" if label == "gguf" else "")
            add("5b", f"{label}: parse + build the tree in-process (imports excluded) vs {ref}",
                f"{x['in_process_s']:.3f} s",
                f"{x['reference_s']:.3f} s", _ratio(x["in_process_s"], x["reference_s"]),
                "≤ 0.2" if label == "gguf" else "")
    for kind in ("raw", "Q4_K", "raw_nothreads", "Q4_K_nothreads"):
        if f"6_parallel_{kind}" in r:
            x = r[f"6_parallel_{kind}"]
            what = ("raw files" if kind.startswith("raw") else "Q4_K .npy views") + (
                ", `-o nothreads`" if kind.endswith("nothreads") else "")
            add("6", f"4 parallel readers, {what} (aggregate) vs one reader", f"{x['four']:,.0f} MB/s",
                f"{x['one']:,.0f} MB/s", _ratio(x["four"], x["one"]))
            add("6", f"8 parallel readers, {what} (aggregate) vs one reader", f"{x['eight']:,.0f} MB/s",
                f"{x['one']:,.0f} MB/s", _ratio(x["eight"], x["one"]))
    for key in sorted(k for k in r if k.startswith("6w_")):
        x = r[key]
        w = key.split("_")[1]
        add("6w", f"{x['readers']} parallel Q4_K .npy readers (aggregate) vs one reader, `--workers {w}` "
            f"(daemon + workers CPU: {x.get('cpu_s_per_gib', float('nan')):.2f} s/GiB)",
            f"{x['n']:,.0f} MB/s", f"{x['one']:,.0f} MB/s", _ratio(x["n"], x["one"]),
            "≥ 1.5" if w != "0" and int(w) == x["readers"] else "")
    for label in ("", "_nothreads"):
        if f"6_raw_beside_conversion{label}" in r:
            x = r[f"6_raw_beside_conversion{label}"]
            add("6b", "BF16 raw reader while a Q6_K .npy is read, vs alone"
                + (", `-o nothreads`" if label else ""), f"{x['beside']:,.0f} MB/s",
                f"{x['alone']:,.0f} MB/s", _ratio(x["beside"], x["alone"]))
    for key in sorted((k for k in r if k.startswith("7_tree_")), key=lambda k: int(k.split("_")[-1])):
        x = r[key]
        n = int(key.split("_")[-1])
        for tool in ("ls", "find"):
            name = "ls -lR" if tool == "ls" else "find"
            add("7", f"`{name}`, {n:,} tensors ({x['files']:,} files), fresh mount vs tmpfs",
                f"{x[f'{tool}_first_s']:.2f} s", f"{x[f'{tool}_tmpfs_s']:.2f} s",
                _ratio(x[f"{tool}_first_s"], x[f"{tool}_tmpfs_s"]))
            add("7", f"`{name}`, {n:,} tensors, second run (kernel caches) vs tmpfs",
                f"{x[f'{tool}_second_s']:.2f} s", f"{x[f'{tool}_tmpfs_s']:.2f} s",
                _ratio(x[f"{tool}_second_s"], x[f"{tool}_tmpfs_s"]))
            if f"{tool}_nothreads_first_s" in x:
                add("7", f"`{name}`, {n:,} tensors, fresh mount, `-o nothreads` vs tmpfs",
                    f"{x[f'{tool}_nothreads_first_s']:.2f} s", f"{x[f'{tool}_tmpfs_s']:.2f} s",
                    _ratio(x[f"{tool}_nothreads_first_s"], x[f"{tool}_tmpfs_s"]))
            if f"{tool}_floor_first_s" in x:
                for run in ("first", "second"):
                    add("7f", f"`{name}`, {n:,} tensors, {'fresh mount' if run == 'first' else 'second run'}"
                        " vs the C floor (bench/floor/treefs.c, same run)",
                        f"{x[f'{tool}_{run}_s']:.2f} s", f"{x[f'{tool}_floor_{run}_s']:.2f} s",
                        _ratio(x[f"{tool}_{run}_s"], x[f"{tool}_floor_{run}_s"]))
    for key in (k for k in r if k.startswith("8_rss_")):
        x = r[key]
        cache = key.split("_")[-1]
        add("8", f"daemon RssAnon after reading all {x['read_gib']:.1f} GiB of views, --cache-size {cache} "
            f"(at mount: {x['rss_before_mib']:.0f} MiB)", f"{x['rss_after_mib']:.0f} MiB", cache,
            _ratio(x["rss_after_mib"] * MiB, _size_bytes(cache)))
    for key in (k for k in r if k.startswith("8_rss_")):
        x = r[key]
        if "total_mib" not in x:
            continue
        cache = key.split("_")[-1]
        add("8w", f"daemon + {x['workers']} workers: RssAnon + shared arena after the same reads, "
            f"--cache-size {cache} (workers {x['worker_anon_mib']:.0f} MiB, arena "
            f"{x['arena_mib']:.0f} MiB)", f"{x['total_mib']:.0f} MiB", cache,
            _ratio(x["total_mib"] * MiB, _size_bytes(cache)))
    return rows


def _size_bytes(text: str) -> float:
    m = re.fullmatch(r"(\d+)([KMG]?)", text.upper())
    return int(m.group(1)) * {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}[m.group(2)] if m else float("nan")


BEGIN, END = "<!-- results:begin (bench/run.py rewrites this part) -->", "<!-- results:end -->"


def write_report(b: Bench, command: str, elapsed: float) -> None:
    m = machine()
    rows = table(b.results)
    lines = [BEGIN, "",
             f"Run {datetime.datetime.now().astimezone().strftime('%Y-%m-%d %H:%M %Z')}, "
             f"{elapsed / 60:.1f} min, with:", "", "```", command, "```", "",
             f"Machine: {m['nproc']} CPUs ({m['cpu']}), {m['memory']} RAM, Linux {m['kernel']}, "
             f"Python {m['python']}, numpy {m['numpy']}; tensorfs on libfuse {m['libfuse3']} "
             f"(low-level API, tensorfs/fuse/), the passthrough reference on fusepy {m['fusepy']} "
             f"over libfuse 2 ({m['fusermount']}).  Cold reads drop the page cache with: "
             f"{b.drop_method or 'n/a'}.",
             *(f"Note: {note}." for note in b.notes),
             f"Load average when the run ended: {os.getloadavg()[0]:.2f} (other work on the machine "
             f"shares its CPUs: compare ratios, not absolute figures, across runs).  "
             f"Best of {b.args.repeat} runs each; readers use read(2) into a reused "
             f"{READ_BUF >> 20} MiB buffer unless said otherwise.", "",
             "| row | measurement | tensorfs | reference | ratio | goal |",
             "|---|---|---:|---:|---:|---|"]
    for num, what, ours, ref, ratio, goal in rows:
        lines.append(f"| {num} | {what} | {ours} | {ref} | {ratio:.2f} | {goal} |")
    lines += ["", "![throughput per view kind](benchmarks.png)", "",
              "Raw results: bench/results.json.", "", END]
    block = "\n".join(lines)
    path = b.args.out
    # the raw figures beside the script, not in the document a person reads
    with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "results.json"), "w") as f:
        json.dump(b.results, f, indent=1, sort_keys=True)
        f.write("\n")
    if os.path.exists(path):
        text = open(path).read()
        if BEGIN in text and END in text:
            head, rest = text.split(BEGIN, 1)
            text = head + block + rest.split(END, 1)[1]
        else:
            text = text.rstrip() + "\n\n" + block + "\n"
    else:
        text = (f"# Benchmarks\n\nMade by `make bench` (bench/run.py); every figure is a ratio "
                f"against a reference measured in the same run.  What each option buys is in "
                f"[serving.md](serving.md).\n\n{block}\n\n## History\n\n")
    with open(path, "w") as f:
        f.write(text)
    print(f"wrote {path}")


def plot(b: Bench, path: str) -> None:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib missing: no plot")
        return
    r = b.results
    groups = []                                    # (label, tensorfs, reference, ref label)
    if "1_cold_raw" in r:
        groups.append(("raw, cold", r["1_cold_raw"]["tensorfs"], r["1_cold_raw"]["passthrough"], "passthrough"))
        groups.append(("raw, fresh mount", r["1_fresh_raw"]["tensorfs"],
                       r["1_fresh_raw"]["passthrough"], "passthrough"))
        groups.append(("raw, warm", r["2_warm_raw"]["tensorfs"], r["2_warm_raw"]["pread"], "pread"))
        groups.append(("F32 .npy", r["3_npy_native"]["tensorfs"], r["3_npy_native"]["fromfile"], "fromfile"))
    for q in CONV_TYPES:
        if f"4_{q}" in r:
            groups.append((f"{q} .npy", r[f"4_{q}"]["tensorfs"], r[f"4_{q}"]["gguf_py"], "gguf-py"))
    if not groups:
        return
    fig, ax = plt.subplots(figsize=(10, 4.5))
    xs = np.arange(len(groups))
    ax.bar(xs - 0.2, [g[1] for g in groups], 0.4, label="tensorfs (through the mount)", color="#1f77b4")
    ax.bar(xs + 0.2, [g[2] for g in groups], 0.4, label="reference", color="#bbbbbb")
    for x, g in zip(xs, groups):
        ax.text(x + 0.2, g[2], g[3], ha="center", va="bottom", fontsize=7, rotation=90)
        ax.text(x - 0.2, g[1], f"{g[1] / g[2]:.2f}×", ha="center", va="bottom", fontsize=7)
    ax.set_xticks(xs, [g[0] for g in groups], rotation=20, ha="right", fontsize=8)
    ax.set_ylabel("MB/s (float32 output for .npy views)")
    ax.set_title("tensorfs read throughput vs references (one run)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"wrote {path}")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", default="raw,converted,mount,parallel,workers,tree,rss",
                   help="comma-separated subset of: " + ",".join(ROWS))
    p.add_argument("--quick", action="store_true", help="small sizes, one repeat (a smoke run)")
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--big-mib", type=int, default=1024, help="row 1/2 tensor size")
    p.add_argument("--mid-mib", type=int, default=256, help="row 3 tensor size")
    p.add_argument("--par-mib", type=int, default=128, help="row 6 raw tensor size (x8)")
    p.add_argument("--conv-mib", type=int, default=256, help="row 4 float32 output per type")
    p.add_argument("--par-conv-mib", type=int, default=64, help="row 6 Q4_K output per tensor (x8)")
    p.add_argument("--rss-mib", type=int, default=1024, help="row 8 model size")
    p.add_argument("--vocab", type=int, default=150_000)
    p.add_argument("--header-tensors", type=int, default=3000)
    p.add_argument("--tree-sizes", type=lambda s: [int(x) for x in s.split(",")], default=[10_000, 100_000])
    p.add_argument("--cache-sizes", type=lambda s: s.split(","), default=["64M", "256M", "1G"])
    p.add_argument("--workdir", default=os.path.join(REPO, "build", "bench"))
    p.add_argument("--tensorfs-path", help="import tensorfs from here (compare a copy of the tree)")
    p.add_argument("-o", dest="option", action="append", default=[], help="extra mount -o options")
    p.add_argument("--workers", type=int, help="mount --workers N (default: tensorfs's own)")
    p.add_argument("--out", default=os.path.join(REPO, "docs", "benchmarks.md"))
    p.add_argument("--png", default=os.path.join(REPO, "docs", "benchmarks.png"))
    p.add_argument("--json", help="also write the raw results here")
    p.add_argument("--nice", type=int, default=0, metavar="N",
                   help="raise the priority of the run (and its mounts) by N, on a shared machine")
    p.add_argument("--no-report", action="store_true", help="print only; leave docs/ alone")
    args = p.parse_args()
    if args.quick:
        args.repeat = 1
        args.big_mib, args.mid_mib, args.par_mib = 256, 64, 32
        args.conv_mib, args.par_conv_mib, args.rss_mib = 64, 16, 256
        args.vocab, args.tree_sizes = 150_000, [10_000]
    if args.nice:
        try:
            os.nice(-args.nice)            # root only; children (daemons, references) inherit it
        except OSError as error:
            print(f"--nice ignored: {error}")
    b = Bench(args)
    command = "python bench/run.py " + " ".join(sys.argv[1:])
    t0 = time.perf_counter()
    for name in args.rows.split(","):
        ROWS[name.strip()](b)
    elapsed = time.perf_counter() - t0
    if args.json:
        with open(args.json, "w") as f:
            json.dump(b.results, f, indent=1)
    if not args.no_report:
        write_report(b, command, elapsed)
        plot(b, args.png)
    for num, what, ours, ref, ratio, goal in table(b.results):
        print(f"{num:>3} {ratio:6.2f} {goal:>6}  {ours:>14} {ref:>14}  {what}")
    print(f"total {elapsed / 60:.1f} min")
    return 0


if __name__ == "__main__":
    sys.exit(main())
