"""Type tables: every fact about a type lives in one line here.

GGML block and type sizes follow ggml's ``type_traits`` (ggml.c / ggml-common.h), not
gguf-py's GGML_QUANT_SIZES, which disagrees for Q8_1 (ggml: two fp16 halves + 32 int8 = 36
bytes).  Ids that ggml has removed (4, 5, 31-33, 36-38) are absent: a file using them is
refused.
"""

from __future__ import annotations

from dataclasses import dataclass


# How a type without a numpy dtype becomes float32 (tensorfs.convert): "bf16" (a shift),
# "fp8" (a 256-entry table), "ggml" (our kernel in tensorfs.convert.ggml, named as the type
# in lower case), "ggml-scaled" (the same, built for the byte order of its fp16 scales),
# "gguf-py" (gguf.quants.dequantize, the gguf extra), None (raw only).
@dataclass(frozen=True)
class GGMLType:
    id: int
    name: str
    block_size: int        # elements per block
    type_size: int         # bytes per block
    numpy: str | None      # numpy dtype (little-endian form) when numpy has the type
    kernel: str | None = None   # how it converts (above)
    # its big-endian form is known: gguf-py's gguf_convert_endian.py swaps the fp16 scales
    # of Q4_0, Q8_0 (d), Q4_K (d, dmin) and Q6_K (d) only; MXFP4 and NVFP4 have single-byte
    # fields only (byteswap_noop), so big-endian files read the same
    big_endian: bool = False


GGML_TYPES: dict[int, GGMLType] = {t.id: t for t in (
    GGMLType(0, "F32", 1, 4, "<f4"),
    GGMLType(1, "F16", 1, 2, "<f2"),
    GGMLType(2, "Q4_0", 32, 18, None, "ggml-scaled", True),
    GGMLType(3, "Q4_1", 32, 20, None, "ggml"),
    GGMLType(6, "Q5_0", 32, 22, None, "ggml"),
    GGMLType(7, "Q5_1", 32, 24, None, "ggml"),
    GGMLType(8, "Q8_0", 32, 34, None, "ggml-scaled", True),
    GGMLType(9, "Q8_1", 32, 36, None, "ggml"),
    GGMLType(10, "Q2_K", 256, 84, None, "ggml"),
    GGMLType(11, "Q3_K", 256, 110, None, "ggml"),
    GGMLType(12, "Q4_K", 256, 144, None, "ggml-scaled", True),
    GGMLType(13, "Q5_K", 256, 176, None, "ggml"),
    GGMLType(14, "Q6_K", 256, 210, None, "ggml-scaled", True),
    GGMLType(15, "Q8_K", 256, 292, None, "ggml"),
    GGMLType(16, "IQ2_XXS", 256, 66, None, "gguf-py"),
    GGMLType(17, "IQ2_XS", 256, 74, None, "gguf-py"),
    GGMLType(18, "IQ3_XXS", 256, 98, None, "gguf-py"),
    GGMLType(19, "IQ1_S", 256, 50, None, "gguf-py"),
    GGMLType(20, "IQ4_NL", 32, 18, None, "gguf-py"),
    GGMLType(21, "IQ3_S", 256, 110, None, "gguf-py"),
    GGMLType(22, "IQ2_S", 256, 82, None, "gguf-py"),
    GGMLType(23, "IQ4_XS", 256, 136, None, "gguf-py"),
    GGMLType(24, "I8", 1, 1, "|i1"),
    GGMLType(25, "I16", 1, 2, "<i2"),
    GGMLType(26, "I32", 1, 4, "<i4"),
    GGMLType(27, "I64", 1, 8, "<i8"),
    GGMLType(28, "F64", 1, 8, "<f8"),
    GGMLType(29, "IQ1_M", 256, 56, None, "gguf-py"),
    GGMLType(30, "BF16", 1, 2, None, "bf16", True),
    GGMLType(34, "TQ1_0", 256, 54, None, "gguf-py"),
    GGMLType(35, "TQ2_0", 256, 66, None, "gguf-py"),
    GGMLType(39, "MXFP4", 32, 17, None, "gguf-py", True),
    GGMLType(40, "NVFP4", 64, 36, None, "gguf-py", True),
    GGMLType(41, "Q1_0", 128, 18, None, "ggml"),
    GGMLType(42, "Q2_0", 64, 18, None, "ggml"),
)}

