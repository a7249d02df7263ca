"""The library API (docs/reference/api.md) against the reference readers: safe_open, GGUFReader and
gguf.quants.dequantize, for every dtype family, single files and shards, and every refusal
the command line makes (the same ModelError, the same line)."""

from __future__ import annotations

import json
import subprocess
import sys

import gguf
import ml_dtypes
import numpy as np
import pytest
from safetensors import safe_open

import tensorfs
from tensorfs.convert import blocks as block_driver
from tensorfs.dtypes import GGML_TYPES_BY_NAME
from tests.support import (
    convert_reference,  # tests/: the oracles for what gguf-py cannot dequantize
    gguf_corpus,
    run_tensorfs,
    safetensors_corpus,
)
from tests.support.models import write_gguf, write_safetensors
from tests.support.quant_blocks import HAND_TYPES, ROWS, WRITER_TYPES, expected_values, type_blocks
from tests.support.shards import write_hf_shards, write_split_gguf


def _bits(a):
    return np.ascontiguousarray(a).view(np.uint32)


def test_importing_tensorfs_stays_cheap():
    code = ("import sys, tensorfs; assert 'numpy' not in sys.modules, 'numpy'; "
            "assert 'tensorfs.loading.loader' not in sys.modules; tensorfs.open; tensorfs.ModelError; "
            "assert 'tensorfs.api' in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_safetensors_every_numpy_dtype_as_safe_open_reads_it(tmp_path):
    model = tmp_path / "m.safetensors"
    written = write_safetensors(model, metadata={"format": "np", "n": "3"})
    with tensorfs.open(model) as m, safe_open(str(model), framework="np") as ref:
        assert dict(m.metadata) == ref.metadata() == {"format": "np", "n": "3"}
        assert sorted(m.tensors) == sorted(written)
        for name in ref.keys():
            want = ref.get_tensor(name)
            info = m.tensors[name]
            assert info.shape == want.shape and info.nbytes == want.nbytes
            assert info.file == str(model)
            a = m.array(name)
            assert a.dtype == want.dtype and a.shape == want.shape
            assert np.array_equal(a, want)
            assert not a.flags.writeable
            if want.size:
                assert isinstance(a, np.memmap)           # mapped, not copied
            assert m.read(name) == want.tobytes()
            with open(model, "rb") as f:
                f.seek(info.offset)
                assert f.read(info.nbytes) == want.tobytes()


def test_read_ranges_clip_like_a_file(tmp_path):
    model = tmp_path / "m.safetensors"
    write_safetensors(model)
    with tensorfs.open(model) as m:
        whole = m.read("lm_head.weight")
        n = len(whole)
        for offset, size in [(0, 0), (0, 1), (5, 17), (n - 3, 10), (n, 5), (n + 100, 5), (7, None)]:
            end = n if size is None else offset + size
            assert m.read("lm_head.weight", offset=offset, size=size) == whole[offset:end]
        with pytest.raises(ValueError):
            m.read("lm_head.weight", offset=-1)
        with pytest.raises(KeyError):
            m.read("no.such.tensor")


def test_safetensors_bf16_and_fp8_arrays_equal_ml_dtypes_upcasts(tmp_path):
    rng = np.random.default_rng(3)
    kinds = {"BF16": ml_dtypes.bfloat16, "F8_E4M3": ml_dtypes.float8_e4m3fn,
             "F8_E5M2": ml_dtypes.float8_e5m2}
    entries, data, expected = [], bytearray(), {}
    for dtype, ml in kinds.items():
        raw = rng.integers(0, 256, 4 * 6 * np.dtype(ml).itemsize, dtype=np.uint8).tobytes()
        entries.append((f"w.{dtype}", safetensors_corpus.tensor(dtype, [4, 6], len(data),
                                                                  len(data) + len(raw))))
        expected[f"w.{dtype}"] = np.frombuffer(raw, dtype=ml).astype(np.float32).reshape(4, 6)
        data += raw
    model = tmp_path / "floats.safetensors"
    model.write_bytes(safetensors_corpus.build(entries, data=bytes(data)))
    with tensorfs.open(model) as m:
        for name, want in expected.items():
            a = m.array(name)
            assert a.dtype == np.float32 and a.shape == (4, 6)
            assert np.array_equal(_bits(a), _bits(want)), name


def test_a_type_without_a_view_is_a_model_error_saying_why(tmp_path):
    model = tmp_path / "f4.safetensors"
    model.write_bytes(safetensors_corpus.build(
        [("w", safetensors_corpus.tensor("F4", [4], 0, 2))], data=b"\x12\x34"))
    with tensorfs.open(model) as m:
        assert m.read("w") == b"\x12\x34"
        with pytest.raises(tensorfs.ModelError, match="packing"):
            m.array("w")


@pytest.mark.parametrize("big_endian", [False, True], ids=["little", "big"])
def test_gguf_native_types_as_gguf_reader_reads_them(tmp_path, big_endian):
    model = tmp_path / "m.gguf"
    written = write_gguf(model, big_endian=big_endian)
    reader = gguf.GGUFReader(str(model), "r")
    doc = json.loads(run_tensorfs("inspect", "--json", model).stdout)
    with tensorfs.open(model) as m:
        assert dict(m.metadata) == doc["metadata"]          # the values metadata.json holds
        assert m.metadata_types == doc["metadata_types"]
        for t in reader.tensors:
            info = m.tensors[t.name]
            assert info.dtype == t.tensor_type.name
            assert info.shape == tuple(reversed([int(d) for d in t.shape]))
            assert info.offset == t.data_offset and info.nbytes == t.n_bytes
            a = m.array(t.name)
            assert isinstance(a, np.memmap) and not a.flags.writeable
            assert a.dtype.byteorder in ("|", ">" if big_endian else "=", "<")
            assert np.array_equal(a, written[t.name]) and a.shape == written[t.name].shape
            assert m.read(t.name) == t.data.tobytes()
            assert doc["tensors"][t.name]["npy_dtype"] == a.dtype.str


def test_every_quantized_type_equals_gguf_dequantize_bit_for_bit(tmp_path):
    writer = gguf.GGUFWriter(str(tmp_path / "q.gguf"), "llama")
    expected = {}
    for name in WRITER_TYPES:
        blocks = type_blocks(name, 3)
        tensor = f"blk.0.{name.lower()}.weight"
        writer.add_tensor(tensor, blocks, raw_dtype=gguf.GGMLQuantizationType[name])
        expected[tensor] = expected_values(name, blocks, (ROWS, 3 * GGML_TYPES_BY_NAME[name].block_size))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    reader = gguf.GGUFReader(str(tmp_path / "q.gguf"), "r")
    with tensorfs.open(tmp_path / "q.gguf") as m:
        for t in reader.tensors:
            a = m.array(t.name)
            assert a.dtype == np.float32 and a.shape == expected[t.name].shape
            assert np.array_equal(_bits(a), _bits(expected[t.name])), t.name
            if t.tensor_type.name not in convert_reference.REFERENCES:  # gguf-py's own
                with np.errstate(all="ignore"):
                    direct = gguf.quants.dequantize(t.data, t.tensor_type)
                assert np.array_equal(_bits(a), _bits(direct)), t.name
            assert m.read(t.name) == t.data.tobytes()


def test_types_gguf_py_cannot_write_and_tensors_larger_than_a_slab(tmp_path, monkeypatch):
    import tensorfs.api

    infos, data, expected = [], bytearray(), {}
    for name in HAND_TYPES + ["Q4_K"]:
        gt = GGML_TYPES_BY_NAME[name]
        blocks = type_blocks(name, 5)
        tensor = f"hand.{name.lower()}.weight"
        data += bytes(-len(data) % 32)
        infos.append((tensor, (5 * gt.block_size, ROWS), gt.id, len(data)))
        data += blocks.tobytes()
        expected[tensor] = expected_values(name, blocks, (ROWS, 5 * gt.block_size))
    model = tmp_path / "hand.gguf"
    model.write_bytes(gguf_corpus.encode_gguf(tensors=infos, data=bytes(data)))
    # slabs of one block: the conversion loop's seams, on every tensor
    monkeypatch.setattr(block_driver, "SLAB_BYTES", 1)
    with tensorfs.open(model) as m:
        for tensor, want in expected.items():
            assert np.array_equal(_bits(m.array(tensor)), _bits(want)), tensor


def test_sharded_safetensors_through_every_form(tmp_path):
    index, tensors, weight_map = write_hf_shards(tmp_path / "hf", metadata={"total_size": 7})
    for named in (index, tmp_path / "hf"):
        with tensorfs.open(named) as m:
            assert dict(m.metadata) == {"total_size": 7}
            assert sorted(m.tensors) == sorted(tensors)
            for name, want in tensors.items():
                shard = tmp_path / "hf" / weight_map[name]
                assert m.tensors[name].file == str(shard)
                with safe_open(str(shard), framework="np") as ref:
                    assert np.array_equal(m.array(name), ref.get_tensor(name))
                    assert m.read(name) == ref.get_tensor(name).tobytes()


def test_split_gguf_as_gguf_reader_reads_each_shard(tmp_path):
    files, tensors = write_split_gguf(tmp_path / "split")
    with tensorfs.open(files[0]) as m:
        assert m.metadata["split.count"] == len(files)
        for path in files:
            for t in gguf.GGUFReader(str(path), "r").tensors:
                assert m.tensors[t.name].file == str(path)
                assert m.read(t.name) == t.data.tobytes()
                assert np.array_equal(m.array(t.name), tensors[t.name])


@pytest.mark.slow
def test_refused_models_raise_the_model_error_the_cli_prints(tmp_path):
    cases = {"empty": b"", "text": b"hello world\n" * 10,
             **{f"st-{n}": d for n, d in safetensors_corpus.MALFORMED[:20]}}
    for name, data in cases.items():
        model = tmp_path / f"{name}.model"
        model.write_bytes(data)
        with pytest.raises(tensorfs.ModelError) as caught:
            tensorfs.open(model)
        line = run_tensorfs("inspect", model).stderr.strip()
        assert line == f"tensorfs: error: {caught.value}", name
    with pytest.raises(tensorfs.ModelError):
        tensorfs.open(tmp_path / "missing.gguf")


def test_a_closed_model_refuses_reads_but_its_arrays_stay(tmp_path):
    model = tmp_path / "m.safetensors"
    written = write_safetensors(model)
    m = tensorfs.open(model)
    a = m.array("lm_head.weight")
    m.close()
    m.close()
    with pytest.raises(ValueError, match="closed"):
        m.read("lm_head.weight")
    assert np.array_equal(a, written["lm_head.weight"])


def test_the_file_changing_under_an_open_model_fails_reads_with_eio(tmp_path):
    model = tmp_path / "m.safetensors"
    write_safetensors(model)
    with tensorfs.open(model) as m:
        data = bytearray(model.read_bytes())
        data[-1] ^= 0xFF
        with open(model, "r+b") as f:      # rewritten in place: same size, new mtime
            f.write(data)
        import os
        os.utime(model, ns=(1, 1))
        with pytest.raises(OSError) as caught:
            m.read("lm_head.weight")
        assert caught.value.errno == 5
