"""Views: everything a file in the mount can be.  Each is a ``View`` (``tensorfs.views.base``): a
``size`` and ``read(offset, size) -> bytes``; none knows about FUSE or about the tree it
sits in.

- ``RawView``: a byte range of the model file, served as stored.
- ``GeneratedView``: content made on first use and kept in the shared LRU cache in blocks
  (metadata.json, metadata/ files); its size is learnt by generating it once, and reading
  it costs one generation whatever the cache holds.
- ``NpyView``: an .npy file, a header made on first use followed by a data view.
- ``ConvertedView``: a tensor converted to float32 block by block, only for the bytes a
  reader asks for (``tensorfs.convert`` supplies the kernels).

``cheap_size`` says whether ``size`` costs next to nothing (a listing then gives it unasked,
so that ``ls -l`` needs no lookup per file) or may have to generate content first.

Each also has ``read_into(offset, buf) -> n``: the same bytes written into a writable buffer
(the one the FUSE reply is sent from), so that the hot path builds no bytes object and copies
once — see docs/internals/serving.md.  ``View.read_into`` copies ``read`` for a view that has no
faster way.
"""

from __future__ import annotations

import errno
import logging
import os
import struct
import threading
import weakref
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING, Callable, Hashable

if TYPE_CHECKING:          # annotations only: numpy is imported where it is used
    import numpy as np

from tensorfs.budget import STREAM_BYTES, MemoryBudget
from tensorfs.cache import ByteLRU
from tensorfs.convert.blocks import Readable, read_converted
from tensorfs.convert.workers import START_WORK_BYTES, WorkerPool, paying_size
from tensorfs.runtime import libraries
from tensorfs.sources.source import Source
from tensorfs.views.base import View, _clip, _copy_into
from tensorfs.waits import gathered, then

# _LIBRARIES: the read path takes numpy as ``libraries.np`` (a module attribute: ~50 ns once
# it is imported), not ``from tensorfs.runtime.libraries import np`` in each call: that
# statement also asks the module for ``__path__``, which its ``__getattr__`` answers with
# an AttributeError, ~3 us, twice per read of a converted view.

log = logging.getLogger("tensorfs")


class RawView(View):
    """A byte range of a source, served as stored."""

    size: int

    _span = None        # read-ahead stays inside the tensor the range is (blockcache)

    def __init__(self, source: Source, offset: int, nbytes: int):
        self.source = source
        self.offset = offset
        self.size = nbytes

    def read(self, offset: int, size: int) -> bytes:
        offset, size = _clip(offset, size, self.size)
        return self.source.read(self.offset + offset, size)

    def read_into(self, offset: int, buf: memoryview) -> int:
        offset, size = _clip(offset, len(buf), self.size)
        return self.source.read_into(self.offset + offset, buf[:size],
                                     span=self._span) if size else 0

    def read_or_wait(self, offset: int, buf: memoryview) -> int | Future[int]:
        offset, size = _clip(offset, len(buf), self.size)
        return self.source.read_or_wait(self.offset + offset, buf[:size],
                                        span=self._span) if size else 0

    def open(self) -> None:
        """A file changed since the mount is refused at open (EIO), as at a read."""
        self.source.vouch()

    # A local file's bytes are named, not copied: tensorfs.fuse.session replies with the descriptor
    # and offset (splice), so a raw read never passes through Python (benchmark W3).
    def read_fd(self, offset: int, size: int):
        fd = self.source.local_fd
        if fd is None:
            return None
        offset, size = _clip(offset, size, self.size)
        if size:
            self.source.vouch(self.offset + offset, size)
        return fd, self.offset + offset, size


# Generated content is kept in the shared LRU in blocks of this many bytes.
GENERATED_BLOCK = 256 << 10
# A generated file larger than the cache is read through cursors: each is its producer, left
# where the last block it made ended, with the last WINDOW_BLOCKS blocks it made: the
# kernel's read-ahead has several 1 MiB requests in flight, answered in any order by
# libfuse's threads (seen: a request 2.5 MiB behind one already answered).  A reader
# continues the cursor just behind it, so two readers of one file each keep their own.  At
# most LIVE_CURSORS live at a time, the oldest dropped first: WINDOW_BLOCKS *
# GENERATED_BLOCK * LIVE_CURSORS = 32 MiB at most outside --cache-size (before, such a file
# was generated whole for every read), besides what each producer holds (the decoded value
# it is writing out, no more than the model holds).
WINDOW_BLOCKS = 32
LIVE_CURSORS = 4

