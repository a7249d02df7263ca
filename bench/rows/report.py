"""The report: the machine, the table of ratios written into docs/internals/benchmarks.md, the plot."""

from __future__ import annotations

import datetime
import os
import platform
import re
import subprocess

import numpy as np

from rows.common import READ_BUF, Bench, MiB
from rows.models import CONV_TYPES


def machine() -> dict:
    import numpy

    mem = "?"
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemTotal:"):
                mem = f"{int(line.split()[1]) / (1 << 20):.1f} GiB"
    cpu = platform.processor() or "?"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    try:
        fuse_ver = subprocess.run(["fusermount", "-V"], capture_output=True, text=True).stdout.strip()
    except OSError:
        fuse_ver = "?"
    try:
        import importlib.metadata as md
        fusepy = md.version("fusepy")
    except Exception:
        fusepy = "?"
    try:
        from tensorfs.fuse.loader import libfuse
        version = libfuse().version
        libfuse3 = f"{version // 100}.{version % 100}"
    except Exception:
        libfuse3 = "?"
    return {"nproc": os.cpu_count(), "cpu": cpu, "memory": mem, "kernel": platform.release(),
            "python": platform.python_version(), "numpy": numpy.__version__, "fusepy": fusepy,
            "libfuse3": libfuse3, "fusermount": fuse_ver}


def _ratio(x, y):
    return x / y if y else float("nan")


