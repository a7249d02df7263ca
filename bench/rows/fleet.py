"""A fleet on one origin fetch (issue 37 C, docs/reference/fleet.md): N nodes mount one URL, each
reading the whole model, straight from the origin or through a caching tier (nginx with
``slice``, ``proxy_cache`` and ``proxy_cache_lock``: ``tests/support/servers.py``'s
``CacheTier``, the config docs/reference/fleet.md shows), all on 127.0.0.1.

    python bench/rows/fleet.py [--size-mib 256] [--nodes 1,2,4] [--repeat 1]

Per N and path (origin or tier, the tier's cache empty at the start of each run): the total
time from starting the N ``tensorfs mount`` commands at once to the last node having read
``files/NAME`` whole, and the bytes the origin sent for the model ($body_bytes_sent in its
access log), as a multiple of the file.  The N nodes are N mounts on this one machine: they
share its CPUs, so the times say what the tier costs and saves here, not what N machines
would see.  Prints a Markdown table and the load.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]          # bench/
REPO = HERE.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(HERE))

from rows.peers import make_model  # noqa: E402 (bench/rows/peers.py)
from tests.support.servers import CacheTier, Nginx  # noqa: E402 (after the sys.path line above)

MiB = 1 << 20
NAME = "model.safetensors"
PATH = f"files/fleet/{NAME}"


def read_all(path: Path) -> int:
    buf = bytearray(MiB)
    done = 0
    with open(path, "rb", buffering=0) as f:
        while n := f.readinto(buf):
            done += n
    return done


class Bench:
    def __init__(self, args):
        self.args = args
        self.work = Path(tempfile.mkdtemp(prefix="tensorfs-bench-fleet-"))
        self.env = dict(os.environ, PYTHONPATH=str(REPO))
        make_model(self.work / NAME, args.size_mib * MiB)
        self.size = (self.work / NAME).stat().st_size
        self.origin = Nginx(self.work / "origin", workers=2)
        self.origin.put(PATH, self.work / NAME)
        self.origin.start()
        self.runs = 0

    def close(self) -> None:
        self.origin.stop()
        shutil.rmtree(self.work, ignore_errors=True)

    def tensorfs(self, *args) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "tensorfs", *map(str, args)],
                              env=self.env, capture_output=True, text=True)

    def node(self, url: str, mnt: Path) -> int:
        mounted = self.tensorfs("mount", url, mnt)
        if mounted.returncode != 0:
            raise RuntimeError(f"mount {url}: {mounted.stderr.strip()}")
        return read_all(mnt / "files" / NAME)

    def run(self, nodes: int, through_tier: bool) -> tuple[float, int]:
        """(seconds until every node has read the file, bytes the origin sent)."""
        self.runs += 1
        tier = None
        if through_tier:
            tier = CacheTier(self.work / f"tier{self.runs}", self.origin.port, workers=2).start()
        url = f"{(tier or self.origin).url}/{PATH}"
        mnts = [self.work / f"mnt{self.runs}.{i}" for i in range(nodes)]
        for mnt in mnts:
            mnt.mkdir()
        mark = self.origin.log_mark()
        try:
            start = time.perf_counter()
            with ThreadPoolExecutor(nodes) as pool:
                sizes = list(pool.map(lambda mnt: self.node(url, mnt), mnts))
            took = time.perf_counter() - start
            assert sizes == [self.size] * nodes, sizes
        finally:
            for mnt in mnts:
                self.tensorfs("unmount", mnt)
            if tier is not None:
                tier.stop()
                shutil.rmtree(tier.base, ignore_errors=True)
        sent = sum(r["bytes"] for r in self.origin.wait_quiet(mark) if r["uri"] == f"/{PATH}")
        return took, sent

    def table(self) -> None:
        rows = []
        for n in self.args.nodes:
            cells = []
            for through_tier in (False, True):
                best = min(self.run(n, through_tier) for _ in range(self.args.repeat))
                cells += [f"{best[0]:.2f}", f"{best[1] / self.size:.2f}×"]
            rows.append(f"| {n} | " + " | ".join(cells) + " |")
        print(f"\n{self.args.size_mib} MiB model, each node reading files/{NAME} whole\n")
        print("| nodes | origin: time s | origin bytes | tier: time s | origin bytes |")
        print("|---|---|---|---|---|")
        print("\n".join(rows))
        nginx = subprocess.run(["nginx", "-v"], capture_output=True, text=True).stderr.strip()
        print(f"\nBest of {self.args.repeat}, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; "
              f"{nginx}, {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f} at the end.")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size-mib", type=int, default=256)
    parser.add_argument("--nodes", type=lambda s: [int(n) for n in s.split(",")],
                        default=[1, 2, 4])
    parser.add_argument("--repeat", type=int, default=1)
    args = parser.parse_args()
    bench = Bench(args)
    try:
        bench.table()
    finally:
        bench.close()


if __name__ == "__main__":
    main()
