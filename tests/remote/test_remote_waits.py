"""Reads of a remote model that wait without holding a thread (docs/reference/remote.md, "Reads that
wait"): a read whose bytes are on their way is kept by the daemon, not by one of libfuse's
threads, so that other requests are answered meanwhile; a reader killed while its read
waits ends the fetch made for it (the server sees the connection close), long before
``--timeout``, and the same bytes read later are right.  A fault proxy in front of nginx
holds the answers (``stall``) and says when a client leaves."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest

from tests.support.processes import alive, daemon_pid

MiB = 1 << 20
TIMEOUT = "120"                     # --timeout: far above every bound the tests wait for
BOUND_S = 20                        # what a test waits for the daemon to act, at most
SLOW_READERS = 12                   # more than libfuse's ten threads


@pytest.fixture(scope="module")
def wide(nginx, tmp_path_factory) -> Path:
    """One 64 MiB tensor (its bytes random), served by the session's nginx."""
    from safetensors.numpy import save_file

    path = tmp_path_factory.mktemp("wide") / "wide.safetensors"
    rng = np.random.default_rng(11)
    save_file({"w": rng.integers(0, 255, 64 * MiB, dtype=np.uint8)}, str(path))
    nginx.put("files/wide/wide.safetensors", path)
    return path


def _until(predicate, bound: float = BOUND_S) -> bool:
    deadline = time.monotonic() + bound
    while not predicate() and time.monotonic() < deadline:
        time.sleep(0.05)
    return predicate()


def _stalled(p) -> list:
    return [entry for entry in p.log if entry[3] == "stall"]


# read(2)'s number, as /proc/PID/syscall shows the call a process is blocked in
_READ = {"x86_64": 0, "aarch64": 63}[os.uname().machine]


def _in_read(pid: int) -> bool:
    """Whether ``pid`` is blocked in read(2) (dd, on the file it copies)."""
    try:
        return Path(f"/proc/{pid}/syscall").read_text().split()[0] == str(_READ)
    except (OSError, IndexError):
        return False


def _quiet(p, for_s: float = 0.5) -> bool:
    """Whether the proxy saw no new request for ``for_s`` seconds."""
    seen = len(p.log)
    time.sleep(for_s)
    return len(p.log) == seen


def _killed_while_it_waits(p, argv: list[str]) -> None:
    """Run ``argv``, its read held by the server; kill it while it waits: the fetch made for
    it ends (its connection closes)."""
    p.push("stall")
    reader = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        assert _until(lambda: _stalled(p)), p.log
        reader.kill()
        reader.wait(BOUND_S)
        assert _until(lambda: p.left), (p.log, p.left)
    finally:
        reader.kill()
        reader.wait()


def _answered_while_readers_wait(p, mnt: Path, path: Path, first: int, step: int,
                                 more: str = "") -> str:
    """More readers than libfuse has threads, of 4 KiB each of ``path`` at ``first`` and
    every ``step`` bytes after it (no page shared), each waiting on what the server holds
    (one fetch or several, as the block cache plans them): meanwhile a listing,
    metadata.json and the shell commands ``more`` are answered (their output), the readers
    still waiting.  Killed, every fetch made for them ends."""
    p.push(*["stall"] * SLOW_READERS)
    readers = [subprocess.Popen(["dd", f"if={path}", "of=/dev/null", "bs=4k", "count=1",
                                 f"skip={(first + i * step) // 4096}"], stderr=subprocess.DEVNULL)
               for i in range(SLOW_READERS)]
    try:
        assert _until(lambda: _stalled(p) and all(_in_read(r.pid) for r in readers)), p.log
        assert _until(lambda: _quiet(p))
        p.clear()                           # the stalls the readers' fetches did not take
        done = subprocess.run(["sh", "-c", f"ls -lR {mnt} && cat {mnt}/metadata.json{more}"],
                              capture_output=True, text=True, timeout=BOUND_S)
        assert done.returncode == 0, done.stderr
        assert all(reader.poll() is None for reader in readers)     # still waiting
    finally:
        for reader in readers:
            reader.kill()
            reader.wait()
    assert _until(lambda: len(p.left) == len(_stalled(p))), (p.log, p.left)
    return done.stdout


@pytest.mark.receivers
def test_a_killed_reader_ends_its_fetch_and_the_bytes_come_later(nginx, proxy, wide, rmount):
    p = proxy(nginx.port)
    mnt = rmount(f"{p.url}/files/wide/wide.safetensors", "--timeout", TIMEOUT)
    whole = mnt / "files" / "wide.safetensors"
    _killed_while_it_waits(p, ["cat", str(whole)])
    assert alive(daemon_pid(mnt))
    requests = len(p.log)
    time.sleep(1)
    assert len(p.log) == requests, p.log[requests:]        # and nothing more is asked for it
    subprocess.run(["cmp", str(whole), str(wide)], check=True)


