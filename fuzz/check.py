"""What every fuzz input must satisfy, and the mutators that make the inputs.

Shared by ``tests/test_fuzz.py`` (hypothesis, in the suite) and ``fuzz/fuzz_parsers.py``
(atheris, for long runs), so both hold a parser to the same contract (issue 5):

* every input either parses into a model whose every tensor lies inside the file
  (``header_size <= offset`` and ``offset + nbytes <= file_size``, no two overlapping, sizes
  consistent with dtype and shape), or raises the parser's own error type with a kind from
  its ``KINDS`` / ``ERROR_KINDS`` and a one-line message; nothing else escapes;
* fed a short prefix and grown the way ``tensorfs.sources.modelfile`` grows it, the parser asks only
  for more bytes of the file (``NeedMoreBytes`` makes progress, never past ``file_size``)
  and ends with the same answer as on the whole buffer;
* what a mount would build from an accepted model (names, view plans, metadata.json)
  builds without an exception;
* memory: ``tracemalloc``'s peak during a parse stays within ``PARSE_BYTES_PER_INPUT_BYTE``
  times the input plus ``PARSE_FIXED_BYTES``; decoding every metadata value within
  ``DECODE_BYTES_PER_INPUT_BYTE`` times the input plus the same constant.  A count or a
  length the file merely claims must never size an allocation;
* time: each input is checked under a ``signal.setitimer`` alarm; a hang raises
  ``Violation`` instead of hanging the run.

A failed property raises ``Violation`` (an ``AssertionError``).
"""

from __future__ import annotations

import json
import random
import signal
import struct
import tracemalloc
from contextlib import contextmanager

from tensorfs.errors import GGUFError, SafetensorsError
from tensorfs.formats import NeedMoreBytes
from tensorfs.formats import gguf as gguf_format
from tensorfs.formats import safetensors as st_format

# Python objects cost more than the bytes they come from (a 26-byte GGUF tensor record
# becomes a TensorInfo of some 500 bytes; a 4-byte float in an array a 32-byte float
# object plus its list slot): these factors are what that costs at worst, with room.
# They are still linear: a claimed count of 2**32 in a 300-byte file breaks them at once.
PARSE_BYTES_PER_INPUT_BYTE = 48
DECODE_BYTES_PER_INPUT_BYTE = 96
PARSE_FIXED_BYTES = 2 << 20
TIME_LIMIT_S = 5.0              # per input of at most a few hundred KiB (none is near it)

BOUNDARY_VALUES = (0, 1, 2, 3, 4, 5, 7, 8, 31, 32, 255, 256, 2**16 - 1, 2**16,
                   2**31 - 1, 2**31, 2**32 - 1, 2**32, 2**53 + 1, 2**63 - 1, 2**63,
                   2**64 - 1)

PARSERS = {
    "gguf": (gguf_format.parse_gguf, GGUFError, frozenset(gguf_format.KINDS)),
    "safetensors": (st_format.parse_safetensors, SafetensorsError,
                    frozenset(st_format.ERROR_KINDS)),
}


class Violation(AssertionError):
    """An input broke the contract above."""


class _Timeout(BaseException):
    """Raised by the alarm; a BaseException so no ``except Exception`` in the parser eats it."""


@contextmanager
def time_limit(seconds: float):
    """Raise ``Violation`` if the body runs longer than ``seconds`` (main thread only)."""
    def on_alarm(signum, frame):
        raise _Timeout()

    previous = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    except _Timeout:
        raise Violation(f"input not handled within {seconds} s (a hang)") from None
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


class _Peak:
    """tracemalloc's peak over a block, in bytes above what was traced when it began."""

    def __init__(self):
        self.bytes = 0

    def __enter__(self):
        self._started = not tracemalloc.is_tracing()
        if self._started:
            tracemalloc.start()
        tracemalloc.reset_peak()
        self._base = tracemalloc.get_traced_memory()[0]
        return self

    def __exit__(self, *exc):
        self.bytes = tracemalloc.get_traced_memory()[1] - self._base
        if self._started:
            tracemalloc.stop()
        return False


def _outcome(model_or_error):
    """What two parses must agree on."""
    if isinstance(model_or_error, Exception):
        e = model_or_error
        return ("error", type(e).__name__, e.kind, e.offset, e.message)
    m = model_or_error
    return ("model", m.header_size, m.file_size, m.alignment, m.endianness, tuple(m.metadata),
            tuple((t.name, t.dtype, t.shape, t.offset, t.nbytes) for t in m.tensors))


def _parse_whole(fmt: str, data: bytes, memory: bool):
    parse, error_type, kinds = PARSERS[fmt]
    peak = _Peak() if memory else None
    try:
        if peak:
            with peak:
                result = parse(data, len(data), path="fuzz")
        else:
            result = parse(data, len(data), path="fuzz")
    except error_type as error:
        result = error
    except NeedMoreBytes as more:
        raise Violation(f"{fmt}: NeedMoreBytes({more.needed}) with the whole "
                        f"{len(data)}-byte file in hand") from None
    except Exception as error:
        raise Violation(f"{fmt}: {type(error).__name__} escaped the parser: {error}") from error
    if peak and peak.bytes > PARSE_BYTES_PER_INPUT_BYTE * len(data) + PARSE_FIXED_BYTES:
        raise Violation(f"{fmt}: parsing {len(data)} bytes peaked at {peak.bytes} bytes "
                        "of allocations")
    return result, (peak.bytes if peak else 0)


