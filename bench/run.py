"""The tensorfs benchmark (issue 6): every figure is a ratio against a reference measured in
the same run, on models this script writes itself.

    python bench/run.py [--quick] [--rows 1,2,...] [--big-mib 1024] [--conv-mib 128] ...

Run by ``make bench``.  Mounts go through the real command (``python -m tensorfs mount``,
daemonized, as a user runs it); the references are a minimal fusepy passthrough
(bench/passthrough.py), the smallest C daemon serving the same tree (bench/floor/treefs.c,
row 7), a direct ``os.preadv`` of the model file, ``numpy.fromfile``,
``gguf.quants.dequantize`` / ``gguf.GGUFReader`` / ``safetensors.safe_open`` in-process, and
``ls``/``find`` over the same tree of empty files on tmpfs.  Writes ``docs/benchmarks.md``
(between the results markers; the hand-kept history below them stays) and
``docs/benchmarks.png``.

"Cold" means: the source file's pages are dropped (``echo 1 > /proc/sys/vm/drop_caches`` as
root, else ``posix_fadvise(DONTNEED)`` on the file) and the mount is fresh, so neither the
source nor the FUSE file has a cached page.  "Fresh mount" alone leaves the source in the page
cache: that isolates the daemon's own cost.  Every figure is the best of ``--repeat`` runs.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

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


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", default="raw,converted,mount,parallel,workers,tree,rss",
                   help="comma-separated subset of: " + ",".join(ROWS))
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
    p.add_argument("--out", default=os.path.join(REPO, "docs", "benchmarks.md"))
    p.add_argument("--png", default=os.path.join(REPO, "docs", "benchmarks.png"))
    p.add_argument("--json", help="also write the raw results here")
    p.add_argument("--nice", type=int, default=0, metavar="N",
                   help="raise the priority of the run (and its mounts) by N, on a shared machine")
    p.add_argument("--no-report", action="store_true", help="print only; leave docs/ alone")
    args = p.parse_args()
    if args.quick:
        args.repeat = 1
        args.big_mib, args.mid_mib, args.par_mib = 256, 64, 32
        args.conv_mib, args.par_conv_mib, args.rss_mib = 64, 16, 256
        args.vocab, args.tree_sizes = 150_000, [10_000]
    if args.nice:
        try:
            os.nice(-args.nice)            # root only; children (daemons, references) inherit it
        except OSError as error:
            print(f"--nice ignored: {error}")
    b = Bench(args)
    command = "python bench/run.py " + " ".join(sys.argv[1:])
    t0 = time.perf_counter()
    for name in args.rows.split(","):
        ROWS[name.strip()](b)
    elapsed = time.perf_counter() - t0
    if args.json:
        with open(args.json, "w") as f:
            json.dump(b.results, f, indent=1)
    if not args.no_report:
        write_report(b, command, elapsed)
        plot(b, args.png)
    for num, what, ours, ref, ratio, goal in table(b.results):
        print(f"{num:>3} {ratio:6.2f} {goal:>6}  {ours:>14} {ref:>14}  {what}")
    print(f"total {elapsed / 60:.1f} min")
    return 0


if __name__ == "__main__":
    sys.exit(main())
