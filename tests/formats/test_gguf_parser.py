"""The GGUF parser against the reference implementation (no FUSE).

Oracles: files written by gguf-py's ``GGUFWriter`` (little- and big-endian) and read back by
``gguf.GGUFReader``; v1 files and malformed files come from ``tests/support/gguf_corpus.py``, whose
writer lays bytes out exactly as told.
"""

from __future__ import annotations

import itertools
import math
import os
import struct
import time

import gguf
import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q
from gguf import GGUFEndian
from gguf import GGUFValueType as VT
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tensorfs.dtypes import GGML_TYPES
from tensorfs.errors import GGUFError
from tensorfs.formats import NeedMoreBytes
from tensorfs.formats.gguf import KINDS, MAX_ARRAY_DEPTH, looks_like_gguf, parse_gguf
from tensorfs.model import ModelFile
from tests.support import gguf_corpus as corpus

ENDIANS = {"little": GGUFEndian.LITTLE, "big": GGUFEndian.BIG}
TYPE_NAMES = {VT.UINT8: "uint8", VT.INT8: "int8", VT.UINT16: "uint16", VT.INT16: "int16",
              VT.UINT32: "uint32", VT.INT32: "int32", VT.FLOAT32: "float32", VT.BOOL: "bool",
              VT.STRING: "string", VT.UINT64: "uint64", VT.INT64: "int64", VT.FLOAT64: "float64"}


# --------------------------------------------------------------------------- helpers

def parse_file(path) -> ModelFile:
    data = open(path, "rb").read()
    return parse_gguf(data, len(data), str(path))


