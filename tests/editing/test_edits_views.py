"""Every view of an edited model agrees, whatever tool wrote the edit (docs/reference/editing.md
"Reading while editing").

A tensor's raw file written by ``cp``, ``dd conv=notrunc``, ``numpy.save`` of its ``.npy``
or a ``numpy.memmap`` in ``r+`` mode: its raw file, its ``.npy``, its sha256 xattr,
``files/``, ``metadata.json`` and ``tensorfs hash`` of the mount all show the edit at
once, and again after a remount.  A program reads its own writes before it closes the
file; each open of ``files/`` reads one version whole; a write of a shared memory map
after ``close`` is kept.  Oracles: the file GGUFWriter or save_file writes with the same
tensor, read by GGUFReader and safe_open.
"""

from __future__ import annotations

import ctypes
import hashlib
import io
import json
import mmap
import os
import random
import subprocess
import sys
from pathlib import Path

import gguf
import numpy as np
import pytest
from safetensors import safe_open
from safetensors.numpy import save_file

from tests.support.commands import run_tensorfs
from tests.support.processes import wait_for

BIG = 1 << 20       # float32 elements of the big tensor: a 4 MiB file, many reads


def _gguf_model(path: Path, tensors: dict, name: str = "tiny") -> Path:
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_key_value("general.name", name, gguf.GGUFValueType.STRING)
    for tensor_name, array in tensors.items():
        writer.add_tensor(tensor_name, array)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


class Kind:
    """One model format: its file, the tensor edited and where its files are."""

    def __init__(self, fmt: str, tmp_path: Path, big: bool = False):
        rng = np.random.default_rng(7)
        self.fmt = fmt
        self.norm = rng.standard_normal(64).astype(np.float32)
        self.tensors = {"tok.weight": rng.standard_normal((4, 8)).astype(np.float16),
                        "norm.weight": self.norm}
        if big:
            self.tensors["big.weight"] = rng.standard_normal(BIG).astype(np.float32)
        self.file = "model.gguf" if fmt == "gguf" else "model.safetensors"
        self.model = self.reference(tmp_path / self.file, self.norm)

    def reference(self, path: Path, norm: np.ndarray, name: str = "tiny") -> Path:
        tensors = {**self.tensors, "norm.weight": norm}
        if self.fmt == "gguf":
            return _gguf_model(path, tensors, name)
        save_file(tensors, str(path), metadata={"name": name})
        return path

    def tensor_of(self, path: Path, name: str) -> np.ndarray:
        if self.fmt == "gguf":
            return np.array({t.name: t for t in gguf.GGUFReader(str(path)).tensors}[name].data)
        with safe_open(str(path), "np") as f:
            return f.get_tensor(name)

    def same_file(self, path: Path, reference: Path) -> None:
        if self.fmt == "gguf":
            assert path.read_bytes() == reference.read_bytes()
            return
        with safe_open(str(path), "np") as got, safe_open(str(reference), "np") as want:
            assert got.metadata() == want.metadata()
            assert sorted(got.keys()) == sorted(want.keys())
            for name in want.keys():
                assert got.get_tensor(name).tobytes() == want.get_tensor(name).tobytes()


@pytest.fixture(params=["gguf", "safetensors"])
def kind(request, tmp_path):
    return Kind(request.param, tmp_path)


def _tensorfs_out(*args) -> str:
    result = run_tensorfs(*args)
    assert result.returncode == 0, result.stderr
    return result.stdout


def _hash_lines(path: Path) -> list[str]:
    result = run_tensorfs("hash", "--sha256", path)
    assert result.returncode == 0, result.stderr
    return [line.split()[0] + " " + line.split()[1].rsplit(":", 1)[-1]
            for line in result.stdout.splitlines() if line.strip()]


