"""Conversion worker processes (tensorfs.convert.workers) through real mounts: parallel readers
against the oracle, a worker killed in the middle of a read, and no process left behind
whichever way the mount ends."""

from __future__ import annotations

import ctypes
import errno
import fcntl
import os
import signal
import struct
import termios
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from tests.support import (
    TENSORFS,
    alive,
    cmdline,
    daemon_pid,
    fuse_mounts_under,
    in_fuse_request,
    run_tensorfs,
    safetensors_corpus,
    usage_error,
    wait_for,
    worker_pids,
)
from tests.support.reliability_models import npy_bytes, write_mixed_gguf
from tests.support.users import needs_users

pytestmark = pytest.mark.slow     # every test here runs for seconds

CONVERTED = ("b.q8_0.weight", "c.bf16.weight", "d.q4_k.weight")


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    path = tmp_path_factory.mktemp("workers") / "mixed.gguf"
    return path, write_mixed_gguf(path, seed=16, scale=2)


def _running(pid: int) -> bool:
    """A live process (not a zombie waiting to be reaped) that is still a worker."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            state = f.read().rsplit(b")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in (b"Z", b"X") and b"tensorfs.convert.workers" in cmdline(pid)


def _wait_workers(pid: int, n: int, exclude=()) -> list[int]:
    assert wait_for(lambda: len([w for w in worker_pids(pid) if w not in exclude]) >= n, 30)
    return [w for w in worker_pids(pid) if w not in exclude]


def test_eight_parallel_readers_with_a_1mib_cache_and_two_workers(model, mount, tmp_path):
    path, expected = model
    log = tmp_path / "daemon.log"
    mnt = mount(path, "--workers", "2", "--cache-size", "1M", "--log", str(log))
    pid = daemon_pid(mnt)
    _start_workers(mnt, expected, log)
    wants = {name: npy_bytes(expected[name].values) for name in CONVERTED}

    def reader(i: int) -> None:
        rng = np.random.default_rng(i)
        name = CONVERTED[i % len(CONVERTED)]
        want = wants[name]
        file = mnt / (expected[name].path + ".npy")
        with open(file, "rb") as f:
            if i % 2:                                   # sequential: read-ahead on the workers
                got = b"".join(iter(lambda: f.read(1 << 20), b""))
                assert got == want, name
            else:                                       # random ranges: the shared cache
                for _ in range(40):
                    offset = int(rng.integers(0, len(want)))
                    size = int(rng.integers(1, 3 << 20))
                    assert os.pread(f.fileno(), size, offset) == want[offset:offset + size], name
            os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)

    for _ in range(2):
        with ThreadPoolExecutor(8) as pool:
            list(pool.map(reader, range(8)))
    assert len(worker_pids(pid)) == 2
    assert _rss_shmem_kib(pid) >= 1024       # the chunks were in the shared arena
    for name in CONVERTED:
        assert np.array_equal(np.load(mnt / (expected[name].path + ".npy")).view(np.uint32),
                              expected[name].values.view(np.uint32))


def _rss_shmem_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("RssShmem:"))


def _start_workers(mnt, expected, log) -> None:
    """Workers start on the first costly conversion: ask for one, wait until they are ready.
    (The chunks asked for now are converted in-thread and cached: not the Q4_K ones.)"""
    with open(mnt / (expected["b.q8_0.weight"].path + ".npy"), "rb") as f:
        f.read(4096)
    assert wait_for(lambda: "conversion workers ready" in log.read_text(), 30)


def _pidfd_getfd(pid: int, fd: int) -> int | None:
    """A duplicate of another process's descriptor (Linux 5.6+, needs ptrace rights)."""
    libc = ctypes.CDLL(None, use_errno=True)
    try:
        pidfd = os.pidfd_open(pid)
    except OSError:
        return None
    try:
        got = libc.syscall(438, pidfd, fd, 0)        # SYS_pidfd_getfd
        return got if got >= 0 else None
    finally:
        os.close(pidfd)


def _queued_task(worker: int) -> bool | None:
    """Whether a task waits in the worker's socket (None: cannot tell)."""
    fd = _pidfd_getfd(worker, int(cmdline(worker).split(b"\0")[4]))
    if fd is None:
        return None
    try:
        n = fcntl.ioctl(fd, termios.FIONREAD, struct.pack("i", 0))
        return struct.unpack("i", n)[0] > 0
    finally:
        os.close(fd)


