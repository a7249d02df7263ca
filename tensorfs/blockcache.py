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
- **growing read-ahead**: a reader whose reads follow each other (its next read starts where
  its last one ended) gets the blocks after it fetched ahead,
  1, 2, 4 ... ``MAX_AHEAD`` blocks, one request per block so that several are in flight at
  once (what a long round trip needs: docs/remote.md);
- blocks kept in memory in the mount's one LRU (``--cache-size``), and with a ``DiskCache``
  on disk too, keyed by the file's URL and version.

The fetch function (``tensorfs.remote.RemoteSource``) does the retries, the timeout and the
version check; this module only decides which ranges to ask for and who waits for what.
"""

from __future__ import annotations

import bisect
import hashlib
import os
import stat
import sys
import threading
import time
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Callable

from tensorfs.runtime import unsafe_directory, write_file

# 4 MiB: against nginx on loopback 1, 2, 4 and 8 MiB blocks read a 256 MiB tensor within a
# few percent of each other once read-ahead runs, and a random 4 KiB read costs the block's
# transfer (docs/remote.md, "block size").
BLOCK_SIZE = 4 << 20
MAX_REQUEST = 16 << 20          # bytes in one merged request
SMALL_TENSOR = 16 << 20         # a tensor at most this big is fetched whole at first read
MAX_AHEAD = 16                  # blocks of read-ahead, at most
STREAMS = 16                    # sequential readers told apart per file
FETCH_THREADS = 32              # read-ahead requests in flight, all files together

POOLED = 8                      # spare block buffers kept for reuse, at most

_executor: ThreadPoolExecutor | None = None
_executor_pid = 0
_executor_lock = threading.Lock()


def _pool() -> ThreadPoolExecutor:
    """The read-ahead threads, made in the process that uses them (the daemon forks after
    the mount's headers are read: threads do not survive a fork)."""
    global _executor, _executor_pid
    with _executor_lock:
        if _executor is None or _executor_pid != os.getpid():
            _executor = ThreadPoolExecutor(FETCH_THREADS, thread_name_prefix="tensorfs-fetch")
            _executor_pid = os.getpid()
        return _executor


class BufferPool:
    """Block-sized ``bytearray`` buffers to receive bodies into, used again once served.

    Memory the process touches for the first time costs a page fault per 4 KiB, zeroed by
    the kernel: receiving a 256 MiB tensor into fresh 4 MiB objects cost about half of the
    event loop thread's CPU, with the GIL held (docs/remote.md "Measured").  A buffer comes
    back only when nothing else refers to it (``give``), so no reader ever sees its bytes
    change."""

    def __init__(self, size: int, keep: int = POOLED):
        self.size = size
        self.keep = keep
        self._spare: list[bytearray] = []
        self._lock = threading.Lock()

    def take(self, n: int) -> bytearray:
        if n == self.size:
            with self._lock:
                if self._spare:
                    return self._spare.pop()
        return bytearray(n)

    def give(self, buf) -> None:
        """Keep ``buf`` for a later ``take`` if the caller's local variable is the only
        reference to it; anything else still using it keeps it."""
        if (type(buf) is bytearray and len(buf) == self.size
                and sys.getrefcount(buf) <= _ONLY_THE_CALLERS):
            with self._lock:
                if len(self._spare) < self.keep:
                    self._spare.append(buf)


def _refs_seen_by_give() -> int:
    """What ``give`` counts for a buffer only its caller's local variable refers to,
    measured the way ``give`` measures (not assumed: 3.14 counts borrowed references
    differently, and a count too high would hand out a buffer someone still reads)."""
    def count(buf):
        return sys.getrefcount(buf)

    local = bytearray(0)
    return count(local)


_ONLY_THE_CALLERS = _refs_seen_by_give()


_pools: dict[int, BufferPool] = {}


def buffer_pool(size: int | None = None) -> BufferPool:
    """The pool of ``size``-byte buffers (default: ``BLOCK_SIZE``, as it is now: bench/
    varies it)."""
    size = BLOCK_SIZE if size is None else size
    pool = _pools.get(size)
    if pool is None:
        pool = _pools.setdefault(size, BufferPool(size))
    return pool


class BlockReader:
    """The blocks of one remote file.  ``fetch(start, end, deadline) -> bytes`` gets
    ``[start, end)`` (exactly) or raises."""

    def __init__(self, key: tuple, size: int, fetch: Callable[[int, int, float], bytes],
                 memory, disk: "DiskCache | None" = None, disk_key: str | None = None,
                 block_size: int = BLOCK_SIZE):
        self.key = key
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
        self._read_ahead(offset, offset + size, last, span)  # before waiting: all in flight at once
        lo, hi = self._small_tensor(offset, first, last)
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
        holds its bytes now, and its buffer receives a later block (``BufferPool``) unless
        someone else still holds it.  A block read again (the kernel dropped its pages,
        another tensor in the same block) is fetched again, never served wrong."""
        data = self.memory.pop((self.key, index))
        if data is not None:
            buffer_pool(self.block).give(data)

    def _small_tensor(self, offset: int, first: int, last: int) -> tuple[int, int]:
        i = bisect.bisect_right(self._starts, offset) - 1
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
        """Fetch the pending blocks ``indices`` (sorted), adjacent ones in one request."""
        runs: list[list[int]] = []
        per_request = max(1, MAX_REQUEST // self.block)
        for index in indices:
            if self._from_disk(index):
                continue
            if runs and runs[-1][-1] == index - 1 and len(runs[-1]) < per_request:
                runs[-1].append(index)
            else:
                runs.append([index])
        for run in runs:
            self._fetch_run(run, deadline)

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
        if len(run) == 1:               # the answer is the block: no copy
            self._resolve(run[0], data, keep_on_disk=True)
            return
        view = memoryview(data)
        for index in run:
            offset = index * self.block - start
            self._resolve(index, bytes(view[offset:offset + self._block_len(index)]),
                          keep_on_disk=True)

    def _resolve(self, index: int, data: bytes, keep_on_disk: bool) -> None:
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
    def _read_ahead(self, offset: int, end: int, last: int, span=None) -> None:
        """A read that starts where an earlier one ends (or up to a block further on: the
        kernel's read-ahead sends a file's next reads together, and FUSE threads take them in
        any order) continues that reader's stream: its window doubles and that many blocks
        after it are fetched, never past the end of the tensor being read (each file of a
        mount is one tensor: what lies beyond is another file).  A stream is registered when
        its read starts, not when it ends.  Readers of one block at once are not a stream
        (their reads start before where the others' end)."""
        if span is not None:
            limit = (min(span[1], self.size) - 1) // self.block
        else:
            i = bisect.bisect_right(self._starts, end - 1) - 1
            if i < 0 or end > self._ends[i]:
                return                  # not inside a tensor (a header): no read-ahead
            limit = (self._ends[i] - 1) // self.block
        with self._lock:
            key = None
            for known in self._streams:
                if known <= offset <= known + self.block and (key is None or known > key):
                    key = known
            window = self._streams.pop(key) if key is not None else None
            if window is not None:
                window = min(self._max_ahead(), max(1, 2 * window))
            else:
                window = 0              # a new reader: read-ahead from its second read on
            self._streams[end] = window
            while len(self._streams) > STREAMS:
                self._streams.popitem(last=False)
            if not window or self.closed:
                return
            todo = []
            for index in range(last + 1, min(limit + 1, last + 1 + window)):
                if index in self._pending or self.memory.lookup((self.key, index)) is not None:
                    continue
                self._pending[index] = Future()
                todo.append(index)
        if todo:
            pool = _pool()
            deadline = time.monotonic() + 3600      # nobody waits on read-ahead but readers,
            for index in todo:                      # who wait with their own deadline
                pool.submit(self._fetch_ahead, index, deadline)

    def _max_ahead(self) -> int:
        """No more read-ahead than a quarter of the memory cache holds: blocks fetched ahead
        must not push each other out before they are read."""
        room = getattr(self.memory, "max_bytes", MAX_AHEAD * self.block) // (4 * self.block)
        return max(1, min(MAX_AHEAD, room))

    def _fetch_ahead(self, index: int, deadline: float) -> None:
        if not self._from_disk(index):
            self._fetch_run([index], deadline)

    def close(self) -> None:
        """Wake every reader waiting for a block: unmounting does not wait for a request."""
        self.closed = True
        with self._lock:
            pending, self._pending = self._pending, {}
        for future in pending.values():
            if not future.done():
                future.set_exception(OSError("the mount is closing"))


class DiskCache:
    """Fetched blocks on disk, under ``directory``, at most ``max_bytes`` of them: the least
    recently used go first.  Shared by concurrent and later mounts: a block file is written
    under a temporary name (``O_EXCL|O_NOFOLLOW``) and renamed into place, so a reader sees a
    whole block or none; the directory must be the user's own and closed to others."""

    def __init__(self, directory: str, max_bytes: int):
        self.directory = directory
        self.max_bytes = max_bytes
        self._lock = threading.Lock()
        self._checked: set[str] = set()
        _own_directory(directory)
        self._lru: OrderedDict[str, int] = OrderedDict()     # block file -> bytes
        found = []
        for sub in os.listdir(directory):
            sub_path = os.path.join(directory, sub)
            if not _is_private_dir(sub_path):
                continue
            for name in os.listdir(sub_path):
                path = os.path.join(sub_path, name)
                try:
                    st = os.lstat(path)
                except OSError:
                    continue
                if stat.S_ISREG(st.st_mode) and not name.endswith(".tmp"):
                    found.append((st.st_mtime_ns, path, st.st_size))
        for _, path, size in sorted(found):
            self._lru[path] = size
        self.total = sum(self._lru.values())

    @staticmethod
    def object_key(url: str, version: str, block_size: int) -> str:
        text = f"{url}\0{version}\0{block_size}"
        return hashlib.sha256(text.encode("utf-8", "surrogateescape")).hexdigest()[:40]

    def _sub(self, key: str) -> str:
        path = os.path.join(self.directory, key)
        if key not in self._checked:
            try:
                os.mkdir(path, 0o700)
            except FileExistsError:
                pass
            if not _is_private_dir(path):
                raise OSError(f"{path}: not a directory of this user's own")
            self._checked.add(key)
        return path

    def get(self, key: str, index: int, length: int) -> bytes | None:
        path = os.path.join(self.directory, key, f"{index}")
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            return None
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or st.st_size != length or st.st_uid != os.geteuid():
                return None
            data = os.pread(fd, length, 0)
        except OSError:
            return None
        finally:
            os.close(fd)
        if len(data) != length:
            return None
        with self._lock:
            if path in self._lru:
                self._lru.move_to_end(path)
        try:
            os.utime(path, follow_symlinks=False)   # recency for a later mount's order
        except OSError:
            pass
        return data

    def put(self, key: str, index: int, data: bytes) -> None:
        if len(data) > self.max_bytes:
            return
        try:
            sub = self._sub(key)
            path = os.path.join(sub, f"{index}")
            dir_fd = os.open(sub, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
            try:
                write_file(dir_fd, f"{index}", data)
            finally:
                os.close(dir_fd)
        except OSError:
            return                      # a full disk or a race: the block is just not kept
        with self._lock:
            self.total += len(data) - self._lru.pop(path, 0)
            self._lru[path] = len(data)
            while self.total > self.max_bytes and self._lru:
                victim, size = self._lru.popitem(last=False)
                self.total -= size
                try:
                    os.unlink(victim)
                except OSError:
                    pass


def _is_private_dir(path: str) -> bool:
    try:
        return unsafe_directory(os.lstat(path), os.geteuid()) is None
    except OSError:
        return False


def _own_directory(directory: str) -> None:
    """``directory`` exists (made 0700 if not), is a directory, is the user's and only the
    user can write to it: otherwise ``PermissionError`` saying which."""
    try:
        os.makedirs(directory, 0o700, exist_ok=True)
    except OSError as error:
        raise PermissionError(f"{directory}: cannot create the disk cache: {error.strerror}") from None
    st = os.lstat(directory)
    if stat.S_ISLNK(st.st_mode):
        real = os.path.realpath(directory)
        st = os.lstat(real)
    if not stat.S_ISDIR(st.st_mode):
        raise PermissionError(f"{directory}: the disk cache is not a directory")
    if st.st_uid != os.geteuid():
        raise PermissionError(f"{directory}: the disk cache belongs to another user (uid {st.st_uid})")
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise PermissionError(f"{directory}: others can write to the disk cache directory "
                              f"(mode {stat.S_IMODE(st.st_mode):o}): chmod go-w it")
