"""The PyTorch checkpoint reader: ``torch.save``'s zip container, and its pickle walked,
never run.

A checkpoint is a zip archive (``PREFIX/data.pkl``, ``PREFIX/byteorder``, one stored entry
``PREFIX/data/KEY`` per storage ...), read by ``tensorfs.formats.ziparchive`` as torch reads
it.  ``data.pkl`` is then walked opcode by opcode (``pickletools.genops``: a
decoder, it calls nothing) on a stack of plain values: a global is only ever a name, and a
call only ever one of the few functions ``torch.load(weights_only=True)`` allows, whose
effect is modelled here (``_rebuild_tensor_v2`` gives a tensor record: its storage, offset,
shape and strides).  Nothing of the file is imported, called or constructed.

What is refused, each one ``PytorchError`` whose ``kind`` is below, in one line:

``forbidden``     a global outside the allow-list (``forbidden global os.system at byte N``),
                  an opcode torch's weights-only reader refuses (INST, OBJ, EXT*, out-of-band
                  buffers, NEWOBJ_EX), a persistent id other than a storage, a call or BUILD
                  on something not allowed;
``unsupported``   an allowed global this reader does not serve (a sparse, quantized, nested
                  or meta tensor), a big-endian checkpoint, a TorchScript archive;
``legacy``        the pre-zip format of torch < 1.6;
``zip``           a damaged container: no end record, entries outside the file, a compressed
                  or encrypted entry, an unsafe entry name (``..``, ``/abs``, ``\\``), two
                  entries with one name, entries under several prefixes;
``pickle``        a damaged pickle (truncated, bad opcode arguments, stack underflow);
``storage``       a storage missing, shorter than its tensors, or of two types;
``structure``     what the pickle gives is not tensors in (nested) dicts and lists, or two
                  tensors get one name.

A tensor's ``TensorInfo``: ``offset`` is the byte of its element 0 in the file, ``nbytes``
its elements' bytes; a non-contiguous one has ``strides`` (elements), and its bytes are
gathered by whoever serves it (``tensorfs.loading.checkpoints``).  Nested dicts give dotted
names (``{"model": {"w": t}}``: ``model.w``); values other than tensors are the metadata.
"""

from __future__ import annotations

import io
import pickletools
from typing import Callable, NamedTuple, NoReturn

from tensorfs.errors import PytorchError
from tensorfs.formats.ziparchive import (
    ZIP_MAGIC,
    archive_prefix,
    check_records,
    read_entries,
    read_exact,
)
from tensorfs.model import MetadataValue, ModelFile, TensorInfo

# Every PytorchError.kind (the module docstring says what each means)
KINDS = ("forbidden", "unsupported", "legacy", "zip", "pickle", "storage", "structure")
MAX_PICKLE = 256 << 20              # data.pkl read whole, at most
MAX_DEPTH = 64                      # nesting of dicts and lists around a tensor, at most
MAX_STRIDED_DIMS = 32               # dimensions of a non-contiguous tensor, at most
LEGACY_MAGIC = 0x1950A86A20F9469CFC6C

# The storage classes torch writes, as the safetensors dtype of their elements.
STORAGE_DTYPES = {
    "DoubleStorage": "F64", "FloatStorage": "F32", "HalfStorage": "F16",
    "BFloat16Storage": "BF16", "LongStorage": "I64", "IntStorage": "I32",
    "ShortStorage": "I16", "CharStorage": "I8", "ByteStorage": "U8", "BoolStorage": "BOOL",
    "ComplexFloatStorage": "C64", "UntypedStorage": None,
}
# torch dtypes (torch.float32 ...) as safetensors dtypes
TORCH_DTYPES = {
    "float64": "F64", "float32": "F32", "float16": "F16", "bfloat16": "BF16",
    "int64": "I64", "int32": "I32", "int16": "I16", "int8": "I8", "uint8": "U8",
    "uint16": "U16", "uint32": "U32", "uint64": "U64", "bool": "BOOL", "complex64": "C64",
    "float8_e4m3fn": "F8_E4M3", "float8_e5m2": "F8_E5M2", "float8_e8m0fnu": "F8_E8M0",
    "float8_e4m3fnuz": "F8_E4M3FNUZ", "float8_e5m2fnuz": "F8_E5M2FNUZ",
}
ITEMSIZE = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1,
            "U8": 1, "U16": 2, "U32": 4, "U64": 8, "BOOL": 1, "C64": 8, "F8_E4M3": 1,
            "F8_E5M2": 1, "F8_E8M0": 1, "F8_E4M3FNUZ": 1, "F8_E5M2FNUZ": 1}

