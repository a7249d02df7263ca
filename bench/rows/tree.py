"""Row 7: ls -lR and find over a tree of many tensors, against the smallest C daemon."""

from __future__ import annotations

import os
import shutil
import subprocess
import time

from rows.common import HERE, Bench
from rows.models import tree_model


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