def _check_error(fmt: str, error, data: bytes) -> None:
    _, _, kinds = PARSERS[fmt]
    if error.kind not in kinds:
        raise Violation(f"{fmt}: error kind {error.kind!r} is not in the parser's list")
    text = str(error)
    if "\n" in text or "\r" in text or not text:
        raise Violation(f"{fmt}: error message is not one line: {text!r}")
    if error.offset is not None and (type(error.offset) is not int or error.offset < 0):
        raise Violation(f"{fmt}: error offset {error.offset!r}")


def _check_model(fmt: str, model, data: bytes, memory: bool) -> int:
    from tensorfs.dtypes import GGML_TYPES, SAFETENSORS_DTYPES

    size = len(data)
    if model.file_size != size or not 0 <= model.header_size <= size:
        raise Violation(f"{fmt}: file_size {model.file_size}, header_size {model.header_size} "
                        f"for a {size}-byte file")
    spans = []
    names = set()
    for t in model.tensors:
        if t.name in names:
            raise Violation(f"{fmt}: tensor {t.name!r} twice")
        names.add(t.name)
        if not (model.header_size <= t.offset and t.nbytes >= 0
                and t.offset + t.nbytes <= size):
            raise Violation(f"{fmt}: tensor {t.name!r} at [{t.offset}, {t.offset + t.nbytes}) "
                            f"is not inside the data of a {size}-byte file "
                            f"(header {model.header_size})")
        count = 1
        for d in t.shape:
            if type(d) is not int or d < 0:
                raise Violation(f"{fmt}: tensor {t.name!r} shape {t.shape}")
            count *= d
        if fmt == "gguf":
            gt = GGML_TYPES[t.ggml_type]
            want = count // gt.block_size * gt.type_size
            if count % gt.block_size:
                raise Violation(f"{fmt}: {t.name!r}: {count} elements of {gt.name}")
        else:
            want = count * SAFETENSORS_DTYPES[t.dtype].bits // 8
        if want != t.nbytes:
            raise Violation(f"{fmt}: tensor {t.name!r} {t.dtype} {t.shape} has nbytes "
                            f"{t.nbytes}, its shape says {want}")
        if t.nbytes:
            spans.append((t.offset, t.offset + t.nbytes, t.name))
    spans.sort()
    for (a0, a1, an), (b0, b1, bn) in zip(spans, spans[1:]):
        if b0 < a1:
            raise Violation(f"{fmt}: tensors {an!r} and {bn!r} overlap")

    peak = _Peak() if memory else None
    try:
        if peak:
            with peak:
                for value in model.metadata.values():
                    value.value()
        else:
            for value in model.metadata.values():
                value.value()
    except Exception as error:
        raise Violation(f"{fmt}: decoding a metadata value raised {error!r}") from error
    if peak and peak.bytes > DECODE_BYTES_PER_INPUT_BYTE * size + PARSE_FIXED_BYTES:
        raise Violation(f"{fmt}: decoding the metadata of {size} bytes peaked at "
                        f"{peak.bytes} bytes")
    _check_downstream(fmt, model)
    return peak.bytes if peak else 0


def _check_downstream(fmt: str, model) -> None:
    """What a mount builds from the model, short of FUSE, must not raise either."""
    from tensorfs.model import Model
    from tensorfs.mount.metadata_json import metadata_document, metadata_json_bytes
    from tensorfs.mount.tree import describe

    try:
        whole = Model.single(model)
        for layout in ("tree", "flat"):
            paths, plans = describe(whole, layout)
            raw = [paths[t.name].raw for t in model.tensors]
            if len(set(raw)) != len(raw):
                raise Violation(f"{fmt}: two tensors share a path in the {layout} layout")
        json.loads(metadata_json_bytes(metadata_document(whole, paths, plans)),
                   parse_constant=_refuse_constant)         # strict JSON: no bare NaN
    except Violation:
        raise
    except Exception as error:
        raise Violation(f"{fmt}: building the mount's description raised {error!r}") from error


def _parse_grown(fmt: str, data: bytes, first: int):
    """The loader's loop, with the smallest growth the parser asks for."""
    parse, error_type, _ = PARSERS[fmt]
    size = len(data)
    n = min(size, first)
    for step in range(10_000):
        try:
            return parse(data[:n], size, path="fuzz")
        except error_type as error:
            return error
        except NeedMoreBytes as more:
            if not n < more.needed <= size:
                raise Violation(f"{fmt}: with {n} of {size} bytes the parser asked for "
                                f"{more.needed}") from None
            # the loader doubles; after a few exact steps, do the same to stay linear
            n = more.needed if step < 32 else min(size, max(more.needed, 2 * n))
        except Exception as error:
            raise Violation(f"{fmt}: {type(error).__name__} escaped the parser on a "
                            f"{n}-byte prefix: {error}") from error
    raise Violation(f"{fmt}: the prefix never grew to an answer")


