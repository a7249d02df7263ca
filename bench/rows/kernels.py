"""Kernel throughput: tensorfs.convert vs gguf.quants.dequantize, MB/s of float32 output.

    python bench/rows/kernels.py [--mib 4] [--repeat 7]

Input: ``--mib`` MiB of random blocks (fp16 / f32 scale lanes set to finite values) per type.
Ours is measured twice: returning a fresh array (the plain API) and writing into a reused
``out=`` buffer.  gguf-py is measured on the same bytes shaped as a tensor of 4096-element
rows (how GGUFReader hands them over), and on the best of several other row shapes
(1 row, 16 rows, 256 rows; one block per row is far slower still), since its speed depends on the shape.
Each figure is the best of ``--repeat`` runs, all variants of a type taking turns.  Prints a markdown table.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))

from tensorfs.convert import conversion_for
from tensorfs.dtypes import GGML_TYPES_BY_NAME
from tensorfs.model import TensorInfo

HOT = ["BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K"]

# Offsets of the fp16 scale fields in each block (kept finite so NaN/inf do not dominate).
HALF_FIELDS = {
    "Q8_0": (0,), "Q4_0": (0,), "Q4_1": (0, 2), "Q5_0": (0,), "Q5_1": (0, 2),
    "Q2_K": (80, 82), "Q3_K": (108,), "Q4_K": (0, 2), "Q5_K": (0, 2), "Q6_K": (208,),
}


def random_blocks(name: str, n_bytes: int, rng: np.random.Generator) -> np.ndarray:
    gt = GGML_TYPES_BY_NAME[name]
    n_blocks = n_bytes // gt.type_size
    blocks = rng.integers(0, 256, (n_blocks, gt.type_size), dtype=np.uint8)
    for off in HALF_FIELDS.get(name, ()):
        scale = rng.standard_normal(n_blocks).astype(np.float16)
        blocks[:, off:off + 2] = scale.view(np.uint8).reshape(n_blocks, 2)
    if name == "BF16":
        blocks = rng.standard_normal(n_blocks // 2).astype(np.float32).view(np.uint16)[1::2].copy().view(np.uint8)
        blocks = blocks.reshape(-1, 2)
    return blocks.reshape(-1)


def interleaved_best(runs: dict, repeat: int) -> dict:
    """Best time of each callable, the callables taking turns (so load changes hit all alike)."""
    best = {label: float("inf") for label in runs}
    for fn in (f for _, f in runs.values()):
        fn()                                          # warm-up: lazy imports, grids, pages
    for _ in range(repeat):
        for label, (_, fn) in runs.items():
            t0 = time.perf_counter()
            fn()
            best[label] = min(best[label], time.perf_counter() - t0)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=float, default=4.0)
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--types", nargs="*", default=HOT)
    args = parser.parse_args()

    import gguf.quants
    from gguf import GGMLQuantizationType

    rng = np.random.default_rng(0)
    n_bytes = int(args.mib * 1024 * 1024)
    print(f"input: {args.mib:g} MiB of blocks per type; MB/s of float32 output, best of {args.repeat}\n")
    print("| type | ours | ours, out= reused | gguf-py, 4096-elem rows | gguf-py, best shape | ours / gguf-py best |")
    print("|---|---:|---:|---:|---:|---:|")
    for name in args.types:
        gt = GGML_TYPES_BY_NAME[name]
        data = random_blocks(name, n_bytes, rng)
        data.flags.writeable = False                 # like a read-only mmap
        tensor = TensorInfo("t", name, (data.size // gt.type_size * gt.block_size,), 0,
                            data.size, "bench", ggml_type=gt.id)
        conv = conversion_for(tensor)
        out = np.empty(data.size // gt.type_size * gt.block_size, dtype=np.float32)
        mb = out.nbytes / 1e6
        qtype = GGMLQuantizationType[name]
        row_bytes = 4096 // gt.block_size * gt.type_size
        n_rows = data.size // row_bytes
        shapes = {"rows": data[:n_rows * row_bytes].reshape(n_rows, row_bytes)}
        for rows in (1, 16, 256):
            usable = data.size // (rows * gt.type_size) * rows * gt.type_size
            shapes[f"{rows}"] = data[:usable].reshape(rows, -1)
        runs = {"ours": (mb, lambda: conv.convert(data)),
                "ours_out": (mb, lambda: conv.convert(data, out=out))}
        for label, arr in shapes.items():
            runs[label] = (arr.size // gt.type_size * gt.block_size * 4 / 1e6,
                           lambda arr=arr: gguf.quants.dequantize(arr, qtype))
        with np.errstate(all="ignore"):
            times = interleaved_best(runs, args.repeat)
        speeds = {label: runs[label][0] / times[label] for label in shapes}
        ours, ours_out = mb / times["ours"], mb / times["ours_out"]
        best = max(speeds.values())
        print(f"| {name} | {ours:,.0f} | {ours_out:,.0f} | {speeds['rows']:,.0f} | {best:,.0f} | {ours / best:.1f}× |")


if __name__ == "__main__":
    main()
