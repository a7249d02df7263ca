"""The PyTorch checkpoint reader: ``torch.save``'s zip container, and its pickle walked,
never run.

A checkpoint is a zip archive (``PREFIX/data.pkl``, ``PREFIX/byteorder``, one stored entry
``PREFIX/data/KEY`` per storage ...), read by ``tensorfs.formats.ziparchive`` as torch reads
it.  ``data.pkl`` is then walked opcode by opcode as torch's weights-only ``Unpickler``
walks it (the same opcodes, stack and mark stack, read here: nothing is called) on a stack of
plain values: a global is only ever a name of torch's allow-list, and a call only ever one
of those, whose effect is modelled here, each argument applied or refused
(``_rebuild_tensor_v2`` gives a tensor record: its storage, offset, shape and strides).
Nothing of the file is imported, called or constructed.

What is refused, each one ``PytorchError`` whose ``kind`` is below, in one line:

``forbidden``     a global outside the allow-list (``forbidden global os.system at byte N``),
                  an opcode torch's weights-only reader refuses (FRAME, STACK_GLOBAL,
                  MEMOIZE, INST, OBJ, EXT*, out-of-band buffers, NEWOBJ_EX ...), a persistent
                  id other than a storage, a call or BUILD on something not allowed;
``unsupported``   an allowed global this reader does not serve (a sparse, quantized, nested
                  or meta tensor), a negative or conjugate view, a state that sets a
                  tensor's data, a big-endian checkpoint, a TorchScript archive;
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

import pickletools
import struct
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

# -- what torch's weights-only reader allows (torch/_weights_only_unpickler.py) ----------------

# The element types of torch's legacy storage and tensor classes (torch.FloatStorage,
# torch.cuda.FloatTensor ...: as a storage class each stands for its dtype)
_LEGACY_TYPES = {"Double": "float64", "Float": "float32", "Half": "float16",
                 "BFloat16": "bfloat16", "Long": "int64", "Int": "int32", "Short": "int16",
                 "Char": "int8", "Byte": "uint8", "Bool": "bool"}
_QUANTIZED_STORAGES = ("QInt32", "QInt8", "QUInt2x4", "QUInt4x2", "QUInt8")
# every torch dtype (torch.float32 ...), those served as safetensors dtypes in TORCH_DTYPES
_ALL_DTYPES = (
    [name for name in TORCH_DTYPES] + ["complex128", "complex32", "float4_e2m1fn_x2", "qint32",
                                       "qint8", "quint2x4", "quint4x2", "quint8", "bits16",
                                       "bits1x8", "bits2x4", "bits4x2", "bits8"]
    + [f"int{n}" for n in range(1, 8)] + [f"uint{n}" for n in range(1, 8)])
_STORAGE_CLASSES = {  # name -> its dtype (a key of _ALL_DTYPES)
    **{f"{m}{t}Storage": d for m in ("torch.", "torch.cuda.") for t, d in _LEGACY_TYPES.items()},
    **{f"{m}Complex{t}Storage": d for m in ("torch.", "torch.cuda.")
       for t, d in (("Float", "complex64"), ("Double", "complex128"))},
    **{f"torch.{q}Storage": q.lower() for q in _QUANTIZED_STORAGES},
    "torch.storage.UntypedStorage": "uint8",
}
_TENSOR_CLASSES = {  # the legacy tensor types (torch.FloatTensor ...) -> their dtype
    **{f"{m}{t}Tensor": d for m in ("torch.", "torch.cuda.") for t, d in _LEGACY_TYPES.items()},
    **{f"{m}{t}Tensor": d for m in ("torch.sparse.", "torch.cuda.sparse.")
       for t, d in _LEGACY_TYPES.items() if t != "Bool"},
}
_REBUILDERS = ("_rebuild_tensor", "_rebuild_tensor_v2", "_rebuild_tensor_v3",
               "_rebuild_parameter", "_rebuild_parameter_with_state")
# Allowed by torch's weights-only reader, not served here: refused as unsupported when used.
UNSERVED = {
    "torch._utils._rebuild_sparse_tensor": "a sparse tensor",
    "torch._utils._rebuild_qtensor": "a quantized tensor",
    "torch._utils._rebuild_nested_tensor": "a nested tensor",
    "torch._utils._rebuild_meta_tensor_no_storage": "a meta tensor (no data)",
    "torch._utils._rebuild_wrapper_subclass": "a tensor subclass",
    "torch._utils._rebuild_device_tensor_from_numpy": "a tensor from numpy",
    "torch._utils._rebuild_device_tensor_from_cpu_tensor": "a device tensor",
    "torch.Tensor": "a tensor made by the torch.Tensor constructor",
    "torch.storage.TypedStorage": "a storage made by its constructor",
    "torch.storage.UntypedStorage": "a storage made by its constructor",
    **{name: "a tensor made by a legacy tensor type" for name in _TENSOR_CLASSES},
}
# Every global torch.load(weights_only=True) allows (its _get_allowed_globals, torch 2.13);
# tests/formats/test_pytorch_agrees.py checks it against torch's own list.
ALLOWED_GLOBALS = frozenset({
    "collections.OrderedDict", "collections.Counter", "torch.nn.parameter.Parameter",
    "torch.serialization._get_layout", "torch.Size", "torch.Tensor", "torch.device",
    "_codecs.encode", "builtins.bytearray", "builtins.set", "builtins.complex",
    "torch._tensor._rebuild_from_type_v2", "torch.storage.TypedStorage",
    *(f"torch._utils.{name}" for name in _REBUILDERS), *UNSERVED,
    *(f"torch.{name}" for name in _ALL_DTYPES), *_STORAGE_CLASSES, *_TENSOR_CLASSES,
    *(f"torch.{q}" for q in ("per_tensor_affine", "per_tensor_symmetric", "per_channel_affine",
                             "per_channel_symmetric", "per_channel_affine_float_qparams")),
})
# modules whose globals torch refuses whatever its allow-list, and its Python 2 renames
_BLOCKED_MODULES = ("sys", "os", "posix", "nt")
_RENAMED_MODULES = {"__builtin__": "builtins", "UserDict": "collections",
                    "UserList": "collections", "UserString": "collections"}
# The attributes a state (_set_obj_state: setattr on the tensor) may not set: each is a
# data descriptor of torch.nn.Parameter (its data, grad, shape ...); any other name is a plain
# Python attribute, which changes no value.  Checked against torch in the tests.
TENSOR_DESCRIPTORS = frozenset({
    "H", "T", "__class__", "__cuda_array_interface__", "__dict__", "__weakref__",
    "_backward_hooks", "_base", "_cdata", "_grad", "_grad_fn", "_has_symbolic_sizes_strides",
    "_post_accumulate_grad_hooks", "_python_dispatch", "_version", "data", "device", "dtype",
    "grad", "grad_dtype", "grad_fn", "imag", "is_cpu", "is_cuda", "is_ipu", "is_leaf",
    "is_maia", "is_meta", "is_mkldnn", "is_mps", "is_mtia", "is_nested", "is_quantized",
    "is_sparse", "is_sparse_csr", "is_vulkan", "is_xla", "is_xpu", "itemsize", "layout", "mH",
    "mT", "name", "nbytes", "ndim", "output_nr", "real", "requires_grad", "retains_grad",
    "shape", "volatile"})
# restore_location's tags (torch.serialization._package_registry) a storage may carry;
# "meta" is refused (its tensors hold no data)
_LOCATIONS = ("cuda", "mps", "privateuseone", "hpu", "xpu", "mtia")
_DEVICE_TYPES = ("cpu", "cuda", "ipu", "xpu", "mkldnn", "opengl", "opencl", "ideep", "hip",
                 "ve", "fpga", "maia", "xla", "lazy", "vulkan", "mps", "meta", "hpu", "mtia",
                 "privateuseone")
_LAYOUTS = ("torch.strided", "torch.sparse_coo", "torch.sparse_csr", "torch.sparse_csc",
            "torch.sparse_bsr", "torch.sparse_bsc", "torch._mkldnn", "torch.jagged")
_TEXT_CODECS = ("latin1", "latin-1", "utf-8", "utf8", "ascii")
_FLOATING = ("F64", "F32", "F16", "BF16", "C64", "F8_E4M3", "F8_E5M2", "F8_E8M0",
             "F8_E4M3FNUZ", "F8_E5M2FNUZ")
_INT64 = 1 << 63

# The opcodes torch's weights-only reader takes, by byte; any other is refused, as it is
# there (FRAME, MEMOIZE, STACK_GLOBAL ...: a checkpoint saved with pickle_protocol=4).
_OPCODES = {
    0x80: "PROTO", 0x2E: "STOP", 0x63: "GLOBAL", 0x81: "NEWOBJ", 0x52: "REDUCE",
    0x62: "BUILD", 0x61: "APPEND", 0x65: "APPENDS", 0x73: "SETITEM", 0x75: "SETITEMS",
    0x28: "MARK", 0x74: "TUPLE", 0x85: "TUPLE1", 0x86: "TUPLE2", 0x87: "TUPLE3", 0x4E: "NONE",
    0x89: "NEWFALSE", 0x88: "NEWTRUE", 0x29: "EMPTY_TUPLE", 0x5D: "EMPTY_LIST",
    0x7D: "EMPTY_DICT", 0x8F: "EMPTY_SET", 0x4A: "BININT", 0x4B: "BININT1", 0x4D: "BININT2",
    0x47: "BINFLOAT", 0x58: "BINUNICODE", 0x55: "SHORT_BINSTRING", 0x51: "BINPERSID",
    0x68: "BINGET", 0x6A: "LONG_BINGET", 0x71: "BINPUT", 0x72: "LONG_BINPUT", 0x8A: "LONG1",
}


def _error(kind: str, message: str, offset: int | None = None,
           name: str | None = None) -> PytorchError:
    return PytorchError(kind, message, offset=offset, name=name)


def _show(value) -> str:
    """A value of the file in a message: ASCII, at most 80 characters."""
    text = ascii(value)
    return text if len(text) <= 80 else text[:77] + "..."


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
    dtype: str              # its elements' (a key of _ALL_DTYPES)
    numel: int


class Tensor(NamedTuple):
    storage: Storage
    offset: int             # elements
    shape: tuple
    strides: tuple
    dtype: str              # a safetensors dtype


class Opaque(NamedTuple):
    what: str


class ODict(dict):
    """An ``OrderedDict`` of the pickle (a BUILD may set its attributes: checked, ignored)."""


class Counter(dict):
    """A ``collections.Counter`` of the pickle."""


class Size(tuple):
    """A ``torch.Size``."""


_SCALARS = frozenset((str, int, float, bool, bytes, type(None), complex))
_DICTS = (dict, ODict, Counter)


class _Short(Exception):
    """The pickle ends in the middle of an opcode's argument."""


