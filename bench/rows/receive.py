"""What receiving a remote file's blocks costs a process, by how the body is taken: the
receive side of a remote mount's reads, without FUSE (docs/internals/copylimit.md).

    python bench/rows/receive.py [--size-mib 1024] [--threads 4] [--repeat 3]

One loopback nginx (tests/support/servers.py) serves a file of noise; ``--threads`` threads
read it in 4 MiB ranges, each range once, as the mount's fetch threads do.  Ways:

  stream     obstore ``get`` + ``stream(min_chunk_size=want)``: what tensorfs does (bounded:
             a body longer than asked is refused without being taken whole); each block a
             new Python ``bytes``, zeroed and copied by pyo3
  get_range  obstore ``get_range``: its own ``Bytes`` (buffer protocol, no Python ``bytes``
             made), but unbounded (it takes any body whole): what obstore's zero-copy
             buffer would save, were it offered bounded
  http.client  ``tensorfs.sources.transports.receive.Receiver``: http.client's ``readinto``
             into a reused buffer, on a kept connection per thread (what a mount does with
             ``TENSORFS_HTTP_TRANSPORT=http.client``)
  curl       ``--threads`` curl processes, each receiving its share of the file in one
             request (their CPU: the reference)

Rows: process CPU s (user + system), minor page faults and context switches (voluntary and
not) per GiB received, best of ``--repeat``; the figures depend on the machine's load
(printed with them).
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]          # bench/
sys.path.insert(0, str(HERE.parent))

from tests.support.servers import Nginx  # noqa: E402 - after the path is set

MiB = 1 << 20
BLOCK = 4 * MiB


def ranges(size: int) -> list[tuple[int, int]]:
    return [(start, min(size, start + BLOCK)) for start in range(0, size, BLOCK)]


def run_threads(threads: int, work, todo: list) -> None:
    lock = threading.Lock()

    def loop():
        state: dict = {}
        while True:
            with lock:
                if not todo:
                    return
                start, end = todo.pop(0)
            work(state, start, end)

    pool = [threading.Thread(target=loop) for _ in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()


def way_stream(store, name):
    import obstore as obs

    def work(state, start, end):
        result = obs.get(store, name, options={"range": (start, end)})
        stream = result.stream(min_chunk_size=end - start)
        body = next(stream, b"")
        assert len(body) == end - start and next(stream, None) is None
    return work


def way_get_range(store, name):
    import obstore as obs

    def work(state, start, end):
        body = obs.get_range(store, name, start=start, end=end)
        assert len(body) == end - start
    return work


def way_receiver(url):
    from tensorfs.sources.transports.receive import Receiver
    from tensorfs.sources.urls import RemoteSettings

    receiver = Receiver(RemoteSettings(timeout=60), {}, None, https_only=False)

    def work(state, start, end):
        body, _ = receiver.get(url, start, end, 60, size=None)
        assert len(body) == end - start
    return work


def curl(url: str, size: int, threads: int) -> None:
    import subprocess

    procs = [subprocess.Popen(["curl", "-s", "-o", "/dev/null", "-r",
                               f"{k * size // threads}-{(k + 1) * size // threads - 1}", url])
             for k in range(threads)]
    for p in procs:
        p.wait()


def measure(work, size: int, threads: int) -> tuple[float, float, float]:
    who = resource.RUSAGE_CHILDREN if isinstance(work, str) else resource.RUSAGE_SELF
    before = resource.getrusage(who)
    if isinstance(work, str):
        curl(work, size, threads)
    else:
        run_threads(threads, work, ranges(size))
    after = resource.getrusage(who)
    gib = size / (1 << 30)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    switches = (after.ru_nvcsw - before.ru_nvcsw) + (after.ru_nivcsw - before.ru_nivcsw)
    return cpu / gib, (after.ru_minflt - before.ru_minflt) / gib, switches / gib


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size-mib", type=int, default=1024)
    parser.add_argument("--threads", type=int, default=4)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    import obstore
    from obstore.store import HTTPStore

    work_dir = Path(tempfile.mkdtemp(prefix="bench-receive-"))
    nginx = Nginx(work_dir / "srv", workers=2).start()
    try:
        path = work_dir / "blob"
        with open(path, "wb") as f:
            chunk = os.urandom(16 * MiB)
            for _ in range(args.size_mib // 16):
                f.write(chunk)
        url = nginx.put("files/blob", path)
        size = os.path.getsize(path)
        store = HTTPStore.from_url(url.rsplit("/", 1)[0], client_options={"allow_http": True})
        obstore.head(store, "blob")
        ways = {"stream": way_stream(store, "blob"), "get_range": way_get_range(store, "blob"),
                "http.client": way_receiver(url), "curl": url}
        results: dict[str, list[tuple[float, float, float]]] = {name: [] for name in ways}
        loads = []
        for _ in range(args.repeat):
            loads.append(os.getloadavg()[0])
            for name, work in ways.items():
                results[name].append(measure(work, size, args.threads))
                time.sleep(0.2)
        print("| way | CPU s per GiB | page faults per GiB | context switches per GiB |")
        print("|---|---:|---:|---:|")
        for name, values in results.items():
            print(f"| {name} | {min(v[0] for v in values):.2f} | "
                  f"{min(v[1] for v in values):,.0f} | {min(v[2] for v in values):,.0f} |")
        print(f"\nBest of {args.repeat}, {args.size_mib} MiB in 4 MiB ranges, {args.threads} "
              f"threads, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {os.cpu_count()} "
              f"CPUs, load {min(loads):.1f}-{max(loads):.1f} at the rounds' starts.")
    finally:
        nginx.stop()
        shutil.rmtree(work_dir, ignore_errors=True)


if __name__ == "__main__":
    main()
