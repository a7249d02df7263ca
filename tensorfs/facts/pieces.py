"""How a fact command works through a model: each tensor cut in bounded pieces on block
boundaries, small pieces grouped into tasks, the tasks run by every core in order, with
buffers each worker thread reuses.

Pieces are read with the sources' ``read_into`` into those buffers; the work on them runs in
threads: ``pread``, hashlib, xxhash and numpy's loops release the GIL on buffers this large
(docs/reference/facts.md, "Speed", says what was measured).
"""

from __future__ import annotations

import math
import threading
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Iterable, Iterator, NamedTuple

from tensorfs.runtime.libraries import np

# A piece of a tensor whose values are worked on at once: at most this many elements (its
# float64 copy is 8 MiB), cut on block boundaries.
PIECE_ELEMENTS = 1 << 20
# A piece of stored bytes hashed at once.
HASH_PIECE_BYTES = 8 << 20
# Tensors smaller than this are grouped into one task with their neighbours, so that a
# model of 100k small tensors costs one task per few MiB, not one per tensor.
TASK_BYTES = 4 << 20


class Piece(NamedTuple):
    """Elements ``[first, first + count)`` of ``tensor`` (``index``: its place in the list
    being worked on), stored at bytes ``[start, start + nbytes)`` of the tensor."""

    index: int
    first: int
    count: int
    start: int
    nbytes: int


def cut(index: int, n_elements: int, unit_elems: int, unit_bytes: int,
        max_elements: int = PIECE_ELEMENTS) -> Iterator[Piece]:
    """A tensor's pieces: whole units, at most ``max_elements`` values each (one unit at
    least); a tensor of no elements is one empty piece, so that it is still reported."""
    per = max(1, max_elements // unit_elems) * unit_elems
    if n_elements == 0:
        yield Piece(index, 0, 0, 0, 0)
        return
    for first in range(0, n_elements, per):
        count = min(per, n_elements - first)
        yield Piece(index, first, count, first // unit_elems * unit_bytes,
                    -(-count // unit_elems) * unit_bytes)


def tasks_of(pieces: Iterable[Piece], task_bytes: int | None = None) -> Iterator[list[Piece]]:
    """Pieces grouped into tasks of about ``task_bytes`` (``TASK_BYTES``) stored bytes, in
    order."""
    task_bytes = task_bytes or TASK_BYTES
    task: list[Piece] = []
    size = 0
    for piece in pieces:
        if task and size + piece.nbytes > task_bytes:
            yield task
            task, size = [], 0
        task.append(piece)
        size += piece.nbytes
    if task:
        yield task


def lcm(a: int, b: int) -> int:
    return a * b // math.gcd(a, b)


def run_ordered(work: Callable, tasks: Iterable, on_result: Callable, workers: int,
                window: int | None = None) -> None:
    """``on_result(work(task))`` for every task, in the tasks' order, ``work`` running in
    ``workers`` threads with at most ``window`` tasks started and not yet taken (which
    bounds memory).  The first failure stops the rest and is raised."""
    window = window or 2 * workers
    pool = ThreadPoolExecutor(max(1, workers), thread_name_prefix="tensorfs-facts")
    pending: deque = deque()
    try:
        for task in tasks:
            pending.append(pool.submit(work, task))
            while len(pending) >= window:
                on_result(pending.popleft().result())
        while pending:
            on_result(pending.popleft().result())
    finally:
        for future in pending:
            future.cancel()
        pool.shutdown(wait=True, cancel_futures=True)


class Scratch(threading.local):
    """Buffers a worker thread reuses from piece to piece: touching fresh memory costs more
    than the work on it (docs/internals/serving.md)."""

    def __init__(self):
        self.buffers: dict[str, np.ndarray] = {}

    def get(self, key: str, n: int, dtype) -> np.ndarray:
        buf = self.buffers.get(key)
        if buf is None or buf.size < n:
            buf = self.buffers[key] = np.empty(max(n, 1), dtype)
        return buf[:n]
