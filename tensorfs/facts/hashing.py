"""``tensorfs hash`` (docs/reference/facts.md): llama.cpp's ``llama-gguf-hash`` lines, for any
model tensorfs opens.

The line format, the order, the whole-model line, the UUIDv5 rule, the default algorithm
and what ``--check`` accepts are those of llama.cpp's ``examples/gguf-hash/gguf-hash.cpp``
(checked against the program itself in tests/facts/test_facts_hash.py):

* one line per tensor and algorithm, ``printf("%-8s  %s  %s\\n", type, hex, MODEL:NAME)``,
  per tensor xxh64, then sha1, then sha256, tensors in stored order; then one line per
  algorithm for the whole model (the tensors' bytes one after another, padding left out),
  named ``MODEL``; then ``uuid`` (never per tensor): UUIDv5 in llama.cpp's namespace of the
  same bytes (sha1 of the namespace's 16 bytes then the data, version and variant bits set);
* xxh64 with seed 0, its 64-bit value in big-endian hex; sha1/sha256 digests in hex;
* no algorithm named: xxh64, or with ``--check`` the strongest one the manifest has
  (sha256, sha1, xxh64, uuid);
* ``--check``: each line computed is looked up by (algorithm, name) in the manifest (the
  first three whitespace-separated fields of each of its lines); the model is good when
  nothing looked up mismatches and something was found.

A name that holds whitespace, a backslash or a character that is not printable is written
with Python escapes (``\\x20``, ``\\\\``, ``\\n``), so that every line stays one line of
three fields; other names are written as they are, as llama-gguf-hash writes them.
"""

from __future__ import annotations

import hashlib
import sys
import threading
import uuid
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

from tensorfs.convert.workers import usable_cpus
from tensorfs.errors import printable
from tensorfs.facts.files import MANIFEST_LIMIT, read_text_input
from tensorfs.facts.models import FactsError, open_model, source_of, stored_order
from tensorfs.facts.output import Progress
from tensorfs.facts.pieces import HASH_PIECE_BYTES
from tensorfs.sources.urls import shown_name

# uuid.uuid5(uuid.NAMESPACE_URL, 'en.wikipedia.org/wiki/Llama.cpp'), as gguf-hash.cpp has it
UUID_NAMESPACE = uuid.UUID("ef001206-dadc-5f6d-a15f-3359e577d4e5")

ALGORITHMS = ("xxh64", "sha1", "sha256")            # per-tensor lines, in this order
STRENGTH = ("sha256", "sha1", "xxh64", "uuid")      # --check's choice when none is named


class _XXH64:
    """xxhash's xxh64 with seed 0, its digest as llama-gguf-hash prints it."""

    def __init__(self):
        try:
            import xxhash  # optional: xxh64 only
        except ImportError:
            raise FactsError("xxh64 needs the xxhash package (pip install xxhash)") from None
        self._h = xxhash.xxh64(seed=0)

    def update(self, data) -> None:
        self._h.update(data)

    def hexdigest(self) -> str:
        return self._h.hexdigest()          # big-endian hex of the 64-bit value


def new_hasher(algorithm: str):
    if algorithm == "xxh64":
        return _XXH64()
    if algorithm == "uuid":
        h = hashlib.sha1()
        h.update(UUID_NAMESPACE.bytes)
        return h
    return hashlib.new(algorithm)


def final_value(algorithm: str, hasher) -> str:
    if algorithm == "uuid":
        return str(uuid.UUID(bytes=hasher.digest()[:16], version=5))
    return hasher.hexdigest()


def escaped(name: str) -> str:
    """``name`` as one field of a line (module docstring): unchanged unless it holds
    whitespace, a backslash or a character that is not printable."""
    if name.isprintable() and not any(ch.isspace() or ch == "\\" for ch in name):
        return name
    out = []
    for ch in name:
        if ch == "\\":
            out.append("\\\\")
        elif ch.isprintable() and not ch.isspace():
            out.append(ch)
        elif ch in "\n\r\t":
            out.append({"\n": "\\n", "\r": "\\r", "\t": "\\t"}[ch])
        else:
            code = ord(ch)
            out.append(f"\\x{code:02x}" if code < 0x100 else
                       f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}")
    return "".join(out)


