"""Conversion worker processes: costly conversions (block quants, gguf-py's long tail) on
every core, not on one core at a time behind the GIL (docs/internals/workers.md).

The pool owns its chunk slots.  A caller asks ``pool.convert(conversion, fill_input,
in_bytes, out_bytes)`` and gets back a finished ``PoolChunk`` (its float32 values in an
output slot of the arena), or ``None``: no worker is ready yet, or every slot is held, and
the caller converts in its own thread.  The slot is the pool's again once nobody holds the
chunk.  Callers never see a slot number; the pool knows nothing of what a chunk is for (a
view's cache, a hash, a statistic).

The caller and its workers share one memory arena (a ``memfd``, mapped by both):

* one *input slot* per worker, where the caller's ``fill_input`` reads the stored bytes of
  the blocks to convert (``source.read_into``: one ``pread`` for a local file, the GIL
  released; the checks that turn a truncated or rewritten model into EIO stay in the caller,
  and any source works, local or not);
* *output slots* of ``slot_bytes`` each, where a worker writes the float32 values.

No chunk data crosses a pipe: a task is a few numbers (which slots, how many bytes, which
conversion) on a socket, and the answer is ``ok`` or one line saying what failed.

Where a pool pays (``paying_size``): workers cost each read a hand-over (two cross-CPU
wake-ups) and cost the machine an interpreter's start (~0.1 s of CPU each, more when
loaded), so they pay only where cores are idle beyond what the caller and its readers use,
and for work larger than their start.  On a 2-CPU machine that is never: there the default
is no pool (docs/internals/benchmarks.md, "Worker pool").

Workers are started with ``spawn`` semantics (a fresh ``python -m tensorfs.convert.workers``, through
``subprocess``: fork + exec at once), so the pool may start one at any time, also once
libfuse's threads exist: a worker that dies is replaced the same way the first ones were
started.  They start ahead (``start(ahead=True)``, or ``start_ahead()``) or when the first
conversion large enough asks for them; until one is ready, ``convert`` returns ``None`` at
once: no caller waits for a start.  A worker never outlives its pool's process: the kernel
kills it when the thread that started it ends (``PR_SET_PDEATHSIG``), it exits when its
socket reaches end of file, and it checks at start that its parent is still the process
that started it.

Faults: a worker that dies (or stops answering for ``TASK_TIMEOUT_S``) fails the conversion
it was doing with ``WorkerError`` (EIO) and is replaced; nothing waits forever.
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
from typing import Any

log = logging.getLogger("tensorfs")

# A converted chunk's float32 bytes, unless the caller says otherwise (a view's chunk).
SLOT_BYTES = 1 << 20
# A conversion of one chunk takes milliseconds; this long without an answer means the
# worker is stuck (or stopped): it is killed and replaced, and the read fails with EIO.
TASK_TIMEOUT_S = float(os.environ.get("TENSORFS_WORKER_TIMEOUT_S", "30"))  # tests shorten it
# Output slots beyond what the caller may hold: chunks being converted or copied into a
# reply at the moment their cache drops them.  Past that, ``convert`` returns None.
SPARE_SLOTS = 32
STOP_WAIT_S = 2.0                     # what closing a pool waits for its workers to exit
RESPAWN_PAUSE_S = 1.0                 # between two starts of the same worker slot
# A start that fails (fork refused: RLIMIT_NPROC, memory), or a worker that dies before it is
# ready, makes the pool wait before the next start: RESPAWN_PAUSE_S, doubled at each failure
# in a row, at most MAX_BACKOFF_S.  After GIVE_UP_FAILURES in a row it stops trying: the
# workers it has keep working, the conversions beyond them run in the daemon's threads.
MAX_BACKOFF_S = 30.0
GIVE_UP_FAILURES = 5
# The most workers a pool may have per CPU this process may use: more only take memory
# (an interpreter with numpy each) and time slices from each other (``max_workers``).
MAX_WORKERS_PER_CPU = 4
# Work (float32 output bytes) below which starting workers costs more than they give: a
# worker's start is ~0.1 s of CPU (an interpreter, numpy), what one core converts of the
# costliest types' output in about that time, several times over for the cheap ones.
START_WORK_BYTES = 128 << 20
# Fewer workers than this do not pay: one worker beside in-thread conversion was a draw at
# best (docs/internals/benchmarks.md, "Issue 16", --workers 1).
LEAST_WORKERS = 2
# CPUs a mount keeps busy without workers: the daemon's thread replying, and the reader's own
# copy out of the page cache.
MOUNT_RESERVED_CPUS = 2

_TASK = struct.Struct("<QQQQ")        # input offset, input bytes, output offset, output bytes
_PR_SET_PDEATHSIG = 1


class WorkerError(OSError):
    """A conversion worker died, stopped answering, or failed: the read gets EIO."""

    def __init__(self, message: str):
        super().__init__(errno.EIO, message)


def usable_cpus() -> int:
    """CPUs this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def max_workers(cpus: int | None = None) -> int:
    """The most conversion workers a pool may have here: ``MAX_WORKERS_PER_CPU`` per usable
    CPU (``--workers`` above it is refused)."""
    return MAX_WORKERS_PER_CPU * (usable_cpus() if cpus is None else cpus)