def check(data: bytes, fmt: str, *, memory: bool = True, prefix: int | None = 16,
          seconds: float | None = TIME_LIMIT_S) -> dict:
    """Check one input against one parser; raises ``Violation``.  Returns what happened:
    ``{"outcome": "model" | kind, "parse_peak": bytes, "decode_peak": bytes}``."""
    data = bytes(data)

    def run():
        result, parse_peak = _parse_whole(fmt, data, memory)
        decode_peak = 0
        if isinstance(result, Exception):
            _check_error(fmt, result, data)
        else:
            decode_peak = _check_model(fmt, result, data, memory)
        if prefix is not None and prefix < len(data):
            grown = _parse_grown(fmt, data, prefix)
            if _outcome(grown) != _outcome(result):
                raise Violation(f"{fmt}: a {prefix}-byte first prefix gives "
                                f"{_outcome(grown)[:3]}, the whole file {_outcome(result)[:3]}")
        return {"outcome": "model" if not isinstance(result, Exception) else result.kind,
                "parse_peak": parse_peak, "decode_peak": decode_peak}

    if seconds is None:
        return run()
    with time_limit(seconds):
        return run()


def check_both(data: bytes, **kwargs) -> dict:
    """Every input through every parser: each must refuse the others' files properly too
    (the PyTorch reader under ``check_pytorch``: it reads where it asks, not a prefix)."""
    out = {fmt: check(data, fmt, **kwargs) for fmt in PARSERS}
    out["pytorch"] = check_pytorch(data, memory=kwargs.get("memory", True),
                                   seconds=kwargs.get("seconds", TIME_LIMIT_S))
    return out


# ---------------------------------------------------------------------------------------
# PyTorch checkpoints: the zip and the pickle walked; the composed safetensors read whole.
# ---------------------------------------------------------------------------------------

def check_pytorch(data: bytes, *, memory: bool = True,
                  seconds: float | None = TIME_LIMIT_S) -> dict:
    """The contract for ``tensorfs.formats.pytorch``: a model whose tensors lie inside their
    storages inside the file, or a ``PytorchError`` of a listed kind in one line; bounded
    memory; and the safetensors file composed from an accepted one reads whole, as long
    as it says, into the file ``safetensors`` parses (the composition's own check)."""
    from tensorfs.errors import PytorchError
    from tensorfs.formats import pytorch
    from tensorfs.loading.checkpoints import BytesSource, compose_checkpoint

    data = bytes(data)
    size = len(data)

    def read(offset, n):
        return data[offset:offset + n]

    def run():
        peak = _Peak() if memory else None
        try:
            if peak:
                with peak:
                    result = pytorch.parse_pytorch(read, size, path="fuzz")
            else:
                result = pytorch.parse_pytorch(read, size, path="fuzz")
        except PytorchError as error:
            if error.kind not in pytorch.KINDS:
                raise Violation(f"pytorch: error kind {error.kind!r} is not in KINDS") from None
            text = str(error)
            if "\n" in text or "\r" in text or not text:
                raise Violation(f"pytorch: error message is not one line: {text!r}") from None
            if error.offset is not None and (type(error.offset) is not int or error.offset < 0):
                raise Violation(f"pytorch: error offset {error.offset!r}") from None
            return {"outcome": error.kind}
        except Exception as error:
            raise Violation(f"pytorch: {type(error).__name__} escaped the parser: "
                            f"{error}") from error
        if peak and peak.bytes > PARSE_BYTES_PER_INPUT_BYTE * size + PARSE_FIXED_BYTES:
            raise Violation(f"pytorch: parsing {size} bytes peaked at {peak.bytes} bytes")
        for t in result.tensors:
            count = 1
            for d in t.shape:
                count *= d
            if t.nbytes != count * pytorch.ITEMSIZE[t.dtype]:
                raise Violation(f"pytorch: tensor {t.name!r} nbytes {t.nbytes}")
            end = t.offset + t.nbytes
            if t.strides is not None:
                end = t.offset + (sum((d - 1) * st for d, st in zip(t.shape, t.strides)) + 1) \
                    * pytorch.ITEMSIZE[t.dtype]
            if count and not (result.header_size <= t.offset and end <= size):
                raise Violation(f"pytorch: tensor {t.name!r} reaches outside the file")
        try:
            composed, composed_file, _ = compose_checkpoint(
                result, BytesSource("fuzz", data, None), "fuzz")
            whole = composed.read(0, composed.size)
        except Exception as error:
            raise Violation(f"pytorch: composing the safetensors file raised {error!r}") \
                from error
        if len(whole) != composed.size or composed.size != composed_file.file_size:
            raise Violation("pytorch: the composed file reads short")
        return {"outcome": "model"}

    if seconds is None:
        return run()
    with time_limit(seconds):
        return run()


def _pickled_tensor(storage: str, key: str, numel: int, offset: int, shape, strides) -> bytes:
    """What torch.save writes for one tensor (protocol 2), written here without torch."""
    def ints(values):
        return b"(" + b"".join(b"J" + struct.pack("<i", v) for v in values) + b"t"
    return (b"ctorch._utils\n_rebuild_tensor_v2\n(" +
            b"(X\x07\x00\x00\x00storagectorch\n" + storage.encode() + b"\n" +
            b"X" + struct.pack("<I", len(key)) + key.encode() +
            b"X\x03\x00\x00\x00cpuJ" + struct.pack("<i", numel) + b"tQ" +
            b"J" + struct.pack("<i", offset) + ints(shape) + ints(strides) +
            b"\x89ccollections\nOrderedDict\n)RtR")


