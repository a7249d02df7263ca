"""Remote models (issue 15): each figure a ratio against a reference measured in the same run,
against a real nginx on 127.0.0.1 started here (tests/support/servers.py).

    python bench/rows/remote.py [--big-mib 256] [--repeat 3] [--rtt-ms 20] [--no-report]

R1  sequential read of a --big-mib tensor through an http mount (fresh mount each time) vs
    `curl` of the same byte range from the same nginx                         goal >= 0.8
R2  the same through a proxy adding --rtt-ms of round-trip time, whose window (--window-mib
    in flight per connection, as TCP's) bounds one stream to window/RTT, vs `curl`'s single
    stream through the same proxy                                             goal >= 3
R3  `tensorfs mount` of the remote GGUF with a 150k-token vocabulary and 3,000 tensors until
    ready vs gguf.GGUFReader on the local file                                goal <= 0.2
R4  a second mount with --disk-cache reading the whole model again: bytes fetched again
    (nginx's access log)                                                      goal 0
R5  four readers at once, each of its own 64 MiB tensor of one http mount, vs four `curl`s of
    the same ranges at once (total bytes / wall time of the slowest)          goal >= 0.8
R6  the daemon's CPU seconds (user + system, /proc/PID/stat) per GiB read in R1  goal <= 0.5
R1-s3, R1-hf  R1 through s3:// (moto's server, build/moto-venv) and hf:// (nginx in the Hub's
    layout, HF_ENDPOINT), each vs `curl` of the same range from the same server

Writes its table into docs/internals/benchmarks.md between the remote markers (and prints it).
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parents[1]          # bench/
REPO = HERE.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(HERE))

from tests.support.servers import Nginx, parse_range  # noqa: E402 (after the sys.path line above)

MiB = 1 << 20
BEGIN, END = "<!-- remote:begin (bench/rows/remote.py rewrites this part) -->", "<!-- remote:end -->"


class RemoteBench:
    def __init__(self, args):
        self.args = args
        self.work = Path(args.workdir).resolve()
        self.work.mkdir(parents=True, exist_ok=True)
        self.env = dict(os.environ, PYTHONPATH=str(REPO), HF_HUB_DISABLE_TELEMETRY="1")
        self.tensorfs = [sys.executable, "-m", "tensorfs"]
        self.rows: list[tuple] = []
        self.n = 0

    @contextmanager
    def mount(self, url: str, *options: str, env: dict | None = None):
        self.n += 1
        mnt = self.work / f"mnt{self.n}"
        mnt.mkdir(exist_ok=True)
        t0 = time.perf_counter()
        done = subprocess.run([*self.tensorfs, "mount", url, str(mnt), *options],
                              env=dict(self.env, **(env or {})), capture_output=True, text=True)
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


def curl(url: str, start: int, size: int) -> float:
    t0 = time.perf_counter()
    done = subprocess.run(["curl", "-sf", "-o", "/dev/null", "-w", "%{size_download}",
                           "-r", f"{start}-{start + size - 1}", url], capture_output=True, text=True)
    dt = time.perf_counter() - t0
    if done.returncode or int(float(done.stdout)) != size:
        raise RuntimeError(f"curl {url}: rc {done.returncode}, {done.stdout!r}")
    return dt


def big_model(b: RemoteBench) -> tuple[Path, int, int]:
    """A safetensors file with one --big-mib uint8 tensor: (path, data offset, size)."""
    from safetensors.numpy import save_file

    size = b.args.big_mib * MiB
    path = b.work / f"big-{b.args.big_mib}.safetensors"
    if not path.exists():
        rng = np.random.default_rng(1)
        save_file({"big.weight": rng.integers(0, 255, size, dtype=np.uint8),
                   "small.weight": np.arange(16, dtype=np.float32)}, str(path))
    from tensorfs.sources.modelfile import parse_model_file

    t = next(t for t in parse_model_file(str(path)).tensors if t.name == "big.weight")
    return path, t.offset, t.nbytes


@contextmanager
def proxy(upstream: int, rtt: float, window: int):
    """The delaying proxy of tests/support/servers.py in a process of its own (not sharing the GIL
    with the reader)."""
    proc = subprocess.Popen([sys.executable, str(REPO / "tests" / "support" / "servers.py"), "proxy",
                             str(upstream), str(rtt), str(window)], stdout=subprocess.PIPE, text=True)
    try:
        yield proc.stdout.readline().strip()
    finally:
        proc.terminate()
        proc.wait(10)


def sequential(b: RemoteBench, url: str, ref_url: str, offset: int, size: int, tensor: str,
               env: dict | None = None) -> tuple[float, float, float]:
    """Best of --repeat: (our seconds, curl's seconds, daemon CPU seconds) reading ``size``
    bytes at ``offset``: ``tensor`` of a fresh mount of ``url`` vs curl of ``ref_url``."""
    ours, refs, cpu = [], [], []
    for _ in range(b.args.repeat):
        refs.append(curl(ref_url, offset, size))
        with b.mount(url, "--timeout", "120", env=env) as (mnt, _):
            pid = _daemon_pid(mnt)
            before = _cpu_seconds(pid)
            n, dt = read_all(mnt / tensor)
            cpu.append(_cpu_seconds(pid) - before)
            assert n == size, (n, size)
            ours.append(dt)
    return min(ours), min(refs), min(cpu)


def _receivers(b: RemoteBench) -> list[tuple[str, dict]]:
    """(a row's suffix, the mount's environment) per receiver of http reads asked for
    (``--transports``: TENSORFS_HTTP_TRANSPORT)."""
    names = b.args.transports.split(",")
    return [(f" {t}" if len(names) > 1 else "", {"TENSORFS_HTTP_TRANSPORT": t}) for t in names]


def r1_r2(b: RemoteBench, server: Nginx) -> None:
    path, offset, size = big_model(b)
    server.put("files/big.safetensors", path)
    a = b.args
    for label, rtt in (("R1", 0.0), ("R2", a.rtt_ms / 1000)):
        for suffix, env in _receivers(b):
            with proxy(server.port, rtt, a.window_mib * MiB) if rtt else _direct(server.url) as base:
                url = f"{base}/files/big.safetensors"
                ours, ref, cpu = sequential(b, url, url, offset, size, "big/weight", env=env)
                mbps = lambda dt: size / dt / 1e6  # noqa: E731 (a one-line formula)
                if rtt:
                    what = (f"sequential read of a {a.big_mib} MiB tensor, http mount vs `curl` of "
                            f"the same range, +{a.rtt_ms:g} ms RTT (window {a.window_mib} MiB: one "
                            f"stream <= {a.window_mib * MiB / rtt / 1e6:.0f} MB/s)")
                    goal = ">= 3"
                else:
                    what = (f"sequential read of a {a.big_mib} MiB tensor, http mount vs `curl` of "
                            "the same range")
                    goal = ">= 0.8"
                b.row(label + suffix, what, mbps(ours), mbps(ref), "MB/s", goal)
                if not rtt:
                    b.row("R6" + suffix, f"daemon CPU seconds per GiB read (R1, best of {a.repeat})",
                          cpu / (size / (1 << 30)), 1.0, "s/GiB", "<= 0.5")


def s3_row(b: RemoteBench, server: Nginx) -> None:
    """R1 through s3:// (moto's server, from build/moto-venv) vs curl of the same object."""
    from tests.support.servers import MotoServer

    path, offset, size = big_model(b)
    moto = MotoServer(b.work / "moto").start()
    try:
        fs = moto.s3fs()
        fs.mkdir("bench")
        fs.put_file(str(path), "bench/big.safetensors")
        ours, ref, cpu = sequential(b, "s3://bench/big.safetensors",
                                    f"{moto.url}/bench/big.safetensors", offset, size,
                                    "big/weight", env=moto.env())
        # moto answers each ranged GET in time that grows with the object, not the range:
        # curl's rate in block-sized ranges, one after another, shows what a server allows
        # a reader of blocks
        block, span = 4 * MiB, min(size, 32 * MiB)
        blocks = sum(curl(f"{moto.url}/bench/big.safetensors", offset + i, block)
                     for i in range(0, span, block))
    finally:
        moto.stop()
    mbps = lambda dt: size / dt / 1e6  # noqa: E731 (a one-line formula)
    b.row("R1-s3", "R1 through s3:// (moto server) vs `curl` of the same range of the object",
          mbps(ours), mbps(ref), "MB/s", ">= 0.8",
          f"daemon {cpu / (size / (1 << 30)):.2f} CPU s/GiB; `curl` of 4 MiB ranges one after "
          f"another: {span / blocks / 1e6:,.0f} MB/s")


def hf_row(b: RemoteBench, server: Nginx) -> None:
    """R1 through hf:// (nginx in the Hub's layout) vs curl of the commit's resolve URL."""
    from tests.support.servers import HubRepo

    path, offset, size = big_model(b)
    repo = HubRepo("bench/big")
    sha = repo.commit({"model.safetensors": path})
    hub = Nginx(b.work / "hub", repos=[repo], workers=2).start()
    env = {"HF_ENDPOINT": hub.url, "HF_HOME": str(b.work / "hf-home"),
           "HF_HUB_DISABLE_IMPLICIT_TOKEN": "1"}
    try:
        ours, ref, cpu = sequential(b, "hf://bench/big/model.safetensors",
                                    f"{hub.url}/bench/big/resolve/{sha}/model.safetensors",
                                    offset, size, "big/weight", env=env)
    finally:
        hub.stop()
    mbps = lambda dt: size / dt / 1e6  # noqa: E731 (a one-line formula)
    b.row("R1-hf", "R1 through hf:// (nginx in the Hub's layout) vs `curl` of the same range of "
          "the commit's file", mbps(ours), mbps(ref), "MB/s", ">= 0.8",
          f"daemon {cpu / (size / (1 << 30)):.2f} CPU s/GiB")


def _cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat", "rb") as f:
        fields = f.read().rsplit(b")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _daemon_pid(mnt: Path) -> int:
    from tensorfs.runtime import pid_file

    with open(pid_file(str(mnt))) as f:
        return int(f.read().split()[0])


def r5(b: RemoteBench, server: Nginx) -> None:
    """Four readers of four 64 MiB tensors of one file at once vs four curls at once."""
    from concurrent.futures import ThreadPoolExecutor

    from safetensors.numpy import save_file

    size = 64 * MiB
    path = b.work / "four.safetensors"
    if not path.exists():
        rng = np.random.default_rng(2)
        save_file({f"t{i}.weight": rng.integers(0, 255, size, dtype=np.uint8) for i in range(4)},
                  str(path))
    from tensorfs.sources.modelfile import parse_model_file

    tensors = [t for t in parse_model_file(str(path)).tensors]
    url = server.put("files/four.safetensors", path)
    receivers = _receivers(b)
    ours: dict[str, list[float]] = {suffix: [] for suffix, _ in receivers}
    refs = []
    for _ in range(b.args.repeat):
        with ThreadPoolExecutor(4) as pool:
            t0 = time.perf_counter()
            list(pool.map(lambda t: curl(url, t.offset, t.nbytes), tensors))
            refs.append(time.perf_counter() - t0)
        for suffix, env in receivers:       # interleaved with curl's, round by round
            with b.mount(url, "--timeout", "120", env=env) as (mnt, _):
                with ThreadPoolExecutor(4) as pool:
                    t0 = time.perf_counter()
                    got = list(pool.map(lambda t: read_all(mnt / t.name.replace(".", "/"))[0],
                                        tensors))
                    ours[suffix].append(time.perf_counter() - t0)
                assert got == [size] * 4, got
    mbps = lambda dt: 4 * size / dt / 1e6  # noqa: E731 (a one-line formula)
    for suffix, _ in receivers:
        b.row("R5" + suffix, "four readers of four 64 MiB tensors of one http mount at once vs "
              "four `curl`s at once", mbps(min(ours[suffix])), mbps(min(refs)), "MB/s", ">= 0.8")


@contextmanager
def _direct(url):
    yield url


def r3(b: RemoteBench, server: Nginx) -> None:
    import gguf

    from rows.common import Bench
    from rows.models import vocab_models

    class Args(argparse.Namespace):           # bench/run.py's options this row does not set
        def __getattr__(self, name):
            return None

    ns = Args(workdir=str(b.work / "vocab"), tensorfs_path=str(REPO), option=[],
                            vocab=b.args.vocab, header_tensors=b.args.header_tensors)
    gpath, _ = vocab_models(Bench(ns))
    url = server.put("files/vocab.gguf", Path(gpath))
    mounts = []
    mark = server.log_mark()
    for _ in range(b.args.repeat):
        with b.mount(url) as (_, ready):
            mounts.append(ready)
    sent = sum(r["bytes"] for r in server.requests(mark)) / b.args.repeat
    t0 = time.perf_counter()
    gguf.GGUFReader(gpath)
    ref = time.perf_counter() - t0
    header = gguf.GGUFReader(gpath).data_offset
    b.row("R3", f"`tensorfs mount` of the remote GGUF ({b.args.vocab:,}-token vocabulary, "
          f"{b.args.header_tensors:,} tensors) until ready vs gguf.GGUFReader on the local file",
          min(mounts), ref, "s", "<= 0.2",
          f"{sent / MiB:.2f} MiB fetched per mount, header {header / MiB:.2f} MiB")


def r4(b: RemoteBench, server: Nginx) -> None:
    path, offset, size = big_model(b)
    url = server.put("files/cached.safetensors", path)
    cache = Path(tempfile.mkdtemp(prefix="diskcache-", dir=b.work))
    passes = []
    for _ in range(2):
        mark = server.log_mark()
        with b.mount(url, "--disk-cache", str(cache)) as (mnt, _):
            after_mount = server.log_mark()
            n, dt = read_all(mnt / "big" / "weight")
            assert n == size
        time.sleep(0.3)
        everything, since_mount = server.requests(mark), server.requests(after_mount)
        reads = [r for r in since_mount if parse_range(r["range"])]
        at_mount = everything[:len(everything) - len(since_mount)]
        passes.append((sum(r["bytes"] for r in reads), len(reads), sum(r["bytes"] for r in at_mount), dt))
    shutil.rmtree(cache, ignore_errors=True)
    (first, n1, m1, dt1), (second, n2, m2, dt2) = passes
    b.row("R4", f"--disk-cache, second mount reading the {b.args.big_mib} MiB tensor again: bytes fetched "
          f"again by reads ({n2} requests; first mount: {n1} requests, {first / MiB:.0f} MiB; "
          f"at mount {m2 / 1024:.0f} KiB) vs the first mount's", second, first, "B", "0",
          f"read {size / dt2 / 1e6:,.0f} MB/s from disk vs {size / dt1 / 1e6:,.0f} MB/s over http")


def report(b: RemoteBench, command: str, elapsed: float) -> str:
    lines = [BEGIN, "", f"Run {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC, "
             f"{elapsed / 60:.1f} min, with:", "", "```", command, "```", "",
             f"Machine: {os.cpu_count()} CPUs, Linux {platform.release()}, Python "
             f"{platform.python_version()}; nginx "
             f"{_nginx_version()}, curl {_curl_version()}; load average when it ended "
             f"{os.getloadavg()[0]:.2f}.  Best of {b.args.repeat}; the mount's reader uses read(2) into a "
             "1 MiB buffer, each time on a fresh mount.", "",
             "| row | measurement | tensorfs | reference | ratio | goal | note |",
             "|---|---|---:|---:|---:|---|---|"]
    for num, what, ours, ref, unit, ratio, goal, note in b.rows:
        lines.append(f"| {num} | {what} | {_fmt(ours, unit)} | {_fmt(ref, unit)} | {ratio:.2f} | {goal} | {note} |")
    lines += ["", END]
    return "\n".join(lines)


def _fmt(v, unit):
    if unit == "MB/s":
        return f"{v:,.0f} MB/s"
    if unit == "s":
        return f"{v:.3f} s"
    return f"{v / MiB:,.1f} MiB" if v >= MiB else f"{v:,.0f} B"


def _nginx_version() -> str:
    out = subprocess.run(["nginx", "-v"], capture_output=True, text=True).stderr
    return out.strip().split("/")[-1]


def _curl_version() -> str:
    return subprocess.run(["curl", "--version"], capture_output=True, text=True).stdout.split()[1]


def write_docs(text: str, path: Path) -> None:
    doc = path.read_text()
    if BEGIN in doc:
        doc = doc[:doc.index(BEGIN)] + text + doc[doc.index(END) + len(END):]
    else:
        doc = doc.rstrip("\n") + "\n\n## Remote models (`bench/rows/remote.py`)\n\n" + text + "\n"
    path.write_text(doc)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", default="r1r2,r5,r3,r4,s3,hf",
                   help="comma-separated: r1r2 (R1, R2, R6), r5, r3, r4, s3, hf")
    p.add_argument("--transports", default="http.client,obstore",
                   help="the receivers of the http rows (R1, R2, R6, R5), comma-separated "
                        "(TENSORFS_HTTP_TRANSPORT)")
    p.add_argument("--big-mib", type=int, default=256)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--rtt-ms", type=float, default=20)
    p.add_argument("--window-mib", type=int, default=4)
    p.add_argument("--vocab", type=int, default=150_000)
    p.add_argument("--header-tensors", type=int, default=3000)
    p.add_argument("--workdir", default=str(REPO / "build" / "bench-remote"))
    p.add_argument("--out", default=str(REPO / "docs" / "internals" / "benchmarks.md"))
    p.add_argument("--no-report", action="store_true")
    args = p.parse_args()
    if not shutil.which("curl"):
        print("curl is missing (apt-get install curl)", file=sys.stderr)
        return 1
    b = RemoteBench(args)
    server = Nginx(b.work / "nginx", workers=2).start()
    t0 = time.perf_counter()
    try:
        for name in args.rows.split(","):
            {"r1r2": r1_r2, "r5": r5, "r3": r3, "r4": r4, "s3": s3_row, "hf": hf_row}[name](b, server)
    finally:
        server.stop()
    elapsed = time.perf_counter() - t0
    text = report(b, "python bench/rows/remote.py " + " ".join(sys.argv[1:]), elapsed)
    print(text)
    if not args.no_report:
        write_docs(text, Path(args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
