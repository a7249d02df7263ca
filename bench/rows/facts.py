"""Tensor facts (issue 23): ``tensorfs hash``, ``stats`` and ``diff``, each a ratio against a
reference measured in the same run (higher is better: reference time / tensorfs time).

    python bench/rows/facts.py [--model-mib 1024] [--q4k-mib 64] [--repeat 3] [--no-report]

T1  `tensorfs hash --sha256` of a --model-mib safetensors model vs `sha256sum` of the file,
    page cache warm                                                          goal >= 1.0
T2  `tensorfs stats` of a Q4_K GGUF (--q4k-mib stored) vs gguf-py dequantize + numpy's
    min/max/mean/std/absmax/NaN/Inf/zeros in one process                     goal >= 2
T3  `tensorfs diff` of that Q4_K model against its F16 vs gguf-py dequantize + numpy's
    max_abs_diff/nmse/cosine in one process                                   goal >= 2
T5  `tensorfs hash --sha256` of the T1 model over http (nginx on 127.0.0.1) vs
    `curl -s URL | sha256sum`                                                  goal >= 0.8

Each command runs in a fresh process (its start-up counted); the best of --repeat runs.
Writes its table into docs/internals/benchmarks.md between the facts markers (and prints it).
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parents[1]          # bench/
REPO = HERE.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))

MiB = 1 << 20
BEGIN, END = "<!-- facts:begin (bench/rows/facts.py rewrites this part) -->", "<!-- facts:end -->"
TENSORFS = [sys.executable, "-m", "tensorfs"]

BASELINE_STATS = r"""
import sys, numpy as np, gguf, gguf.quants
r = gguf.GGUFReader(sys.argv[1], "r")
for t in r.tensors:
    x = gguf.quants.dequantize(t.data, t.tensor_type).reshape(-1)
    w = x.astype(np.float64)
    f = w[np.isfinite(w)]
    print(t.name, x.size, f.min(), f.max(), f.mean(), f.std(), np.abs(f).max(),
          np.isnan(x).sum(), (x == np.inf).sum(), (x == -np.inf).sum(), (x == 0).sum())
"""

BASELINE_DIFF = r"""
import sys, numpy as np, gguf, gguf.quants
a = {t.name: t for t in gguf.GGUFReader(sys.argv[1], "r").tensors}
for t in gguf.GGUFReader(sys.argv[2], "r").tensors:
    u = a[t.name]
    x = gguf.quants.dequantize(u.data, u.tensor_type).reshape(-1).astype(np.float64)
    y = gguf.quants.dequantize(t.data, t.tensor_type).reshape(-1).astype(np.float64)
    d = x - y
    print(t.name, np.abs(d).max(), (d @ d) / (x @ x), (x @ y) / np.sqrt((x @ x) * (y @ y)))