def pytorch_checkpoint(entries: list[tuple[str, bytes]], tensors: list[tuple[str, bytes]],
                       prefix: str = "archive") -> bytes:
    """A torch.save zip (stored entries) holding an OrderedDict of ``tensors`` (name,
    pickled tensor) and the storages ``entries`` (key, bytes): a seed needing no torch."""
    import io
    import zipfile

    pkl = b"\x80\x02ccollections\nOrderedDict\n)R("
    for name, tensor in tensors:
        pkl += b"X" + struct.pack("<I", len(name.encode())) + name.encode() + tensor
    pkl += b"u."
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_STORED) as z:
        z.writestr(f"{prefix}/data.pkl", pkl)
        z.writestr(f"{prefix}/byteorder", b"little")
        for key, raw in entries:
            z.writestr(f"{prefix}/data/{key}", raw)
        z.writestr(f"{prefix}/version", b"3\n")
    return out.getvalue()


def mutate_pytorch(data: bytes, rng: random.Random, pool=()) -> bytes:
    """A checkpoint with its data.pkl's bytes mutated (the zip rebuilt around it, so the
    walker, not the container check, meets the change), or one of its other entries."""
    import io
    import warnings
    import zipfile

    with zipfile.ZipFile(io.BytesIO(data)) as z:
        entries = [(i.filename, z.read(i.filename)) for i in z.infolist()]
    which = rng.randrange(len(entries))
    if rng.random() < 0.7:
        which = next((i for i, (n, _) in enumerate(entries) if n.endswith("/data.pkl")), which)
    name, body = entries[which]
    if rng.random() < 0.4 and name.endswith("/data.pkl"):
        body = splice_pickle(body, rng)
    else:
        entries[which] = (name, mutate_bytes(body, rng, pool, len(body)) if body else body)
        body = entries[which][1]
    entries[which] = (name, body)
    if rng.random() < 0.15:                     # names torch's reader finds another way
        i = rng.randrange(len(entries))
        n, b = entries[i]
        entries.append((rng.choice([n, n.upper(), n.replace("/", "/./", 1)]), b))
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_STORED) as z, warnings.catch_warnings():
        warnings.simplefilter("ignore")             # a duplicate name is meant
        for name, body in entries:
            z.writestr(name, body)
    data = out.getvalue()
    return zip_trick(data, rng) if rng.random() < 0.2 else data


# What torch's weights-only reader meets in a pickle, spliced in at an opcode boundary: every
# opcode of protocols 0 to 5 with a small argument, globals on and off its allow-list, the
# rebuild arguments it applies (requires_grad, metadata's neg/conj, a tensor's state), large
# integers and values, memo reuse.
_SPLICES = [
    b"K\x01", b"J\xff\xff\xff\x7f", b"M\xff\xff", b"\x8a\xff" + b"\x7f" * 255, b"I1\n",
    b"L" + b"9" * 5000 + b"L\n", b"\x8b\x00\x10\x00\x00" + b"\xff" * 4096, b"F1e999\n",
    b"G\x7f\xf8\x00\x00\x00\x00\x00\x00", b"X\x02\x00\x00\x00\xed\xa0", b"U\x01\xe9",
    b"\x8c\x01a", b"C\x01a", b"B\x01\x00\x00\x00a", b"\x96\x01" + bytes(7) + b"a", b"N", b"\x88",
    b"\x89", b")", b"]", b"}", b"\x8f", b"(", b"t", b"\x85", b"\x86", b"\x87", b"a", b"e", b"s",
    b"u", b"l", b"d", b"\x90", b"\x91", b"0", b"1", b"2", b"h\x00", b"h\xff", b"j\x00\x00\x00\x00",
    b"q\x00", b"r\xff\xff\xff\xff", b"\x94", b"g0\n", b"p0\n", b"R", b"\x81", b"\x92", b"b",
    b"Q", b"P0\n", b"\x95" + bytes(8), b"\x97", b"\x98", b"\x82\x01", b"\x80\x05", b".",
    b"ctorch\nUntypedStorage\n", b"ctorch.storage\nUntypedStorage\n", b"ctorch\nFloatTensor\n",
    b"ctorch.cuda\nHalfStorage\n", b"ctorch\nQInt8Storage\n", b"cbuiltins\nfrozenset\n",
    b"c__builtin__\nset\n", b"cUserDict\nOrderedDict\n", b"cos\nsystem\n", b"ctorch\nSize\n",
    b"ctorch\ndevice\n", b"cbuiltins\nbytearray\n", b"c_codecs\nencode\n", b"ctorch\nTensor\n",
    b"ctorch._tensor\n_rebuild_from_type_v2\n", b"ctorch._utils\n_rebuild_parameter\n",
    b"ctorch._utils\n_rebuild_tensor_v3\n", b"ctorch\nfloat32\n", b"ctorch\nuint4\n",
    b"}X\x03\x00\x00\x00neg\x88s", b"}X\x04\x00\x00\x00conj\x88s", b"}X\x04\x00\x00\x00data]s",
    b"X\x04\x00\x00\x00meta", b"J\x00\x00\x00\x80", b"\x8a\x08" + b"\xff" * 7 + b"\x7f",
]


