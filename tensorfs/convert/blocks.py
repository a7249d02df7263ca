"""The one driver that turns a tensor's stored blocks into float32: every reader of
converted values goes through it (a mount's ``ConvertedView`` and its worker processes,
``tensorfs.api``'s ``OpenModel.array``, the ``hash``/``stats``/``diff`` commands).

``convert_blocks`` runs a ``Conversion``'s kernel over whole stored blocks into the
caller's float32 buffer; ``read_converted`` first reads the blocks from a source (anything
with ``read_into``, as ``tensorfs.sources.source.Source``) into the caller's scratch;
``converted_array`` converts a whole tensor in bounded slabs.  The kernels themselves are
``tensorfs.convert``'s.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from tensorfs.convert import Conversion

if TYPE_CHECKING:               # numpy comes with the first conversion, not with a mount
    import numpy as np

# A whole tensor is converted this many stored bytes at a time (``converted_array``): the
# scratch it is read into stays small whatever the tensor's size.
SLAB_BYTES = 16 << 20


class Readable(Protocol):
    """What the blocks are read from: a source's ``read_into`` (exactly ``len(buf)`` bytes
    at ``offset``, or an error)."""

    def read_into(self, offset: int, buf, span: tuple[int, int] | None = None) -> int: ...


def convert_blocks(conversion: Conversion, raw: np.ndarray,
                   out: np.ndarray | None = None) -> np.ndarray:
    """The float32 values of ``raw`` (uint8, whole blocks of ``conversion``), into ``out``
    (float32, at least as many values; only its first ones are written) when given."""
    if raw.size % conversion.block_bytes:
        raise ValueError(f"{raw.size} bytes are not whole {conversion.name} blocks "
                         f"of {conversion.block_bytes}")
    n = raw.size // conversion.block_bytes * conversion.block_elems
    if out is not None:
        if out.size < n:
            raise ValueError(f"{n} values do not fit in a buffer of {out.size}")
        out = out[:n]
    return conversion.convert(raw, out=out)


def read_converted(source: Readable, offset: int, conversion: Conversion, first_block: int,
                   n_blocks: int, out: np.ndarray, scratch: np.ndarray) -> np.ndarray:
    """Blocks ``[first_block, first_block + n_blocks)`` of the tensor whose bytes start at
    ``offset`` of ``source``: read into ``scratch`` (uint8, at least ``n_blocks`` blocks),
    then converted into ``out``."""
    length = n_blocks * conversion.block_bytes
    raw = scratch[:length]
    source.read_into(offset + first_block * conversion.block_bytes,
                     memoryview(raw))  # type: ignore[arg-type, unused-ignore]
    return convert_blocks(conversion, raw, out)


def converted_array(source: Readable, offset: int, conversion: Conversion,
                    n_elements: int) -> np.ndarray:
    """A whole tensor's float32 values (1-D, ``n_elements``), converted a slab of at most
    ``SLAB_BYTES`` stored bytes at a time."""
    from tensorfs.runtime.libraries import np

    slab_bytes = SLAB_BYTES
    out = np.empty(n_elements, np.float32)
    n_blocks = n_elements // conversion.block_elems
    per_slab = max(1, slab_bytes // conversion.block_bytes)
    scratch = np.empty(min(n_blocks, per_slab) * conversion.block_bytes, np.uint8)
    for first in range(0, n_blocks, per_slab):
        count = min(per_slab, n_blocks - first)
        read_converted(source, offset, conversion, first, count,
                       out[first * conversion.block_elems:], scratch)
    return out
