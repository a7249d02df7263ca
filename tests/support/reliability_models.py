"""Models shared by the reliability tests (faults, concurrency, shutdown); the process
helpers are ``tests.support``'s.

``write_mixed_gguf`` writes, with gguf-py's writer, a GGUF holding native and converted
tensors (F32, F16, Q8_0, Q4_K, BF16), big enough that converted views span several chunks,
and returns for each tensor what its raw file and its .npy view must hold, from the oracles
(``gguf.quants.dequantize``; BF16: the 16-bit shift).
"""

from __future__ import annotations

import subprocess
import sys
from contextlib import contextmanager
from dataclasses import dataclass

import gguf
import ml_dtypes
import numpy as np

from tensorfs.dtypes import GGML_TYPES_BY_NAME

# once defined here, now in tests.support (re-exported: tests import them from here too)
from tests.support import EIO, alive, daemon_pid, read_errno, wait_for  # noqa: F401 (re-exported to the reliability tests)
from tests.support.quant_blocks import oracle, random_blocks


@dataclass
class Expected:
    name: str            # the tensor name
    dtype: str
    raw: bytes           # the raw file's bytes
    values: np.ndarray   # what numpy.load of the .npy view gives
    offset: int = 0      # absolute offset of the data in the model file (filled after writing)

    @property
    def path(self) -> str:
        return self.name.replace(".", "/")


# (name, ggml type, numpy shape); the file keeps them in this order
MIXED = (
    ("a.f32.weight", "F32", (64, 1024)),          # 256 KiB raw, native view
    ("b.q8_0.weight", "Q8_0", (96, 1024)),        # 102 KiB raw, 384 KiB view
    ("c.bf16.weight", "BF16", (512, 1024)),       # 1 MiB raw, 2 MiB view (2 chunks)
    ("d.q4_k.weight", "Q4_K", (768, 1024)),       # 432 KiB raw, 3 MiB view (3 chunks)
    ("e.f16.weight", "F16", (128, 512)),          # 128 KiB raw, native view
)


def write_mixed_gguf(path, seed: int = 0, scale: int = 1) -> dict[str, Expected]:
    """``scale`` multiplies the row counts (bigger files for the concurrency test)."""
    rng = np.random.default_rng(seed)
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_uint32("test.seed", seed)
    out: dict[str, Expected] = {}
    for name, kind, (rows, cols) in MIXED:
        rows *= scale
        if kind in ("F32", "F16"):
            array = rng.standard_normal((rows, cols)).astype(np.float32 if kind == "F32"
                                                             else np.float16)
            writer.add_tensor(name, array)
            out[name] = Expected(name, kind, array.tobytes(), array)
            continue
        if kind == "BF16":
            values = rng.standard_normal(rows * cols).astype(ml_dtypes.bfloat16)
            raw = values.view(np.uint8).reshape(rows, cols * 2)
            expect = (raw.reshape(-1).view("<u2").astype(np.uint32) << 16).view(np.float32)
        else:
            gt = GGML_TYPES_BY_NAME[kind]
            n_blocks = rows * cols // gt.block_size
            raw = random_blocks(kind, n_blocks, rng, raw_tail=0).reshape(rows, -1)
            expect = oracle(kind, raw.reshape(-1))
        writer.add_tensor(name, raw, raw_dtype=gguf.GGMLQuantizationType[kind])
        out[name] = Expected(name, kind, raw.tobytes(), expect.reshape(rows, cols))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    from tensorfs.sources.modelfile import parse_model_file

    for t in parse_model_file(str(path)).tensors:
        out[t.name].offset = t.offset
    return out


def npy_bytes(values: np.ndarray) -> bytes:
    import io

    buf = io.BytesIO()
    np.save(buf, np.ascontiguousarray(values))
    return buf.getvalue()


SLOW_FS = r'''
import errno, os, stat, sys, time
from fuse import FUSE, FuseOSError, Operations

class Slow(Operations):
    """A read-only passthrough of one directory whose reads take DELAY seconds each."""
    def __init__(self, root, delay):
        self.root, self.delay = root, delay
    def _p(self, path):
        return os.path.join(self.root, path.lstrip("/"))
    def getattr(self, path, fh=None):
        try:
            st = os.lstat(self._p(path))
        except OSError as e:
            raise FuseOSError(e.errno)
        return {k: getattr(st, k) for k in ("st_mode", "st_size", "st_nlink", "st_uid",
                                            "st_gid", "st_mtime", "st_ctime", "st_atime")}
    def readdir(self, path, fh):
        return [".", ".."] + os.listdir(self._p(path))
    def open(self, path, flags):
        return os.open(self._p(path), os.O_RDONLY)
    def read(self, path, size, offset, fh):
        delay = self.delay
        if os.path.exists(os.path.join(self.root, "DELAY")):   # changeable while mounted
            with open(os.path.join(self.root, "DELAY")) as f:
                delay = float(f.read())
        time.sleep(delay)
        return os.pread(fh, size, offset)
    def release(self, path, fh):
        os.close(fh)

FUSE(Slow(sys.argv[1], float(sys.argv[3])), sys.argv[2], foreground=True, ro=True,
     direct_io=True)
'''


@contextmanager
def slow_filesystem(base, delay: float):
    """``(src, mnt)``: files put in ``src`` appear in ``mnt``, each read taking ``delay``
    seconds (a file ``src/DELAY`` holding a number overrides it while mounted).  Keep
    ``base`` outside the test's tmp_path: the mount fixture checks no FUSE mount is left
    there."""
    from tests.support import fuse_mounts_under

    src, mnt = base / "src", base / "mnt"
    src.mkdir()
    mnt.mkdir()
    script = base / "slowfs.py"
    script.write_text(SLOW_FS)
    proc = subprocess.Popen([sys.executable, str(script), str(src), str(mnt), str(delay)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        assert wait_for(lambda: fuse_mounts_under(mnt), 20), "slow filesystem did not mount"
        yield src, mnt
    finally:
        subprocess.run(["fusermount", "-u", str(mnt)], capture_output=True)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            subprocess.run(["fusermount", "-uz", str(mnt)], capture_output=True)
