"""Conversion worker processes: costly conversions (block quants, gguf-py's long tail) on
every core, not on one core at a time behind the GIL (docs/serving.md, "The worker pool").

The daemon and its workers share one memory arena (a ``memfd``, mapped by both):

* one *input slot* per worker, where the daemon reads the stored bytes of the blocks to
  convert (``source.read_into``: one ``pread`` for a local file, the GIL released; the
  checks that turn a truncated or rewritten model into EIO stay in the daemon, and any
  source works, local or not);
* *output slots* of one converted chunk each (``CHUNK_OUTPUT_BYTES``), where a worker writes
  the float32 values and from where the daemon replies.  A slot belongs to one chunk of the
  daemon's caches; it comes back to the free list when that chunk is dropped.

No chunk data crosses a pipe: a task is a few numbers (which slots, how many bytes, which
conversion) on a socket, and the answer is ``ok`` or one line saying what failed.

Workers are started with ``spawn`` semantics (a fresh ``python -m tensorfs.workers``, through
``subprocess``: fork + exec at once), so the daemon may start one at any time, also once
libfuse's threads exist: a worker that dies is replaced the same way the first ones were
started.  They start when the first costly conversion asks for them; until one is ready,
the daemon converts in its own threads.  A worker never outlives its daemon: the kernel
kills it when the daemon's thread that started it ends (``PR_SET_PDEATHSIG``), it exits
when its socket reaches end of file, and it checks at start that its parent is still the
daemon that started it.

Faults: a worker that dies (or stops answering for ``TASK_TIMEOUT_S``) fails the reads it was
serving with ``WorkerError`` (EIO) and is replaced; nothing waits forever.
"""

from __future__ import annotations

import ctypes
import errno
import json
import logging
import mmap
import os
import queue
import select
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from tensorfs.views import CHUNK_OUTPUT_BYTES, STREAM_BYTES

log = logging.getLogger("tensorfs")

# Stored bytes of one chunk: every costly type stores at most 292 bytes per 256 elements
# (Q8_K), i.e. under 0.3 bytes per float32 output byte; a half leaves room.
IN_SLOT_BYTES = CHUNK_OUTPUT_BYTES // 2
# A conversion of one chunk takes milliseconds; this long without an answer means the
# worker is stuck (or stopped): it is killed and replaced, and the read fails with EIO.
TASK_TIMEOUT_S = float(os.environ.get("TENSORFS_WORKER_TIMEOUT_S", "30"))  # tests shorten it
# Output slots beyond what the caches may hold: chunks being converted or copied into a
# reply at the moment their cache drops them.  Past that, chunks are made in-thread.
SPARE_SLOTS = 32
RESPAWN_PAUSE_S = 1.0                 # between two starts of the same worker slot

_TASK = struct.Struct("<QQQQ")        # input offset, input bytes, output offset, output bytes
_PR_SET_PDEATHSIG = 1


class WorkerError(OSError):
    """A conversion worker died, stopped answering, or failed: the read gets EIO."""

    def __init__(self, message: str):
        super().__init__(errno.EIO, message)


