"""What ``tensorfs hash``, ``stats`` and ``diff`` share (docs/facts.md): the model
opened as a mount opens it, its tensors in stored order, each tensor read once in bounded
pieces, the pieces worked on by every core, a progress bar on a terminal.

A model is opened with ``tensorfs.api.open`` (the loader, sources and block cache a mount
uses), so every MODEL form works and whatever a mount refuses is refused here with the same
error.  Pieces are read with the sources' ``read_into`` into buffers each worker thread
reuses; the work on them runs in threads: ``pread``, hashlib, xxhash and numpy's loops
release the GIL on buffers this large (docs/facts.md, "Speed", says what was measured).
"""

from __future__ import annotations

import difflib
import math
import os
import stat
import sys
import threading
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Iterable, Iterator, NamedTuple

import numpy as np

from tensorfs import api
from tensorfs.convert.plan import ViewPlan, plan_view
from tensorfs.model import TensorInfo
from tensorfs.runtime.paths import walk_problem
from tensorfs.sources.location import is_url

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


def close_names(name: str, known, limit: int = 3) -> list[str]:
    """The names of ``known`` a user who typed ``name`` may have meant: those that extend it
    by a dotted part (``blk.0.attn_q`` -> ``blk.0.attn_q.weight``), then difflib's."""
    known = list(known)
    extended = sorted(k for k in known if k.startswith(name + "."))
    close = [k for k in difflib.get_close_matches(name, known, n=limit, cutoff=0.75)
             if k not in extended]
    return (extended + close)[:limit]


def no_tensor_named(model: str, name: str, known) -> FactsError:
    """The one line for a tensor name the model lacks, naming the close ones."""
    from tensorfs.errors import printable

    close = close_names(name, known)
    hint = f" (did you mean {', '.join(repr(printable(c)) for c in close)}?)" if close else ""
    return FactsError(f"{model}: no tensor named '{printable(name)}'{hint}")


# -- files the commands read and write ---------------------------------------------------------

# A manifest is at most this big: llama-gguf-hash's lines for 100,000 tensors with every
# algorithm take about 40 MiB.
MANIFEST_LIMIT = 64 << 20


def _kind(mode: int) -> str:
    for test, what in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISSOCK, "a socket"), (stat.S_ISLNK, "a symbolic link")):
        if test(mode):
            return what
    return "not a regular file"