def paying_size(reserved: int = MOUNT_RESERVED_CPUS, cpus: int | None = None,
                load: float | None = None) -> int:
    """How many workers pay on this machine now: the CPUs this process may use, less the
    ones busy already (the 1-minute load average) and the ``reserved`` ones its own work
    keeps busy without workers; 0 below ``LEAST_WORKERS``."""
    cpus = usable_cpus() if cpus is None else cpus
    if load is None:
        try:
            load = os.getloadavg()[0]
        except OSError:
            load = float(cpus)        # cannot tell: assume busy
    idle = min(cpus, int(cpus - load + 0.5))
    n = idle - reserved
    return n if n >= LEAST_WORKERS else 0


def start_ahead(size: int | None = None, slot_bytes: int = SLOT_BYTES,
                held_bytes: int = 0, reserved: int = 1) -> "WorkerPool | None":
    """A pool started now, its workers starting in the background, for work known to come
    (``tensorfs hash``/``stats``/``diff`` of a model with costly types): ``size`` workers, or
    as many as pay (``paying_size(reserved)``: the caller's own thread takes one CPU); None
    where none pay.  Until a worker is ready, ``convert`` returns None (convert in-thread);
    ``close()`` it when done.  ``held_bytes``: converted chunks the caller keeps at once."""
    n = paying_size(reserved) if size is None else size
    if n <= 0:
        return None
    pool = WorkerPool(n, slot_bytes=slot_bytes, held_bytes=held_bytes)
    pool.start(ahead=True)
    return pool


class _Worker:
    __slots__ = ("index", "proc", "sock", "pidfd", "dead", "ready", "started")

    def __init__(self, index: int, proc: subprocess.Popen, sock: socket.socket, pidfd: int):
        self.index = index
        self.proc = proc
        self.sock = sock
        self.pidfd = pidfd
        self.dead = False
        self.ready = False      # said so once its imports were done
        self.started = time.monotonic()