def write_gguf_py(path, endian: str, kvs=(), tensors=()) -> None:
    """kvs: (key, value, GGUFValueType, sub_type); tensors: (name, array, raw_dtype or None)."""
    w = gguf.GGUFWriter(str(path), "test", endianess=ENDIANS[endian])
    for key, value, vtype, sub_type in kvs:
        w.add_key_value(key, value, vtype, sub_type)
    for name, array, raw_dtype in tensors:
        w.add_tensor(name, array, raw_dtype=raw_dtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def same_scalar(vtype, ours, theirs) -> bool:
    """Our JSON-ready value against a raw Python value of the given GGUF type."""
    if vtype in (VT.FLOAT32, VT.FLOAT64):
        width = np.float32 if vtype == VT.FLOAT32 else np.float64
        if isinstance(ours, str):
            return ours == {True: "nan"}.get(math.isnan(theirs), "inf" if theirs > 0 else "-inf")
        if vtype == VT.FLOAT32:       # shortest float32 decimal: equal in float32, no longer
            return width(ours) == width(theirs) and len(repr(ours)) <= len(repr(float(theirs)))
        return ours == theirs
    if vtype == VT.BOOL:
        return ours is bool(theirs)
    return ours == theirs and type(ours) is type(theirs)


def same_value(vtype, sub, ours, theirs) -> bool:
    """``sub`` is the array element type (or a (type, sub) pair for nested arrays)."""
    if vtype != VT.ARRAY:
        return same_scalar(vtype, ours, theirs)
    if not isinstance(ours, list) or len(ours) != len(theirs):
        return False
    inner, inner_sub = sub if isinstance(sub, tuple) else (sub, None)
    return all(same_value(inner, inner_sub, a, b) for a, b in zip(ours, theirs))


def reader_type_name(field) -> str:
    types = field.types
    if types[0] != VT.ARRAY:
        return TYPE_NAMES[types[0]]
    return "array[" * (len(types) - 1) + TYPE_NAMES[types[-1]] + "]" * (len(types) - 1)


def assert_matches_reader(path, model: ModelFile) -> None:
    """Every tensor and KV of ``model`` against gguf.GGUFReader on the same file."""
    reader = gguf.GGUFReader(str(path))
    data = open(path, "rb").read()
    assert model.data_offset == reader.data_offset
    assert model.alignment == reader.alignment
    assert model.endianness == ("big" if reader.endianess == GGUFEndian.BIG else "little")
    assert [t.name for t in model.tensors] == [t.name for t in reader.tensors]
    for ours, theirs in zip(model.tensors, reader.tensors):
        assert ours.ggml_type == int(theirs.tensor_type)
        assert ours.dtype == theirs.tensor_type.name
        assert ours.shape == tuple(int(d) for d in reversed(theirs.shape.tolist()))
        assert ours.offset == theirs.data_offset
        assert ours.byte_order == ("<" if model.endianness == "little" else ">")
        if theirs.tensor_type != Q.Q8_1:          # gguf-py's Q8_1 size is not ggml's
            assert ours.nbytes == theirs.n_bytes
        assert data[ours.offset:ours.offset + ours.nbytes] == theirs.data.tobytes()
        assert ours.file == str(path)
    fields = {k: f for k, f in reader.fields.items() if not k.startswith("GGUF.")}
    assert list(model.metadata) == list(fields)
    for key, field in fields.items():
        value = model.metadata[key]
        assert value.type_name == reader_type_name(field), key
        if len(field.types) > 2:
            continue                                # gguf-py flattens nested arrays
        theirs = field.contents()
        if field.types[0] == VT.ARRAY:
            assert same_value(VT.ARRAY, field.types[-1], value.value(), theirs), key
            assert value.count == len(theirs)
        else:
            assert same_scalar(field.types[0], value.value(), theirs), key
            assert value.count is None


# --------------------------------------------------------------------------- gguf-py oracle

ALL_KVS = [
    ("k.uint8", 255, VT.UINT8, None), ("k.int8", -128, VT.INT8, None),
    ("k.uint16", 65535, VT.UINT16, None), ("k.int16", -32768, VT.INT16, None),
    ("k.uint32", 2**32 - 1, VT.UINT32, None), ("k.int32", -2**31, VT.INT32, None),
    ("k.float32", 0.1, VT.FLOAT32, None), ("k.float32.nan", float("nan"), VT.FLOAT32, None),
    ("k.float32.inf", float("-inf"), VT.FLOAT32, None), ("k.bool", True, VT.BOOL, None),
    ("k.bool.false", False, VT.BOOL, None), ("k.string", "héllo wörld ✓", VT.STRING, None),
    ("k.string.empty", "", VT.STRING, None), ("k.uint64", 2**64 - 1, VT.UINT64, None),
    ("k.int64", -2**63, VT.INT64, None), ("k.float64", 1e-300, VT.FLOAT64, None),
    ("k.float64.inf", float("inf"), VT.FLOAT64, None),
    ("a.uint8", [0, 255], VT.ARRAY, VT.UINT8), ("a.int8", [-1, 1], VT.ARRAY, VT.INT8),
    ("a.uint16", [1, 65535], VT.ARRAY, VT.UINT16), ("a.int16", [-5], VT.ARRAY, VT.INT16),
    ("a.uint32", [7] * 10, VT.ARRAY, VT.UINT32), ("a.int32", [-7, 7], VT.ARRAY, VT.INT32),
    ("a.float32", [0.1, -2.5, 3e38, float("nan")], VT.ARRAY, VT.FLOAT32),
    ("a.bool", [True, False, True], VT.ARRAY, VT.BOOL),
    ("a.string", ["<s>", "", "tok en", "日本"], VT.ARRAY, VT.STRING),
    ("a.uint64", [2**64 - 1, 0], VT.ARRAY, VT.UINT64), ("a.int64", [-2**63], VT.ARRAY, VT.INT64),
    ("a.float64", [0.1, float("-inf")], VT.ARRAY, VT.FLOAT64),
    ("n.int32", [[1, 2], [3]], VT.ARRAY, VT.ARRAY),
    ("n.string", [["a", "b"], ["c"]], VT.ARRAY, VT.ARRAY),
    ("n.deep", [[[1.5]], [[2.5, 3.5]]], VT.ARRAY, VT.ARRAY),
]
NESTED_TYPES = {"n.int32": "array[array[int32]]", "n.string": "array[array[string]]",
                "n.deep": "array[array[array[float32]]]"}


def _quant(qtype, rows: int, blocks: int, seed: int) -> tuple[np.ndarray, Q]:
    block, size = gguf.GGML_QUANT_SIZES[qtype]
    rng = np.random.default_rng(seed)
    return rng.integers(0, 256, (rows, blocks * size), dtype=np.uint8), qtype


def sample_tensors():
    rng = np.random.default_rng(1)
    out = [("f32", rng.standard_normal((3, 5)).astype(np.float32), None),
           ("f16", rng.standard_normal((2, 3, 4)).astype(np.float16), None),
           ("f64", rng.standard_normal((7,)), None),
           ("i8", rng.integers(-128, 127, (4, 4), dtype=np.int8), None),
           ("i16", rng.integers(-999, 999, (2, 2, 2, 2), dtype=np.int16), None),
           ("i32", rng.integers(-99999, 99999, (5,), dtype=np.int32), None),
           ("i64", rng.integers(-2**40, 2**40, (3, 1), dtype=np.int64), None)]
    for i, qtype in enumerate((Q.Q4_0, Q.Q8_0, Q.Q4_K, Q.Q6_K, Q.IQ2_XS, Q.BF16, Q.TQ1_0, Q.MXFP4)):
        arr, raw = _quant(qtype, 2 + i % 3, 1 + i % 2, i)
        out.append((f"blk.{i}.{qtype.name.lower()}.weight", arr, raw))
    return out


@pytest.mark.parametrize("endian", ["little", "big"])
def test_gguf_py_file_matches_reader(tmp_path, endian):
    path = tmp_path / "model.gguf"
    write_gguf_py(path, endian, ALL_KVS, sample_tensors())
    model = parse_file(path)
    assert model.format == "gguf" and model.version == 3 and model.endianness == endian
    assert model.file_size == os.path.getsize(path)
    assert_matches_reader(path, model)
    for key, value, vtype, sub in ALL_KVS:
        meta = model.metadata[key]
        if key in NESTED_TYPES:
            assert meta.type_name == NESTED_TYPES[key]
            assert meta.value() == value
        else:
            assert same_value(vtype, sub, meta.value(), value), key


def test_decoded_values_are_json_ready(tmp_path):
    path = tmp_path / "m.gguf"
    write_gguf_py(path, "little", ALL_KVS)
    meta = {k: v.value() for k, v in parse_file(path).metadata.items()}
    assert meta["k.float32"] == 0.1                         # not 0.10000000149011612
    assert meta["k.float32.nan"] == "nan" and meta["k.float32.inf"] == "-inf"
    assert meta["k.float64.inf"] == "inf" and meta["a.float64"] == [0.1, "-inf"]
    assert meta["a.float32"] == [0.1, -2.5, 3e38, "nan"]
    assert meta["k.uint64"] == 2**64 - 1 and type(meta["k.uint64"]) is int
    assert meta["a.int64"] == [-2**63] and meta["a.bool"] == [True, False, True]
    assert meta["k.bool"] is True and meta["k.string.empty"] == ""
    import json
    json.dumps(meta)                                         # nothing numpy-typed


def test_float32_shortest_repr_round_trips():
    values = np.array([0.1, 1 / 3, 16777217, 1e-45, -0.0, 3.4e38, 2**24 - 1, 1e10, -7.0,
                       123456789.0], dtype=np.float32)
    data = corpus.encode_gguf(kvs=[("a", corpus.ARR, corpus.Arr(corpus.F32, values.tolist()))]
                              + [(f"s{i}", corpus.F32, float(v)) for i, v in enumerate(values)])
    model = parse_gguf(data, len(data))
    decoded = model.metadata["a"].value()
    scalars = [model.metadata[f"s{i}"].value() for i in range(len(values))]
    assert decoded == scalars
    for ours, stored in zip(decoded, values):
        assert np.float32(ours) == stored and type(ours) is float
        assert repr(ours) == repr(float(str(stored)))        # the shortest float32 decimal
    assert math.copysign(1, decoded[4]) == -1


def test_invalid_utf8_in_vocabulary_does_not_raise():
    data = corpus.encode_gguf(kvs=[("tokenizer.ggml.tokens", corpus.ARR,
                                    corpus.Arr(corpus.STR, [b"\xff", b"ok", b"\xe2\x82"])),
                                   ("s", corpus.STR, b"\xc3(")])
    model = parse_gguf(data, len(data))
    tokens = model.metadata["tokenizer.ggml.tokens"].value()
    assert tokens == ["\udcff", "ok", "\udce2\udc82"]
    assert [t.encode("utf-8", "surrogateescape") for t in tokens] == [b"\xff", b"ok", b"\xe2\x82"]
    assert model.metadata["s"].value() == "\udcc3("


def test_arrays_nest_up_to_the_depth_limit():
    leaf = corpus.Arr(corpus.I32, [1])
    value = leaf
    for _ in range(MAX_ARRAY_DEPTH - 1):
        value = corpus.Arr(corpus.ARR, [value])
    data = corpus.encode_gguf(kvs=[("ok", corpus.ARR, value),
                                   ("mixed", corpus.ARR, corpus.Arr(corpus.ARR, [
                                       corpus.Arr(corpus.U8, [1]), corpus.Arr(corpus.STR, ["x"])])),
                                   ("empty", corpus.ARR, corpus.Arr(corpus.ARR, []))])
    model = parse_gguf(data, len(data))
    depth = MAX_ARRAY_DEPTH
    assert model.metadata["ok"].type_name == "array[" * depth + "int32" + "]" * depth
    assert model.metadata["ok"].value() == [[[1]]]
    assert model.metadata["mixed"].type_name == "array[array]"
    assert model.metadata["mixed"].value() == [[1], ["x"]]
    assert model.metadata["empty"].type_name == "array[array]"
    assert model.metadata["empty"].value() == [] and model.metadata["empty"].count == 0
    deeper = corpus.encode_gguf(kvs=[("deep", corpus.ARR, corpus.Arr(corpus.ARR, [value]))])
    with pytest.raises(GGUFError) as err:
        parse_gguf(deeper, len(deeper))
    assert err.value.kind == "nesting" and err.value.name == "deep"


# --------------------------------------------------------------------------- v1, v2, byte orders

@pytest.mark.parametrize("version", [1, 2, 3])
@pytest.mark.parametrize("order", ["<", ">"])
def test_hand_written_versions_and_byte_orders(version, order):
    data = corpus.valid_gguf(version, order)
    model = parse_gguf(data, len(data), "v.gguf", mtime=12.5)
    assert model.version == version and model.mtime == 12.5 and model.path == "v.gguf"
    assert model.endianness == ("little" if order == "<" else "big")
    assert {k: v.value() for k, v in model.metadata.items()} == corpus.VALID_VALUES
    assert list(model.metadata) == [k for k, _, _ in corpus.VALID_KVS]
    assert model.metadata["tokenizer.ggml.tokens"].type_name == "array[string]"
    assert model.metadata["tokenizer.ggml.tokens"].count == 4
    assert model.metadata["t.nested"].type_name == "array[array[uint8]]"
    infos, blob = corpus.layout(corpus._VALID_SPECS)
    assert model.header_size == len(data) - len(blob)
    assert model.header_size % 32 == 0
    assert [t.name for t in model.tensors] == list(corpus.VALID_TENSOR_NAMES)
    for t, (name, ne, ggml_type, rel) in zip(model.tensors, infos):
        assert t.shape == tuple(reversed(ne)) and t.ggml_type == ggml_type
        assert t.dtype == GGML_TYPES[ggml_type].name
        assert t.offset == model.header_size + rel
        assert t.nbytes == corpus.tensor_nbytes(ne, ggml_type)
        assert t.byte_order == order and t.file == "v.gguf"
        assert data[t.offset:t.offset + t.nbytes] == blob[rel:rel + t.nbytes]


def test_v1_layout_is_32_bit_counts_lengths_and_dims():
    """v1: counts, string lengths, array lengths and dims are u32; n_dims, type ids u32;
    the tensor offset stays u64 (gguf-parser-go's v1 reader)."""
    data = corpus.encode_gguf(version=1, kvs=[("a", corpus.STR, "xy")],
                              tensors=[("t", (32, 2), corpus.F32_T, 0)], data=bytes(256))
    expected = (b"GGUF" + struct.pack("<IIIIs", 1, 1, 1, 1, b"a")
                + struct.pack("<II", corpus.STR, 2) + b"xy"
                + struct.pack("<I", 1) + b"t" + struct.pack("<IIIIQ", 2, 32, 2, 0, 0))
    assert data.startswith(expected)
    model = parse_gguf(data, len(data))
    assert model.tensors[0].shape == (2, 32) and model.tensors[0].nbytes == 256
    assert model.header_size == 64


def test_big_endian_written_by_gguf_py_is_read_by_both(tmp_path):
    path = tmp_path / "be.gguf"
    arr = np.arange(6, dtype=np.float32).reshape(2, 3)
    write_gguf_py(path, "big", [("x", 258, VT.UINT32, None)], [("w", arr, None)])
    raw = open(path, "rb").read()
    assert raw[4:8] == b"\x00\x00\x00\x03"
    model = parse_file(path)
    t = model.tensors[0]
    assert model.metadata["x"].value() == 258
    stored = np.frombuffer(raw, dtype=">f4", count=6, offset=t.offset).reshape(t.shape)
    assert (stored == arr).all()
    assert_matches_reader(path, model)


# --------------------------------------------------------------------------- vocab-only, prefixes

def test_vocab_only_file_without_final_padding():
    kvs = [("tokenizer.ggml.tokens", corpus.ARR, corpus.Arr(corpus.STR, ["a", "bb", "ccc"]))]
    data = corpus.encode_gguf(kvs=kvs, pad=False)
    assert len(data) % 32 != 0
    model = parse_gguf(data, len(data))
    assert model.tensors == () and model.header_size == len(data)
    padded = data + bytes(-len(data) % 32)
    assert parse_gguf(padded, len(padded)).header_size == len(padded)


def test_vocab_only_gguf_py_file(tmp_path):
    path = tmp_path / "vocab.gguf"
    write_gguf_py(path, "little", [("tokenizer.ggml.tokens", ["x", "y"], VT.ARRAY, VT.STRING)])
    model = parse_file(path)
    assert model.tensors == () and model.header_size <= model.file_size
    assert_matches_reader(path, model)


def test_zero_sized_and_zero_dim_tensors():
    tensors = [("empty", (0, 4), corpus.F32_T, 0), ("scalar", (), corpus.F32_T, 0),
               ("after", (8,), corpus.F32_T, 32)]
    data = corpus.encode_gguf(tensors=tensors, data=bytes(64))
    model = parse_gguf(data, len(data))
    assert [(t.shape, t.nbytes) for t in model.tensors] == [((4, 0), 0), ((), 4), ((8,), 32)]


def _parse_like_the_opener(data: bytes, first: int = 16):
    """Start from a short prefix and double it on NeedMoreBytes, as the opener does."""
    size = first
    while True:
        prefix = data[:size]
        try:
            return parse_gguf(prefix, len(data))
        except NeedMoreBytes as more:
            assert len(prefix) < more.needed <= len(data)
            size = max(size * 2, more.needed)


def _outcome(fn, *args):
    try:
        model = fn(*args)
    except GGUFError as e:
        return ("error", e.kind, e.message, e.offset, e.name)
    values = model.metadata.values()
    return ("ok", model.header_size, tuple(model.tensors), list(model.metadata),
            [v.value() for v in values], [v.type_name for v in values])


_PREFIX_CASES = corpus.MALFORMED[::3] + [("valid", corpus.valid_gguf()),
                                         ("valid-v1-be", corpus.valid_gguf(1, ">"))]


@pytest.mark.parametrize("name,data", _PREFIX_CASES, ids=[n for n, _ in _PREFIX_CASES])
def test_prefix_doubling_gives_the_whole_file_answer(name, data):
    assert _outcome(_parse_like_the_opener, data) == _outcome(parse_gguf, data, len(data))


def test_need_more_bytes_only_within_the_file():
    data = corpus.valid_gguf()
    with pytest.raises(NeedMoreBytes) as more:
        parse_gguf(data[:100], len(data))
    assert 100 < more.value.needed <= len(data)
    with pytest.raises(GGUFError):                   # a prefix the size of the file: truncated
        parse_gguf(data[:100], 100)
    # a buffer longer than the file: only file_size bytes count
    with pytest.raises(GGUFError) as err:
        parse_gguf(data, 100)
    assert err.value.kind in ("truncated", "count")


def test_metadata_decodes_from_a_private_copy_of_the_buffer():
    data = bytearray(corpus.valid_gguf())
    model = parse_gguf(memoryview(data), len(data))
    data[:] = bytes(len(data))                       # the caller reuses its buffer
    tokens = model.metadata["tokenizer.ggml.tokens"].value()
    assert tokens == corpus.VALID_VALUES["tokenizer.ggml.tokens"]


def test_looks_like_gguf():
    assert looks_like_gguf(corpus.valid_gguf())
    assert looks_like_gguf(corpus.valid_gguf(3, ">"))
    assert not looks_like_gguf(b"GGML\x03\x00\x00\x00")
    assert not looks_like_gguf(b"GG")
    assert not looks_like_gguf(b"\x08\x00\x00\x00\x00\x00\x00\x00{}")


# --------------------------------------------------------------------------- the malformed corpus

def _assert_refused(data: bytes, kinds) -> GGUFError:
    try:
        parse_gguf(data, len(data))
    except GGUFError as error:
        assert error.kind in kinds, (error.kind, kinds, str(error))
        assert error.kind in KINDS
        text = str(error)
        assert "\n" not in text and "\r" not in text and text
        assert error.offset is None or 0 <= error.offset <= max(len(data), 8)
        return error
    pytest.fail(f"accepted; expected one of {kinds}")


@pytest.mark.parametrize("name,data", corpus.MALFORMED, ids=[n for n, _ in corpus.MALFORMED])
def test_malformed_corpus_is_refused(name, data):
    error = _assert_refused(data, corpus.EXPECTED_KINDS[name])
    if name in corpus.EXPECTED_NAME:
        assert f"'{corpus.EXPECTED_NAME[name]}'" in str(error)
        assert error.name == corpus.EXPECTED_NAME[name]


def test_error_offsets_point_at_the_offending_field():
    cases = dict(corpus.MALFORMED)
    assert _assert_refused(cases["version-99"], ("version",)).offset == 4
    assert _assert_refused(cases["n_tensors-2^64-1"], ("count",)).offset == 8
    assert _assert_refused(cases["n_kv-2^64-1"], ("count",)).offset == 16
    dup = corpus.encode_gguf(kvs=(("a", corpus.U8, 1), ("a", corpus.U8, 2)))
    error = _assert_refused(dup, ("duplicate_key",))
    assert error.offset == 24 + (8 + 1 + 4 + 1) and error.name == "a"
    assert "(byte offset 38)" in str(error)


def test_every_structural_truncation_is_refused():
    for name, data, kinds in corpus.TRUNCATIONS:
        _assert_refused(data, kinds)


def test_every_error_kind_is_exercised_by_the_corpus():
    seen = set()
    for name, data in corpus.MALFORMED:
        try:
            parse_gguf(data, len(data))
        except GGUFError as e:
            seen.add(e.kind)
    assert seen == set(KINDS)


def test_cut_inside_tensor_data_names_the_tensor():
    error = _assert_refused(corpus.valid_gguf()[:-1], ("tensor_data",))
    assert "'output_norm.weight'" in str(error) and "past the end of the file" in str(error)


def test_names_with_newlines_stay_on_one_line():
    data = corpus.encode_gguf(tensors=[("a\nb", (8,), corpus.F32_T, 0)], data=bytes(16))
    error = _assert_refused(data, ("tensor_data",))
    assert error.name == "a\nb" and "a\\nb" in str(error)
    assert parse_gguf(data + bytes(16), len(data) + 16).tensors[0].name == "a\nb"


def test_long_tensor_names_are_accepted():
    """gguf.cpp refuses names of 64 bytes or more; gguf-py writes them: we read them."""
    name = "x" * 300
    data = corpus.encode_gguf(tensors=[(name, (8,), corpus.F32_T, 0)], data=bytes(32))
    assert parse_gguf(data, len(data)).tensors[0].name == name


def test_counts_are_checked_before_anything_is_allocated():
    started = time.perf_counter()
    for label in ("n_kv-2^64-1", "n_tensors-2^63-1", "array-count-2^64-1",
                  "string-array-count-2^63-1", "nested-array-count-2^64-1"):
        data = dict(corpus.MALFORMED)[label]
        assert _assert_refused(data, ("count",)).kind == "count"
    assert time.perf_counter() - started < 1


# --------------------------------------------------------------------------- hypothesis

_SCALAR_STRATEGIES = {
    VT.UINT8: st.integers(0, 2**8 - 1), VT.INT8: st.integers(-2**7, 2**7 - 1),
    VT.UINT16: st.integers(0, 2**16 - 1), VT.INT16: st.integers(-2**15, 2**15 - 1),
    VT.UINT32: st.integers(0, 2**32 - 1), VT.INT32: st.integers(-2**31, 2**31 - 1),
    VT.UINT64: st.integers(0, 2**64 - 1), VT.INT64: st.integers(-2**63, 2**63 - 1),
    VT.FLOAT32: st.floats(width=32), VT.FLOAT64: st.floats(), VT.BOOL: st.booleans(),
    VT.STRING: st.text(st.characters(exclude_categories=("Cs",)), max_size=20),
}


@st.composite
def kv_entries(draw):
    vtype = draw(st.sampled_from(list(_SCALAR_STRATEGIES) + [VT.ARRAY]))
    if vtype != VT.ARRAY:
        return vtype, None, draw(_SCALAR_STRATEGIES[vtype])
    sub = draw(st.sampled_from(list(_SCALAR_STRATEGIES) + [VT.ARRAY]))
    if sub != VT.ARRAY:
        return vtype, sub, draw(st.lists(_SCALAR_STRATEGIES[sub], min_size=1, max_size=30))
    # gguf-py infers inner array types: int -> int32, float -> float32, str -> string
    inner = draw(st.sampled_from([VT.INT32, VT.STRING]))
    items = st.lists(_SCALAR_STRATEGIES[inner], min_size=1, max_size=5)
    return vtype, (VT.ARRAY, inner), draw(st.lists(items, min_size=1, max_size=5))


_NATIVE = [np.float32, np.float16, np.float64, np.int8, np.int16, np.int32, np.int64]
_QUANT = [Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q8_0, Q.Q2_K, Q.Q4_K, Q.Q5_K, Q.IQ4_NL, Q.IQ3_S, Q.BF16]


@st.composite
def tensor_entries(draw, index):
    name = f"t{index}." + draw(st.text("abc.xyz_0123", max_size=12))
    if draw(st.booleans()):
        dtype = draw(st.sampled_from(_NATIVE))
        shape = tuple(draw(st.lists(st.integers(1, 6), min_size=1, max_size=4)))
        return name, np.ones(shape, dtype=dtype) * index, None
    qtype = draw(st.sampled_from(_QUANT))
    rows = tuple(draw(st.lists(st.integers(1, 3), min_size=0, max_size=3)))
    blocks = draw(st.integers(1, 3))
    size = gguf.GGML_QUANT_SIZES[qtype][1]
    return name, np.full(rows + (blocks * size,), index % 256, dtype=np.uint8), qtype


@st.composite
def gguf_py_models(draw):
    keys = draw(st.lists(st.text("abcdefghij._-0123456789ÄΩ", min_size=1, max_size=16),
                         unique=True, max_size=8))
    keys = [k for k in keys if k != "general.architecture"]
    kvs = []
    for key in keys:
        vtype, sub, value = draw(kv_entries())
        kvs.append((key, value, vtype, sub if not isinstance(sub, tuple) else None, sub))
    n = draw(st.integers(0, 5))
    tensors = [draw(tensor_entries(i)) for i in range(n)]
    return kvs, tensors


_FILE_NUMBERS = itertools.count()


@settings(max_examples=int(os.environ.get("GGUF_HYPOTHESIS_EXAMPLES", 60)), deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(model=gguf_py_models(), endian=st.sampled_from(["little", "big"]))
def test_random_gguf_py_files_match_reader(tmp_path, model, endian):
    kvs, tensors = model
    path = tmp_path / f"h-{endian}-{next(_FILE_NUMBERS)}.gguf"    # never rewrite a mapped file
    write_gguf_py(path, endian, [(k, v, t, s) for k, v, t, s, _ in kvs], tensors)
    parsed = parse_file(path)
    assert_matches_reader(path, parsed)
    for key, value, vtype, _, sub in kvs:
        assert same_value(vtype, sub, parsed.metadata[key].value(), value), key
    for t, (_, array, _) in zip(parsed.tensors, tensors):
        if array.dtype != np.uint8:
            assert t.shape == array.shape
        assert t.offset >= parsed.header_size and t.offset + t.nbytes <= parsed.file_size


_BOUNDARY = [0, 1, 31, 32, 2**31, 2**32 - 1, 2**32, 2**63 - 1, 2**63, 2**64 - 1]
_MUTATION_BASES = [corpus.valid_gguf(3), corpus.valid_gguf(1), corpus.valid_gguf(2, ">")]


@st.composite
def mutated_files(draw):
    data = bytearray(draw(st.sampled_from(_MUTATION_BASES)))
    header = corpus.header_end()
    for _ in range(draw(st.integers(1, 4))):
        op = draw(st.sampled_from(["flip", "set8", "set4", "truncate", "byte"]))
        if not data:
            break
        pos = draw(st.integers(0, min(len(data), header) - 1))
        if op == "flip":
            data[pos] ^= 1 << draw(st.integers(0, 7))
        elif op == "byte":
            data[pos] = draw(st.integers(0, 255))
        elif op in ("set8", "set4"):
            width = 8 if op == "set8" else 4
            value = draw(st.sampled_from(_BOUNDARY)) % 2**(8 * width)
            order = draw(st.sampled_from("<>"))
            data[pos:pos + width] = struct.pack(order + ("Q" if width == 8 else "I"), value)
        else:
            del data[draw(st.integers(0, len(data))):]
    return bytes(data)


@settings(max_examples=300, deadline=None)
@given(data=mutated_files())
def test_mutated_files_parse_safely_or_are_refused(data):
    try:
        model = parse_gguf(data, len(data))
    except GGUFError as error:
        assert error.kind in KINDS and "\n" not in str(error)
        return
    assert model.header_size <= model.file_size == len(data)
    for t in model.tensors:
        assert model.header_size <= t.offset and t.offset + t.nbytes <= model.file_size
    ranges = sorted((t.offset, t.offset + t.nbytes) for t in model.tensors if t.nbytes)
    assert all(a[1] <= b[0] for a, b in zip(ranges, ranges[1:]))
    for value in model.metadata.values():             # decoding never raises either
        value.value()


# --------------------------------------------------------------------------- speed (measured only)

def _big_vocab_file(n_tokens: int = 150_000, n_tensors: int = 3_000) -> bytes:
    rng = np.random.default_rng(0)
    tokens = [f"tok{i}" + "x" * int(k) for i, k in enumerate(rng.integers(0, 12, n_tokens))]
    kvs = [("general.architecture", corpus.STR, "llama"),
           ("tokenizer.ggml.tokens", corpus.ARR, corpus.Arr(corpus.STR, tokens)),
           ("tokenizer.ggml.scores", corpus.ARR,
            corpus.Arr(corpus.F32, rng.random(n_tokens).tolist())),
           ("tokenizer.ggml.token_type", corpus.ARR, corpus.Arr(corpus.I32, [1] * n_tokens))]
    infos = [(f"blk.{i // 10}.t{i % 10}.weight", (32, 4), corpus.F32_T, i * 512)
             for i in range(n_tensors)]
    return corpus.encode_gguf(kvs=kvs, tensors=infos, data=bytes(n_tensors * 512))


def test_speed_of_a_150k_vocab_and_3000_tensors_header(capsys):
    data = _big_vocab_file()
    best = math.inf
    for _ in range(5):
        started = time.perf_counter()
        model = parse_gguf(data, len(data))
        best = min(best, time.perf_counter() - started)
    started = time.perf_counter()
    tokens = model.metadata["tokenizer.ggml.tokens"].value()
    decode = time.perf_counter() - started
    assert len(tokens) == 150_000 and len(model.tensors) == 3_000
    with capsys.disabled():
        print(f"\n[gguf speed] header of 150k tokens + 3000 tensors ({model.header_size} bytes): "
              f"parse {best * 1000:.1f} ms (best of 5); tokens value() {decode * 1000:.1f} ms")
