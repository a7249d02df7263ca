"""Fuzzing both parsers in the suite, under the contract of ``fuzz.check`` (issue 5).

The parser test modules already mutate bytes at random; this module adds what they do not:

* every length, count, type and offset field of valid GGUF files set to every boundary
  value (0, 1, 2**31-1, 2**32-1, 2**63-1, 2**64-1 and their neighbours), exhaustively;
* the same for every shape entry, data offset and the header length of safetensors files;
* structure-aware random mutations (GGUF header fields; safetensors JSON as JSON);
* for every input: the tracemalloc bound, a per-input alarm (a hang fails, it does not hang
  the suite), a grown-prefix parse that must agree with the whole-file parse, and what a
  mount would build from an accepted model;
* the regression corpus ``tests/regressions/``: every input fuzzing ever found, replayed
  through both parsers and through the loader;
* the harness itself: a hang, an allocation sized by a claimed count and a foreign
  exception are each caught.
"""

from __future__ import annotations

import os
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fuzz import check as fz
from tensorfs.errors import ModelError

pytestmark = pytest.mark.slow     # every test here runs for seconds

REGRESSIONS = Path(__file__).resolve().parents[1] / "regressions"
GGUF_SEEDS = fz.gguf_seeds()
ST_SEEDS = fz.safetensors_seeds()


def fuzz_settings(n: int) -> settings:
    # no deadline: fuzz.check's own alarm is the per-input time bound
    return settings(max_examples=n, deadline=None, database=None,
                    suppress_health_check=[HealthCheck.too_slow])


# -- exhaustive boundary values ---------------------------------------------------------

@pytest.mark.parametrize("seed_index", range(len(GGUF_SEEDS)))
def test_every_gguf_field_at_every_boundary_value(seed_index):
    seed = GGUF_SEEDS[seed_index]
    order = fz.gguf_order(seed)
    outcomes: dict[str, int] = {}
    fields = fz.gguf_fields(seed)
    for at, width, role in fields:
        for value in fz.BOUNDARY_VALUES + (len(seed), len(seed) - 1):
            data = fz.set_field(seed, at, width, value, order)
            # the grown-prefix comparison (the costly part) for the widest values only
            prefix = 64 if value in (0, 2**32 - 1, 2**64 - 1) else None
            try:
                result = fz.check(data, "gguf", prefix=prefix)
            except AssertionError as error:
                raise AssertionError(f"{role} = {value}: {error}") from None
            outcomes[result["outcome"]] = outcomes.get(result["outcome"], 0) + 1
    # the walk reached the counts, the strings, the arrays and the tensor records
    roles = {role.split(".")[-1].rstrip("[]0123456789") for _, _, role in fields}
    assert {"n_tensors", "n_kv", "key_length", "array_length", "n_dims", "ggml_type",
            "offset"} <= roles, roles
    assert "model" in outcomes and len(outcomes) > 5, outcomes


def _st_variants(seed: bytes):
    """The seed with each shape entry, each data offset and the header length set to each
    boundary value, re-framed (the JSON length changes) and not."""
    import json

    n = struct.unpack_from("<Q", seed)[0]
    header = json.loads(seed[8:8 + n])
    data = seed[8 + n:]
    for value in fz.BOUNDARY_VALUES + (2**64, len(data)):
        yield f"length={value}", struct.pack("<Q", value % 2**64) + seed[8:]
        for name, entry in header.items():
            if name == "__metadata__":
                continue
            places = [("shape", i) for i in range(len(entry["shape"]))] + \
                     [("data_offsets", 0), ("data_offsets", 1)]
            for field, i in places:
                changed = json.loads(json.dumps(header))
                changed[name][field][i] = value
                text = json.dumps(changed, separators=(",", ":")).encode()
                yield f"{name}.{field}[{i}]={value}", struct.pack("<Q", len(text)) + text + data


@pytest.mark.parametrize("seed_index", range(len(ST_SEEDS)))
def test_every_safetensors_number_at_every_boundary_value(seed_index):
    seen = set()
    for i, (what, data) in enumerate(_st_variants(ST_SEEDS[seed_index])):
        try:
            seen.add(fz.check(data, "safetensors", prefix=16 if i % 4 == 0 else None)["outcome"])
        except AssertionError as error:
            raise AssertionError(f"{what}: {error}") from None
    assert seen


# -- structure-aware random mutations ----------------------------------------------------

