"""tensorfs serves what ``torch.load(weights_only=True)`` gives, or refuses in one line
(issue 43): each file here is crafted to make a reader disagree with torch's -- its zip
container (read by miniz in torch), its tensors' rebuild arguments, its globals -- and is
loaded by torch itself in the test.  Where tensorfs serves the file, every tensor's values are
torch's; where it refuses, the refusal is one line naming what it met."""

from __future__ import annotations

import io
import struct
import zipfile
from pathlib import Path

import numpy as np
import pytest

from tests.support import run_tensorfs

torch = pytest.importorskip("torch")

import tensorfs  # noqa: E402
from tensorfs.errors import ModelError  # noqa: E402


def _saved(obj, path: Path | None = None) -> bytes:
    buf = io.BytesIO()
    torch.save(obj, buf)
    if path is not None:
        path.write_bytes(buf.getvalue())
    return buf.getvalue()


def _torch(path: Path):
    """torch's own reading of the file: its state dict, or None where torch refuses it."""
    import warnings

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return torch.load(path, weights_only=True)
    except Exception:
        return None


def _flat(value, prefix=""):
    if isinstance(value, torch.Tensor):
        yield prefix, value
    elif isinstance(value, dict):
        for k, v in value.items():
            yield from _flat(v, f"{prefix}.{k}" if prefix else str(k))
    elif isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            yield from _flat(v, f"{prefix}.{i}" if prefix else str(i))


def _numpy(t):
    t = t.detach().resolve_conj().resolve_neg()
    if t.dtype in (torch.bfloat16, torch.float8_e4m3fn, torch.float8_e5m2):
        return t.float().numpy()
    return t.numpy()


def served_or_refused(path: Path) -> str | None:
    """None where tensorfs serves ``path`` with torch's values for every tensor (and torch
    loads it); else tensorfs's one-line refusal."""
    theirs = _torch(path)
    try:
        with tensorfs.open(path) as m:
            ours = {name: m.array(name) for name in m.tensors}
    except ModelError as error:
        text = str(error)
        assert "\n" not in text and text, text
        return text
    assert theirs is not None, f"tensorfs serves {path.name}, which torch refuses"
    expected = dict(_flat(theirs))
    assert set(ours) == set(expected)
    for name, t in expected.items():
        np.testing.assert_array_equal(ours[name], _numpy(t), err_msg=name)
        assert ours[name].shape == tuple(t.shape), name
    return None


def assert_refused(path: Path, *words: str) -> str:
    said = served_or_refused(path)
    assert said is not None, f"{path.name} is served"
    for word in words:
        assert word in said, said
    return said


# -- the zip container: the archive torch reads ----------------------------------------------

A = {"w": torch.arange(4.0)}
B = {"w": -torch.arange(4.0) - 10}


def _shifted(data: bytes, shift: int) -> bytes:
    """A torch.save archive with each of its absolute offsets moved by ``shift`` (to be
    placed ``shift`` bytes into another file)."""
    d = bytearray(data)
    e = d.rfind(b"PK\x05\x06")
    n, _, cd = struct.unpack_from("<HII", d, e + 10)
    struct.pack_into("<I", d, e + 16, cd + shift)
    if d[e - 20:e - 16] == b"PK\x06\x07":
        (rec,) = struct.unpack_from("<Q", d, e - 12)
        struct.pack_into("<Q", d, e - 12, rec + shift)
        (cd,) = struct.unpack_from("<Q", d, rec + 48)
        struct.pack_into("<Q", d, rec + 48, cd + shift)
    at = cd
    for _ in range(n):
        nlen, xlen, clen = struct.unpack_from("<HHH", d, at + 28)
        (local,) = struct.unpack_from("<I", d, at + 42)
        struct.pack_into("<I", d, at + 42, local + shift)
        at += 46 + nlen + xlen + clen
    return bytes(d)


