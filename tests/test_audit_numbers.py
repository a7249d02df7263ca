"""Numbers a user hands tensorfs that overflow further down (the audit's instances of the
"numbers that overflow" class beyond the review's): each is one clear line at parse time."""

from __future__ import annotations

import pytest

from tests.models import write_safetensors
from tests.servers import Nginx
from tests.support import run_tensorfs


@pytest.fixture
def served(tmp_path):
    server = Nginx(tmp_path / "nginx")
    model = tmp_path / "model.safetensors"
    write_safetensors(model)
    server.put("files/model.safetensors", model)
    server.start()
    yield f"{server.url}/files/model.safetensors"
    server.stop()


@pytest.mark.remote
@pytest.mark.parametrize("timeout", ["1e10", "1e308", "inf", "nan", "0", "-5"])
def test_a_timeout_no_clock_can_wait_is_one_line_at_parse_time(served, timeout):
    """[--timeout 1e10 with a URL: `internal error: OverflowError: timestamp out of range
    for platform time_t`; 1e308 and inf: "cannot convert float infinity to integer" blamed
    on the URL.]"""
    for command in ("inspect", "hash"):
        result = run_tensorfs(command, served, "--timeout", timeout, timeout=60)
        assert result.returncode != 0
        lines = result.stderr.splitlines()
        assert len(lines) == 1, result.stderr
        assert lines[0] == (f"tensorfs: error: argument --timeout: not a number of seconds: "
                            f"'{timeout}' (more than 0, at most 86400)"), result.stderr


@pytest.mark.remote
def test_the_longest_timeout_allowed_still_reads(served):
    result = run_tensorfs("inspect", served, "--timeout", "86400", timeout=60)
    assert result.returncode == 0, result.stderr


def _safetensors(path, tensors: dict) -> None:
    """A safetensors file of zero-filled tensors; ``tensors``: name -> (shape, nbytes)."""
    import json
    import struct

    header, offset = {}, 0
    for name, (shape, nbytes) in tensors.items():
        header[name] = {"dtype": "F32", "shape": shape, "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    path.write_bytes(struct.pack("<Q", len(text)) + text + bytes(offset))


@pytest.mark.parametrize("shape, nbytes", [([1] * 70, 4), ([0, 2**64 - 1], 0),
                                           ([0, 2**62, 2**62], 0), ([0, 2**63 - 1], 0)])
def test_a_shape_numpy_cannot_hold_is_one_line_with_npy_views_and_mounts_raw(tmp_path, mount, shape, nbytes):
    """[found by the audit: safetensors allows 70 dimensions, or `[0, 2**64 - 1]`; the
    mount served a .npy view that numpy.load refuses ("maximum supported dimension",
    "Maximum allowed dimension exceeded", "array is too big")]  The oracle, safetensors'
    own numpy loader, refuses it too; the mount says so in one line, and mounts it raw."""
    import numpy as np
    from safetensors.numpy import load_file

    model = tmp_path / "odd.safetensors"
    _safetensors(model, {"fine": ([2], 8), "odd": (shape, nbytes)})
    with pytest.raises(ValueError):
        load_file(model)
    (tmp_path / "refused").mkdir()
    result = run_tensorfs("mount", model, tmp_path / "refused")
    assert result.returncode == 1
    assert result.stderr.splitlines() == [result.stderr.strip()]
    assert result.stderr.startswith(f"tensorfs: error: {model}: tensor 'odd' has "), result.stderr
    assert "no .npy view can hold it (--views raw,files mounts it" in result.stderr
    mnt = mount(model, "--views", "raw,files")
    assert (mnt / "odd").read_bytes() == bytes(nbytes)
    assert np.array_equal(np.frombuffer((mnt / "fine").read_bytes(), "<f4"), np.zeros(2))
    assert not (mnt / "odd.npy").exists()
