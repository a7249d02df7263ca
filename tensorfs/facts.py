"""What ``tensorfs hash``, ``stats`` and ``diff`` share (SPEC §12, docs/facts.md): the model
opened as a mount opens it, its tensors in stored order, each tensor read once in bounded
pieces, the pieces worked on by every core, a progress bar on a terminal.

A model is opened with ``tensorfs.api.open`` (the loader, sources and block cache a mount
uses), so every MODEL form works and whatever a mount refuses is refused here with the same
error.  Pieces are read with the sources' ``read_into`` into buffers each worker thread
reuses; the work on them runs in threads: ``pread``, hashlib, xxhash and numpy's loops
release the GIL on buffers this large (docs/facts.md, "Speed", says what was measured).
"""

from __future__ import annotations

import math
import sys
import threading
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Iterable, Iterator, NamedTuple

import numpy as np

from tensorfs import api
from tensorfs.location import is_url
from tensorfs.model import TensorInfo
from tensorfs.plan import ViewPlan, plan_view

# A piece of a tensor whose values are worked on at once: at most this many elements (its
# float64 copy is 8 MiB), cut on block boundaries.
PIECE_ELEMENTS = 1 << 20
# A piece of stored bytes hashed at once.
HASH_PIECE_BYTES = 8 << 20
# Tensors smaller than this are grouped into one task with their neighbours, so that a
# model of 100k small tensors costs one task per few MiB, not one per tensor.
TASK_BYTES = 4 << 20


class FactsError(Exception):
    """Something the user named that a fact command cannot use (a manifest, a tensor name):
    one line, like a ``ModelError``."""


def open_model(model: str, storage_options: dict | None = None, timeout: float | None = None):
    """``tensorfs.api.open`` of what the user named: any MODEL form, with the remote options
    for a URL only."""
    if is_url(model):
        return api.open(model, storage_options=storage_options, timeout=timeout)
    return api.open(model)


def stored_order(model) -> list[TensorInfo]:
    """The tensors in the order their bytes are stored: file by file, a GGUF's in the order
    of its tensor infos (llama-gguf-hash's order), a safetensors file's by offset (so the
    whole-model hash of one file is that of its data section)."""
    out: list[TensorInfo] = []
    for f in model.files:
        tensors = list(f.tensors)
        if f.format == "safetensors":
            tensors.sort(key=lambda t: (t.offset, t.nbytes))
        out.extend(tensors)
    return out


def source_of(open_model_, tensor: TensorInfo):
    """The source a tensor's bytes are read from: the one its file was parsed from."""
    return open_model_.model.sources[tensor.file]


# -- values ---------------------------------------------------------------------------------

class Values(NamedTuple):
    """How a tensor's stored bytes become the values of its ``.npy`` view: whole units of
    ``unit_bytes`` stored bytes give ``unit_elems`` values each."""

    plan: ViewPlan
    unit_elems: int
    unit_bytes: int

    @property
    def exists(self) -> bool:
        return self.plan.kind is not None

    def of(self, raw: np.ndarray, out32: np.ndarray | None = None) -> np.ndarray:
        """The values of ``raw`` (uint8, whole units): the view's own dtype for a native type,
        float32 for a converted one (into ``out32`` when given)."""
        if self.plan.kind == "native":
            return raw.view(np.dtype(self.plan.npy_dtype))
        n = raw.size // self.unit_bytes * self.unit_elems
        out = None if out32 is None else out32[:n]
        return self.plan.conversion.convert(raw, out=out)


def values_of(tensor: TensorInfo, plan: ViewPlan | None = None) -> Values:
    plan = plan or plan_view(tensor)
    if plan.kind == "native":
        return Values(plan, 1, np.dtype(plan.npy_dtype).itemsize)
    if plan.kind == "converted":
        return Values(plan, plan.conversion.block_elems, plan.conversion.block_bytes)
    return Values(plan, 1, 1)


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


def tasks_of(pieces: Iterable[Piece], task_bytes: int = TASK_BYTES) -> Iterator[list[Piece]]:
    """Pieces grouped into tasks of about ``task_bytes`` stored bytes, in order."""
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


# -- running ---------------------------------------------------------------------------------

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
    than the work on it (docs/serving.md)."""

    def __init__(self):
        self.buffers: dict[str, np.ndarray] = {}

    def get(self, key: str, n: int, dtype) -> np.ndarray:
        buf = self.buffers.get(key)
        if buf is None or buf.size < n:
            buf = self.buffers[key] = np.empty(max(n, 1), dtype)
        return buf[:n]


# -- progress --------------------------------------------------------------------------------

class Progress:
    """A tqdm bar of bytes on stderr when stderr is a terminal; nothing otherwise."""

    def __init__(self, total: int, what: str):
        self.bar = None
        if total > 0 and _is_terminal(sys.stderr):
            try:
                from tqdm import tqdm       # optional: a terminal only
            except ImportError:         # a plain install has it; a bare one just shows nothing
                return
            self.bar = tqdm(total=total, desc=what, unit="B", unit_scale=True,
                            unit_divisor=1024, leave=False, file=sys.stderr,
                            dynamic_ncols=True)

    def update(self, n: int) -> None:
        if self.bar is not None and n:
            self.bar.update(n)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None

    def __enter__(self) -> "Progress":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _is_terminal(stream) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


# -- output ----------------------------------------------------------------------------------

def json_number(x):
    """A float as JSON can hold it: non-finite values as "nan", "inf", "-inf" (as
    metadata.json writes them); integers as they are."""
    if isinstance(x, (int, np.integer)) and not isinstance(x, bool):
        return int(x)
    if x is None:
        return None
    x = float(x)
    if math.isnan(x):
        return "nan"
    if math.isinf(x):
        return "inf" if x > 0 else "-inf"
    return x


def fmt(x) -> str:
    """A number in a table: integers exact, floats with 6 significant digits."""
    if x is None:
        return "-"
    if isinstance(x, (int, np.integer)):
        return str(int(x))
    return f"{float(x):.6g}"
