"""tensorfs beside rclone, the FUSE filesystem a user would pick instead to read a model over
HTTP (issue 31), in one run on one loopback nginx started here (tests/support/servers.py), with
`curl` of the same ranges as the wire's reference.

    python bench/rows/peers.py [--size-mib 1024] [--repeat 3] [--random 200] [--drop-caches]

Systems, interleaved round by round (each round starts with curl's, and the ratios to curl
are taken within a round: the machine's load moves between rounds), each row on a fresh
mount: tensorfs (`files/NAME`, the remote file's bytes) once per receiver of its http reads
(`TENSORFS_HTTP_TRANSPORT`: "tensorfs http.client", "tensorfs obstore"), `rclone mount :http:` with
`--vfs-cache-mode off` and `full` (Debian's rclone; `make bench` installs it).  Rows (best of --repeat):

  one reader      MB/s reading the whole file in 1 MiB reads
  four readers    aggregate MB/s, four threads each reading a quarter of the file at once
  random          total s of --random 1 MiB reads at random 4 KiB-aligned places, and the
                  bytes nginx sent for them ($body_bytes_sent in its access log)
  first 4 KiB     s from starting the mount command to the first 4 KiB of the file read,
                  after the command returned (rclone's --daemon returns after its own
                  readiness poll)
  first, polled   the same from starting the command, the file polled meanwhile (as a
                  user's program meets it; rclone in the foreground, without --daemon)
  CPU/GiB         the daemon's CPU s (user + system, /proc/PID/stat) per GiB of one reader

Prints a Markdown table; the figures depend on the machine's load (printed with them).
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from contextlib import contextmanager
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]          # bench/
REPO = HERE.parent
sys.path.insert(0, str(REPO))

from tests.support.servers import Nginx  # noqa: E402 - after the path is set

MiB = 1 << 20
NAME = "model.safetensors"


class ListingNginx(Nginx):
    """rclone's http backend lists a directory from its HTML index."""

    def config(self) -> str:
        return super().config().replace("location /files/ { }",
                                        "location /files/ { autoindex on; }")


