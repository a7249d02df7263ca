"""The regression guard's rows (``make bench-compare BASE=REV``, bench/compare.py): the local
read paths, each measured once per call of ``one_round`` for one side (a tree of tensorfs's
code), on models written here.

A round of one side makes three fresh mounts:

* the raw model: the first 4 KiB of a tensor's file as a user meets it (from starting the
  mount command, polling the file), the mount command's own time, the tensor read whole
  (fresh mount, source in the page cache), again (the mount's page cache), its native
  ``.npy``, and the model's whole file under ``files/``;
* the same model, its source pages dropped first: the cold raw read;
* the converted model: a fresh mount's first BF16 ``.npy`` (what a user's first converted read
  pays), then, after one untimed read of a tiny Q4_K tensor (with ``--workers N``: until the
  conversion workers it starts are ready), one reader and two readers of BF16, Q8_0 and Q4_K ``.npy`` views.

Each mount's daemon CPU seconds are rows too: under a loaded machine they move less than
wall time.  Every row says whether more (MB/s) or less (seconds) is better.
"""

from __future__ import annotations

import os
import subprocess
import threading
import time
from dataclasses import dataclass

import numpy as np

from rows.common import Bench, MiB, _mounted, cpu_seconds, mbps, parallel, pread_range, read_file

CONV = ("BF16", "Q8_0", "Q4_K")


@dataclass(frozen=True)
class Row:
    key: str
    what: str
    unit: str                     # "MB/s" (more is better) or "s" (less is better)

    @property
    def higher_is_better(self) -> bool:
        return self.unit == "MB/s"


ROWS = [
    Row("first_byte", "first 4 KiB of a tensor from starting the mount command", "s"),
    Row("mount", "mount command until it returns", "s"),
    Row("raw_cold", "raw tensor, cold (source pages dropped), fresh mount", "MB/s"),
    Row("raw_fresh", "raw tensor, fresh mount, source in page cache", "MB/s"),
    Row("raw_warm", "raw tensor again (the mount's page cache)", "MB/s"),
    Row("npy_native", "native F32 .npy, fresh", "MB/s"),
    Row("whole_file", "files/MODEL whole, fresh", "MB/s"),
    Row("raw_daemon_cpu", "daemon CPU of the raw mount (all of the above reads)", "s"),
    Row("bf16_npy_first", "BF16 .npy, a fresh mount's first converted read", "MB/s"),
    *(Row(f"{q.lower()}_npy_1", f"{q} .npy, one reader", "MB/s") for q in CONV),
    *(Row(f"{q.lower()}_npy_2", f"{q} .npy, two readers (two tensors)", "MB/s") for q in CONV),
    Row("conv_daemon_cpu", "daemon CPU of the converted mount's one- and two-reader rows", "s"),
]


