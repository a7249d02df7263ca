"""Row 5: how long a mount takes until it is live (in-process parse alongside)."""

from __future__ import annotations

import subprocess
import sys
import time

from rows.common import Bench
from rows.models import vocab_models


def row_mount_time(b: Bench) -> None:
    """5: mount-ready time vs GGUFReader / safe_open."""
    import gguf
    from safetensors import safe_open

    a = b.args
    gpath, spath = vocab_models(b)
    print("row 5: mount-ready time", flush=True)
    startup = []
    for _ in range(a.repeat):
        t0 = time.perf_counter()
        subprocess.run([*b.tensorfs, "--version"], env=b.env, cwd=b.work, capture_output=True, check=True)
        startup.append(time.perf_counter() - t0)
    out = {}
    for label, path in (("gguf", gpath), ("safetensors", spath)):
        readies = []
        for _ in range(a.repeat):
            with b.mount(path) as (mnt, _, ready):
                readies.append(ready)
        parse = []
        for _ in range(a.repeat):
            code = ("import time,sys; from tensorfs.loading.loader import load_model; "
                    "from tensorfs.mount.tree import build_mount; from tensorfs.budget import MemoryBudget; "
                    f"t=time.perf_counter(); m=build_mount(load_model({path!r}), MemoryBudget(1<<28)); "
                    "print(time.perf_counter()-t)")
            done = subprocess.run([sys.executable, "-c", code], env=b.env, cwd=b.work, capture_output=True,
                                  text=True, check=True)
            parse.append(float(done.stdout.split()[-1]))
        refs = []
        for _ in range(a.repeat):
            if refs and refs[0] > 5:            # GGUFReader on a big vocabulary: once is enough
                break
            t0 = time.perf_counter()
            if label == "gguf":
                r = gguf.GGUFReader(path)
                del r
            else:
                with safe_open(path, "numpy") as f:
                    f.keys()
            refs.append(time.perf_counter() - t0)
        out[label] = b.record(f"5_mount_{label}", mount_s=min(readies), in_process_s=min(parse),
                              reference_s=min(refs), startup_s=min(startup))
