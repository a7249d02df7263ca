"""W1-W3 (issue "the mount is the model", docs/internals/benchmarks.md "whole files"): a local model's
whole file and raw tensor file read through a mount against the same bytes read directly,
all from the page cache, ratios in one run.

    python bench/rows/files.py [--size-mib 512] [--libfuse DIR ...] [--repeat 3]

W1: files/MODEL read sequentially (1 MiB reads) on a fresh mount, vs reading the file.
W2: the same file read again on that mount (the kernel's page cache of the mount).
W3: the tensor's raw file read on a fresh mount, vs ``pread`` of its range.
Each ``--libfuse DIR`` (a directory holding a built libfuse3.so.*: tests/fuse/test_libfuse_matrix.py
builds them under build/libfuse/) is run besides the system libfuse: passthrough needs
libfuse >= 3.17, the system's Debian 12 libfuse 3.14 splices.  Best of ``--repeat``.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from safetensors.numpy import save_file

TENSORFS = [str(Path(sys.executable).with_name("tensorfs"))]
CHUNK = 1 << 20


def read_all(path: Path, offset: int = 0, size: int | None = None) -> float:
    fd = os.open(path, os.O_RDONLY)
    try:
        end = os.fstat(fd).st_size if size is None else offset + size
        buf = bytearray(CHUNK)
        view = memoryview(buf)
        start = time.perf_counter()
        pos = offset
        while pos < end:
            n = os.preadv(fd, [view[:min(CHUNK, end - pos)]], pos)
            if n <= 0:
                break
            pos += n
        return time.perf_counter() - start
    finally:
        os.close(fd)


def mount(model: Path, mnt: Path, env: dict, log: Path) -> None:
    subprocess.run([*TENSORFS, "mount", str(model), str(mnt), "--log", str(log)], check=True,
                   env=env)


def unmount(mnt: Path, env: dict) -> None:
    subprocess.run([*TENSORFS, "unmount", str(mnt)], check=True, env=env)


def run(model: Path, tensor_offset: int, tensor_size: int, libdir: str | None,
        work: Path, repeat: int, copy: bool = False) -> dict:
    env = dict(os.environ)
    # copy: local reads copied through Python (the default); else splice offered
    env["TENSORFS_FD_REPLIES"] = "0" if copy else "1"
    # passthrough is off by default (docs/internals/reliability.md section 9): asked for, as measured
    env["TENSORFS_PASSTHROUGH"] = "0" if copy else "1"
    if libdir:
        env["LD_LIBRARY_PATH"] = str(Path(libdir).resolve())
    best = {}
    for i in range(repeat):
        read_all(model)                                  # the file in the page cache
        direct = read_all(model)
        direct_range = read_all(model, tensor_offset, tensor_size)
        mnt, log = work / f"mnt{i}", work / f"log{i}-{libdir and Path(libdir).name}"
        mnt.mkdir()
        mount(model, mnt, env, log)
        try:
            w1 = read_all(mnt / "files" / model.name)
            w2 = read_all(mnt / "files" / model.name)
        finally:
            unmount(mnt, env)
        mount(model, mnt, env, log)
        try:
            w3 = read_all(mnt / "tensor")
        finally:
            unmount(mnt, env)
        mnt.rmdir()
        text = log.read_text()
        row = {"W1": direct / w1, "W2": direct / w2, "W3": direct_range / w3,
               "direct_GBps": model.stat().st_size / direct / 1e9,
               "libfuse": re.search(r"libfuse (\S+)", text)[1],
               "mechanism": "python copy" if copy else re.search(r"local files: (\w+)", text)[1]}
        for key in ("W1", "W2", "W3"):
            best[key] = max(best.get(key, 0), row[key])
        best.update({k: row[k] for k in ("libfuse", "mechanism")})
        best["direct_GBps"] = max(best.get("direct_GBps", 0), row["direct_GBps"])
    return best


def c_reference(model: Path, binary: str, libdir: str, work: Path, repeat: int,
                splice: bool) -> dict:
    """W1 and W2 through libfuse's own C example ``passthrough_hp`` with the kernel's
    passthrough off: the FUSE round trip of a file served by a daemon, without any Python,
    on this kernel -- the ceiling of the copy and splice paths."""
    env = dict(os.environ, LD_LIBRARY_PATH=str(Path(libdir).resolve()))
    best: dict = {}
    for i in range(repeat):
        read_all(model)
        direct = read_all(model)
        mnt = work / f"cmnt{i}"
        mnt.mkdir()
        # it daemonizes once mounted
        subprocess.run([binary, "--nopassthrough", *([] if splice else ["--nosplice"]),
                        str(model.parent), str(mnt)], check=True, env=env)
        try:
            w1 = read_all(mnt / model.name)
            w2 = read_all(mnt / model.name)
        finally:
            subprocess.run(["umount", str(mnt)], check=True)
        mnt.rmdir()
        best["W1"] = max(best.get("W1", 0), direct / w1)
        best["W2"] = max(best.get("W2", 0), direct / w2)
        best["direct_GBps"] = max(best.get("direct_GBps", 0), model.stat().st_size / direct / 1e9)
    return best


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--size-mib", type=int, default=512)
    parser.add_argument("--libfuse", action="append", default=[])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--c-reference", metavar="PASSTHROUGH_HP",
                        help="also read the file through libfuse's example passthrough_hp "
                             "(built from the libfuse source; runs with the --libfuse "
                             "directory's library)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-files-") as tmp:
        work = Path(tmp)
        model = work / "model.safetensors"
        n = args.size_mib << 20
        save_file({"tensor": np.frombuffer(os.urandom(n), np.uint8)}, str(model))
        offset = model.stat().st_size - n
        print(f"model {model.stat().st_size / 2**20:.0f} MiB, load {os.getloadavg()[0]:.2f} "
              f"on {os.cpu_count()} CPUs")
        print("| libfuse | mechanism | W1 fresh | W2 warm | W3 raw tensor | direct GB/s |")
        print("|---|---|---|---|---|---|")
        runs = [(None, False), *((d, False) for d in args.libfuse), (None, True)]
        for libdir, copy in runs:
            r = run(model, offset, n, libdir, work, args.repeat, copy)
            print(f"| {r['libfuse']} | {r['mechanism']} | {r['W1']:.2f} | {r['W2']:.2f} | "
                  f"{r['W3']:.2f} | {r['direct_GBps']:.1f} |")
        if args.c_reference:
            libdir = args.libfuse[-1] if args.libfuse else "/usr/lib/x86_64-linux-gnu"
            for splice in (False, True):
                r = c_reference(model, args.c_reference, libdir, work, args.repeat, splice)
                print(f"| {Path(libdir).name} | C passthrough_hp, {'splice' if splice else 'copy'}"
                      f" (no kernel passthrough) | {r['W1']:.2f} | {r['W2']:.2f} | - | "
                      f"{r['direct_GBps']:.1f} |")
        print(f"load after {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