def _end_record_in_comment(after: bytes = b"") -> bytes:
    """A's archive whose end-record comment holds B's whole archive (then ``after``): miniz
    takes the last end record, another reader the first."""
    a = _saved(A)
    e = a.rfind(b"PK\x05\x06")
    comment = _shifted(_saved(B), e + 22) + after
    out = bytearray(a[:e + 22])
    struct.pack_into("<H", out, e + 20, len(comment))
    return bytes(out) + comment


def _zip64_elsewhere() -> bytes:
    """A then B: the last end record's 32-bit fields name A's central directory, its zip64
    locator B's, which miniz follows."""
    a, b = _saved(A), _saved(B)
    out = bytearray(a + _shifted(b, len(a)))
    ea = a.rfind(b"PK\x05\x06")
    e = out.rfind(b"PK\x05\x06")
    out[e + 8:e + 20] = a[ea + 8:ea + 20]           # A's entry count, size and offset
    return bytes(out)


def _local_header_sizes_changed() -> bytes:
    data = bytearray(_saved(A))
    at = data.find(b"PK\x03\x04", data.find(b"data/0") - 40)
    struct.pack_into("<II", data, at + 18, 3, 5)    # the local sizes lie; miniz reads the central
    return bytes(data)


def _locator_to_nothing() -> bytes:
    """A zip64 locator pointing at no zip64 record: miniz ignores it, and so does tensorfs."""
    data = bytearray(_saved(A))
    e = data.rfind(b"PK\x05\x06")
    struct.pack_into("<Q", data, e - 12, 0)
    return bytes(data)


def _rewritten(change) -> bytes:
    src = io.BytesIO(_saved(A))
    out = io.BytesIO()
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(out, "w") as zout:
        for info in zin.infolist():
            for name, data in change(info.filename, zin.read(info.filename)):
                zout.writestr(zipfile.ZipInfo(name, info.date_time), data)
    return out.getvalue()


def _renamed(old: str, new: str):
    return lambda n, d: [(n.replace(old, new), d)]


def _version(text: bytes | None):
    def change(n, d):
        if n.endswith("/version"):
            return [] if text is None else [(n, text)]
        return [(n, d)]
    return change


ZIPS = {
    # (the file, None where it is served as torch reads it, else words of the refusal)
    "end record inside the comment, at the end": (lambda: _end_record_in_comment(),
                                                  ["two zip end records"]),
    "end record inside the comment, bytes after": (lambda: _end_record_in_comment(b"xyz"),
                                                   ["followed by", "not its 0-byte comment"]),
    "bytes after the archive": (lambda: _saved(A) + b"junk", ["followed by"]),
    "bytes before the archive": (lambda: b"junk" + _saved(A), ["first bytes"]),
    "zip64 record naming another directory": (_zip64_elsewhere, ["different archives"]),
    "zip64 locator to nothing": (_locator_to_nothing, None),
    "local header sizes differ": (_local_header_sizes_changed, None),
    "two entries of one name": (lambda: _rewritten(lambda n, d: [(n, d), (n, d)]
                                                   if n.endswith("data/0") else [(n, d)]),
                                ["two entries named"]),
    "names differing in case": (lambda: _rewritten(lambda n, d: [(n, d), (n.upper(), d)]
                                                   if n.endswith("data/0") else [(n, d)]),
                                ["differ only in case"]),
    "no version record": (lambda: _rewritten(_version(None)), ["no version record"]),
    "version too new": (lambda: _rewritten(_version(b"11\n")), ["archive version"]),
    "version unreadable": (lambda: _rewritten(_version(b"three")), ["archive version"]),
    "version as stoll reads it": (lambda: _rewritten(_version(b" 3 trailing")), None),
    "storage alignment unreadable": (
        lambda: _rewritten(lambda n, d: [(n, b"x" if n.endswith(".storage_alignment") else d)]),
        ["storage alignment"]),
    "serialization id not UTF-8": (
        lambda: _rewritten(lambda n, d: [(n, b"\xff" * 8 if n.endswith("serialization_id")
                                          else d)]), ["serialization id"]),
    "storage record longer than its elements": (
        lambda: _rewritten(lambda n, d: [(n, d + b"\0" * 4 if n.endswith("data/0") else d)]),
        ["longer than"]),
    "another top folder name": (lambda: _rewritten(_renamed("archive/", "weights/")), None),
    "two top folders": (lambda: _rewritten(lambda n, d: [(n.replace("archive/", "other/"), d)]
                                           if n.endswith("data/0") else [(n, d)]),
                        ["one folder"]),
}