@fuzz_settings(300)
@given(rng=st.randoms(use_true_random=False), seed=st.sampled_from(GGUF_SEEDS))
def test_gguf_field_mutations(rng, seed):
    fz.check_both(fz.mutate_gguf(seed, rng, GGUF_SEEDS), prefix=rng.choice((8, 24, 100)))


@fuzz_settings(300)
@given(rng=st.randoms(use_true_random=False), seed=st.sampled_from(ST_SEEDS))
def test_safetensors_json_mutations(rng, seed):
    fz.check_both(fz.mutate_safetensors(seed, rng, ST_SEEDS), prefix=rng.choice((8, 16, 64)))


@fuzz_settings(200)
@given(rng=st.randoms(use_true_random=False),
       seed=st.sampled_from(GGUF_SEEDS + ST_SEEDS))
def test_byte_mutations_of_any_seed(rng, seed):
    fz.check_both(fz.mutate_bytes(seed, rng, GGUF_SEEDS + ST_SEEDS, 1024))


def test_tiny_files_claiming_everything_are_refused_fast_and_small():
    """A 40-byte file that claims 2**64-1 of something costs what 40 bytes cost."""
    for version in (1, 2, 3):
        width = 4 if version == 1 else 8
        for n_tensors, n_kv in ((2**64 - 1, 0), (0, 2**64 - 1), (2**32 - 1, 2**32 - 1)):
            head = b"GGUF" + struct.pack("<I", version)
            for v in (n_tensors, n_kv):
                head += (v % 2**(8 * width)).to_bytes(width, "little")
            for tail in (b"", bytes(24), b"\xff" * 24):
                started = time.perf_counter()
                result = fz.check(head + tail, "gguf")
                assert result["outcome"] in ("count", "truncated"), result
                assert result["parse_peak"] < 1 << 20
                assert time.perf_counter() - started < 0.5
    for n in (2**64 - 1, 10**8, 10**8 + 1, 2**32):
        result = fz.check(struct.pack("<Q", n) + b"{}", "safetensors")
        assert result["outcome"] in ("HeaderTooLarge", "InvalidHeaderLength")


# -- the regression corpus ------------------------------------------------------------------

REGRESSION_FILES = sorted(p for p in REGRESSIONS.glob("*") if p.suffix in (".gguf", ".safetensors", ".bin"))


def test_the_field_walker_refuses_what_it_cannot_trust():
    """Found by atheris: the harness's own GGUF field walker, handed a mutated file by the
    custom mutator, trusted an array length of 2**62 and grew to 2 GB (libFuzzer's
    -rss_limit_mb stopped it).  It now checks the file with the parser first."""
    data = (REGRESSIONS / "gguf-array-length-2e62.gguf").read_bytes()
    with pytest.raises(ValueError, match="not a valid GGUF"):
        fz.gguf_fields(data)
    assert fz.check(data, "gguf")["outcome"] == "count"


def test_regression_corpus_is_not_empty_and_documented():
    assert REGRESSION_FILES, "tests/regressions/ holds every input fuzzing found"
    readme = (REGRESSIONS / "README.md").read_text()
    for path in REGRESSION_FILES:
        assert path.name in readme, f"{path.name}: say in README.md what it found"


@pytest.mark.parametrize("path", REGRESSION_FILES, ids=[p.name for p in REGRESSION_FILES])
def test_regression_inputs(path, tmp_path):
    data = path.read_bytes()
    fz.check_both(data, prefix=16)
    from tensorfs.sources.modelfile import parse_model_file

    copy = tmp_path / path.name
    copy.write_bytes(data)
    try:
        model = parse_model_file(str(copy))
    except ModelError as error:
        assert "\n" not in error.one_line()
    else:
        assert all(t.offset + t.nbytes <= model.file_size for t in model.tensors)


# -- name shapes: memory linear in the file, whatever the names look like --------------------

_PIECES = ["", "a", "%", "/", "\n", "\x7f", "metadata", "headers", "header.bin", "npy",
           "\u00e9", "\U0001F600", "x" * 250]


