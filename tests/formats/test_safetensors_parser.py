"""The safetensors parser against the reference implementation (no FUSE).

Oracles: files written by ``safetensors.numpy`` / ``safetensors.serialize`` and read back by
``safetensors.safe_open`` and ``safetensors.deserialize`` (the Rust reader, tensor.rs).
"""

from __future__ import annotations

import json
import mmap
import os
import struct
import tempfile

import numpy as np
import pytest
import safetensors
import safetensors.numpy as st_numpy
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tensorfs.dtypes import SAFETENSORS_DTYPES
from tensorfs.errors import SafetensorsError
from tensorfs.formats import NeedMoreBytes
from tensorfs.formats import safetensors as parser_module
from tensorfs.formats.safetensors import (
    ERROR_KINDS,
    MAX_HEADER_SIZE,
    looks_like_safetensors,
    parse_safetensors,
)
from tensorfs.model import ModelFile
from tests.support.safetensors_corpus import CASES, VALID_ODD, build, frame, pad8, tensor

NUMPY_DTYPES = {
    np.bool_: "BOOL", np.uint8: "U8", np.int8: "I8", np.uint16: "U16", np.int16: "I16",
    np.uint32: "U32", np.int32: "I32", np.uint64: "U64", np.int64: "I64",
    np.float16: "F16", np.float32: "F32", np.float64: "F64", np.complex64: "C64",
}

FAST = settings(deadline=None, suppress_health_check=[HealthCheck.too_slow],
                max_examples=100)


# -- helpers ------------------------------------------------------------------------------


def parse(data: bytes, path: str = "<memory>") -> ModelFile:
    return parse_safetensors(data, len(data), path)


def parse_by_prefix(data: bytes, first: int = 8) -> ModelFile:
    """Parse the way the opener does: a short prefix, then exactly what NeedMoreBytes asks."""
    size = first
    for _ in range(3):
        try:
            return parse_safetensors(data[:size], len(data))
        except NeedMoreBytes as more:
            assert more.needed > size
            size = more.needed
    raise AssertionError("NeedMoreBytes asked more than twice")


def json_order(data: bytes) -> list[str]:
    n = struct.unpack_from("<Q", data)[0]
    pairs = json.loads(data[8:8 + n], object_pairs_hook=lambda p: p)
    return [k for k, _ in pairs if k != "__metadata__"]


def reference_tensors(data: bytes) -> dict:
    """What the Rust reader sees: name -> (dtype, shape, bytes)."""
    return {name: (info["dtype"], list(info["shape"]), bytes(info["data"]))
            for name, info in safetensors.deserialize(data)}


def reference_accepts(data: bytes) -> bool:
    try:
        safetensors.deserialize(data)
    except Exception:       # the reference's own error type; any refusal counts
        return False
    return True


def assert_same_as_reference(data: bytes, model: ModelFile) -> None:
    ref = reference_tensors(data)
    ours = {t.name: (t.dtype, list(t.shape), data[t.offset:t.offset + t.nbytes])
            for t in model.tensors}
    assert ours == ref
    assert len(model.tensors) == len(ref)
    assert [t.name for t in model.tensors] == json_order(data)


def assert_well_formed(model: ModelFile, data: bytes) -> None:
    assert model.format == "safetensors" and model.version is None
    assert model.endianness == "little" and model.alignment is None
    assert model.file_size == len(data)
    n = struct.unpack_from("<Q", data)[0]
    assert model.header_size == model.data_offset == 8 + n
    covered = 0
    for t in model.tensors:
        assert model.header_size <= t.offset <= t.offset + t.nbytes <= len(data)
        assert t.byte_order == "<" and t.ggml_type is None
        bits = SAFETENSORS_DTYPES[t.dtype].bits
        assert t.nbytes * 8 == t.n_elements * bits
        covered += t.nbytes
    assert model.header_size + covered == len(data)