@pytest.mark.parametrize("case", list(ZIPS))
def test_zip_is_read_as_torch_reads_it(tmp_path, case):
    make, refused = ZIPS[case]
    path = tmp_path / "crafted.pt"
    path.write_bytes(make())
    if refused is None:
        assert served_or_refused(path) is None
    else:
        assert_refused(path, *refused)


def test_end_record_in_comment_is_refused_by_the_command_in_one_line(tmp_path):
    path = tmp_path / "two-ends.pt"
    path.write_bytes(_end_record_in_comment(b"xyz"))
    # torch takes the archive in the comment, B; a reader of the first end record, A
    assert torch.equal(_torch(path)["w"], B["w"])
    result = run_tensorfs("inspect", path)
    assert result.returncode == 1 and len(result.stderr.splitlines()) == 1, result.stderr
    assert "zip end record" in result.stderr


# -- pickles written here: one opcode, global or rebuild argument at a time --------------------

W = np.arange(6, dtype=np.float32)


def _s(text: str) -> bytes:
    raw = text.encode("utf-8", "surrogatepass")
    return b"X" + struct.pack("<I", len(raw)) + raw


def _ints(values) -> bytes:
    return b"(" + b"".join(b"J" + struct.pack("<i", v) for v in values) + b"t"


def _storage(cls: str = "torch\nFloatStorage", key: str = "0", numel: int = 6,
             location: bytes = _s("cpu")) -> bytes:
    return (b"(" + _s("storage") + b"c" + cls.encode() + b"\n" + _s(key) + location +
            b"J" + struct.pack("<i", numel) + b"tQ")


def _tensor(offset: int = 0, shape=(2, 3), strides=(3, 1), tail: bytes | None = None,
            storage: bytes | None = None) -> bytes:
    """``_rebuild_tensor_v2(storage, offset, shape, strides, requires_grad, hooks)`` as
    torch.save writes it; ``tail`` replaces its last two arguments."""
    tail = b"\x89ccollections\nOrderedDict\n)R" if tail is None else tail
    return (b"ctorch._utils\n_rebuild_tensor_v2\n(" + (storage or _storage()) +
            b"J" + struct.pack("<i", offset) + _ints(shape) + _ints(strides) + tail + b"tR")


def _checkpoint(tmp_path: Path, items: bytes, storage: bytes = W.tobytes(),
                head: bytes = b"\x80\x02", name: str = "crafted.pt") -> Path:
    """A checkpoint whose data.pkl is ``{...items}`` (SETITEMS of ``items``)."""
    pkl = head + b"}(" + items + b"u."
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as z:
        z.writestr("archive/data.pkl", pkl)
        z.writestr("archive/byteorder", b"little")
        z.writestr("archive/data/0", storage)
        z.writestr("archive/version", b"3\n")
    path = tmp_path / name
    path.write_bytes(out.getvalue())
    return path


def test_the_pickles_written_here_are_what_torch_reads(tmp_path):
    path = _checkpoint(tmp_path, _s("w") + _tensor())
    assert served_or_refused(path) is None
    np.testing.assert_array_equal(_torch(path)["w"].numpy(), W.reshape(2, 3))


# -- class 2: every rebuild argument applied or refused ---------------------------------------

