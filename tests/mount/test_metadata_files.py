"""metadata/ (docs/reference/shards-and-metadata.md): one file per metadata key, read with cat, wc -l and grep, compared
with gguf-py's GGUFReader and safetensors' safe_open on the same files."""

from __future__ import annotations

import codecs
import json
import os
import random
import stat
import subprocess

import gguf
import numpy as np
import pytest
from safetensors import safe_open
from safetensors.numpy import save_file

from tests.support import fuse_mounts_under, run_tensorfs
from tests.support.models import GGUF_ARRAYS, GGUF_KV

GV = gguf.GGUFValueType
TOKENS = ["<s>", "hello", "a\nb", "back\\slash", "tab\there", "\r\n", "nul\x00", "\x7f", "",
          "héllo", "日本", " hello", "hello ", "\\n", b"\xff\xfe bad", "pua\ue000", "hello"]
BIG_VOCAB = 150_000
FLOATS = [0.1, -0.0, 1e-45, 3.4028235e38, 123456789.0, float("inf"), float("-inf"),
          float("nan"), 1.0, -2.5]


def write_metadata_gguf(path) -> None:
    writer = gguf.GGUFWriter(str(path), "llama")
    for key, value, vtype in GGUF_KV:
        writer.add_key_value(key, value, vtype)
    for key, value in GGUF_ARRAYS:
        writer.add_array(key, value)
    writer.add_key_value("tokenizer.ggml.tokens", TOKENS, GV.ARRAY, sub_type=GV.STRING)
    writer.add_array("tokenizer.ggml.scores", FLOATS)
    writer.add_key_value("test.array_bool", [True, False, True], GV.ARRAY, sub_type=GV.BOOL)
    writer.add_key_value("test.array_u64", [0, 2**64 - 1], GV.ARRAY, sub_type=GV.UINT64)
    writer.add_chat_template("{% for m in messages %}\n{{ m.content }}\n{% endfor %}")
    writer.add_tensor("w", np.zeros((2, 2), np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


BIG_TOKENS = [f"tok{i}" if i % 1000 else f"line\nbreak\\{i}" for i in range(BIG_VOCAB)]


def write_vocab_gguf(path) -> None:
    """A 150k-token vocabulary (checked against what was written: GGUFReader takes seconds)."""
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_key_value("tokenizer.ggml.tokens", BIG_TOKENS, GV.ARRAY, sub_type=GV.STRING)
    writer.add_tensor("w", np.zeros((2, 2), np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def _mount(model, mnt, *options):
    mnt.mkdir()
    result = run_tensorfs("mount", model, mnt, *options)
    assert result.returncode == 0, result.stderr
    return mnt


@pytest.fixture(scope="module")
def gguf_mount(tmp_path_factory):
    """meta.gguf mounted; vocab.gguf mounted with the default cache and with a 64 KiB cache
    that keeps neither the decoded vocabulary nor most chunks."""
    base = tmp_path_factory.mktemp("meta")
    model, vocab = base / "meta.gguf", base / "vocab.gguf"
    write_metadata_gguf(model)
    write_vocab_gguf(vocab)
    mounts = [_mount(model, base / "mnt"), _mount(vocab, base / "vocab"),
              _mount(vocab, base / "small", "--cache-size", "64K")]
    yield model, mounts
    for mnt in mounts:
        assert run_tensorfs("unmount", mnt).returncode == 0
    assert fuse_mounts_under(base) == []


def _string_bytes(field) -> list[bytes]:
    return [bytes(field.parts[i]) for i in field.data]


def _lines(data: bytes) -> list[bytes]:
    assert data == b"" or data.endswith(b"\n")
    return data.split(b"\n")[:-1]


def test_every_key_is_a_file_that_says_what_the_reader_reads(gguf_mount):
    model, (mnt, _, _) = gguf_mount
    reader = gguf.GGUFReader(model)
    doc = json.loads((mnt / "metadata.json").read_bytes())
    fields = {k: f for k, f in reader.fields.items() if not k.startswith("GGUF.")}
    assert sorted(os.listdir(mnt / "metadata")) == sorted(fields)
    for key, field in fields.items():
        path = mnt / "metadata" / key
        st = os.stat(path)
        assert stat.S_ISREG(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o444
        data = path.read_bytes()
        assert st.st_size == len(data)
        main = field.types[0]
        if main == GV.STRING:
            assert data == _string_bytes(field)[0] + b"\n"       # verbatim, newline after
        elif main != GV.ARRAY:
            value = field.contents()
            if main == GV.BOOL:
                assert data == (b"true\n" if value else b"false\n")
            elif main in (GV.FLOAT32, GV.FLOAT64):
                assert data.endswith(b"\n") and data.count(b"\n") == 1
                _assert_shortest_float(data[:-1].decode(), value, np.float32 if main == GV.FLOAT32 else np.float64)
            else:
                assert data == f"{value}\n".encode()
        else:
            lines = _lines(data)
            assert len(lines) == len(doc["metadata"][key])         # wc -l == element count
            inner = field.types[1]
            if inner == GV.STRING:
                assert [codecs.escape_decode(line)[0] for line in lines] == _string_bytes(field)
                assert all(b"\r" not in line and b"\t" not in line for line in lines)
            elif inner == GV.ARRAY:
                assert [json.loads(line) for line in lines] == doc["metadata"][key]
            elif inner == GV.BOOL:
                assert lines == [b"true" if v else b"false" for v in field.contents()]
            elif inner in (GV.FLOAT32, GV.FLOAT64):
                width = np.float32 if inner == GV.FLOAT32 else np.float64
                for line, value in zip(lines, field.contents()):
                    _assert_shortest_float(line.decode(), value, width)
            else:
                assert lines == [str(v).encode() for v in field.contents()]


def _assert_shortest_float(text: str, value: float, width) -> None:
    if np.isnan(value):
        assert text == "nan"
        return
    assert width(float(text)) == width(value)                       # round-trips in its width
    assert float(text) == float(str(width(value)))                  # and is the shortest decimal
    if value == 0:
        assert text == ("-0.0" if np.signbit(value) else "0.0")


def test_scalars_read_with_cat(gguf_mount):
    _, (mnt, _, _) = gguf_mount
    def cat(key):
        return subprocess.run(["cat", mnt / "metadata" / key], capture_output=True,
                              check=True).stdout
    assert cat("general.architecture") == b"llama\n"
    assert cat("test.string") == "héllo\nworld\n".encode()
    assert cat("test.u64") == b"18446744073709551615\n"
    assert cat("test.i64") == b"-9223372036854775808\n"
    assert cat("test.f32") == b"0.1\n"
    assert cat("test.f64") == b"1e-300\n"
    assert cat("test.bool") == b"true\n"
    assert cat("tokenizer.chat_template") == b"{% for m in messages %}\n{{ m.content }}\n{% endfor %}\n"
    assert cat("test.array_nested") == b"[1, 2]\n[3]\n"


def test_grep_n_finds_a_token_id_and_wc_counts_them(gguf_mount):
    _, (mnt, _, _) = gguf_mount
    tokens = mnt / "metadata" / "tokenizer.ggml.tokens"
    found = subprocess.run(["grep", "-n", "^hello$", tokens], capture_output=True, text=True).stdout
    ids = [int(line.split(":")[0]) - 1 for line in found.splitlines()]
    assert ids == [i for i, t in enumerate(TOKENS) if t == "hello"]
    newline = subprocess.run(["grep", "-nF", "a\\nb", tokens], capture_output=True, text=True).stdout
    assert [int(line.split(":")[0]) - 1 for line in newline.splitlines()] == [TOKENS.index("a\nb")]
    wc = subprocess.run(["wc", "-l", tokens], capture_output=True, text=True, check=True).stdout
    assert int(wc.split()[0]) == len(TOKENS)


@pytest.mark.parametrize("which", ["default cache", "64K cache"])
def test_a_large_vocabulary_has_its_size_at_stat_and_reads_at_any_offset(gguf_mount, which):
    _, mounts = gguf_mount
    mnt = mounts[1 if which == "default cache" else 2]
    path = mnt / "metadata" / "tokenizer.ggml.tokens"
    size = os.stat(path).st_size
    rng = random.Random(4)
    reads = []
    fd = os.open(path, os.O_RDONLY)
    try:                     # before anything is in the page cache: these reach the daemon
        for _ in range(200 if which == "default cache" else 50):
            offset = rng.randrange(size + 10)
            length = rng.choice([1, 7, 4096, 65536, 300_000])
            reads.append((offset, length, os.pread(fd, length, offset)))
    finally:
        os.close(fd)
    whole = subprocess.run(["cat", path], capture_output=True, check=True).stdout
    assert len(whole) == size
    for offset, length, data in reads:
        assert data == whole[offset:offset + length]
    lines = _lines(whole)
    assert [codecs.escape_decode(line)[0].decode() for line in lines] == BIG_TOKENS
    found = subprocess.run(["grep", "-nx", "tok149999", path], capture_output=True, text=True).stdout
    assert found == "150000:tok149999\n"


def test_array_text_view_reads_any_range_in_process():
    """The view itself, without the kernel's page-aligned reads in between."""
    from tensorfs.cache import ByteLRU
    from tensorfs.model import MetadataValue
    from tensorfs.mount.metadata_files import CHUNK_ELEMENTS, ArrayTextView

    items = [f"t{i}" + ("\n" * (i % 3)) for i in range(3 * CHUNK_ELEMENTS + 5)]
    expected = "".join(s.replace("\n", "\\n") + "\n" for s in items).encode()
    for cache_bytes in (1 << 30, 100):                    # everything kept / nothing kept
        view = ArrayTextView(ByteLRU(cache_bytes), "k", MetadataValue("array[string]", lambda: items, len(items)))
        assert view.size == len(expected)
        rng = random.Random(cache_bytes)
        for _ in range(300):
            offset = rng.randrange(len(expected) + 5)
            size = rng.choice([0, 1, 3, 1000, 40_000, 200_000])
            assert view.read(offset, size) == expected[offset:offset + size]


@pytest.fixture
def odd_keys_model(tmp_path):
    long_key = "k" * 250
    metadata = {"a/b": "1", "..": "2", ".": "2b", "": "3", "x\ny": "4", "%": "5", "format": "pt",
                long_key: "6", "multi": "line one\nline two"}
    path = tmp_path / "odd.safetensors"
    save_file({"t": np.ones(3, np.float32)}, str(path), metadata=metadata)
    return path, metadata, long_key


def test_safetensors_metadata_keys_are_escaped_file_names(odd_keys_model, mount):
    path, metadata, long_key = odd_keys_model
    mnt = mount(path)
    with safe_open(str(path), "numpy") as f:
        assert f.metadata() == metadata
    names = set(os.listdir(mnt / "metadata"))
    expected = {"a%2Fb": "1", "%2E%2E": "2", "%2E": "2b", "%": "3", "x%0Ay": "4", "%25": "5",
                "format": "pt", "multi": "line one\nline two"}
    assert set(expected) <= names and len(names) == len(metadata)
    for name, value in expected.items():
        assert (mnt / "metadata" / name).read_text() == value + "\n"
    (hashed,) = names - set(expected)
    assert hashed.startswith("k" * 180 + "%~") and len(hashed.encode()) <= 200
    assert (mnt / "metadata" / hashed).read_text() == "6\n"


def test_a_model_without_metadata_has_an_empty_metadata_directory(tmp_path, mount):
    path = tmp_path / "bare.safetensors"
    save_file({"metadata.x": np.ones(2, np.float32)}, str(path))
    mnt = mount(path)
    assert stat.S_ISDIR(os.stat(mnt / "metadata").st_mode)
    assert os.listdir(mnt / "metadata") == []
    doc = json.loads((mnt / "metadata.json").read_bytes())
    assert (mnt / doc["tensors"]["metadata.x"]["path"]).read_bytes() == np.ones(2, np.float32).tobytes()


def test_escaping_rules_in_process():
    from tensorfs.formats.metadata_text import escape_element, render_lines
    from tensorfs.mount.metadata_files import metadata_file_name

    assert escape_element("a\nb\\c\r\t\x00\x7f") == "a\\nb\\\\c\\r\\t\\x00\\x7f"
    assert escape_element(b"\xff".decode("utf-8", "surrogateescape")) == "\\xff"
    for text in ["a\nb", "\\", "\\n", "é\x01", b"\xc3(".decode("utf-8", "surrogateescape")]:
        escaped = escape_element(text).encode()
        assert b"\n" not in escaped
        assert codecs.escape_decode(escaped)[0] == text.encode("utf-8", "surrogateescape")
    assert metadata_file_name("tokenizer.ggml.tokens") == "tokenizer.ggml.tokens"
    assert render_lines([], "array[string]") == b""
    assert render_lines(["x", "y\n"], "array[string]") == b"x\ny\\n\n"
    assert render_lines([1.0, "nan", 0.5], "array[float32]") == b"1.0\nnan\n0.5\n"