def default_size() -> int:
    """One worker per CPU this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


class _Worker:
    __slots__ = ("index", "proc", "sock", "pidfd", "dead", "ready")

    def __init__(self, index: int, proc: subprocess.Popen, sock: socket.socket, pidfd: int):
        self.index = index
        self.proc = proc
        self.sock = sock
        self.pidfd = pidfd
        self.dead = False
        self.ready = False      # said so once its imports were done


class WorkerPool:
    """``size`` conversion workers and the arena they share with the daemon.

    ``out_slots`` bounds the converted chunks that can live in the arena at once: the
    caches' byte budgets (``--cache-size`` and the stream store) in chunks, plus spares.
    Pages of the arena are only backed once touched, and free slots are reused last-freed
    first, so the memory used is that of the most chunks held at once.
    """

    def __init__(self, size: int, cache_bytes: int):
        self.size = max(0, size)
        self.out_slots = (cache_bytes + STREAM_BYTES) // CHUNK_OUTPUT_BYTES + SPARE_SLOTS
        # One sequential reader keeps every worker busy: the chunk it asks for and the ones
        # after it are converted at the same time (benchmark row 4).
        self.read_ahead_chunks = self.size + 1
        self.running = False
        # Workers that finished starting (imported numpy and the kernels) and are not known
        # dead.  Until one is, chunks are converted in the daemon's threads: a fresh mount's
        # first reads do not wait for interpreters to start (~0.1 s each, more when loaded).
        self.ready_workers = 0
        self._closed = False
        self._workers: list[_Worker | None] = []
        self._idle: queue.Queue[_Worker] = queue.Queue()
        self._slots_lock = threading.Lock()
        self._free: list[int] = []
        self._specs: dict[tuple, bytes] = {}    # Conversion.spec -> its bytes in a task
        self._poisoned: set[int] = set()      # slots a worker that would not die may write
        self._stop_lock = threading.Lock()
        self._keeper: threading.Thread | None = None
        self._executor: ThreadPoolExecutor | None = None
        self._executor_lock = threading.Lock()
        self.arena: mmap.mmap | None = None
        self._arena_fd = -1
        self._wake_r = self._wake_w = -1
        self._wanted = threading.Event()

    # -- life -----------------------------------------------------------------------------
    def start(self) -> None:
        """Map the arena and start the keeper thread, which starts the workers when the
        first costly conversion asks for them (``want``): a mount that is never read that
        way (most are only listed, or hold no quantized tensor) starts no interpreter."""
        if self.size == 0 or self.running:
            return
        self._in_bytes = self.size * IN_SLOT_BYTES
        total = self._in_bytes + self.out_slots * CHUNK_OUTPUT_BYTES
        self._arena_fd = os.memfd_create("tensorfs-arena", os.MFD_CLOEXEC)
        os.ftruncate(self._arena_fd, total)
        self.arena = mmap.mmap(self._arena_fd, total, mmap.MAP_SHARED,
                               mmap.PROT_READ | mmap.PROT_WRITE)
        self.arena_bytes = total
        self._free = list(range(self.out_slots - 1, -1, -1))
        self._workers = [None] * self.size
        self._wake_r, self._wake_w = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
        self.running = True
        # Workers are started, watched and replaced by this one thread: PR_SET_PDEATHSIG
        # fires when the *thread* that started a child ends, so it must be one that lives
        # as long as the pool (libfuse's threads come and go).
        self._keeper = threading.Thread(target=self._keep, name="tensorfs-workers", daemon=True)
        self._keeper.start()

    def want(self) -> None:
        """A costly conversion is asked for: start the workers if they are not started.
        (Until they are ready, chunks are converted in the daemon's threads.)"""
        if not self._wanted.is_set():
            self._wanted.set()

    def close(self) -> None:
        if not self.running or self._closed:
            return
        self._closed = True
        self._wanted.set()
        self._wake()
        if self._keeper is not None:
            self._keeper.join(timeout=5)
        for w in self._workers:
            if w is not None:
                self._stop(w)
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)
        for fd in (self._arena_fd, self._wake_r, self._wake_w):
            os.close(fd)
        self.running = False

    def _stop(self, w: _Worker) -> None:
        """End one worker: end of file on its socket, then SIGKILL if it lingers; reaped.
        Once only: its descriptor numbers may belong to something else afterwards."""
        self._mark_dead(w)
        with self._stop_lock:
            if w.pidfd < 0:
                return
            pidfd, w.pidfd = w.pidfd, -1
        try:
            w.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        try:
            w.proc.wait(timeout=1)
        except subprocess.TimeoutExpired:
            w.proc.kill()
            w.proc.wait()
        os.close(pidfd)

    def _mark_dead(self, w: _Worker) -> None:
        with self._stop_lock:
            if not w.dead:
                w.dead = True
                if w.ready:
                    self.ready_workers -= 1

    def pids(self) -> list[int]:
        return [w.proc.pid for w in self._workers if w is not None and not w.dead]

    # -- the keeper thread: start, watch, replace ------------------------------------------
    def _keep(self) -> None:
        self._wanted.wait()
        try:
            self._keep_loop()
        except BaseException:
            log.exception("the conversion workers' keeper failed")
            raise

    def _keep_loop(self) -> None:
        last_start = [0.0] * self.size
        while not self._closed:
            for i, w in enumerate(self._workers):
                if w is not None and not w.dead:
                    continue
                if w is not None:
                    self._stop(w)
                    self._workers[i] = None
                if time.monotonic() - last_start[i] < RESPAWN_PAUSE_S:
                    continue
                last_start[i] = time.monotonic()
                try:
                    new = self._spawn(i)
                except OSError as error:
                    log.error("could not start conversion worker %d: %s", i, error)
                    continue
                self._workers[i] = new
            watched = {w.pidfd: w for w in self._workers if w is not None and not w.dead}
            starting = {w.sock.fileno(): w for w in self._workers
                        if w is not None and not w.dead and not w.ready}
            pending = any(w is None for w in self._workers)
            try:
                ready, _, _ = select.select([self._wake_r, *watched, *starting], [], [],
                                            RESPAWN_PAUSE_S if pending else None)
            except OSError:
                continue
            for fd in ready:
                if fd in starting:
                    self._hello(starting[fd])
                    continue
                if fd == self._wake_r:
                    try:
                        while os.read(self._wake_r, 512):
                            pass
                    except BlockingIOError:
                        pass
                    continue
                w = watched[fd]
                if not self._closed and not w.dead:
                    w.proc.poll()
                    log.error("conversion worker %d (pid %d) died (exit status %s); starting "
                              "another", w.index, w.proc.pid, w.proc.returncode)
                self._mark_dead(w)

    def _hello(self, w: _Worker) -> None:
        """A starting worker's first message: its imports are done, it takes tasks now."""
        try:
            hello = w.sock.recv(64)
        except OSError:
            hello = b""
        if hello != b"ready":
            self._mark_dead(w)    # died while starting: its pidfd says so too
            return
        w.ready = True
        self.ready_workers += 1
        self._idle.put(w)
        if self.ready_workers == self.size:
            log.info("%d conversion workers ready (pids %s)", self.size,
                     " ".join(str(p) for p in self.pids()))

    def _wake(self) -> None:
        try:
            os.write(self._wake_w, b"x")
        except OSError:
            pass

    def _spawn(self, index: int) -> _Worker:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            in_offset = index * IN_SLOT_BYTES
            proc = subprocess.Popen(
                [sys.executable, "-m", "tensorfs.workers", str(os.getpid()),
                 str(theirs.fileno()), str(self._arena_fd), str(self.arena_bytes),
                 str(in_offset)],
                pass_fds=(theirs.fileno(), self._arena_fd), stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL)
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        ours.settimeout(TASK_TIMEOUT_S)
        try:
            pidfd = os.pidfd_open(proc.pid)
        except OSError:               # cannot be watched: not kept either
            ours.close()
            proc.kill()
            proc.wait()
            raise
        log.debug("conversion worker %d started: pid %d", index, proc.pid)
        return _Worker(index, proc, ours, pidfd)

    # -- output slots ---------------------------------------------------------------------
    def take_slot(self) -> int | None:
        with self._slots_lock:
            return self._free.pop() if self._free else None

    def give_slot(self, slot: int) -> None:
        with self._slots_lock:
            if slot not in self._poisoned:
                self._free.append(slot)

    def slot_view(self, slot: int, nbytes: int) -> memoryview:
        start = self._in_bytes + slot * CHUNK_OUTPUT_BYTES
        return memoryview(self.arena)[start:start + nbytes]

    # -- one conversion -------------------------------------------------------------------
    def convert(self, conversion, fill_input, in_bytes: int, slot: int, out_bytes: int) -> None:
        """Convert ``in_bytes`` stored bytes into output ``slot``: ``fill_input(buf)`` writes
        the stored bytes into the worker's input slot (here, in the calling thread), the
        worker converts.  Raises what ``fill_input`` raises, or ``WorkerError``."""
        if in_bytes > IN_SLOT_BYTES or out_bytes > CHUNK_OUTPUT_BYTES:
            raise ValueError("a chunk larger than an arena slot")
        self.want()
        w = self._checkout()
        lost = False
        try:
            in_offset = w.index * IN_SLOT_BYTES
            fill_input(memoryview(self.arena)[in_offset:in_offset + in_bytes])
            spec = self._specs.get(conversion.spec)
            if spec is None:
                spec = self._specs[conversion.spec] = json.dumps(conversion.spec).encode()
            task = _TASK.pack(in_offset, in_bytes, self._in_bytes + slot * CHUNK_OUTPUT_BYTES,
                              out_bytes) + spec
            try:
                w.sock.send(task)
                answer = w.sock.recv(4096)
            except socket.timeout:
                lost = True
                w.proc.kill()
                try:                   # the slot is free again only once nobody can write it
                    w.proc.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    with self._slots_lock:
                        self._poisoned.add(slot)
                raise WorkerError(f"conversion worker {w.index} (pid {w.proc.pid}) did not "
                                  f"answer in {TASK_TIMEOUT_S:g} s: killed, another starts") from None
            except OSError as error:
                lost = True
                raise WorkerError(f"conversion worker {w.index} (pid {w.proc.pid}) is gone "
                                  f"({error.strerror or error}): another starts") from None
            if not answer:
                lost = True
                raise WorkerError(f"conversion worker {w.index} (pid {w.proc.pid}) died during "
                                  "a conversion: another starts")
            if answer != b"ok":
                raise WorkerError(f"conversion worker {w.index}: {answer.decode(errors='replace')}")
        finally:
            if lost:
                self._mark_dead(w)
                self._wake()
            else:
                self._idle.put(w)

    def _checkout(self) -> _Worker:
        deadline = time.monotonic() + TASK_TIMEOUT_S
        while not self._closed:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            try:
                w = self._idle.get(timeout=remaining)
            except queue.Empty:
                break
            if w.dead or w.proc.poll() is not None:    # died while idle: the keeper replaces it
                self._mark_dead(w)
                self._wake()
                continue
            return w
        raise WorkerError(f"no conversion worker was free in {TASK_TIMEOUT_S:g} s"
                          if not self._closed else "the conversion workers are stopped")

    # -- read-ahead -----------------------------------------------------------------------
    def executor(self) -> ThreadPoolExecutor:
        """Threads that wait for read-ahead conversions (they wait; the workers convert)."""
        with self._executor_lock:
            if self._executor is None:
                self._executor = ThreadPoolExecutor(max_workers=self.read_ahead_chunks,
                                                    thread_name_prefix="readahead")
            return self._executor


