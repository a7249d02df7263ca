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
  once (what a long round trip needs: docs/remote.md);
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

# 4 MiB: against nginx on loopback 1, 2, 4 and 8 MiB blocks read a 256 MiB tensor within a
# few percent of each other once read-ahead runs, and a random 4 KiB read costs the block's
# transfer (docs/remote.md, "block size").
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
# (docs/benchmarks.md "Wire speed": 4/8/16/32 in flight measured alike at 0 ms, 16 hides a
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
    of a 1 GiB read through the default 256 MiB cache (docs/benchmarks.md, "Wire speed").
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
    """The blocks of one remote file.  ``fetch(start, end, deadline) -> bytes`` gets
    ``[start, end)`` (exactly) or raises."""

    def __init__(self, key: tuple, size: int, fetch: Callable[[int, int, float], bytes],
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
        size = len(buf)
        if size <= 0:
            return 0
        first, last = offset // self.block, (offset + size - 1) // self.block
        # before waiting: all in flight at once
        exact = self._read_ahead(offset, offset + size, first, last, span)
        lo, hi = self._small_tensor(offset, first, last, span)
        if self.exact_reads:
            if exact and size < self.block and (lo, hi) == (first, last):
                return self._read_exact(offset, buf, deadline)
            with self._lock:
                held = self._has_pieces(lo, hi)
            if held:                    # blocks partly held as pieces: the rest as pieces
                return self._read_exact(offset, buf, deadline)
        blocks = self._blocks(lo, hi, deadline, needed=(first, last))
        out = memoryview(buf)
        pos = 0
        done = []
        for index in range(first, last + 1):
            data = blocks[index]
            start = offset + pos - index * self.block
            n = min(len(data) - start, size - pos)
            with memoryview(data) as view:
                out[pos:pos + n] = view[start:start + n]
            pos += n
            if self.page_cached and self._served_all(index, n):
                done.append(index)
        del blocks, data
        for index in done:
            self._let_go(index)
        return pos

    def _read_exact(self, offset: int, buf, deadline: float) -> int:
        """A random reader's read: blocks and pieces already here (or on their way) serve
        it, and each stretch of it that nothing holds is fetched as it is, one request per
        stretch: a piece, kept in the memory cache (unless the kernel's page cache keeps
        what FUSE served) so that no byte is fetched twice."""
        end = offset + len(buf)
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
                    todo.append((part[0], part[1], part[2]))
        for start, stop, future in todo:
            self.fetcher.submit(functools.partial(self._fetch_piece, start, stop, future, deadline),
                                urgent=True)
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

    def _fetch_piece(self, start: int, stop: int, future: Future, deadline: float) -> None:
        try:
            if self.closed:
                raise OSError("the mount is closing")
            data = self.fetch(start, stop, deadline)
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
        """Blocks lo..hi (the ones in ``needed`` waited for), fetching what is missing."""
        found: dict[int, bytes] = {}
        waits: dict[int, Future] = {}
        mine: dict[int, Future] = {}
        with self._lock:
            for index in range(lo, hi + 1):
                data = self.memory.lookup((self.key, index))
                if data is not None:
                    found[index] = data
                elif index in self._pending:
                    waits[index] = self._pending[index]
                else:
                    mine[index] = self._pending[index] = Future()
        if mine:
            self._fetch_runs(sorted(mine), deadline)
            waits.update(mine)
        first, last = needed
        for index, future in waits.items():
            if first <= index <= last:
                found[index] = self._wait(future, deadline)
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
            self.fetcher.submit(functools.partial(self._fetch_disk_or_run, run, deadline),
                                urgent=True)

    def _fetch_disk_or_run(self, run: list[int], deadline: float) -> None:
        missing = [index for index in run if not self._from_disk(index)]
        while missing:                  # what the disk lacked, in adjacent runs again
            part = [missing.pop(0)]
            while missing and missing[0] == part[-1] + 1:
                part.append(missing.pop(0))
            self._fetch_run(part, deadline)

    def _from_disk(self, index: int) -> bool:
        if self.disk is None:
            return False
        data = self.disk.get(self.disk_key, index, self._block_len(index))
        if data is None:
            return False
        self._resolve(index, data, keep_on_disk=False)
        return True

    def _fetch_run(self, run: list[int], deadline: float) -> None:
        start = run[0] * self.block
        end = min(self.size, (run[-1] + 1) * self.block)
        try:
            if self.closed:
                raise OSError("the mount is closing")
            data = self.fetch(start, end, deadline)
            with self._lock:
                self.requests += 1
                self.fetched_bytes += len(data)
        except BaseException as error:
            with self._lock:
                futures = [self._pending.pop(i) for i in run if i in self._pending]
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
                self._pending[index] = Future()
                todo.append(index)
        if todo:
            deadline = time.monotonic() + 3600      # nobody waits on read-ahead but readers,
            for index in todo:                      # who wait with their own deadline
                self.fetcher.submit(functools.partial(self._fetch_ahead, index, deadline),
                                    urgent=False, key=(id(self), limit))   # one per extent read
        return exact

    def _max_ahead(self) -> int:
        """No more read-ahead than a quarter of the memory cache holds: blocks fetched ahead
        must not push each other out before they are read."""
        room = self.memory.max_bytes // (4 * self.block)
        return max(1, min(MAX_AHEAD, room))

    def _fetch_ahead(self, index: int, deadline: float) -> None:
        if not self._from_disk(index):
            self._fetch_run([index], deadline)

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

