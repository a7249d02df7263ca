"""What one edit costs through an --edits mount, as the edits pile up and as the model grows:
1,000 new keys added one after the other (``echo V > metadata/KEY``: ms per key for the
first and the last 100), then one key edit on a model of 20,000 tensors (ms, median of 5).

    python bench/rows/edit_cost.py [WORKDIR]
"""
import os
import shutil
import statistics
import subprocess
import sys
import time

import gguf
import numpy as np

work = sys.argv[1] if len(sys.argv) > 1 else "/tmp/tensorfs-bench-edit-cost"
KEYS = int(os.environ.get("KEYS", "1000"))
TENSORS = int(os.environ.get("TENSORS", "20000"))
os.makedirs(work, exist_ok=True)
T = os.path.join(os.path.dirname(sys.executable), "tensorfs")


def model(path: str, n_tensors: int) -> str:
    if not os.path.exists(path):
        w = gguf.GGUFWriter(path, "llama")
        w.add_uint32("tokenizer.ggml.eos_token_id", 1)
        for i in range(n_tensors):
            w.add_tensor(f"blk.{i // 10}.t{i % 10}.weight", np.zeros(8, np.float32))
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
    return path


def mounted(model_path: str, label: str) -> tuple[str, str]:
    mnt, edits = os.path.join(work, label), os.path.join(work, label + "-edits")
    shutil.rmtree(edits, ignore_errors=True)
    os.makedirs(mnt, exist_ok=True)
    subprocess.run([T, "mount", model_path, mnt, "--edits", edits], check=True)
    return mnt, edits


def edit(path: str, text: str) -> float:
    t = time.perf_counter()
    with open(path, "w") as f:
        f.write(text)
    return (time.perf_counter() - t) * 1000


small, _ = mounted(model(os.path.join(work, "small.gguf"), 10), "keys")
try:
    costs = [edit(os.path.join(small, "metadata", f"bench.key{i}"), f"value {i}\n")
             for i in range(KEYS)]
    print(f"{KEYS} new keys: first 100 {statistics.mean(costs[:100]):.1f} ms/key, "
          f"last 100 {statistics.mean(costs[-100:]):.1f} ms/key")
finally:
    subprocess.run([T, "unmount", small], check=False)

big, _ = mounted(model(os.path.join(work, f"t{TENSORS}.gguf"), TENSORS), "tensors")
try:
    eos = os.path.join(big, "metadata", "tokenizer.ggml.eos_token_id")
    costs = [edit(eos, f"{i}\n") for i in range(2, 7)]
    print(f"one key edit on a model of {TENSORS} tensors: {statistics.median(costs):.0f} ms "
          "(median of 5)")
finally:
    subprocess.run([T, "unmount", big], check=False)