def line(algorithm: str, value: str, name: str) -> str:
    return f"{algorithm:<8}  {value}  {name}"


# -- computing -------------------------------------------------------------------------------

@dataclass
class ModelHashes:
    """Per tensor (in stored order) and whole-model values, algorithm -> hex."""

    tensors: list[tuple[str, dict[str, str]]] = field(default_factory=list)
    model: dict[str, str] = field(default_factory=dict)


class _Lane:
    """One thread that works through what it is given in order: the whole-model hashers
    need the tensors' bytes in order, and one tensor's hasher its own bytes in order."""

    def __init__(self, name: str):
        self.pool = ThreadPoolExecutor(1, thread_name_prefix=name)
        self.queued = 0             # bytes given and not yet done (to balance tensor lanes)

    def submit(self, fn, *args) -> Future:
        return self.pool.submit(fn, *args)


class _Buffers:
    """At most ``count`` piece buffers in flight; one is free again once every lane that
    reads it is done with it."""

    def __init__(self, count: int, size: int):
        self._free = [bytearray(size) for _ in range(count)]
        self._cond = threading.Condition()
        self._users: dict[int, int] = {}

    def take(self, users: int) -> bytearray:
        with self._cond:
            while not self._free:
                self._cond.wait()
            buf = self._free.pop()
            self._users[id(buf)] = users
            return buf

    def done(self, buf: bytearray) -> None:
        with self._cond:
            left = self._users[id(buf)] = self._users[id(buf)] - 1
            if left == 0:
                del self._users[id(buf)]
                self._free.append(buf)
                self._cond.notify()


def hash_model(opened, algorithms: tuple[str, ...], per_tensor: bool = True,
               workers: int | None = None, progress: Progress | None = None) -> ModelHashes:
    """Every tensor's hashes and the whole model's, each byte read once.

    The pieces are read in stored order by reader threads; each whole-model algorithm has
    its own lane that hashes every piece in order, and the tensors are spread over the
    other lanes, a tensor's pieces in order on one lane.  So the whole-model hash of the
    slowest algorithm bounds the time: it is one sequential stream (a hash of a
    concatenation cannot be split), the per-tensor hashes run beside it."""
    workers = workers or usable_cpus()
    tensors = stored_order(opened.model)
    model_algorithms = [a for a in ALGORITHMS if a in algorithms] + \
        (["uuid"] if "uuid" in algorithms else [])
    tensor_algorithms = [a for a in ALGORITHMS if a in algorithms] if per_tensor else []
    model_lanes = {a: _Lane(f"tensorfs-hash-{a}") for a in model_algorithms}
    tensor_lanes = [_Lane("tensorfs-hash-tensor")
                    for _ in range(max(1, workers - len(model_lanes))) if tensor_algorithms]
    readers = ThreadPoolExecutor(max(2, min(8, workers)), thread_name_prefix="tensorfs-read")
    users = len(model_lanes) + (1 if tensor_lanes else 0)
    buffers = _Buffers(max(4, 2 * workers + 2), HASH_PIECE_BYTES)
    model_hashers = {a: new_hasher(a) for a in model_algorithms}
    out = ModelHashes()
    failed: list[BaseException] = []
    lock = threading.Lock()

    def fail(error: BaseException) -> None:
        with lock:
            failed.append(error)

    def read(source, offset: int, buf: bytearray, n: int) -> memoryview:
        view = memoryview(buf)[:n]
        source.read_into(offset, view)
        return view

    def feed_model(algorithm: str, read_done: Future, buf: bytearray) -> None:
        try:
            if not failed:
                model_hashers[algorithm].update(read_done.result())
        except BaseException as error:     # any exception: handed to the caller
            fail(error)
        finally:
            buffers.done(buf)

    def feed_tensor(lane: _Lane, state: dict, read_done: Future, buf: bytearray, n: int,
                    last: bool, slot: int) -> None:
        try:
            if not failed:
                data = read_done.result()
                for h in state.values():
                    h.update(data)
                if last:
                    out.tensors[slot] = (out.tensors[slot][0],
                                         {a: final_value(a, h) for a, h in state.items()})
        except BaseException as error:     # any exception: handed to the caller
            fail(error)
        finally:
            with lock:
                lane.queued -= n
            buffers.done(buf)
        if progress is not None:
            progress.update(n)

    try:
        for slot, tensor in enumerate(tensors):
            out.tensors.append((tensor.name, {}))
            if failed:
                break
            source = source_of(opened, tensor)
            state = {a: new_hasher(a) for a in tensor_algorithms}
            lane = None
            if tensor_lanes:
                with lock:
                    lane = min(tensor_lanes, key=lambda x: x.queued)
                    lane.queued += tensor.nbytes
            starts = range(0, tensor.nbytes, HASH_PIECE_BYTES) if tensor.nbytes else [0]
            for start in starts:
                if failed:
                    break
                n = min(HASH_PIECE_BYTES, tensor.nbytes - start)
                buf = buffers.take(users)
                read_done = readers.submit(read, source, tensor.offset + start, buf, n)
                for algorithm, model_lane in model_lanes.items():
                    model_lane.submit(feed_model, algorithm, read_done, buf)
                last = start + HASH_PIECE_BYTES >= tensor.nbytes
                if lane is not None:
                    lane.submit(feed_tensor, lane, state, read_done, buf, n, last, slot)
                elif progress is not None:
                    read_done.add_done_callback(lambda f, n=n: f.exception() or progress.update(n))
    finally:
        for lane in list(model_lanes.values()) + tensor_lanes:
            lane.pool.shutdown(wait=True)
        readers.shutdown(wait=True)
    if failed:
        raise failed[0]
    out.model = {a: final_value(a, h) for a, h in model_hashers.items()}
    return out