def test_a_worker_killed_during_a_read_gives_eio_then_the_mount_recovers(model, mount, tmp_path):
    path, expected = model
    log = tmp_path / "daemon.log"
    mnt = mount(path, "--workers", "2", "--log", str(log))
    pid = daemon_pid(mnt)
    name = "d.q4_k.weight"
    file = mnt / (expected[name].path + ".npy")
    want = npy_bytes(expected[name].values)
    _start_workers(mnt, expected, log)
    workers = _wait_workers(pid, 2)
    for w in workers:                       # stopped: a task sent to one stays in its socket
        os.kill(w, signal.SIGSTOP)
    result = {}
    offset, size = 1 << 20, 4096            # inside the second chunk of the view

    def read():
        # O_DIRECT: one request, answered as it is.  (A buffered read is retried once by the
        # kernel's page cache after an error, and that retry is served by the new worker.)
        fd = os.open(file, os.O_RDONLY | os.O_DIRECT)
        try:
            result["data"] = os.pread(fd, size, offset)
        except OSError as error:
            result["error"] = error
        finally:
            os.close(fd)

    reader = threading.Thread(target=read)
    reader.start()
    try:
        # the task waits in a stopped worker's socket; where pidfd_getfd cannot tell (None),
        # the reader is seen waiting for the daemon's answer instead
        assert wait_for(lambda: any(_queued_task(w) for w in workers)
                        or (_queued_task(workers[0]) is None
                            and in_fuse_request(reader.native_id)), 30)
        assert reader.is_alive()            # the read waits for the stopped worker
    finally:
        for w in workers:
            os.kill(w, signal.SIGKILL)
    reader.join(60)
    assert not reader.is_alive()
    assert isinstance(result.get("error"), OSError) and result["error"].errno == errno.EIO
    # replaced, and reads work again
    new = _wait_workers(pid, 2, exclude=workers)
    assert len(new) == 2
    assert wait_for(lambda: log.read_text().count("2 conversion workers ready") == 2, 30)
    with open(file, "rb") as f:
        assert os.pread(f.fileno(), size, offset) == want[offset:offset + size]
        assert f.read() == want
    text = log.read_text()
    assert "conversion worker" in text and "died" in text


def _no_workers_left(workers) -> bool:
    return not any(_running(w) for w in workers)


@pytest.mark.parametrize("how", ["unmount", "SIGTERM", "SIGKILL"])
def test_no_worker_outlives_its_mount(model, mount, how):
    path, expected = model
    mnt = mount(path, "--workers", "2")
    pid = daemon_pid(mnt)
    name = "d.q4_k.weight"
    assert np.array_equal(np.load(mnt / (expected[name].path + ".npy")).view(np.uint32),
                          expected[name].values.view(np.uint32))
    workers = _wait_workers(pid, 2)
    if how == "unmount":
        assert run_tensorfs("unmount", mnt).returncode == 0
    else:
        os.kill(pid, getattr(signal, how))
    assert wait_for(lambda: not alive(pid), 30)
    assert wait_for(lambda: _no_workers_left(workers), 30), \
        [w for w in workers if _running(w)]


def test_no_worker_starts_without_a_costly_conversion_to_do(model, mount, tmp_path):
    path, expected = model
    mnt = mount(path, "--workers", "0")
    name = "d.q4_k.weight"
    assert np.array_equal(np.load(mnt / (expected[name].path + ".npy")).view(np.uint32),
                          expected[name].values.view(np.uint32))
    assert worker_pids(daemon_pid(mnt)) == []

    # BF16 is a cheap conversion (in the daemon, straight into the reply): no worker starts
    st_path = tmp_path / "bf16.safetensors"
    st_path.write_bytes(safetensors_corpus.one("BF16", (4,), 0, 8, data=bytes(8)))
    logs = [tmp_path / "bf16.log", tmp_path / "listed.log"]
    mnt2 = mount(st_path, "--workers", "2", "--log", logs[0])
    assert np.array_equal(np.load(mnt2 / "t.npy"), np.zeros(4, np.float32))
    assert worker_pids(daemon_pid(mnt2)) == []
    # nor does a mount of quantized tensors that is only listed
    mnt3 = mount(path, "--workers", "2", "--log", logs[1])
    assert sorted(os.listdir(mnt3 / "d" / "q4_k")) == ["weight", "weight.npy"]
    assert worker_pids(daemon_pid(mnt3)) == []
    # not later either: once the daemons are gone their logs are complete, and a pool that
    # started (even after the reads) would have said "conversion workers ready"
    for mnt, log in zip((mnt2, mnt3), logs):
        assert run_tensorfs("unmount", mnt).returncode == 0
        assert "conversion workers ready" not in log.read_text(), log.read_text()