_live_cursors: list = []            # (weak reference to the view, its cursor), oldest first
_live_lock = threading.Lock()


class _Cursor:
    """A producer part-way through: ``index`` is the block it makes next."""

    __slots__ = ("pieces", "index", "pending", "window")

    def __init__(self, pieces):
        self.pieces = pieces
        self.index = 0
        self.pending = bytearray()
        self.window: dict[int, bytes] = {}

    def next_block(self) -> bytes | None:
        """The next block (the last one may be short), or None past the end."""
        while len(self.pending) < GENERATED_BLOCK:
            piece = next(self.pieces, None)
            if piece is None:
                break
            self.pending += piece
        if not self.pending:
            return None
        block = bytes(self.pending[:GENERATED_BLOCK])
        del self.pending[:GENERATED_BLOCK]
        self.window[self.index] = block
        self.window.pop(self.index - WINDOW_BLOCKS, None)
        self.index += 1
        return block


class GeneratedView(View):
    """Content made by ``produce()`` -- bytes, or an iterable of bytes pieces (metadata.json,
    a vocabulary's text) -- kept in the shared LRU in blocks of ``GENERATED_BLOCK``.

    Reading it from start to end costs one generation (two with the first stat, which
    generates once to learn the size) whatever ``--cache-size`` is: a block the cache no
    longer holds is made by the cursor, which continues the producer from where the last
    block ended; only a read behind the cursor (and outside its window) starts the producer
    again.  Content that fits in the cache is generated once, as before.  ``generations``
    counts the producer's starts (logged at debug level)."""

    def __init__(self, cache: ByteLRU, key: Hashable, produce: Callable[[], object],
                 size: int | None = None):
        self.cache = cache
        self.key = key
        self.produce = produce
        self._size = size
        self._lock = threading.Lock()
        self._cursors: list[_Cursor] = []
        self.generations = 0

    def _start(self, keep: bool = True) -> _Cursor:
        self.generations += 1
        log.debug("%s: generating (start %d)", self.key, self.generations)
        out = self.produce()
        if isinstance(out, (bytes, bytearray, memoryview)):
            out = (bytes(out),)
        cursor = _Cursor(iter(out))
        if keep:
            self._cursors.append(cursor)
            with _live_lock:
                _live_cursors.append((weakref.ref(self), cursor))
                while len(_live_cursors) > LIVE_CURSORS:
                    ref, old = _live_cursors.pop(0)
                    view = ref()
                    if view is not None and old in view._cursors:
                        view._cursors.remove(old)
        return cursor

    def _keep(self, index: int, block: bytes) -> None:
        """A block made on the way to another: kept if the cache can (never waits: the
        thread that asked for it may be waiting for this view's lock)."""
        self.cache.put((self.key, index), block)

    def _make(self, index: int) -> bytes:
        """Block ``index``: from a cursor's window, or made by the cursor nearest behind
        it, or by a new one."""
        with self._lock:
            cursor = None
            for c in list(self._cursors):
                block = c.window.get(index)
                if block is not None:
                    return block
                if c.index <= index and (cursor is None or c.index > cursor.index):
                    cursor = c
            if cursor is None:
                log.debug("%s: block %d: no cursor behind it (%s)", self.key, index,
                          [c.index for c in self._cursors])
                cursor = self._start()
            try:
                while True:
                    block = cursor.next_block()
                    if block is None:               # past the end: done with the producer
                        self._drop(cursor)
                        return b""
                    if cursor.index - 1 == index:
                        return block
                    self._keep(cursor.index - 1, block)
            except BaseException:
                self._drop(cursor)
                raise

    def _drop(self, cursor: _Cursor) -> None:
        if cursor in self._cursors:
            self._cursors.remove(cursor)

    def _block(self, index: int) -> bytes:
        return self.cache.get((self.key, index), lambda: self._make(index))

    @property
    def size(self) -> int:
        if self._size is None:
            with self._lock:
                if self._size is None:
                    self._check()
                    cursor = self._start(keep=False)
                    total = 0
                    while (block := cursor.next_block()) is not None:
                        self._check()
                        self._keep(cursor.index - 1, block)
                        total += len(block)
                    self._size = total
        return self._size

    def stop(self) -> None:
        """The mount is ending: a size still being learnt (the whole content generated,
        O(model) for metadata.json) is given up, within a block, and not started again;
        the requests waiting for it get ECANCELED instead of holding up the end."""
        self._stopped = True

    _stopped = False

    def _check(self) -> None:
        if self._stopped:
            raise OSError(errno.ECANCELED, f"{self.key}: not generated: the mount is ending")

    @property
    def cheap_size(self) -> bool:
        return self._size is not None

    def read(self, offset: int, size: int) -> bytes:
        out = bytearray(max(0, min(size, self.size - offset)))
        n = self.read_into(offset, memoryview(out))
        return bytes(out[:n])

    def read_into(self, offset: int, buf: memoryview) -> int:
        offset, size = _clip(offset, len(buf), self.size)
        pos = 0
        while pos < size:
            index, skip = divmod(offset + pos, GENERATED_BLOCK)
            block = self._block(index)
            if len(block) <= skip:
                break
            n = _copy_into(buf[pos:size], memoryview(block)[skip:])
            pos += n
        return pos


