"""A Hugging Face directory in llama.cpp: mount + llama.cpp's first token from the mounted
GGUF (files/NAME-BF16.gguf, composed on demand) against convert_hf_to_gguf.py + the first
token from the file it wrote; then the daemon's memory while the mounted Q8_0 file (every
tensor computed on read) and the BF16 one are read whole.

The model: SmolLM2-135M's shapes (hidden 576, 30 layers, 9 heads, 3 KV heads), random BF16
weights, tied embeddings, Llama 2's tokenizer (tests/support/hf_tokenizers.py): about 270 MB.
The converter is llama.cpp's, as ``make convert-oracle`` sets it up (TENSORFS_CONVERT_ORACLE).

    TENSORFS_CONVERT_ORACLE=... python bench/run.py hfgguf   (or bench/rows/hfgguf.py [--workdir DIR])
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.hfgguf.tiny import llama_config, llama_shapes, random_tensors, write_safetensors

_p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
_p.add_argument("--workdir", default="/tmp/tensorfs-bench-hfgguf")
_args = _p.parse_args()
work = Path(_args.workdir)
if not os.environ.get("TENSORFS_CONVERT_ORACLE"):
    sys.exit("bench/rows/hfgguf.py: set TENSORFS_CONVERT_ORACLE (make convert-oracle; make bench sets it)")
oracle = Path(os.environ["TENSORFS_CONVERT_ORACLE"])
T = os.path.join(os.path.dirname(sys.executable), "tensorfs")
model = work / "SmolBench-135M"
FIRST_TOKEN = """
import sys, time
t = time.perf_counter()
from llama_cpp import Llama
llm = Llama(model_path=sys.argv[1], n_ctx=64, n_threads=2, verbose=False)
out = llm("Hello", max_tokens=1, temperature=0.0)
print(time.perf_counter() - t)
"""


def make_model() -> None:
    if (model / "model.safetensors").exists():
        return
    from tests.support.hf_tokenizers import write_tokenizer
    model.mkdir(parents=True, exist_ok=True)
    write_tokenizer(model, "llama-spm")
    cfg = llama_config(32000, hidden_size=576, intermediate_size=1536, num_attention_heads=9,
                       num_key_value_heads=3, num_hidden_layers=30, tie_word_embeddings=True,
                       max_position_embeddings=8192, rope_theta=100000.0)
    (model / "config.json").write_text(json.dumps(cfg, indent=2))
    write_safetensors(model / "model.safetensors",
                      random_tensors(llama_shapes(cfg, tied=True), "BF16", 0))


def first_token(path: Path) -> float:
    out = subprocess.run([sys.executable, "-c", FIRST_TOKEN, str(path)], check=True,
                         capture_output=True, text=True)
    return float(out.stdout.strip().splitlines()[-1])


def drop_caches() -> None:
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("1")
    except OSError:
        pass


def rss_kb(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def read_whole(path: Path, pid: int) -> tuple[float, int]:
    peak = [rss_kb(pid)]
    done = threading.Event()

    def sample():
        while not done.is_set():
            peak[0] = max(peak[0], rss_kb(pid))
            time.sleep(0.05)
    threading.Thread(target=sample, daemon=True).start()
    t = time.perf_counter()
    with open(path, "rb") as f:
        while f.read(1 << 20):
            pass
    done.set()
    return time.perf_counter() - t, peak[0]


def main() -> None:
    work.mkdir(parents=True, exist_ok=True)
    make_model()
    size = (model / "model.safetensors").stat().st_size
    print(f"model: {size / 1e6:.0f} MB BF16 safetensors, load {open('/proc/loadavg').read().split()[:3]}")
    out = work / "converted"
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir()
    drop_caches()
    t = time.perf_counter()
    subprocess.run([str(oracle / "bin" / "convert"), str(model), "--outtype", "bf16",
                    "--outfile", str(out)], check=True, capture_output=True)
    convert_s = time.perf_counter() - t
    written = next(out.iterdir())
    drop_caches()
    convert_first = first_token(written)
    mnt = work / "mnt"
    mnt.mkdir(exist_ok=True)
    drop_caches()
    t = time.perf_counter()
    subprocess.run([T, "mount", str(model), str(mnt)], check=True)
    mount_s = time.perf_counter() - t
    try:
        served = mnt / "files" / written.name
        mounted_first = first_token(served)
        same = subprocess.run(["cmp", str(written), str(served)]).returncode == 0
        rows = json.loads(subprocess.run([T, "list", "--json"], capture_output=True,
                                         text=True, check=True).stdout)
        pid = int(next(r["pid"] for r in rows if r["mountpoint"] == str(mnt)))
        base = rss_kb(pid)
        q8 = next(p for p in (mnt / "files").iterdir() if p.name.endswith("-Q8_0.gguf"))
        q8_size = q8.stat().st_size
        q8_s, q8_peak = read_whole(q8, pid)
        bf_s, bf_peak = read_whole(served, pid)
    finally:
        subprocess.run([T, "unmount", str(mnt)], check=True)
    a = convert_s + convert_first
    b = mount_s + mounted_first
    print(f"convert {convert_s:.2f} s + first token {convert_first:.2f} s = {a:.2f} s")
    print(f"mount   {mount_s:.2f} s + first token {mounted_first:.2f} s = {b:.2f} s "
          f"({a / b:.1f}x sooner); cmp-equal: {same}")
    print(f"daemon RSS: {base / 1024:.0f} MiB mounted; peak {q8_peak / 1024:.0f} MiB reading "
          f"the Q8_0 file whole ({q8_size / 1e6:.0f} MB in {q8_s:.1f} s), "
          f"peak {bf_peak / 1024:.0f} MiB reading the BF16 one ({bf_s:.1f} s)")


if __name__ == "__main__":
    main()
