"""Hand-built GGUF files, valid and malformed, for the parser tests and the CLI tests.

Nothing current writes GGUF v1 or lets a test write a broken file, so this module carries
its own small writer (``encode_gguf``) that lays bytes out exactly as told, right or wrong.

Public:

* ``encode_gguf(...)`` — bytes of a GGUF file of any version (1, 2, 3) and byte order.
* ``valid_gguf(version=3, order="<")`` — a small valid file: every value type, a nested
  array, three tensors with data.  ``VALID_TENSOR_NAMES`` are its tensors.
* ``MALFORMED`` — a list of ``(case name, file bytes)``; ``EXPECTED_KINDS[case name]`` is
  the tuple of ``GGUFError.kind`` values the parser may refuse it with.
* ``NAMED_TENSOR_CASES`` — case names whose error message must contain a tensor name
  (``EXPECTED_NAME[case]``).
* ``TRUNCATIONS`` — ``(name, bytes, kinds)``: ``valid_gguf`` cut at every structure
  boundary of its header, for each version and byte order.
"""

from __future__ import annotations

import struct

# GGUF value type ids (ggml gguf.h)
U8, I8, U16, I16, U32, I32, F32, BOOL, STR, ARR, U64, I64, F64 = range(13)
_FMT = {U8: "B", I8: "b", U16: "H", I16: "h", U32: "I", I32: "i", F32: "f", BOOL: "?",
        U64: "Q", I64: "q", F64: "d"}

# ggml type ids and (block size, bytes per block) used below
F32_T, F16_T, Q4_0_T, Q8_0_T, Q4_K_T = 0, 1, 2, 8, 12
_BLOCK = {F32_T: (1, 4), F16_T: (1, 2), Q4_0_T: (32, 18), Q8_0_T: (32, 34), Q4_K_T: (256, 144)}


class Arr:
    """An array value for ``encode_gguf``: element type and items (``Arr`` for nesting)."""

    def __init__(self, elem_type: int, items, count: int | None = None):
        self.elem_type = elem_type
        self.items = list(items)
        self.count = len(self.items) if count is None else count   # a lying count on purpose


class Raw:
    """Bytes placed verbatim where a value would go."""

    def __init__(self, data: bytes):
        self.data = data


