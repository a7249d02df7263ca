"""A/B of read-path variants (the history in docs/internals/benchmarks.md): mount each variant side by
side, read FILE through each in turn (the FUSE file's page cache dropped with
posix_fadvise(DONTNEED) before every read), report best / median MB/s and the daemon's CPU
seconds per GiB served (from /proc/PID/stat: less sensitive to other load than wall time).

    python bench/rows/ab_read.py '{"model": M, "file": "big/weight", "reps": 7, "variants":
        {"pass": {"passthrough": true, "tensor": "big.weight"},
         "before": {"path": "/copy/of/an/older/tree"}, "now": {}, "s": {"opts": ["-o", "nothreads"]}}}'

A variant is {"path": dir to import tensorfs from, "opts": [...], "env": {...}} or the
passthrough.  (Converted views keep chunks across reads of one mount: compare them with
``bench/run.py --rows converted --tensorfs-path DIR``, which mounts afresh.)
"""
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))   # bench/
REPO = os.path.dirname(HERE)
sys.path.insert(0, HERE)
sys.path.insert(0, REPO)
from rows import common  # noqa: E402 (bench/rows/common.py, found through the path set just above)
from tensorfs.runtime import pid_file  # noqa: E402 (this checkout's, through the path above)

CLK = os.sysconf("SC_CLK_TCK")
def cpu(pid):
    f = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(f[11]) + int(f[12])) / CLK
WORK = tempfile.mkdtemp(prefix="tensorfs-ab-")


def main():
    cfg = json.loads(sys.argv[1])
    model, rel, reps = cfg["model"], cfg["file"], cfg.get("reps", 5)
    mounts = {}
    procs = []
    for name, v in cfg["variants"].items():
        mnt = os.path.join(WORK, f"mnt_{name}")
        os.makedirs(mnt, exist_ok=True)
        if v.get("passthrough"):
            off, size = common.tensor_range(model, v["tensor"])
            p = subprocess.Popen(cwd=WORK, args=[sys.executable, os.path.join(HERE, "passthrough.py"),
                                                 model, str(off), str(size), mnt])
            while not common._mounted(mnt):
                time.sleep(0.01)
            mounts[name] = (os.path.join(mnt, "data"), p.pid)
            procs.append(p)
        else:
            env = dict(os.environ, PYTHONPATH=v.get("path", REPO), **v.get("env", {}))
            cmd = [sys.executable, "-m", "tensorfs", "mount", model, mnt] + v.get("opts", [])
            subprocess.run(cmd, env=env, cwd=WORK, check=True)
            mounts[name] = (os.path.join(mnt, rel), int(open(pid_file(mnt)).read()))
    res = {n: {"mbps": [], "cpu": []} for n in mounts}
    try:
        for _ in range(reps):
            for name, (path, pid) in mounts.items():
                fd = os.open(path, os.O_RDONLY)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                os.close(fd)
                c0 = cpu(pid)
                n, dt = common.read_file(path, cfg.get("bufsize", 1 << 20))
                c1 = cpu(pid)
                res[name]["mbps"].append(n / dt / 1e6)
                res[name]["cpu"].append((c1 - c0) / (n / 2**30))
    finally:
        for name in mounts:
            subprocess.run(["fusermount", "-u", os.path.join(WORK, f"mnt_{name}")])
    for name, r in res.items():
        print(f"{name:>14}: best {max(r['mbps']):7.0f} MB/s  "
              f"median {statistics.median(r['mbps']):7.0f} MB/s  "
              f"daemon cpu {statistics.median(r['cpu']):.3f} s/GiB")
if __name__ == "__main__":
    main()