_REBUILD = "torch._utils."
# The globals torch.load(weights_only=True) allows (torch/_weights_only_unpickler.py,
# _get_allowed_globals), those this reader serves.
SERVED_CALLS = {
    "collections.OrderedDict", "collections.Counter", "torch._utils._rebuild_tensor",
    "torch._utils._rebuild_tensor_v2", "torch._utils._rebuild_tensor_v3",
    "torch._utils._rebuild_parameter", "torch._utils._rebuild_parameter_with_state",
    "torch._tensor._rebuild_from_type_v2", "torch.Size", "torch.device",
    "torch.serialization._get_layout", "_codecs.encode", "builtins.set", "builtins.frozenset",
    "builtins.complex", "builtins.bytearray",
}
SERVED_VALUES = ({f"torch.{name}" for name in STORAGE_DTYPES}
                 | {"torch.storage.UntypedStorage"}
                 | {f"torch.{name}" for name in TORCH_DTYPES}
                 | {"torch.Tensor", "torch.nn.parameter.Parameter"})
# Allowed by torch's weights-only reader, not served here: refused as unsupported.
UNSERVED = {
    "torch._utils._rebuild_sparse_tensor": "a sparse tensor",
    "torch._utils._rebuild_qtensor": "a quantized tensor",
    "torch._utils._rebuild_nested_tensor": "a nested tensor",
    "torch._utils._rebuild_meta_tensor_no_storage": "a meta tensor (no data)",
    "torch._utils._rebuild_wrapper_subclass": "a tensor subclass",
    "torch._utils._rebuild_device_tensor_from_numpy": "a tensor from numpy",
    "torch._utils._rebuild_device_tensor_from_cpu_tensor": "a device tensor",
    **{f"torch.Q{n}Storage": "a quantized storage" for n in ("Int8", "UInt8", "Int32",
                                                             "UInt4x2", "UInt2x4")},
}

# Opcodes walked; any other is refused (torch's weights-only reader refuses them too).
_OPS = {
    "PROTO", "FRAME", "STOP", "MARK", "POP", "POP_MARK", "DUP", "NONE", "NEWTRUE",
    "NEWFALSE", "INT", "BININT", "BININT1", "BININT2", "LONG", "LONG1", "LONG4", "FLOAT",
    "BINFLOAT", "STRING", "BINSTRING", "SHORT_BINSTRING", "UNICODE", "SHORT_BINUNICODE",
    "BINUNICODE", "BINUNICODE8", "SHORT_BINBYTES", "BINBYTES", "BINBYTES8", "BYTEARRAY8",
    "EMPTY_TUPLE", "TUPLE", "TUPLE1", "TUPLE2", "TUPLE3", "EMPTY_LIST", "LIST", "APPEND",
    "APPENDS", "EMPTY_DICT", "DICT", "SETITEM", "SETITEMS", "EMPTY_SET", "ADDITEMS",
    "FROZENSET", "GLOBAL", "STACK_GLOBAL", "REDUCE", "NEWOBJ", "BUILD", "BINPERSID", "GET",
    "BINGET", "LONG_BINGET", "PUT", "BINPUT", "LONG_BINPUT", "MEMOIZE",
}


def _error(kind: str, message: str, offset: int | None = None,
           name: str | None = None) -> PytorchError:
    return PytorchError(kind, message, offset=offset, name=name)


def looks_like_pytorch(prefix: bytes) -> bool:
    """A zip archive (torch.save since 1.6), or the legacy pickle of torch < 1.6."""
    return bytes(prefix[:4]) == ZIP_MAGIC or looks_like_legacy(prefix)


def looks_like_legacy(prefix: bytes) -> bool:
    head = bytes(prefix[:14])
    return head[:2] == b"\x80\x02" and head[2:4] == b"\x8a\x0a" and \
        int.from_bytes(head[4:14], "little") == LEGACY_MAGIC


# -- the pickle -----------------------------------------------------------------------------

class Global(NamedTuple):
    name: str


class Storage(NamedTuple):
    key: str
    dtype: str | None       # None: untyped (bytes)
    numel: int


class Tensor(NamedTuple):
    storage: Storage
    offset: int             # elements
    shape: tuple
    strides: tuple
    dtype: str


