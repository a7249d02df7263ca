"""Byte sources: everything a file in the mount can be.  Each has a ``size`` and
``read(offset, size) -> bytes``; none knows about FUSE or about the tree it sits in.

- ``RawView``: a byte range of the model file, served as stored.
- ``GeneratedView``: content made on first use and kept in the shared LRU cache
  (metadata.json); its size is learnt by generating it once.
- ``NpyView``: an .npy file, a header made on first use followed by a data view.
- ``ConvertedView``: a tensor converted to float32 block by block, only for the bytes a
  reader asks for (``tensorfs.convert`` supplies the kernels).
"""

from __future__ import annotations

import io
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Hashable

import numpy as np
from numpy.lib import format as npy_format

from tensorfs.cache import ByteLRU
from tensorfs.source import ModelSource


def _clip(offset: int, size: int, total: int) -> tuple[int, int]:
    if offset >= total or size <= 0:
        return total, 0
    return offset, min(size, total - offset)


class RawView:
    def __init__(self, source: ModelSource, offset: int, nbytes: int):
        self.source = source
        self.offset = offset
        self.size = nbytes

    def read(self, offset: int, size: int) -> bytes:
        offset, size = _clip(offset, size, self.size)
        return self.source.read(self.offset + offset, size)


class GeneratedView:
    """Content produced by ``produce()`` when first read or stat'ed, cached by ``key``."""

    def __init__(self, cache: ByteLRU, key: Hashable, produce: Callable[[], bytes],
                 size: int | None = None):
        self.cache = cache
        self.key = key
        self.produce = produce
        self._size = size

    def content(self) -> bytes:
        data = self.cache.get(self.key, self.produce)
        self._size = len(data)
        return data

    @property
    def size(self) -> int:
        if self._size is None:
            self.content()
        return self._size

    def read(self, offset: int, size: int) -> bytes:
        return self.content()[offset:offset + max(size, 0)]


def npy_header(descr: str, shape: tuple[int, ...]) -> bytes:
    """The .npy header numpy.save would write for a C-order array of this dtype and shape:
    format 1.0 unless the header needs 2.0, padded so the data starts on a 64-byte boundary."""
    header = {"descr": descr, "fortran_order": False, "shape": tuple(shape)}
    buf = io.BytesIO()
    try:
        npy_format.write_array_header_1_0(buf, header)
    except ValueError:
        buf = io.BytesIO()
        npy_format.write_array_header_2_0(buf, header)
    return buf.getvalue()


class NpyView:
    """An .npy file: header + the data view.  The header is built on first use, so a tree
    of 100k tensors costs nothing per tensor until one is looked at."""

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


# Converted chunks are this many float32 output bytes (rounded to whole blocks): big enough
# that one chunk serves several 128 KiB kernel reads, small enough that a random read
# converts little it does not need.
CHUNK_OUTPUT_BYTES = 1 << 20


class ConvertedView:
    """A tensor's float32 conversion, computed lazily in block-aligned chunks.

    Costly conversions (K-quants, IQ types ...) keep their chunks in the shared LRU and a
    sequential reader gets the next chunk converted ahead on a worker thread; cheap ones
    (BF16, FP8) convert just the blocks a read covers and keep nothing.
    """

    _readahead_pool: ThreadPoolExecutor | None = None
    _pool_lock = threading.Lock()

    def __init__(self, source: ModelSource, offset: int, nbytes: int, conversion,
                 cache: ByteLRU, key: Hashable, n_elements: int):
        self.source = source
        self.offset = offset
        self.nbytes = nbytes
        self.conversion = conversion
        self.cache = cache
        self.key = key
        self.size = n_elements * 4
        self.block_out = conversion.block_elems * 4
        blocks_per_chunk = max(1, CHUNK_OUTPUT_BYTES // self.block_out)
        self.chunk_out = blocks_per_chunk * self.block_out
        self.chunk_in = blocks_per_chunk * conversion.block_bytes
        self._last_end = -1

    # -- conversion of whole blocks -------------------------------------------------------
    def _convert_blocks(self, first_block: int, n_blocks: int) -> bytes:
        start = first_block * self.conversion.block_bytes
        length = n_blocks * self.conversion.block_bytes
        raw = self.source.read(self.offset + start, length)
        values = self.conversion.convert(np.frombuffer(raw, dtype=np.uint8))
        return values.tobytes()

    def _chunk(self, index: int) -> bytes:
        blocks_per_chunk = self.chunk_out // self.block_out
        first = index * blocks_per_chunk
        total_blocks = self.size // self.block_out
        count = min(blocks_per_chunk, total_blocks - first)
        return self.cache.get((self.key, index), lambda: self._convert_blocks(first, count))

    # -- reads ----------------------------------------------------------------------------
    def read(self, offset: int, size: int) -> bytes:
        offset, size = _clip(offset, size, self.size)
        if size == 0:
            return b""
        end = offset + size
        if not self.conversion.costly:
            first = offset // self.block_out
            last = (end + self.block_out - 1) // self.block_out
            data = self._convert_blocks(first, last - first)
            skip = offset - first * self.block_out
            return data[skip:skip + size]
        sequential = offset == self._last_end
        self._last_end = end
        pieces = []
        first_chunk = offset // self.chunk_out
        last_chunk = (end - 1) // self.chunk_out
        for index in range(first_chunk, last_chunk + 1):
            chunk = self._chunk(index)
            base = index * self.chunk_out
            lo = max(offset, base) - base
            hi = min(end, base + len(chunk)) - base
            pieces.append(chunk[lo:hi])
        if sequential:
            self._read_ahead(last_chunk + 1)
        return pieces[0] if len(pieces) == 1 else b"".join(pieces)

    def _read_ahead(self, index: int) -> None:
        if index * self.chunk_out >= self.size or self.cache.peek((self.key, index)):
            return
        pool = ConvertedView._pool()
        pool.submit(self._quiet_chunk, index)

    def _quiet_chunk(self, index: int) -> None:
        try:
            self._chunk(index)
        except Exception:      # a failed read-ahead is retried, and reported, by the real read
            pass

    @classmethod
    def _pool(cls) -> ThreadPoolExecutor:
        with cls._pool_lock:
            if cls._readahead_pool is None:
                cls._readahead_pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="readahead")
            return cls._readahead_pool
