"""The .npy header the views write themselves (``tensorfs.views.byteviews.npy_header``,
so that a listing's sizes need no numpy) is byte for byte the one numpy writes."""

from __future__ import annotations

import io

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from tensorfs.views.byteviews import npy_header

DESCRS = ["<f4", "<f2", "<f8", "|u1", "|i1", "<i2", "<u2", "<i4", "<u4", "<i8", "<u8", "|b1",
          "<c8", ">f4", ">i8", "|V2"]


def numpys(descr: str, shape: tuple[int, ...]) -> bytes:
    header = {"descr": descr, "fortran_order": False, "shape": shape}
    out = io.BytesIO()
    try:
        np.lib.format.write_array_header_1_0(out, header)
    except ValueError:
        out = io.BytesIO()
        np.lib.format.write_array_header_2_0(out, header)
    return out.getvalue()


@settings(max_examples=300, deadline=None)
@given(descr=st.sampled_from(DESCRS),
       shape=st.lists(st.one_of(st.integers(0, 9), st.integers(0, 2**63 - 1)), max_size=8))
def test_npy_header_is_numpys(descr, shape):
    assert npy_header(descr, tuple(shape)) == numpys(descr, tuple(shape))


def test_npy_header_of_a_long_shape_is_numpys_format_2():
    shape = (2**62,) * 4000                 # a header over 64 KiB: format 2.0
    mine = npy_header("<f4", shape)
    assert mine[6:8] == b"\x02\x00"
    assert mine == numpys("<f4", shape)


def test_npy_header_reads_back_in_numpy():
    for shape in [(), (0,), (3,), (2, 3, 4)]:
        array = np.arange(int(np.prod(shape)), dtype="<f4").reshape(shape)
        assert np.array_equal(np.load(io.BytesIO(npy_header("<f4", shape) + array.tobytes())), array)