def assert_refused(data: bytes, kind: str | None = None) -> SafetensorsError:
    with pytest.raises(SafetensorsError) as info:
        parse(data)
    err = info.value
    if kind is not None:
        assert err.kind == kind, str(err)
    assert err.kind in ERROR_KINDS
    text = str(err)
    assert text and len(text.splitlines()) == 1 and "\n" not in text and "\r" not in text
    assert isinstance(err.offset, int) and err.offset >= 0
    return err


# -- files from the reference writer --------------------------------------------------------


@pytest.mark.parametrize("np_dtype", list(NUMPY_DTYPES), ids=lambda d: NUMPY_DTYPES[d])
def test_reference_writer_every_numpy_dtype(tmp_path, np_dtype):
    rng = np.random.default_rng(7)
    raw = rng.integers(0, 256, size=3 * 5 * np.dtype(np_dtype).itemsize, dtype=np.uint8)
    matrix = (raw % 2).astype(bool) if np_dtype is np.bool_ else raw.view(np_dtype)
    tensors = {
        "model.layers.0.weight": matrix.reshape(3, 5),
        "scalar": matrix.reshape(-1)[:1].reshape(()),
        "empty": np.zeros((0, 4), dtype=np_dtype),
        "flat": matrix.reshape(-1),
    }
    metadata = {"format": "np", "note": "h\u00e9llo \U0001f600", "": "empty key"}
    path = tmp_path / "m.safetensors"
    st_numpy.save_file(tensors, str(path), metadata=metadata)
    data = path.read_bytes()

    model = parse_safetensors(data, len(data), str(path), mtime=12.5)
    assert_well_formed(model, data)
    assert model.path == str(path) and model.mtime == 12.5
    assert all(t.file == str(path) for t in model.tensors)
    with safetensors.safe_open(str(path), "numpy") as ref:
        assert sorted(t.name for t in model.tensors) == sorted(ref.keys())
        assert {k: v.value() for k, v in model.metadata.items()} == ref.metadata()
        assert all(v.type_name == "string" for v in model.metadata.values())
        for t in model.tensors:
            sl = ref.get_slice(t.name)
            assert t.dtype == sl.get_dtype() == NUMPY_DTYPES[np_dtype]
            assert list(t.shape) == sl.get_shape()
            assert data[t.offset:t.offset + t.nbytes] == ref.get_tensor(t.name).tobytes()
    assert [t.name for t in model.tensors] == json_order(data)


def test_metadata_in_file_order():
    data = build([], {"zeta": "1", "alpha": "2", "mid": "3"})
    model = parse(data)
    assert list(model.metadata) == ["zeta", "alpha", "mid"]
    assert model.metadata["alpha"].value() == "2"


def test_tensors_in_json_order_not_offset_order():
    data = build([("b", tensor("U8", [2], 2, 4)), ("a", tensor("U8", [2], 0, 2))], data=b"abcd")
    model = parse(data)
    assert [t.name for t in model.tensors] == ["b", "a"]
    assert [(t.offset - model.header_size, t.nbytes) for t in model.tensors] == [(2, 2), (0, 2)]
    assert_same_as_reference(data, model)


# Every reference dtype name the installed reference writer knows, under its framework name.
REFERENCE_WRITER_DTYPES = {
    "bfloat16": ("BF16", 2), "float8_e4m3fn": ("F8_E4M3", 1), "float8_e5m2": ("F8_E5M2", 1),
    "float8_e8m0fnu": ("F8_E8M0", 1), "float8_e4m3fnuz": ("F8_E4M3FNUZ", 1),
    "float8_e5m2fnuz": ("F8_E5M2FNUZ", 1), "float4_e2m1fn_x2": ("F4", 1),
    "complex64": ("C64", 8), "bool": ("BOOL", 1),
}


