"""Row 6w: parallel Q4_K readers by --workers, and the CPU seconds per GiB served."""

from __future__ import annotations

import os

from rows.common import Bench, cpu_seconds, mbps, parallel, pread_range, read_file
from rows.models import conv_model
from tests.support.processes import worker_pids


def row_workers(b: Bench) -> None:
    """6w (issue 16): N parallel Q4_K .npy readers (N = the CPUs) against one reader, with
    --workers 0 (in-thread) and 1..N worker processes; fresh mount per measurement."""
    a = b.args
    cmodel = conv_model(b)
    cores = len(os.sched_getaffinity(0))
    print(f"row 6w: {cores} parallel Q4_K readers by --workers", flush=True)
    pread_range(cmodel, 0, os.path.getsize(cmodel))
    files = [f"par/{i}/weight.npy" for i in range(max(cores, 1))]
    for w in range(0, cores + 1):
        runs = {"one": [], "n": []}
        cpu = []
        for _ in range(a.repeat):
            with b.mount(cmodel, "--workers", str(w), workers_ready="conv/Q4_0/weight.npy") as (mnt, _, _):
                runs["one"].append(read_file(os.path.join(mnt, files[0])))
            with b.mount(cmodel, "--workers", str(w), workers_ready="conv/Q4_0/weight.npy") as (mnt, pid, _):
                procs = [pid] + worker_pids(pid)
                before = sum(cpu_seconds(p) for p in procs)
                runs["n"].append(parallel(read_file, [os.path.join(mnt, f) for f in files]))
                # CPU seconds of the daemon and its workers per GiB served: what the two
                # CPUs are spent on (the readers' own kernel time is not in it)
                cpu.append((sum(cpu_seconds(p) for p in procs) - before) / (runs["n"][-1][0] / (1 << 30)))
        best = {k: min(v, key=lambda r: r[1]) for k, v in runs.items()}
        b.record(f"6w_{w}", one=mbps(*best["one"]), n=mbps(*best["n"]), readers=cores,
                 one_spread=max(r[1] for r in runs["one"]) / best["one"][1],
                 n_spread=max(r[1] for r in runs["n"]) / best["n"][1],
                 cpu_s_per_gib=min(cpu))