def test_a_negative_worker_count_is_one_usage_line(model, tmp_path):
    path, _ = model
    (tmp_path / "m").mkdir()
    for bad in ("-1", "two"):
        result = run_tensorfs("mount", path, tmp_path / "m", "--workers", bad)
        assert "--workers" in usage_error(result)


def test_more_workers_than_the_machine_can_use_is_one_usage_line(model, tmp_path):
    """The review's --workers 1000 on 2 CPUs started hundreds of interpreters: refused,
    naming the most this machine takes (4 per usable CPU); the most is taken."""
    from tensorfs.convert.workers import max_workers

    path, _ = model
    mnt = tmp_path / "m"
    mnt.mkdir()
    most = max_workers()
    for many in (1000, most + 1):
        result = run_tensorfs("mount", path, mnt, "--workers", str(many))
        mounted = fuse_mounts_under(mnt)
        if mounted:
            run_tensorfs("unmount", mnt)
        assert not mounted, result.stderr
        assert f"--workers: {many} is more than this machine can use: at most {most} " in \
            usage_error(result)
    result = run_tensorfs("mount", path, mnt, "--workers", str(most))
    assert result.returncode == 0, result.stderr
    assert run_tensorfs("unmount", mnt).returncode == 0


@needs_users
@pytest.mark.slow
def test_workers_that_cannot_start_under_a_process_limit_are_given_up_in_two_lines(
        users, shared_dir):
    """A real user's mount under ``prlimit --nproc``: the pool asks for as many workers as
    the machine allows, the kernel refuses most forks.  The pool waits longer after each
    failure and gives up after a few (one line when it starts failing, one when it gives
    up: the review saw ~900 lines a second), every byte read is still right (converted in
    the daemon's threads or by the workers that did start), and unmount ends the daemon."""
    from tensorfs.convert.workers import max_workers

    user, _ = users
    path = shared_dir / "mixed.gguf"
    expected = write_mixed_gguf(path, seed=3)
    path.chmod(0o644)
    mnt = shared_dir / "mnt"
    mnt.mkdir()
    os.chown(mnt, user.uid, user.uid)
    out = shared_dir / "out"
    out.mkdir()
    os.chown(out, user.uid, user.uid)
    log, npy = out / "daemon.log", out / "read.npy"
    name = "d.q4_k.weight"
    t = " ".join(TENSORFS)
    # the daemon's own threads (libfuse's, the keeper, read-ahead) count against the limit:
    # 12 leaves room for them and for a worker or two, not for the rest
    script = (f"prlimit --nproc=12:12 {t} mount {path} {mnt} --workers {max_workers()} "
              f"--log {log} || exit 1; "
              f"cat {mnt}/{expected[name].path}.npy > {npy}; "
              f"i=0; while [ $i -lt 120 ] && ! grep -q 'gave up starting' {log}; do "
              f"sleep 0.5; i=$((i+1)); done; "
              f"cat {mnt}/{expected[name].path}.npy | cmp - {npy} && "
              f"{t} unmount {mnt}; echo unmount=$?")
    result = user.script_in_fuse_namespace(script, shared_dir, env={"XDG_RUNTIME_DIR": ""})
    text = log.read_text()
    assert "unmount=0" in result.stdout, (result.stdout, result.stderr, text)
    assert "did not exit" not in result.stderr          # the daemon ended by itself
    assert npy.read_bytes() == npy_bytes(expected[name].values)
    failures = [line for line in text.splitlines() if "conversion worker" in line
                and ("could not start" in line or "while starting" in line)]
    assert any("gave up starting conversion workers" in line for line in failures), text
    assert len(failures) == 2, text
    assert "unmounted" in text


def test_a_truncated_model_gives_eio_through_the_workers_and_they_live_on(tmp_path, mount):
    path = tmp_path / "mixed.gguf"
    expected = write_mixed_gguf(path, seed=7)
    log = tmp_path / "daemon.log"
    mnt = mount(path, "--workers", "2", "--log", str(log))
    pid = daemon_pid(mnt)
    _start_workers(mnt, expected, log)
    workers = worker_pids(pid)
    q4k = expected["d.q4_k.weight"]
    os.truncate(path, q4k.offset + 1000)           # inside the Q4_K tensor
    for name in CONVERTED:
        fd = os.open(mnt / (expected[name].path + ".npy"), os.O_RDONLY | os.O_DIRECT)
        try:
            with pytest.raises(OSError) as error:
                os.pread(fd, 1 << 20, 0)
            assert error.value.errno == errno.EIO
        finally:
            os.close(fd)
    text = log.read_text()
    assert "truncated" in text and "Traceback" not in text and "died" not in text
    assert sorted(worker_pids(pid)) == sorted(workers)      # the read failed, not a worker