# -- the worker process ----------------------------------------------------------------------

def _die_with_parent(parent: int) -> None:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        pass                      # the socket's end of file still ends this process
    if os.getppid() != parent:    # the daemon died before prctl: nobody to work for
        os._exit(0)


def worker_main(argv: list[str]) -> int:
    parent, sock_fd, arena_fd, arena_bytes, in_offset = map(int, argv)
    _die_with_parent(parent)
    signal.signal(signal.SIGINT, signal.SIG_IGN)     # Ctrl-C is for the daemon, which stops us
    sock = socket.socket(fileno=sock_fd)
    arena = mmap.mmap(arena_fd, arena_bytes, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
    os.close(arena_fd)

    import numpy as np

    from tensorfs.convert import conversion_from_spec

    conversions: dict[bytes, object] = {}
    sock.send(b"ready")
    while True:
        try:
            task = sock.recv(4096)
        except OSError:
            return 0
        if not task:
            return 0              # the daemon closed our socket, or died
        try:
            in_off, in_bytes, out_off, out_bytes = _TASK.unpack_from(task)
            spec = task[_TASK.size:]
            conversion = conversions.get(spec)
            if conversion is None:
                conversion = conversions[spec] = conversion_from_spec(json.loads(spec))
            if in_off + in_bytes > arena_bytes or out_off + out_bytes > arena_bytes:
                raise ValueError("task outside the arena")
            raw = np.frombuffer(arena, dtype=np.uint8, count=in_bytes, offset=in_off)
            out = np.frombuffer(arena, dtype=np.float32, count=out_bytes // 4, offset=out_off)
            conversion.convert(raw, out=out)
            del raw, out
            answer = b"ok"
        except Exception as error:
            answer = f"{type(error).__name__}: {error}".encode()[:4000]
        try:
            sock.send(answer)
        except OSError:
            return 0


if __name__ == "__main__":
    sys.exit(worker_main(sys.argv[1:]))