def _saved_state(tmp_path: Path, state: dict) -> Path:
    path = tmp_path / "saved.pt"
    _saved(state, path)
    return path


def test_a_negative_view_is_refused_not_served_as_its_storage(tmp_path):
    x = torch.arange(4.0)
    path = _saved_state(tmp_path, {"x": x, "n": torch._neg_view(x)})
    assert torch.equal(_torch(path)["n"].resolve_neg(), -x)
    assert_refused(path, "negative view", "'neg'")


def test_a_conjugate_view_is_refused_not_served_as_its_storage(tmp_path):
    c = torch.tensor([1 + 2j, 3 - 1j], dtype=torch.complex64)
    path = _saved_state(tmp_path, {"c": c, "cc": c.conj()})
    assert torch.equal(_torch(path)["cc"].resolve_conj(), c.conj().resolve_conj())
    assert_refused(path, "conjugate view", "'conj'")


def test_a_tensors_state_that_sets_its_values_is_refused(tmp_path):
    """``p.data = zeros`` in the state torch.save writes for a parameter with attributes:
    torch applies it (the values become zeros); a plain attribute changes nothing."""
    p = torch.nn.Parameter(torch.ones(3))
    p.abcd = torch.zeros(3)
    p.note = "kept"
    path = _saved_state(tmp_path, {"p": p})
    assert served_or_refused(path) is None                    # plain attributes: served
    with zipfile.ZipFile(path) as z:
        pkl = z.read("archive/data.pkl")
    assert pkl.count(b"abcd") == 1
    real = rewrite_pickle(path, tmp_path / "real.pt", pkl.replace(b"abcd", b"data"))
    assert torch.equal(_torch(real)["p"].detach(), torch.zeros(3))
    assert_refused(real, "'data'")


def rewrite_pickle(src: Path, dst: Path, pkl: bytes) -> Path:
    out = io.BytesIO()
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(out, "w") as zout:
        for info in zin.infolist():
            data = pkl if info.filename.endswith("/data.pkl") else zin.read(info.filename)
            zout.writestr(zipfile.ZipInfo(info.filename, info.date_time), data)
    dst.write_bytes(out.getvalue())
    return dst


