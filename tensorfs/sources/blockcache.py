"""The block cache of a remote file: ranged requests shaped by how tensors are read.

A remote file is read in fixed blocks of ``BLOCK_SIZE`` bytes, aligned in the file.  What a
block cache for tensors adds to a plain LRU of blocks:

- **one request per block**: a block being fetched is *pending*; every other read that needs
  it waits for that request instead of making its own;
- **merged requests**: the missing blocks one read needs (a big read, or a whole small
  tensor) that are adjacent go in one request, up to ``MAX_REQUEST`` bytes;
- **a small tensor whole**: a read inside a tensor of at most ``SMALL_TENSOR`` bytes fetches
  every block of that tensor, in one request, the first time (an ``.npy`` reader then finds
  the rest there);
- **exact ranges for a random reader**: a read smaller than a block that does not continue
  a run of more than ``EXACT_RUN`` bytes in sequence fetches just the stretches of it that
  nothing holds, as *pieces* (kept in the LRU like blocks, and indexed by their start): a
  random reader (an mmap'd model's scattered page faults, a 1 MiB read here and there) is
  sent what it asks for, not 4 MiB per read, and no byte is fetched twice;
- **growing read-ahead**: a reader whose reads follow each other (its next read starts where
  its last one ended) is a sequential reader once it has read ``EXACT_RUN`` bytes in a row
  and reads on:
  from then on it reads whole blocks and gets the blocks after it fetched ahead,
  1, 2, 4 ... ``MAX_AHEAD`` blocks, one request per block so that several are in flight at
  once (what a long round trip needs: docs/reference/remote.md);
- **reads that wait without a thread** (``read_or_wait``): a read whose bytes are on their
  way gets a ``Future``, done once they are here and copied; cancelling it (its reader is
  gone) drops the fetches no other read waits for, queued or in flight (``Cancel``);
- blocks kept in memory in the mount's one LRU (``--cache-size``), and with a
  ``tensorfs.sources.diskcache.DiskCache`` on disk too, keyed by the file's endpoint, path, version
  and block size.

The fetch function (``tensorfs.sources.remote.RemoteSource``) does the retries, the timeout and the
version check; this module only decides which ranges to ask for and who waits for what.
It owns the blocks: each is what the fetch function returned (``bytes``, or the transport
library's own buffer), kept as it is and lent out as views, never copied again; the blocks
of a merged request are views of its one answer.
"""

from __future__ import annotations

import bisect
import functools
import logging
import os
import threading
import time
from collections import OrderedDict, deque
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Callable

from tensorfs.sources.diskcache import DiskCache
from tensorfs.sources.transports.base import Cancel, FetchError
from tensorfs.waits import Timers

# 4 MiB: against nginx on loopback 1, 2, 4 and 8 MiB blocks read a 256 MiB tensor within a
# few percent of each other once read-ahead runs, and a random 4 KiB read costs the block's
# transfer (docs/reference/remote.md, "block size").
BLOCK_SIZE = 4 << 20
MAX_REQUEST = 16 << 20          # bytes in one merged request
SMALL_TENSOR = 16 << 20         # a tensor at most this big is fetched whole at first read
MAX_AHEAD = 16                  # blocks of read-ahead, at most
# A reader is sequential once it has read more than this in a row; until then its reads
# smaller than a block fetch just their bytes.  1 MiB: the kernel's largest read-ahead on a
# mount (a random 1 MiB read arrives as one run of FUSE reads of up to that size) - so a
# random reader's run never turns sequential.  A sequential one gets read-ahead from then on
# and whole blocks from the first block after those it read in pieces: no byte twice.
EXACT_RUN = 1 << 20
MAX_PIECES = 4096               # pieces indexed per file before those let go are forgotten
STREAMS = 16                    # sequential readers told apart per file
# Requests in flight per mount: 16 blocks of 4 MiB keep a 20 ms round trip busy at ~3 GB/s
# (docs/internals/benchmarks.md "Wire speed": 4/8/16/32 in flight measured alike at 0 ms, 16 hides a
# 20 ms RTT), and four readers of four tensors share them (R5).
IN_FLIGHT = 16