@pytest.mark.parametrize("framework_dtype", list(REFERENCE_WRITER_DTYPES))
def test_reference_writer_dtypes_numpy_lacks(framework_dtype):
    name, itemsize = REFERENCE_WRITER_DTYPES[framework_dtype]
    storage = np.arange(6 * itemsize, dtype=np.uint8)
    spec = safetensors.TensorSpec(dtype=framework_dtype, shape=[2, 3],
                                  data_ptr=storage.ctypes.data, data_len=storage.nbytes)
    other = np.arange(4, dtype=np.float32)
    spec2 = safetensors.TensorSpec(dtype="float32", shape=[4], data_ptr=other.ctypes.data,
                                   data_len=other.nbytes)
    data = bytes(safetensors.serialize({"x": spec, "y": spec2}, metadata={"k": "v"}))
    model = parse(data)
    assert_well_formed(model, data)
    assert_same_as_reference(data, model)
    assert {t.name: t.dtype for t in model.tensors} == {"x": name, "y": "F32"}
    assert data[model.header_size:].find(storage.tobytes()) >= 0


@pytest.mark.parametrize("dtype", list(SAFETENSORS_DTYPES))
def test_hand_written_every_dtype(dtype):
    bits = SAFETENSORS_DTYPES[dtype].bits
    n1 = bits                      # 2 x 4 elements: 8 * bits bits = bits bytes
    n2 = 3 * bits                  # 2 x 3 x 4 elements
    payload = bytes((i * 37 + 11) & 0xFF for i in range(n1 + n2))
    data = build([("first", tensor(dtype, [2, 4], 0, n1)),
                  ("second/..", tensor(dtype, [2, 3, 4], n1, n1 + n2))],
                 {"dtype": dtype}, payload)
    model = parse(data)
    assert_well_formed(model, data)
    assert [(t.name, t.dtype, t.shape, t.nbytes) for t in model.tensors] == [
        ("first", dtype, (2, 4), n1), ("second/..", dtype, (2, 3, 4), n2)]
    assert model.tensors[0].offset == model.header_size
    assert_same_as_reference(data, model)      # the Rust reader agrees on validity and bytes


@pytest.mark.parametrize("name,data", VALID_ODD, ids=[n for n, _ in VALID_ODD])
def test_odd_but_valid_files(name, data):
    assert_paths_agree(data)
    model = parse(data)
    assert_well_formed(model, data)
    assert_same_as_reference(data, model)
    assert parse_by_prefix(data) == model


def test_metadata_null_and_absent_give_empty_metadata():
    assert parse(frame(pad8(b'{"__metadata__":null}'))).metadata == {}
    assert parse(build([])).metadata == {}


# -- hypothesis: random names, shapes, bytes through the reference writer ---------------------

names = st.text(max_size=10).filter(lambda s: s != "__metadata__") | st.sampled_from(
    ["", "/", "..", ".", "a/../../b", "a\nb", "a\x00b", "a.b", "a.b.c", "header.bin",
     "metadata.json", "\u2028", "\U0001f600.x"])


@st.composite
def tensor_dicts(draw):
    count = draw(st.integers(0, 5))
    out = {}
    for name in draw(st.lists(names, min_size=count, max_size=count, unique=True)):
        np_dtype = draw(st.sampled_from(list(NUMPY_DTYPES)))
        shape = tuple(draw(st.lists(st.integers(0, 4), max_size=3)))
        size = int(np.prod(shape, dtype=np.int64)) * np.dtype(np_dtype).itemsize
        raw = np.frombuffer(draw(st.binary(min_size=size, max_size=size)), dtype=np.uint8)
        arr = (raw % 2).astype(bool) if np_dtype is np.bool_ else raw.view(np_dtype)
        out[name] = arr.reshape(shape)
    return out


@FAST
@given(tensors=tensor_dicts(), metadata=st.none() | st.dictionaries(st.text(max_size=6),
                                                                      st.text(max_size=6),
                                                                      max_size=3))
def test_random_files_match_reference(tensors, metadata):
    data = st_numpy.save(tensors, metadata=metadata)
    if not tensors and metadata == {}:
        # safetensors 0.8's writer emits '{},"__metadata__":{}}' here: its own reader refuses
        # the file, and so do we.
        assert_refused(data, "InvalidHeaderDeserialization")
        assert not reference_accepts(data)
        return
    model = parse(data)
    assert_well_formed(model, data)
    assert_same_as_reference(data, model)
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "m.safetensors")
        with open(path, "wb") as f:
            f.write(data)
        with safetensors.safe_open(path, "numpy") as ref:
            assert {k: v.value() for k, v in model.metadata.items()} == (ref.metadata() or {})
            for t in model.tensors:
                assert data[t.offset:t.offset + t.nbytes] == ref.get_tensor(t.name).tobytes()