def table(r: dict) -> list[tuple]:
    """(row, measurement, tensorfs, reference, ratio, goal)."""
    rows = []

    def add(num, what, ours, ref, ratio, goal=""):
        rows.append((num, what, ours, ref, ratio, goal))

    if "1_cold_raw" in r:
        x = r["1_cold_raw"]
        n = x["nbytes"] / (1 << 30)
        add("1", f"cold raw read, {n:g} GiB tensor (source dropped, fresh mount) vs passthrough",
            f"{x['tensorfs']:,.0f} MB/s", f"{x['passthrough']:,.0f} MB/s",
            _ratio(x["tensorfs"], x["passthrough"]), "≥ 0.9")
        add("1b", "... same, vs direct pread of the dropped source (disk)", f"{x['tensorfs']:,.0f} MB/s",
            f"{x['pread']:,.0f} MB/s", _ratio(x["tensorfs"], x["pread"]))
        y = r["1_fresh_raw"]
        add("1c", "raw read, fresh mount, source in page cache, vs passthrough",
            f"{y['tensorfs']:,.0f} MB/s", f"{y['passthrough']:,.0f} MB/s",
            _ratio(y["tensorfs"], y["passthrough"]), "≥ 0.9")
        add("1d", "... same, vs direct pread (page cache)", f"{y['tensorfs']:,.0f} MB/s",
            f"{y['pread']:,.0f} MB/s", _ratio(y["tensorfs"], y["pread"]))
        if "1_nothreads_raw" in r:
            t = r["1_nothreads_raw"]
            add("1e", "... same, `-o nothreads` (single-threaded libfuse) vs the default (multithreaded)",
                f"{t['tensorfs']:,.0f} MB/s", f"{t['multithreaded']:,.0f} MB/s",
                _ratio(t["tensorfs"], t["multithreaded"]))
        z = r["2_warm_raw"]
        add("2", "warm (second) raw read vs direct pread", f"{z['tensorfs']:,.0f} MB/s",
            f"{z['pread']:,.0f} MB/s", _ratio(z["tensorfs"], z["pread"]), "≥ 0.8")
        add("2b", "... passthrough's second read (no kernel_cache: through the daemon again)",
            f"{z['tensorfs']:,.0f} MB/s", f"{z['passthrough']:,.0f} MB/s",
            _ratio(z["tensorfs"], z["passthrough"]))
        w = r["3_npy_native"]
        add("3", f"numpy.load of a native F32 .npy ({w['nbytes'] >> 20} MiB, fresh mount) vs numpy.fromfile",
            f"{w['tensorfs']:,.0f} MB/s", f"{w['fromfile']:,.0f} MB/s", _ratio(w["tensorfs"], w["fromfile"]))
        v = r["issue2_256MiB"]
        add("3b", f"issue 2: first read of a {v['nbytes'] >> 20} MiB raw tensor vs pread "
            f"(mount ready in {v['mount_s']:.2f} s)", f"{v['tensorfs']:,.0f} MB/s",
            f"{v['pread']:,.0f} MB/s", _ratio(v["tensorfs"], v["pread"]))
    for q in CONV_TYPES:
        if f"4_{q}" in r:
            x = r[f"4_{q}"]
            add("4", f"{q} .npy (numpy.load, fresh mount; MB/s of float32) vs gguf.quants.dequantize",
                f"{x['tensorfs']:,.0f} MB/s", f"{x['gguf_py']:,.0f} MB/s",
                _ratio(x["tensorfs"], x["gguf_py"]), "≥ 2" if q != "BF16" else "")
    for q in CONV_TYPES:
        if "direct" in r.get(f"4_{q}", {}):
            x = r[f"4_{q}"]
            add("4d", f"{q} .npy read with O_DIRECT in 1 MiB reads (the daemon's rate, no page cache) "
                "vs gguf.quants.dequantize", f"{x['direct']:,.0f} MB/s", f"{x['gguf_py']:,.0f} MB/s",
                _ratio(x["direct"], x["gguf_py"]))
    for q in CONV_TYPES:
        if "tensorfs_w0" in r.get(f"4_{q}", {}):
            x = r[f"4_{q}"]
            add("4w", f"{q} .npy, numpy.load: worker processes (default --workers) vs `--workers 0` "
                f"(in-thread; w0 / gguf-py = {x['tensorfs_w0'] / x['gguf_py']:.2f})",
                f"{x['tensorfs']:,.0f} MB/s", f"{x['tensorfs_w0']:,.0f} MB/s",
                _ratio(x["tensorfs"], x["tensorfs_w0"]))
    for q in CONV_TYPES:
        if "direct_w0" in r.get(f"4_{q}", {}):
            x = r[f"4_{q}"]
            add("4w", f"{q} .npy read with O_DIRECT (the daemon's rate): worker processes vs "
                f"`--workers 0` (w0 / gguf-py = {x['direct_w0'] / x['gguf_py']:.2f})",
                f"{x['direct']:,.0f} MB/s", f"{x['direct_w0']:,.0f} MB/s",
                _ratio(x["direct"], x["direct_w0"]))
    if "1_fresh_raw" in r and any(f"4_{q}" in r for q in CONV_TYPES):
        # A converted view moves as many float32 bytes through FUSE as a raw file of that size:
        # the raw rate of the same kind of read bounds it, before any conversion.
        ceiling = r["1_fresh_raw"]["tensorfs"]
        parts = ", ".join(f"{q} {ceiling / r[f'4_{q}']['gguf_py']:.2f}" for q in CONV_TYPES if f"4_{q}" in r)
        add("4c", f"ceiling for row 4: tensorfs's own raw read (row 1c) / gguf-py, per type: {parts}",
            f"{ceiling:,.0f} MB/s", "", float("nan"))
    if "4_BF16_npy_vs_raw" in r:
        x = r["4_BF16_npy_vs_raw"]
        add("4b", "BF16 .npy vs the raw file of the same mount (MB/s of file read, fresh mounts)",
            f"{x['npy']:,.0f} MB/s", f"{x['raw']:,.0f} MB/s", _ratio(x["npy"], x["raw"]), "≥ 0.7")
    for label, ref in (("gguf", "gguf.GGUFReader(path)"), ("safetensors", "safetensors.safe_open")):
        if f"5_mount_{label}" in r:
            x = r[f"5_mount_{label}"]
            add("5", f"{label}: `tensorfs mount` until ready (whole command) vs {ref}",
                f"{x['mount_s']:.3f} s", f"{x['reference_s']:.3f} s",
                _ratio(x["mount_s"], x["reference_s"]), "≤ 0.2" if label == "gguf" else "")
            add("5b", f"{label}: parse + build the tree in-process (imports excluded) vs {ref}",
                f"{x['in_process_s']:.3f} s",
                f"{x['reference_s']:.3f} s", _ratio(x["in_process_s"], x["reference_s"]),
                "≤ 0.2" if label == "gguf" else "")
    for kind in ("raw", "Q4_K", "raw_nothreads", "Q4_K_nothreads"):
        if f"6_parallel_{kind}" in r:
            x = r[f"6_parallel_{kind}"]
            what = ("raw files" if kind.startswith("raw") else "Q4_K .npy views") + (
                ", `-o nothreads`" if kind.endswith("nothreads") else "")
            add("6", f"4 parallel readers, {what} (aggregate) vs one reader", f"{x['four']:,.0f} MB/s",
                f"{x['one']:,.0f} MB/s", _ratio(x["four"], x["one"]))
            add("6", f"8 parallel readers, {what} (aggregate) vs one reader", f"{x['eight']:,.0f} MB/s",
                f"{x['one']:,.0f} MB/s", _ratio(x["eight"], x["one"]))
    for key in sorted(k for k in r if k.startswith("6w_")):
        x = r[key]
        w = key.split("_")[1]
        add("6w", f"{x['readers']} parallel Q4_K .npy readers (aggregate) vs one reader, `--workers {w}` "
            f"(daemon + workers CPU: {x.get('cpu_s_per_gib', float('nan')):.2f} s/GiB)",
            f"{x['n']:,.0f} MB/s", f"{x['one']:,.0f} MB/s", _ratio(x["n"], x["one"]),
            "≥ 1.5" if w != "0" and int(w) == x["readers"] else "")
    for label in ("", "_nothreads"):
        if f"6_raw_beside_conversion{label}" in r:
            x = r[f"6_raw_beside_conversion{label}"]
            add("6b", "BF16 raw reader while a Q6_K .npy is read, vs alone"
                + (", `-o nothreads`" if label else ""), f"{x['beside']:,.0f} MB/s",
                f"{x['alone']:,.0f} MB/s", _ratio(x["beside"], x["alone"]))
    for key in sorted((k for k in r if k.startswith("7_tree_")), key=lambda k: int(k.split("_")[-1])):
        x = r[key]
        n = int(key.split("_")[-1])
        for tool in ("ls", "find"):
            name = "ls -lR" if tool == "ls" else "find"
            add("7", f"`{name}`, {n:,} tensors ({x['files']:,} files), fresh mount vs tmpfs",
                f"{x[f'{tool}_first_s']:.2f} s", f"{x[f'{tool}_tmpfs_s']:.2f} s",
                _ratio(x[f"{tool}_first_s"], x[f"{tool}_tmpfs_s"]))
            add("7", f"`{name}`, {n:,} tensors, second run (kernel caches) vs tmpfs",
                f"{x[f'{tool}_second_s']:.2f} s", f"{x[f'{tool}_tmpfs_s']:.2f} s",
                _ratio(x[f"{tool}_second_s"], x[f"{tool}_tmpfs_s"]))
            if f"{tool}_nothreads_first_s" in x:
                add("7", f"`{name}`, {n:,} tensors, fresh mount, `-o nothreads` vs tmpfs",
                    f"{x[f'{tool}_nothreads_first_s']:.2f} s", f"{x[f'{tool}_tmpfs_s']:.2f} s",
                    _ratio(x[f"{tool}_nothreads_first_s"], x[f"{tool}_tmpfs_s"]))
            if f"{tool}_floor_first_s" in x:
                for run in ("first", "second"):
                    add("7f", f"`{name}`, {n:,} tensors, {'fresh mount' if run == 'first' else 'second run'}"
                        " vs the C floor (bench/floor/treefs.c, same run)",
                        f"{x[f'{tool}_{run}_s']:.2f} s", f"{x[f'{tool}_floor_{run}_s']:.2f} s",
                        _ratio(x[f"{tool}_{run}_s"], x[f"{tool}_floor_{run}_s"]))
    for key in (k for k in r if k.startswith("8_rss_")):
        x = r[key]
        cache = key.split("_")[-1]
        add("8", f"daemon RssAnon after reading all {x['read_gib']:.1f} GiB of views, --cache-size {cache} "
            f"(at mount: {x['rss_before_mib']:.0f} MiB)", f"{x['rss_after_mib']:.0f} MiB", cache,
            _ratio(x["rss_after_mib"] * MiB, _size_bytes(cache)))
    for key in (k for k in r if k.startswith("8_rss_")):
        x = r[key]
        if "total_mib" not in x:
            continue
        cache = key.split("_")[-1]
        add("8w", f"daemon + {x['workers']} workers: RssAnon + shared arena after the same reads, "
            f"--cache-size {cache} (workers {x['worker_anon_mib']:.0f} MiB, arena "
            f"{x['arena_mib']:.0f} MiB)", f"{x['total_mib']:.0f} MiB", cache,
            _ratio(x["total_mib"] * MiB, _size_bytes(cache)))
    return rows