log = logging.getLogger("tensorfs")


class Fetcher:
    """The fetch threads of one mount: at most ``in_flight`` requests at once.  Jobs a reader
    waits for (``urgent``) go first; read-ahead is taken from each ``key`` (a tensor being
    read) in turn, so that one reader's long window does not starve the others.  The threads
    are made in the process that uses them (the daemon forks after the mount's headers are
    read: threads do not survive a fork) and are daemon threads: a request that hangs never
    holds up the process's exit."""

    def __init__(self, in_flight: int = IN_FLIGHT):
        self.in_flight = in_flight
        self._cond = threading.Condition()
        self._urgent: deque = deque()
        self._ahead: OrderedDict = OrderedDict()       # key -> deque of jobs
        self._pid = 0
        self._threads = 0

    def submit(self, job: Callable[[], None], urgent: bool, key=None) -> None:
        with self._cond:
            if self._pid != os.getpid():
                self._pid, self._threads = os.getpid(), 0
            if urgent:
                self._urgent.append(job)
            else:
                self._ahead.setdefault(key, deque()).append(job)
            if self._threads < self.in_flight:
                self._threads += 1
                threading.Thread(target=self._work, name="tensorfs-fetch", daemon=True).start()
            self._cond.notify()

    def _next(self) -> Callable[[], None]:
        with self._cond:
            while not self._urgent and not self._ahead:
                self._cond.wait()
            if self._urgent:
                return self._urgent.popleft()
            key, jobs = next(iter(self._ahead.items()))
            job = jobs.popleft()
            del self._ahead[key]
            if jobs:
                self._ahead[key] = jobs         # to the back: the next key's turn
            return job

    def _work(self) -> None:
        while True:
            job = self._next()
            try:
                job()
            except BaseException:           # any exception: a job reports to its own futures
                log.exception("a fetch failed unexpectedly")


_default_fetcher = Fetcher()

# glibc's mallopt parameters
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD, _M_ARENA_MAX = -1, -3, -8
_allocator_tuned = False


def reuse_freed_blocks() -> None:
    """In the serving process: let a freed block's memory serve the next one.  By default
    glibc gives each 4 MiB answer fresh pages (mmap past its threshold, an arena per thread,
    the top of a heap trimmed at once), and the kernel zeroes and maps every page of every
    block: a third of the daemon's CPU.  One arena, blocks from the heap (up to 32 MiB, the
    most glibc allows) and freed memory kept up to the read-ahead's size halve the page faults
    of a 1 GiB read through the default 256 MiB cache (docs/internals/benchmarks.md, "Wire speed").
    Elsewhere (another C library) nothing changes."""
    global _allocator_tuned
    if _allocator_tuned:
        return
    _allocator_tuned = True
    import ctypes  # the serving process only (glibc's mallopt)

    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return
    for option, value in ((_M_ARENA_MAX, 1), (_M_MMAP_THRESHOLD, 32 << 20),
                          (_M_TRIM_THRESHOLD, IN_FLIGHT * BLOCK_SIZE)):
        mallopt(option, value)