def raw_model(b: Bench) -> str:
    """safetensors: big.weight (--big-mib of F32), mid.weight (a quarter of it)."""
    from safetensors.numpy import save_file

    a = b.args
    path = os.path.join(b.models, f"cmp-raw-{a.big_mib}.safetensors")
    if not os.path.exists(path):
        rng = np.random.default_rng(11)
        n = a.big_mib * MiB // 4
        save_file({"big.weight": rng.random(n, dtype=np.float32).reshape(-1, 1024),
                   "mid.weight": rng.random(n // 4, dtype=np.float32).reshape(-1, 1024)}, path + ".tmp")
        os.replace(path + ".tmp", path)
    return path


def conv_model(b: Bench) -> str:
    """GGUF: tensors T.0 .. T.3 of each converted type (--conv-mib of float32 output each),
    and a tiny Q4_K one."""
    from rows.models import _blocks, _write_gguf

    a = b.args
    path = os.path.join(b.models, f"cmp-conv-{a.conv_mib}.gguf")
    if not os.path.exists(path):
        rng = np.random.default_rng(12)
        tensors = {f"{q}.{i}.weight": (q, _blocks(q, a.conv_mib * MiB, rng)) for q in CONV for i in range(4)}
        tensors["tiny.weight"] = ("Q4_K", _blocks("Q4_K", 64 << 10, rng))
        _write_gguf(path + ".tmp", tensors)
        os.replace(path + ".tmp", path)
    return path


def drop_pages(path: str) -> None:
    """The file's own pages only (posix_fadvise): never the machine's whole cache."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fdatasync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def _first_bytes(path: str, deadline: float, proc: subprocess.Popen) -> None:
    """Poll ``path`` until its first 4 KiB read (the mount command still running or not)."""
    while True:
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError:
            if time.monotonic() > deadline or proc.returncode not in (None, 0):
                raise RuntimeError(f"{path}: not served in time") from None
            time.sleep(0.001)
            continue
        try:
            if len(os.pread(fd, 4096, 0)) == 4096:
                return
        finally:
            os.close(fd)


class Side:
    """One tree of tensorfs's code, measured with a Bench whose mounts import it."""

    def __init__(self, name: str, b: Bench):
        self.name = name
        self.b = b
        self.runs: dict[str, list[float]] = {row.key: [] for row in ROWS}

    def add(self, key: str, value: float) -> None:
        self.runs[key].append(value)

    def _unmount(self, mnt: str) -> None:
        b = self.b
        subprocess.run([*b.tensorfs, "unmount", mnt], env=b.env, cwd=b.work, capture_output=True)
        if _mounted(mnt):
            subprocess.run(["fusermount", "-uz", mnt], capture_output=True)
        os.rmdir(mnt)

    def one_round(self, raw: str, conv: str) -> None:
        self._raw_round(raw)
        self._cold_round(raw)
        self._conv_round(conv)

    def _raw_round(self, raw: str) -> None:
        b = self.b
        mnt = b._fresh_dir("c")
        pread_range(raw, 0, os.path.getsize(raw))
        returned: list[float] = []
        t0 = time.perf_counter()
        proc = subprocess.Popen([*b.tensorfs, "mount", raw, mnt, *b.mount_opts], env=b.env, cwd=b.work,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        waiter = threading.Thread(target=lambda: (proc.wait(), returned.append(time.perf_counter())))
        waiter.start()
        try:
            _first_bytes(os.path.join(mnt, "big/weight"), time.monotonic() + 60, proc)
            self.add("first_byte", time.perf_counter() - t0)
            waiter.join(60)
            if proc.returncode != 0:
                raise RuntimeError(f"mount of {raw} failed ({proc.returncode})")
            self.add("mount", returned[0] - t0)
            pid = b._daemon_pid(mnt)
            self.add("raw_fresh", mbps(*read_file(os.path.join(mnt, "big/weight"))))
            self.add("raw_warm", mbps(*read_file(os.path.join(mnt, "big/weight"))))
            self.add("npy_native", mbps(*read_file(os.path.join(mnt, "mid/weight.npy"))))
            self.add("whole_file", mbps(*read_file(os.path.join(mnt, "files", os.path.basename(raw)))))
            if pid:
                self.add("raw_daemon_cpu", cpu_seconds(pid))
        finally:
            self._unmount(mnt)

    def _cold_round(self, raw: str) -> None:
        drop_pages(raw)
        with self.b.mount(raw) as (mnt, _, _):
            self.add("raw_cold", mbps(*read_file(os.path.join(mnt, "big/weight"))))

    def _conv_round(self, conv: str) -> None:
        b = self.b
        pread_range(conv, 0, os.path.getsize(conv))
        log = os.path.join(b.mnts, f"{self.name}-conv.log")
        if os.path.exists(log):
            os.unlink(log)
        with b.mount(conv, "--log", log) as (mnt, pid, _):
            self.add("bf16_npy_first", mbps(*read_file(os.path.join(mnt, "BF16/0/weight.npy"))))
            with open(os.path.join(mnt, "tiny/weight.npy"), "rb") as f:
                f.read()
            cpu0 = cpu_seconds(pid) if pid else 0.0     # the reads' own, not the mount's imports
            # --workers N: the workers the tiny read started, ready (by default a mount starts
            # them only where they pay, and only for a large tensor: none to wait for)
            deadline = time.monotonic() + (30 if b.args.workers else 0)
            while time.monotonic() < deadline:
                with open(log, errors="replace") as f:
                    if "conversion workers ready" in f.read():
                        break
                time.sleep(0.01)
            for q in CONV:
                self.add(f"{q.lower()}_npy_1", mbps(*read_file(os.path.join(mnt, f"{q}/1/weight.npy"))))
                two = [os.path.join(mnt, f"{q}/{i}/weight.npy") for i in (2, 3)]
                self.add(f"{q.lower()}_npy_2", mbps(*parallel(read_file, two)))
            if pid:
                self.add("conv_daemon_cpu", cpu_seconds(pid) - cpu0)
        os.unlink(log)


def summary(values: list[float], higher_is_better: bool) -> tuple[float, float]:
    """(best, median)."""
    if not values:
        return float("nan"), float("nan")
    best = max(values) if higher_is_better else min(values)
    return best, float(np.median(values))


def worse_by(base: float, head: float, higher_is_better: bool) -> float:
    """How much worse head is than base, as a fraction of base's figure (negative: better)."""
    if not base or base != base or head != head:
        return float("nan")
    return (base - head) / base if higher_is_better else (head - base) / base


def compare(base: Side, head: Side, threshold: float) -> tuple[list[str], list[str]]:
    """The report's lines and the keys of the rows flagged: a row is flagged when head's best
    AND its median are each ``threshold`` or more worse than base's (the best alone moves
    with one lucky run, the median alone with one unlucky one)."""
    lines = [f"{'row':<16} {'unit':>4} {'base best':>10} {'head best':>10} {'worse':>7}"
             f" {'base med':>10} {'head med':>10} {'worse':>7}  what"]
    flagged = []
    for row in ROWS:
        hib = row.higher_is_better
        bb, bm = summary(base.runs[row.key], hib)
        hb, hm = summary(head.runs[row.key], hib)
        wb, wm = worse_by(bb, hb, hib), worse_by(bm, hm, hib)
        flag = wb >= threshold and wm >= threshold
        if flag:
            flagged.append(row.key)
        fmt = "{:10.4f}" if row.unit == "s" else "{:10.0f}"
        lines.append(f"{row.key:<16} {row.unit:>4} {fmt.format(bb)} {fmt.format(hb)} {wb:+7.1%}"
                     f" {fmt.format(bm)} {fmt.format(hm)} {wm:+7.1%}  {row.what}"
                     + ("  <-- WORSE" if flag else ""))
    return lines, flagged