GGML_TYPES_BY_NAME: dict[str, GGMLType] = {t.name: t for t in GGML_TYPES.values()}


# GGUF metadata value types: id -> (name, struct format of a scalar or None, byte size).
GGUF_VALUE_TYPES: dict[int, tuple[str, str | None, int]] = {
    0: ("uint8", "B", 1),
    1: ("int8", "b", 1),
    2: ("uint16", "H", 2),
    3: ("int16", "h", 2),
    4: ("uint32", "I", 4),
    5: ("int32", "i", 4),
    6: ("float32", "f", 4),
    7: ("bool", "?", 1),
    8: ("string", None, 0),
    9: ("array", None, 0),
    10: ("uint64", "Q", 8),
    11: ("int64", "q", 8),
    12: ("float64", "d", 8),
}
GGUF_STRING = 8
GGUF_ARRAY = 9


_UNDOCUMENTED = "element packing order ({}) is not documented by the safetensors format"


@dataclass(frozen=True)
class SafetensorsDType:
    name: str
    bits: int              # bits per element; sub-byte types are packed
    numpy: str | None      # numpy dtype when numpy has the type (data served untouched)
    kernel: str | None = None       # how it converts (GGMLType's kinds, above)
    raw_only: str | None = None     # why it has no .npy view, where that is known


SAFETENSORS_DTYPES: dict[str, SafetensorsDType] = {d.name: d for d in (
    SafetensorsDType("BOOL", 8, "|b1"),
    SafetensorsDType("U8", 8, "|u1"),
    SafetensorsDType("I8", 8, "|i1"),
    SafetensorsDType("I16", 16, "<i2"),
    SafetensorsDType("U16", 16, "<u2"),
    SafetensorsDType("I32", 32, "<i4"),
    SafetensorsDType("U32", 32, "<u4"),
    SafetensorsDType("I64", 64, "<i8"),
    SafetensorsDType("U64", 64, "<u8"),
    SafetensorsDType("F16", 16, "<f2"),
    SafetensorsDType("BF16", 16, None, "bf16"),
    SafetensorsDType("F32", 32, "<f4"),
    SafetensorsDType("F64", 64, "<f8"),
    SafetensorsDType("C64", 64, "<c8"),
    SafetensorsDType("F8_E4M3", 8, None, "fp8"),
    SafetensorsDType("F8_E5M2", 8, None, "fp8"),
    SafetensorsDType("F8_E8M0", 8, None, "fp8"),
    SafetensorsDType("F8_E4M3FNUZ", 8, None, "fp8"),
    SafetensorsDType("F8_E5M2FNUZ", 8, None, "fp8"),
    SafetensorsDType("F6_E2M3", 6, None, raw_only="F6_E2M3 " + _UNDOCUMENTED.format(
        "how four 6-bit elements fill three bytes")),
    SafetensorsDType("F6_E3M2", 6, None, raw_only="F6_E3M2 " + _UNDOCUMENTED.format(
        "how four 6-bit elements fill three bytes")),
    SafetensorsDType("F4", 4, None, raw_only="F4 (E2M1) " + _UNDOCUMENTED.format(
        "which nibble of a byte is the first element")),
)}


def native_numpy_dtype(tensor) -> str | None:
    """The numpy dtype string a tensor's bytes are, untouched, or None if numpy lacks it.

    Big-endian GGUF tensors keep their byte order (``>f4``): the bytes are served as stored.
    """
    if tensor.ggml_type is not None:
        gt = GGML_TYPES.get(tensor.ggml_type)
        base = gt.numpy if gt else None
    else:
        st = SAFETENSORS_DTYPES.get(tensor.dtype)
        base = st.numpy if st else None
    if base is None:
        return None
    if tensor.byte_order == ">" and base[0] == "<":
        return ">" + base[1:]
    return base
