"""Hand-built safetensors files: a small writer, a malformed corpus, odd-but-valid files.

Reusable outside the parser tests (CLI ``inspect`` / ``mount`` tests):

- ``build(entries, metadata=None, data=b"")`` writes a file the way the reference writer
  lays it out (8-byte LE length, compact JSON, space padding to a multiple of 8, data).
- ``MALFORMED``: ``(name, bytes)`` files tensorfs must refuse; ``CASES`` adds the expected
  ``SafetensorsError.kind`` and whether the reference reader (``safetensors.deserialize``)
  accepts the file anyway (``reference_accepts``: tensorfs is stricter there on purpose).
- ``VALID_ODD``: ``(name, bytes)`` unusual files both tensorfs and the reference accept.
"""

from __future__ import annotations

import json
import struct
from typing import NamedTuple

MAX_HEADER_SIZE = 100_000_000


def frame(header: bytes | str, data: bytes = b"") -> bytes:
    """8-byte little-endian length + header bytes verbatim + data."""
    if isinstance(header, str):
        header = header.encode("utf-8")
    return struct.pack("<Q", len(header)) + header + data


def header_json(entries, metadata=None) -> str:
    """Compact JSON like the reference writer's; ``entries`` is a list of (name, info)."""
    parts = []
    if metadata is not None:
        parts.append(json.dumps("__metadata__") + ":" + json.dumps(metadata, separators=(",", ":"),
                                                                ensure_ascii=False))
    for name, info in entries:
        parts.append(json.dumps(name, ensure_ascii=False) + ":" +
                     json.dumps(info, separators=(",", ":"), ensure_ascii=False))
    return "{" + ",".join(parts) + "}"


def pad8(header: bytes) -> bytes:
    return header + b" " * (-len(header) % 8)


def build(entries, metadata=None, data: bytes = b"") -> bytes:
    """A file from (name, {"dtype", "shape", "data_offsets"}) entries, in that order."""
    return frame(pad8(header_json(entries, metadata).encode("utf-8")), data)


def tensor(dtype: str, shape, begin: int, end: int, **extra) -> dict:
    info = {"dtype": dtype, "shape": list(shape), "data_offsets": [begin, end]}
    info.update(extra)
    return info


def one(dtype: str = "F32", shape=(2,), begin: int = 0, end: int = 8, data: bytes | None = None,
        name: str = "t", metadata=None, **extra) -> bytes:
    """A one-tensor file; data defaults to exactly what the offsets say."""
    if data is None:
        data = bytes((i * 7 + 1) & 0xFF for i in range(max(end, 0)))
    return build([(name, tensor(dtype, shape, begin, end, **extra))], metadata, data)


def raw_entry(body: str, data: bytes = b"", name: str = "t") -> bytes:
    """A one-tensor file whose entry JSON is given verbatim."""
    return frame(pad8(("{" + json.dumps(name) + ":" + body + "}").encode()), data)


class Case(NamedTuple):
    name: str
    data: bytes
    kind: str
    reference_accepts: bool = False   # True: the reference loads it, tensorfs refuses (why: docs)


_DEEP = 100_000
_OK_ENTRY = '"dtype":"U8","shape":[1],"data_offsets":[0,1]'