# -- the malformed corpus --------------------------------------------------------------------


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_malformed_refused(case):
    assert_paths_agree(case.data)
    err = assert_refused(case.data, case.kind)
    # The reference refuses it too, unless listed as a deliberate tensorfs strictness.
    assert reference_accepts(case.data) == case.reference_accepts
    # The prefix protocol reaches the same verdict.
    with pytest.raises(SafetensorsError) as again:
        parse_by_prefix(case.data)
    assert (again.value.kind, again.value.offset) == (err.kind, err.offset)


def test_reference_accepted_cases_are_only_documented_strictness():
    doc = parser_module.__doc__
    assert "duplicate keys are refused everywhere" in doc
    assert "positional array form" in doc and "enum-as-map" in doc
    for case in CASES:
        if case.reference_accepts:
            assert ("duplicate" in case.name or case.name in ("entry_array_form",
                                                              "dtype_enum_map")), case.name


def test_every_kind_documented_and_exercised():
    doc = parser_module.__doc__
    for kind in ERROR_KINDS:
        assert f"``{kind}``" in doc
    assert {c.kind for c in CASES} == set(ERROR_KINDS)


def test_tensor_errors_name_the_tensor_and_its_data_offset():
    data = build([("ok", tensor("U8", [4], 0, 4)), ("bad\nname", tensor("F32", [2], 4, 8))],
                 data=bytes(8))
    err = assert_refused(data, "TensorInvalidInfo")
    model_header = 8 + struct.unpack_from("<Q", data)[0]
    assert err.name == "bad\nname"
    assert err.offset == model_header + 4
    assert "bad\\nname" in str(err)


def test_json_error_offset_is_a_byte_offset():
    header = '{"__metadata__":{"\u00e9\u20ac\U0001f600":1}}'.encode()
    err = assert_refused(frame(header))
    assert err.offset == 8 + header.index(b"1}}")


def test_utf8_error_offset():
    header = b'{"__metadata__":{"ok":"\xc3\xa9\xff"}}'
    err = assert_refused(frame(header), "InvalidHeader")
    assert err.offset == 8 + header.index(b"\xff")


def test_duplicate_key_offset_points_at_second_key():
    header = pad8(b'{"a":{"dtype":"U8","shape":[0],"data_offsets":[0,0]},'
                  b'"a":{"dtype":"U8","shape":[0],"data_offsets":[0,0]}}')
    err = assert_refused(frame(header), "InvalidHeaderDeserialization")
    assert err.offset == 8 + header.rindex(b'"a"')
    assert err.name == "a"


def test_lone_surrogate_offset():
    header = pad8(b'{"__metadata__":{"k":"ok \\\\ud800 \\ud800"}}')    # escaped \\ is fine
    err = assert_refused(frame(header), "InvalidHeaderDeserialization")
    assert err.offset == 8 + header.rindex(b"\\ud800")


def test_header_size_limit_is_inclusive():
    # N == MAX_HEADER_SIZE passes the size check (then needs the bytes); N + 1 does not.
    assert_refused(struct.pack("<Q", MAX_HEADER_SIZE + 1) + b"{}", "HeaderTooLarge")
    assert_refused(struct.pack("<Q", MAX_HEADER_SIZE) + b"{}", "InvalidHeaderLength")
    with pytest.raises(NeedMoreBytes) as more:
        parse_safetensors(struct.pack("<Q", MAX_HEADER_SIZE) + b"{}", 8 + MAX_HEADER_SIZE)
    assert more.value.needed == 8 + MAX_HEADER_SIZE


