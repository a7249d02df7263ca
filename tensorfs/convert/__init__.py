"""Conversion kernels: stored tensor bytes of a type numpy lacks -> float32.

The view layer asks ``conversion_for(tensor)`` once per tensor.  ``None`` means no converted
view: either numpy has the type and the bytes are served untouched (F32, F16, F64, I8..I64,
U8..U64, BOOL, C64; ``raw_only_reason`` is then ``None`` too), or the type cannot be
converted and ``raw_only_reason(tensor)`` says why (for ``metadata.json``).

A ``Conversion`` converts whole blocks: ``convert(data)`` takes a uint8 array of
``k * block_bytes`` bytes (a read-only view of the mmap is fine) and returns ``k *
block_elems`` native float32 values (``<f4``).  Blocks are independent, so any run of whole
blocks converts to the same values as the matching slice of the whole tensor.  Every
``convert`` also accepts ``out=`` (a contiguous float32 array of the right size) to write
into a buffer the caller reuses instead of fresh memory.

Which kernel serves which type:

* BF16 (safetensors and GGUF) and the safetensors 8-bit floats: ``floats`` (exact).
* Q4_0 Q4_1 Q5_0 Q5_1 Q8_0 Q2_K..Q6_K, and Q8_1 Q8_K Q1_0 Q2_0 (which gguf-py cannot do):
  our own numpy kernels in ``ggml``; same float32 bits as ``gguf.quants.dequantize``.
* IQ1_S IQ1_M IQ2_XXS IQ2_XS IQ2_S IQ3_XXS IQ3_S IQ4_NL IQ4_XS TQ1_0 TQ2_0 MXFP4 NVFP4:
  ``gguf.quants`` itself (``longtail``), imported lazily.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING, Callable

from tensorfs.dtypes import GGML_TYPES, SAFETENSORS_DTYPES
from tensorfs.model import TensorInfo

if TYPE_CHECKING:
    import numpy as np

# The kernels (``floats``, ``ggml``, ``longtail``) and numpy with them are imported by the
# first ``convert`` call, not with this package: a mount asks every tensor's plan (which
# conversion, or none) without converting anything, and numpy is most of a mount's imports
# (docs/internals/copylimit.md).

__all__ = ["Conversion", "conversion_for", "conversion_from_spec", "raw_only_reason"]


@dataclass(frozen=True)
class Conversion:
    name: str            # the stored type's name, e.g. "Q4_K", "BF16"
    block_elems: int     # elements per block
    block_bytes: int     # bytes per block
    costly: bool         # worth caching a converted chunk (block quants); False: recompute per read
    # What names this conversion, to its kernel and to another process (a conversion
    # worker, tensorfs.convert.workers): plain values, since the kernels are closures.
    spec: tuple

    def convert(self, data: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        """uint8 whole blocks -> float32 '<f4' 1-D (into ``out`` when given)."""
        return _kernel(self.spec)(data, out=out)


@lru_cache(maxsize=None)
def _kernel(spec: tuple) -> Callable[..., np.ndarray]:
    """The kernel ``spec`` names, made at its first use (numpy comes with it)."""
    from tensorfs.convert import floats, ggml, longtail
    from tensorfs.runtime.libraries import np

    if spec[0] == "safetensors":
        dtype = spec[1]
        if SAFETENSORS_DTYPES[dtype].kernel == "bf16":
            return floats.bf16_converter("<")
        return floats.fp8_converter(dtype)
    _, ggml_type, byte_order = spec
    gt = GGML_TYPES[ggml_type]
    if gt.kernel == "bf16":
        return floats.bf16_converter(byte_order)
    if gt.kernel == "gguf-py":
        return longtail.gguf_converter(gt.id, gt.type_size, gt.block_size)
    kernel = getattr(ggml, gt.name.lower())        # "ggml", "ggml-scaled": ours, by name
    if gt.kernel == "ggml-scaled":
        kernel = kernel(np.dtype(">f2" if byte_order == ">" else "<f2"))
    return ggml.blockwise(kernel, gt.type_size, gt.block_size)


# --- safetensors ----------------------------------------------------------------------------
# Which types convert, and how, is each type's line in tensorfs.dtypes; the kernels are here.

def _safetensors(dtype: str) -> Conversion | None:
    st = SAFETENSORS_DTYPES.get(dtype)
    kernel = st.kernel if st is not None else None
    if kernel == "bf16":
        return Conversion(dtype, 1, 2, False, ("safetensors", dtype))
    if kernel == "fp8":
        return Conversion(dtype, 1, 1, False, ("safetensors", dtype))
    return None


# --- GGUF -----------------------------------------------------------------------------------

def _gguf_available() -> bool:
    return importlib.util.find_spec("gguf") is not None


def _ggml(ggml_type: int, byte_order: str) -> tuple[Conversion | None, str | None]:
    gt = GGML_TYPES.get(ggml_type)
    if gt is None:
        return None, f"unknown GGML type id {ggml_type}"
    if gt.numpy is not None:
        return None, None                         # numpy has it: served untouched
    if gt.kernel is None:
        return None, f"no dequantization known for GGML type {gt.name}"
    if byte_order == ">" and not gt.big_endian:
        return None, _be_reason(gt.name)
    spec = ("ggml", ggml_type, byte_order)
    if gt.kernel == "bf16":
        return Conversion("BF16", 1, 2, False, spec), None
    if gt.kernel == "gguf-py" and not _gguf_available():
        return None, f"{gt.name} dequantization needs the gguf package (gguf-py), not installed"
    return Conversion(gt.name, gt.block_size, gt.type_size, True, spec), None


def _be_reason(name: str) -> str:
    return (f"byte order of {name} scales in big-endian files is not defined "
            "(gguf_convert_endian.py swaps only Q4_0, Q8_0, Q4_K and Q6_K blocks)")


# --- the API ----------------------------------------------------------------------------------

def conversion_for(tensor: TensorInfo) -> Conversion | None:
    """The float32 conversion for ``tensor``'s type, or None (native numpy type, or raw only)."""
    if tensor.ggml_type is not None:
        return _ggml(tensor.ggml_type, tensor.byte_order)[0]
    return _safetensors(tensor.dtype)


def conversion_from_spec(spec) -> Conversion | None:
    """The conversion a ``Conversion.spec`` names (lists are accepted for tuples, as JSON
    gives them back)."""
    kind, *args = spec
    if kind == "ggml":
        return _ggml(int(args[0]), str(args[1]))[0]
    if kind == "safetensors":
        return _safetensors(str(args[0]))
    raise ValueError(f"not a conversion spec: {spec!r}")


def raw_only_reason(tensor: TensorInfo) -> str | None:
    """Why ``tensor`` has no .npy view; None when it has one (converted or untouched)."""
    if tensor.ggml_type is not None:
        return _ggml(tensor.ggml_type, tensor.byte_order)[1]
    st = SAFETENSORS_DTYPES.get(tensor.dtype)
    if st is None:
        return f"unknown safetensors dtype {tensor.dtype}"
    if st.numpy is not None or _safetensors(tensor.dtype) is not None:
        return None
    return st.raw_only or f"no conversion known for {tensor.dtype}"