class _Walker:
    """``data.pkl`` walked as torch's weights-only ``Unpickler.load`` walks it, opcode by
    opcode, on its stack and mark stack, each call's effect modelled instead of made."""

    def __init__(self, pickle: bytes, base: int, records: Callable[[str], int | None]):
        self.pickle = pickle
        self.base = base            # data.pkl's offset in the file
        self.records = records      # a storage's record name -> its bytes (None: absent)
        self.storages: dict[str, Storage] = {}
        self.budget = 16 * len(pickle) + 10_000     # bytes made (bytearray(n)), at most
        self.pos = 0

    def fail(self, kind: str, message: str, pos: int | None = None) -> NoReturn:
        pos = self.pos if pos is None else pos
        raise _error(kind, f"{message} at byte {pos} of data.pkl", offset=self.base + pos)

    def take(self, n: int) -> bytes:
        if self.pos + n > len(self.pickle):
            raise _Short
        out = self.pickle[self.pos:self.pos + n]
        self.pos += n
        return out

    def line(self) -> str:
        end = self.pickle.find(b"\n", self.pos)
        if end < 0:
            raise _Short
        raw = self.pickle[self.pos:end]
        self.pos = end + 1
        return raw.decode("utf-8")

    def run(self):
        stack: list = []
        metastack: list = []
        memo: dict = {}
        at = 0
        try:
            while True:
                at = self.pos
                if at >= len(self.pickle):
                    self.fail("pickle", "the pickle ends without STOP", at)
                code = self.pickle[at]
                self.pos += 1
                name = _OPCODES.get(code)
                if name is None:
                    op = pickletools.code2op.get(chr(code))
                    what = f"opcode {op.name} (pickle protocol {op.proto})" if op else \
                        f"byte {code:#04x}, not an opcode,"
                    self.fail("forbidden", f"{what}, which torch.load(weights_only=True) "
                              "refuses too,", at)
                if name == "STOP":
                    return stack.pop()
                if name == "MARK":
                    metastack.append(stack)
                    stack = []
                elif name in ("TUPLE", "APPENDS", "SETITEMS"):
                    items = stack
                    stack = metastack.pop()
                    self.step(name, items, stack, memo, at)
                else:
                    self.step(name, None, stack, memo, at)
        except PytorchError:
            raise
        except _Short:
            self.fail("pickle", "the pickle ends in the middle of an opcode", at)
        except (IndexError, KeyError, UnicodeDecodeError, struct.error, RecursionError,
                MemoryError) as error:
            self.fail("pickle", f"a damaged pickle ({type(error).__name__}: "
                      f"{_show(str(error))})", at)

    def step(self, name, items, stack, memo, at):
        push = stack.append
        if name == "PROTO":
            self.take(1)
        elif name == "GLOBAL":
            module = self.line()
            attr = self.line()
            push(self.global_(_RENAMED_MODULES.get(module, module), attr, at))
        elif name == "NEWOBJ":
            args = stack.pop()
            push(self.new(stack.pop(), args, at))
        elif name == "REDUCE":
            args = stack.pop()
            stack[-1] = self.call(stack[-1], self.args(args, at), at)
        elif name == "BUILD":
            state = stack.pop()
            self.build(stack[-1], state, at)
        elif name == "APPEND":
            item = stack.pop()
            self.container(stack[-1], list, at).append(item)
        elif name == "APPENDS":
            self.container(stack[-1], list, at).extend(items)
        elif name == "SETITEM":
            value = stack.pop()
            key = stack.pop()
            self.container(stack[-1], _DICTS, at)[self.hashable(key, at)] = value
        elif name == "SETITEMS":
            target = self.container(stack[-1], _DICTS, at)
            for i in range(0, len(items), 2):
                target[self.hashable(items[i], at)] = items[i + 1]
        elif name == "TUPLE":
            push(tuple(items))
        elif name == "TUPLE1":
            stack[-1] = (stack[-1],)
        elif name == "TUPLE2":
            stack[-2:] = [(stack[-2], stack[-1])]
        elif name == "TUPLE3":
            stack[-3:] = [(stack[-3], stack[-2], stack[-1])]
        elif name in ("NONE", "NEWFALSE", "NEWTRUE"):
            push({"NONE": None, "NEWFALSE": False, "NEWTRUE": True}[name])
        elif name == "EMPTY_TUPLE":
            push(())
        elif name == "EMPTY_LIST":
            push([])
        elif name == "EMPTY_DICT":
            push({})
        elif name == "EMPTY_SET":
            push(set())
        elif name == "BININT":
            push(struct.unpack("<i", self.take(4))[0])
        elif name == "BININT1":
            push(self.take(1)[0])
        elif name == "BININT2":
            push(struct.unpack("<H", self.take(2))[0])
        elif name == "BINFLOAT":
            push(struct.unpack(">d", self.take(8))[0])
        elif name == "BINUNICODE":
            (n,) = struct.unpack("<I", self.take(4))
            push(str(self.take(n), "utf-8", "surrogatepass"))
        elif name == "SHORT_BINSTRING":
            push(self.take(self.take(1)[0]).decode("utf-8"))     # torch.load's encoding
        elif name == "BINPERSID":
            push(self.storage(stack.pop(), at))
        elif name in ("BINGET", "LONG_BINGET"):
            key = self.take(1)[0] if name == "BINGET" else struct.unpack("<I", self.take(4))[0]
            push(memo[key])
        elif name in ("BINPUT", "LONG_BINPUT"):
            key = self.take(1)[0] if name == "BINPUT" else struct.unpack("<I", self.take(4))[0]
            memo[key] = stack[-1]
        elif name == "LONG1":
            push(pickle_decode_long(self.take(self.take(1)[0])))
        else:                                           # pragma: no cover
            self.fail("forbidden", f"opcode {name}", at)

    def what(self, value) -> str:
        return value.name if isinstance(value, Global) else type(value).__name__

    def hashable(self, value, pos):
        """A dict key or set member: a scalar, or a flat tuple of scalars (never a nested
        one, whose hash would recurse as deep as the pickle nests it)."""
        if type(value) in _SCALARS:
            return value
        if type(value) in (tuple, Size):
            self.spend(len(value), pos)
            if all(type(v) in _SCALARS for v in value):
                return value
        self.fail("structure", f"a {type(value).__name__} as a key", pos)

    def container(self, value, kind, pos):
        if type(value) not in (kind if isinstance(kind, tuple) else (kind,)):
            self.fail("forbidden", f"items added to a {self.what(value)}", pos)
        return value

    def args(self, args, pos) -> tuple:
        """``func(*args)``'s arguments: a tuple or list, as torch's REDUCE takes them."""
        if type(args) not in (tuple, list, Size):
            self.fail("structure", f"arguments that are a {type(args).__name__}", pos)
        self.spend(len(args), pos)
        return tuple(args)

    def global_(self, module: str, attr: str, pos: int) -> Global:
        full = f"{module}.{attr}"
        if module in _BLOCKED_MODULES:
            self.fail("forbidden", f"forbidden global {_show(full)[1:-1]}", pos)
        if full in ALLOWED_GLOBALS:
            return Global(full)
        self.fail("forbidden", f"forbidden global {_show(full)[1:-1]}", pos)

    def storage(self, pid, pos: int) -> Storage:
        """A storage, as torch's persistent_load reads its id: ("storage", class, key,
        location, numel), the record ``data/KEY`` read there and then."""
        if type(pid) is not tuple or not pid or _ascii(pid[0]) != "storage":
            self.fail("forbidden", "a persistent id other than a storage", pos)
        if len(pid) != 5:
            self.fail("structure", "a storage id other than (storage, class, key, location, "
                      "size)", pos)
        _, cls, key, location, numel = pid
        name = cls.name if isinstance(cls, Global) else None
        if name in _STORAGE_CLASSES:
            dtype = _STORAGE_CLASSES[name]
        elif name in _TENSOR_CLASSES:
            dtype = _TENSOR_CLASSES[name]
        else:
            self.fail("forbidden", f"{self.what(cls)} as a storage class", pos)
        if type(key) is int:
            key = str(key)
        if type(key) is not str or type(numel) is not int:
            self.fail("structure", f"a storage id whose key ({type(key).__name__}) or size "
                      f"({type(numel).__name__}) is odd", pos)
        location = _ascii(location)
        if location != "cpu" and not (isinstance(location, str) and
                                      location.startswith(_LOCATIONS)):
            self.fail("unsupported", f"a storage on device {_show(location)} (tensorfs "
                      "serves what is stored on cpu, cuda, mps, xpu, hpu, mtia)", pos)
        size = _ITEMSIZE_OF.get(dtype)
        if size is None:
            self.fail("unsupported", f"a storage of torch.{dtype}, which tensorfs does not "
                      "serve,", pos)
        if not 0 <= numel * size < _INT64:
            self.fail("storage", f"storage {_show(key)} of {numel} elements", pos)
        storage = Storage(key, dtype, numel)
        known = self.storages.setdefault(key, storage)
        if known != storage:
            self.fail("storage", f"storage {_show(key)} given with two types or sizes", pos)
        have = self.records(key)
        if have is None:
            self.fail("storage", f"storage {_show(key)} has no entry data/{_show(key)[1:-1]}",
                      pos)
        if have != numel * size:                # torch requires the record's size exactly
            self.fail("storage", f"storage {_show(key)} is {have} bytes, "
                      f"{'shorter' if have < numel * size else 'longer'} than its {numel} "
                      f"elements of {size} bytes", pos)
        return known

    def spend(self, n: int, pos: int) -> None:
        """Work (items copied or counted, bytes made) charged to the pickle's budget: a
        container the pickle gives once may be passed to a call at every reuse of it."""
        self.budget -= n
        if self.budget < 0:
            self.fail("structure", "the calls of the pickle cost more than it is worth (a "
                      "large value reused in many calls)", pos)

    def new(self, cls, args, pos):
        """NEWOBJ: ``torch.nn.Parameter(*args)``, or ``cls.__new__(cls, *args)``."""
        name = cls.name if isinstance(cls, Global) else None
        args = self.args(args, pos)
        if name == "torch.nn.parameter.Parameter":
            if not 1 <= len(args) <= 2:
                self.fail("unsupported", "a parameter made without its tensor", pos)
            return self.parameter(args[0], args[1] if len(args) > 1 else True, pos)
        empty = {"collections.OrderedDict": ODict, "collections.Counter": Counter,
                 "builtins.set": set, "builtins.bytearray": bytearray}
        if name in empty:
            return empty[name]()
        if name in ("builtins.complex", "torch.Size", "torch.device"):
            return self.call(cls, args, pos)
        if name in UNSERVED:
            self.fail("unsupported", f"{UNSERVED[name]} ({name}), which tensorfs does not "
                      "serve,", pos)
        self.fail("forbidden", f"NEWOBJ of {self.what(cls)}", pos)

    def build(self, inst, state, pos):
        """BUILD: an ``OrderedDict``'s or ``Counter``'s attributes (set there, no value
        changed); a state torch would refuse is refused, and so is a tensor's (a legacy
        ``set_``)."""
        if type(inst) is ODict:                 # its __dict__.update(state)
            if type(state) in (list, tuple):
                self.spend(len(state), pos)
                for item in state:
                    if type(item) not in (tuple, list) or len(item) != 2:
                        self.fail("structure", "BUILD of an OrderedDict with other than "
                                  "pairs", pos)
                    self.hashable(item[0], pos)
            elif type(state) not in _DICTS:
                self.fail("structure", f"BUILD of an OrderedDict with a {type(state).__name__}",
                          pos)
            return
        if type(inst) is Counter or type(inst) in (set, bytearray, complex, Size) or \
                (type(inst) is Opaque and inst.what == "torch.device"):
            if not state:
                return
            if type(inst) is Counter:
                parts = state if type(state) is tuple and len(state) == 2 else (state, None)
                if all(not p or type(p) in _DICTS for p in parts):
                    return
            self.fail("structure", f"BUILD of a {self.what(inst)} with a state", pos)
        if type(inst) is Tensor:
            self.fail("unsupported", "BUILD of a tensor (a legacy set_ of its storage)", pos)
        self.fail("forbidden", f"BUILD of {self.what(inst)}", pos)

    def call(self, func, args: tuple, pos):
        """REDUCE: ``func(*args)`` of an allowed global, its effect modelled."""
        name = func.name if isinstance(func, Global) else None
        if name is None or name not in ALLOWED_GLOBALS:
            self.fail("forbidden", f"a call of {self.what(func)}", pos)
        if name in UNSERVED:
            self.fail("unsupported", f"{UNSERVED[name]} ({name}), which tensorfs does not "
                      "serve,", pos)
        if name in ("collections.OrderedDict", "collections.Counter"):
            return self.mapping(name, args, pos)
        if name.startswith("torch._utils._rebuild_"):
            return self.rebuild(name[len("torch._utils."):], args, pos)
        if name == "torch._tensor._rebuild_from_type_v2":
            return self.from_type(args, pos)
        if name == "torch.Size":
            if len(args) > 1:
                self.fail("structure", "torch.Size of more than one sequence", pos)
            return Size(self.ints(args[0] if args else (), "torch.Size", pos, signed=True))
        if name == "torch.device":
            return self.device(args, pos)
        if name == "torch.serialization._get_layout":
            if len(args) != 1 or args[0] not in _LAYOUTS:
                self.fail("structure", f"_get_layout of {_show(args)}", pos)
            return Opaque(args[0])
        if name == "_codecs.encode":
            if not 1 <= len(args) <= 3 or type(args[0]) is not str:
                self.fail("structure", "_codecs.encode of other than a string", pos)
            return self.encode(*args, pos=pos)
        if name == "builtins.set":
            if len(args) > 1:
                self.fail("structure", "set of more than one iterable", pos)
            return {self.hashable(v, pos) for v in self.iterable(args[0] if args else (), pos)}
        if name == "builtins.complex":
            if len(args) > 2 or not all(type(v) in (int, float, complex, bool) for v in args) \
                    and not (len(args) == 1 and type(args[0]) is str):
                self.fail("structure", "complex of other than numbers", pos)
            try:
                return complex(*args)
            except (ValueError, OverflowError, TypeError) as error:
                self.fail("structure", f"complex{_show(args)}: {error}", pos)
        if name == "builtins.bytearray":
            return self.bytearray_(args, pos)
        self.fail("forbidden", f"a call of {name}, which torch cannot call either,", pos)

    def mapping(self, name: str, args: tuple, pos):
        out = ODict() if name == "collections.OrderedDict" else Counter()
        if len(args) > 1:
            self.fail("structure", f"{name} of more than one argument", pos)
        if not args:
            return out
        arg = args[0]
        if type(arg) in _DICTS or type(arg) in (list, tuple):
            self.spend(len(arg), pos)
        if type(arg) in _DICTS:
            out.update(arg)
        elif type(out) is Counter:
            for item in self.iterable(arg, pos):
                item = self.hashable(item, pos)
                out[item] = out.get(item, 0) + 1
        elif type(arg) in (list, tuple):
            for item in arg:
                if type(item) not in (tuple, list) or len(item) != 2:
                    self.fail("structure", f"{name} of other than pairs", pos)
                out[self.hashable(item[0], pos)] = item[1]
        else:
            self.fail("structure", f"{name} of a {type(arg).__name__}", pos)
        return out

    def iterable(self, value, pos):
        if type(value) in (list, tuple, Size, set, str, bytes, bytearray) or \
                type(value) in _DICTS:
            self.spend(len(value), pos)
            return value
        self.fail("structure", f"a {type(value).__name__} where a sequence belongs", pos)

    def ints(self, value, what: str, pos: int, signed: bool = False) -> tuple:
        if type(value) in (tuple, list, Size):
            self.spend(len(value), pos)
        if type(value) not in (tuple, list, Size) or \
                not all(type(v) is int and (signed or v >= 0) and -_INT64 <= v < _INT64
                        for v in value):
            self.fail("structure", f"{what} is not a sequence of "
                      f"{'' if signed else 'non-negative '}64-bit integers", pos)
        return tuple(value)

    def device(self, args: tuple, pos):
        text = args[0] if args else None
        kind, _, index = text.partition(":") if type(text) is str else ("", "", "")
        if not 1 <= len(args) <= 2 or kind not in _DEVICE_TYPES or \
                (index and not index.isdigit()) or \
                (len(args) == 2 and (type(args[1]) is not int or index)):
            self.fail("structure", f"torch.device{_show(args)}", pos)
        return Opaque("torch.device")

    def encode(self, text: str, encoding="utf-8", errors="strict", *, pos: int) -> bytes:
        if encoding not in _TEXT_CODECS or errors != "strict":
            self.fail("unsupported", f"_codecs.encode with {_show(encoding)}, "
                      f"{_show(errors)}", pos)
        try:
            return text.encode(encoding)
        except UnicodeEncodeError as error:
            self.fail("structure", f"_codecs.encode: {_show(str(error))}", pos)

    def bytearray_(self, args: tuple, pos) -> bytearray:
        if not args:
            return bytearray()
        arg = args[0]
        if type(arg) in (bytes, bytearray, list, tuple, str):
            self.spend(len(arg), pos)
        if len(args) == 1 and type(arg) in (bytes, bytearray):
            return bytearray(arg)
        if len(args) == 1 and type(arg) is int and arg >= 0:
            self.spend(arg, pos)
            return bytearray(arg)
        if len(args) == 1 and type(arg) in (list, tuple) and \
                all(type(v) is int and 0 <= v < 256 for v in arg):
            return bytearray(arg)
        if type(arg) is str and len(args) <= 3:
            return bytearray(self.encode(*args, pos=pos))
        self.fail("structure", "bytearray of other than bytes", pos)

    def parameter(self, data, requires_grad, pos) -> Tensor:
        if type(data) is not Tensor:
            self.fail("unsupported", f"a parameter of a {type(data).__name__}, not of a "
                      "stored tensor,", pos)
        self.requires_grad(data, requires_grad, pos)
        return data

    def requires_grad(self, t: Tensor, value, pos) -> None:
        if type(value) is not bool:
            self.fail("structure", f"requires_grad {_show(value)}, not a bool,", pos)
        if value and t.dtype not in _FLOATING:
            self.fail("structure", f"requires_grad of a {t.dtype} tensor (only floating "
                      "point and complex ones can require gradients)", pos)

    def rebuild(self, name: str, args: tuple, pos) -> Tensor:
        """torch._utils' rebuild functions, each argument applied or refused."""
        if name in ("_rebuild_parameter", "_rebuild_parameter_with_state"):
            if len(args) != (3 if name == "_rebuild_parameter" else 4):
                self.fail("structure", f"{name} of {len(args)} arguments", pos)
            t = self.parameter(args[0], args[1], pos)
            if len(args) == 4:
                self.state(t, args[3], pos)
            return t
        n = {"_rebuild_tensor": (4,), "_rebuild_tensor_v2": (6, 7),
             "_rebuild_tensor_v3": (7, 8)}[name]
        if len(args) not in n or type(args[0]) is not Storage:
            self.fail("structure", f"{name} of other than (storage, offset, size, stride, "
                      "...)", pos)
        storage, offset = args[0], args[1]
        if type(offset) is not int or not 0 <= offset < _INT64:
            self.fail("structure", f"{name}: storage offset {_show(offset)}", pos)
        shape = self.ints(args[2], "a tensor's size", pos)
        strides = self.ints(args[3], "a tensor's stride", pos)
        if len(shape) != len(strides):
            self.fail("structure", "a tensor whose size and stride differ in length", pos)
        dtype = storage.dtype
        if name == "_rebuild_tensor_v3":
            d = args[6]
            if not isinstance(d, Global) or d.name[6:] not in _ALL_DTYPES or \
                    not d.name.startswith("torch."):
                self.fail("structure", f"{name} of other than a dtype", pos)
            dtype = d.name[6:]
        served = TORCH_DTYPES.get(dtype)
        if served is None:
            self.fail("unsupported", f"a tensor of torch.{dtype}, which tensorfs does not "
                      "serve,", pos)
        t = Tensor(storage, offset, shape, strides, served)
        if name != "_rebuild_tensor":
            self.requires_grad(t, args[4], pos)
            # args[5], backward_hooks: set and never used by torch ("only for backwards
            # compatibility"); changes no value
            metadata = args[7] if name == "_rebuild_tensor_v3" and len(args) == 8 else \
                args[6] if name == "_rebuild_tensor_v2" and len(args) == 7 else None
            self.metadata(metadata, pos)
        return t

    def metadata(self, metadata, pos) -> None:
        """set_tensor_metadata's: its ``neg`` and ``conj`` bits (a negative or conjugate
        view, whose values are not the stored ones) are refused; other keys change
        nothing."""
        if not metadata:
            return
        if type(metadata) not in _DICTS or \
                not all(type(k) is str and type(v) is bool for k, v in metadata.items()):
            self.fail("structure", f"tensor metadata {_show(metadata)}", pos)
        for bit, what in (("neg", "a negative view (torch._neg_view)"),
                          ("conj", "a conjugate view (.conj())")):
            if bit in metadata:
                self.fail("unsupported", f"a tensor with metadata {{{bit!r}: "
                          f"{metadata[bit]}}}, {what}, whose values are not the stored ones: "
                          "save it with .resolve_neg() / .resolve_conj()", pos)

    def state(self, t: Tensor, state, pos) -> None:
        """_set_obj_state's setattr of each name: a plain attribute changes no value; a
        tensor's own (``data``, ``real``, ``grad`` ...) is refused."""
        if not state:
            return
        if type(state) is tuple:
            if len(state) != 2:
                self.fail("structure", "a tensor's state of other than (dict, slots)", pos)
            parts = state
        else:
            parts = (state, None)
        for part in parts:
            if not part:
                continue
            if type(part) not in _DICTS:
                self.fail("structure", f"a tensor's state that is a {type(part).__name__}", pos)
            self.spend(len(part), pos)
            for key in part:
                if type(key) is not str:
                    self.fail("structure", f"a tensor's attribute named by a "
                              f"{type(key).__name__}", pos)
                if key in TENSOR_DESCRIPTORS:
                    self.fail("unsupported", f"a tensor whose state sets its {_show(key)}, "
                              "which tensorfs does not apply,", pos)

    def from_type(self, args: tuple, pos):
        """``_rebuild_from_type_v2(func, new_type, args, state)``: ``func(*args)`` as
        ``new_type`` (a tensor as torch.Tensor or a Parameter), its state set."""
        if len(args) != 4:
            self.fail("structure", f"_rebuild_from_type_v2 of {len(args)} arguments", pos)
        func, new_type, inner, state = args
        result = self.call(func, self.args(inner, pos), pos)
        kind = new_type.name if isinstance(new_type, Global) else None
        if type(result) is Tensor:
            if kind not in ("torch.Tensor", "torch.nn.parameter.Parameter"):
                self.fail("unsupported", f"a tensor subclass ({self.what(new_type)})", pos)
            self.state(result, state, pos)
            return result
        if kind != func.name or state:
            self.fail("structure", f"_rebuild_from_type_v2 of {self.what(func)} as "
                      f"{self.what(new_type)}", pos)
        return result