class Opaque(NamedTuple):
    what: str


class ODict(dict):
    """An ``OrderedDict`` of the pickle (a BUILD may set its attributes: ignored)."""


_SCALARS = frozenset((str, int, float, bool, bytes, type(None), complex))


def _int_tuple(value, what: str, at: int) -> tuple:
    if not isinstance(value, tuple) or not all(type(v) is int and v >= 0 for v in value):
        raise _error("structure", f"{what} is not a tuple of non-negative integers", offset=at)
    return value


class _Walker:
    def __init__(self, pickle: bytes, base: int):
        self.pickle = pickle
        self.base = base            # data.pkl's offset in the file
        self.storages: dict[str, Storage] = {}

    def fail(self, kind: str, message: str, pos: int) -> NoReturn:
        raise _error(kind, f"{message} at byte {pos} of data.pkl", offset=self.base + pos)

    def run(self):
        stack: list = []
        marks: list = []
        memo: dict = {}
        pos = 0
        try:
            for op, arg, pos in pickletools.genops(io.BytesIO(self.pickle)):
                name = op.name
                if name not in _OPS:
                    self.fail("forbidden", f"forbidden opcode {name}", pos)
                if name == "STOP":
                    if len(stack) != 1 or marks:
                        self.fail("pickle", "STOP with a stack of other than one value", pos)
                    return stack[0]
                self.step(name, arg, pos, stack, marks, memo)
        except PytorchError:
            raise
        except (ValueError, IndexError, KeyError, TypeError, OverflowError, EOFError,
                UnicodeDecodeError, RecursionError, MemoryError) as error:
            self.fail("pickle", f"a damaged pickle ({type(error).__name__}: "
                      f"{str(error)[:200]})", pos)
        self.fail("pickle", "the pickle ends without STOP", len(self.pickle))

    def step(self, name, arg, pos, stack, marks, memo):
        if name in ("PROTO", "FRAME"):
            return
        if name == "MARK":
            marks.append(len(stack))
        elif name in ("POP",):
            stack.pop()
        elif name == "POP_MARK":
            del stack[marks.pop():]
        elif name == "DUP":
            stack.append(stack[-1])
        elif name == "NONE":
            stack.append(None)
        elif name in ("NEWTRUE", "NEWFALSE"):
            stack.append(name == "NEWTRUE")
        elif name in ("INT", "BININT", "BININT1", "BININT2", "LONG", "LONG1", "LONG4",
                      "FLOAT", "BINFLOAT", "UNICODE", "SHORT_BINUNICODE", "BINUNICODE",
                      "BINUNICODE8", "SHORT_BINBYTES", "BINBYTES", "BINBYTES8"):
            stack.append(arg)
        elif name in ("STRING", "BINSTRING", "SHORT_BINSTRING"):
            stack.append(arg.decode("latin-1") if isinstance(arg, bytes) else arg)
        elif name == "BYTEARRAY8":
            stack.append(bytes(arg))
        elif name == "EMPTY_TUPLE":
            stack.append(())
        elif name in ("TUPLE1", "TUPLE2", "TUPLE3"):
            n = int(name[-1])
            if len(stack) < n:
                raise IndexError("stack underflow")
            items = tuple(stack[-n:])
            del stack[-n:]
            stack.append(items)
        elif name in ("TUPLE", "LIST", "DICT", "FROZENSET"):
            items = stack[marks.pop():]
            del stack[len(stack) - len(items):]
            if name == "TUPLE":
                stack.append(tuple(items))
            elif name == "LIST":
                stack.append(list(items))
            elif name == "FROZENSET":
                stack.append(frozenset(self.hashable(v, pos) for v in items))
            else:
                stack.append({self.hashable(k, pos): v for k, v in zip(items[::2], items[1::2])})
        elif name == "EMPTY_LIST":
            stack.append([])
        elif name == "EMPTY_DICT":
            stack.append({})
        elif name == "EMPTY_SET":
            stack.append(set())
        elif name == "APPEND":
            value = stack.pop()
            self.container(stack[-1], list, pos).append(value)
        elif name in ("APPENDS", "SETITEMS", "ADDITEMS"):
            items = stack[marks.pop():]
            del stack[len(stack) - len(items):]
            if name == "APPENDS":
                self.container(stack[-1], list, pos).extend(items)
            elif name == "ADDITEMS":
                self.container(stack[-1], set, pos).update(self.hashable(v, pos) for v in items)
            else:
                target = self.container(stack[-1], dict, pos)
                if len(items) % 2:
                    raise IndexError("SETITEMS with an odd count")
                for k, v in zip(items[::2], items[1::2]):
                    target[self.hashable(k, pos)] = v
        elif name == "SETITEM":
            value = stack.pop()
            key = stack.pop()
            self.container(stack[-1], dict, pos)[self.hashable(key, pos)] = value
        elif name in ("GET", "BINGET", "LONG_BINGET"):
            stack.append(memo[arg])
        elif name in ("PUT", "BINPUT", "LONG_BINPUT"):
            memo[arg] = stack[-1]
        elif name == "MEMOIZE":
            memo[len(memo)] = stack[-1]
        elif name == "GLOBAL":
            module, _, attr = arg.partition(" ")
            stack.append(self.global_(module, attr, pos))
        elif name == "STACK_GLOBAL":
            attr = stack.pop()
            module = stack.pop()
            if type(module) is not str or type(attr) is not str:
                self.fail("forbidden", "STACK_GLOBAL of other than two strings", pos)
            stack.append(self.global_(module, attr, pos))
        elif name == "REDUCE":
            args = stack.pop()
            stack[-1] = self.call(stack[-1], args, pos)
        elif name == "NEWOBJ":
            args = stack.pop()
            cls = stack.pop()
            if cls != Global("torch.nn.parameter.Parameter") or not isinstance(args, tuple) \
                    or not args or not isinstance(args[0], Tensor):
                self.fail("forbidden", f"NEWOBJ of {self.what(cls)}", pos)
            stack.append(args[0])
        elif name == "BUILD":
            stack.pop()
            if type(stack[-1]) is not ODict:
                self.fail("forbidden", f"BUILD of {self.what(stack[-1])}", pos)
        elif name == "BINPERSID":
            stack.append(self.storage(stack.pop(), pos))
        else:                                       # pragma: no cover (_OPS is handled above)
            self.fail("forbidden", f"forbidden opcode {name}", pos)

    def what(self, value) -> str:
        return value.name if isinstance(value, Global) else type(value).__name__

    def hashable(self, value, pos):
        """A dict key or set member: a scalar, or a flat tuple of scalars (never a nested
        one, whose hash would recurse as deep as the pickle nests it)."""
        if type(value) in _SCALARS or (type(value) is tuple and
                                       all(type(v) in _SCALARS for v in value)):
            return value
        self.fail("structure", f"a {type(value).__name__} as a key", pos)

    def container(self, value, kind, pos):
        if not isinstance(value, kind):
            self.fail("forbidden", f"items added to a {self.what(value)}", pos)
        return value

    def global_(self, module: str, attr: str, pos: int) -> Global:
        full = f"{module}.{attr}"
        if full in SERVED_CALLS or full in SERVED_VALUES:
            return Global(full)
        if full in UNSERVED:
            self.fail("unsupported", f"{UNSERVED[full]} ({full}), which tensorfs does not "
                      "serve,", pos)
        self.fail("forbidden", f"forbidden global {full}", pos)

    def storage(self, pid, pos: int) -> Storage:
        if not (isinstance(pid, tuple) and len(pid) == 5 and pid[0] in ("storage", b"storage")):
            self.fail("forbidden", "a persistent id other than a storage", pos)
        _, cls, key, _location, numel = pid
        if not isinstance(cls, Global) or type(numel) is not int or numel < 0 or \
                type(key) is not str:
            self.fail("forbidden", "a storage id other than (storage, class, key, "
                      "location, size)", pos)
        short = cls.name.rsplit(".", 1)[-1]
        if cls.name not in SERVED_VALUES or short not in STORAGE_DTYPES:
            self.fail("forbidden", f"{cls.name} as a storage class", pos)
        storage = Storage(key, STORAGE_DTYPES[short], numel)
        known = self.storages.setdefault(key, storage)
        if known != storage:
            self.fail("storage", f"storage {key!r} given with two types or sizes", pos)
        return known

    def call(self, func, args, pos):
        if not isinstance(func, Global) or func.name not in SERVED_CALLS:
            self.fail("forbidden", f"a call of {self.what(func)}", pos)
        if not isinstance(args, tuple):
            self.fail("pickle", f"arguments of {func.name} are not a tuple", pos)
        name = func.name
        if name in ("collections.OrderedDict", "collections.Counter"):
            out = ODict()
            if args:
                if len(args) != 1 or not isinstance(args[0], (list, dict, tuple)):
                    self.fail("structure", f"{name} of other than one container", pos)
                items = args[0].items() if isinstance(args[0], dict) else args[0]
                for item in items:
                    if not isinstance(item, tuple) or len(item) != 2:
                        self.fail("structure", f"{name} of other than pairs", pos)
                    out[self.hashable(item[0], pos)] = item[1]
            return out
        if name in ("torch._utils._rebuild_tensor", "torch._utils._rebuild_tensor_v2",
                    "torch._utils._rebuild_tensor_v3"):
            return self.tensor(name, args, pos)
        if name in ("torch._utils._rebuild_parameter",
                    "torch._utils._rebuild_parameter_with_state"):
            if len(args) not in (3, 4) or not isinstance(args[0], Tensor):
                self.fail("structure", f"{name} of other than a tensor", pos)
            return args[0]
        if name == "torch._tensor._rebuild_from_type_v2":
            if len(args) != 4 or args[1] not in (Global("torch.Tensor"),
                                                 Global("torch.nn.parameter.Parameter")):
                self.fail("unsupported", "a tensor subclass", pos)
            if not isinstance(args[2], tuple):
                self.fail("structure", f"{name} with arguments not a tuple", pos)
            return self.call(args[0], args[2], pos)
        if name == "torch.Size":
            return _int_tuple(args[0] if args else (), "torch.Size", self.base + pos)
        if name in ("torch.device", "torch.serialization._get_layout"):
            return Opaque(name)
        if name == "_codecs.encode":
            if len(args) != 2 or type(args[0]) is not str or args[1] != "latin1":
                self.fail("structure", "_codecs.encode of other than (str, 'latin1')", pos)
            return args[0].encode("latin-1")
        if name in ("builtins.set", "builtins.frozenset"):
            items = args[0] if args else ()
            if not isinstance(items, (list, tuple, set, frozenset)):
                self.fail("structure", f"{name} of other than a list", pos)
            return {self.hashable(v, pos) for v in items}
        if name == "builtins.complex":
            if not all(type(v) in (int, float) for v in args) or len(args) > 2:
                self.fail("structure", "complex of other than numbers", pos)
            return complex(*args)
        if name == "builtins.bytearray":
            if len(args) > 1 or (args and not isinstance(args[0], (bytes, str))):
                self.fail("structure", "bytearray of other than bytes", pos)
            return bytes(args[0]) if args and isinstance(args[0], bytes) else b""
        self.fail("forbidden", f"a call of {name}", pos)   # pragma: no cover

    def tensor(self, name: str, args: tuple, pos: int) -> Tensor:
        n = {"torch._utils._rebuild_tensor": (4,), "torch._utils._rebuild_tensor_v2": (6, 7),
             "torch._utils._rebuild_tensor_v3": (7, 8)}[name]
        if len(args) not in n or not isinstance(args[0], Storage) or type(args[1]) is not int \
                or args[1] < 0:
            self.fail("structure", f"{name} of other than (storage, offset, size, stride, "
                      "...)", pos)
        storage = args[0]
        shape = _int_tuple(args[2], "a tensor's size", self.base + pos)
        strides = _int_tuple(args[3], "a tensor's stride", self.base + pos)
        if len(shape) != len(strides):
            self.fail("structure", "a tensor whose size and stride differ in length", pos)
        dtype = storage.dtype
        if name.endswith("_v3"):
            d = args[6]
            if not isinstance(d, Global) or not d.name.startswith("torch.") or \
                    d.name[6:] not in TORCH_DTYPES:
                self.fail("structure", f"{name} of other than a dtype", pos)
            dtype = TORCH_DTYPES[d.name[6:]]
        if dtype is None:
            self.fail("storage", "a tensor of an untyped storage with no dtype", pos)
        return Tensor(storage, args[1], shape, strides, dtype)