def test_a_stopped_worker_is_killed_after_the_timeout_and_the_read_fails_not_hangs(model, tmp_path):
    path, expected = model
    log = tmp_path / "daemon.log"
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    env = dict(os.environ, TENSORFS_WORKER_TIMEOUT_S="2")
    result = run_tensorfs("mount", path, mnt, "--workers", "1", "--log", log, env=env)
    assert result.returncode == 0, result.stderr
    try:
        pid = daemon_pid(mnt)
        _start_workers(mnt, expected, log)
        [worker] = _wait_workers(pid, 1)
        os.kill(worker, signal.SIGSTOP)             # alive, but never answers
        name = "d.q4_k.weight"
        fd = os.open(mnt / (expected[name].path + ".npy"), os.O_RDONLY | os.O_DIRECT)
        try:
            with pytest.raises(OSError) as error:     # after the 2 s timeout, not never
                os.pread(fd, 4096, 1 << 20)
            assert error.value.errno == errno.EIO
            assert wait_for(lambda: not _running(worker), 10)       # killed, not left
            [new] = _wait_workers(pid, 1, exclude=[worker])
            assert wait_for(lambda: log.read_text().count("conversion workers ready") == 2, 30)
            want = npy_bytes(expected[name].values)
            assert os.pread(fd, 4096, 1 << 20) == want[1 << 20:(1 << 20) + 4096]
        finally:
            os.close(fd)
        assert "did not answer in 2 s" in log.read_text()
    finally:
        assert run_tensorfs("unmount", mnt).returncode == 0


# -- where the pool pays (issue 23) -------------------------------------------------------------

BIG = "big.q4_k.weight"
BIG_SHAPE = (8192, 4096)          # 128 MiB of float32: costly work enough to start workers ahead