def hash_lines(hashes: ModelHashes, shown: str, algorithms: tuple[str, ...],
               per_tensor: bool = True) -> list[tuple[str, str, str]]:
    """(algorithm, value, name) in llama-gguf-hash's order."""
    prefix = escaped(shown)
    rows = []
    if per_tensor:
        for name, values in hashes.tensors:
            for a in ALGORITHMS:
                if a in algorithms:
                    rows.append((a, values[a], f"{prefix}:{escaped(name)}"))
    for a in ALGORITHMS + ("uuid",):
        if a in algorithms:
            rows.append((a, hashes.model[a], prefix))
    return rows


def sha256_of(view) -> str:
    """The sha256 of a file of a mount (anything with ``size`` and ``read_into``): the
    ``user.tensorfs.sha256`` xattr of a raw tensor file."""
    h = hashlib.sha256()
    buf = bytearray(min(max(view.size, 1), HASH_PIECE_BYTES))
    pos = 0
    while pos < view.size:
        n = view.read_into(pos, memoryview(buf)[:min(len(buf), view.size - pos)])
        if n <= 0:
            raise OSError(5, "short read while hashing")
        h.update(memoryview(buf)[:n])
        pos += n
    return h.hexdigest()


# -- manifests -------------------------------------------------------------------------------

@dataclass
class Manifest:
    path: str
    entries: dict[tuple[str, str], str]     # (algorithm, name) -> value, the first line wins
    algorithms: set[str]


def read_manifest(path: str) -> Manifest:
    """The lines llama-gguf-hash's ``manifest_verify`` would find: the first three
    whitespace-separated fields of each line; any other line is passed over, as there.
    The file is read only once it is known to be a regular file of at most
    ``MANIFEST_LIMIT`` bytes of UTF-8 text (``read_text_input``)."""
    text = read_text_input(path, "manifest", MANIFEST_LIMIT)
    entries: dict[tuple[str, str], str] = {}
    algorithms: set[str] = set()
    for raw in text.split("\n"):
        fields = raw.split(maxsplit=3)[:3]
        if fields and fields[0] in STRENGTH:
            algorithms.add(fields[0])
        if len(fields) >= 3:
            entries.setdefault((fields[0], fields[2]), fields[1])
    if not algorithms:
        raise FactsError(f"{printable(path)}: no line of the manifest is a hash line "
                         f"(xxh64, sha1, sha256 or uuid)")
    return Manifest(path, entries, algorithms)