def _cp(mnt: Path, tmp_path: Path, new: np.ndarray, old: np.ndarray) -> None:
    (tmp_path / "new.bin").write_bytes(new.tobytes())
    result = subprocess.run(["cp", str(tmp_path / "new.bin"), str(mnt / "norm" / "weight")],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def _dd(mnt: Path, tmp_path: Path, new: np.ndarray, old: np.ndarray) -> None:
    # the bytes of elements 3..5 only, written in place
    (tmp_path / "patch.bin").write_bytes(new[3:6].tobytes())
    result = subprocess.run(["dd", f"if={tmp_path / 'patch.bin'}", f"of={mnt / 'norm' / 'weight'}",
                             "bs=4", "seek=3", "conv=notrunc", "status=none"],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def _numpy_save(mnt: Path, tmp_path: Path, new: np.ndarray, old: np.ndarray) -> None:
    np.save(mnt / "norm" / "weight.npy", new)


def _memmap(mnt: Path, tmp_path: Path, new: np.ndarray, old: np.ndarray) -> None:
    mapped = np.memmap(mnt / "norm" / "weight", dtype="<f4", mode="r+", shape=old.shape)
    mapped[3:6] = new[3:6]
    mapped.flush()
    del mapped


TOOLS = {"cp": _cp, "dd": _dd, "numpy.save": _numpy_save, "memmap": _memmap}


def _check_views(kind: Kind, mnt: Path, want: np.ndarray, reference: Path) -> None:
    raw = subprocess.run(["cat", str(mnt / "norm" / "weight")], capture_output=True)
    assert raw.returncode == 0, raw.stderr
    assert raw.stdout == want.tobytes()
    assert np.array_equal(np.load(mnt / "norm" / "weight.npy"), want)
    assert os.getxattr(mnt / "norm" / "weight", "user.tensorfs.sha256").decode() == \
        hashlib.sha256(want.tobytes()).hexdigest()
    served = mnt / "files" / kind.file
    assert np.array_equal(kind.tensor_of(served, "norm.weight"), want)
    kind.same_file(served, reference)
    shown = json.loads((mnt / "metadata.json").read_text())["tensors"]["norm.weight"]
    assert (shown["dtype"], shown["shape"], shown["nbytes"]) == ("F32", [64], 256)
    assert _hash_lines(served) == _hash_lines(reference)
    assert _tensorfs_out("stats", "--tsv", served) == _tensorfs_out("stats", "--tsv", reference)


@pytest.mark.parametrize("tool", TOOLS)
def test_every_view_shows_an_edit_at_once_and_after_a_remount(tmp_path, mount, kind, tool):
    edits = tmp_path / "fixes"
    mnt = mount(kind.model, "--edits", edits)
    new = (kind.norm * 3 + 1).astype(np.float32)
    TOOLS[tool](mnt, tmp_path, new, kind.norm)
    want = new if tool in ("cp", "numpy.save") else \
        np.concatenate([kind.norm[:3], new[3:6], kind.norm[6:]])
    reference = kind.reference(tmp_path / ("reference-" + kind.file), want)
    _check_views(kind, mnt, want, reference)
    result = run_tensorfs("unmount", mnt)
    assert result.returncode == 0, result.stderr
    again = mount(kind.model, "--edits", edits, name="again")
    _check_views(kind, again, want, reference)


def test_a_program_reads_its_own_writes_before_it_closes(tmp_path, mount):
    """Random writes and reads of one open raw file, plain and through a shared map, and a
    second open reading alongside: each read returns what was written last."""
    kind = Kind("gguf", tmp_path, big=True)
    mnt = mount(kind.model, "--edits", tmp_path / "fixes")
    path = mnt / "big" / "weight"
    expect = bytearray(kind.tensors["big.weight"].tobytes())
    rng = random.Random(3)
    fd = os.open(path, os.O_RDWR)
    other = os.open(path, os.O_RDONLY)
    mapped = mmap.mmap(fd, len(expect))
    try:
        for step in range(300):
            at = rng.randrange(len(expect) - 5000)
            n = rng.randrange(1, 5000)
            data = rng.randbytes(n)
            if step % 3 == 0:
                mapped[at:at + n] = data
            else:
                assert os.pwrite(fd, data, at) == n
            expect[at:at + n] = data
            at = rng.randrange(len(expect) - 9000)
            n = rng.randrange(1, 9000)
            reader = (fd, other)[step % 2]
            assert os.pread(reader, n, at) == bytes(expect[at:at + n]), step
            assert mapped[at:at + n] == bytes(expect[at:at + n]), step
    finally:
        mapped.close()
        os.close(other)
        os.close(fd)
    assert path.read_bytes() == bytes(expect)
    got = kind.tensor_of(mnt / "files" / kind.file, "big.weight")
    assert got.tobytes() == bytes(expect)
    # a metadata file and an .npy likewise
    for name, data in (("metadata/general.name", b"new name\n"), ("norm/weight.npy", None)):
        target = mnt / name
        if data is None:
            out = io.BytesIO()
            np.save(out, kind.norm + 1)
            data = out.getvalue()
        fd = os.open(target, os.O_RDWR | os.O_TRUNC)
        try:
            assert os.pwrite(fd, data, 0) == len(data)
            assert os.pread(fd, len(data) + 10, 0) == data
            assert target.read_bytes() == data
            assert os.fstat(fd).st_size == target.stat().st_size == len(data)
        finally:
            os.close(fd)
    assert (mnt / "metadata" / "general.name").read_bytes() == b"new name\n"
    assert np.array_equal(np.load(mnt / "norm" / "weight.npy"), kind.norm + 1)


def _rename_model(mnt: Path, name: str) -> None:
    (mnt / "metadata" / "general.name").write_text(name + "\n")


def test_each_open_of_files_reads_one_version(tmp_path, mount):
    """A reader and a map opened before an edit that shifts every offset keep the old bytes
    whole, while a reader opened after reads the new ones whole."""
    kind = Kind("gguf", tmp_path, big=True)
    old = kind.model.read_bytes()
    mnt = mount(kind.model, "--edits", tmp_path / "fixes")
    served = mnt / "files" / kind.file
    first_ino = served.stat().st_ino
    with open(served, "rb") as before, open(served, "rb") as mapped_file, \
            mmap.mmap(mapped_file.fileno(), 0, prot=mmap.PROT_READ) as mapped:
        start = before.read(1 << 16)
        assert mapped[:1 << 16] == old[:1 << 16]
        _rename_model(mnt, "a much longer name that moves every tensor")
        new = served.read_bytes()
        assert new != old and len(new) != len(old)
        rest = before.read()
        assert start + rest == old
        assert mapped[:] == old
        assert served.stat().st_ino != first_ino      # how: a new version, as by rename
    reference = kind.reference(tmp_path / "reference.gguf", kind.norm,
                               "a much longer name that moves every tensor")
    assert new == reference.read_bytes()


EDIT_LOOP = """
import os, sys
key, names = sys.argv[1], [n.encode() + b"\\n" for n in sys.argv[2:]]
i = 0
while True:
    i += 1
    fd = os.open(key, os.O_WRONLY | os.O_TRUNC)
    os.write(fd, names[i % 2])
    os.close(fd)
"""


def test_a_copy_racing_edits_is_one_version_whole(tmp_path, mount):
    kind = Kind("gguf", tmp_path, big=True)
    names = ["short", "a name long enough to shift every tensor's offset"]
    versions = {kind.reference(tmp_path / f"v{i}.gguf", kind.norm, n).read_bytes()
                for i, n in enumerate(names)}
    mnt = mount(kind.model, "--edits", tmp_path / "fixes")
    _rename_model(mnt, names[0])
    # the edits come from a process of their own: a descriptor open for writing that a
    # child of this one inherited (cp's) would be closed there, and each close keeps the
    # file as it is then (an empty name just after O_TRUNC), as on a disk
    key = mnt / "metadata" / "general.name"
    # (and not a shell's `>`, which closes a descriptor of the emptied file after its dup2)
    editor = subprocess.Popen([sys.executable, "-c", EDIT_LOOP, str(key), *names],
                              stderr=subprocess.PIPE, text=True)
    copies, refused = [], 0
    try:
        target = tmp_path / "copy.gguf"
        while len(copies) < 12 and refused < 200:
            # cp checks that the file it opened is the one it looked up: a version that
            # became an old one in between is refused in one line (as on a disk)
            result = subprocess.run(["cp", str(mnt / "files" / kind.file), str(target)],
                                    capture_output=True, text=True)
            if result.returncode:
                assert "replaced while being copied" in result.stderr, result.stderr
                refused += 1
                continue
            copies.append(target.read_bytes())
            copies.append((mnt / "files" / kind.file).read_bytes())
        assert editor.poll() is None, editor.stderr.read()
    finally:
        editor.kill()
        editor.communicate()
    assert len(copies) >= 12
    assert [i for i, copy in enumerate(copies) if copy not in versions] == []


def _libc_map(fd: int, size: int):
    """A shared writable map of ``fd`` by libc itself: unlike Python's mmap, which keeps a
    descriptor of its own until it is closed, it holds none (the kernel's map holds the
    file, as a C program's does)."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                          ctypes.c_int, ctypes.c_long]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    libc.msync.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    addr = libc.mmap(None, size, mmap.PROT_READ | mmap.PROT_WRITE, mmap.MAP_SHARED, fd, 0)
    assert addr not in (None, ctypes.c_void_p(-1).value), os.strerror(ctypes.get_errno())
    return libc, addr


@pytest.mark.parametrize("sync", ["msync", "munmap"])
def test_a_shared_map_written_after_close_is_kept(tmp_path, mount, sync):
    """Pages of a shared map written after the descriptor's close: kept at msync (Python's
    mmap.flush), and at munmap of a map that holds no descriptor (what the kernel's last
    release of the file follows)."""
    kind = Kind("gguf", tmp_path)
    mnt = mount(kind.model, "--edits", tmp_path / "fixes")
    path = mnt / "norm" / "weight"
    new = (kind.norm - 2).astype(np.float32)

    def kept() -> bool:
        return np.array_equal(kind.tensor_of(mnt / "files" / kind.file, "norm.weight"), new)

    fd = os.open(path, os.O_RDWR)
    if sync == "msync":
        mapped = mmap.mmap(fd, new.nbytes)
        os.close(fd)
        try:
            mapped[:] = new.tobytes()
            mapped.flush()
            assert kept()               # before the map is gone
        finally:
            mapped.close()
    else:
        libc, addr = _libc_map(fd, new.nbytes)
        os.close(fd)
        ctypes.memmove(addr, new.tobytes(), new.nbytes)
        assert libc.munmap(addr, new.nbytes) == 0
        assert wait_for(kept)
    assert path.read_bytes() == new.tobytes()
    reference = kind.reference(tmp_path / "reference.gguf", new)
    kind.same_file(mnt / "files" / kind.file, reference)