class BlockReader:
    """The blocks of one remote file.  ``fetch(start, end, deadline, cancel) -> bytes`` gets
    ``[start, end)`` (exactly) or raises; ``cancel`` (a ``Cancel``, or None) ends it where
    no read waits for it any more."""

    def __init__(self, key: tuple, size: int,
                 fetch: Callable[[int, int, float, Cancel | None], bytes],
                 memory, disk: "DiskCache | None" = None, disk_key: str | None = None,
                 block_size: int = BLOCK_SIZE, fetcher: Fetcher | None = None):
        self.key = key
        self.fetcher = fetcher or _default_fetcher
        self.size = size
        self.fetch = fetch
        self.memory = memory            # tensorfs.cache.ByteLRU: lookup / put
        self.disk = disk if disk_key else None
        self.disk_key = disk_key
        self.block = block_size
        self.n_blocks = (size + block_size - 1) // block_size
        self._lock = threading.Lock()
        self._pending: dict[int, Future] = {}
        self._streams: OrderedDict[int, int] = OrderedDict()    # where a read ended -> window
        self._starts: list[int] = []    # tensor extents, sorted by start
        self._ends: list[int] = []
        # Set for a mount (RemoteSource.start): what FUSE served is in the kernel's page cache,
        # so a block whose every byte was served is let go at once (see _served).
        self.page_cached = False
        self._served: dict[int, int] = {}   # block -> bytes of it served, while page_cached
        self._pieces: dict[int, tuple[int, Future | None]] = {}     # exact ranges (below)
        self._piece_starts: list[int] = []
        # Reads in exact ranges: never with a disk cache, whose unit is the block (what is
        # fetched is kept for the next mount, and a block is what the disk holds).
        self.exact_reads = disk is None or not disk_key
        # each pending block's or piece's Future -> (the Cancel of the fetch that brings it,
        # its block index or ("piece", start)); and how many reads wait for it
        self._fetches: dict[Future, tuple[Cancel, int | tuple[str, int]]] = {}
        self._waiters: dict[Future, int] = {}
        self.requests = 0               # how many fetches were made (tests, bench)
        self.fetched_bytes = 0
        self.closed = False

    def set_extents(self, extents: list[tuple[int, int]]) -> None:
        """(offset, nbytes) of the file's tensors: a small one is fetched whole."""
        extents = sorted(e for e in extents if e[1] > 0)
        self._starts = [o for o, _ in extents]
        self._ends = [o + n for o, n in extents]

    # -- reading ---------------------------------------------------------------------------
    def read_into(self, offset: int, buf, deadline: float, span: tuple[int, int] | None = None) -> int:
        """``span``: the extent of the file being read, that read-ahead may run to (a whole
        file of files/: all of it); by default the tensor the read falls in."""
        if len(buf) <= 0:
            return 0
        return self._copy_and_release(self._plan(offset, len(buf), deadline, span), offset,
                                      buf, deadline)

    def read_or_wait(self, offset: int, buf, deadline: float,
                     span: tuple[int, int] | None = None,
                     failed: Callable[[BaseException], BaseException] | None = None):
        """``read_into`` where every byte is here; else a ``Future`` of the count, done
        once the bytes came and were copied into ``buf`` (by the thread that brought the
        last of them), failed with ``failed(error)`` (a fetch failed, or ``deadline``
        passed: TimeoutError).  Cancelling it drops the fetches no other read waits for."""
        if len(buf) <= 0:
            return 0
        parts = self._plan(offset, len(buf), deadline, span)
        futures = _futures(parts)
        if all(future.done() for future in futures):
            return self._copy_and_release(parts, offset, buf, deadline)
        return _Waiting(self, parts, offset, buf, deadline, futures, failed,
                        (offset + len(buf) - 1) // self.block).future

    def _plan(self, offset: int, size: int, deadline: float, span) -> list[list]:
        """The parts of ``[offset, offset + size)``: ``[start, stop, bytes or Future, block
        index or None]`` in order, the fetches of the missing ones started, every Future
        counted as waited for (``_release`` once done with them)."""
        first, last = offset // self.block, (offset + size - 1) // self.block
        # before waiting: all in flight at once
        exact = self._read_ahead(offset, offset + size, first, last, span)
        lo, hi = self._small_tensor(offset, first, last, span)
        if self.exact_reads:
            if exact and size < self.block and (lo, hi) == (first, last):
                return self._exact_parts(offset, size, deadline)
            with self._lock:
                held = self._has_pieces(lo, hi)
            if held:                    # blocks partly held as pieces: the rest as pieces
                return self._exact_parts(offset, size, deadline)
        blocks = self._blocks(lo, hi, deadline, needed=(first, last))
        return [[index * self.block, index * self.block + self._block_len(index), blocks[index],
                 index] for index in range(first, last + 1)]

    def _copy_and_release(self, parts: list[list], offset: int, buf, deadline: float) -> int:
        """``_copy``, then the parts let go of (``_release``)."""
        try:
            return self._copy(parts, offset, buf, deadline)
        finally:
            self._release(_futures(parts), cancel=False)

    def _copy(self, parts: list[list], offset: int, buf, deadline: float) -> int:
        """Copy the parts into ``buf`` (waiting for those on their way)."""
        end = offset + len(buf)
        out = memoryview(buf)
        pos = offset
        done = []
        for start, stop, data, index in parts:
            if isinstance(data, Future):
                data = self._wait(data, deadline)
            n = min(stop, end) - pos
            with memoryview(data) as view:
                out[pos - offset:pos - offset + n] = view[pos - start:pos - start + n]
            pos += n
            if index is not None and self.page_cached and self._served_all(index, n):
                done.append(index)
        del parts, data
        for index in done:
            self._let_go(index)
        return pos - offset

    def _exact_parts(self, offset: int, size: int, deadline: float) -> list[list]:
        """A random reader's read: blocks and pieces already here (or on their way) serve
        it, and each stretch of it that nothing holds is fetched as it is, one request per
        stretch: a piece, kept in the memory cache (unless the kernel's page cache keeps
        what FUSE served) so that no byte is fetched twice."""
        end = offset + size
        parts: list[list] = []      # [start, stop, bytes or Future or None (a gap), block index]
        with self._lock:
            pos = offset
            while pos < end:
                index = pos // self.block
                data = self.memory.lookup((self.key, index))
                if data is None:
                    data = self._pending.get(index)
                if data is not None:
                    start = index * self.block
                    parts.append([start, start + self._block_len(index), data, index])
                    pos = start + self._block_len(index)
                    continue
                piece = self._piece_at(pos)
                if piece is not None:
                    parts.append([*piece, None])
                    pos = piece[1]
                    continue
                stop = min(end, (index + 1) * self.block, self._next_piece(pos))
                if parts and parts[-1][2] is None and parts[-1][1] == pos:
                    parts[-1][1] = stop             # the stretch goes on: one request
                else:
                    parts.append([pos, stop, None, None])
                pos = stop
            todo = []
            for part in parts:
                if part[2] is None:
                    part[2] = Future()
                    bisect.insort(self._piece_starts, part[0])
                    self._pieces[part[0]] = (part[1], part[2])
                    cancel = self._fetching(part[2], ("piece", part[0]))
                    todo.append((part[0], part[1], part[2], cancel))
            self._hold(_futures(parts))
        for start, stop, future, cancel in todo:
            self.fetcher.submit(functools.partial(self._fetch_piece, start, stop, future, deadline,
                                                  cancel), urgent=True)
        return parts

    # -- who waits for what: a fetch no read waits for any more is cancelled -----------------
    def _fetching(self, future: Future, where: int | tuple[str, int],
                  cancel: Cancel | None = None) -> Cancel:
        """Note the fetch that brings ``future`` (lock held): its off switch, made here
        unless a merged request shares one."""
        cancel = cancel or Cancel()
        self._fetches[future] = (cancel, where)
        future.add_done_callback(self._fetched)
        return cancel

    def _fetched(self, future: Future) -> None:
        with self._lock:
            self._fetches.pop(future, None)

    def _hold(self, futures: list[Future]) -> None:
        """One more read waits for each of ``futures`` (lock held)."""
        for future in futures:
            self._waiters[future] = self._waiters.get(future, 0) + 1

    def _release(self, futures: list[Future], cancel: bool, last: int = -1) -> None:
        """A read no longer waits for ``futures``.  ``cancel``: it gave up (its reader is
        gone): a fetch that no read waits for any more is cancelled, queued or in flight,
        and its blocks or pieces forgotten (a later read fetches them again); so is the
        read-ahead after the read's ``last`` block that no read waits for."""
        stopped: dict[int, tuple[Cancel, list[Future]]] = {}
        with self._lock:
            for future in futures:
                left = self._waiters.get(future, 0) - 1
                if left > 0:
                    self._waiters[future] = left
                else:
                    self._waiters.pop(future, None)
            if not cancel:
                return
            ahead = [self._pending.get(index) for index in range(last + 1, last + 1 + MAX_AHEAD)]
            for future in [*futures, *(f for f in ahead if f is not None)]:
                fetch = self._fetches.get(future)
                if fetch is None or future.done() or id(fetch[0]) in stopped \
                        or self._waiters.get(future):
                    continue
                group = [f for f, (c, _) in self._fetches.items() if c is fetch[0]]
                if any(self._waiters.get(f) for f in group):
                    continue                # a merged request another read waits for
                stopped[id(fetch[0])] = (fetch[0], group)
                for f in group:
                    where = self._fetches[f][1]
                    if isinstance(where, int):
                        if self._pending.get(where) is f:
                            del self._pending[where]
                    else:
                        self._forget_piece(where[1], f)
        for switch, group in stopped.values():
            log.debug("%s: a fetch no one waits for any more is cancelled", self.key[0])
            switch.cancel()
            for future in group:
                if not future.done():
                    future.set_exception(FetchError("cancelled", "no one waits for it any more"))

    # the pieces: starts sorted, start -> (stop, the Future while it is fetched, else None)
    def _piece_at(self, pos: int):
        """(start, stop, bytes or Future) of the piece holding byte ``pos``, or None
        (called with the lock held)."""
        i = bisect.bisect_right(self._piece_starts, pos) - 1
        if i < 0:
            return None
        start = self._piece_starts[i]
        stop, future = self._pieces[start]
        if pos >= stop:
            return None
        if future is not None:
            return start, stop, future
        data = self.memory.lookup((self.key, "piece", start))
        if data is None:                        # let go, or pushed out of the cache
            del self._piece_starts[i], self._pieces[start]
            return None
        return start, stop, data

    def _next_piece(self, pos: int) -> int:
        i = bisect.bisect_right(self._piece_starts, pos)
        return self._piece_starts[i] if i < len(self._piece_starts) else self.size

    def _has_pieces(self, lo: int, hi: int) -> bool:
        """Whether a piece holds any byte of blocks lo..hi (lock held): those blocks are
        not fetched whole, their other bytes are fetched as pieces."""
        start, stop = lo * self.block, (hi + 1) * self.block
        return self._piece_at(start) is not None or self._next_piece(start) < min(stop, self.size)

    def keep_piece(self, start: int, data: bytes) -> None:
        """Bytes fetched already (the header the mount parsed), kept as a piece in the memory
        cache: a read of them is not another request."""
        if not self.exact_reads or not data:
            return                      # with a disk cache, blocks are the unit
        self.memory.put((self.key, "piece", start), data)
        with self._lock:
            if start not in self._pieces:
                bisect.insort(self._piece_starts, start)
            self._pieces[start] = (start + len(data), None)

    def _fetch_piece(self, start: int, stop: int, future: Future, deadline: float,
                     cancel: Cancel | None = None) -> None:
        try:
            if self.closed:
                raise OSError("the mount is closing")
            data = self.fetch(start, stop, deadline, cancel)
        except BaseException as error:      # the reader gets it
            with self._lock:
                self._forget_piece(start, future)
            if not future.done():
                future.set_exception(error)
            return
        keep = not self.page_cached         # else the kernel's page cache holds what is served
        if keep:
            self.memory.put((self.key, "piece", start), data)
        with self._lock:
            self.requests += 1
            self.fetched_bytes += len(data)
            if keep and self._pieces.get(start, (0, None))[1] is future:
                self._pieces[start] = (stop, None)
            else:
                self._forget_piece(start, future)
            if len(self._pieces) > MAX_PIECES:
                self._prune_pieces()
        if not future.done():
            future.set_result(data)

    def _forget_piece(self, start: int, future: Future) -> None:
        if self._pieces.get(start, (0, None))[1] is future:
            del self._pieces[start]
            self._piece_starts.remove(start)

    def _prune_pieces(self) -> None:
        """Forget the pieces the memory cache let go (lock held): the index stays bounded."""
        for start in list(self._piece_starts):
            _, future = self._pieces[start]
            if future is None and not self.memory.peek((self.key, "piece", start)):
                del self._pieces[start]
        self._piece_starts = sorted(self._pieces)

    def _served_all(self, index: int, n: int) -> bool:
        """Count ``n`` more bytes of block ``index`` served: True once it is all served."""
        with self._lock:
            served = self._served.get(index, 0) + n
            if served < self._block_len(index):
                self._served[index] = served
                return False
            self._served.pop(index, None)
            return True

    def _let_go(self, index: int) -> None:
        """A block FUSE has served in full leaves the memory cache: the kernel's page cache
        holds its bytes now.  A block read again (the kernel dropped its pages, another
        tensor in the same block) is fetched again, never served wrong; a reader still
        holding it keeps it alive (it is never reused for other bytes)."""
        self.memory.pop((self.key, index))

    def _small_tensor(self, offset: int, first: int, last: int, span=None) -> tuple[int, int]:
        """The blocks to fetch for a read of blocks first..last: all of a small tensor's
        when the read is in one and reads that tensor (its own file, or a file that is
        that one extent); a read through a whole model file (``files/``, an mmap'd GGUF's
        page faults) is not a tensor's reader, and gets what it asks for."""
        i = bisect.bisect_right(self._starts, offset) - 1
        if span is not None and (i < 0 or (self._starts[i], self._ends[i]) != tuple(span)):
            return first, last
        if i >= 0 and offset < self._ends[i] and self._ends[i] - self._starts[i] <= SMALL_TENSOR:
            return (min(first, self._starts[i] // self.block),
                    max(last, (self._ends[i] - 1) // self.block))
        return first, last

    def _blocks(self, lo: int, hi: int, deadline: float, needed: tuple[int, int]) -> dict:
        """Blocks lo..hi, each its bytes or the Future of its fetch (those in ``needed``
        counted as waited for), fetching what is missing."""
        found: dict[int, bytes | Future] = {}
        mine: dict[int, Future] = {}
        first, last = needed
        with self._lock:
            for index in range(lo, hi + 1):
                data = self.memory.lookup((self.key, index))
                if data is not None:
                    found[index] = data
                elif index in self._pending:
                    found[index] = self._pending[index]
                else:
                    found[index] = mine[index] = self._pending[index] = Future()
            self._hold([f for i, f in found.items()
                        if first <= i <= last and isinstance(f, Future)])
        if mine:
            self._fetch_runs(sorted(mine), deadline)
        return found

    @staticmethod
    def _wait(future: Future, deadline: float) -> bytes:
        try:
            return future.result(timeout=max(0.0, deadline - time.monotonic()))
        except FutureTimeout:
            raise TimeoutError("no answer in time") from None

    def _fetch_runs(self, indices: list[int], deadline: float) -> None:
        """Fetch the pending blocks ``indices`` (sorted), adjacent ones in one request, each
        request a job of the mount's fetch threads (the caller waits for the blocks)."""
        runs: list[list[int]] = []
        per_request = max(1, MAX_REQUEST // self.block)
        for index in indices:
            if runs and runs[-1][-1] == index - 1 and len(runs[-1]) < per_request:
                runs[-1].append(index)
            else:
                runs.append([index])
        for run in runs:
            with self._lock:
                cancel = Cancel()
                for index in run:
                    future = self._pending.get(index)
                    if future is not None:      # else let go: the mount is closing
                        self._fetching(future, index, cancel)
            self.fetcher.submit(functools.partial(self._fetch_disk_or_run, run, deadline,
                                                  cancel), urgent=True)

    def _fetch_disk_or_run(self, run: list[int], deadline: float,
                           cancel: Cancel | None = None) -> None:
        if cancel is not None and cancel.cancelled:
            return                      # dropped before it started: no one waits for it
        missing = [index for index in run if not self._from_disk(index)]
        while missing:                  # what the disk lacked, in adjacent runs again
            part = [missing.pop(0)]
            while missing and missing[0] == part[-1] + 1:
                part.append(missing.pop(0))
            self._fetch_run(part, deadline, cancel)

    def _from_disk(self, index: int) -> bool:
        if self.disk is None:
            return False
        data = self.disk.get(self.disk_key, index, self._block_len(index))
        if data is None:
            return False
        self._resolve(index, data, keep_on_disk=False)
        return True

    def _fetch_run(self, run: list[int], deadline: float, cancel: Cancel | None = None) -> None:
        start = run[0] * self.block
        end = min(self.size, (run[-1] + 1) * self.block)
        try:
            if self.closed:
                raise OSError("the mount is closing")
            data = self.fetch(start, end, deadline, cancel)
            with self._lock:
                self.requests += 1
                self.fetched_bytes += len(data)
        except BaseException as error:
            with self._lock:            # this fetch's own (a cancelled one's: forgotten)
                futures = [self._pending.pop(i) for i in run if i in self._pending
                           and self._fetches.get(self._pending[i], (None,))[0] is cancel]
            for future in futures:
                if not future.done():
                    future.set_exception(error)
            return
        if len(run) == 1:               # the answer is the block
            self._resolve(run[0], data, keep_on_disk=True)
            return
        view = memoryview(data)         # each block a view of the one answer: no copy
        for index in run:
            offset = index * self.block - start
            self._resolve(index, view[offset:offset + self._block_len(index)],
                          keep_on_disk=True)

    def _resolve(self, index: int, data: bytes | bytearray | memoryview,
                 keep_on_disk: bool) -> None:
        self.memory.put((self.key, index), data)
        if keep_on_disk and self.disk is not None:
            self.disk.put(self.disk_key, index, data)
        with self._lock:
            future = self._pending.pop(index, None)
        if future is not None and not future.done():
            future.set_result(data)

    def _block_len(self, index: int) -> int:
        return min(self.block, self.size - index * self.block)

    # -- read-ahead ------------------------------------------------------------------------
    def _read_ahead(self, offset: int, end: int, first: int, last: int, span=None) -> bool:
        """A read that starts where an earlier one ends (for a sequential reader, up to a
        block further on: the kernel's read-ahead sends a file's next reads together, and
        FUSE threads take them in any order) continues that reader's stream.  Once the
        stream has read more than ``EXACT_RUN`` bytes in a row, its window doubles and that
        many blocks after it are fetched, never past the end of the tensor being read (each
        file of a mount is one tensor: what lies beyond is another file).  A stream is
        registered when its read starts, not when it ends.  Readers of one block at once are
        not a stream (their reads start before where the others' end).  Returns whether
        the read is to be fetched in exact ranges: a random reader's, or a sequential one's
        still in the blocks it began in exact ranges (a block of those fetched whole would
        fetch their bytes again)."""
        if span is not None:
            limit = (min(span[1], self.size) - 1) // self.block
        else:
            i = bisect.bisect_right(self._starts, end - 1) - 1
            if i < 0 or end > self._ends[i]:
                return True             # not inside a tensor (a header): no read-ahead
            limit = (self._ends[i] - 1) // self.block
        with self._lock:
            key = None
            for known, (_, run, _) in self._streams.items():
                # a sequential reader's next read may come a little ahead of the one before
                # it; a reader not yet sequential continues only where it ended (a random
                # reader's read landing just after another's is not a run)
                ahead = self.block if run > EXACT_RUN else 0
                if known <= offset <= known + ahead and (key is None or known > key):
                    key = known
            window, run, exact_block = self._streams.pop(key) if key is not None else (0, 0, -1)
            # exact ranges until the reader is sequential, and then until it leaves the
            # blocks it read in exact ranges: none of its bytes is fetched twice
            exact = run <= EXACT_RUN or first <= exact_block
            if run > EXACT_RUN:         # a sequential reader: its window doubles each read
                window = min(self._max_ahead(), max(1, 2 * window))
            self._streams[end] = (window, run + end - offset, last if exact else exact_block)
            while len(self._streams) > STREAMS:
                self._streams.popitem(last=False)
            if not window or self.closed:
                return exact
            todo = []
            for index in range(last + 1, min(limit + 1, last + 1 + window)):
                if index in self._pending or self.memory.lookup((self.key, index)) is not None \
                        or (self.exact_reads and self._has_pieces(index, index)):
                    continue
                todo.append((index, self._fetching(future := Future(), index)))
                self._pending[index] = future
        if todo:
            deadline = time.monotonic() + 3600      # nobody waits on read-ahead but readers,
            for index, cancel in todo:              # who wait with their own deadline
                self.fetcher.submit(functools.partial(self._fetch_ahead, index, deadline, cancel),
                                    urgent=False, key=(id(self), limit))   # one per extent read
        return exact

    def _max_ahead(self) -> int:
        """No more read-ahead than a quarter of the memory cache holds: blocks fetched ahead
        must not push each other out before they are read."""
        room = self.memory.max_bytes // (4 * self.block)
        return max(1, min(MAX_AHEAD, room))

    def _fetch_ahead(self, index: int, deadline: float, cancel: Cancel | None = None) -> None:
        if cancel is not None and cancel.cancelled:
            return
        if not self._from_disk(index):
            self._fetch_run([index], deadline, cancel)

    def close(self) -> None:
        """Wake every reader waiting for a block: unmounting does not wait for a request."""
        self.closed = True
        with self._lock:
            pending, self._pending = self._pending, {}
            pieces = [future for _, future in self._pieces.values() if future is not None]
            self._pieces, self._piece_starts = {}, []
        for future in [*pending.values(), *pieces]:
            if not future.done():
                future.set_exception(OSError("the mount is closing"))



def _futures(parts: list[list]) -> list[Future]:
    return [part[2] for part in parts if isinstance(part[2], Future)]


class _Waiting:
    """One read that waits for its blocks without a thread: ``future`` is done once the
    last of them came and the read was copied (by the thread that brought it), or failed
    (a fetch failed; ``deadline`` passed).  Cancelling ``future`` (the reader gave up)
    releases the blocks with ``cancel``: the fetches no other read waits for stop."""

    def __init__(self, reader: BlockReader, parts: list[list], offset: int, buf,
                 deadline: float, futures: list[Future], failed, last: int):
        self.future: Future = Future()
        self._last = last
        self._reader, self._parts, self._offset, self._buf = reader, parts, offset, buf
        self._deadline, self._futures, self._failed = deadline, futures, failed
        self._lock = threading.Lock()
        self._left = {id(f) for f in futures if not f.done()}
        self._over = False
        self._timer = _timers.add(deadline, self._late)
        self.future.add_done_callback(self._ended)
        for future in futures:
            future.add_done_callback(self._came)

    def _came(self, future: Future) -> None:
        with self._lock:
            self._left.discard(id(future))
            last = not self._left
        if future.exception() is not None or last:
            self._finish(None)

    def _late(self) -> None:
        self._finish(TimeoutError("no answer in time"))

    def _finish(self, error: BaseException | None) -> None:
        with self._lock:
            if self._over:
                return
            self._over = True
        _timers.cancel(self._timer)
        if not self.future.set_running_or_notify_cancel():
            return                      # given up first: _ended released the blocks
        reader, parts = self._reader, self._parts
        self._parts = []
        try:
            if error is not None:
                raise error
            n = reader._copy(parts, self._offset, self._buf, self._deadline)    # all here
        except BaseException as exc:    # the reader gets it
            self.future.set_exception(self._failed(exc) if self._failed else exc)
        else:
            self.future.set_result(n)
        finally:
            reader._release(self._futures, cancel=False)
            self._buf = None

    def _ended(self, future: Future) -> None:
        if not future.cancelled():
            return
        with self._lock:
            self._over = True
        _timers.cancel(self._timer)
        self._parts, self._buf = [], None
        self._reader._release(self._futures, cancel=True, last=self._last)


_timers = Timers("tensorfs-deadlines")