def _size_bytes(text: str) -> float:
    m = re.fullmatch(r"(\d+)([KMG]?)", text.upper())
    return int(m.group(1)) * {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}[m.group(2)] if m else float("nan")


BEGIN, END = "<!-- results:begin (bench/run.py rewrites this part) -->", "<!-- results:end -->"


def write_report(b: Bench, command: str, elapsed: float) -> None:
    m = machine()
    rows = table(b.results)
    lines = [BEGIN, "",
             f"Run {datetime.datetime.now().astimezone().strftime('%Y-%m-%d %H:%M %Z')}, "
             f"{elapsed / 60:.1f} min, with:", "", "```", command, "```", "",
             f"Machine: {m['nproc']} CPUs ({m['cpu']}), {m['memory']} RAM, Linux {m['kernel']}, "
             f"Python {m['python']}, numpy {m['numpy']}; tensorfs on libfuse {m['libfuse3']} "
             f"(low-level API, tensorfs/fuse/), the passthrough reference on fusepy {m['fusepy']} "
             f"over libfuse 2 ({m['fusermount']}).  Cold reads drop the page cache with: "
             f"{b.drop_method or 'n/a'}.",
             *(f"Note: {note}." for note in b.notes),
             f"Load average when the run ended: {os.getloadavg()[0]:.2f} (other work on the machine "
             f"shares its CPUs: compare ratios, not absolute figures, across runs).  "
             f"Best of {b.args.repeat} runs each; readers use read(2) into a reused "
             f"{READ_BUF >> 20} MiB buffer unless said otherwise.", "",
             "| row | measurement | tensorfs | reference | ratio | goal |",
             "|---|---|---:|---:|---:|---|"]
    for num, what, ours, ref, ratio, goal in rows:
        lines.append(f"| {num} | {what} | {ours} | {ref} | {ratio:.2f} | {goal} |")
    lines += ["", "![throughput per view kind](benchmarks.png)", "",
              "Raw results: bench/results.json.", "", END]
    block = "\n".join(lines)
    path = b.args.out
    # the raw figures: the run's one results file (bench/run.py --json), not this page
    if os.path.exists(path):
        text = open(path).read()
        if BEGIN in text and END in text:
            head, rest = text.split(BEGIN, 1)
            text = head + block + rest.split(END, 1)[1]
        else:
            text = text.rstrip() + "\n\n" + block + "\n"
    else:
        text = (f"# Benchmarks\n\nMade by `make bench` (bench/run.py); every figure is a ratio "
                f"against a reference measured in the same run.  What each option buys is in "
                f"[serving.md](serving.md).\n\n{block}\n\n## History\n\n")
    with open(path, "w") as f:
        f.write(text)
    print(f"wrote {path}")