# The .npy format's constants (numpy.lib.format): the magic, the data's alignment, and the
# spare room numpy leaves after the shape so that a file can grow along its first axis.
_NPY_MAGIC = b"\x93NUMPY"
_NPY_ALIGN = 64
_NPY_GROWTH_DIGITS = 21


def npy_header(descr: str, shape: tuple[int, ...]) -> bytes:
    """The .npy header numpy.save would write for a C-order array of this dtype and shape:
    format 1.0 unless the header needs 2.0, padded so the data starts on a 64-byte boundary.
    Written here as numpy.lib.format writes it (the views' tests hold it to numpy's bytes):
    a listing's sizes (``ls -l``) then need no numpy, which is most of a mount's imports."""
    shape = tuple(int(n) for n in shape)
    text = f"{{'descr': {descr!r}, 'fortran_order': False, 'shape': {shape!r}, }}"
    if shape:
        text += " " * (_NPY_GROWTH_DIGITS - len(repr(shape[0])))
    header = text.encode("latin1")
    for major, length in ((1, "<H"), (2, "<I")):
        size = len(header) + 1                      # the final newline
        size += _NPY_ALIGN - (len(_NPY_MAGIC) + 2 + struct.calcsize(length) + size) % _NPY_ALIGN
        try:
            prefix = _NPY_MAGIC + bytes((major, 0)) + struct.pack(length, size)
        except struct.error:                        # too long for 1.0's 16-bit length
            continue
        return prefix + header + b" " * (size - len(header) - 1) + b"\n"
    raise ValueError(f"a .npy header of {len(header)} bytes is too long")


class NpyView(View):
    """An .npy file: header + the data view.  The header is built on first use, so a tree
    of 100k tensors costs nothing per tensor until one is looked at."""

    cheap_size = True       # the header takes ~6 us to build, a FUSE round trip far more

    def __init__(self, descr: str, shape: tuple[int, ...], data_view):
        self.descr = descr
        self.shape = tuple(shape)
        self.data = data_view
        self._header: bytes | None = None

    @property
    def header(self) -> bytes:
        if self._header is None:
            self._header = npy_header(self.descr, self.shape)
        return self._header

    @property
    def size(self) -> int:
        return len(self.header) + self.data.size

    def read(self, offset: int, size: int) -> bytes:
        header = self.header
        offset, size = _clip(offset, size, len(header) + self.data.size)
        if size == 0:
            return b""
        end = offset + size
        if offset >= len(header):
            return self.data.read(offset - len(header), size)
        head = header[offset:end]
        if end <= len(header):
            return head
        return head + self.data.read(0, end - len(header))

    def _split(self, offset: int, buf: memoryview) -> tuple[int, int, memoryview | None]:
        """A read's header part copied into ``buf``: (how many bytes, where its data part
        starts in the data view, the rest of ``buf`` it fills, or None where it has none)."""
        header = self.header
        offset, size = _clip(offset, len(buf), len(header) + self.data.size)
        n = _copy_into(buf[:size], memoryview(header)[offset:]) if offset < len(header) else 0
        if n == size:
            return n, 0, None
        return n, offset + n - len(header), buf[n:size]

    def read_into(self, offset: int, buf: memoryview) -> int:
        n, at, rest = self._split(offset, buf)
        return n if rest is None else n + self.data.read_into(at, rest)

    def read_or_wait(self, offset: int, buf: memoryview) -> int | Future[int]:
        """The data part as its view reads it: without a thread where its bytes are on
        their way (a remote tensor's, plain or converted)."""
        n, at, rest = self._split(offset, buf)
        if rest is None:
            return n
        waited = self.data.read_or_wait(at, rest)
        if isinstance(waited, Future):
            return gathered(n + len(rest), [(n, len(rest), waited)])
        return n + waited