HOOKS = b"ccollections\nOrderedDict\n)R"
REBUILDS = {
    # name: (the pickled value of "w", served as torch reads it: True; refused: its words)
    "requires_grad True": (_tensor(tail=b"\x88" + HOOKS), True),
    "requires_grad an int": (_tensor(tail=b"K\x01" + HOOKS), ["requires_grad"]),
    "requires_grad None": (_tensor(tail=b"N" + HOOKS), ["requires_grad"]),
    "requires_grad of an int tensor": (
        _tensor(shape=(6,), strides=(1,), tail=b"\x88" + HOOKS,
                storage=_storage("torch\nIntStorage")), ["requires_grad of a I32"]),
    "backward hooks not empty": (_tensor(tail=b"\x89ccollections\nOrderedDict\n)R" +
                                      b"K\x01K\x02s"), True),
    "backward hooks None": (_tensor(tail=b"\x89N"), True),
    "metadata neg True": (_tensor(tail=b"\x89" + HOOKS + b"}" + _s("neg") + b"\x88s"),
                          ["negative view"]),
    "metadata neg False": (_tensor(tail=b"\x89" + HOOKS + b"}" + _s("neg") + b"\x89s"),
                           ["negative view"]),
    "metadata conj": (_tensor(tail=b"\x89" + HOOKS + b"}" + _s("conj") + b"\x88s"),
                      ["conjugate view"]),
    "metadata other key": (_tensor(tail=b"\x89" + HOOKS + b"}" + _s("other") + b"\x88s"),
                           True),
    "metadata empty": (_tensor(tail=b"\x89" + HOOKS + b"}"), True),
    "metadata an int": (_tensor(tail=b"\x89" + HOOKS + b"K\x01"), ["metadata"]),
    "empty tensor far past its storage": (_tensor(offset=1000, shape=(0, 3), strides=(3, 1)),
                                          True),
    "storage offset a bool": (_tensor().replace(b"J\x00\x00\x00\x00(J\x02", b"\x89(J\x02"),
                              ["storage offset"]),
    "size as a list": (_tensor().replace(b"(J\x02\x00\x00\x00J\x03\x00\x00\x00t",
                                         b"](J\x02\x00\x00\x00J\x03\x00\x00\x00e", 1), True),
    "parameter": (b"ctorch._utils\n_rebuild_parameter\n(" + _tensor() + b"\x88" + HOOKS +
                  b"tR", True),
    "parameter requires_grad an int": (b"ctorch._utils\n_rebuild_parameter\n(" + _tensor() +
                                       b"K\x01" + HOOKS + b"tR", ["requires_grad"]),
    "parameter of no tensor": (b"ctorch._utils\n_rebuild_parameter\n(N\x89" + HOOKS + b"tR",
                               ["parameter of a NoneType"]),
    "Parameter by NEWOBJ": (b"ctorch.nn.parameter\nParameter\n" + _tensor() + b"\x85\x81",
                            True),
    "from_type_v2 as Tensor": (b"ctorch._tensor\n_rebuild_from_type_v2\n(ctorch._utils\n"
                               b"_rebuild_tensor_v2\nctorch\nTensor\n(" + _storage() +
                               b"K\x00" + _ints((6,)) + _ints((1,)) + b"\x89" + HOOKS +
                               b"t}" + _s("note") + b"K\x01stR", True),
    "from_type_v2 setting data": (b"ctorch._tensor\n_rebuild_from_type_v2\n(ctorch._utils\n"
                                  b"_rebuild_tensor_v2\nctorch\nTensor\n(" + _storage() +
                                  b"K\x00" + _ints((6,)) + _ints((1,)) + b"\x89" + HOOKS +
                                  b"t}" + _s("data") + _tensor(shape=(6,), strides=(1,)) +
                                  b"stR", ["'data'"]),
    "BUILD of a tensor": (_tensor() + b"(" + _storage() + b"K\x00" + _ints((6,)) +
                          _ints((1,)) + b"tb", ["BUILD of a tensor"]),
    "storage on the meta device": (_tensor(storage=_storage(location=_s("meta"))),
                                   ["device"]),
    "storage as a legacy tensor type": (_tensor(storage=_storage("torch\nFloatTensor")), True),
    "storage of cuda type": (_tensor(storage=_storage("torch.cuda\nFloatStorage")), True),
    "untyped storage": (_tensor(shape=(24,), strides=(1,),
                                storage=_storage("torch.storage\nUntypedStorage", numel=24)),
                        True),
    "torch.UntypedStorage": (_tensor(storage=_storage("torch\nUntypedStorage", numel=24)),
                             ["forbidden global torch.UntypedStorage"]),
    "a storage id of an int key": (_tensor().replace(_s("0"), b"K\x00", 1), True),
    "storage missing, in a value not served": (_s("x") + b"(" + _storage(key="9") + b"t",
                                               ["no entry"]),
}


@pytest.mark.parametrize("case", list(REBUILDS))
def test_rebuild_arguments_are_applied_or_refused(tmp_path, case):
    value, expected = REBUILDS[case]
    path = _checkpoint(tmp_path, _s("w") + value)
    if expected is True:
        assert served_or_refused(path) is None
    else:
        assert_refused(path, *expected)


# -- class 7: the allow-list is torch's, exactly ---------------------------------------------

def test_the_allowed_globals_are_torchs():
    from torch._weights_only_unpickler import _get_allowed_globals

    from tensorfs.formats import pytorch

    assert pytorch.ALLOWED_GLOBALS == set(_get_allowed_globals())