def splice_pickle(pkl: bytes, rng: random.Random) -> bytes:
    """``pkl`` with one to three of ``_SPLICES`` inserted at opcode boundaries (or an
    opcode's argument replaced, where the boundary is not found)."""
    import pickletools

    try:
        bounds = [pos for _, _, pos in pickletools.genops(pkl)]
    except Exception:
        bounds = list(range(len(pkl)))
    out = pkl
    for _ in range(rng.randint(1, 3)):
        at = rng.choice(bounds) if bounds else 0
        out = out[:at] + rng.choice(_SPLICES) + out[at:]
    return out


def zip_trick(data: bytes, rng: random.Random) -> bytes:
    """``data``'s container given a trick zip readers disagree on: a second end record in
    its comment (at the end, or with bytes after it), bytes after or before the archive, a
    zip64 locator moved, the 32-bit end fields changed, a local header's sizes, method or
    name changed."""
    import struct as st

    e = data.rfind(b"PK\x05\x06")
    if e < 0:
        return data
    out = bytearray(data)
    trick = rng.randrange(7)
    if trick == 0:
        comment = bytes(out[e:e + 20]) + b"\x00\x00" + (b"xyz" if rng.random() < 0.5 else b"")
        st.pack_into("<H", out, e + 20, len(comment))
        return bytes(out[:e + 22]) + comment
    if trick == 1:
        return bytes(out) + b"junk"[:rng.randint(1, 4)]
    if trick == 2:
        return b"junk" + bytes(out)
    if trick == 3 and out[e - 20:e - 16] == b"PK\x06\x07":
        st.pack_into("<Q", out, e - 12, _boundary(rng, 8) % (len(out) + 64))
    elif trick == 4:
        at = e + 8 + 2 * rng.randrange(6)
        st.pack_into("<H", out, at, _boundary(rng, 2) % (1 << 16))
    else:
        local = [i for i in range(len(out)) if out[i:i + 4] == b"PK\x03\x04"]
        if local:
            at = rng.choice(local)
            field = {4: (8, 2), 5: (18, 4), 6: (30, 1)}.get(trick, (22, 4))
            out[at + field[0]:at + field[0] + field[1]] = \
                (_boundary(rng, field[1]) % (1 << 8 * field[1])).to_bytes(field[1], "little")
    return bytes(out)


def pytorch_seeds() -> list[bytes]:
    """Checkpoints as torch.save lays them out: a plain one, one with a view at an offset,
    a transposed view and a tied key of one storage."""
    import numpy as np

    w = np.arange(12, dtype=np.float32).tobytes()
    plain = pytorch_checkpoint(
        [("0", w), ("1", bytes(range(6)))],
        [("w", _pickled_tensor("FloatStorage", "0", 12, 0, (3, 4), (4, 1))),
         ("b", _pickled_tensor("ByteStorage", "1", 6, 0, (6,), (1,)))])
    views = pytorch_checkpoint(
        [("0", w)],
        [("w", _pickled_tensor("FloatStorage", "0", 12, 0, (3, 4), (4, 1))),
         ("t", _pickled_tensor("FloatStorage", "0", 12, 0, (4, 3), (1, 4))),
         ("row", _pickled_tensor("FloatStorage", "0", 12, 4, (2, 4), (4, 1))),
         ("tied", _pickled_tensor("FloatStorage", "0", 12, 0, (3, 4), (4, 1)))])
    return [plain, views]


# ---------------------------------------------------------------------------------------
# Name shapes: what a mount builds from names, against a bound linear in the file.
# ---------------------------------------------------------------------------------------

# Everything a mount and ``inspect`` build from the names (both layouts' paths, metadata.json
# written out, the whole tree walked with every file's size and xattrs, the inspect report),
# per byte of the file.  The worst shape is a name of dots: each byte is a directory (a
# node, its entry, its expansion), ~300 bytes of Python objects.  Quadratic costs break the
# bound at once: one name of 20,000 dots kept every parent path, ~20,000 bytes per byte.
NAME_BYTES_PER_INPUT_BYTE = 1024


def names_file(names) -> bytes:
    """A safetensors file with one F32 [1] tensor per name, in order."""
    header = {name: {"dtype": "F32", "shape": [1], "data_offsets": [4 * i, 4 * i + 4]}
              for i, name in enumerate(names)}
    text = json.dumps(header, separators=(",", ":")).encode("utf-8")
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text + bytes(4 * len(names))