@pytest.mark.receivers
def test_a_killed_sequential_reader_ends_its_read_ahead(nginx, proxy, wide, rmount):
    """A reader far enough into a file to get read-ahead, then every request held: once it
    is killed, the connection of every held request closes, read-ahead's included."""
    p = proxy(nginx.port)
    mnt = rmount(f"{p.url}/files/wide/wide.safetensors", "--timeout", TIMEOUT)
    p.push(*["pass"] * 4, *["stall"] * 40)
    reader = subprocess.Popen(["cat", str(mnt / "files" / "wide.safetensors")],
                              stdout=subprocess.DEVNULL)
    try:
        assert _until(lambda: len(_stalled(p)) >= 2), p.log
        time.sleep(1)                   # every request of the reader made by now
        reader.kill()
        reader.wait(BOUND_S)
        assert _until(lambda: len(p.left) == len(_stalled(p))), (p.log, p.left)
    finally:
        reader.kill()
        reader.wait()
    p.clear()
    assert alive(daemon_pid(mnt))
    subprocess.run(["cmp", str(mnt / "files" / "wide.safetensors"), str(wide)], check=True)


def test_a_killed_dd_of_a_tensor_ends_its_fetch(nginx, proxy, wide, rmount):
    """The same through a tensor's raw file, its .npy (a plain view of its bytes) and an
    O_DIRECT read (which the kernel does not interrupt either)."""
    p = proxy(nginx.port)
    mnt = rmount(f"{p.url}/files/wide/wide.safetensors", "--timeout", TIMEOUT)
    for name, skip, flags in (("w", 8, []), ("w.npy", 16, []), ("w", 24, ["iflag=direct"])):
        path = next(q for q in mnt.rglob(name) if q.is_file())
        p.left.clear()
        p.push("stall")
        reader = subprocess.Popen(["dd", f"if={path}", "of=/dev/null", "bs=1M", f"skip={skip}",
                                   *flags], stderr=subprocess.DEVNULL)
        try:
            assert _until(lambda: _stalled(p)), p.log
            reader.kill()
            reader.wait(BOUND_S)
            assert _until(lambda: p.left), (name, flags, p.log, p.left)
        finally:
            reader.kill()
            reader.wait()
        p.log.clear()
    assert alive(daemon_pid(mnt))
    import safetensors.numpy

    expected = safetensors.numpy.load_file(str(wide))["w"]
    raw = next(q for q in mnt.rglob("w") if q.is_file())
    assert raw.read_bytes() == expected.tobytes()
    assert np.array_equal(np.load(next(q for q in mnt.rglob("w.npy"))), expected)


def test_reads_that_wait_hold_no_thread(nginx, proxy, wide, rmount, tmp_path):
    """More slow readers than libfuse has threads, each waiting on a request the server
    holds: a listing, a stat, metadata.json and the model's header are answered meanwhile."""
    p = proxy(nginx.port)
    mnt = rmount(f"{p.url}/files/wide/wide.safetensors", "--timeout", TIMEOUT)
    whole = mnt / "files" / "wide.safetensors"
    p.push(*["stall"] * SLOW_READERS)
    readers = [subprocess.Popen(["dd", f"if={whole}", "of=/dev/null", "bs=4k", "count=1",
                                 f"skip={(4 * i + 2) * 256}"], stderr=subprocess.DEVNULL)
               for i in range(SLOW_READERS)]
    try:
        assert _until(lambda: len(_stalled(p)) == SLOW_READERS), p.log
        done = subprocess.run(["sh", "-c", f"ls -lR {mnt} && cat {mnt}/metadata.json && "
                               f"head -c 8 {whole} | od -A n -t u8"],
                              capture_output=True, text=True, timeout=BOUND_S)
        assert done.returncode == 0, done.stderr
        header = wide.read_bytes()[:8]
        assert done.stdout.split()[-1] == str(int.from_bytes(header, "little"))
        assert all(reader.poll() is None for reader in readers)     # still waiting
    finally:
        for reader in readers:
            reader.kill()
            reader.wait()
    assert _until(lambda: len(p.left) == SLOW_READERS), p.left
    assert alive(daemon_pid(mnt))
    with open(whole, "rb") as f:
        f.seek(10 * MiB)
        assert f.read(MiB) == wide.read_bytes()[10 * MiB:11 * MiB]
    assert os.stat(whole).st_size == wide.stat().st_size


