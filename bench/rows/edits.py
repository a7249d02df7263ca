"""Reading files/ of an edited mount (--edits: the model composed on the fly, by copy) against
files/ of an unedited mount of the same model, on the same libfuse: the median of 5 cold
reads of each, alternated (page cache dropped: root), of a 100 MB GGUF after a metadata edit.

    python bench/rows/edits.py [WORKDIR]     # prints MB/s of each and their ratio
"""
import os
import subprocess
import sys
import time

import gguf
import numpy as np

work = sys.argv[1] if len(sys.argv) > 1 else "/tmp/tensorfs-bench-edits"
os.makedirs(work, exist_ok=True)
os.chdir(work)
T = os.path.join(os.path.dirname(sys.executable), "tensorfs")
env = dict(os.environ)
if not os.path.exists("big.gguf"):
    w = gguf.GGUFWriter("big.gguf", "llama")
    rng = np.random.default_rng(0)
    w.add_string("tokenizer.chat_template", "x")
    for i in range(25):
        w.add_tensor(f"blk.{i}.w", rng.standard_normal((1024, 1024)).astype(np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def read_all(path):
    fd = os.open(path, os.O_RDONLY)
    t = time.perf_counter()
    n = 0
    while True:
        b = os.read(fd, 1 << 20)
        if not b:
            break
        n += len(b)
    os.close(fd)
    return n / (time.perf_counter() - t) / 1e6


def drop():
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("1")


mounts = {}
for label, extra in (("plain", []), ("edited", ["--edits", os.path.join(work, "edits")])):
    mnt = os.path.join(work, label)
    os.makedirs(mnt, exist_ok=True)
    subprocess.run([T, "mount", "big.gguf", mnt, *extra], env=env, check=True)
    mounts[label] = mnt
try:
    with open(os.path.join(mounts["edited"], "metadata", "tokenizer.chat_template"), "w") as f:
        f.write("a longer template\n")
    rates = {label: [] for label in mounts}
    for _ in range(5):                  # alternated: a busy machine slows both alike
        for label, mnt in mounts.items():
            drop()
            rates[label].append(read_all(os.path.join(mnt, "files", "big.gguf")))
finally:
    for mnt in mounts.values():
        subprocess.run([T, "unmount", mnt], env=env, check=False)
res = {label: sorted(r)[len(r) // 2] for label, r in rates.items()}
print({k: round(v) for k, v in res.items()}, "MB/s (median of 5), ratio",
      round(res["edited"] / res["plain"], 2))
