"""Rows 1, 2 and 3: a raw tensor read cold and warm through the mount (against a minimal
passthrough and the file itself), and numpy.load of a native .npy."""

from __future__ import annotations

import os
import time

import numpy as np

from rows.common import Bench, mbps, pread_range, read_file, tensor_range
from rows.models import raw_model


def row_raw(b: Bench) -> None:
    """1 (cold raw vs passthrough), 2 (warm vs pread), 3 (numpy.load vs fromfile), issue 2's
    256 MiB figure."""
    a = b.args
    model = raw_model(b)
    off, size = tensor_range(model, "big.weight")
    moff, msize = tensor_range(model, "mid.weight")
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
