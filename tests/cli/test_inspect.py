"""``tensorfs inspect`` as a user reads it: every metadata key with its value (checked
against GGUFReader and safe_open), the tensor table, nothing raw on the terminal, output
linear in the input, sharded models, and the words ("1 key")."""

from __future__ import annotations

import json
import struct
import unicodedata

import gguf
import numpy as np
import pytest
from safetensors import safe_open
from safetensors.numpy import save_file

from tests.support import run_tensorfs, safetensors_corpus
from tests.support.models import write_gguf
from tests.support.shards import write_hf_shards, write_split_gguf


def _inspect(model) -> str:
    result = run_tensorfs("inspect", model)
    assert result.returncode == 0 and result.stderr == "", result.stderr
    return result.stdout


def _section(out: str, header: str) -> list[str]:
    """The lines of the table whose header line starts with ``header``."""
    lines = out.split("\n")
    start = next(i for i, line in enumerate(lines) if line.startswith(header + " "))
    end = lines.index("", start)
    return lines[start + 1:end]


def _row(rows: list[str], key: str) -> str:
    return next(r for r in rows if r.startswith(key + " "))


def test_every_gguf_key_is_shown_with_its_type_and_value(tmp_path):
    model = tmp_path / "m.gguf"
    writer = gguf.GGUFWriter(str(model), "llama")
    long_text = "x" * 500 + "END"
    tokens = [f"tok{i}" for i in range(1000)]
    writer.add_key_value("test.long", long_text, gguf.GGUFValueType.STRING)
    writer.add_array("tokenizer.ggml.tokens", tokens)
    writer.add_key_value("test.u64", 2**64 - 1, gguf.GGUFValueType.UINT64)
    writer.add_key_value("test.f32", 0.1, gguf.GGUFValueType.FLOAT32)
    writer.add_key_value("test.nan", float("nan"), gguf.GGUFValueType.FLOAT64)
    writer.add_key_value("test.flag", False, gguf.GGUFValueType.BOOL)
    writer.add_tensor("w", np.zeros((2, 3), np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()

    out = _inspect(model)
    rows = _section(out, "KEY")
    reader = gguf.GGUFReader(str(model), "r")
    keys = [k for k in reader.fields if not k.startswith("GGUF.")]
    assert [r.split()[0] for r in rows] == keys          # every key, in the file's order
    doc = json.loads(run_tensorfs("inspect", "--json", model).stdout)
    for key in keys:
        assert _row(rows, key).split()[1] == doc["metadata_types"][key]
    assert _row(rows, "general.architecture").endswith('"llama"')
    assert _row(rows, "test.u64").endswith(" 18446744073709551615")   # scalars in full
    assert _row(rows, "test.f32").endswith(" 0.1")
    assert _row(rows, "test.nan").endswith(" nan")
    assert _row(rows, "test.flag").endswith(" false")
    long_row = _row(rows, "test.long")                    # cut, its length said
    assert "(503 chars)" in long_row and "END" not in long_row and len(long_row) < 200
    token_row = _row(rows, "tokenizer.ggml.tokens")       # length and first elements
    assert "array[string]" in token_row and "1000 elements" in token_row
    assert '"tok0", "tok1", "tok2"' in token_row and "tok999" not in token_row
    assert len(token_row) < 200
    table = _section(out, "NAME")
    assert table[0].split() == ["w", "F32", "[2,", "3]", "24"]


def test_summary_words_agree_in_number(tmp_path):
    model = tmp_path / "one.safetensors"
    save_file({"w": np.zeros(2, np.float32)}, str(model), metadata={"k": "v"})
    out = _inspect(model)
    assert "metadata:   1 key\n" in out and "tensors:    1, 8 bytes" in out
    assert "1 keys" not in out
    model2 = tmp_path / "two.safetensors"
    save_file({"a": np.zeros(1, np.uint8), "b": np.zeros(0, np.uint8)}, str(model2),
              metadata={"k": "v", "j": "w"})
    out2 = _inspect(model2)
    assert "metadata:   2 keys\n" in out2 and "tensors:    2, 1 byte\n" in out2


def _assert_terminal_safe(text: str) -> None:
    for ch in text:
        if ch == "\n":
            continue
        assert unicodedata.category(ch) not in ("Cc", "Cf", "Cs", "Zl", "Zp", "Co", "Cn"), \
            f"raw {ch!r} in the output"


HOSTILE = ["esc\x1b[31mred", "bel\x07", "c1\x9bcsi", "del\x7f", "nul\x00", "rtl\u202eevil",
           "ls\u2028sep", "nl\nline", "tab\tx"]


def test_no_control_character_reaches_the_terminal(tmp_path):
    entries, data = [], bytearray()
    for i, name in enumerate(HOSTILE):
        entries.append((f"t.{name}", safetensors_corpus.tensor("U8", [1], i, i + 1)))
        data += b"\x00"
    metadata = {f"k.{name}": f"v.{name}" for name in HOSTILE}
    model = tmp_path / "esc\x1b]0;title\x07.safetensors"
    model.write_bytes(safetensors_corpus.build(entries, metadata=metadata, data=bytes(data)))
    out = _inspect(model)
    _assert_terminal_safe(out)
    assert "esc\\x1b[31mred" in out and "c1\\x9bcsi" in out and "rtl\\u202eevil" in out
    assert "del\\x7f" in out and "bel\\x07" in out and "ls\\u2028sep" in out
    rows = _section(out, "KEY")
    assert len(rows) == len(HOSTILE) and len(_section(out, "NAME")) == len(HOSTILE)
    with safe_open(str(model), framework="np") as ref:
        assert sorted(ref.keys()) == sorted(f"t.{n}" for n in HOSTILE)    # all there
    # the same names in a refusal's one line
    bad = tmp_path / "bad\x1b[2J.safetensors"
    bad.write_bytes(safetensors_corpus.build(
        [("x\x1b[2J\x9b\u202e", safetensors_corpus.tensor("F32", [4], 0, 8))], data=bytes(8)))
    result = run_tensorfs("inspect", bad)
    assert result.returncode == 1 and len(result.stderr.splitlines()) == 1
    _assert_terminal_safe(result.stderr)


def test_output_is_linear_in_the_input(tmp_path):
    """One long name must not widen every row (a 656 KB file once printed 400 MB)."""
    names = [f"t{i}" for i in range(3000)] + ["n" * 100_000]
    header = {name: {"dtype": "U8", "shape": [0], "data_offsets": [0, 0]} for name in names}
    header["__metadata__"] = {("k" * 50_000): "v" * 200_000, "short": "s"}
    body = json.dumps(header).encode()
    model = tmp_path / "wide.safetensors"
    model.write_bytes(struct.pack("<Q", len(body)) + body)
    out = _inspect(model)
    assert len(out) < 2 * model.stat().st_size
    rows = _section(out, "NAME")
    assert len(rows) == len(names)
    assert max(len(r) for r in rows[:-1]) < 120          # the short rows stay short
    assert _row(_section(out, "KEY"), "short").endswith('"s"')


@pytest.mark.parametrize("form", ["index", "split"])
def test_a_sharded_model_says_data_at_byte_per_shard(tmp_path, form):
    if form == "index":
        model, _, weight_map = write_hf_shards(tmp_path / "m")
        files = [model.parent / n for n in sorted(set(weight_map.values()))]
        offsets = [8 + struct.unpack("<Q", f.read_bytes()[:8])[0] for f in files]
    else:
        files, _ = write_split_gguf(tmp_path / "m")
        model = files[0]
        offsets = [gguf.GGUFReader(str(f), "r").data_offset for f in files]
    out = _inspect(model)
    assert out.count("data at byte") == len(files)
    size_line = next(line for line in out.splitlines() if line.startswith("size:"))
    assert "data at byte" not in size_line and f"in {len(files)} shards" in size_line
    shard_lines = [line for line in out.splitlines() if line.startswith("shard:")]
    for f, offset, line in zip(files, offsets, shard_lines):
        assert line.startswith(f"shard:      {f.name}:") and f"data at byte {offset}," in line
        assert f"{f.stat().st_size} bytes" in line


def test_single_file_gguf_keeps_its_summary(tmp_path):
    model = tmp_path / "m.gguf"
    tensors = write_gguf(model)
    out = _inspect(model)
    reader = gguf.GGUFReader(str(model), "r")
    assert f"data at byte {reader.data_offset}\n" in out
    for name, array in tensors.items():
        row = _row(_section(out, "NAME"), name)
        assert row.split()[-1] == str(array.nbytes)