def test_large_valid_header_at_the_limit():
    # A header of exactly MAX_HEADER_SIZE bytes: a small object padded with spaces.
    header = b'{"__metadata__":{"k":"v"}}'
    header += b" " * (MAX_HEADER_SIZE - len(header))
    model = parse(frame(header))
    assert model.header_size == 8 + MAX_HEADER_SIZE and model.metadata["k"].value() == "v"


# -- the prefix protocol and buffer types ---------------------------------------------------


def test_need_more_bytes():
    data = st_numpy.save({"w": np.arange(10, dtype=np.float32)}, metadata={"a": "b" * 500})
    header_size = 8 + struct.unpack_from("<Q", data)[0]
    with pytest.raises(NeedMoreBytes) as more:
        parse_safetensors(data[:5], len(data))
    assert more.value.needed == 8
    with pytest.raises(NeedMoreBytes) as more:
        parse_safetensors(data[:100], len(data))
    assert more.value.needed == header_size
    # The header alone is enough: nothing returned depends on the data bytes.
    assert parse_safetensors(data[:header_size], len(data)) == parse(data)
    # A header past the end of the file is an error, not a request for more.
    with pytest.raises(SafetensorsError) as err:
        parse_safetensors(data[:100], header_size - 1)
    assert err.value.kind == "InvalidHeaderLength"


def test_bytes_like_inputs(tmp_path):
    data = st_numpy.save({"w": np.arange(6, dtype=np.int16).reshape(2, 3)})
    expected = parse(data)
    assert parse_safetensors(bytearray(data), len(data)) == expected
    assert parse_safetensors(memoryview(data), len(data)) == expected
    path = tmp_path / "m.safetensors"
    path.write_bytes(data)
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
        assert parse_safetensors(mm, len(data)) == expected
    # A refused mmap-ed file: the parser holds no buffer export, the map closes at once.
    path.write_bytes(data + b"x")
    with open(path, "rb") as f:
        mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        try:
            parse_safetensors(mm, len(mm))
        except SafetensorsError as err:
            mm.close()
            assert err.kind == "MetadataIncompleteBuffer"
        else:
            raise AssertionError("accepted a file with a trailing byte")


# -- the sniff ---------------------------------------------------------------------------


def test_looks_like_safetensors():
    data = st_numpy.save({"w": np.zeros(3, np.float32)})
    assert looks_like_safetensors(data[:64], len(data))
    assert looks_like_safetensors(data, len(data))
    ws = frame(b'\n  {"__metadata__":{}}')
    assert looks_like_safetensors(ws, len(ws))
    assert not looks_like_safetensors(b"GGUF\x03\x00\x00\x00" + bytes(24), 4096)
    assert not looks_like_safetensors(data[:7], len(data))
    assert not looks_like_safetensors(data[:64], 20)                     # length past EOF
    assert not looks_like_safetensors(frame(b"[1,2,3] "), 16)
    assert not looks_like_safetensors(struct.pack("<Q", MAX_HEADER_SIZE + 1) + b"{",
                                      2 * MAX_HEADER_SIZE)
    assert not looks_like_safetensors(b"", 0)


# -- fuzzing: arbitrary bytes and mutations of valid files ---------------------------------


def assert_paths_agree(data: bytes) -> None:
    """The parser's fast path accepts only what its precise path accepts, identically."""
    if len(data) < 8:
        return
    n = struct.unpack_from("<Q", data)[0]
    try:
        text = data[8:8 + n].decode("utf-8")
    except UnicodeDecodeError:
        return
    header = parser_module._Header(text)
    try:
        fast = header._fast()
    except Exception as exc:                   # the fast path must never raise
        raise AssertionError(f"fast path raised {exc!r}") from exc
    if fast is None:
        return
    precise = header._precise()
    assert fast == precise


def check_any(data: bytes) -> None:
    """Any input: a consistent ModelFile the reference also accepts, or a SafetensorsError
    (the reference may accept it only for a documented strictness)."""
    assert_paths_agree(data)
    try:
        model = parse(data)
    except SafetensorsError as err:
        assert err.kind in ERROR_KINDS
        assert len(str(err).splitlines()) == 1
        if reference_accepts(data):
            text = str(err)
            assert ("duplicate" in text or "must be an object, not an array" in text
                    or "unknown dtype an object" in text), text
        return
    assert_well_formed(model, data)
    assert_same_as_reference(data, model)