def make_model(path: Path, size: int) -> None:
    """One U8 tensor of ``size`` bytes of noise in a safetensors file (no numpy needed)."""
    import json

    header = json.dumps({"w": {"dtype": "U8", "shape": [size], "data_offsets": [0, size]}})
    header += " " * (-len(header) % 8)
    with open(path, "wb") as f:
        f.write(len(header).to_bytes(8, "little") + header.encode())
        chunk = os.urandom(16 * MiB)
        for _ in range(size // len(chunk)):
            f.write(chunk)
        f.write(chunk[:size % len(chunk)])


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat", "rb") as f:
        fields = f.read().rsplit(b")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def daemon_of(mountpoint: Path) -> int | None:
    """The process serving ``mountpoint``: the one whose command line names it."""
    me = str(mountpoint).encode()
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    args = f.read().split(b"\0")
            except OSError:
                continue
            if me in args and b"unmount" not in args:
                return int(entry)
    return None


def read_all(path: Path, start: int, end: int) -> int:
    buf = bytearray(MiB)
    fd = os.open(path, os.O_RDONLY)
    try:
        pos = start
        while pos < end:
            n = os.preadv(fd, [memoryview(buf)[:min(MiB, end - pos)]], pos)
            if n <= 0:
                break
            pos += n
    finally:
        os.close(fd)
    return pos - start


class Bench:
    def __init__(self, args):
        self.args = args
        self.work = Path(tempfile.mkdtemp(prefix="bench-peers-"))
        self.env = dict(os.environ, PYTHONPATH=str(REPO))
        self.env.pop("PYTHONDONTWRITEBYTECODE", None)     # as installed: compiled modules
        for tree in (REPO, *([Path(args.baseline)] if args.baseline else [])):
            subprocess.run([sys.executable, "-m", "compileall", "-q", str(tree / "tensorfs")],
                           stdout=subprocess.DEVNULL, check=False)
        self.nginx = ListingNginx(self.work / "srv", workers=2).start()
        make_model(self.work / NAME, args.size_mib * MiB)
        self.url = self.nginx.put(f"files/{NAME}", self.work / NAME)
        self.size = os.path.getsize(self.work / NAME)
        self.results: dict[tuple[str, str], list[float]] = {}
        self.n = 0

    def close(self) -> None:
        self.nginx.stop()
        shutil.rmtree(self.work, ignore_errors=True)

    # -- mounts ----------------------------------------------------------------------------
    def mount_command(self, system: str, mnt: Path) -> list[str]:
        if system.startswith("tensorfs"):
            return [sys.executable, "-m", "tensorfs", "mount", self.url, str(mnt)]
        mode = system.split()[-1]
        cache = self.work / f"rclone-cache{self.n}"
        return ["rclone", "mount", ":http:", str(mnt), "--http-url", self.url.rsplit("/", 1)[0] + "/",
                "--vfs-cache-mode", mode, "--cache-dir", str(cache), "--read-only", "--daemon"]

    def file_in(self, system: str, mnt: Path) -> Path:
        return mnt / "files" / NAME if system.startswith("tensorfs") else mnt / NAME

    @contextmanager
    def mounted(self, system: str):
        self.n += 1
        mnt = self.work / f"mnt{self.n}"
        mnt.mkdir()
        if self.args.drop_caches:
            subprocess.run(["sh", "-c", "sync; echo 3 > /proc/sys/vm/drop_caches"], check=False)
        t0 = time.perf_counter()
        env = self.env
        if system == "tensorfs before":
            env = dict(env, PYTHONPATH=self.args.baseline)
        elif system.startswith("tensorfs "):       # the receiver this system names
            env = dict(env, TENSORFS_HTTP_TRANSPORT=system.split(" ", 1)[1])
        done = subprocess.run(self.mount_command(system, mnt), env=env, capture_output=True,
                              text=True, cwd=self.work, check=False)     # not this tree: `-m` looks in "."
        if done.returncode:
            raise RuntimeError(f"{system} mount: {done.stderr.strip()}")
        path = self.file_in(system, mnt)
        try:
            fd = os.open(path, os.O_RDONLY)
            os.pread(fd, 4096, 0)
            first = time.perf_counter() - t0
            os.close(fd)
            yield path, first, daemon_of(mnt)
        finally:
            pid = daemon_of(mnt)
            subprocess.run(["fusermount3", "-u", str(mnt)], capture_output=True, check=False)
            deadline = time.monotonic() + 10
            while pid and time.monotonic() < deadline and os.path.exists(f"/proc/{pid}"):
                with open(f"/proc/{pid}/stat", "rb") as f:
                    if f.read().rsplit(b")", 1)[1].split()[0] == b"Z":
                        break
                time.sleep(0.02)
            mnt.rmdir()

    def first_polled(self, system: str) -> None:
        """The first 4 KiB as a user meets them: from starting the mount command (rclone's in
        the foreground, without --daemon and its own readiness poll) to the first 4 KiB of the
        file read, polling the file meanwhile, not waiting for the command to return."""
        self.n += 1
        mnt = self.work / f"mnt{self.n}"
        mnt.mkdir()
        command = [c for c in self.mount_command(system, mnt) if c != "--daemon"]
        env = dict(self.env, PYTHONPATH=self.args.baseline) if system == "tensorfs before" else self.env
        path = self.file_in(system, mnt)
        t0 = time.perf_counter()
        proc = subprocess.Popen(command, env=env, cwd=self.work, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)
        try:
            deadline = time.monotonic() + 60
            while True:
                try:
                    fd = os.open(path, os.O_RDONLY)
                except OSError:
                    if time.monotonic() > deadline or proc.poll() not in (None, 0):
                        raise RuntimeError(f"{system}: {path} not served") from None
                    time.sleep(0.001)
                    continue
                got = len(os.pread(fd, 4096, 0))
                os.close(fd)
                if got == 4096:
                    break
            self.keep(system, "first polled", time.perf_counter() - t0)
        finally:
            if system.startswith("tensorfs"):       # its command returns once it serves
                proc.wait(timeout=60)
            subprocess.run(["fusermount3", "-u", str(mnt)], capture_output=True, check=False)
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            mnt.rmdir()

    def keep(self, system: str, row: str, value: float) -> None:
        self.results.setdefault((system, row), []).append(value)

    # -- rows --------------------------------------------------------------------------------
    def one_round(self, system: str) -> None:
        size = self.size
        with self.mounted(system) as (path, first, pid):
            self.keep(system, "first", first)
            cpu0 = cpu_seconds(pid) if pid else None
            t0 = time.perf_counter()
            read_all(path, 0, size)
            elapsed = time.perf_counter() - t0
            self.keep(system, "one", size / elapsed / 1e6)
            if cpu0 is not None:
                self.keep(system, "cpu", (cpu_seconds(pid) - cpu0) / (size / (1 << 30)))
        with self.mounted(system) as (path, _, _):
            quarters = [(k * size // 4, (k + 1) * size // 4) for k in range(4)]
            threads = [threading.Thread(target=read_all, args=(path, a, b)) for a, b in quarters]
            t0 = time.perf_counter()
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            self.keep(system, "four", size / (time.perf_counter() - t0) / 1e6)
        with self.mounted(system) as (path, _, _):
            rng = random.Random(31)
            places = [rng.randrange(0, (size - MiB) // 4096) * 4096 for _ in range(self.args.random)]
            mark = self.nginx.log_mark()
            fd = os.open(path, os.O_RDONLY)
            t0 = time.perf_counter()
            for at in places:
                os.pread(fd, MiB, at)
            self.keep(system, "random", time.perf_counter() - t0)
            os.close(fd)
            sent = sum(r["bytes"] for r in self.nginx.wait_quiet(mark, quiet=0.3, timeout=30))
            self.keep(system, "fetched", sent / MiB)

    def curl_round(self) -> None:
        size = self.size
        t0 = time.perf_counter()
        subprocess.run(["curl", "-s", "-o", "/dev/null", self.url], check=True)
        self.keep("curl", "one", size / (time.perf_counter() - t0) / 1e6)
        t0 = time.perf_counter()
        procs = [subprocess.Popen(["curl", "-s", "-o", "/dev/null", "-r",
                                   f"{k * size // 4}-{(k + 1) * size // 4 - 1}", self.url])
                 for k in range(4)]
        for p in procs:
            p.wait()
        self.keep("curl", "four", size / (time.perf_counter() - t0) / 1e6)
        t0 = time.perf_counter()
        subprocess.run(["curl", "-s", "-o", "/dev/null", "-r", "0-4095", self.url], check=True)
        self.keep("curl", "first", time.perf_counter() - t0)

    def run(self) -> None:
        systems = [f"tensorfs {t}" for t in self.args.transports.split(",")]
        systems += ["rclone off", "rclone full"]
        if self.args.baseline:
            systems.insert(len(systems) - 2, "tensorfs before")
        for _ in range(self.args.repeat):
            self.keep("load", "load", os.getloadavg()[0])
            self.curl_round()
            for system in systems:
                self.first_polled(system)
                self.one_round(system)
                for row in ("one", "four"):     # against curl of the same round: the load
                    self.keep(system, f"{row}/curl",        # moves between rounds
                              self.results[(system, row)][-1] / self.results[("curl", row)][-1])
        self.report(systems + ["curl"])

    def report(self, systems: list[str]) -> None:
        rows = [("one", f"one reader, MB/s ({self.args.size_mib} MiB file)", max, "{:,.0f}"),
                ("one/curl", "one reader / curl's (same round)", max, "{:.2f}"),
                ("four", "four readers, aggregate MB/s", max, "{:,.0f}"),
                ("four/curl", "four readers / curl's (same round)", max, "{:.2f}"),
                ("random", f"{self.args.random} random 1 MiB reads, total s", min, "{:.2f}"),
                ("fetched", f"MiB fetched for those {self.args.random} MiB", min, "{:,.0f}"),
                ("first", "mount command → first 4 KiB, s", min, "{:.3f}"),
                ("first polled", "start → first 4 KiB, file polled (rclone foreground), s", min,
                 "{:.3f}"),
                ("cpu", "daemon CPU s per GiB (one reader)", min, "{:.2f}")]
        print(f"| row | {' | '.join(systems)} |")
        print("|---|" + "---:|" * len(systems))
        for key, label, best, fmt in rows:
            cells = []
            for system in systems:
                values = self.results.get((system, key))
                cells.append(fmt.format(best(values)) if values else "")
            print(f"| {label} | {' | '.join(cells)} |")
        loads = self.results[("load", "load")]
        rclone = subprocess.run(["rclone", "version"], capture_output=True, text=True,
                                check=False).stdout
        nginx = subprocess.run(["nginx", "-v"], capture_output=True, text=True, check=False).stderr
        print(f"\nBest of {self.args.repeat}, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; "
              f"{rclone.splitlines()[0] if rclone else 'rclone ?'}, {nginx.strip()}, "
              f"{os.cpu_count()} CPUs, load {min(loads):.1f}-{max(loads):.1f} at the rounds' "
              f"starts, {os.getloadavg()[0]:.1f} at the end.")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size-mib", type=int, default=1024)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--random", type=int, default=200, help="random 1 MiB reads")
    parser.add_argument("--baseline", metavar="DIR",
                        help="also a tensorfs tree from DIR (git archive of another commit), "
                             "interleaved: a before/after in the same run")
    parser.add_argument("--transports", default="http.client,obstore",
                        help="the receivers of tensorfs's http reads to run, comma-separated")
    parser.add_argument("--drop-caches", action="store_true",
                        help="drop the page cache before each mount (a fresh mount's files "
                             "start uncached anyway; this also drops nginx's copy)")
    args = parser.parse_args()
    for tool in ("rclone", "curl", "fusermount3"):
        if shutil.which(tool) is None:
            sys.exit(f"bench/rows/peers.py: {tool} is not installed (make bench installs it)")
    bench = Bench(args)
    try:
        bench.run()
    finally:
        bench.close()


if __name__ == "__main__":
    main()