@pytest.fixture(scope="module")
def big_model(tmp_path_factory):
    """A Q4_K tensor whose view is START_WORK_BYTES, and its stored blocks."""
    import gguf

    from tensorfs.convert.workers import START_WORK_BYTES
    from tests.support.quant_blocks import random_blocks

    rows, cols = BIG_SHAPE
    assert rows * cols * 4 >= START_WORK_BYTES
    blocks = random_blocks("Q4_K", rows * cols // 256, np.random.default_rng(23), raw_tail=0)
    path = tmp_path_factory.mktemp("big") / "big.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_tensor(BIG, blocks.reshape(rows, -1), raw_dtype=gguf.GGMLQuantizationType.Q4_K)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path, blocks.reshape(-1, 144)


def _big_range_ok(mnt, blocks, first_block: int, n_blocks: int) -> bool:
    """The .npy view's values of blocks [first, first + n) against gguf-py, read with O_DIRECT
    (one request each, straight from the daemon)."""
    from tests.support.quant_blocks import oracle

    want = oracle("Q4_K", blocks[first_block:first_block + n_blocks].reshape(-1))
    path = mnt / (BIG.replace(".", "/") + ".npy")
    with open(path, "rb") as f:                      # where the data starts
        np.lib.format.read_magic(f)
        np.lib.format.read_array_header_1_0(f)
        start = f.tell()
    offset = start + first_block * 256 * 4
    fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
    try:
        aligned = offset - offset % 4096
        end = offset + want.nbytes
        data = os.pread(fd, (end - aligned + 4095) // 4096 * 4096, aligned)
        got = data[offset - aligned:end - aligned]
    finally:
        os.close(fd)
    return np.array_equal(np.frombuffer(got, np.float32).view(np.uint32), want.view(np.uint32))


@pytest.mark.parametrize("cpus, load, paying", [
    (1, 0, 0), (2, 0, 0), (3, 0, 0), (4, 0, 2), (4, 1.2, 0), (16, 0, 14), (16, 8, 6),
    (16, 13.6, 0)])
def test_workers_pay_only_on_cpus_the_daemon_and_the_reader_leave_idle(cpus, load, paying):
    from tensorfs.convert.workers import paying_size

    assert paying_size(cpus=cpus, load=load) == paying


@pytest.mark.parametrize("cpus", [1, 2])
def test_by_default_no_worker_starts_on_one_or_two_cpus(big_model, mount, tmp_path, cpus):
    path, blocks = big_model
    mine = sorted(os.sched_getaffinity(0))
    if len(mine) < cpus:
        pytest.skip(f"this process may run on {len(mine)} CPU(s)")
    log = tmp_path / "daemon.log"
    os.sched_setaffinity(0, mine[:cpus])          # the daemon inherits it
    try:
        mnt = mount(path, "--log", str(log))
    finally:
        os.sched_setaffinity(0, mine)
    assert wait_for(lambda: "conversions in the daemon's threads" in log.read_text(), 30)
    assert _big_range_ok(mnt, blocks, 4096, 2048)          # 8 MiB of float32, 3 chunks
    assert worker_pids(daemon_pid(mnt)) == []
    assert "conversion worker" not in log.read_text()


def test_workers_start_ahead_for_costly_work_and_a_read_meanwhile_converts_in_thread(
        big_model, mount, tmp_path):
    path, blocks = big_model
    log = tmp_path / "daemon.log"
    mnt = mount(path, "--workers", "2", "--log", str(log),
                env={"TENSORFS_WORKER_TIMEOUT_S": "10"})
    pid = daemon_pid(mnt)
    # no read yet: the mount started them, for a model with 128 MiB of Q4_K views
    workers = wait_for(lambda: (w := worker_pids(pid)) and len(w) == 2 and w, 30, step=0.002)
    assert workers, worker_pids(pid)
    for w in workers:                   # held in their start-up: never ready meanwhile
        os.kill(w, signal.SIGSTOP)
    try:
        text = log.read_text()
        assert "starting the conversion workers ahead: 128 MiB" in text
        assert "conversion workers ready" not in text, "a worker was ready before it was stopped"
        # converted in the daemon's threads: a read sent to a stopped worker would fail
        assert _big_range_ok(mnt, blocks, 8192, 2048)
        assert "conversion workers ready" not in log.read_text()
    finally:
        for w in workers:
            os.kill(w, signal.SIGCONT)
    assert wait_for(lambda: "2 conversion workers ready" in log.read_text(), 30)
    assert _big_range_ok(mnt, blocks, 65536, 4096)         # now through the workers
    assert sorted(worker_pids(pid)) == sorted(workers)
    assert "died" not in log.read_text() and "did not answer" not in log.read_text()


def test_the_pool_owns_its_slots_starts_only_for_work_worth_it_and_takes_chunks_back():
    from tensorfs.convert import conversion_from_spec
    from tensorfs.convert.workers import SPARE_SLOTS, WorkerPool
    from tensorfs.dtypes import GGML_TYPES_BY_NAME
    from tests.support.quant_blocks import oracle, random_blocks

    conv = conversion_from_spec(("ggml", GGML_TYPES_BY_NAME["Q4_K"].id, "<"))
    n_blocks = 1024                                  # one whole 1 MiB chunk
    data = random_blocks("Q4_K", n_blocks, np.random.default_rng(5))
    want = oracle("Q4_K", data)

    def fill(buf):
        buf[:] = data.tobytes()

    def convert(work):
        return pool.convert(conv, fill, data.nbytes, want.nbytes, work=work)

    pool = WorkerPool(2, slot_bytes=1 << 20, held_bytes=4 << 20, start_work=64 << 20)
    pool.start()
    try:
        slots = 4 + SPARE_SLOTS
        assert pool.slots() == (slots, 0)
        assert convert(work=1 << 20) is None        # cheap work: convert in-thread, no start
        assert not pool.started and pool.pids() == []
        assert convert(work=64 << 20) is None       # worth it: started, in-thread meanwhile
        assert pool.started
        assert pool.wait_ready(60) and len(pool.pids()) == 2
        held = [convert(work=0) for _ in range(slots)]       # ready: any work goes to them
        assert all(c is not None for c in held)
        assert pool.slots() == (0, slots)
        assert convert(work=0) is None              # every slot held: in-thread
        for c in held:
            assert np.array_equal(np.frombuffer(c.data, np.float32).view(np.uint32),
                                  want.view(np.uint32))
        held[0].release()
        held[0].release()                           # once only
        assert pool.slots() == (1, slots - 1)
        del held, c                                 # dropped: back to the pool
        assert pool.slots() == (slots, 0)
    finally:
        pids = pool.pids()
        pool.close()
    assert wait_for(lambda: _no_workers_left(pids), 10)
    assert convert(work=64 << 20) is None           # closed: nothing to hand out


def test_a_pool_closed_while_its_workers_start_leaves_no_process_and_no_traceback(capfd):
    from tensorfs.convert.workers import start_ahead

    pool = start_ahead(size=2)
    assert wait_for(lambda: len(pool.pids()) == 2, 30, step=0.005)
    pids = pool.pids()
    pool.close()                        # before they said they were ready (or just after)
    assert wait_for(lambda: _no_workers_left(pids), 10)
    assert "Traceback" not in capfd.readouterr().err
