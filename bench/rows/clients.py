"""Real clients on remote whole files (issue 24): each figure a ratio against a
reference measured in the same run, against a real nginx on 127.0.0.1 started here
(tests/support/servers.py).

    python bench/rows/clients.py [--mib 256] [--tensors 64] [--repeat 3] [--no-report]

W4  whole-file sequential read of MNT/files/model.safetensors, an http mount (fresh each
    time), vs `curl` of the file from the same nginx to /dev/null             goal >= 0.8
W5  mount + safetensors.safe_open + get_tensor of every tensor of the mounted remote file
    vs `curl` of the file to a local copy + the same safe_open and get_tensor on it
    (time, lower is better)                                                   goal <= 1.3

Writes its table into docs/internals/benchmarks.md between the clients markers (and prints it).
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import shutil
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parents[1]          # bench/
REPO = HERE.parent
sys.path.insert(0, str(REPO))

from tests.support.servers import Nginx  # noqa: E402 (after the sys.path line above)

MiB = 1 << 20
BEGIN = "<!-- clients:begin (bench/rows/clients.py rewrites this part) -->"
END = "<!-- clients:end -->"


class Bench:
    def __init__(self, args):
        self.args = args
        self.work = Path(args.workdir).resolve()
        self.work.mkdir(parents=True, exist_ok=True)
        pythonpath = [p for p in (os.environ.get("PYTHONPATH"), str(REPO)) if p]
        self.env = dict(os.environ, PYTHONPATH=os.pathsep.join(pythonpath),
                        HF_HUB_DISABLE_TELEMETRY="1")
        self.tensorfs = [sys.executable, "-m", "tensorfs"]
        self.rows: list[tuple] = []
        self.n = 0

    @contextmanager
    def mount(self, url: str, *options: str):
        """A fresh mount of ``url``: (mount point, seconds until the command returned)."""
        self.n += 1
        mnt = self.work / f"mnt{self.n}"
        mnt.mkdir(exist_ok=True)
        t0 = time.perf_counter()
        done = subprocess.run([*self.tensorfs, "mount", url, str(mnt), *options], env=self.env,
                              capture_output=True, text=True)
        ready = time.perf_counter() - t0
        if done.returncode:
            raise RuntimeError(f"mount {url}: {done.stderr.strip()}")
        try:
            yield mnt, ready
        finally:
            subprocess.run([*self.tensorfs, "unmount", str(mnt)], env=self.env, capture_output=True)
            mnt.rmdir()

    def row(self, num, what, ours, ref, unit, goal, note=""):
        ratio = ours / ref if ref else float("nan")
        self.rows.append((num, what, ours, ref, unit, ratio, goal, note))
        print(f"  {num}: {what}: {ours:.4g} vs {ref:.4g} {unit} -> {ratio:.2f} (goal {goal}) {note}",
              flush=True)


def model(b: Bench) -> Path:
    """A safetensors file of --tensors float32 tensors, --mib in all, in a few sizes as a
    model's are (a quarter of the tensors small, as norms and biases)."""
    from safetensors.numpy import save_file

    a = b.args
    path = b.work / f"model-{a.mib}m-{a.tensors}t.safetensors"
    if path.exists():
        return path
    rng = np.random.default_rng(5)
    small = max(1, a.tensors // 4)
    big = a.tensors - small
    per = (a.mib * MiB - small * 4096) // big // 4
    tensors = {}
    for i in range(a.tensors):
        n = 1024 if i % 4 == 3 else per
        tensors[f"layers.{i // 4}.t{i % 4}.weight"] = rng.standard_normal(n, dtype=np.float32)
    save_file(tensors, str(path))
    return path


def read_all(path: Path) -> tuple[int, float]:
    buf = bytearray(MiB)
    fd = os.open(path, os.O_RDONLY)
    total = 0
    t0 = time.perf_counter()
    while n := os.readv(fd, [buf]):
        total += n
    dt = time.perf_counter() - t0
    os.close(fd)
    return total, dt


def curl(url: str, out: str = "/dev/null") -> tuple[int, float]:
    t0 = time.perf_counter()
    done = subprocess.run(["curl", "-sf", "-o", out, "-w", "%{size_download}", url],
                          capture_output=True, text=True)
    dt = time.perf_counter() - t0
    if done.returncode:
        raise RuntimeError(f"curl {url}: rc {done.returncode}")
    return int(float(done.stdout)), dt


def load_all(path: Path) -> tuple[int, float]:
    """safe_open + get_tensor of every tensor, as a loader does: (bytes, seconds)."""
    from safetensors import safe_open

    t0 = time.perf_counter()
    total = 0
    with safe_open(path, framework="numpy") as f:
        for name in f.keys():
            total += f.get_tensor(name).nbytes
    return total, time.perf_counter() - t0


def block_cache_alone(url: str, size: int) -> float:
    """What bounds W4 below FUSE: the whole file read in 1 MiB pieces from tensorfs's remote
    source in this process (block cache and transport, no kernel, no daemon): seconds."""
    from tensorfs.cache import ByteLRU
    from tensorfs.loading.loader import load_model
    from tensorfs.sources.remote import RemoteSettings

    model = load_model(url, RemoteSettings(cache=ByteLRU(256 * MiB), timeout=120))
    try:
        source = next(iter(model.sources.values()))
        buf = bytearray(MiB)
        t0 = time.perf_counter()
        for pos in range(0, size, MiB):
            source.read_into(pos, memoryview(buf)[:min(MiB, size - pos)])
        return time.perf_counter() - t0
    finally:
        model.close()


def w4(b: Bench, server: Nginx, path: Path) -> None:
    url = server.put(f"files/{path.name}", path)
    size = path.stat().st_size
    ours, refs, tensor, alone = [], [], [], []
    for _ in range(b.args.repeat):
        n, dt = curl(url)
        assert n == size, (n, size)
        refs.append(dt)
        with b.mount(url, "--timeout", "120") as (mnt, _):
            n, dt = read_all(mnt / "files" / path.name)
            assert n == size, (n, size)
            ours.append(dt)
        # the same bytes as tensor files (R1's path), and below FUSE
        with b.mount(url, "--timeout", "120") as (mnt, _):
            t0 = time.perf_counter()
            got = sum(read_all(f)[0] for f in sorted((mnt / "layers").rglob("weight")))
            tensor.append((got, time.perf_counter() - t0))
        alone.append(block_cache_alone(url, size))
    mbps = lambda dt: size / dt / 1e6  # noqa: E731 (a one-line formula)
    tensor_bytes, tensor_s = min(tensor, key=lambda x: x[1])
    b.row("W4", f"whole file ({size / MiB:.0f} MiB) read sequentially from MNT/files/ of an http "
          "mount (fresh each time) vs `curl` of the file to /dev/null", mbps(min(ours)),
          mbps(min(refs)), "MB/s", ">= 0.8",
          f"what bounds it: every tensor file read in turn {tensor_bytes / tensor_s / 1e6:,.0f} "
          f"MB/s; the remote source alone, in-process, no FUSE {mbps(min(alone)):,.0f} MB/s")


def w5(b: Bench, server: Nginx, path: Path) -> None:
    url = server.put(f"files/{path.name}", path)
    size = path.stat().st_size
    copy = b.work / "copy.safetensors"
    ours, refs, mounts, loads, curls = [], [], [], [], []
    for _ in range(b.args.repeat):
        copy.unlink(missing_ok=True)         # written anew by curl: in the page cache, as after any download
        t0 = time.perf_counter()
        n, dt_curl = curl(url, str(copy))
        assert n == size
        loaded, dt_load = load_all(copy)
        refs.append(time.perf_counter() - t0)
        curls.append(dt_curl)
        t0 = time.perf_counter()
        with b.mount(url, "--timeout", "120") as (mnt, ready):
            got, dt = load_all(mnt / "files" / path.name)
            ours.append(time.perf_counter() - t0)
            assert got == loaded
            mounts.append(ready)
            loads.append(dt)
    copy.unlink(missing_ok=True)
    b.row("W5", f"mount + safe_open + get_tensor of all {b.args.tensors} tensors of the remote "
          f"file ({size / MiB:.0f} MiB) vs `curl` to a local copy + the same on the copy",
          min(ours), min(refs), "s", "<= 1.3",
          f"ours: mount {min(mounts):.2f} s + load {min(loads):.2f} s; reference: curl "
          f"{min(curls):.2f} s + load {min(refs) - min(curls):.2f} s")


def report(b: Bench, command: str, elapsed: float, load_before: float) -> str:
    branch = subprocess.run(["git", "-C", str(REPO), "log", "-1", "--format=%h %s"],
                            capture_output=True, text=True).stdout.strip()
    lines = [BEGIN, "", f"Run {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC, "
             f"{elapsed / 60:.1f} min, at commit `{branch[:80]}`, with:", "", "```", command, "```",
             "", f"Machine: {os.cpu_count()} CPUs, Linux {platform.release()}, Python "
             f"{platform.python_version()}; nginx {_version(['nginx', '-v'], 'stderr')}, curl "
             f"{_version(['curl', '--version'])}; load average {load_before:.2f} when it began, "
             f"{os.getloadavg()[0]:.2f} when it ended.  Best of {b.args.repeat}, each on a fresh "
             "mount (no disk cache); the mount's reader uses read(2) into a 1 MiB buffer.", "",
             "| row | measurement | tensorfs | reference | ratio | goal | note |",
             "|---|---|---:|---:|---:|---|---|"]
    for num, what, ours, ref, unit, ratio, goal, note in b.rows:
        lines.append(f"| {num} | {what} | {_fmt(ours, unit)} | {_fmt(ref, unit)} | {ratio:.2f} "
                     f"| {goal} | {note} |")
    lines += ["", END]
    return "\n".join(lines)


def _fmt(v, unit):
    return f"{v:,.0f} MB/s" if unit == "MB/s" else f"{v:.3f} s"


def _version(cmd, stream="stdout") -> str:
    try:
        out = getattr(subprocess.run(cmd, capture_output=True, text=True), stream)
    except OSError:
        return "?"
    return out.split()[1].split("/")[-1] if stream == "stdout" else out.strip().split("/")[-1]


def write_docs(text: str, path: Path) -> None:
    doc = path.read_text()
    if BEGIN in doc:
        doc = doc[:doc.index(BEGIN)] + text + doc[doc.index(END) + len(END):]
    else:
        doc = doc.rstrip("\n") + "\n\n## Real clients (`bench/rows/clients.py`)\n\n" + text + "\n"
    path.write_text(doc)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", default="w4,w5")
    p.add_argument("--mib", type=int, default=256)
    p.add_argument("--tensors", type=int, default=64)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--workdir", default=str(REPO / "build" / "bench-clients"))
    p.add_argument("--out", default=str(REPO / "docs" / "internals" / "benchmarks.md"))
    p.add_argument("--no-report", action="store_true")
    args = p.parse_args()
    if not shutil.which("curl"):
        print("curl is missing (apt-get install curl)", file=sys.stderr)
        return 1
    load_before = os.getloadavg()[0]
    b = Bench(args)
    path = model(b)
    server = Nginx(b.work / "nginx", workers=2).start()
    t0 = time.perf_counter()
    try:
        for name in args.rows.split(","):
            {"w4": w4, "w5": w5}[name](b, server, path)
    finally:
        server.stop()
    elapsed = time.perf_counter() - t0
    text = report(b, "python bench/rows/clients.py " + " ".join(sys.argv[1:]), elapsed, load_before)
    print(text)
    if not args.no_report:
        write_docs(text, Path(args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