# -- the checkpoint -------------------------------------------------------------------------

def _flatten(top, at: int, budget: int):
    """(name, tensor) and (name, other value) leaves of nested dicts, lists and tuples,
    named by their keys joined with dots.  A container met again (memoized: shared, or a
    cycle) is walked again, within ``budget`` visits in all and ``MAX_DEPTH`` levels."""
    tensors, others = [], []
    stack = [(top, "", 0)]
    while stack:
        value, prefix, depth = stack.pop()
        budget -= 1
        if budget < 0:
            raise _error("structure", "the containers reach each other more often than "
                         "the pickle has bytes (shared or cyclic)", offset=at)
        if isinstance(value, Tensor):
            tensors.append((prefix, value))
        elif isinstance(value, (dict, list, tuple)):
            if depth >= MAX_DEPTH:
                raise _error("structure", f"containers nested more than {MAX_DEPTH} deep "
                             "(or a cycle)", offset=at)
            items = value.items() if isinstance(value, dict) else enumerate(value)
            children = []
            for key, item in items:
                if type(key) not in (str, int, bool):
                    raise _error("structure", f"{prefix or 'the top'}: a key that is a "
                                 f"{type(key).__name__}", offset=at)
                children.append((item, f"{prefix}.{key}" if prefix else str(key), depth + 1))
            stack.extend(reversed(children))
        else:
            others.append((prefix, value))
    return tensors, others