def test_the_tensor_attributes_a_state_may_not_set_are_torchs():
    import inspect

    from tensorfs.formats import pytorch

    descriptors = {name for name in dir(torch.nn.Parameter)
                   if hasattr(type(inspect.getattr_static(torch.nn.Parameter, name)), "__set__")}
    assert pytorch.TENSOR_DESCRIPTORS == descriptors


def _global_names() -> list[str]:
    from torch._weights_only_unpickler import _get_allowed_globals

    return sorted(_get_allowed_globals()) + [
        "torch.UntypedStorage", "builtins.frozenset", "builtins.dict", "builtins.getattr",
        "builtins.eval", "os.system", "posix.system", "sys.modules", "collections.defaultdict",
        "collections.deque", "torch.nn.Module", "torch.storage._load_from_bytes",
        "torch._utils._rebuild_tensor_v2.__globals__", "torch.serialization.os.system",
        "numpy.core.multiarray._reconstruct", "__builtin__.set", "UserDict.OrderedDict",
        "copy_reg._reconstructor", "torch.nn.parameter.Buffer", "torch.Generator",
    ]


@pytest.mark.parametrize("name", _global_names())
def test_each_global_is_accepted_or_refused_as_torch_does(tmp_path, name):
    """A global as a value beside a tensor: torch's reader takes it (and the file) when it is
    on its allow-list, and so does tensorfs; any other is refused by both."""
    module, attr = name.rsplit(".", 1)
    path = _checkpoint(tmp_path, _s("w") + _tensor() + _s("g") +
                       b"c" + module.encode() + b"\n" + attr.encode() + b"\n")
    said = served_or_refused(path)
    if _torch(path) is None:
        assert said is not None and "forbidden global" in said, said
    else:
        assert said is None


def _value(snippet: bytes) -> bytes:
    """Key "k" and a value (inside the top dict's SETITEMS)."""
    return _s("k") + snippet


