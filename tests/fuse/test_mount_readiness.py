"""`tensorfs mount` returns 0 only for a mount that answers (docs/reference/cli.md: a script may use it on
the next line).  libfuse checks the init callback's answer only after it returns, and may
end the session there: `-o max_read=N` once exited 0 with nothing mounted."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
from safetensors.numpy import save_file

from tests.support import fuse_mounts_under, run_tensorfs


@pytest.fixture
def model(tmp_path):
    # 3 tensors, one of 1.2 MB: reads far beyond any max_read given below.
    tensors = {"big": np.arange(300_000, dtype=np.float32), "small": np.arange(5, dtype=np.int16),
               "bytes": np.arange(4097, dtype=np.uint8)}
    path = tmp_path / "model.safetensors"
    save_file(tensors, str(path))
    return path, tensors


@pytest.mark.parametrize("value", ["4096", "1", "65536", "131072", "4294967295"])
def test_max_read_mounts_and_serves_the_oracles_bytes(model, mount, value):
    path, tensors = model
    mnt = mount(path, "-o", f"max_read={value}")
    assert os.path.ismount(mnt)
    _check_bytes(mnt, tensors)


def _check_bytes(mnt, tensors):
    doc = json.loads((mnt / "metadata.json").read_bytes())
    for name, array in tensors.items():
        assert (mnt / doc["tensors"][name]["path"]).read_bytes() == array.tobytes()
        loaded = np.load(mnt / (doc["tensors"][name]["path"] + ".npy"))
        assert np.array_equal(loaded, array)


@pytest.mark.parametrize("value", ["abc", "-1", "0", "4294967296", "", "0x1000", "1e3",
                                   "99999999999999999999"])
@pytest.mark.parametrize("foreground", [False, True])
def test_any_max_read_serves_or_is_one_line_with_nothing_mounted(model, tmp_path, value,
                                                                  foreground):
    path, tensors = model
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    command = ["mount", path, mnt, "-o", f"max_read={value}"]
    if foreground:
        command.append("--foreground")
    result = run_tensorfs(*command, timeout=60)
    if result.returncode == 0:       # a value the checks let through must really serve
        try:
            _check_bytes(mnt, tensors)
        finally:
            assert run_tensorfs("unmount", mnt).returncode == 0
        return
    assert result.returncode in (1, 2), result.stderr     # 2: refused as usage, before mounting
    lines = result.stderr.splitlines()
    assert lines[-1].startswith("tensorfs: error: ") and "max_read" in lines[-1]
    if not foreground:               # a foreground daemon logs to stderr as it goes
        assert len(lines) == 1 or (result.returncode == 2 and len(lines) == 2
                                   and lines[0].startswith("usage: tensorfs mount"))
    assert "Traceback" not in result.stderr
    assert fuse_mounts_under(tmp_path) == []