class WorkerPool:
    """``size`` conversion workers and the arena they share with this process.

    ``held_bytes``: converted chunks the caller may hold at once (a mount: its caches' byte
    budgets); the arena has that many output slots of ``slot_bytes``, plus spares.  Pages of
    the arena are only backed once touched, and free slots are reused last-freed first, so
    the memory used is that of the most chunks held at once.  ``start_work``: the least
    work (float32 bytes) that starts the workers when they were not started ahead.
    """

    def __init__(self, size: int, slot_bytes: int = SLOT_BYTES, held_bytes: int = 0,
                 start_work: int = 0):
        self.size = max(0, size)
        self.slot_bytes = slot_bytes
        # Stored bytes of one chunk: every costly type stores at most 292 bytes per 256
        # elements (Q8_K), i.e. under 0.3 bytes per float32 output byte; a half leaves room.
        self.in_slot_bytes = slot_bytes // 2
        self.out_slots = held_bytes // slot_bytes + SPARE_SLOTS
        self.start_work = start_work
        self.running = False
        # Workers that finished starting (imported numpy and the kernels) and are not known
        # dead.  Until one is, ``convert`` returns None: the caller converts in its own
        # thread, and a fresh mount's first reads do not wait for interpreters to start.
        self.ready_workers = 0
        self._closed = False
        self._workers: list[_Worker | None] = []
        self._idle: queue.Queue[_Worker] = queue.Queue()
        self._slots_lock = threading.Lock()
        self._free: list[int] = []
        self._held: set[int] = set()            # slots handed out in a PoolChunk
        self._specs: dict[tuple, bytes] = {}    # Conversion.spec -> its bytes in a task
        self._poisoned: set[int] = set()      # slots a worker that would not die may write
        self._stop_lock = threading.Lock()
        self._ready_cond = threading.Condition(self._stop_lock)
        self._keeper: threading.Thread | None = None
        self.arena: mmap.mmap | None = None
        self._arena_fd = -1
        self._wake_r = self._wake_w = -1
        self._wanted = threading.Event()
        self._failures = 0            # failed starts (or deaths before ready) in a row
        self._failed_at = 0.0         # the last one (monotonic)
        self._next_start = 0.0        # no start before this: the back-off

    # -- life -----------------------------------------------------------------------------
    def start(self, ahead: bool = False) -> None:
        """Map the arena and start the keeper thread, which starts the workers now
        (``ahead``) or when a conversion of at least ``start_work`` bytes asks for them: a
        mount that is never read that way (most are only listed, or hold no quantized
        tensor) starts no interpreter."""
        if self.size == 0 or self.running:
            return
        self._in_bytes = self.size * self.in_slot_bytes
        total = self._in_bytes + self.out_slots * self.slot_bytes
        self._arena_fd = os.memfd_create("tensorfs-arena", os.MFD_CLOEXEC)
        os.ftruncate(self._arena_fd, total)
        self.arena = mmap.mmap(self._arena_fd, total, mmap.MAP_SHARED,
                               mmap.PROT_READ | mmap.PROT_WRITE)
        self.arena_bytes = total
        self._free = list(range(self.out_slots - 1, -1, -1))
        self._workers = [None] * self.size
        self._wake_r, self._wake_w = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
        self.running = True
        if ahead:
            self._wanted.set()
        # Workers are started, watched and replaced by this one thread: PR_SET_PDEATHSIG
        # fires when the *thread* that started a child ends, so it must be one that lives
        # as long as the pool (libfuse's threads come and go).
        self._keeper = threading.Thread(target=self._keep, name="tensorfs-workers", daemon=True)
        self._keeper.start()

    def want(self) -> None:
        """Start the workers if they are not started (until they are ready, ``convert``
        returns None)."""
        if not self._wanted.is_set():
            self._wanted.set()

    @property
    def started(self) -> bool:
        """Whether the workers were asked to start (ahead, or by a conversion)."""
        return self._wanted.is_set() and not self._closed

    def wait_ready(self, timeout: float) -> bool:
        """Wait until every worker is ready (or ``timeout``); whether they are."""
        with self._ready_cond:
            return self._ready_cond.wait_for(
                lambda: self._closed or self.ready_workers == self.size, timeout) \
                and not self._closed

    def close(self) -> None:
        """Stop the workers, all at once: end of file on every socket, then at most
        ``STOP_WAIT_S`` for all of them together before the rest are killed (a worker still
        importing numpy does not read its socket yet)."""
        with self._stop_lock:
            if not self.running or self._closed:
                return
            self._closed = True
        self._wanted.set()
        self._wake()
        if self._keeper is not None and self._keeper is not threading.current_thread():
            self._keeper.join(timeout=5)
        workers = [w for w in self._workers if w is not None]
        for w in workers:
            self._mark_dead(w)
            try:
                w.sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        deadline = time.monotonic() + STOP_WAIT_S
        for w in workers:
            try:
                w.proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        for w in workers:
            self._stop(w)             # kills and reaps what is left
        with self._ready_cond:
            self._ready_cond.notify_all()
        fds = (self._arena_fd, self._wake_r, self._wake_w)
        self._arena_fd = self._wake_r = self._wake_w = -1    # a late _wake writes nowhere
        for fd in fds:
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
            w.proc.wait(timeout=0 if self._closed else 1)
        except subprocess.TimeoutExpired:
            w.proc.kill()
            w.proc.wait()
        w.sock.close()
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
        gave_up = False
        while not self._closed:
            for i, w in enumerate(self._workers):
                if w is not None and not w.dead:
                    continue
                if w is not None:
                    self._stop(w)
                    self._workers[i] = None
                if gave_up or self._closed:
                    continue
                now = time.monotonic()
                if now < self._next_start or now - last_start[i] < RESPAWN_PAUSE_S:
                    continue
                last_start[i] = now
                try:
                    new = self._spawn(i)
                except OSError as error:
                    gave_up = self._start_failed(f"could not start conversion worker {i}: "
                                                 f"{error.strerror or error}")
                    break             # not the next slot at once: it would fail the same way
                self._workers[i] = new
            watched = {w.pidfd: w for w in self._workers if w is not None and not w.dead}
            starting = {w.sock.fileno(): w for w in self._workers
                        if w is not None and not w.dead and not w.ready}
            pending = not gave_up and any(w is None for w in self._workers)
            wait = max(RESPAWN_PAUSE_S, self._next_start - time.monotonic()) if pending else None
            try:
                ready, _, _ = select.select([self._wake_r, *watched, *starting], [], [], wait)
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
                    said = (f"conversion worker {w.index} (pid {w.proc.pid}) died (exit "
                            f"status {w.proc.returncode})")
                    if w.ready:
                        log.error("%s; starting another", said)
                    else:                 # died starting: that counts as a failed start
                        gave_up = self._start_failed(said + " while starting") or gave_up
                self._mark_dead(w)

    def _start_failed(self, said: str) -> bool:
        """One more failed start in a row: the next one waits twice as long as the last
        (one log line when it starts failing, one when it gives up).  True: give up."""
        self._failures += 1
        self._failed_at = time.monotonic()
        pause = min(MAX_BACKOFF_S, RESPAWN_PAUSE_S * 2 ** (self._failures - 1))
        self._next_start = time.monotonic() + pause
        alive = sum(1 for w in self._workers if w is not None and not w.dead)
        if self._failures > GIVE_UP_FAILURES:       # given up already: said once
            log.debug("%s", said)
            return True
        if self._failures == GIVE_UP_FAILURES:
            log.error("%s; gave up starting conversion workers after %d failures in a row: "
                      "%d of %d running, conversions beyond them run in the daemon's threads",
                      said, self._failures, alive, self.size)
            return True
        if self._failures == 1:
            log.error("%s; trying again in %g s, then less and less often", said, pause)
        else:
            log.debug("%s; trying again in %g s", said, pause)
        return False

    def _hello(self, w: _Worker) -> None:
        """A starting worker's first message: its imports are done, it takes tasks now."""
        try:
            hello = w.sock.recv(64)
        except OSError:
            hello = b""
        if hello != b"ready":
            self._mark_dead(w)    # died while starting: its pidfd says so too
            return
        with self._ready_cond:
            w.ready = True
            self.ready_workers += 1
            self._ready_cond.notify_all()
        if w.started > self._failed_at:
            self._failures = 0        # starting works again (not a start from before)
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
            in_offset = index * self.in_slot_bytes
            proc = subprocess.Popen(
                [sys.executable, "-m", "tensorfs.convert.workers", str(os.getpid()),
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

    # -- output slots: taken by ``convert``, given back by the PoolChunk it returns ---------
    def _take_slot(self) -> int | None:
        with self._slots_lock:
            if not self._free:
                return None
            slot = self._free.pop()
            self._held.add(slot)
            return slot

    def _give_slot(self, slot: int) -> None:
        with self._slots_lock:
            if slot not in self._held:
                raise RuntimeError(f"output slot {slot} given back twice")
            self._held.remove(slot)
            if slot not in self._poisoned:
                self._free.append(slot)

    def _slot_view(self, slot: int, nbytes: int) -> memoryview:
        start = self._in_bytes + slot * self.slot_bytes
        return memoryview(self.arena)[start:start + nbytes]

    def slots(self) -> tuple[int, int]:
        """(free, held) output slots."""
        with self._slots_lock:
            return len(self._free), len(self._held)

    # -- one conversion -------------------------------------------------------------------
    def convert(self, conversion, fill_input, in_bytes: int, out_bytes: int,
                work: int = 0) -> "PoolChunk | None":
        """``in_bytes`` stored bytes converted by a worker into a ``PoolChunk`` of
        ``out_bytes``: ``fill_input(buf)`` writes the stored bytes into the worker's input
        slot (here, in the calling thread).  None, at once, when no worker is ready yet (the
        workers are then started if ``work`` — the float32 bytes the caller has to convert
        — is at least ``start_work``) or every output slot is held: convert in-thread.
        Raises what ``fill_input`` raises, or ``WorkerError``."""
        if in_bytes > self.in_slot_bytes or out_bytes > self.slot_bytes:
            raise ValueError("a chunk larger than an arena slot")
        if not self.running or self._closed:
            return None
        if self.ready_workers == 0:
            if work >= self.start_work:
                self.want()
            return None
        slot = self._take_slot()
        if slot is None:
            return None
        chunk = PoolChunk(self, slot, out_bytes)
        try:
            self._convert_into(conversion, fill_input, in_bytes, slot, out_bytes)
        except BaseException:
            chunk.release()
            raise
        return chunk

    def _convert_into(self, conversion, fill_input, in_bytes: int, slot: int,
                      out_bytes: int) -> None:
        w = self._checkout()
        lost = False
        try:
            in_offset = w.index * self.in_slot_bytes
            fill_input(memoryview(self.arena)[in_offset:in_offset + in_bytes])
            spec = self._specs.get(conversion.spec)
            if spec is None:
                spec = self._specs[conversion.spec] = json.dumps(conversion.spec).encode()
            task = _TASK.pack(in_offset, in_bytes, self._in_bytes + slot * self.slot_bytes,
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



class PoolChunk:
    """A converted chunk in an output slot of a pool's arena: a worker wrote it, the caller
    reads ``data``; the slot is the pool's again once nobody holds the chunk (or at
    ``release()``, for a caller that knows it is done).  ``len`` is its size in bytes (what
    a cache counts)."""

    __slots__ = ("_pool", "_slot", "n", "data")

    def __init__(self, pool: WorkerPool, slot: int, n: int):
        self._pool = pool
        self._slot = slot
        self.n = n
        self.data = pool._slot_view(slot, n)

    def __len__(self) -> int:
        return self.n

    def release(self) -> None:
        if self._slot is not None:
            slot, self._slot = self._slot, None
            self._pool._give_slot(slot)
            try:
                self.data.release()
            except BufferError:         # a slice of it still held: goes with it
                pass

    def __del__(self):
        try:
            self.release()
        except Exception:       # interpreter shutdown
            pass


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

    # in the worker, after its sockets and arena are set: a failed start says so before
    # the imports' cost
    from tensorfs.convert import conversion_from_spec
    from tensorfs.convert.blocks import convert_blocks
    from tensorfs.runtime.libraries import np

    conversions: dict[bytes, Any] = {}      # tensorfs.convert.Conversion
    try:
        sock.send(b"ready")
    except OSError:
        return 0                  # the pool closed while we started (started ahead, not used)
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
            convert_blocks(conversion, raw, out)
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