# Converted chunks are this many float32 output bytes (rounded to whole blocks): big enough
# that one chunk serves several 128 KiB kernel reads, small enough that a random read
# converts little it does not need.
CHUNK_OUTPUT_BYTES = 1 << 20

# Chunks converted for sequential readers (and ahead of them) live in a store of their own,
# the budget's ``stream`` (tensorfs.budget); random reads use the shared LRU.
# A sequential reader gets this many chunks converted ahead of it, by this many workers
# (one per core, at most two: more only queue behind the GIL).  Benchmark rows 4 and 6.
READ_AHEAD_CHUNKS = 2
READ_AHEAD_WORKERS = min(2, os.cpu_count() or 1)


class _ChunkBuffers:
    """Recycled chunk buffers: a chunk dropped by a cache gives its bytearray back here."""

    def __init__(self, keep: int):
        self.keep = keep
        self._free: list[bytearray] = []
        self._lock = threading.Lock()

    def take(self) -> bytearray:
        with self._lock:
            if self._free:
                return self._free.pop()
        return bytearray(CHUNK_OUTPUT_BYTES)

    def give(self, buf: bytearray) -> None:
        with self._lock:
            if len(self._free) < self.keep:
                self._free.append(buf)


_BUFFERS = _ChunkBuffers(keep=STREAM_BYTES // CHUNK_OUTPUT_BYTES)
# Stored bytes of the blocks being converted, read into a reused buffer.  Shared, not per
# thread: libfuse threads come and go, and a buffer per thread would go with them only if
# their Python thread state did (it does not: tensorfs.fuse.session.Session._guarded keeps it).
_SCRATCH = _ChunkBuffers(keep=8)


class _Chunk:
    """A converted chunk in a recycled buffer; ``len`` is its size in bytes (what the caches
    count).  Whoever reads ``data`` holds the chunk meanwhile, so the buffer is recycled only
    once nobody can see it."""

    __slots__ = ("buf", "n")

    def __init__(self, n: int):
        self.buf = _BUFFERS.take()
        self.n = n

    def __len__(self) -> int:
        return self.n

    @property
    def data(self) -> memoryview:
        return memoryview(self.buf)[:self.n]

    def __del__(self):
        try:
            _BUFFERS.give(self.buf)
        except Exception:       # interpreter shutdown
            pass


def worker_pool(workers: int | None, budget: MemoryBudget) -> WorkerPool | None:
    """The conversion workers of a mount (tensorfs.convert.workers): ``workers`` of them, started by
    the first costly conversion; or, by default (None), as many as pay on this machine now
    (none on 2 CPUs), started only by a conversion of a tensor large enough to pay for their
    start (the mount also starts them ahead, ``MountedModel.start``).  The pool's slots
    are chunks: as many as the budget's caches hold."""
    if workers is None:
        size, start_work = paying_size(), START_WORK_BYTES
    else:
        size, start_work = workers, 0
    if size <= 0:
        return None
    return WorkerPool(size, slot_bytes=CHUNK_OUTPUT_BYTES, held_bytes=budget.held_bytes,
                      start_work=start_work)


class ConvertedView(View):
    """A tensor's float32 conversion, computed lazily in block-aligned chunks.

    Costly conversions (K-quants, IQ types ...) keep their chunks in the shared LRU and a
    sequential reader gets the next chunks converted ahead; with a worker ``pool``
    (tensorfs.convert.workers) ready, worker processes convert them into the pool's arena (a chunk
    is then a ``PoolChunk``, its slot the pool's again once the caches drop it), else
    threads of this process do.  Cheap ones
    (BF16, FP8) convert just the blocks a read covers, straight into the reader's buffer
    when the read is block-aligned (every kernel read is), and keep nothing.
    """

    size: int

    cheap_size = True

    def __init__(self, source: Source, offset: int, nbytes: int, conversion,
                 budget: MemoryBudget, key: Hashable, n_elements: int, pool=None):
        self.source = source
        self.pool = pool
        self.offset = offset
        self.nbytes = nbytes
        self.conversion = conversion
        self.cache = budget.cache
        self.key = key
        self.size = n_elements * 4
        self.block_out = conversion.block_elems * 4
        blocks_per_chunk = max(1, CHUNK_OUTPUT_BYTES // self.block_out)
        self.chunk_out = blocks_per_chunk * self.block_out
        self.chunk_in = blocks_per_chunk * conversion.block_bytes
        self._last_end = -1
        self.stream = budget.stream if conversion.costly else None

    # -- conversion of whole blocks -------------------------------------------------------
    def _convert_into(self, first_block: int, n_blocks: int, out: np.ndarray,
                      stored: Readable) -> None:
        length = n_blocks * self.conversion.block_bytes
        np = libraries.np  # at first use, not with a mount (_LIBRARIES)

        scratch = _SCRATCH.take() if length <= CHUNK_OUTPUT_BYTES else bytearray(length)
        try:
            raw = np.frombuffer(scratch, dtype=np.uint8, count=length)
            read_converted(stored, self.offset, self.conversion, first_block, n_blocks,
                           out, raw)
            del raw
        finally:
            if len(scratch) == CHUNK_OUTPUT_BYTES:
                _SCRATCH.give(scratch)

    def _convert_chunk(self, index: int, stored: Readable):
        """Chunk ``index``: a worker's (a ``tensorfs.convert.workers.PoolChunk``) when the pool has
        one ready and a slot free, else converted here into a recycled buffer; its stored
        bytes read from ``stored``."""
        blocks_per_chunk = self.chunk_out // self.block_out
        first = index * blocks_per_chunk
        count = min(blocks_per_chunk, self.size // self.block_out - first)
        if self.pool is not None:
            start = self.offset + first * self.conversion.block_bytes
            chunk = self.pool.convert(self.conversion,
                                      lambda buf: stored.read_into(start, buf),
                                      count * self.conversion.block_bytes,
                                      count * self.block_out, work=self.size)
            if chunk is not None:
                return chunk
        np = libraries.np  # at first use, not with a mount (_LIBRARIES)

        chunk = _Chunk(count * self.block_out)
        self._convert_into(first, count, np.frombuffer(chunk.data, dtype=np.float32), stored)
        return chunk

    def _chunk(self, index: int, sequential: bool = False, stored: Readable | None = None
               ) -> _Chunk:
        key = (self.key, index)
        source = stored or self.source
        if sequential or self.stream.peek(key):
            return self.stream.get(key, lambda: self._convert_chunk(index, source))
        return self.cache.get(key, lambda: self._convert_chunk(index, source))

    # -- reads ----------------------------------------------------------------------------
    def read(self, offset: int, size: int) -> bytes:
        offset, size = _clip(offset, size, self.size)
        out = bytearray(size)
        n = self.read_into(offset, memoryview(out))
        return bytes(out[:n])

    def read_into(self, offset: int, buf: memoryview) -> int:
        return self._read(offset, buf, self.source)

    def read_or_wait(self, offset: int, buf: memoryview) -> int | Future[int]:
        """``read_into``; or, where the stored bytes it converts are on their way (a remote
        tensor's), a ``Future`` of the count: the bytes are fetched without a thread
        (``Source.read_or_wait``), then converted by one of the conversion threads into
        ``buf``.  Cancelling it before they came stops the fetches no other read waits for.
        A chunk another read is converting is waited for in a conversion thread too."""
        offset, size = _clip(offset, len(buf), self.size)
        if size == 0 or not self.source.remote:
            return self._read(offset, buf, self.source)
        end = offset + size
        if self.conversion.costly:
            first, last = offset // self.chunk_out, (end - 1) // self.chunk_out
            keys = [(self.key, index) for index in range(first, last + 1)]
            if all(self.stream.holds(key) or self.cache.holds(key) for key in keys):
                return self._read(offset, buf, self.source)
            if any(self.stream.peek(key) or self.cache.peek(key) for key in keys):
                # being converted by another read (read-ahead): its fetch is under way
                return _converting().submit(self._read, offset, buf, self.source)
            blocks_per_chunk = self.chunk_out // self.block_out
            first_block = first * blocks_per_chunk
            last_block = min((last + 1) * blocks_per_chunk, self.size // self.block_out)
        else:
            first_block = offset // self.block_out
            last_block = (end + self.block_out - 1) // self.block_out
        start = self.offset + first_block * self.conversion.block_bytes
        stored = bytearray((last_block - first_block) * self.conversion.block_bytes)
        came = self.source.read_or_wait(start, stored)
        here = _Fetched(self.source, start, stored)
        if not isinstance(came, Future):
            return self._read(offset, buf, here)
        return then(came, lambda: self._read(offset, buf, here), _converting(), str(self.key))

    def _read(self, offset: int, buf: memoryview, stored: Readable) -> int:
        """``read_into``, the stored bytes read from ``stored`` (the source, or what
        ``read_or_wait`` fetched of it)."""
        offset, size = _clip(offset, len(buf), self.size)
        if size == 0:
            return 0
        end = offset + size
        if not self.conversion.costly:
            np = libraries.np  # at first use, not with a mount (_LIBRARIES)

            bo = self.block_out
            first = offset // bo
            last = (end + bo - 1) // bo
            if offset % bo == 0 and size % bo == 0:         # straight into the reply
                self._convert_into(first, last - first, np.frombuffer(buf[:size], dtype=np.float32),
                                   stored)
                return size
            tmp = bytearray((last - first) * bo)            # unaligned: in-process reads only
            self._convert_into(first, last - first, np.frombuffer(tmp, dtype=np.float32), stored)
            skip = offset - first * bo
            buf[:size] = memoryview(tmp)[skip:skip + size]
            return size
        first_chunk = offset // self.chunk_out
        last_chunk = (end - 1) // self.chunk_out
        # Sequential: this read starts in the chunk where the previous one ended, or the
        # next (the kernel's read-ahead requests may come in slightly out of order).
        previous = self._last_end
        sequential = previous >= 0 and 0 <= first_chunk - (previous - 1) // self.chunk_out <= 1
        self._last_end = end
        pos = 0
        for index in range(first_chunk, last_chunk + 1):
            chunk = self._chunk(index, sequential, stored)
            base = index * self.chunk_out
            lo = max(offset, base) - base
            hi = min(end, base + len(chunk)) - base
            buf[pos:pos + hi - lo] = chunk.data[lo:hi]
            pos += hi - lo
        if sequential:
            pool = self.pool
            if pool is not None and pool.ready_workers:
                # every worker has a chunk while the reader is served; these threads only
                # wait for the workers (benchmark row 4w)
                ahead = threads = pool.size + 1
            else:
                ahead, threads = READ_AHEAD_CHUNKS, READ_AHEAD_WORKERS
            # no more ahead than the store keeps besides the chunk being read: a chunk
            # converted ahead must not push out the one read now (a small --cache-size)
            ahead = min(ahead, self.stream.max_bytes // self.chunk_out - 1)
            executor = _read_ahead_executor(threads)
            for index in range(last_chunk + 1, last_chunk + ahead + 1):
                self._read_ahead(index, executor)
        return pos

    def _read_ahead(self, index: int, executor) -> None:
        key = (self.key, index)
        if index * self.chunk_out >= self.size or self.stream.peek(key) or self.cache.peek(key):
            return
        try:
            executor.submit(self._quiet_chunk, index)
        except RuntimeError:    # no thread to be had (RLIMIT_NPROC, memory): read-ahead is
            pass                # only ever a head start, and never fails the read it follows

    def _quiet_chunk(self, index: int) -> None:
        try:
            self._chunk(index, sequential=True)
        except Exception:      # a failed read-ahead is retried, and reported, by the real read
            pass



class _Fetched:
    """The stored bytes a read fetched ahead of its conversion (``ConvertedView.read_or_wait``),
    read from here; any other range from the source."""

    def __init__(self, source: Source, start: int, data: bytearray):
        self.source = source
        self.start = start
        self.data = data

    def read_into(self, offset: int, buf, span: tuple[int, int] | None = None) -> int:
        at = offset - self.start
        n = len(buf)
        if at < 0 or at + n > len(self.data):
            return self.source.read_into(offset, buf, span)
        memoryview(buf).cast("B")[:] = memoryview(self.data)[at:at + n]
        return n


_executors: dict[tuple[str, int], ThreadPoolExecutor] = {}
_executors_lock = threading.Lock()


def _executor(name: str, threads: int) -> ThreadPoolExecutor:
    with _executors_lock:
        executor = _executors.get((name, threads))
        if executor is None:
            executor = _executors[name, threads] = ThreadPoolExecutor(
                max_workers=threads, thread_name_prefix=name)
        return executor


def _converting() -> ThreadPoolExecutor:
    """The threads that convert what reads which waited without a thread fetched
    (``ConvertedView.read_or_wait``): as many as convert ahead."""
    return _executor("convert", READ_AHEAD_WORKERS)


def _read_ahead_executor(threads: int) -> ThreadPoolExecutor:
    """The read-ahead threads: ``READ_AHEAD_WORKERS`` converting in-thread, or as many as a
    worker pool's workers plus one, waiting for them."""
    return _executor("readahead", threads)
