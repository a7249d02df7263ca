"""Row 6: readers in parallel, and a raw read beside a conversion."""

from __future__ import annotations

import os
import threading
import time

from rows.common import Bench, mbps, parallel, pread_range, read_file
from rows.models import conv_model, raw_model


def row_parallel(b: Bench) -> None:
    """6: 1, 4, 8 parallel readers, each reading its own tensor: raw files (fresh mount,
    source in page cache) and Q4_K .npy views; and a raw reader beside a Q6_K reader."""
    a = b.args
    model = raw_model(b)
    cmodel = conv_model(b)
    print("row 6: parallel readers", flush=True)
    pread_range(model, 0, os.path.getsize(model))
    pread_range(cmodel, 0, os.path.getsize(cmodel))
    raw_files = [f"par/{i}/weight" for i in range(8)]
    q_files = [f"par/{i}/weight.npy" for i in range(8)]
    for kind, path, files, opts in (("raw", model, raw_files, ()), ("Q4_K", cmodel, q_files, ()),
                                    ("raw_nothreads", model, raw_files, ("-o", "nothreads")),
                                    ("Q4_K_nothreads", cmodel, q_files, ("-o", "nothreads"))):
        speeds = {}
        for n in (1, 4, 8):
            runs = []
            for _ in range(a.repeat):
                with b.mount(path, *opts) as (mnt, _, _):
                    runs.append(parallel(read_file, [os.path.join(mnt, f) for f in files[:n]]))
            speeds[n] = mbps(*min(runs, key=lambda r: r[1]))
        b.record(f"6_parallel_{kind}", one=speeds[1], four=speeds[4], eight=speeds[8])
    # one costly conversion beside a raw reader: the raw reader must not wait for it
    for label, opts in (("", ()), ("_nothreads", ("-o", "nothreads"))):
        alone, beside = [], []
        for _ in range(a.repeat):
            with b.mount(cmodel, *opts) as (mnt, _, _):
                alone.append(read_file(os.path.join(mnt, "conv/BF16/weight")))
            with b.mount(cmodel, *opts) as (mnt, _, _):
                result = {}
                slow = threading.Thread(target=lambda: result.setdefault(
                    "q", read_file(os.path.join(mnt, "conv/Q6_K/weight.npy"))))
                slow.start()
                time.sleep(0.05)
                beside.append(read_file(os.path.join(mnt, "conv/BF16/weight")))
                slow.join()
        b.record(f"6_raw_beside_conversion{label}", alone=mbps(*min(alone, key=lambda r: r[1])),
                 beside=mbps(*min(beside, key=lambda r: r[1])))
