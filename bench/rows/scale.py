"""Scale: a synthetic sharded model of many tensors, mounted for real.

    python bench/rows/scale.py [--tensors 10000 100000] [--shards 160] [--repeat 3] [--keep DIR]

For each tensor count: a Hugging Face layout (``model-0000K-of-00160.safetensors`` shards plus
``model.safetensors.index.json``) is written by hand, every data section a hole (``truncate``),
with MoE-style names ``model.layers.L.mlp.experts.E.{gate,up,down}_proj.weight`` (a realistic
deep tree: ~4 directories per 3 tensors).  Then, each the best of ``--repeat`` runs:

- ``mount``: wall time of ``tensorfs mount INDEX MNT`` (the command returns once the mount is
  live: parse, validate, build the tree, fork, FUSE init);
- ``find``: ``find MNT -type f | wc -l`` (every directory looked up and listed; files are
  raw + .npy, so twice the tensors, plus headers/ and metadata/), on the fresh mount and
  again (the kernel's caches: entries, attributes and listings);
- ``RssAnon``: the daemon's anonymous resident memory (``/proc/PID/status``) after mount and
  after the find;
- per tensor: the RSS difference between the two sizes over the tensor difference.

Also the first ``stat`` of ``metadata/tokenizer.ggml.tokens`` in a GGUF with a 150k-token
vocabulary (the file's size is computed then; the cost of the decode is in it).

Prints a markdown table.  No thresholds are asserted: it measures.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))

from tensorfs.runtime import pid_file

TENSORFS = [sys.executable, "-m", "tensorfs"]
SHAPE = (64, 64)
DTYPE, ITEM = "F16", 2
PROJ = ("gate_proj", "up_proj", "down_proj")


def tensor_names(n: int, layers: int = 100) -> list[str]:
    per_layer = -(-n // layers)
    names = []
    for layer in range(layers):
        names.append(f"model.layers.{layer}.input_layernorm.weight")
        expert = 0
        while len(names) < (layer + 1) * per_layer:
            for proj in PROJ:
                names.append(f"model.layers.{layer}.mlp.experts.{expert}.{proj}.weight")
            expert += 1
        del names[(layer + 1) * per_layer:]
    return names[:n]


def write_sparse_safetensors(path: str, names: list[str]) -> None:
    nbytes = ITEM * SHAPE[0] * SHAPE[1]
    header: dict = {"__metadata__": {"format": "pt"}}
    for i, name in enumerate(names):
        header[name] = {"dtype": DTYPE, "shape": list(SHAPE), "data_offsets": [i * nbytes, (i + 1) * nbytes]}
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(len(text).to_bytes(8, "little"))
        f.write(text)
        f.truncate(8 + len(text) + nbytes * len(names))     # the data: a hole


def write_model(directory: str, n_tensors: int, n_shards: int) -> str:
    os.makedirs(directory, exist_ok=True)
    names = tensor_names(n_tensors)
    weight_map = {}
    per = -(-len(names) // n_shards)
    for k in range(n_shards):
        part = names[k * per:(k + 1) * per]
        shard = f"model-{k + 1:05d}-of-{n_shards:05d}.safetensors"
        write_sparse_safetensors(os.path.join(directory, shard), part)
        weight_map.update((n, shard) for n in part)
    index = os.path.join(directory, "model.safetensors.index.json")
    with open(index, "w") as f:
        json.dump({"metadata": {"total_size": len(names) * ITEM * SHAPE[0] * SHAPE[1]},
                   "weight_map": weight_map}, f)
    return index


def rss_anon_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("RssAnon:"):
                return int(line.split()[1])
    raise RuntimeError("no RssAnon")


def run(*args) -> None:
    result = subprocess.run([*TENSORFS, *args], capture_output=True, text=True)
    if result.returncode != 0:
        raise SystemExit(f"tensorfs {' '.join(args)}: {result.stderr.strip()}")


def timed_find(mnt: str) -> tuple[float, str]:
    t0 = time.perf_counter()
    out = subprocess.run(f"find '{mnt}' -type f | wc -l", shell=True, capture_output=True,
                         text=True, check=True).stdout
    return time.perf_counter() - t0, out


def measure(index: str, mnt: str, repeat: int) -> dict:
    best: dict = {}
    for _ in range(repeat):
        os.makedirs(mnt, exist_ok=True)
        t0 = time.perf_counter()
        run("mount", index, mnt)
        mount_s = time.perf_counter() - t0
        try:
            with open(pid_file(mnt)) as f:
                pid = int(f.read())
            rss_mount = rss_anon_kib(pid)
            find_s, out = timed_find(mnt)
            rss_find = rss_anon_kib(pid)
            find2_s, _ = timed_find(mnt)
        finally:
            run("unmount", mnt)
        sample = dict(mount_s=mount_s, find_s=find_s, files=int(out), rss_mount=rss_mount,
                      rss_find=rss_find, find2_s=find2_s)
        if not best or mount_s < best["mount_s"]:
            best.update(mount_s=mount_s, rss_mount=rss_mount, files=sample["files"])
        if "find_s" not in best or find_s < best["find_s"]:
            best.update(find_s=find_s, rss_find=rss_find)
        best["find2_s"] = min(best.get("find2_s", find2_s), find2_s)
    return best


def vocab_stat(base: str) -> float:
    import gguf
    import numpy as np

    path = os.path.join(base, "vocab.gguf")
    writer = gguf.GGUFWriter(path, "llama")
    writer.add_token_list([f"tok{i}" if i % 97 else f"a\\b\n{i}" for i in range(150_000)])
    writer.add_tensor("w", np.zeros(4, np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    mnt = os.path.join(base, "vocab-mnt")
    os.makedirs(mnt, exist_ok=True)
    run("mount", path, mnt)
    try:
        t0 = time.perf_counter()
        os.stat(os.path.join(mnt, "metadata", "tokenizer.ggml.tokens"))
        return time.perf_counter() - t0
    finally:
        run("unmount", mnt)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tensors", type=int, nargs="+", default=[10_000, 100_000])
    parser.add_argument("--shards", type=int, default=160)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--keep", metavar="DIR", help="write the models here and keep them")
    args = parser.parse_args()

    base = args.keep or tempfile.mkdtemp(prefix="tensorfs-scale-")
    rows = []
    try:
        for n in args.tensors:
            directory = os.path.join(base, f"m{n}")
            t0 = time.perf_counter()
            shutil.rmtree(directory, ignore_errors=True)
            index = write_model(directory, n, args.shards)
            write_s = time.perf_counter() - t0
            result = measure(index, os.path.join(base, f"mnt{n}"), args.repeat)
            rows.append((n, write_s, result))
        stat_s = vocab_stat(base)
    finally:
        if not args.keep:
            shutil.rmtree(base, ignore_errors=True)

    print(f"{args.shards} shards, {SHAPE[0]}x{SHAPE[1]} {DTYPE} tensors (data sparse), "
          f"best of {args.repeat}, {os.cpu_count()} CPUs\n")
    print("| tensors | files found | mount (s) | find -type f \\| wc -l (s) | same, second run (s) "
          "| RssAnon after mount (MiB) | RssAnon after find (MiB) |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for n, _, r in rows:
        print(f"| {n:,} | {r['files']:,} | {r['mount_s']:.2f} | {r['find_s']:.2f} | {r['find2_s']:.2f} | "
              f"{r['rss_mount'] / 1024:.1f} | {r['rss_find'] / 1024:.1f} |")
    if len(rows) >= 2:
        (n0, _, a), (n1, _, b) = rows[0], rows[-1]
        per_mount = (b["rss_mount"] - a["rss_mount"]) * 1024 / (n1 - n0)
        per_find = (b["rss_find"] - a["rss_find"]) * 1024 / (n1 - n0)
        print(f"\nRSS per tensor ({n0:,} -> {n1:,}): {per_mount:,.0f} bytes after mount, "
              f"{per_find:,.0f} bytes after find")
    print(f"\nfirst stat of metadata/tokenizer.ggml.tokens (150,000 tokens): {stat_s * 1000:.0f} ms")


if __name__ == "__main__":
    main()