def pickle_decode_long(data: bytes) -> int:
    return int.from_bytes(data, "little", signed=True)


def _ascii(value):
    """torch's _maybe_decode_ascii: bytes as ASCII text."""
    return value.decode("ascii") if type(value) is bytes else value


_ITEMSIZE_OF = {dtype: ITEMSIZE[TORCH_DTYPES[dtype]] for dtype in TORCH_DTYPES}
_ITEMSIZE_OF.update({"complex128": 16, "complex32": 4})


# -- the checkpoint -------------------------------------------------------------------------

_CONTAINERS = (dict, ODict, Counter, list, tuple, Size)


def _flatten(top, at: int, budget: int):
    """(name, tensor) and (name, other value) leaves of nested dicts, lists and tuples,
    named by their keys joined with dots.  A container met again (memoized: shared, or a
    cycle) is walked again, within ``budget`` visits in all and ``MAX_DEPTH`` levels, and
    the names made hold at most ``budget`` characters in all (a long key the pickle gives
    once can be reused at every level: its names would cost far more than the file)."""
    tensors, others = [], []
    stack = [(top, "", 0)]
    name_budget = budget
    while stack:
        value, prefix, depth = stack.pop()
        budget -= 1
        if budget < 0:
            raise _error("structure", "the containers reach each other more often than "
                         "the pickle has bytes (shared or cyclic)", offset=at)
        if type(value) is Tensor:
            tensors.append((prefix, value))
        elif type(value) in _CONTAINERS:
            if depth >= MAX_DEPTH:
                raise _error("structure", f"containers nested more than {MAX_DEPTH} deep "
                             "(or a cycle)", offset=at)
            items = value.items() if isinstance(value, dict) else enumerate(value)
            children = []
            for key, item in items:
                if type(key) not in (str, int, bool):
                    raise _error("structure", f"{_show(prefix) if prefix else 'the top'}: a "
                                 f"key that is a {type(key).__name__}", offset=at)
                name = f"{prefix}.{key}" if prefix else str(key)
                name_budget -= len(name)
                if name_budget < 0:
                    raise _error("structure", "the names of the values are longer than the "
                                 "pickle is worth (a long key reused at many levels)",
                                 offset=at)
                children.append((item, name, depth + 1))
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
        raise _error("structure", f"the string {_show(text)} is not valid UTF-8 (a lone "
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
    if isinstance(value, (bytes, bytearray, set, frozenset)):
        return MetadataValue.of("string", f"<{type(value).__name__} of {len(value)}>")
    if isinstance(value, Opaque):
        return MetadataValue.of("string", f"<{value.what}>")
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
    def record(key: str) -> int | None:
        entry = entries.get(f"{prefix}/data/{key}")
        return None if entry is None else entry.size

    walker = _Walker(data, pkl.offset, record)
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
            raise _error("structure", f"two tensors named {_show(name)}", name=name)
        names.add(name)
        infos.append(_tensor_info(name, t, entries, prefix, path))
    metadata = {}
    for name, value in others:
        if name in names or name in metadata:
            raise _error("structure", f"two values named {_show(name)}", name=name)
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
        raise _error("storage", f"tensor {_show(name)}: storage {_show(storage.key)} has no entry "
                     f"{prefix}/data/{storage.key}", name=name)
    if entry.offset < 0:
        raise _error("zip", f"entry {_show(entry.name)} is compressed (method "
                     f"{-entry.offset - 1}): torch.save stores every entry", name=name)
    unit = _ITEMSIZE_OF[storage.dtype]
    itemsize = ITEMSIZE[t.dtype]
    storage_bytes = storage.numel * unit
    if entry.size < storage_bytes:
        raise _error("storage", f"storage {_show(storage.key)} is {entry.size} bytes, shorter than "
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
    if numel == 0:
        start = 0                       # no byte of it is read: torch checks no bound
    elif end > storage_bytes:
        raise _error("storage", f"tensor {_show(name)} ({t.dtype} {_show(list(t.shape))} at element "
                     f"{t.offset}) runs past its storage {_show(storage.key)} of {storage_bytes} "
                     "bytes", offset=entry.offset, name=name)
    strides = None if is_contiguous(t.shape, t.strides) else tuple(t.strides)
    if strides is not None and len(t.shape) > MAX_STRIDED_DIMS:
        raise _error("unsupported", f"tensor {_show(name)}: a non-contiguous tensor of "
                     f"{len(t.shape)} dimensions (at most {MAX_STRIDED_DIMS} are gathered)",
                     name=name)
    return TensorInfo(name, t.dtype, tuple(t.shape), entry.offset + start, numel * itemsize,
                      path, strides=strides)