def _check_text(text: str, at: int) -> None:
    """A name or value that UTF-8 can write (the pickle's strings may hold lone surrogates,
    which no header, file name or metadata.json could)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise _error("structure", f"the string {ascii(text)[:80]} is not valid UTF-8 (a lone "
                     "surrogate)", offset=at) from None


def _metadata_value(value) -> MetadataValue:
    if value is None:
        return MetadataValue.of("null", None)
    if isinstance(value, bool):
        return MetadataValue.of("boolean", value)
    if isinstance(value, int):
        return MetadataValue.of("integer", value)
    if isinstance(value, float):
        return MetadataValue.of("number", value if value == value and abs(value) != float("inf")
                                else str(value))
    if isinstance(value, str):
        return MetadataValue.of("string", value)
    if isinstance(value, Global):
        return MetadataValue.of("string", value.name)
    if isinstance(value, (bytes, set, frozenset)):
        return MetadataValue.of("string", f"<{type(value).__name__} of {len(value)}>")
    if isinstance(value, complex):
        return MetadataValue.of("string", str(value))
    return MetadataValue.of("string", f"<{type(value).__name__}>")


def contiguous_strides(shape: tuple) -> tuple:
    out = []
    step = 1
    for dim in reversed(shape):
        out.append(step)
        step *= dim
    return tuple(reversed(out))


def is_contiguous(shape: tuple, strides: tuple) -> bool:
    """torch's ``is_contiguous``: strides of size-1 dimensions do not matter."""
    if any(d == 0 for d in shape):
        return True
    return all(d == 1 or s == c for d, s, c in zip(shape, strides, contiguous_strides(shape)))