def check_names(names, *, seconds: float | None = 4 * TIME_LIMIT_S) -> dict:
    """Mount-side work for ``names`` within ``NAME_BYTES_PER_INPUT_BYTE`` per byte of the
    file (+ ``PARSE_FIXED_BYTES``) and the time limit; raises ``Violation``.  Returns
    ``{"size": file bytes, "peak": bytes, "per_byte": peak / size}``."""
    import io
    import os
    import tempfile

    from tensorfs.budget import MemoryBudget
    from tensorfs.cli.inspect import write_report
    from tensorfs.loading.loader import load_model
    from tensorfs.mount.metadata_json import metadata_json_pieces
    from tensorfs.mount.tree import build_mount, describe
    from tensorfs.views.names import DirNode

    data = names_file(names)
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "names.safetensors")
        with open(path, "wb") as f:
            f.write(data)
        peak = _Peak()

        def run():
            with peak:
                model = load_model(path)
                try:
                    for layout in ("tree", "flat"):
                        paths, plans = describe(model, layout)
                        text = b"".join(metadata_json_pieces(model, paths, plans))
                        doc = json.loads(text, parse_constant=_refuse_constant)
                        if len(doc["tensors"]) != len(set(names)):
                            raise Violation("metadata.json lost a tensor")
                        del paths, plans, text, doc
                        mounted = build_mount(model, MemoryBudget(1 << 20), layout)
                        _walk_tree(mounted.tree.root, DirNode)
                        del mounted
                    write_report(model, io.StringIO() if len(data) < 1 << 16 else _Sink())
                finally:
                    model.close()

        if seconds is None:
            run()
        else:
            with time_limit(seconds):
                run()
    if peak.bytes > NAME_BYTES_PER_INPUT_BYTE * len(data) + PARSE_FIXED_BYTES:
        raise Violation(f"names: a {len(data)}-byte file cost {peak.bytes} bytes to mount and "
                        f"walk ({peak.bytes / len(data):.0f} per byte)")
    return {"size": len(data), "peak": peak.bytes, "per_byte": peak.bytes / len(data)}


def _refuse_constant(token):
    raise Violation(f"metadata.json holds {token}, which is not JSON")


class _Sink:
    def write(self, text):
        return len(text)


def _walk_tree(root, dir_type) -> None:
    """Every directory expanded and every file's size and xattrs asked for, as ``find``
    and ``getfattr -R`` would (iteratively: the tree is as deep as a name has dots)."""
    stack = [root]
    while stack:
        node = stack.pop()
        for child in node.children.values():
            if isinstance(child, dir_type):
                stack.append(child)
            else:
                child.view.size
                for name in child.xattrs:
                    child.xattrs[name]


# ---------------------------------------------------------------------------------------
# Seeds: the valid files of the test suite.
# ---------------------------------------------------------------------------------------

def gguf_seeds() -> list[bytes]:
    from tests.support import gguf_corpus as corpus

    seeds = [corpus.valid_gguf(v, order) for v in (1, 2, 3) for order in "<>"]
    try:
        seeds.append(_written_gguf())
    except Exception:               # pragma: no cover - gguf-py missing
        pass
    return seeds


def _written_gguf() -> bytes:
    """A file from gguf-py's writer: every value type, quantized and native tensors."""
    import os
    import tempfile

    import gguf
    import numpy as np

    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "w.gguf")
        writer = gguf.GGUFWriter(path, "llama")
        writer.add_uint32("u", 7)
        writer.add_array("a.str", ["x", "", "yz"])
        writer.add_array("a.nested", [[1, 2], [3]])
        writer.add_float64("f", 0.5)
        writer.add_tensor("q8", np.zeros((2, 34), np.uint8), raw_shape=(2, 32),
                          raw_dtype=gguf.GGMLQuantizationType.Q8_0)
        writer.add_tensor("q4k", np.zeros((1, 144), np.uint8), raw_shape=(1, 256),
                          raw_dtype=gguf.GGMLQuantizationType.Q4_K)
        writer.add_tensor("bf", np.zeros((4, 2), np.uint8), raw_shape=(4,),
                          raw_dtype=gguf.GGMLQuantizationType.BF16)
        writer.add_tensor("f32", np.arange(6, dtype=np.float32).reshape(2, 3))
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
        with open(path, "rb") as f:
            return f.read()


def safetensors_seeds() -> list[bytes]:
    import numpy as np
    from safetensors.numpy import save

    from tests.support import safetensors_corpus as corpus

    seeds = [
        save({"a.w": np.arange(6, dtype=np.float32).reshape(2, 3),
              "b": np.array([1, 2, 3], np.int8), "z": np.zeros((0,), np.float64)},
             metadata={"format": "pt", "k": "v"}),
        corpus.build([("f4", corpus.tensor("F4", [2, 2], 0, 2)),
                      ("bf", corpus.tensor("BF16", [3], 2, 8)),
                      ("s", corpus.tensor("U8", [], 8, 9))], {"x": "\u00e9"}, bytes(range(9))),
    ]
    seeds += [data for _, data in corpus.VALID_ODD if len(data) < 4096]
    return seeds


# ---------------------------------------------------------------------------------------
# GGUF: where every length, count, type and offset field of a valid file lies.
# ---------------------------------------------------------------------------------------