@FAST
@given(st.binary(max_size=64))
def test_random_bytes(data):
    check_any(data)


json_junk = st.text(alphabet='{}[]":,0123456789-.eE \\utrnfalsd_F3U8INBO\u00e9\ud7ff',
                    max_size=80)


@FAST
@given(json_junk, st.binary(max_size=16))
def test_random_json_like_headers(text, tail):
    check_any(frame(text.encode("utf-8", "surrogatepass"), tail))


SEEDS = [
    st_numpy.save({"a.w": np.arange(6, dtype=np.float32).reshape(2, 3),
                   "b": np.array([1, 2, 3], np.int8), "z": np.zeros((0,), np.float64)},
                  metadata={"format": "pt", "k": "v"}),
    build([("f4", tensor("F4", [2, 2], 0, 2)), ("bf", tensor("BF16", [3], 2, 8)),
           ("s", tensor("U8", [], 8, 9))], {"x": "\u00e9"}, bytes(range(9))),
    dict(VALID_ODD)["unknown_fields"],
    dict(VALID_ODD)["awkward_names"],
]


@st.composite
def mutated(draw):
    data = bytearray(draw(st.sampled_from(SEEDS)))
    header_end = 8 + struct.unpack_from("<Q", data)[0]
    for _ in range(draw(st.integers(1, 3))):
        op = draw(st.sampled_from(["flip", "digit", "truncate", "insert", "delete", "length"]))
        if not data:
            break
        if op == "flip":
            i = draw(st.integers(0, min(len(data), header_end) - 1))
            data[i] ^= 1 << draw(st.integers(0, 7))
        elif op == "digit":
            digits = [i for i in range(8, min(len(data), header_end)) if 48 <= data[i] <= 57]
            if digits:
                data[draw(st.sampled_from(digits))] = draw(st.sampled_from(b"0123456789"))
        elif op == "truncate":
            del data[draw(st.integers(0, len(data))):]
        elif op == "insert":
            data.insert(draw(st.integers(0, len(data))), draw(st.integers(0, 255)))
        elif op == "delete":
            del data[draw(st.integers(0, len(data) - 1))]
        elif op == "length" and len(data) >= 8:
            struct.pack_into("<Q", data, 0, (struct.unpack_from("<Q", data)[0] +
                             draw(st.integers(-16, 16))) % (1 << 64))
    return bytes(data)


@settings(deadline=None, suppress_health_check=[HealthCheck.too_slow], max_examples=400)
@given(mutated())
def test_mutation_fuzz(data):
    check_any(data)


dims = st.sampled_from([0, 1, 2, 3, 5, 2**31, 2**32, 2**61, 2**63, 2**64 - 1])


@st.composite
def semantic_headers(draw):
    """Well-formed JSON whose tensor entries are plausible but often inconsistent."""
    entries, offset = [], 0
    for name in draw(st.lists(st.text(max_size=3), max_size=4, unique=True)):
        dtype = draw(st.sampled_from(list(SAFETENSORS_DTYPES)))
        shape = draw(st.lists(dims, max_size=3))
        count = 1
        for d in shape:
            count *= d
        size = count * SAFETENSORS_DTYPES[dtype].bits // 8
        if size > 64 or draw(st.booleans()):
            size = draw(st.integers(0, 9))
        begin = offset + draw(st.sampled_from([0, 0, 0, 1, -1]))
        end = begin + size + draw(st.sampled_from([0, 0, 0, 1, -1]))
        entries.append((name, tensor(dtype, shape, max(begin, 0), max(end, 0))))
        offset = max(end, 0)
    if draw(st.booleans()):
        entries.reverse()
    extra = draw(st.sampled_from([0, 0, 0, 1, -1]))
    return build(entries, draw(st.none() | st.just({"k": "v"})), bytes(max(offset + extra, 0)))