def parse_pytorch(read: Callable[[int, int], bytes], file_size: int, path: str = "<memory>",
                  mtime: float = 0.0) -> ModelFile:
    """Read and check a ``torch.save`` checkpoint through ``read(offset, size)`` (exactly
    that many bytes, or fewer at the end of the file); ``PytorchError`` if refused."""
    try:
        return _parse(read, file_size, path, mtime)
    except PytorchError as error:
        error.file = path
        raise


def _parse(read, file_size, path, mtime) -> ModelFile:
    head = read_exact(read, file_size, 0, min(file_size, 16), "the first bytes")
    if looks_like_legacy(head):
        raise _error("legacy", "a checkpoint in the legacy format of torch < 1.6 (a bare "
                     "pickle): re-save it with a recent torch.save, or convert it", offset=0)
    if head[:4] != ZIP_MAGIC:
        raise _error("zip", "not a zip archive (torch.save writes one)", offset=0)
    entries = read_entries(read, file_size)
    prefix = archive_prefix(entries)
    check_records(read, file_size, entries, prefix)
    if f"{prefix}/constants.pkl" in entries or f"{prefix}/code/" in entries or \
            any(n.startswith(f"{prefix}/code/") for n in entries):
        raise _error("unsupported", "a TorchScript archive (torch.jit.save): its code is not "
                     "read; save the state dict with torch.save instead")
    pkl = entries.get(f"{prefix}/data.pkl")
    if pkl is None:
        raise _error("zip", "no data.pkl entry: not a checkpoint written by torch.save")
    for name in (f"{prefix}/data.pkl", f"{prefix}/byteorder"):
        entry = entries.get(name)
        if entry is not None and entry.offset < 0:
            raise _error("zip", f"entry {name!r} is compressed (method {-entry.offset - 1}): "
                         "torch.save stores every entry", offset=None)
    order = entries.get(f"{prefix}/byteorder")
    if order is not None:
        text = read_exact(read, file_size, order.offset, min(order.size, 16), "byteorder")
        if text != b"little":
            raise _error("unsupported", f"byteorder {text[:16]!r}: only little-endian "
                         "checkpoints are served", offset=order.offset)
    if pkl.size > MAX_PICKLE:
        raise _error("pickle", f"data.pkl is {pkl.size} bytes, more than tensorfs reads "
                     f"({MAX_PICKLE})", offset=pkl.offset)
    data = read_exact(read, file_size, pkl.offset, pkl.size, "data.pkl")
    walker = _Walker(data, pkl.offset)
    top = walker.run()
    tensors, others = _flatten(top, pkl.offset, 16 * len(data) + 10_000)
    if not isinstance(top, (dict, list, tuple)) and not isinstance(top, Tensor):
        raise _error("structure", f"the checkpoint holds a {type(top).__name__}, not a "
                     "dict of tensors", offset=pkl.offset)
    if not tensors:
        raise _error("structure", f"a PyTorch checkpoint that holds no tensor (a "
                     f"{type(top).__name__} of {len(others)} other values): not a model's "
                     "weights", offset=pkl.offset)
    for name, value in tensors + others:
        _check_text(name, pkl.offset)
        if isinstance(value, str):
            _check_text(value, pkl.offset)
    infos = []
    names = set()
    for name, t in tensors:
        name = name or "tensor"
        if name == "__metadata__":
            raise _error("structure", "a tensor named '__metadata__', which a safetensors "
                         "header cannot hold", name=name)
        if name in names:
            raise _error("structure", f"two tensors named {name!r}", name=name)
        names.add(name)
        infos.append(_tensor_info(name, t, entries, prefix, path))
    metadata = {}
    for name, value in others:
        if name in names or name in metadata:
            raise _error("structure", f"two values named {name!r}", name=name)
        metadata[name or "value"] = _metadata_value(value)
    first_data = min((e.offset for e in entries.values()
                      if e.name.startswith(f"{prefix}/data/") and e.offset >= 0),
                     default=pkl.offset + pkl.size)
    return ModelFile("pytorch", None, path, file_size, "little", None,
                     min(first_data, file_size), metadata, tuple(infos), mtime)


