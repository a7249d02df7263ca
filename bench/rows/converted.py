"""Row 4: the converted .npy views, against gguf-py's dequantize in-process."""

from __future__ import annotations

import os
import time

import numpy as np

from rows.common import Bench, mbps, pread_range, read_file
from rows.models import CONV_TYPES, conv_model


def row_converted(b: Bench) -> None:
    """4: each converted .npy through the mount (numpy.load, first read of a fresh mount) vs
    gguf.quants.dequantize of the tensor's rows in memory; BF16 .npy vs the raw file."""
    import gguf
    import gguf.quants

    a = b.args
    model = conv_model(b)
    reader = gguf.GGUFReader(model)
    by_name = {t.name: t for t in reader.tensors}
    print("row 4: converted views", flush=True)
    ours = {q: [] for q in CONV_TYPES}
    bf16_raw = []
    for _ in range(a.repeat):
        pread_range(model, 0, os.path.getsize(model))                   # source in page cache
        with b.mount(model, workers_ready="par/7/weight.npy") as (mnt, _, _):
            for q in CONV_TYPES:
                path = os.path.join(mnt, f"conv/{q}/weight.npy")
                t0 = time.perf_counter()
                arr = np.load(path)
                ours[q].append((arr.nbytes, time.perf_counter() - t0))
                del arr
            bf16_raw.append(read_file(os.path.join(mnt, "conv/BF16/weight")))
        with b.mount(model, "--workers", "0") as (mnt, _, _):   # issue 16: in-thread, as before
            for q in CONV_TYPES:
                if q == "BF16":
                    continue
                t0 = time.perf_counter()
                arr = np.load(os.path.join(mnt, f"conv/{q}/weight.npy"))
                ours.setdefault(f"{q}_w0", []).append((arr.nbytes, time.perf_counter() - t0))
                del arr
        with b.mount(model) as (mnt, _, _):                                # same kind of read
            bf16_npy = read_file(os.path.join(mnt, "conv/BF16/weight.npy"))
            ours.setdefault("BF16_read", []).append(bf16_npy)
        with b.mount(model, workers_ready="par/7/weight.npy") as (mnt, _, _):   # the daemon alone: no page cache
            for q in CONV_TYPES:
                path = os.path.join(mnt, f"conv/{q}/weight.npy")
                ours.setdefault(f"{q}_direct", []).append(read_file(path, flags=os.O_DIRECT))
        with b.mount(model, "--workers", "0") as (mnt, _, _):    # the same, in-thread
            for q in CONV_TYPES:
                if q != "BF16":
                    path = os.path.join(mnt, f"conv/{q}/weight.npy")
                    ours.setdefault(f"{q}_direct_w0", []).append(read_file(path, flags=os.O_DIRECT))
    for q in CONV_TYPES:
        t = by_name[f"conv.{q}.weight"]
        rows = np.array(t.data)                       # the rows as stored, in memory
        qtype = gguf.GGMLQuantizationType[q]
        with np.errstate(all="ignore"):
            gguf.quants.dequantize(rows[:16], qtype)
            times = []
            for _ in range(a.repeat):
                t0 = time.perf_counter()
                out = gguf.quants.dequantize(rows, qtype)
                times.append(time.perf_counter() - t0)
        mine = min(ours[q], key=lambda r: r[1])
        direct = min(ours[f"{q}_direct"], key=lambda r: r[1])
        extra = {}
        if f"{q}_w0" in ours:
            extra["tensorfs_w0"] = mbps(*min(ours[f"{q}_w0"], key=lambda r: r[1]))
            extra["direct_w0"] = mbps(*min(ours[f"{q}_direct_w0"], key=lambda r: r[1]))
        b.record(f"4_{q}", tensorfs=mbps(*mine), gguf_py=mbps(out.nbytes, min(times)), nbytes=out.nbytes,
                 direct=mbps(*direct), spread=max(r[1] for r in ours[q]) / mine[1], **extra)
        del rows, out
    b.record("4_BF16_npy_vs_raw", npy=mbps(*min(ours["BF16_read"], key=lambda r: r[1])),
             raw=mbps(*min(bf16_raw, key=lambda r: r[1])))
