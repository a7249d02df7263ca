"""Row 8: the daemon's memory while a model much larger than its cache is read."""

from __future__ import annotations

import os
import time

from rows.common import (
    Bench,
    mbps,
    pread_range,
    proc_status_kib,
    read_file,
    rss_anon_kib,
)
from rows.models import rss_model
from tests.support.processes import worker_pids


def row_rss(b: Bench) -> None:
    """8: daemon RssAnon after reading every file (raw and .npy) of a ~1 GiB model."""
    a = b.args
    model = rss_model(b)
    print("row 8: daemon memory", flush=True)
    pread_range(model, 0, os.path.getsize(model))
    for cache in a.cache_sizes:
        with b.mount(model, cache_size=cache) as (mnt, pid, _):
            before = rss_anon_kib(pid)
            total = 0
            t0 = time.perf_counter()
            for root, _, files in os.walk(mnt):
                for name in sorted(files):
                    total += read_file(os.path.join(root, name))[0]
            dt = time.perf_counter() - t0
            after = rss_anon_kib(pid)
            # issue 16: the workers' private memory, and the shared arena (RssShmem: the
            # daemon maps every slot a worker wrote, so its RssShmem counts the arena once)
            workers = worker_pids(pid)
            worker_anon = [proc_status_kib(w).get("RssAnon", 0) for w in workers]
            shmem = proc_status_kib(pid).get("RssShmem", 0)
            b.record(f"8_rss_{cache}", rss_before_mib=before / 1024, rss_after_mib=after / 1024,
                     read_gib=total / (1 << 30), mbps=mbps(total, dt), workers=len(workers),
                     worker_anon_mib=sum(worker_anon) / 1024, arena_mib=shmem / 1024,
                     total_mib=(after + shmem + sum(worker_anon)) / 1024)