def plot(b: Bench, path: str) -> None:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib missing: no plot")
        return
    r = b.results
    groups = []                                    # (label, tensorfs, reference, ref label)
    if "1_cold_raw" in r:
        groups.append(("raw, cold", r["1_cold_raw"]["tensorfs"], r["1_cold_raw"]["passthrough"], "passthrough"))
        groups.append(("raw, fresh mount", r["1_fresh_raw"]["tensorfs"],
                       r["1_fresh_raw"]["passthrough"], "passthrough"))
        groups.append(("raw, warm", r["2_warm_raw"]["tensorfs"], r["2_warm_raw"]["pread"], "pread"))
        groups.append(("F32 .npy", r["3_npy_native"]["tensorfs"], r["3_npy_native"]["fromfile"], "fromfile"))
    for q in CONV_TYPES:
        if f"4_{q}" in r:
            groups.append((f"{q} .npy", r[f"4_{q}"]["tensorfs"], r[f"4_{q}"]["gguf_py"], "gguf-py"))
    if not groups:
        return
    fig, ax = plt.subplots(figsize=(10, 4.5))
    xs = np.arange(len(groups))
    ax.bar(xs - 0.2, [g[1] for g in groups], 0.4, label="tensorfs (through the mount)", color="#1f77b4")
    ax.bar(xs + 0.2, [g[2] for g in groups], 0.4, label="reference", color="#bbbbbb")
    for x, g in zip(xs, groups):
        ax.text(x + 0.2, g[2], g[3], ha="center", va="bottom", fontsize=7, rotation=90)
        ax.text(x - 0.2, g[1], f"{g[1] / g[2]:.2f}×", ha="center", va="bottom", fontsize=7)
    ax.set_xticks(xs, [g[0] for g in groups], rotation=20, ha="right", fontsize=8)
    ax.set_ylabel("MB/s (float32 output for .npy views)")
    ax.set_title("tensorfs read throughput vs references (one run)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"wrote {path}")