def _tensor_info(name: str, t: Tensor, entries, prefix: str, path: str) -> TensorInfo:
    storage = t.storage
    entry = entries.get(f"{prefix}/data/{storage.key}")
    if entry is None:
        raise _error("storage", f"tensor {name!r}: storage {storage.key!r} has no entry "
                     f"{prefix}/data/{storage.key}", name=name)
    if entry.offset < 0:
        raise _error("zip", f"entry {entry.name!r} is compressed (method "
                     f"{-entry.offset - 1}): torch.save stores every entry", name=name)
    unit = ITEMSIZE[storage.dtype] if storage.dtype is not None else 1
    itemsize = ITEMSIZE[t.dtype]
    storage_bytes = storage.numel * unit
    if entry.size < storage_bytes:
        raise _error("storage", f"storage {storage.key!r} is {entry.size} bytes, shorter than "
                     f"its {storage.numel} elements of {unit} bytes", offset=entry.offset,
                     name=name)
    numel = 1
    for d in t.shape:
        numel *= d
    start = t.offset * itemsize
    if numel:
        end = start + (sum((d - 1) * s for d, s in zip(t.shape, t.strides)) + 1) * itemsize
    else:
        end = start
    if end > storage_bytes:
        raise _error("storage", f"tensor {name!r} ({t.dtype} {list(t.shape)} at element "
                     f"{t.offset}) runs past its storage {storage.key!r} of {storage_bytes} "
                     "bytes", offset=entry.offset, name=name)
    strides = None if is_contiguous(t.shape, t.strides) else tuple(t.strides)
    if strides is not None and len(t.shape) > MAX_STRIDED_DIMS:
        raise _error("unsupported", f"tensor {name!r}: a non-contiguous tensor of "
                     f"{len(t.shape)} dimensions (at most {MAX_STRIDED_DIMS} are gathered)",
                     name=name)
    return TensorInfo(name, t.dtype, tuple(t.shape), entry.offset + start, numel * itemsize,
                      path, strides=strides)
