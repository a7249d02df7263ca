"""The regression guard: the local read rows for a base revision and the working tree, taking
turns in one run, and every row 10% or more worse flagged (exit status 1).

    python bench/compare.py BASE [--head REV] [--rounds 5] [--threshold 0.10] [--quick]
    make bench-compare BASE=REV

BASE (any git revision) is checked out with ``git worktree add`` into a temporary folder; its
mounts import its own code (PYTHONPATH), with the same Python and packages; the working
tree's mounts import this checkout (or ``--head REV``'s, checked out the same way).  The
rows are bench/rows/compare.py's (raw cold and warm,
native and converted ``.npy`` with one and two readers, the whole file, mount time, the first
byte, the daemons' CPU).  Rounds alternate A B A B ... (B A B A ... on odd rounds), so that a
machine's drift hits both alike; a row's figures are its best and its median over the rounds,
and it is flagged when both are worse by ``--threshold`` or more.  The figures of a loaded
machine move by more than 10%: the load average is printed with them, and the CPU rows move
least.  Like airspeed velocity's ``asv continuous``, kept small.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from types import SimpleNamespace

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, HERE)
sys.path.insert(0, REPO)

from rows.common import Bench  # noqa: E402 (the path above)
from rows.compare import Side, compare, conv_model, raw_model  # noqa: E402


def loadavg() -> str:
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


def _bench(args, tree: str, tag: str) -> Bench:
    ns = SimpleNamespace(workdir=os.path.join(args.workdir), tensorfs_path=tree, option=args.option,
                         workers=args.workers, big_mib=args.big_mib, conv_mib=args.conv_mib, repeat=1)
    b = Bench(ns)
    # as installed: every module compiled once (a tree without __pycache__ would compile its
    # modules at every mount, and the mount rows would time the compiler)
    b.env.pop("PYTHONDONTWRITEBYTECODE", None)
    subprocess.run([sys.executable, "-m", "compileall", "-q", os.path.join(tree, "tensorfs")],
                   stdout=subprocess.DEVNULL, check=False)
    b.mnts = os.path.join(b.work, f"mnt-{tag}")
    os.makedirs(b.mnts, exist_ok=True)
    return b


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("base", help="the git revision to compare the working tree with")
    p.add_argument("--head", help="a revision to measure instead of the working tree")
    p.add_argument("--rounds", type=int, default=5, help="rounds of each side (default 5)")
    p.add_argument("--threshold", type=float, default=0.10, help="flag rows this much worse (0.10)")
    p.add_argument("--big-mib", type=int, default=256, help="raw tensor size (MiB of F32)")
    p.add_argument("--conv-mib", type=int, default=48, help="float32 output of each converted tensor")
    p.add_argument("--quick", action="store_true", help="tiny sizes, two rounds: a smoke run")
    p.add_argument("--workdir", default=os.path.join(REPO, "build", "bench-compare"))
    p.add_argument("-o", dest="option", action="append", default=[], help="extra mount -o options")
    p.add_argument("--workers", type=int, help="mount --workers N (default: tensorfs's own choice)")
    p.add_argument("--json", help="also write every run's figures here")
    args = p.parse_args(argv)
    if args.quick:
        args.rounds, args.big_mib, args.conv_mib = 2, 8, 2
    commit = _commit(args.base)
    if commit is None:
        print(f"bench-compare: {args.base!r} is not a revision of this repository", file=sys.stderr)
        return 2
    head_commit = None
    if args.head:
        head_commit = _commit(args.head)
        if head_commit is None:
            print(f"bench-compare: {args.head!r} is not a revision of this repository", file=sys.stderr)
            return 2
    os.makedirs(args.workdir, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="tensorfs-base-") as tmp:
        trees = []
        try:
            for name, rev in (("base", commit), ("head", head_commit)):
                if rev is not None:
                    trees.append(os.path.join(tmp, name))
                    subprocess.run(["git", "-C", REPO, "worktree", "add", "--detach", "--quiet",
                                    trees[-1], rev], check=True)
            head_tree = trees[1] if head_commit else REPO
            head_rev = head_commit[:10] if head_commit else subprocess.run(
                ["git", "-C", REPO, "describe", "--always", "--dirty"],
                capture_output=True, text=True).stdout.strip() + ", the working tree"
            return _run(args, commit, trees[0], head_tree, head_rev)
        finally:
            for tree in trees:
                subprocess.run(["git", "-C", REPO, "worktree", "remove", "--force", tree],
                               capture_output=True)


def _commit(rev: str) -> str | None:
    done = subprocess.run(["git", "-C", REPO, "rev-parse", "--verify", "--quiet", rev + "^{commit}"],
                          capture_output=True, text=True)
    return done.stdout.strip() if done.returncode == 0 else None


def _run(args, commit: str, tree: str, head_tree: str, head_rev: str) -> int:
    base = Side("base", _bench(args, tree, "base"))
    head = Side("head", _bench(args, head_tree, "head"))
    raw, conv = raw_model(base.b), conv_model(base.b)
    print(f"base {args.base} ({commit[:10]}) against {head_rev}; "
          f"{args.rounds} rounds; load {loadavg()}", flush=True)
    loads = [loadavg()]
    t0 = time.perf_counter()
    for i in range(args.rounds):
        for side in (base, head) if i % 2 == 0 else (head, base):
            side.one_round(raw, conv)
        loads.append(loadavg())
        print(f"  round {i + 1}/{args.rounds} done ({time.perf_counter() - t0:.0f} s, load {loads[-1]})",
              flush=True)
    lines, flagged = compare(base, head, args.threshold)
    print()
    print("\n".join(lines))
    print(f"\nload averages (1, 5, 15 min) after each round: {'; '.join(loads)}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"base": commit, "head": head_rev, "loads": loads,
                       "runs": {"base": base.runs, "head": head.runs}}, f, indent=1)
    if flagged:
        print(f"{len(flagged)} row(s) {args.threshold:.0%} or more worse than {args.base}: {', '.join(flagged)}")
        return 1
    print(f"no row {args.threshold:.0%} or more worse than {args.base}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