def _cases() -> list[Case]:
    C = Case
    IHD = "InvalidHeaderDeserialization"
    cases = [
        # -- the length field ------------------------------------------------------------
        C("empty_file", b"", "HeaderTooSmall"),
        C("seven_bytes", b"\x02\x00\x00\x00\x00\x00\x00", "HeaderTooSmall"),
        C("length_u64_max", struct.pack("<Q", 2**64 - 1) + b"{}", "HeaderTooLarge"),
        C("length_over_limit", struct.pack("<Q", MAX_HEADER_SIZE + 1) + b"{}      ",
          "HeaderTooLarge"),
        C("length_past_eof", struct.pack("<Q", 1000) + b"{}      ", "InvalidHeaderLength"),
        C("length_one_past_eof", struct.pack("<Q", 9) + b"{}      ", "InvalidHeaderLength"),
        C("length_only", struct.pack("<Q", 8), "InvalidHeaderLength"),
        # -- the header bytes ------------------------------------------------------------
        C("non_utf8", frame(b'{"\xff":1}'), "InvalidHeader"),
        C("utf8_encoded_surrogate", frame(b'{"\xed\xa0\x80":1}'), "InvalidHeader"),
        C("utf8_overlong", frame(b'{"\xc0\xaf":1}'), "InvalidHeader"),
        C("utf8_truncated_sequence", frame(b'{"\xe2\x82":1}'), "InvalidHeader"),
        C("zero_length_header", frame(b""), IHD),
        C("not_json", frame(b"hello!!!"), IHD),
        C("json_array", frame(b"[]"), IHD),
        C("json_string", frame(b'"abc"'), IHD),
        C("json_number", frame(b"12"), IHD),
        C("json_null", frame(b"null"), IHD),
        C("truncated_json", frame(b'{"a":'), IHD),
        C("unclosed_object", frame(b'{"__metadata__":{}'), IHD),
        C("trailing_garbage", frame(b"{} x"), IHD),
        C("nul_padding", frame(b"{}\x00\x00\x00\x00\x00\x00"), IHD),
        C("two_objects", frame(b"{}{}"), IHD),
        C("utf8_bom", frame(b"\xef\xbb\xbf{}"), IHD),
        C("trailing_comma", frame(b'{"__metadata__":{},}'), IHD),
        C("single_quotes", frame(b"{'a':1}"), IHD),
        C("non_string_key", frame(b"{1:2}"), IHD),
        C("raw_control_char_in_name", frame(pad8(b'{"a\nb":{' + _OK_ENTRY.encode() + b'}}'),
                                            b"x"), IHD),
        C("bad_escape", raw_entry('{"dtype":"F\\q32","shape":[2],"data_offsets":[0,8]}',
                                  bytes(8)), IHD),
        # -- duplicates --------------------------------------------------------------------
        C("duplicate_tensor_identical",
          frame(pad8(b'{"a":{' + _OK_ENTRY.encode() + b'},"a":{' + _OK_ENTRY.encode() + b'}}'),
                b"x"), IHD, reference_accepts=True),
        C("duplicate_tensor_different",
          frame(pad8(b'{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},'
                     b'"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]}}'), b"xy"), IHD,
          reference_accepts=True),
        C("duplicate_field_dtype", raw_entry('{"dtype":"U8",' + _OK_ENTRY + '}', b"x"), IHD),
        C("duplicate_field_offsets",
          raw_entry('{' + _OK_ENTRY + ',"data_offsets":[0,1]}', b"x"), IHD),
        C("duplicate_unknown_field", raw_entry('{' + _OK_ENTRY + ',"z":1,"z":2}', b"x"), IHD,
          reference_accepts=True),
        C("duplicate_metadata", frame(pad8(b'{"__metadata__":{},"__metadata__":{}}')), IHD),
        C("duplicate_metadata_key", frame(pad8(b'{"__metadata__":{"k":"1","k":"2"}}')), IHD,
          reference_accepts=True),
        C("duplicate_key_in_extra_object",
          raw_entry('{' + _OK_ENTRY + ',"z":{"q":1,"q":1}}', b"x"), IHD, reference_accepts=True),
        # -- tensor entries ----------------------------------------------------------------
        C("dtype_unknown", one("F33"), IHD),
        C("dtype_lowercase", one("f32"), IHD),
        C("dtype_not_string", raw_entry('{"dtype":32,"shape":[2],"data_offsets":[0,8]}',
                                        bytes(8)), IHD),
        C("dtype_enum_map", raw_entry('{"dtype":{"U8":null},"shape":[1],"data_offsets":[0,1]}',
                                      b"x"), IHD, reference_accepts=True),
        C("entry_array_form", raw_entry('["U8",[1],[0,1]]', b"x"), IHD, reference_accepts=True),
        C("entry_string", raw_entry('"F32"'), IHD),
        C("entry_number", raw_entry("7"), IHD),
        C("entry_null", raw_entry("null"), IHD),
        C("missing_dtype", raw_entry('{"shape":[1],"data_offsets":[0,1]}', b"x"), IHD),
        C("missing_shape", raw_entry('{"dtype":"U8","data_offsets":[0,1]}', b"x"), IHD),
        C("missing_offsets", raw_entry('{"dtype":"U8","shape":[1]}', b"x"), IHD),
        C("shape_negative", one("U8", [-1], 0, 1), IHD),
        C("shape_float", one("U8", [2.0], 0, 2), IHD),
        C("shape_exponent", raw_entry('{"dtype":"U8","shape":[2e0],"data_offsets":[0,2]}',
                                      b"xy"), IHD),
        C("shape_negative_zero", raw_entry('{"dtype":"U8","shape":[-0],"data_offsets":[0,0]}'),
          IHD),
        C("shape_bool", one("U8", [True], 0, 1), IHD),
        C("shape_null_entry", one("U8", [None], 0, 1), IHD),
        C("shape_string_entry", one("U8", ["1"], 0, 1), IHD),
        C("shape_nested", one("U8", [[1]], 0, 1), IHD),
        C("shape_not_array", raw_entry('{"dtype":"U8","shape":1,"data_offsets":[0,1]}', b"x"),
          IHD),
        C("shape_2_pow_64", one("U8", [2**64], 0, 1), IHD),
        C("shape_huge_int", raw_entry('{"dtype":"U8","shape":[' + "9" * 400 +
                                      '],"data_offsets":[0,1]}', b"x"), IHD),
        C("offsets_three", raw_entry('{"dtype":"U8","shape":[1],"data_offsets":[0,1,1]}', b"x"),
          IHD),
        C("offsets_one", raw_entry('{"dtype":"U8","shape":[0],"data_offsets":[0]}'), IHD),
        C("offsets_negative", one("U8", [1], -1, 0), IHD),
        C("offsets_float", raw_entry('{"dtype":"U8","shape":[1],"data_offsets":[0,1.0]}', b"x"),
          IHD),
        C("offsets_string", raw_entry('{"dtype":"U8","shape":[1],"data_offsets":"0,1"}', b"x"),
          IHD),
        C("offsets_2_pow_64", raw_entry('{"dtype":"U8","shape":[1],"data_offsets":[0,' +
                                        str(2**64) + ']}', b"x"), IHD),
        C("tensor_named_metadata", frame(pad8(b'{"__metadata__":{' + _OK_ENTRY.encode() +
                                              b'}}'), b"x"), IHD),
        # -- JSON values serde refuses and Python's json accepts -------------------------
        C("nan_in_extra_field", raw_entry('{' + _OK_ENTRY + ',"z":NaN}', b"x"), IHD),
        C("infinity_in_extra_field", raw_entry('{' + _OK_ENTRY + ',"z":-Infinity}', b"x"), IHD),
        C("float_out_of_range", raw_entry('{' + _OK_ENTRY + ',"z":1e400}', b"x"), IHD),
        C("int_out_of_f64_range", raw_entry('{' + _OK_ENTRY + ',"z":' + "9" * 400 + '}', b"x"),
          IHD),
        C("lone_high_surrogate_name", frame(pad8(b'{"a\\ud800b":{' + _OK_ENTRY.encode() + b'}}'),
                                            b"x"), IHD),
        C("lone_low_surrogate_metadata", frame(pad8(b'{"__metadata__":{"k":"\\udc00"}}')), IHD),
        C("surrogates_reversed", frame(pad8(b'{"__metadata__":{"k":"\\ude00\\ud83d"}}')), IHD),
        C("high_surrogate_then_letter", frame(pad8(b'{"__metadata__":{"k":"\\ud83dx"}}')), IHD),
        C("high_surrogate_then_high", frame(pad8(b'{"__metadata__":{"k":"\\ud83d\\ud83d"}}')),
          IHD),
        C("lone_surrogate_in_extra", raw_entry('{' + _OK_ENTRY + ',"z":["\\udfff"]}', b"x"), IHD),
        # -- nesting -----------------------------------------------------------------------
        C("deep_nesting_top", frame(b"[" * _DEEP), IHD),
        C("deep_nesting_closed_top", frame(b"[" * _DEEP + b"]" * _DEEP), IHD),
        C("deep_nesting_extra_field", raw_entry('{' + _OK_ENTRY + ',"z":' + "[" * _DEEP +
                                                "]" * _DEEP + '}', b"x"), IHD),
        C("deep_nesting_unclosed_extra", raw_entry('{' + _OK_ENTRY + ',"z":' + "[" * _DEEP,
                                                   b"x"), IHD),
        C("deep_nesting_metadata", frame(pad8(b'{"__metadata__":{"k":' + b"{" * _DEEP + b"}")),
          IHD),
        C("deep_nesting_shape", raw_entry('{"dtype":"U8","shape":' + "[" * _DEEP + "]" * _DEEP +
                                          ',"data_offsets":[0,0]}'), IHD),
        C("nesting_128_levels", raw_entry('{' + _OK_ENTRY + ',"z":' + "[" * 126 + "]" * 126 +
                                          '}', b"x"), IHD),
        # -- __metadata__ --------------------------------------------------------------------
        C("metadata_int_value", frame(pad8(b'{"__metadata__":{"k":1}}')), IHD),
        C("metadata_null_value", frame(pad8(b'{"__metadata__":{"k":null}}')), IHD),
        C("metadata_list_value", frame(pad8(b'{"__metadata__":{"k":["a"]}}')), IHD),
        C("metadata_object_value", frame(pad8(b'{"__metadata__":{"k":{"a":"b"}}}')), IHD),
        C("metadata_bool_value", frame(pad8(b'{"__metadata__":{"k":true}}')), IHD),
        C("metadata_string", frame(pad8(b'{"__metadata__":"k"}')), IHD),
        C("metadata_list", frame(pad8(b'{"__metadata__":[]}')), IHD),
        # -- offsets, sizes and the end of file ---------------------------------------------
        C("size_mismatch", one("F32", [2], 0, 4), "TensorInvalidInfo"),
        C("size_mismatch_zero_shape", one("F32", [0], 0, 4), "TensorInvalidInfo"),
        C("size_mismatch_scalar", one("F64", [], 0, 4), "TensorInvalidInfo"),
        C("offsets_not_from_zero", one("F32", [1], 4, 8), "InvalidOffset"),
        C("gap", build([("a", tensor("F32", [1], 0, 4)), ("b", tensor("F32", [1], 8, 12))],
                       data=bytes(12)), "InvalidOffset"),
        C("overlap", build([("a", tensor("F32", [2], 0, 8)), ("b", tensor("F32", [2], 4, 12))],
                           data=bytes(12)), "InvalidOffset"),
        C("same_range_twice", build([("a", tensor("F32", [1], 0, 4)),
                                     ("b", tensor("F32", [1], 0, 4))], data=bytes(4)),
          "InvalidOffset"),
        C("end_before_begin", build([("a", tensor("F32", [1], 0, 4)),
                                     ("b", tensor("F32", [1], 4, 0))], data=bytes(4)),
          "InvalidOffset"),
        C("data_short", one("F32", [2], 0, 8, data=bytes(7)), "MetadataIncompleteBuffer"),
        C("data_long", one("F32", [2], 0, 8, data=bytes(9)), "MetadataIncompleteBuffer"),
        C("data_missing", one("F32", [2], 0, 8, data=b""), "MetadataIncompleteBuffer"),
        C("no_tensors_trailing_byte", build([], data=b"\x00"), "MetadataIncompleteBuffer"),
        C("huge_tensor_past_eof", one("U8", [2**40], 0, 2**40, data=b"x"),
          "MetadataIncompleteBuffer"),
        C("overflow_elements", one("U8", [2**32, 2**32], 0, 0, data=b""), "ValidationOverflow"),
        C("overflow_before_zero", one("U8", [2**63, 2**63, 0], 0, 0, data=b""),
          "ValidationOverflow"),
        C("overflow_bits", one("U32", [2**62], 0, 0, data=b""), "ValidationOverflow"),
        C("overflow_bits_f4", one("F4", [2**62], 0, 2**61, data=b""), "ValidationOverflow"),
        C("f4_odd_count", one("F4", [3], 0, 2, data=b"xy"), "MisalignedSlice"),
        C("f6_two_elements", one("F6_E2M3", [2], 0, 2, data=b"xy"), "MisalignedSlice"),
        C("f6_e3m2_odd", one("F6_E3M2", [3, 1], 0, 3, data=b"xyz"), "MisalignedSlice"),
        C("f4_wrong_size", one("F4", [4], 0, 4, data=b"wxyz"), "TensorInvalidInfo"),
    ]
    names = [c.name for c in cases]
    assert len(names) == len(set(names)), "corpus case names must be unique"
    return cases


