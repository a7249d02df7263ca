"""What every row of the benchmark shares: the run's environment (``Bench``: the work
directory, the mounts it makes, the results), the readers that time a file's bytes, and the
best-of helper."""

from __future__ import annotations

import mmap
import os
import subprocess
import sys
import threading
import time
from contextlib import contextmanager

# bench/: passthrough.py and floor/ are found from here
HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REPO = os.path.dirname(HERE)

MiB = 1 << 20
READ_BUF = 1 << 20           # what the readers ask per read(2): 1 MiB, as cp / numpy do


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


def rss_anon_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("RssAnon:"):
                return int(line.split()[1])
    return -1


def best_of(n: int, fn) -> tuple:
    """fn() -> (nbytes, seconds); the fastest of n runs."""
    runs = [fn() for _ in range(n)]
    return min(runs, key=lambda r: r[1])


def tensor_range(path: str, name: str) -> tuple[int, int]:
    from tensorfs.loading.loader import load_model

    for t in load_model(path).tensors:
        if t.name == name:
            return t.offset, t.nbytes
    raise KeyError(name)


def cpu_seconds(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