def gguf_fields(data: bytes) -> list[tuple[int, int, str]]:
    """``(offset, width, role)`` of every numeric field in the header of a *valid* GGUF
    (anything else: ``ValueError``; the walk trusts the counts, so it checks them first)."""
    try:
        gguf_format.parse_gguf(data, len(data))
    except GGUFError as error:
        raise ValueError(f"not a valid GGUF: {error}") from None
    version_le = int.from_bytes(data[4:8], "little")
    order = "<" if version_le in (1, 2, 3) else ">"
    version = version_le if order == "<" else int.from_bytes(data[4:8], "big")
    cw = 4 if version == 1 else 8
    u32 = struct.Struct(order + "I").unpack_from
    cnt = struct.Struct(order + ("I" if cw == 4 else "Q")).unpack_from
    fields = [(4, 4, "version")]
    pos = 8
    fields.append((pos, cw, "n_tensors"))
    n_tensors = cnt(data, pos)[0]
    pos += cw
    fields.append((pos, cw, "n_kv"))
    n_kv = cnt(data, pos)[0]
    pos += cw
    sizes = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}

    def string(role):
        nonlocal pos
        fields.append((pos, cw, role))
        n = cnt(data, pos)[0]
        pos += cw + n

    def value(vtype, role):
        nonlocal pos
        if vtype == 8:
            string(role + ".string_length")
        elif vtype == 9:
            fields.append((pos, 4, role + ".array_type"))
            etype = u32(data, pos)[0]
            pos += 4
            fields.append((pos, cw, role + ".array_length"))
            n = cnt(data, pos)[0]
            pos += cw
            for _ in range(n):
                value(etype, role + "[]")
        else:
            pos += sizes[vtype]

    for i in range(n_kv):
        string(f"kv{i}.key_length")
        fields.append((pos, 4, f"kv{i}.value_type"))
        vtype = u32(data, pos)[0]
        pos += 4
        value(vtype, f"kv{i}")
    for i in range(n_tensors):
        string(f"t{i}.name_length")
        fields.append((pos, 4, f"t{i}.n_dims"))
        n_dims = u32(data, pos)[0]
        pos += 4
        for d in range(n_dims):
            fields.append((pos, cw, f"t{i}.ne{d}"))
            pos += cw
        fields.append((pos, 4, f"t{i}.ggml_type"))
        pos += 4
        fields.append((pos, 8, f"t{i}.offset"))
        pos += 8
    return fields


def gguf_order(data: bytes) -> str:
    return "<" if int.from_bytes(data[4:8], "little") in (1, 2, 3) else ">"


def set_field(data: bytes, at: int, width: int, value: int, order: str) -> bytes:
    out = bytearray(data)
    out[at:at + width] = (value % (1 << (8 * width))).to_bytes(
        width, "little" if order == "<" else "big")
    return bytes(out)


# ---------------------------------------------------------------------------------------
# Mutators, driven by a random.Random (hypothesis hands one in; atheris seeds one).
# ---------------------------------------------------------------------------------------

def _boundary(rng: random.Random, size: int) -> int:
    choice = rng.random()
    if choice < 0.7:
        return rng.choice(BOUNDARY_VALUES)
    if choice < 0.85:
        return size + rng.randint(-16, 16)
    return rng.getrandbits(rng.choice((8, 16, 32, 64)))


def mutate_bytes(data: bytes, rng: random.Random, pool=(), hot_end: int | None = None) -> bytes:
    """1-4 generic mutations: bit flips, bytes, boundary integers at any position in either
    byte order, truncation, insertion, deletion, duplication and splicing from ``pool``.
    Positions favour the first ``hot_end`` bytes (the header)."""
    out = bytearray(data)
    for _ in range(rng.randint(1, 4)):
        if not out:
            out += bytes(rng.randint(1, 16))
        end = len(out) if hot_end is None or rng.random() < 0.1 else min(len(out), hot_end)
        pos = rng.randrange(max(end, 1))
        op = rng.randrange(9)
        if op == 0:
            out[pos] ^= 1 << rng.randrange(8)
        elif op == 1:
            out[pos] = rng.choice((0, 1, 0x7F, 0x80, 0xFF, rng.randrange(256)))
        elif op in (2, 3):
            width = rng.choice((1, 2, 4, 8))
            value = _boundary(rng, len(out)) % (1 << (8 * width))
            out[pos:pos + width] = value.to_bytes(width, rng.choice(("little", "big")))
        elif op == 4:
            del out[rng.randrange(len(out) + 1):]
        elif op == 5:
            out[pos:pos] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 8)))
        elif op == 6:
            del out[pos:pos + rng.randint(1, 16)]
        elif op == 7:
            n = rng.randint(1, 64)
            out[pos:pos] = out[pos:pos + n] * rng.randint(1, 4)
        elif pool:
            other = rng.choice(pool)
            a = rng.randrange(len(other))
            out[pos:pos + rng.randint(0, 32)] = other[a:a + rng.randint(1, 64)]
    return bytes(out)


def mutate_gguf(seed: bytes, rng: random.Random, pool=()) -> bytes:
    """Set 1-3 header fields of a valid GGUF to boundary values (in its own byte order),
    then maybe one generic mutation on top."""
    fields = gguf_fields(seed)
    order = gguf_order(seed)
    data = seed
    for _ in range(rng.randint(1, 3)):
        at, width, _ = rng.choice(fields)
        value = _boundary(rng, len(data))
        if rng.random() < 0.2:
            old = int.from_bytes(data[at:at + width], "little" if order == "<" else "big")
            value = old + rng.choice((-1, 1, -2, 2, 16, -16))
        data = set_field(data, at, width, value, order)
    if rng.random() < 0.3:
        hot = fields[-1][0] + fields[-1][1]
        data = mutate_bytes(data, rng, pool, hot)
    return data