CASES: list[Case] = _cases()
MALFORMED: list[tuple[str, bytes]] = [(c.name, c.data) for c in CASES]


def _valid_odd() -> list[tuple[str, bytes]]:
    ok = '"dtype":"U8","shape":[1],"data_offsets":[0,1]'
    return [
        ("no_tensors", build([])),
        ("no_tensors_unpadded", frame(b"{}")),
        ("metadata_only", build([], {"format": "pt", "": "", "a\nb": "\u00e9\u4e2d\U0001f600"})),
        ("metadata_null", frame(pad8(b'{"__metadata__":null}'))),
        ("metadata_empty", frame(pad8(b'{"__metadata__":{}}'))),
        ("leading_whitespace", frame(b' \t\r\n{"t":{' + ok.encode() + b'}}', b"x")),
        ("whitespace_everywhere",
         frame(b'{ "t" : { "dtype" : "U8" ,\n"shape" : [ 1 ] , "data_offsets" : [ 0 , 1 ] } }'
               b'\t\r\n', b"x")),
        ("unknown_fields", frame(pad8(b'{"t":{' + ok.encode() +
                                      b',"extra":[1,{"x":null}],"n":-2.5e3}}'), b"x")),
        ("nesting_127_levels", frame(pad8(('{"t":{' + ok + ',"z":' + "[" * 125 + "]" * 125 +
                                           '}}').encode()), b"x")),
        ("surrogate_pair_escape", frame(pad8(b'{"__metadata__":{"k":"\\ud83d\\ude00"}}'))),
        ("escaped_dtype", frame(pad8(b'{"t":{"dtype":"\\u00558","shape":[1],'
                                     b'"data_offsets":[0,1]}}'), b"x")),
        ("zero_size_tensors", build([("a", tensor("F32", [0, 5], 0, 0)),
                                     ("b", tensor("U8", [3], 0, 3)),
                                     ("c", tensor("F64", [7, 0], 3, 3))], data=b"abc")),
        ("scalar", build([("s", tensor("F64", [], 0, 8))], data=bytes(8))),
        ("unsorted_offsets", build([("late", tensor("U8", [2], 4, 6)),
                                    ("early", tensor("U16", [2], 0, 4))], data=bytes(6))),
        ("awkward_names", build([("", tensor("U8", [1], 0, 1)),
                                 ("/", tensor("U8", [1], 1, 2)),
                                 ("..", tensor("U8", [1], 2, 3)),
                                 ("a\x00b\nc", tensor("U8", [1], 3, 4)),
                                 ("a.b", tensor("U8", [1], 4, 5)),
                                 ("a.b.c", tensor("U8", [1], 5, 6)),
                                 ("metadata.json", tensor("U8", [1], 6, 7))], data=b"0123456")),
        ("f4_even", build([("f", tensor("F4", [2, 3], 0, 3))], data=b"xyz")),
        ("f6_four", build([("f", tensor("F6_E3M2", [4], 0, 3))], data=b"xyz")),
        ("large_zero_dim", build([("z", tensor("U8", [2**63, 0], 0, 0))])),
        ("max_shape_entry_times_zero", build([("z", tensor("U8", [0, 2**64 - 1], 0, 0))])),
        ("negative_zero_lookalikes", build([("layer-0", tensor("U8", [1], 0, 1, note=":-0"))],
                                           {"k": "[-0", "-0": ",-0 "}, b"x")),
        ("ints_beyond_u64_in_extra", frame(pad8(('{"t":{' + ok + ',"z":[' + str(2**64) + ',' +
                                                 str(-2**63 - 1) + ',-0,1.5e300]}}').encode()),
                                           b"x")),
        ("big_int_in_extra", frame(pad8(('{"t":{' + ok + ',"z":' + "9" * 300 + '}}').encode()),
                                   b"x")),
    ]


VALID_ODD: list[tuple[str, bytes]] = _valid_odd()