def _pad(n: int, align: int) -> int:
    return -(-n // align) * align


class _Enc:
    def __init__(self, version: int, order: str):
        self.v1 = version == 1
        self.o = order

    def u32(self, v: int) -> bytes:
        return struct.pack(self.o + "I", v)

    def u64(self, v: int) -> bytes:
        return struct.pack(self.o + "Q", v)

    def count(self, v: int) -> bytes:
        return self.u32(v) if self.v1 else self.u64(v)

    def string(self, s, length: int | None = None) -> bytes:
        data = s.encode("utf-8") if isinstance(s, str) else bytes(s)
        return self.count(len(data) if length is None else length) + data

    def value(self, vtype: int, value) -> bytes:
        if isinstance(value, Raw):
            return value.data
        if vtype == STR:
            return self.string(value)
        if vtype == ARR:
            assert isinstance(value, Arr)
            head = self.u32(value.elem_type) + self.count(value.count)
            return head + b"".join(self.value(value.elem_type, item) for item in value.items)
        return struct.pack(self.o + _FMT[vtype], value)


def encode_gguf(*, version: int = 3, order: str = "<", kvs=(), tensors=(), data: bytes = b"",
                alignment: int = 32, n_kv: int | None = None, n_tensors: int | None = None,
                magic: bytes = b"GGUF", raw_version: bytes | None = None,
                pad: bool = True) -> bytes:
    """A GGUF file laid out exactly as told.

    ``kvs``: (key, value type, value) — key a str or bytes, value per ``_Enc.value``.
    ``tensors``: (name, ne (ggml order), ggml type, relative offset) — name str or bytes.
    ``data`` goes at the aligned data offset (``pad=False``: right after the infos).
    ``n_kv`` / ``n_tensors`` override the counts written in the header.
    """
    e = _Enc(version, order)
    out = bytearray(magic)
    out += raw_version if raw_version is not None else e.u32(version)
    out += e.count(len(tensors) if n_tensors is None else n_tensors)
    out += e.count(len(kvs) if n_kv is None else n_kv)
    for key, vtype, value in kvs:
        out += e.string(key) + e.u32(vtype) + e.value(vtype, value)
    dim = e.u32 if e.v1 else e.u64
    for name, ne, ggml_type, offset in tensors:
        out += e.string(name) + e.u32(len(ne))
        for d in ne:
            out += dim(d)
        out += e.u32(ggml_type) + e.u64(offset)
    if pad and (tensors or data):
        out += bytes(_pad(len(out), alignment) - len(out))
    out += data
    return bytes(out)


def tensor_nbytes(ne, ggml_type: int) -> int:
    block, size = _BLOCK[ggml_type]
    rows = 1
    for d in ne[1:]:
        rows *= d
    return ne[0] // block * size * rows


def layout(specs, alignment: int = 32):
    """(name, ne, type) specs -> (tensor infos with packed aligned offsets, data bytes)."""
    infos, data = [], bytearray()
    for i, (name, ne, ggml_type) in enumerate(specs):
        infos.append((name, ne, ggml_type, len(data)))
        data += bytes([(i * 37 + j) % 251 for j in range(tensor_nbytes(ne, ggml_type))])
        data += bytes(_pad(len(data), alignment) - len(data))
    return infos, bytes(data)


VALID_TENSOR_NAMES = ("token_embd.weight", "blk.0.attn_q.weight", "output_norm.weight")
_VALID_SPECS = ((VALID_TENSOR_NAMES[0], (64, 4), Q4_0_T),
                (VALID_TENSOR_NAMES[1], (8, 8), F16_T),
                (VALID_TENSOR_NAMES[2], (16,), F32_T))

VALID_KVS = (
    ("general.architecture", STR, "llama"),
    ("general.alignment", U32, 32),
    ("t.u8", U8, 255), ("t.i8", I8, -128), ("t.u16", U16, 65535), ("t.i16", I16, -32768),
    ("t.u32", U32, 2**32 - 1), ("t.i32", I32, -2**31), ("t.f32", F32, 0.1),
    ("t.bool", BOOL, True), ("t.u64", U64, 2**64 - 1), ("t.i64", I64, -2**63),
    ("t.f64", F64, 0.1),
    ("tokenizer.ggml.tokens", ARR, Arr(STR, ["<s>", "</s>", "héllo", b"\xff\xfe"])),
    ("tokenizer.ggml.scores", ARR, Arr(F32, [0.0, -1.5, 0.1, float("inf")])),
    ("t.nested", ARR, Arr(ARR, [Arr(U8, [1, 2]), Arr(U8, [])])),
)

# Python values the parser must decode VALID_KVS to
VALID_VALUES = {
    "general.architecture": "llama", "general.alignment": 32,
    "t.u8": 255, "t.i8": -128, "t.u16": 65535, "t.i16": -32768, "t.u32": 2**32 - 1,
    "t.i32": -2**31, "t.f32": 0.1, "t.bool": True, "t.u64": 2**64 - 1, "t.i64": -2**63,
    "t.f64": 0.1,
    "tokenizer.ggml.tokens": ["<s>", "</s>", "héllo", "\udcff\udcfe"],
    "tokenizer.ggml.scores": [0.0, -1.5, 0.1, "inf"],
    "t.nested": [[1, 2], []],
}


def valid_gguf(version: int = 3, order: str = "<", kvs=VALID_KVS) -> bytes:
    infos, data = layout(_VALID_SPECS)
    return encode_gguf(version=version, order=order, kvs=kvs, tensors=infos, data=data)


def header_end(version: int = 3, order: str = "<") -> int:
    """Where the tensor infos of ``valid_gguf`` end (before the padding)."""
    infos, _ = layout(_VALID_SPECS)
    return len(encode_gguf(version=version, order=order, kvs=VALID_KVS, tensors=infos, pad=False))


def _boundaries(version: int = 3) -> list[int]:
    """Offsets of every structure boundary in ``valid_gguf(version)``'s header."""
    e = _Enc(version, "<")
    cut = [0, 4, 8, 8 + len(e.count(0)), 8 + 2 * len(e.count(0))]
    pos = cut[-1]
    for key, vtype, value in VALID_KVS:
        body = e.value(vtype, value)
        for part in (e.count(len(key.encode())), key.encode(), e.u32(vtype), body):
            pos += len(part)
            cut.append(pos)
        if vtype == ARR:                                  # inside the array: type, count
            cut += [pos - len(body) + 4, pos - len(body) + 4 + len(e.count(0))]
    for name, ne, ggml_type, offset in layout(_VALID_SPECS)[0]:
        dims = b"".join(e.u32(d) if e.v1 else e.u64(d) for d in ne)
        for part in (e.count(len(name)), name.encode(), e.u32(len(ne)), dims, e.u32(ggml_type),
                     e.u64(offset)):
            pos += len(part)
            cut.append(pos)
    return sorted(set(c for c in cut if c < pos)) + [pos]


def _cases() -> tuple[list[tuple[str, bytes]], dict[str, tuple[str, ...]], dict[str, str]]:
    cases: list[tuple[str, bytes]] = []
    kinds: dict[str, tuple[str, ...]] = {}
    names: dict[str, str] = {}

    def add(name: str, data: bytes, *expected: str, tensor: str | None = None) -> None:
        assert name not in kinds, name
        cases.append((name, data))
        kinds[name] = expected
        if tensor is not None:
            names[name] = tensor

    base = valid_gguf()
    infos, data = layout(_VALID_SPECS)
    arch = (("general.architecture", STR, "llama"),)

    # --- truncation: a few representative cuts here (TRUNCATIONS has every structural one)
    for version in (1, 2, 3):
        full = valid_gguf(version)
        cuts = _boundaries(version)
        for cut in (cuts[3], cuts[len(cuts) // 3], cuts[-4]):
            add(f"v{version}-cut-at-{cut}", full[:cut], "truncated", "count")
        add(f"v{version}-cut-after-infos", full[:cuts[-1]], "tensor_data",
            tensor=VALID_TENSOR_NAMES[0])
    big = valid_gguf(3, ">")
    add("be-cut-in-kv", big[:60], "truncated", "count")
    add("empty-file", b"", "truncated")
    add("three-bytes", b"GGU", "truncated")
    add("43-bytes", base[:43], "truncated", "count")
    add("header-only-24-bytes", base[:24], "truncated", "count")

    # --- tensor data cut off: the first tensor that does not fit is named
    data_start = len(base) - len(data)
    for name, ne, ggml_type, rel in infos:
        cut_at = data_start + rel + tensor_nbytes(ne, ggml_type) - 1
        add(f"cut-inside-{name}", base[:cut_at], "tensor_data", tensor=name)

    # --- magic and version
    add("bad-magic", b"GGML" + base[4:], "magic")
    add("lowercase-magic", b"gguf" + base[4:], "magic")
    add("swapped-magic", b"FUGG" + base[4:], "magic")
    for v in (0, 4, 99, 2**32 - 1):
        add(f"version-{v}", encode_gguf(raw_version=struct.pack("<I", v), kvs=arch), "version")
    add("version-4-big-endian", encode_gguf(raw_version=struct.pack(">I", 4), kvs=arch), "version")

    # --- counts past the end of the file
    for label, n in (("2^63-1", 2**63 - 1), ("2^64-1", 2**64 - 1), ("1000", 1000)):
        add(f"n_kv-{label}", encode_gguf(kvs=arch, n_kv=n), "count")
        add(f"n_tensors-{label}", encode_gguf(kvs=arch, n_tensors=n), "count")
        add(f"array-count-{label}", encode_gguf(kvs=(("a", ARR, Arr(U32, [1, 2], count=n)),)),
            "count")
        add(f"string-array-count-{label}", encode_gguf(kvs=(("a", ARR, Arr(STR, ["x"], count=n)),)),
            "count")
        add(f"nested-array-count-{label}",
            encode_gguf(kvs=(("a", ARR, Arr(ARR, [Arr(U8, [1])], count=n)),)), "count")
    add("v1-n_kv-2^32-1", encode_gguf(version=1, kvs=arch, n_kv=2**32 - 1), "count")
    add("be-n_tensors-2^63-1", encode_gguf(order=">", kvs=arch, n_tensors=2**63 - 1), "count")
    add("string-array-lengths-past-eof",
        encode_gguf(kvs=(("a", ARR, Arr(STR, [Raw(struct.pack("<Q", 2**40) + b"x")] * 3)),)),
        "truncated")
    for label, n in (("2^63-1", 2**63 - 1), ("2^64-1", 2**64 - 1)):
        add(f"string-array-element-length-{label}",
            encode_gguf(kvs=(("a", ARR, Arr(STR, ["ab", Raw(struct.pack("<Q", n)), "cd", "ef"])),)),
            "truncated")
    add("string-array-last-length-past-eof",
        encode_gguf(kvs=(("a", ARR, Arr(STR, ["ab", Raw(struct.pack("<Q", 9) + b"x")])),)),
        "truncated")

    # --- string lengths
    e = _Enc(3, "<")
    head = b"GGUF" + e.u32(3) + e.u64(0) + e.u64(1)
    add("key-length-2^64-1", head + e.u64(2**64 - 1) + bytes(16), "truncated")
    add("key-length-2^63", head + e.u64(2**63) + bytes(16), "truncated")
    add("value-string-length-huge", head + e.string("k") + e.u32(STR) + e.u64(2**62) + b"x",
        "truncated")
    add("tensor-name-length-huge",
        b"GGUF" + e.u32(3) + e.u64(1) + e.u64(0) + e.u64(2**64 - 8) + bytes(32), "truncated")

    # --- value types
    add("unknown-value-type-13", encode_gguf(kvs=(("a", 13, Raw(b"\0" * 8)),)), "value_type")
    add("unknown-value-type-2^32-1", encode_gguf(kvs=(("a", 2**32 - 1, Raw(b"\0" * 8)),)),
        "value_type")
    add("unknown-array-element-type", encode_gguf(kvs=(("a", ARR, Arr(77, [Raw(b"\0")])),)),
        "value_type")
    deep = Arr(ARR, [Arr(ARR, [Arr(ARR, [Arr(U8, [1])])])])
    add("arrays-nested-4-deep", encode_gguf(kvs=(("deep", ARR, deep),)), "nesting")
    deep_empty = Arr(ARR, [Arr(ARR, [Arr(ARR, [])])])
    add("arrays-nested-4-deep-empty", encode_gguf(kvs=(("deep", ARR, deep_empty),)), "nesting")

    # --- keys
    add("duplicate-key", encode_gguf(kvs=(("a", U8, 1), ("b", U8, 2), ("a", U32, 3))),
        "duplicate_key")
    add("empty-key", encode_gguf(kvs=(("", U8, 1),)), "key")
    add("invalid-utf8-key", encode_gguf(kvs=((b"k\xff", U8, 1),)), "key")

    # --- alignment
    for label, vtype, value in (("0", U32, 0), ("3", U32, 3), ("48", U32, 48),
                                ("uint64", U64, 32), ("int32", I32, 32), ("string", STR, "32"),
                                ("array", ARR, Arr(U32, [32]))):
        add(f"alignment-{label}", encode_gguf(kvs=(("general.alignment", vtype, value),),
                                              tensors=infos, data=data), "alignment")

    # --- tensor infos
    def one(ne, ggml_type=F32_T, offset=0, name="t", n_bytes=None):
        size = tensor_nbytes(ne, ggml_type) if n_bytes is None else n_bytes
        return encode_gguf(kvs=arch, tensors=((name, ne, ggml_type, offset),), data=bytes(size))

    for t in (4, 5, 31, 99, 2**31, 2**32 - 1):
        add(f"ggml-type-{t}", one((32,), t, n_bytes=64), "ggml_type", tensor="t")
    add("n_dims-5", one((1, 1, 1, 1, 1), n_bytes=4), "n_dims")
    add("n_dims-2^32-1", b"GGUF" + e.u32(3) + e.u64(1) + e.u64(0) + e.string("t")
        + e.u32(2**32 - 1) + e.u32(F32_T) + e.u64(0) + bytes(64), "n_dims")
    add("ne0-not-block-multiple", one((33, 2), Q4_0_T, n_bytes=64), "shape", tensor="t")
    add("ne0-not-block-multiple-q4k", one((128,), Q4_K_T, n_bytes=144), "shape", tensor="t")
    add("dims-product-overflows-64-bits", one((2**32, 2**32, 2**32), n_bytes=0), "shape",
        tensor="t")
    add("dims-product-2^63", one((2**32, 2**31), F16_T, n_bytes=0), "shape", tensor="t")
    add("dim-negative", one((2**63, 1), n_bytes=0), "shape", tensor="t")
    add("dim-2^64-1", one((2**64 - 1,), n_bytes=0), "shape", tensor="t")
    add("offset-misaligned", one((8,), offset=4, n_bytes=64), "offset", tensor="t")
    add("offset-past-eof", one((8,), offset=2**64 - 32, n_bytes=32), "tensor_data", tensor="t")
    add("tensor-bigger-than-file", one((1024, 1024), n_bytes=64), "tensor_data", tensor="t")
    add("tensor-data-missing", one((1024,), n_bytes=0), "tensor_data", tensor="t")
    two = (("a", (16,), F32_T, 0), ("b", (16,), F32_T, 32))
    add("overlapping-tensors", encode_gguf(kvs=arch, tensors=two, data=bytes(128)), "overlap",
        tensor="b")
    same = (("a", (8,), F32_T, 0), ("b", (8,), F32_T, 0))
    add("tensors-at-same-offset", encode_gguf(kvs=arch, tensors=same, data=bytes(64)), "overlap")
    dup = (("a", (8,), F32_T, 0), ("a", (8,), F32_T, 32))
    add("duplicate-tensor-name", encode_gguf(kvs=arch, tensors=dup, data=bytes(64)),
        "duplicate_tensor", tensor="a")
    add("invalid-utf8-tensor-name", encode_gguf(kvs=arch, tensors=((b"bad\xc3(", (8,), F32_T, 0),),
                                                data=bytes(32)), "tensor_name")
    add("v1-dims-cut", valid_gguf(1)[:header_end(1) - 3], "truncated")
    add("be-overlap", encode_gguf(order=">", kvs=arch, tensors=two, data=bytes(128)), "overlap")
    return cases, kinds, names


def _truncations() -> list[tuple[str, bytes, tuple[str, ...]]]:
    out = []
    for version in (1, 2, 3):
        for order in "<>":
            full = valid_gguf(version, order)
            for cut in _boundaries(version)[:-1]:
                out.append((f"v{version}{order}-cut-at-{cut}", full[:cut], ("truncated", "count")))
    return out


MALFORMED, EXPECTED_KINDS, EXPECTED_NAME = _cases()
NAMED_TENSOR_CASES = tuple(EXPECTED_NAME)
# every structural cut of valid_gguf's header, each version and byte order:
# (name, bytes, acceptable kinds) — too many for the CLI tests, so kept apart from MALFORMED
TRUNCATIONS = _truncations()
