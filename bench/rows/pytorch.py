"""A 1 GiB PyTorch checkpoint (issue 38): tensorfs's mount time and the read speed of the
safetensors file it composes (files/model.safetensors), against torch.load(weights_only=True)
of the checkpoint and against a conversion with safetensors' save_file (torch.load, then
save_file: what the Hub's convert.py does).  The median of RUNS runs of each, warm (the
checkpoint in the page cache: every contender reads the same bytes from memory).

    python bench/rows/pytorch.py [WORKDIR]     # prints a markdown table
"""
import gc
import os
import statistics
import subprocess
import sys
import time

import torch
from safetensors.torch import save_file

work = sys.argv[1] if len(sys.argv) > 1 else "/tmp/tensorfs-bench-pytorch"
RUNS = 3
os.makedirs(work, exist_ok=True)
T = os.path.join(os.path.dirname(sys.executable), "tensorfs")
ckpt = os.path.join(work, "pytorch_model.bin")
if not os.path.exists(ckpt):
    torch.manual_seed(0)
    state = {f"model.layers.{i}.mlp.weight": torch.randn(4096, 4096) for i in range(16)}
    torch.save(state, ckpt)                                  # 16 x 64 MiB = 1 GiB
    del state
size = os.path.getsize(ckpt)


def read_all(path) -> int:
    fd = os.open(path, os.O_RDONLY)
    n = 0
    try:
        while True:
            b = os.read(fd, 1 << 20)
            if not b:
                return n
            n += len(b)
    finally:
        os.close(fd)


def timed(fn):
    t = time.perf_counter()
    out = fn()
    return time.perf_counter() - t, out


read_all(ckpt)                                              # warm: the page cache holds it
mnt = os.path.join(work, "mnt")
os.makedirs(mnt, exist_ok=True)
mount_s, read_s, loads, converts = [], [], [], []
composed = 0
for _ in range(RUNS):
    s, _ = timed(lambda: subprocess.run([T, "mount", ckpt, mnt], check=True))
    mount_s.append(s)
    try:
        s, composed = timed(lambda: read_all(os.path.join(mnt, "files", "model.safetensors")))
        read_s.append(s)
    finally:
        subprocess.run([T, "unmount", mnt], check=True)
    s, state = timed(lambda: torch.load(ckpt, weights_only=True))
    loads.append(s)
    out = os.path.join(work, "converted.safetensors")
    s, _ = timed(lambda: (save_file({k: v.contiguous() for k, v in
                                     torch.load(ckpt, weights_only=True).items()}, out),
                          os.sync()))
    converts.append(s)
    os.unlink(out)
    del state
    gc.collect()

m = statistics.median
mib = 1 << 20
print(f"checkpoint: {size / mib:.0f} MiB, composed model.safetensors: {composed / mib:.0f} MiB; "
      f"median of {RUNS}, warm page cache")
print(f"uptime: {os.popen('uptime').read().strip()}")
print()
print("| what | seconds | MiB/s |")
print("|---|---|---|")
print(f"| tensorfs mount (returns once live) | {m(mount_s):.2f} | |")
print(f"| read MNT/files/model.safetensors whole | {m(read_s):.2f} | {composed / mib / m(read_s):.0f} |")
print(f"| tensorfs mount + read whole | {m(mount_s) + m(read_s):.2f} | |")
print(f"| torch.load(weights_only=True) | {m(loads):.2f} | {size / mib / m(loads):.0f} |")
print(f"| convert: torch.load + save_file (+ sync) | {m(converts):.2f} | "
      f"{size / mib / m(converts):.0f} |")
