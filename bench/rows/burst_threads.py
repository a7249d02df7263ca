"""What bursts of concurrent requests cost the daemon over time: its resident memory and
thread count after each round of bursts (issue 18: libfuse before 3.12 destroyed idle
workers, each keeping a pinned Python thread state).

    LD_LIBRARY_PATH=build/libfuse/3.10.5 .venv/bin/python bench/rows/burst_threads.py [ROUNDS]

Each burst is 48 threads asking for an extended attribute at once (the kernel caches no
xattr, so every call is a request, and a synchronous one: no ``max_background`` cap), which
makes libfuse start a worker per waiting request.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import numpy as np
from safetensors.numpy import save_file

BIN = Path(sys.executable).parent
THREADS, BURSTS_PER_ROUND = 48, 50


def daemon_status(pid: int) -> tuple[int, int]:
    fields = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            fields[key] = value.split()
    return int(fields["VmRSS"][0]), int(fields["Threads"][0])


def libfuse_of(pid: int) -> str:
    with open(f"/proc/{pid}/maps") as f:
        return next((line.split()[-1] for line in f if "libfuse3.so" in line), "?")


def burst(files: list[str]) -> None:
    gate = threading.Barrier(THREADS)

    def ask(path):
        gate.wait()
        for _ in range(4):
            os.getxattr(path, "user.tensorfs.dtype")

    workers = [threading.Thread(target=ask, args=(files[i % len(files)],)) for i in range(THREADS)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()


def main() -> None:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 6
    from tensorfs.runtime import pid_file
    with tempfile.TemporaryDirectory() as tmp:
        model = Path(tmp, "m.safetensors")
        save_file({f"t{i}": np.zeros(4, np.float32) for i in range(THREADS)}, str(model))
        mnt = Path(tmp, "mnt")
        mnt.mkdir()
        subprocess.run([BIN / "tensorfs", "mount", "--layout", "flat", model, mnt], check=True)
        try:
            pid = int(Path(pid_file(str(mnt))).read_text())
            print(f"daemon {pid} with {libfuse_of(pid)}")
            files = [str(mnt / f"t{i}") for i in range(THREADS)]
            burst(files)
            print("round  bursts  VmRSS_KiB  threads")
            print(f"{0:5}  {1:6}  {daemon_status(pid)[0]:9}  {daemon_status(pid)[1]:7}")
            for r in range(1, rounds + 1):
                for _ in range(BURSTS_PER_ROUND):
                    burst(files)
                rss, threads = daemon_status(pid)
                print(f"{r:5}  {1 + r * BURSTS_PER_ROUND:6}  {rss:9}  {threads:7}", flush=True)
        finally:
            subprocess.run([BIN / "tensorfs", "unmount", mnt], check=True)


if __name__ == "__main__":
    main()