@pytest.fixture(scope="module")
def quantized(nginx, tmp_path_factory) -> Path:
    """A GGUF of two 12 MiB (as float32) tensors whose .npy views are converted: ``q8``
    (Q8_0, a block quant: converted in cached chunks) and ``bf`` (BF16: converted per read),
    served by the session's nginx."""
    import gguf

    path = tmp_path_factory.mktemp("quantized") / "quantized.gguf"
    values = np.random.default_rng(12).standard_normal((768, 4096), dtype=np.float32)
    writer = gguf.GGUFWriter(str(path), "llama")
    # first, 2 MiB that no test stalls: the file's header is read from files/ meanwhile,
    # with the kernel's read-ahead after it
    writer.add_tensor("pad", np.zeros(1 << 19, np.float32))
    for name, kind in (("q8", gguf.GGMLQuantizationType.Q8_0),
                       ("bf", gguf.GGMLQuantizationType.BF16)):
        writer.add_tensor(name, gguf.quants.quantize(values, kind), raw_dtype=kind)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    nginx.put("files/quantized/quantized.gguf", path)
    return path


@pytest.mark.parametrize("name", ["q8", "bf"])
def test_converted_reads_that_wait_hold_no_thread(nginx, proxy, quantized, rmount, name):
    """A converted .npy of a remote tensor (a block quant's, BF16's): more slow readers than
    libfuse has threads wait for its stored bytes while a listing, metadata.json and the
    file's header are answered; killed, their fetches end; read later, every value is
    gguf-py's."""
    import gguf

    p = proxy(nginx.port)
    mnt = rmount(f"{p.url}/files/quantized/quantized.gguf", "--timeout", TIMEOUT)
    npy = next(q for q in mnt.rglob(f"{name}.npy") if q.is_file())
    done = _answered_while_readers_wait(p, mnt, npy, 4096, MiB,
                                        f" && head -c 4 {mnt}/files/quantized.gguf")
    assert done.endswith("GGUF")
    assert alive(daemon_pid(mnt))
    stored = next(t for t in gguf.GGUFReader(str(quantized)).tensors if t.name == name)
    expected = gguf.quants.dequantize(stored.data, stored.tensor_type)
    got = np.load(npy)
    assert got.size == expected.size
    assert np.array_equal(got.ravel(), expected.ravel())


@pytest.fixture(scope="module")
def checkpoint(nginx, tmp_path_factory) -> Path:
    """A PyTorch checkpoint of one 12 MiB float32 tensor, served by the session's nginx."""
    torch = pytest.importorskip("torch")
    path = tmp_path_factory.mktemp("checkpoint") / "ckpt.pt"
    torch.manual_seed(13)
    torch.save({"w": torch.randn(768 * 4096)}, path)
    nginx.put("files/checkpoint/ckpt.pt", path)
    return path




def test_a_remote_checkpoints_reads_that_wait_hold_no_thread(nginx, proxy, checkpoint, rmount):
    """A remote PyTorch checkpoint's tensor, read from its storage in the zip (a composed
    file): slow readers wait without holding a thread while a listing and metadata.json
    are answered; killed, their fetches end; read later, the bytes are torch's."""
    import torch

    p = proxy(nginx.port)
    mnt = rmount(f"{p.url}/files/checkpoint/ckpt.pt", "--timeout", TIMEOUT)
    target = next(q for q in mnt.rglob("w") if q.is_file())
    _answered_while_readers_wait(p, mnt, target, 0, MiB)
    assert alive(daemon_pid(mnt))
    want = torch.load(checkpoint, weights_only=True)["w"]
    assert target.read_bytes() == want.numpy().tobytes()


def test_an_edited_remote_models_file_read_that_waits_ends_with_its_reader(
        nginx, proxy, quantized, rmount, tmp_path):
    """files/ of a remote GGUF with a metadata edit (``--edits``: a new header, the
    tensors' bytes read from the server by range): a reader killed while its read waits
    ends the fetch made for it, long before ``--timeout``; read later, the file is the
    edited model, every tensor's bytes gguf-py's.  (One reader: in an editable mount every
    open of a file drops its pages, so the kernel holds a second open of it until the
    first one's pending read is answered.)"""
    import gguf

    p = proxy(nginx.port)
    mnt = rmount(f"{p.url}/files/quantized/quantized.gguf", "--timeout", TIMEOUT,
                 "--edits", str(tmp_path / "edits"))
    subprocess.run(["sh", "-c", f"echo fixed > {mnt}/metadata/general.name"], check=True)
    target = mnt / "files" / "quantized.gguf"
    _killed_while_it_waits(p, ["dd", f"if={target}", "of=/dev/null", "bs=4k", "count=1",
                               f"skip={5 * MiB // 4096}"])
    assert alive(daemon_pid(mnt))
    # read(2), not an mmap: a page fault would hold the GIL that the proxy, in this
    # process, needs to answer the daemon's fetch
    copy = tmp_path / "edited.gguf"
    copy.write_bytes(target.read_bytes())
    edited, stored = gguf.GGUFReader(str(copy)), gguf.GGUFReader(str(quantized))
    field = edited.fields["general.name"]
    assert bytes(field.parts[field.data[0]]) == b"fixed"
    for t, want in zip(edited.tensors, stored.tensors):
        assert (t.name, t.data.tobytes()) == (want.name, want.data.tobytes())