@st.composite
def name_shapes(draw):
    """Names of the shapes that cost the most per byte: deep (a component per dot), wide
    (many names in one directory), long components (hashed), many escapes (3 bytes per
    character), reserved first components, each name a prefix of the next (rule 5)."""
    shape = draw(st.sampled_from(["deep", "wide", "long", "escapes", "reserved", "chain",
                                  "mixed"]))
    n = draw(st.integers(1, 3000))
    piece = draw(st.sampled_from(_PIECES))
    if shape == "deep":
        return [".".join([piece] * n), "w"]
    if shape == "wide":
        return [f"{piece}{i}" for i in range(min(n, 1500))]
    if shape == "long":
        return [(piece or "y") * n, ".".join([piece or "z"] * 3) * (1 + n // 100)]
    if shape == "escapes":
        return [".".join(["\n%/\x01" * 3] * (n // 4 + 1))]
    if shape == "reserved":
        return [f"{r}.{piece}{i}" for i in range(min(n, 300))
                for r in ("metadata", "headers", "header", "metadata.json")]
    if shape == "chain":
        return [".".join([piece or "a"] * k) for k in range(1, min(n, 150) + 1)]
    return draw(st.lists(st.lists(st.sampled_from(_PIECES), min_size=1, max_size=60)
                         .map(".".join), min_size=1, max_size=40, unique=True))


@fuzz_settings(25)
@given(names=name_shapes())
def test_name_shapes_cost_memory_linear_in_the_file(names):
    """Paths in both layouts, metadata.json, the whole tree walked with sizes and xattrs, the
    inspect report: at most NAME_BYTES_PER_INPUT_BYTE per byte of the file (issue 14: one
    name of 40,000 dots cost 1.6 GB, ~40,000 bytes per byte)."""
    fz.check_names(list(dict.fromkeys(names)))


def test_the_review_case_a_name_of_40000_dots():
    result = fz.check_names(["." * 40_000, "w"], seconds=None)
    assert result["per_byte"] < fz.NAME_BYTES_PER_INPUT_BYTE


# -- the harness catches what it is there to catch ----------------------------------------

def test_harness_catches_a_hang(monkeypatch):
    def hang(buf, file_size, path="", mtime=0.0):
        while True:
            pass

    monkeypatch.setitem(fz.PARSERS, "gguf", (hang,) + fz.PARSERS["gguf"][1:])
    started = time.monotonic()
    with pytest.raises(fz.Violation, match="hang"):
        fz.check(GGUF_SEEDS[0], "gguf", seconds=0.3)
    assert time.monotonic() - started < 5


def test_harness_catches_an_allocation_sized_by_a_claim(monkeypatch):
    real = fz.PARSERS["gguf"][0]

    def greedy(buf, file_size, path="", mtime=0.0):
        claimed = bytearray(64 << 20)         # as if a count of 2**26 were trusted
        del claimed
        return real(buf, file_size, path, mtime)

    monkeypatch.setitem(fz.PARSERS, "gguf", (greedy,) + fz.PARSERS["gguf"][1:])
    with pytest.raises(fz.Violation, match="peaked"):
        fz.check(GGUF_SEEDS[0], "gguf")


def test_harness_catches_a_foreign_exception(monkeypatch):
    def broken(buf, file_size, path="", mtime=0.0):
        return struct.unpack_from("<Q", buf, 10**6)

    monkeypatch.setitem(fz.PARSERS, "safetensors", (broken,) + fz.PARSERS["safetensors"][1:])
    with pytest.raises(fz.Violation, match="struct.error|error escaped"):
        fz.check(ST_SEEDS[0], "safetensors")


def test_harness_catches_names_that_cost_memory_quadratic_in_their_depth(monkeypatch):
    """The old rule-5 walk, which kept every parent path of every name, is caught."""
    from tensorfs.views import names as namespace

    real = namespace._continued

    def every_parent_kept(names):
        parents = set()
        for name in names:
            parent = name.rpartition(".")[0]
            while parent and parent not in parents:
                parents.add(parent)
                parent = parent.rpartition(".")[0]
        return real(names)

    monkeypatch.setattr(namespace, "_continued", every_parent_kept)
    with pytest.raises(fz.Violation, match="per byte"):
        fz.check_names(["." * 4000, "w"], seconds=None)


# -- the atheris entry point -----------------------------------------------------------------

def test_atheris_entry_point_runs(tmp_path):
    pytest.importorskip("atheris")
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    result = subprocess.run(
        [sys.executable, "fuzz/fuzz_parsers.py", "-runs=400", "-seed=1",
         f"-artifact_prefix={tmp_path}/", str(corpus)],
        cwd=Path(__file__).resolve().parents[2], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Done 400 runs" in result.stderr
    assert len(os.listdir(corpus)) > 10        # the seed corpus went in, and grew


# -- docs/reference/limits.md: every cap and the exact error it gives, generated here ------------------

def _limit_cases():
    """(format, kind, what is refused, file bytes): one file per way a file is refused."""
    from tests.support import gguf_corpus as g
    from tests.support import safetensors_corpus as s

    big = 2**64 - 1
    ok = [("general.architecture", g.STR, "llama")]
    t = [("t", (32,), g.F32_T, 0)]
    data = bytes(128)
    gguf = [
        ("magic", "the first 4 bytes are not `GGUF`", g.encode_gguf(magic=b"GGML")),
        ("version", "version other than 1, 2, 3 (either byte order)",
         g.encode_gguf(raw_version=(4).to_bytes(4, "little"))),
        ("truncated", "a file cut inside its header",
         g.encode_gguf(kvs=ok + [("general.name", g.STR, "x" * 40)])[:-8]),
        ("truncated", "a string longer than the rest of the file (length 2**64-1)",
         g.encode_gguf(kvs=[("k", g.STR, g.Raw((big).to_bytes(8, "little") + b"x"))])),
        ("count", "a tensor count the rest of the file cannot hold (24 bytes per tensor "
                  "info at least; 20 in v1)", g.encode_gguf(kvs=ok, n_tensors=big)),
        ("count", "a metadata count the rest of the file cannot hold (13 bytes per "
                  "entry at least; 9 in v1)", g.encode_gguf(kvs=ok, n_kv=2**62)),
        ("count", "an array length the rest of the file cannot hold (element size x length)",
         g.encode_gguf(kvs=[("a", g.ARR, g.Arr(g.U32, [1], count=2**62))])),
        ("value_type", "a value type id that is not a GGUF value type",
         g.encode_gguf(kvs=[("k", 13, g.Raw(b""))])),
        ("nesting", "arrays nested deeper than `MAX_ARRAY_DEPTH` (3)",
         g.encode_gguf(kvs=[("a", g.ARR, g.Arr(g.ARR, [g.Arr(g.ARR, [g.Arr(g.ARR, [
             g.Arr(g.U8, [1])])])]))])),
        ("key", "an empty metadata key", g.encode_gguf(kvs=[("", g.U8, 1)])),
        ("key", "a metadata key that is not UTF-8", g.encode_gguf(kvs=[(b"\xff", g.U8, 1)])),
        ("duplicate_key", "the same key twice", g.encode_gguf(kvs=ok + ok)),
        ("alignment", "`general.alignment` of another type than uint32",
         g.encode_gguf(kvs=[("general.alignment", g.U64, 32)])),
        ("alignment", "`general.alignment` not a non-zero power of two",
         g.encode_gguf(kvs=[("general.alignment", g.U32, 48)])),
        ("tensor_name", "a tensor name that is not UTF-8",
         g.encode_gguf(tensors=[(b"\xc3", (32,), g.F32_T, 0)], data=data)),
        ("duplicate_tensor", "the same tensor name twice",
         g.encode_gguf(tensors=t + [("t", (32,), g.F32_T, 128)], data=data * 2)),
        ("n_dims", "more than `MAX_DIMS` (4) dimensions",
         g.encode_gguf(tensors=[("t", (1, 1, 1, 1, 32), g.F32_T, 0)], data=data)),
        ("ggml_type", "a ggml type id ggml does not define or has removed (4, 5, 31-33, 36-38)",
         g.encode_gguf(tensors=[("t", (32,), 4, 0)], data=data)),
        ("shape", "a dimension of 2**63 or more (negative as ggml's int64)",
         g.encode_gguf(tensors=[("t", (2**63,), g.F32_T, 0)], data=data)),
        ("shape", "a product of dimensions of 2**63-1 or more (`MAX_ELEMENTS`)",
         g.encode_gguf(tensors=[("t", (2**32, 2**31), g.F32_T, 0)], data=data)),
        ("shape", "ne[0] not a multiple of the type's block size",
         g.encode_gguf(tensors=[("t", (33,), g.Q8_0_T, 0)], data=data)),
        ("offset", "a tensor offset that is not a multiple of the alignment",
         g.encode_gguf(tensors=[("t", (8,), g.F32_T, 4)], data=data)),
        ("overlap", "two tensors whose bytes overlap",
         g.encode_gguf(tensors=t + [("u", (32,), g.F32_T, 96)], data=data * 2)),
        ("tensor_data", "tensor data that ends (or starts) past the end of the file",
         g.encode_gguf(tensors=[("t", (64,), g.F32_T, 0)], data=data)),
    ]
    n = s.MAX_HEADER_SIZE
    deep = '{"t":{"dtype":"U8","shape":[1],"data_offsets":[0,1],"z":' + "[" * 126 + "]" * 126
    safetensors = [
        ("HeaderTooSmall", "a file shorter than the 8-byte header length", b"\x01\x00"),
        ("HeaderTooLarge", "a header length over `MAX_HEADER_SIZE` (100,000,000 bytes)",
         (n + 1).to_bytes(8, "little") + b"{}"),
        ("InvalidHeaderLength", "a header length past the end of the file",
         (1000).to_bytes(8, "little") + b"{}"),
        ("InvalidHeader", "a header that is not UTF-8", s.frame(b'{"\xff":1}')),
        ("InvalidHeaderDeserialization", "JSON nested deeper than serde_json's 127 levels",
         s.frame((deep + "}}").encode(), b"x")),
        ("InvalidHeaderDeserialization", "a shape entry or offset of 2**64 or more, or negative",
         s.one("U8", [2**64], 0, 1)),
        ("InvalidHeaderDeserialization", "the same key twice (tensor or __metadata__)",
         s.frame(b'{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},'
                 b'"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}', b"x")),
        ("InvalidOffset", "tensors that leave a gap or overlap (sorted by offset, each must "
                          "start where the previous ended)", s.one("U8", [1], 1, 2)),
        ("ValidationOverflow", "an element count of 2**64 or more",
         s.one("U8", [2**32, 2**32], 0, 1)),
        ("ValidationOverflow", "element count x bits of 2**64 or more",
         s.one("F64", [2**61], 0, 1)),
        ("MisalignedSlice", "sub-byte elements (F4, F6) that are not a whole number of bytes",
         s.one("F4", [3], 0, 2)),
        ("TensorInvalidInfo", "data_offsets that do not span dtype x shape bytes",
         s.one("F32", [2], 0, 4)),
        ("MetadataIncompleteBuffer", "data that does not end exactly at the end of the file",
         s.one("U8", [1], 0, 1, data=b"xy")),
    ]
    return [("gguf", *c) for c in gguf] + [("safetensors", *c) for c in safetensors]


def _limits_table() -> str:
    rows = ["| format | kind | refused | what `tensorfs inspect` says |",
            "|---|---|---|---|"]
    for fmt, kind, what, data in _limit_cases():
        result = fz.check(data, fmt, memory=False)       # the whole contract holds too
        assert result["outcome"] == kind, (kind, what, result)
        parse, error_type, _ = fz.PARSERS[fmt]
        with pytest.raises(error_type) as info:
            parse(data, len(data))
        info.value.file = f"model.{fmt}"
        line = ("tensorfs: error: " + info.value.one_line()).replace("|", "\\|")
        rows.append(f"| {fmt} | `{kind}` | {what} | `{line}` |")
    return "\n".join(rows) + "\n"


LIMITS_DOC = Path(__file__).resolve().parents[2] / "docs" / "reference" / "limits.md"
_BEGIN = "<!-- begin: generated by tests/formats/test_fuzz.py::test_limits_doc -->\n"
_END = "<!-- end: generated -->\n"


def test_limits_doc_is_what_the_parsers_do():
    """docs/reference/limits.md's table is regenerated here from the parsers' real answers; a
    difference fails (TENSORFS_WRITE_DOCS=1 rewrites it)."""
    text = LIMITS_DOC.read_text()
    head, _, rest = text.partition(_BEGIN)
    _, _, tail = rest.partition(_END)
    fresh = head + _BEGIN + _limits_table() + _END + tail
    if os.environ.get("TENSORFS_WRITE_DOCS") == "1":
        LIMITS_DOC.write_text(fresh)
    assert _BEGIN in text and _END in text
    assert text == fresh, "docs/reference/limits.md is out of date: TENSORFS_WRITE_DOCS=1 pytest -k limits"


def test_limits_doc_names_every_kind_and_cap():
    from tensorfs.formats import gguf, safetensors

    text = LIMITS_DOC.read_text()
    cases = {(fmt, kind) for fmt, kind, _, _ in _limit_cases()}
    for kind in gguf.KINDS:
        assert ("gguf", kind) in cases and f"`{kind}`" in text, kind
    for kind in safetensors.ERROR_KINDS:
        assert ("safetensors", kind) in cases and f"`{kind}`" in text, kind
    for name, value in [("MAX_DIMS", gguf.MAX_DIMS), ("MAX_ARRAY_DEPTH", gguf.MAX_ARRAY_DEPTH),
                        ("MAX_HEADER_SIZE", safetensors.MAX_HEADER_SIZE),
                        ("SERDE_MAX_DEPTH", safetensors.SERDE_MAX_DEPTH)]:
        assert f"`{name}` = {value}" in text, name
