"""The tensorfs benchmark, one entry point for every row: each row is a module of bench/rows/.

    python bench/run.py [ROW ...] [--quick] [--list] [--big-mib 1024] [--conv-mib 128] ...

Run by ``make bench`` (every default row, once).  No ROW: every row marked default below.
The local rows (raw, converted, mount, parallel, workers, tree, rss) run in this process and
are written into docs/internals/benchmarks.md; the others (remote, clients, facts, pytorch, fleet,
peers, files, ...) are bench/rows/NAME.py run as their own program (each still runs alone,
``python bench/rows/NAME.py --help``, with its own options), their printed tables kept in
the one results file (``--json``, by default bench/results.json) and printed at the
end.  ``--quick`` gives every row small sizes (a smoke run).

The local rows: every figure is a ratio against a reference measured in the same run, on
models this script writes itself.  Mounts go through the real command (``python -m tensorfs mount``,
daemonized, as a user runs it); the references are a minimal fusepy passthrough
(bench/passthrough.py), the smallest C daemon serving the same tree (bench/floor/treefs.c,
row 7), a direct ``os.preadv`` of the model file, ``numpy.fromfile``,
``gguf.quants.dequantize`` / ``gguf.GGUFReader`` / ``safetensors.safe_open`` in-process, and
``ls``/``find`` over the same tree of empty files on tmpfs.  Writes ``docs/internals/benchmarks.md``
(between the results markers; the hand-kept history below them stays) and
``docs/internals/benchmarks.png``.

"Cold" means: the source file's pages are dropped (``echo 1 > /proc/sys/vm/drop_caches`` as
root, else ``posix_fadvise(DONTNEED)`` on the file) and the mount is fresh, so neither the
source nor the FUSE file has a cached page.  "Fresh mount" alone leaves the source in the page
cache: that isolates the daemon's own cost.  Every figure is the best of ``--repeat`` runs.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, HERE)
sys.path.insert(0, REPO)

from rows import converted, mount_time, parallel, raw, rss, tree, workers  # noqa: E402 (the path above)
from rows.common import Bench  # noqa: E402
from rows.report import plot, table, write_report  # noqa: E402

ROWS = {"raw": raw.row_raw, "converted": converted.row_converted, "mount": mount_time.row_mount_time,
        "parallel": parallel.row_parallel, "workers": workers.row_workers, "tree": tree.row_tree,
        "rss": rss.row_rss}


@dataclass(frozen=True)
class ProgramRow:
    """A row that is its own program, bench/rows/NAME.py: its arguments in a full run and in
    a quick one, and whether a run without ROWs includes it."""
    args: tuple[str, ...] = ()
    quick: tuple[str, ...] = ()
    default: bool = True
    needs: tuple[str, ...] = ()         # programs it runs (make bench installs them)


PROGRAM_ROWS = {
    "remote": ProgramRow(quick=("--big-mib", "32", "--repeat", "1", "--vocab", "2000",
                                "--header-tensors", "100")),
    "clients": ProgramRow(quick=("--mib", "16", "--tensors", "8", "--repeat", "1")),
    "facts": ProgramRow(quick=("--model-mib", "32", "--q4k-mib", "8", "--repeat", "1")),
    "pytorch": ProgramRow(),
    "fleet": ProgramRow(quick=("--size-mib", "16",)),
    "peers": ProgramRow(quick=("--size-mib", "16", "--repeat", "1", "--random", "5"),
                        needs=("rclone", "curl")),
    "files": ProgramRow(quick=("--size-mib", "16", "--repeat", "1")),
    "kernels": ProgramRow(quick=("--mib", "0.25", "--repeat", "1")),
    "diskcache": ProgramRow(quick=("--blocks", "8", "--repeat", "1")),
    "edits": ProgramRow(),
    "edit_cost": ProgramRow(),
    "scale": ProgramRow(quick=("--tensors", "1000", "--shards", "4", "--repeat", "1")),
    "worker_pool": ProgramRow(args=("mount",), quick=("mount", "--mib", "8", "--repeat", "1")),
    "receive": ProgramRow(quick=("--size-mib", "16", "--repeat", "1")),
    "remote_blocks": ProgramRow(quick=("--runs", "1")),
    # a Hugging Face directory in llama.cpp: mount against convert_hf_to_gguf.py (the oracle's venv)
    "hfgguf": ProgramRow(),
    # tools more than rows: an A/B of variants given as JSON, bursts on an old libfuse
    "ab_read": ProgramRow(default=False),
    "burst_threads": ProgramRow(default=False),
}


def run_program_row(b: Bench, name: str) -> None:
    """bench/rows/NAME.py as its own program (this checkout's tensorfs, or --tensorfs-path);
    its output is printed and kept in the results."""
    row = PROGRAM_ROWS[name]
    missing = [tool for tool in row.needs if shutil.which(tool) is None]
    if missing:
        print(f"row {name}: skipped, {', '.join(missing)} not installed (make bench installs it)")
        b.results[f"program_{name}"] = {"skipped": f"{', '.join(missing)} not installed"}
        return
    argv = [sys.executable, os.path.join(HERE, "rows", f"{name}.py"),
            *(row.quick if b.args.quick else row.args)]
    print(f"row {name}: {' '.join(argv[1:])}", flush=True)
    t0 = time.perf_counter()
    done = subprocess.run(argv, env=b.env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True, check=False)
    print(done.stdout, end="", flush=True)
    b.results[f"program_{name}"] = {"argv": argv[1:], "returncode": done.returncode,
                                    "seconds": time.perf_counter() - t0, "output": done.stdout}
    if done.returncode:
        print(f"row {name}: exit status {done.returncode}")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("row", nargs="*", help="rows to run (default: every default row): "
                   + ", ".join([*ROWS, *PROGRAM_ROWS]))
    p.add_argument("--rows", help="the same, comma-separated")
    p.add_argument("--list", action="store_true", help="list the rows and exit")
    p.add_argument("--quick", action="store_true", help="small sizes, one repeat (a smoke run)")
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--big-mib", type=int, default=1024, help="row 1/2 tensor size")
    p.add_argument("--mid-mib", type=int, default=256, help="row 3 tensor size")
    p.add_argument("--par-mib", type=int, default=128, help="row 6 raw tensor size (x8)")
    p.add_argument("--conv-mib", type=int, default=256, help="row 4 float32 output per type")
    p.add_argument("--par-conv-mib", type=int, default=64, help="row 6 Q4_K output per tensor (x8)")
    p.add_argument("--rss-mib", type=int, default=1024, help="row 8 model size")
    p.add_argument("--vocab", type=int, default=150_000)
    p.add_argument("--header-tensors", type=int, default=3000)
    p.add_argument("--tree-sizes", type=lambda s: [int(x) for x in s.split(",")], default=[10_000, 100_000])
    p.add_argument("--cache-sizes", type=lambda s: s.split(","), default=["64M", "256M", "1G"])
    p.add_argument("--workdir", default=os.path.join(REPO, "build", "bench"))
    p.add_argument("--tensorfs-path", help="import tensorfs from here (compare a copy of the tree)")
    p.add_argument("-o", dest="option", action="append", default=[], help="extra mount -o options")
    p.add_argument("--workers", type=int, help="mount --workers N (default: tensorfs's own)")
    p.add_argument("--out", default=os.path.join(REPO, "docs", "internals", "benchmarks.md"))
    p.add_argument("--png", default=os.path.join(REPO, "docs", "internals", "benchmarks.png"))
    p.add_argument("--json", default=os.path.join(HERE, "results.json"),
                   help="the one results file: every row's figures (bench/results.json)")
    p.add_argument("--nice", type=int, default=0, metavar="N",
                   help="raise the priority of the run (and its mounts) by N, on a shared machine")
    p.add_argument("--no-report", action="store_true", help="print only; leave docs/ alone")
    args = p.parse_args()
    if args.list:
        for name in ROWS:
            print(f"{name:14} local row (bench/rows/, in this process)")
        for name, row in PROGRAM_ROWS.items():
            print(f"{name:14} bench/rows/{name}.py{'' if row.default else '  (only when named)'}")
        return 0
    names = [*args.row, *(args.rows.split(",") if args.rows else [])]
    names = [n.strip() for n in names if n.strip()] or \
        [*ROWS, *(n for n, r in PROGRAM_ROWS.items() if r.default)]
    unknown = [n for n in names if n not in ROWS and n not in PROGRAM_ROWS]
    if unknown:
        p.error(f"no such row: {', '.join(unknown)} (--list names them)")
    if args.quick:
        args.repeat = 1
        args.big_mib, args.mid_mib, args.par_mib = 256, 64, 32
        args.conv_mib, args.par_conv_mib, args.rss_mib = 64, 16, 256
        args.vocab = 150_000
        if args.tree_sizes == [10_000, 100_000]:     # unless given
            args.tree_sizes = [10_000]
    if args.nice:
        try:
            os.nice(-args.nice)            # root only; children (daemons, references) inherit it
        except OSError as error:
            print(f"--nice ignored: {error}")
    b = Bench(args)
    command = "python bench/run.py " + " ".join(sys.argv[1:])
    t0 = time.perf_counter()
    for name in names:
        if name in ROWS:
            ROWS[name](b)
        else:
            run_program_row(b, name)
    elapsed = time.perf_counter() - t0
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w") as f:
            json.dump(b.results, f, indent=1, sort_keys=True)
            f.write("\n")
    local = any(name in ROWS for name in names)
    if local and not args.no_report:
        write_report(b, command, elapsed)
        plot(b, args.png)
    for num, what, ours, ref, ratio, goal in table(b.results) if local else []:
        print(f"{num:>3} {ratio:6.2f} {goal:>6}  {ours:>14} {ref:>14}  {what}")
    failed = [n for n in names if b.results.get(f"program_{n}", {}).get("returncode")]
    if failed:
        print(f"rows that failed: {', '.join(failed)}")
    print(f"total {elapsed / 60:.1f} min; results in {args.json}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