def strongest(manifest: Manifest) -> str:
    return next(a for a in STRENGTH if a in manifest.algorithms)


@dataclass
class CheckResult:
    lines: list[str]
    status: str                     # "Success" | "Failure" | "Manifest Missing Entry"
    first_mismatch: tuple[str, str] | None = None     # (algorithm, name)


def check(rows: list[tuple[str, str, str]], manifest: Manifest) -> CheckResult:
    """llama-gguf-hash's verdict on the rows computed: any mismatch fails; nothing found
    is a missing entry; else success."""
    lines, found, first = [], False, None
    for algorithm, value, name in rows:
        expected = manifest.entries.get((algorithm, name))
        if expected is None:
            result = "Not Found"
        elif expected == value:
            result, found = "Ok", True
        else:
            result, found = "Mismatch", True
            first = first or (algorithm, name)
        lines.append(f"{line(algorithm, value, name)}  -  {result}")
    status = "Failure" if first else "Success" if found else "Manifest Missing Entry"
    return CheckResult(lines, status, first)


# -- the command -----------------------------------------------------------------------------

def chosen_algorithms(args, manifest: Manifest | None) -> tuple[str, ...]:
    chosen = {a for a in ("xxh64", "sha1", "sha256", "uuid") if getattr(args, a, False)}
    if getattr(args, "all", False):
        chosen |= set(ALGORITHMS)
    if not chosen:
        chosen = {strongest(manifest)} if manifest is not None else {"xxh64"}
    return tuple(a for a in ALGORITHMS + ("uuid",) if a in chosen)


def run(args, out=None) -> int:
    """The ``hash`` command; its exit status."""
    out = out or sys.stdout
    manifest = read_manifest(args.check) if args.check else None
    algorithms = chosen_algorithms(args, manifest)
    if manifest is not None and not manifest.algorithms & set(algorithms):
        # said before the model is read: nothing the model holds could be checked
        def listed(names):
            return ", ".join(a for a in STRENGTH if a in names)
        raise FactsError(f"{printable(manifest.path)}: the manifest has no "
                         f"{listed(algorithms)} lines (it has {listed(manifest.algorithms)}): "
                         f"check with --{strongest(manifest)}, or with no algorithm named")
    per_tensor = not args.no_layer
    with open_model(args.model, dict(args.storage_options or []), args.timeout) as opened:
        total = sum(t.nbytes for t in opened.model.tensors)
        with Progress(total, "hash") as progress:
            hashes = hash_model(opened, algorithms, per_tensor, progress=progress)
    rows = hash_lines(hashes, shown_name(args.model), algorithms, per_tensor)
    if manifest is None:
        out.write("".join(line(*row) + "\n" for row in rows))
        out.flush()
        return 0
    result = check(rows, manifest)
    present = "".join(f"  {a}" for a in STRENGTH if a in manifest.algorithms)
    out.write(f"manifest  {escaped(manifest.path)}{present}\n")
    out.write("".join(text + "\n" for text in result.lines))
    out.write(f"\nVerification results for {escaped(manifest.path)} - {result.status}\n")
    out.flush()
    if result.status == "Success":
        return 0
    if result.first_mismatch is not None:
        algorithm, name = result.first_mismatch
        raise FactsError(f"{manifest.path}: {name}: {algorithm} mismatch")
    raise FactsError(f"{manifest.path}: no line names {escaped(shown_name(args.model))} or "
                     f"its tensors with {', '.join(algorithms)} (llama-gguf-hash names a model "
                     f"as given on its command line: give MODEL the same way)")
