"""Converted .npy views through a real mount: every quantized GGML type, BF16 and FP8,
bit for bit against gguf.quants.dequantize / ml_dtypes, at any offset and size."""

from __future__ import annotations

import io
import json
import os

import gguf
import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tensorfs.convert import conversion_for
from tensorfs.dtypes import GGML_TYPES_BY_NAME
from tensorfs.loading.loader import load_model
from tensorfs.views.byteviews import CHUNK_OUTPUT_BYTES
from tests.support import gguf_corpus, run_tensorfs, safetensors_corpus
from tests.support.quant_blocks import HAND_TYPES, ROWS, WRITER_TYPES, expected_values, type_blocks
from tests.support.reliability_models import wait_for


@pytest.fixture(scope="module", params=["2", "0"], ids=["workers2", "workers0"])
def converted_mount(tmp_path_factory, request):
    """Both ways of converting: two worker processes (tensorfs.convert.workers) and in-thread."""
    base = tmp_path_factory.mktemp("converted")
    expected = {}
    writer = gguf.GGUFWriter(str(base / "writer.gguf"), "llama")
    for name in WRITER_TYPES:
        gt = GGML_TYPES_BY_NAME[name]
        # the big ones cross several converted chunks
        per_row = max(1, (3 * CHUNK_OUTPUT_BYTES // 4) // gt.block_size // ROWS + 1) if name in (
            "Q4_K", "Q8_0", "BF16", "Q6_K") else 3
        blocks = type_blocks(name, per_row)
        tensor = f"blk.0.{name.lower()}.weight"
        writer.add_tensor(tensor, blocks, raw_dtype=gguf.GGMLQuantizationType[name])
        expected[tensor] = expected_values(name, blocks, (ROWS, per_row * gt.block_size))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()

    infos, data = [], bytearray()
    for name in HAND_TYPES:
        gt = GGML_TYPES_BY_NAME[name]
        blocks = type_blocks(name, 2)
        tensor = f"hand.{name.lower()}.weight"
        data += bytes(-len(data) % 32)
        infos.append((tensor, (2 * gt.block_size, ROWS), gt.id, len(data)))
        data += blocks.tobytes()
        expected[tensor] = expected_values(name, blocks, (ROWS, 2 * gt.block_size))
    (base / "hand.gguf").write_bytes(gguf_corpus.encode_gguf(tensors=infos, data=bytes(data)))

    mounts = {}
    for model in ("writer.gguf", "hand.gguf"):
        mnt = base / ("mnt-" + model)
        mnt.mkdir()
        log = base / f"{model}.log"
        result = run_tensorfs("mount", base / model, mnt, "--workers", request.param,
                              "--log", log)
        assert result.returncode == 0, result.stderr
        if request.param != "0":          # workers start on the first costly conversion,
            first = {"writer.gguf": "blk/0/q8_0", "hand.gguf": "hand/q8_1"}[model]
            with open(mnt / first / "weight.npy", "rb") as f:                  # in-thread
                f.read(4096)              # until they are ready
            assert wait_for(lambda: "conversion workers ready" in log.read_text(), 60)
        mounts[model] = mnt
    yield mounts, expected
    for mnt in mounts.values():
        assert run_tensorfs("unmount", mnt).returncode == 0


def _npy_path(mounts, tensor):
    for mnt in mounts.values():
        doc = json.loads((mnt / "metadata.json").read_bytes())
        if tensor in doc["tensors"]:
            entry = doc["tensors"][tensor]
            assert entry["converted"] and entry["npy_dtype"] == "<f4"
            return mnt / (entry["path"] + ".npy")
    raise KeyError(tensor)


def _bits(a):
    return np.ascontiguousarray(a).view(np.uint32)


@pytest.mark.parametrize("type_name", WRITER_TYPES + HAND_TYPES)
def test_npy_view_equals_the_oracle_bit_for_bit(converted_mount, type_name):
    mounts, expected = converted_mount
    tensor = next(t for t in expected if t.split(".")[-2] == type_name.lower())
    path = _npy_path(mounts, tensor)
    for mode in (None, "r"):
        loaded = np.load(path, mmap_mode=mode)
        assert loaded.dtype == np.float32 and loaded.shape == expected[tensor].shape
        assert np.array_equal(_bits(loaded), _bits(expected[tensor]))
    npy = io.BytesIO()
    np.save(npy, expected[tensor])
    assert os.stat(path).st_size == len(npy.getvalue())


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_reads_at_any_offset_and_size(converted_mount, data):
    mounts, expected = converted_mount
    tensor = data.draw(st.sampled_from(sorted(expected)))
    npy = io.BytesIO()
    np.save(npy, expected[tensor])
    want = npy.getvalue()
    offset = data.draw(st.integers(0, len(want)))
    size = data.draw(st.integers(0, len(want) - offset + 10))
    with open(_npy_path(mounts, tensor), "rb") as f:
        got = os.pread(f.fileno(), size, offset)
    assert got == want[offset:offset + size]


@pytest.mark.parametrize("type_name", ["Q4_K", "Q8_0", "BF16", "Q6_K"])
def test_reads_straddling_chunk_and_block_boundaries(converted_mount, type_name):
    mounts, expected = converted_mount
    tensor = f"blk.0.{type_name.lower()}.weight"
    npy = io.BytesIO()
    np.save(npy, expected[tensor])
    want = npy.getvalue()
    header = len(want) - expected[tensor].nbytes
    block_out = GGML_TYPES_BY_NAME[type_name].block_size * 4
    with open(_npy_path(mounts, tensor), "rb") as f:
        for boundary in (CHUNK_OUTPUT_BYTES, 2 * CHUNK_OUTPUT_BYTES, block_out, 7 * block_out):
            for delta in (-5, -1, 0, 1, 3):
                start = header + boundary + delta
                for size in (1, 4, block_out + 2, CHUNK_OUTPUT_BYTES + 9):
                    assert os.pread(f.fileno(), size, start) == want[start:start + size]
        # a sequential reader with an odd buffer size (read-ahead on the way)
        f.seek(0)
        pieces = []
        while chunk := f.read(100_003):
            pieces.append(chunk)
        assert b"".join(pieces) == want


FLOAT8 = {"F8_E4M3": ml_dtypes.float8_e4m3fn, "F8_E5M2": ml_dtypes.float8_e5m2,
          "F8_E4M3FNUZ": ml_dtypes.float8_e4m3fnuz, "F8_E5M2FNUZ": ml_dtypes.float8_e5m2fnuz,
          "BF16": ml_dtypes.bfloat16}


def test_safetensors_bf16_and_fp8_views_equal_ml_dtypes_upcasts(tmp_path, mount):
    rng = np.random.default_rng(7)
    entries, data, expected = [], bytearray(), {}
    for dtype, ml in FLOAT8.items():
        width = np.dtype(ml).itemsize
        raw = rng.integers(0, 256, size=(5, 6) + ((2,) if width == 2 else ()), dtype=np.uint8).tobytes()
        if dtype == "BF16":
            raw = bytes(raw[: 5 * 6 * 2])
        entries.append((f"layer.{dtype}", safetensors_corpus.tensor(dtype, [5, 6], len(data), len(data) + len(raw))))
        expected[f"layer.{dtype}"] = np.frombuffer(raw, dtype=ml).astype(np.float32).reshape(5, 6)
        data += raw
    model = tmp_path / "floats.safetensors"
    model.write_bytes(safetensors_corpus.build(entries, data=bytes(data)))
    mnt = mount(model)
    for name, want in expected.items():
        loaded = np.load(mnt / "layer" / (name.split(".")[1] + ".npy"))
        assert np.array_equal(_bits(loaded), _bits(want)), name
    e8m0 = bytes(range(256))
    model2 = tmp_path / "e8m0.safetensors"
    model2.write_bytes(safetensors_corpus.build(
        [("s", safetensors_corpus.tensor("F8_E8M0", [256], 0, 256))], data=e8m0))
    mnt2 = mount(model2)
    loaded = np.load(mnt2 / "s.npy")
    want = np.array([2.0 ** (e - 127) for e in range(255)] + [np.nan], dtype=np.float32)
    assert np.array_equal(loaded[:255], want[:255]) and np.isnan(loaded[255])


def test_raw_only_tensors_say_why_in_metadata_json(tmp_path, mount):
    model = tmp_path / "f4.safetensors"
    model.write_bytes(safetensors_corpus.build([("w", safetensors_corpus.tensor("F4", [4], 0, 2))], data=b"\x12\x34"))
    mnt = mount(model)
    entry = json.loads((mnt / "metadata.json").read_bytes())["tensors"]["w"]
    assert entry["npy_dtype"] is None and not entry["converted"] and "packing" in entry["raw_only"]
    assert "w" in os.listdir(mnt) and "w.npy" not in os.listdir(mnt)
    assert (mnt / "w").read_bytes() == b"\x12\x34"
    assert conversion_for(load_model(str(model)).tensors[0]) is None
