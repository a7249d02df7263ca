"""tensorfs.convert: every kernel against its oracle, bit for bit.

Oracles: gguf-py's ``gguf.quants.dequantize`` for every GGML type it implements; ml_dtypes
upcasts for BF16 and the 8-bit floats; for the GGML types gguf-py lacks (Q8_1, Q8_K, Q1_0,
Q2_0) the scalar loops of tests/support/convert_reference.py, written from ggml's C code.
Comparisons are on the float32 *bits* (``.view(np.uint32)``), NaNs included.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import gguf.quants
import ml_dtypes
import numpy as np
import pytest
from gguf import GGMLQuantizationType
from hypothesis import given, settings
from hypothesis import strategies as st

from tensorfs.convert import Conversion, conversion_for, ggml, raw_only_reason
from tensorfs.dtypes import GGML_TYPES_BY_NAME, SAFETENSORS_DTYPES
from tensorfs.model import TensorInfo
from tests.support import convert_reference
from tests.support.quant_blocks import SCALE_FIELDS, oracle, random_blocks

ROOT = Path(__file__).resolve().parents[2]

GGUF_PY_TYPES = ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K",
                 "IQ1_S", "IQ1_M", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS", "IQ3_S", "IQ4_NL",
                 "IQ4_XS", "TQ1_0", "TQ2_0", "MXFP4", "NVFP4", "BF16"]
SCALAR_REF_TYPES = sorted(convert_reference.REFERENCES)
OWN_KERNEL_TYPES = ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K",
                    "Q6_K", "Q8_1", "Q8_K", "Q1_0", "Q2_0"]
BE_SWAPPED = {"Q4_0": (0,), "Q8_0": (0,), "Q4_K": (0, 2), "Q6_K": (208,)}   # gguf_convert_endian.py

def ggml_tensor(name: str, n_blocks: int, byte_order: str = "<") -> TensorInfo:
    gt = GGML_TYPES_BY_NAME[name]
    return TensorInfo("blk.0.w", name, (n_blocks * gt.block_size,), 0, n_blocks * gt.type_size,
                      "m.gguf", byte_order=byte_order, ggml_type=gt.id)


def st_tensor(dtype: str, n: int) -> TensorInfo:
    return TensorInfo("w", dtype, (n,), 0, n * SAFETENSORS_DTYPES[dtype].bits // 8, "m.safetensors")


def bits(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a).view(np.uint32)


# --- bit-exactness against the oracle -------------------------------------------------------

@pytest.mark.parametrize("name", GGUF_PY_TYPES + SCALAR_REF_TYPES)
def test_matches_oracle_bit_for_bit(name):
    rng = np.random.default_rng(sum(map(ord, name)))
    n_blocks = 40 if name in SCALAR_REF_TYPES else 300
    data = random_blocks(name, n_blocks, rng)
    data.flags.writeable = False                           # like a read-only mmap
    conv = conversion_for(ggml_tensor(name, n_blocks))
    got = conv.convert(data)
    assert got.dtype == np.dtype("<f4") and got.shape == (n_blocks * conv.block_elems,)
    np.testing.assert_array_equal(bits(got), bits(oracle(name, data)))


@pytest.fixture(scope="module")
def worker_pool():
    from tensorfs.convert.workers import WorkerPool

    pool = WorkerPool(2)
    pool.start(ahead=True)
    assert pool.wait_ready(60)
    yield pool
    pids = pool.pids()
    pool.close()
    for pid in pids:
        assert not os.path.exists(f"/proc/{pid}"), f"worker {pid} outlived its pool"


@pytest.mark.parametrize("name", GGUF_PY_TYPES + SCALAR_REF_TYPES)
def test_matches_oracle_bit_for_bit_through_worker_processes(worker_pool, name):
    """The same kernels in a worker process, reading from and writing to the shared arena."""
    rng = np.random.default_rng(sum(map(ord, name)) + 1)
    n_blocks = 40 if name in SCALAR_REF_TYPES else 300
    data = random_blocks(name, n_blocks, rng)
    conv = conversion_for(ggml_tensor(name, n_blocks))
    out_bytes = n_blocks * conv.block_elems * 4

    def fill(buf):
        buf[:] = data.tobytes()

    chunk = worker_pool.convert(conv, fill, data.nbytes, out_bytes)
    got = np.frombuffer(chunk.data, dtype="<f4").copy()
    chunk.release()
    np.testing.assert_array_equal(bits(got), bits(oracle(name, data)))


@pytest.mark.parametrize("name", OWN_KERNEL_TYPES)
def test_raw_random_blocks_nan_scales_included(name):
    """Fully random bytes: NaN / inf / subnormal scales, compared by bits."""
    rng = np.random.default_rng(7 + sum(map(ord, name)))
    n_blocks = 24 if name in SCALAR_REF_TYPES else 400
    data = random_blocks(name, n_blocks, rng, raw_tail=n_blocks)
    got = conversion_for(ggml_tensor(name, n_blocks)).convert(data)
    np.testing.assert_array_equal(bits(got), bits(oracle(name, data)))


@pytest.mark.parametrize("name", ["Q4_0", "Q8_0", "Q4_K", "Q6_K", "Q2_K", "Q5_0"])
def test_many_inner_chunks(name):
    """More blocks than one inner step of the kernel driver, and a ragged last step."""
    gt = GGML_TYPES_BY_NAME[name]
    n_blocks = 2 * (ggml.CHUNK_ELEMS // gt.block_size) + 5
    data = random_blocks(name, n_blocks, np.random.default_rng(3))
    got = conversion_for(ggml_tensor(name, n_blocks)).convert(data)
    np.testing.assert_array_equal(bits(got), bits(oracle(name, data)))


@pytest.mark.parametrize("name", GGUF_PY_TYPES + SCALAR_REF_TYPES)
def test_sub_range_equals_slice_of_whole(name):
    rng = np.random.default_rng(11)
    n_blocks = 23
    data = random_blocks(name, n_blocks, rng)
    conv = conversion_for(ggml_tensor(name, n_blocks))
    whole = conv.convert(data)
    for a, b in [(0, 1), (5, 6), (3, 17), (22, 23), (0, 23), (9, 9)]:
        part = conv.convert(data[a * conv.block_bytes:b * conv.block_bytes])
        np.testing.assert_array_equal(bits(part), bits(whole[a * conv.block_elems:b * conv.block_elems]))


@settings(max_examples=60, deadline=None)
@given(name=st.sampled_from(OWN_KERNEL_TYPES + ["IQ4_NL", "TQ2_0", "MXFP4"]),
       n_blocks=st.integers(0, 40), seed=st.integers(0, 2**32 - 1),
       pattern=st.sampled_from(["random", "zeros", "ones", "raw", "alternating"]))
def test_hypothesis_block_counts_and_patterns(name, n_blocks, seed, pattern):
    gt = GGML_TYPES_BY_NAME[name]
    rng = np.random.default_rng(seed)
    if pattern == "random":
        data = random_blocks(name, n_blocks, rng, raw_tail=0)
    elif pattern == "raw":
        data = rng.integers(0, 256, n_blocks * gt.type_size, dtype=np.uint8)
    else:
        fill = {"zeros": 0x00, "ones": 0xFF, "alternating": 0x55}[pattern]
        data = random_blocks(name, n_blocks, rng, raw_tail=0)
        mask = np.ones(gt.type_size, dtype=bool)
        for off, kind in SCALE_FIELDS.get(name, []):
            mask[off:off + (2 if kind == "f16" else 4)] = False
        data.reshape(-1, gt.type_size)[:, mask] = fill
    if name in SCALAR_REF_TYPES:
        data = data[:min(n_blocks, 6) * gt.type_size]          # the scalar loop is slow
    conv = conversion_for(ggml_tensor(name, max(1, n_blocks)))
    got = conv.convert(data)
    assert got.shape == (data.size // gt.type_size * gt.block_size,)
    np.testing.assert_array_equal(bits(got), bits(oracle(name, data)))


# --- BF16 and the 8-bit floats against ml_dtypes ---------------------------------------------

ML_DTYPES = {"F8_E4M3": ml_dtypes.float8_e4m3fn, "F8_E5M2": ml_dtypes.float8_e5m2,
             "F8_E4M3FNUZ": ml_dtypes.float8_e4m3fnuz, "F8_E5M2FNUZ": ml_dtypes.float8_e5m2fnuz,
             "F8_E8M0": ml_dtypes.float8_e8m0fnu}


@pytest.mark.parametrize("dtype", sorted(ML_DTYPES))
def test_fp8_every_code_matches_ml_dtypes(dtype):
    codes = np.arange(256, dtype=np.uint8)
    conv = conversion_for(st_tensor(dtype, 256))
    assert (conv.name, conv.block_elems, conv.block_bytes, conv.costly) == (dtype, 1, 1, False)
    got = conv.convert(codes)
    want = codes.view(ML_DTYPES[dtype]).astype(np.float32)
    np.testing.assert_array_equal(bits(got), bits(want))
    assert np.isnan(got).sum() == np.isnan(want).sum() > 0


def test_e8m0_is_two_to_the_e_minus_127():
    got = conversion_for(st_tensor("F8_E8M0", 256)).convert(np.arange(256, dtype=np.uint8))
    np.testing.assert_array_equal(got[:255], np.ldexp(np.float32(1), np.arange(255) - 127))
    assert np.isnan(got[255])


def test_bf16_every_code_exact_shift():
    codes = np.arange(65536, dtype=np.uint16)
    conv = conversion_for(st_tensor("BF16", 65536))
    got = conv.convert(codes.view(np.uint8))
    np.testing.assert_array_equal(bits(got), codes.astype(np.uint32) << 16)
    finite = ~np.isnan(got)
    want = codes.view(ml_dtypes.bfloat16).astype(np.float32)
    np.testing.assert_array_equal(bits(got)[finite], bits(want)[finite])
    assert np.array_equal(np.isnan(want), ~finite)


def test_gguf_bf16_matches_gguf_py_and_big_endian_is_swapped():
    codes = np.random.default_rng(5).integers(0, 65536, 5000, dtype=np.uint16)
    le = conversion_for(ggml_tensor("BF16", 5000)).convert(codes.view(np.uint8))
    ref = gguf.quants.dequantize(codes.view(np.uint8).reshape(-1, 2), GGMLQuantizationType.BF16)
    np.testing.assert_array_equal(bits(le), bits(ref.reshape(-1)))
    be = conversion_for(ggml_tensor("BF16", 5000, ">")).convert(codes.byteswap().view(np.uint8))
    np.testing.assert_array_equal(bits(be), bits(le))


@settings(max_examples=40, deadline=None)
@given(raw=st.binary(min_size=0, max_size=300), dtype=st.sampled_from(sorted(ML_DTYPES) + ["BF16"]))
def test_hypothesis_float_bytes(raw, dtype):
    if dtype == "BF16":
        raw = raw[:len(raw) // 2 * 2]
    got = conversion_for(st_tensor(dtype, 1)).convert(raw)                 # bytes input
    arr = np.frombuffer(raw, dtype=np.uint8)
    if dtype == "BF16":
        np.testing.assert_array_equal(bits(got), arr.view("<u2").astype(np.uint32) << 16)
    else:
        np.testing.assert_array_equal(bits(got), bits(arr.view(ML_DTYPES[dtype]).astype(np.float32)))


# --- big-endian GGUF ---------------------------------------------------------------------------

@pytest.mark.parametrize("name", sorted(BE_SWAPPED))
def test_big_endian_blocks_with_swapped_scales(name):
    """A BE file made like gguf_convert_endian.py (fp16 scale fields swapped) reads the same."""
    gt = GGML_TYPES_BY_NAME[name]
    data = random_blocks(name, 50, np.random.default_rng(2))
    swapped = data.copy().reshape(-1, gt.type_size)
    for off in BE_SWAPPED[name]:
        swapped[:, [off, off + 1]] = swapped[:, [off + 1, off]]
    le = conversion_for(ggml_tensor(name, 50)).convert(data)
    be = conversion_for(ggml_tensor(name, 50, ">")).convert(swapped.reshape(-1))
    np.testing.assert_array_equal(bits(be), bits(le))


@pytest.mark.parametrize("name", ["MXFP4", "NVFP4"])
def test_big_endian_single_byte_field_types_read_as_is(name):
    data = random_blocks(name, 10, np.random.default_rng(4))
    be = conversion_for(ggml_tensor(name, 10, ">")).convert(data)
    np.testing.assert_array_equal(bits(be), bits(oracle(name, data)))


@pytest.mark.parametrize("name", ["Q4_1", "Q5_0", "Q5_1", "Q2_K", "Q3_K", "Q5_K", "Q8_1", "Q8_K",
                                  "Q1_0", "Q2_0", "IQ2_XS", "IQ4_NL", "TQ1_0"])
def test_big_endian_unknown_layout_is_raw_only(name):
    tensor = ggml_tensor(name, 4, ">")
    assert conversion_for(tensor) is None
    assert f"byte order of {name} scales in big-endian files is not defined" in raw_only_reason(tensor)
    assert conversion_for(ggml_tensor(name, 4)) is not None


# --- the API -------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["F32", "F16", "I8", "I16", "I32", "I64", "F64"])
def test_native_ggml_types_are_not_converted(name):
    for order in "<>":
        tensor = ggml_tensor(name, 4, order)
        assert conversion_for(tensor) is None and raw_only_reason(tensor) is None


@pytest.mark.parametrize("dtype", [d for d, t in SAFETENSORS_DTYPES.items() if t.numpy])
def test_native_safetensors_dtypes_are_not_converted(dtype):
    tensor = st_tensor(dtype, 8)
    assert conversion_for(tensor) is None and raw_only_reason(tensor) is None


@pytest.mark.parametrize("dtype", ["F4", "F6_E2M3", "F6_E3M2"])
def test_packed_sub_byte_floats_are_raw_only_with_reason(dtype):
    tensor = st_tensor(dtype, 8)
    assert conversion_for(tensor) is None
    assert "packing order" in raw_only_reason(tensor) and dtype in raw_only_reason(tensor)


def test_unknown_types_have_a_reason():
    assert "unknown" in raw_only_reason(TensorInfo("w", "X", (1,), 0, 1, "f", ggml_type=99))
    assert "unknown" in raw_only_reason(TensorInfo("w", "F7", (1,), 0, 1, "f"))


def test_conversion_record_and_sizes_follow_ggml():
    sizes = {"Q8_1": (32, 36), "Q8_K": (256, 292), "Q1_0": (128, 18), "Q2_0": (64, 18),
             "Q4_K": (256, 144), "NVFP4": (64, 36), "MXFP4": (32, 17)}
    for name, (elems, nbytes) in sizes.items():
        conv = conversion_for(ggml_tensor(name, 1))
        assert isinstance(conv, Conversion)
        assert (conv.name, conv.block_elems, conv.block_bytes, conv.costly) == (name, elems, nbytes, True)


def test_out_buffer_and_input_forms():
    conv = conversion_for(ggml_tensor("Q4_K", 8))
    data = random_blocks("Q4_K", 8, np.random.default_rng(9))
    want = conv.convert(data)
    out = np.full(8 * 256, np.nan, dtype=np.float32)
    assert conv.convert(data, out=out) is out
    np.testing.assert_array_equal(bits(out), bits(want))
    np.testing.assert_array_equal(bits(conv.convert(data.tobytes())), bits(want))
    np.testing.assert_array_equal(bits(conv.convert(memoryview(data.tobytes()))), bits(want))
    with pytest.raises(ValueError):
        conv.convert(data[:-1])
    with pytest.raises(ValueError):
        conv.convert(data, out=np.empty(7, dtype=np.float32))


def test_gguf_is_imported_only_for_long_tail_types():
    script = (
        "import sys, numpy as np\n"
        "from tensorfs.convert import conversion_for\n"
        "from tensorfs.dtypes import GGML_TYPES_BY_NAME as T\n"
        "from tensorfs.model import TensorInfo\n"
        "def t(n): return TensorInfo('w', n, (T[n].block_size,), 0, T[n].type_size, 'f', ggml_type=T[n].id)\n"
        "for n in ('Q4_K', 'Q8_0', 'BF16', 'IQ2_XS'):\n"
        "    c = conversion_for(t(n))\n"
        "    if n != 'IQ2_XS': c.convert(np.zeros(T[n].type_size, np.uint8))\n"
        "assert 'gguf' not in sys.modules, 'imported early'\n"
        "c.convert(np.zeros(T['IQ2_XS'].type_size, np.uint8))\n"
        "assert 'gguf' in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", script], cwd=ROOT, check=True)
