"""The long tail of GGML types (IQ*, TQ*, MXFP4, NVFP4), dequantized by gguf-py.

``gguf`` is imported on first use only, so mounting a model that has none of these types
never loads it.  gguf-py's ``dequantize`` splits its input into groups of 16 *rows*; handing
it one row of a few hundred blocks at a time keeps each of its vectorized passes long while
its temporaries (grids, sign tables: many times the input size) stay bounded.
"""

from __future__ import annotations

from tensorfs.convert.floats import as_bytes
from tensorfs.runtime.libraries import np

_ROW_ELEMS = 1 << 15      # elements per row handed to gguf-py


def gguf_converter(ggml_type: int, type_size: int, block_size: int):
    blocks_per_row = max(1, _ROW_ELEMS // block_size)

    def convert(data: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        from tensorfs.runtime.libraries import gguf  # lazy: only when such a tensor is read

        qtype = gguf.GGMLQuantizationType(ggml_type)
        data = as_bytes(data)
        if data.size % type_size:
            raise ValueError(f"{data.size} bytes is not a whole number of {type_size}-byte blocks")
        n_blocks = data.size // type_size
        if out is None:
            out = np.empty(n_blocks * block_size, dtype=np.float32)
        elif out.dtype != np.float32 or out.shape != (n_blocks * block_size,) or not out.flags.c_contiguous:
            raise ValueError(f"out must be a contiguous float32 array of {n_blocks * block_size} elements")
        with np.errstate(all="ignore"):
            for start in range(0, n_blocks, blocks_per_row):
                stop = min(n_blocks, start + blocks_per_row)
                row = data[start * type_size:stop * type_size].reshape(1, -1)
                out[start * block_size:stop * block_size] = gguf.quants.dequantize(row, qtype).reshape(-1)
        return out

    return convert