@settings(deadline=None, suppress_health_check=[HealthCheck.too_slow], max_examples=200)
@given(semantic_headers())
def test_semantic_validation_agrees_with_reference(data):
    """No duplicates here, so tensorfs and the reference must agree on every file."""
    assert_paths_agree(data)
    try:
        model = parse(data)
    except SafetensorsError as err:
        assert not reference_accepts(data), str(err)
        return
    assert_well_formed(model, data)
    assert_same_as_reference(data, model)


# -- the fast paths: they accept what the precise ones accept, and only that ----------------


@pytest.mark.parametrize("metadata,name", [
    ({"url": "http://host:80/x"}, "plain"),           # a colon inside a string
    ({"q": 'say "a": b'}, "plain"),                    # an escaped quote then a colon
    (None, "a:b"),
    (None, ": starts with a colon"),
])
def test_colons_inside_strings_are_not_taken_for_duplicate_keys(metadata, name):
    data = build([(name, tensor("U8", [2], 0, 2)), ("z", tensor("U8", [1], 2, 3))],
                 metadata, b"xyz")
    assert_paths_agree(data)
    model = parse(data)
    assert [t.name for t in model.tensors] == [name, "z"]


@pytest.mark.parametrize("header", [
    b'{"__metadata__":{"u":"a:b","u":"c"},"t":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}',
    b'{"t":{"dtype":"U8","shape":[1],"data_offsets":[0,1],"x":{"k":"a:b","k":1}}}',
    b'{"t:":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},'
    b'"t:":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}',
])
def test_a_duplicate_key_is_refused_even_behind_a_colon_in_a_string(header):
    err = assert_refused(frame(pad8(header), b"x"), "InvalidHeaderDeserialization")
    assert "duplicate" in str(err)


def test_the_fast_path_takes_a_well_formed_header_in_any_order():
    # sizes 1..40 laid out in one order, listed in another: accepted without the walk
    import random

    sizes = list(range(1, 41))
    entries, begin = [], 0
    for i, size in enumerate(sizes):
        entries.append((f"t{i}", tensor("U8", [size], begin, begin + size)))
        begin += size
    random.Random(0).shuffle(entries)
    data = build(entries, {"format": "pt"}, bytes(begin))
    text = data[8:8 + struct.unpack_from("<Q", data)[0]].decode()
    fast = parser_module._Header(text)._fast()
    assert fast is not None and fast == parser_module._Header(text)._precise()
    header_size = len(data) - begin
    sizes_listed = [info["data_offsets"][1] - info["data_offsets"][0] for _, info in entries]
    assert parser_module._all_valid(fast[1], sizes_listed, header_size, len(data))
    assert [t.name for t in parse(data).tensors] == [name for name, _ in entries]


@pytest.mark.parametrize("entries,data_size", [
    ([("e", tensor("U8", [0], 0, 0)), ("a", tensor("U8", [2], 0, 2))], 2),   # zero elements
    ([("f4", tensor("F4", [2, 3], 0, 3)), ("b", tensor("BF16", [1], 3, 5))], 5),  # sub-byte
])
def test_what_the_fast_layout_check_leaves_to_the_walk_is_still_accepted(entries, data_size):
    data = build(entries, None, bytes(data_size))
    text = data[8:8 + struct.unpack_from("<Q", data)[0]].decode()
    fast = parser_module._Header(text)._fast()
    header_size = len(data) - data_size
    sizes = [info["data_offsets"][1] - info["data_offsets"][0] for _, info in entries]
    assert not parser_module._all_valid(fast[1], sizes, header_size, len(data))
    model = parse(data)
    assert [(t.name, t.nbytes) for t in model.tensors] == [(n, s) for (n, _), s in
                                                          zip(entries, sizes)]
    assert_same_as_reference(data, model)


def test_a_zero_dimension_does_not_hide_an_overflowing_shape():
    # the element count is 0, but the reference's checked product overflows first
    data = build([("t", tensor("U8", [2**40, 2**40, 0], 0, 0))])
    assert_refused(data, "ValidationOverflow")