"""


def best(command, repeat: int, ok=(0,), **kw) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        done = subprocess.run(command, stdout=subprocess.DEVNULL, **kw)
        times.append(time.perf_counter() - t0)
        if done.returncode not in ok:
            raise SystemExit(f"{command}: exit {done.returncode}")
    return min(times)


def write_big_safetensors(path: Path, mib: int) -> None:
    """--model-mib of random bytes in 64 tensors (U8), written without holding them all."""
    import json
    import struct

    n = 64
    per = mib * MiB // n
    header = {f"model.layers.{i}.weight": {"dtype": "U8", "shape": [per],
                                            "data_offsets": [i * per, (i + 1) * per]}
              for i in range(n)}
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    rng = np.random.default_rng(0)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text)
        for _ in range(n):
            f.write(rng.integers(0, 256, per, dtype=np.uint8).tobytes())


def write_q4k_pair(directory: Path, mib: int) -> tuple[Path, Path]:
    """A Q4_K model of --q4k-mib stored bytes (16 tensors) and its F16 (the values it
    dequantizes to), by gguf-py's writer."""
    import gguf

    from tests.support.quant_blocks import oracle, random_blocks

    rng = np.random.default_rng(1)
    q = gguf.GGUFWriter(str(directory / "q4_k.gguf"), "llama")
    f = gguf.GGUFWriter(str(directory / "f16.gguf"), "llama")
    n = 16
    blocks_per = mib * MiB // n // 144
    rows = max(1, blocks_per // 16)
    for i in range(n):
        blocks = random_blocks("Q4_K", rows * 16, rng, raw_tail=0).reshape(rows, -1)
        values = oracle("Q4_K", blocks.reshape(-1)).reshape(rows, 16 * 256)
        q.add_tensor(f"blk.{i}.ffn_up.weight", blocks, raw_dtype=gguf.GGMLQuantizationType.Q4_K)
        f.add_tensor(f"blk.{i}.ffn_up.weight", values.astype(np.float16))
    for w in (q, f):
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
    return directory / "q4_k.gguf", directory / "f16.gguf"


def load() -> str:
    one, five, _ = os.getloadavg()
    return f"load {one:.1f}/{five:.1f} on {os.cpu_count()} CPUs"


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--model-mib", type=int, default=1024)
    p.add_argument("--q4k-mib", type=int, default=64)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--rows", default="t1,t2,t3,t5")
    p.add_argument("--workdir", default=None)
    p.add_argument("--no-report", action="store_true")
    args = p.parse_args()
    work = Path(args.workdir or tempfile.mkdtemp(prefix="tensorfs-bench-facts-"))
    work.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, PYTHONPATH=str(REPO))
    rows = []
    wanted = args.rows.split(",")
    t_start = time.perf_counter()
    big = work / "big.safetensors"
    if {"t1", "t5"} & set(wanted) and not big.exists():
        write_big_safetensors(big, args.model_mib)
    if "t1" in wanted:
        subprocess.run(["cat", str(big)], stdout=subprocess.DEVNULL, check=True)   # warm
        ref = best(["sha256sum", str(big)], args.repeat)
        ours = best(TENSORFS + ["hash", "--sha256", str(big)], args.repeat, env=env)
        rows.append(("T1", f"hash --sha256, {args.model_mib} MiB safetensors (64 tensors), "
                     "page cache warm", "sha256sum", ref, ours, 1.0, load()))
    if {"t2", "t3"} & set(wanted):
        q4k, f16 = write_q4k_pair(work, args.q4k_mib)
        if "t2" in wanted:
            ref = best([sys.executable, "-c", BASELINE_STATS, str(q4k)], args.repeat, env=env)
            ours = best(TENSORFS + ["stats", str(q4k)], args.repeat, env=env)
            rows.append(("T2", f"stats of a Q4_K GGUF ({args.q4k_mib} MiB stored)",
                         "gguf-py dequantize + numpy", ref, ours, 2.0, load()))
        if "t3" in wanted:
            ref = best([sys.executable, "-c", BASELINE_DIFF, str(f16), str(q4k)],
                       args.repeat, env=env)
            ours = best(TENSORFS + ["diff", str(f16), str(q4k)], args.repeat, ok=(1,), env=env)
            rows.append(("T3", "diff of that Q4_K against its F16",
                         "gguf-py dequantize + numpy", ref, ours, 2.0, load()))
    if "t5" in wanted:
        from tests.support.servers import Nginx

        server = Nginx(work / "nginx", workers=2).start()
        try:
            url = server.put("files/big.safetensors", big)
            ref = best(["bash", "-c", f"curl -s {url} | sha256sum"], args.repeat)
            ours = best(TENSORFS + ["hash", "--sha256", url], args.repeat, env=env)
        finally:
            server.stop()
        rows.append(("T5", "hash --sha256 of the T1 model over http (nginx, 127.0.0.1)",
                     "`curl \\| sha256sum`", ref, ours, 0.8, load()))
    elapsed = time.perf_counter() - t_start
    command = "python bench/rows/facts.py " + " ".join(sys.argv[1:])
    lines = [f"`{command}` — {datetime.date.today()}, {platform.machine()}, "
             f"{os.cpu_count()} CPUs, {elapsed:.0f} s", "",
             "| row | what | reference | ref s | tensorfs s | ratio | goal | load (1/5 min) |",
             "|---|---|---|---|---|---|---|---|"]
    for row, what, ref_name, ref, ours, goal, ld in rows:
        ratio = ref / ours
        lines.append(f"| {row} | {what} | {ref_name} | {ref:.2f} | {ours:.2f} | "
                     f"**{ratio:.2f}** {'✓' if ratio >= goal else '✗'} | ≥ {goal:g} | {ld} |")
    text = "\n".join(lines) + "\n"
    print(text)
    if not args.no_report:
        doc = REPO / "docs" / "internals" / "benchmarks.md"
        body = doc.read_text()
        if BEGIN in body and END in body:
            head, rest = body.split(BEGIN, 1)
            _, tail = rest.split(END, 1)
            doc.write_text(head + BEGIN + "\n" + text + END + tail)
    if not args.workdir:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