def read_text_input(path: str, what: str, limit: int) -> str:
    """The text of a small file the user named (``what``: "manifest"), read only once it
    is known to be a regular file of at most ``limit`` bytes: opened without blocking (a
    FIFO would wait for a writer), checked with fstat, read up to ``limit`` + 1 bytes (it
    may grow), decoded as strict UTF-8.  Any problem is one ``FactsError`` line."""
    from tensorfs.errors import printable

    shown = printable(path)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except OSError as error:
        raise FactsError(f"{shown}: cannot read the {what}: "
                         f"{error.strerror or error}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise FactsError(f"{shown}: the {what} is {_kind(st.st_mode)}, not a regular file")
        if st.st_size > limit:
            raise FactsError(f"{shown}: the {what} is {st.st_size:,} bytes, more than a "
                             f"{what} can be ({limit:,})")
        chunks, size = [], 0
        while size <= limit:
            chunk = os.read(fd, min(1 << 20, limit + 1 - size))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        if size > limit:
            raise FactsError(f"{shown}: the {what} grew past {limit:,} bytes while read")
    except OSError as error:
        raise FactsError(f"{shown}: cannot read the {what}: "
                         f"{error.strerror or error}") from None
    finally:
        os.close(fd)
    data = b"".join(chunks)
    if b"\0" in data:
        raise FactsError(f"{shown}: the {what} holds NUL bytes: not a text file")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as error:
        line_no = data.count(b"\n", 0, error.start) + 1
        raise FactsError(f"{shown}: line {line_no} of the {what} is not UTF-8 text") from None


def _others_link(directory: str) -> str | None:
    """Why ``directory`` is a path someone else controls (a link or a directory of another
    user's on the way, or one anyone may write without the sticky bit: a file made below it
    could land where they chose), or None: ``tensorfs.runtime.paths``'s one rule."""
    return walk_problem(directory, os.geteuid())


def _open_output_directory(path: str, what: str) -> tuple[int, str]:
    """(a descriptor of the directory ``path`` is in, its last component), after the
    checks ``output_problem`` describes; the file is then made and renamed relative to the
    descriptor, so the directory cannot be swapped between the checks and the writing."""
    from tensorfs.errors import printable

    shown = printable(path)
    directory = os.path.dirname(path) or "."
    base = os.path.basename(path)
    if not base or base in (".", ".."):
        raise FactsError(f"{shown}: cannot write the {what}: not a file name")
    link = _others_link(directory)
    if link is not None:
        raise FactsError(f"{shown}: cannot write the {what}: {printable(link)}")
    try:
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except FileNotFoundError:
        raise FactsError(f"{shown}: cannot write the {what}: no directory "
                         f"{printable(directory)}") from None
    except OSError as error:
        raise FactsError(f"{shown}: cannot write the {what}: "
                         f"{error.strerror or error}") from None
    try:
        st = os.stat(base, dir_fd=fd, follow_symlinks=False)
    except FileNotFoundError:
        return fd, base
    except OSError as error:
        os.close(fd)
        raise FactsError(f"{shown}: cannot write the {what}: "
                         f"{error.strerror or error}") from None
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        if stat.S_ISLNK(st.st_mode):
            raise FactsError(f"{shown}: cannot write the {what}: it is a symbolic link, "
                             f"never written through (name the file itself)")
        raise FactsError(f"{shown}: cannot write the {what}: it is {_kind(st.st_mode)}, "
                         f"not a regular file")
    return fd, base


def _umask() -> int:
    """The process's umask, read where Linux states it (setting it to learn it would change
    it for every thread meanwhile)."""
    try:
        with open("/proc/self/status", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o077)
    os.umask(mask)
    return mask


def output_problem(path: str, what: str = "output") -> str | None:
    """Why ``path`` cannot be an output file, or None.  It is written as a new file in its
    directory renamed over the name (``write_output``), so: its directory exists and is
    reached through no symbolic link that another user owns, and what is at the name is
    nothing or a regular file, never a link (that another user may have planted to make
    us write elsewhere), a directory, a FIFO or a device."""
    try:
        fd, _ = _open_output_directory(path, what)
    except FactsError as error:
        return str(error)
    os.close(fd)
    return None


def write_output(path: str, write: Callable, what: str = "output") -> None:
    """``write(f)`` into a new file (``O_CREAT|O_EXCL|O_NOFOLLOW``, mode 0600 while written)
    in the directory of ``path``, then renamed over ``path`` (both relative to one
    descriptor of the directory): nothing is ever written through a link or into a file
    someone else planted or holds open; the final mode is 0666 less the umask, as any new
    file's.  A problem is one ``FactsError`` line."""
    from tensorfs.errors import printable

    fd_dir, base = _open_output_directory(path, what)
    umask = _umask()
    temp = None
    try:
        for _ in range(100):
            candidate = f".{base}.{os.urandom(6).hex()}.tmp"
            try:
                fd = os.open(candidate, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
                             | os.O_CLOEXEC, 0o600, dir_fd=fd_dir)
            except FileExistsError:
                continue
            temp = candidate
            break
        else:
            raise FactsError(f"{printable(path)}: cannot write the {what}: no free "
                             f"temporary name")
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fchmod(f.fileno(), 0o666 & ~umask)
        os.rename(temp, base, src_dir_fd=fd_dir, dst_dir_fd=fd_dir)
        temp = None
    except OSError as error:
        raise FactsError(f"{printable(path)}: cannot write the {what}: "
                         f"{error.strerror or error}") from None
    finally:
        if temp is not None:
            try:
                os.unlink(temp, dir_fd=fd_dir)
            except OSError:
                pass
        os.close(fd_dir)


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


# -- sums that cannot overflow -------------------------------------------------------------

def ldexp_or_inf(x: float, e: int) -> float:
    """``x * 2**e``, an infinity where that is past float64 (``math.ldexp`` raises)."""
    try:
        return math.ldexp(x, e)
    except OverflowError:
        return math.copysign(math.inf, x)


# The scale of values that are all zero: below every float64's exponent (a subnormal's is
# -1073 at least), so that merging with any other scale keeps the other.
ZERO_SCALE = -1100


# Values whose largest |value| lies within 2**±SAFE_EXPONENT need no scaling: their squares
# and the sums of a piece's squares (2**20 values at most) are far from float64's range,
# and a value too small to count beside the largest one underflows harmlessly.  Scale 0
# then, which skips a pass over the piece (the usual case: weights are near 1).
SAFE_EXPONENT = 300


def scale_of(absmax: float) -> int:
    """The power of two a piece's values are divided by (``absmax``: their largest |value|,
    finite): 0 within the safe range, else the power of two at least ``absmax``, so that
    the values divided are within [-1, 1] and their squares' sums far from overflow and
    underflow."""
    if absmax == 0:
        return ZERO_SCALE
    exponent = math.frexp(absmax)[1]
    return 0 if -SAFE_EXPONENT <= exponent <= SAFE_EXPONENT else exponent


def scale_down(x: np.ndarray, scale: int) -> None:
    """``x /= 2**scale`` in place, exactly (a power of two), for any scale a float64 has."""
    if scale == 0:
        return
    if -1022 <= -scale <= 1023:
        np.multiply(x, math.ldexp(1.0, -scale), out=x)
    else:                       # 2**-scale itself is not a normal float64
        np.ldexp(x, -scale, out=x)


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
                from tqdm import tqdm  # optional: a terminal only
            except ImportError:         # a plain install has it; a bare one just shows nothing
                return
            self.bar = tqdm(total=total, desc=what, unit="B", unit_scale=True,
                            unit_divisor=1024, leave=False, file=sys.stderr,
                            dynamic_ncols=True)

    def update(self, n: int) -> None:
        if self.bar is not None and n:
            self.bar.update(n)

    def write_above(self, out, text: str) -> None:
        """``text`` (whole lines) on ``out`` with the bar cleared first and drawn again
        after, so that a row never lands on the bar's line when both go to one terminal."""
        if self.bar is None:
            out.write(text)
            out.flush()
            return
        with self.bar.get_lock():
            self.bar.clear()
            out.write(text)
            out.flush()
            self.bar.refresh()

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


class Table:
    """A table's rows as they come: aligned columns for a person (``aligned``: stdout is a
    terminal and ``--tsv`` was not given), tab-separated otherwise.  The widths are fixed
    before the first row from what is known then (``widths``: at least the header's), so
    rows can be printed as each tensor is done; a cell wider than its column pushes the
    rest of its row right rather than being cut."""

    def __init__(self, out, columns, widths=None, aligned: bool = False,
                 progress: "Progress | None" = None):
        self.out = out
        self.columns = list(columns)
        self.aligned = aligned
        self.progress = progress
        self.widths = [max(len(c), (widths or {}).get(c, 0)) for c in self.columns]

    def line(self, cells) -> str:
        cells = list(cells)
        if not self.aligned:
            return "\t".join(cells) + "\n"
        parts, owed = [], 0
        for i, cell in enumerate(cells):
            if i == len(cells) - 1:
                parts.append(cell)
                break
            width = max(0, self.widths[i] - owed) if i < len(self.widths) else 0
            parts.append(cell.ljust(width))
            owed = max(0, len(cell) - width)
        return "  ".join(parts).rstrip() + "\n"

    def write(self, text: str) -> None:
        if self.progress is not None:
            self.progress.write_above(self.out, text)
        else:
            self.out.write(text)
            self.out.flush()

    def header(self) -> None:
        self.write(self.line(self.columns))

    def row(self, cells) -> None:
        self.write(self.line(cells))


def wants_aligned(args, out) -> bool:
    """Aligned columns when the table goes to a terminal and ``--tsv`` was not asked for."""
    return not getattr(args, "tsv", False) and _is_terminal(out)


# a float cell of ``fmt``: "-1.23457e-308" at most
NUMBER_WIDTH = 13


def fmt(x) -> str:
    """A number in a table: integers exact, floats with 6 significant digits."""
    if x is None:
        return "-"
    if isinstance(x, (int, np.integer)):
        return str(int(x))
    return f"{float(x):.6g}"