# name: the items added to the top dict (beside "w", a tensor), using that opcode
OPCODES = {
    "BININT": _value(b"J\x01\x00\x00\x00"), "BININT1": _value(b"K\x01"),
    "BININT2": _value(b"M\x01\x00"), "LONG1": _value(b"\x8a\x02\x01\x01"),
    "INT": _value(b"I1\n"), "LONG": _value(b"L1L\n"), "LONG4": _value(b"\x8b\x01\x00\x00\x00\x01"),
    "BINFLOAT": _value(b"G" + struct.pack(">d", 1.5)), "FLOAT": _value(b"F1.5\n"),
    "BINUNICODE": _value(_s("v")), "SHORT_BINUNICODE": _value(b"\x8c\x01v"),
    "BINUNICODE8": _value(b"\x8d" + struct.pack("<Q", 1) + b"v"),
    "UNICODE": _value(b"Vv\n"), "SHORT_BINSTRING": _value(b"U\x01v"),
    "SHORT_BINSTRING not UTF-8": _value(b"U\x01\xe9"),
    "BINSTRING": _value(b"T\x01\x00\x00\x00v"), "STRING": _value(b"S'v'\n"),
    "SHORT_BINBYTES": _value(b"C\x01v"), "BINBYTES": _value(b"B\x01\x00\x00\x00v"),
    "BINBYTES8": _value(b"\x8e" + struct.pack("<Q", 1) + b"v"),
    "BYTEARRAY8": _value(b"\x96" + struct.pack("<Q", 1) + b"v"),
    "NONE": _value(b"N"), "NEWTRUE": _value(b"\x88"), "NEWFALSE": _value(b"\x89"),
    "EMPTY_TUPLE": _value(b")"), "TUPLE1": _value(b"K\x01\x85"), "TUPLE2": _value(b"K\x01K\x02\x86"),
    "TUPLE3": _value(b"K\x01K\x02K\x03\x87"), "MARK TUPLE": _value(b"(K\x01K\x02t"),
    "EMPTY_LIST": _value(b"]"), "APPEND": _value(b"]K\x01a"), "APPENDS": _value(b"](K\x01e"),
    "LIST": _value(b"(K\x01l"), "EMPTY_DICT": _value(b"}"), "SETITEM": _value(b"}K\x01K\x02s"),
    "DICT": _value(b"(K\x01K\x02d"), "EMPTY_SET": _value(b"\x8f"),
    "ADDITEMS": _value(b"\x8f(K\x01\x90"), "FROZENSET": _value(b"(K\x01\x91"),
    "POP": _value(b"K\x01K\x020"), "POP_MARK": _value(b"K\x01(K\x021"), "DUP": _value(b"K\x012") +
    b"0",
    "BINPUT BINGET": _value(b"K\x07q\x05") + _s("k2") + b"h\x05",
    "LONG_BINPUT LONG_BINGET": _value(b"K\x07r\x05\x00\x00\x00") + _s("k2") +
    b"j\x05\x00\x00\x00",
    "PUT": _value(b"K\x07p5\n"), "GET": _value(b"K\x07q\x05") + _s("k2") + b"g5\n",
    "MEMOIZE": _value(b"K\x07\x94"),
    "GLOBAL": _value(b"ccollections\nOrderedDict\n"),
    "STACK_GLOBAL": _value(_s("collections") + _s("OrderedDict") + b"\x93"),
    "REDUCE": _value(b"ccollections\nOrderedDict\n)R"),
    "NEWOBJ": _value(b"ccollections\nOrderedDict\n)\x81"),
    "NEWOBJ_EX": _value(b"ccollections\nOrderedDict\n)}\x92"),
    "BUILD": _value(b"ccollections\nOrderedDict\n)R}b"),
    "BUILD with a list": _value(b"ccollections\nOrderedDict\n)R]b"),
    "BUILD with an int": _value(b"ccollections\nOrderedDict\n)RK\x01b"),
    "BUILD of a Counter with None": _value(b"ccollections\nCounter\n)RNb"),
    "BUILD of a dict": _value(b"}}b"),
    "INST": _value(b"(icollections\nOrderedDict\n"),
    "OBJ": _value(b"(ccollections\nOrderedDict\no"),
    "EXT1": _value(b"\x82\x01"), "PERSID": _value(b"P0\n"),
    "NEXT_BUFFER": _value(b"\x97"), "READONLY_BUFFER": _value(_s("v") + b"\x98"),
    "MARK left open at STOP": b"(",
    "values left under the result at STOP": b"",
}
HEADS = {"values left under the result at STOP": b"\x80\x02K\x01"}


@pytest.mark.parametrize("case", list(OPCODES))
def test_each_opcode_is_accepted_or_refused_as_torch_does(tmp_path, case):
    """Each opcode of pickle protocols 0 to 5 in a checkpoint's data.pkl: tensorfs serves the
    file where torch's weights-only reader takes it (with torch's values), and refuses it in
    one line where torch does."""
    path = _checkpoint(tmp_path, _s("w") + _tensor() + OPCODES[case],
                       head=HEADS.get(case, b"\x80\x02"))
    said = served_or_refused(path)
    theirs = _torch(path)
    assert (said is None) == (theirs is not None), said
    if said is None:
        with tensorfs.open(path) as m:
            if "k" in theirs and type(theirs["k"]) in (int, float, str, bool):
                assert m.metadata["k"] == theirs["k"]


@pytest.mark.parametrize("protocol", [0, 1, 2, 3, 4, 5])
def test_a_state_dict_of_each_protocol_is_accepted_or_refused_as_torch_does(tmp_path,
                                                                            protocol):
    from tests.support.pytorch_models import tricky_state_dict

    path = tmp_path / "model.pt"
    torch.save(tricky_state_dict(), path, pickle_protocol=protocol)
    said = served_or_refused(path)
    assert (said is None) == (_torch(path) is not None), said