def _json_boundary(rng: random.Random):
    return rng.choice([
        rng.choice(BOUNDARY_VALUES), -1, -0, 2**64, 2**65, 10**30, 1.5, -0.0, 1e308, "1",
        None, True, [], {}, [1], rng.randint(0, 64)])


def _header_of(seed: bytes):
    n = struct.unpack_from("<Q", seed)[0]
    text = seed[8:8 + n].decode("utf-8")
    return json.loads(text, object_pairs_hook=list), seed[8 + n:]


class _Obj(list):
    """A JSON object as a list of (key, value) pairs, so duplicate keys survive."""


def _render(node, rng: random.Random, compact: bool) -> str:
    sep = (",", ":") if compact else (", ", " : ")
    if isinstance(node, _Obj):
        return "{" + sep[0].join(json.dumps(k, ensure_ascii=rng.random() < 0.5) + sep[1]
                                 + _render(v, rng, compact) for k, v in node) + "}"
    if isinstance(node, list):
        return "[" + sep[0].join(_render(x, rng, compact) for x in node) + "]"
    return json.dumps(node)


def _pairs_loads(text: str):
    return json.loads(text, object_pairs_hook=_Obj)


def mutate_safetensors(seed: bytes, rng: random.Random, pool=()) -> bytes:
    """Mutate the JSON header of a valid safetensors file as a structure (dtype, shape and
    data_offsets to boundary values or wrong types, fields dropped or duplicated, tensors
    duplicated or renamed, deep nesting, odd metadata), re-frame it with the right length
    (or a boundary one) and keep, cut or extend the data."""
    from tensorfs.dtypes import SAFETENSORS_DTYPES

    n = struct.unpack_from("<Q", seed)[0]
    top = _pairs_loads(seed[8:8 + n].decode("utf-8"))
    data = bytearray(seed[8 + n:])
    top = _Obj(top) if isinstance(top, _Obj) else _Obj()
    for _ in range(rng.randint(1, 3)):
        tensors = [i for i, (k, v) in enumerate(top) if k != "__metadata__"]
        op = rng.randrange(10)
        if op <= 3 and tensors:
            i = rng.choice(tensors)
            name, entry = top[i]
            entry = _Obj(entry) if isinstance(entry, _Obj) else _Obj()
            field = rng.choice(("dtype", "shape", "data_offsets", "extra"))
            keys = [k for k, _ in entry]
            if field == "dtype":
                value = rng.choice(list(SAFETENSORS_DTYPES) + ["f32", "", "F32 ", "Q4_K", 3])
            elif field == "shape":
                value = [_json_boundary(rng) if rng.random() < 0.5 else rng.randint(0, 9)
                         for _ in range(rng.choice((0, 1, 2, 3, 8, 40)))]
            elif field == "data_offsets":
                value = [rng.choice((_json_boundary(rng), len(data), rng.randint(0, 64)))
                         for _ in range(rng.choice((2, 2, 2, 0, 1, 3)))]
            else:
                depth = rng.choice((1, 2, 126, 127, 128, 200))
                value = json.loads("[" * depth + "]" * depth) if depth < 150 else \
                    [_json_boundary(rng)]
            if field in keys and rng.random() < 0.8:
                entry[keys.index(field)] = (field, value)
            elif rng.random() < 0.3 and keys:
                del entry[rng.randrange(len(entry))]
            else:
                entry.append((field, value))
            top[i] = (name, entry)
        elif op == 4 and tensors:                     # a duplicate tensor
            top.append(top[rng.choice(tensors)])
        elif op == 5 and tensors:                     # rename
            i = rng.choice(tensors)
            top[i] = (rng.choice(("", "__metadata__", "a" * 300, "\x00", "\ud800", "x")),
                      top[i][1])
        elif op == 6:                                  # metadata
            value = rng.choice((_Obj([("k", "v")]), _Obj([("k", 1)]), None, [], "s", _Obj(),
                                _Obj([("k", "v"), ("k", "w")]),
                                _Obj([("\u00e9", "\U0001f600")])))
            top.insert(0, ("__metadata__", value))
        elif op == 7:                                  # many tensors (what counts cost)
            for j in range(rng.choice((2, 50, 500))):
                top.append((f"m{j}", _Obj([("dtype", "U8"), ("shape", [0]),
                                           ("data_offsets", [0, 0])])))
        elif op == 8:
            del data[rng.randrange(len(data) + 1):]
        else:
            data += bytes(rng.choice((1, 7, 8, 64)))
    try:
        text = _render(top, rng, rng.random() < 0.7)
    except (TypeError, ValueError):
        text = "{}"
    raw = text.encode("utf-8", "surrogatepass")
    if rng.random() < 0.5:
        raw += b" " * (-len(raw) % 8)
    length = len(raw)
    if rng.random() < 0.15:
        length = _boundary(rng, len(raw)) % (1 << 64)
    out = struct.pack("<Q", length) + raw + bytes(data)
    if rng.random() < 0.2:
        out = mutate_bytes(out, rng, pool, 8 + len(raw))
    return out
