"""numpy comes with the first request that needs it, not with the mount (docs/internals/copylimit.md),
and many requests that each are the first to need it, at once, all get their bytes.

Python's import locks are per module: a thread importing a numpy submodule while another
is inside ``import numpy`` can be handed a partly initialised numpy (numpy then broken for
the daemon: EIO).  ``tensorfs.runtime.libraries`` imports numpy and gguf whole under one
lock; these tests race the requests (and the functions) that first need them.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import textwrap
import time

import gguf
import numpy as np
import pytest

from tests.support import daemon_pid, run_tensorfs, safetensors_corpus
from tests.support.quant_blocks import expected_values, type_blocks

ROUNDS = 6
QUANTS = ("BF16", "Q8_0", "IQ4_NL")       # our float kernel, our block kernel, gguf-py's


def numpy_in(pid: int) -> bool:
    """Whether numpy's extension module is loaded in process ``pid``."""
    with open(f"/proc/{pid}/maps") as f:
        return "_multiarray_umath" in f.read()


def write_model(path) -> dict[str, np.ndarray]:
    """A GGUF with a native tensor, one per kind of conversion and a float32 array (shown
    through numpy's float32 when metadata.json or its file is read; a float32 scalar would be
    decoded at parse, with numpy at mount): the tensors' values, from the oracles."""
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_array("test.values", [0.1, 0.2, 1e-5])
    expected = {"f32_w": np.arange(64, dtype=np.float32).reshape(4, 16)}
    writer.add_tensor("f32_w", expected["f32_w"])
    for name in QUANTS:
        blocks = type_blocks(name, 2)
        tensor = name.lower() + "_w"
        writer.add_tensor(tensor, blocks, raw_dtype=gguf.GGMLQuantizationType[name])
        n = blocks.size // gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[name]][1] * \
            gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[name]][0]
        expected[tensor] = expected_values(name, blocks, (blocks.shape[0], n // blocks.shape[0]))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return expected


@pytest.mark.slow
def test_requests_that_first_need_numpy_all_at_once_get_their_bytes(tmp_path, mount):
    """On each of several fresh mounts, readers in separate processes start at once, each
    the first of its kind to need numpy: a .npy's size (its header), a converted tensor by
    each kernel, a float32 metadata array, metadata.json; an editable mount every other
    round.  Every one gets the oracle's bytes and the daemon stays whole."""
    model = tmp_path / "model.gguf"
    expected = write_model(model)
    floats = [float(str(np.float32(v))) for v in (0.1, 0.2, 1e-5)]   # as numpy shows them
    for r in range(ROUNDS):
        edits = ("--edits", tmp_path / f"edits{r}") if r % 2 else ()
        mnt = mount(model, *edits, name=f"mnt{r}")
        commands = [["cat", mnt / f"{t}.npy"] for t in expected] * 2
        commands += [["stat", "-c", "%s", mnt / f"{t}.npy"] for t in expected]
        commands += [["cat", mnt / "metadata.json"], ["cat", mnt / "metadata" / "test.values"]] * 2
        readers = [subprocess.Popen(c, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
                   for c in commands]
        done = [(c, *p.communicate(timeout=60), p.returncode) for c, p in zip(commands, readers)]
        failed = [(c[-1].name, c[0], err.decode().strip()) for c, _, err, rc in done if rc]
        assert failed == [], f"round {r}: {failed}"
        for command, out, _, _ in done:
            path = command[-1]
            if command[0] == "stat":
                assert int(out) == path.stat().st_size
            elif path.suffix == ".npy":
                assert np.array_equal(np.load(io.BytesIO(out)), expected[path.stem]), path
            elif path.name == "metadata.json":
                assert json.loads(out)["metadata"]["test.values"] == floats
            else:
                assert [float(v) for v in out.split()] == floats
        # the daemon still answers what needs numpy
        assert np.array_equal(np.load(mnt / "bf16_w.npy"), expected["bf16_w"])
    assert run_tensorfs("list").returncode == 0


def small_model(path, fmt: str, converted: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """A F32 tensor "a.w" and (``converted``) a BF16 one "b.w" (1..8, exact in BF16), with
    metadata (a GGUF's: a float32, decoded at parse, and an integer array): their values."""
    f32 = np.arange(24, dtype="<f4").reshape(4, 6)
    bf16 = (np.arange(1, 9, dtype="<f4").view("<u4") >> 16).astype("<u2")
    if fmt == "safetensors":
        tensors = [("a.w", safetensors_corpus.tensor("F32", f32.shape, 0, 96))]
        tensors += [("b.w", safetensors_corpus.tensor("BF16", (8,), 96, 112))] if converted else []
        path.write_bytes(safetensors_corpus.build(
            tensors, metadata={"note": "plain text"},
            data=f32.tobytes() + (bf16.tobytes() if converted else b"")))
    else:
        writer = gguf.GGUFWriter(str(path), "llama")
        writer.add_float32("test.scale", 0.1)
        writer.add_string("test.note", "plain text")
        writer.add_array("test.types", [1, 1, 3])          # a tokenizer's token types
        writer.add_tensor("a.w", f32)
        if converted:
            writer.add_tensor("b.w", bf16.view(np.uint8).reshape(1, 16),
                              raw_dtype=gguf.GGMLQuantizationType.BF16)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
    return f32, np.arange(1, 9, dtype="<f4")


@pytest.mark.parametrize("fmt", ["safetensors", "gguf"])
def test_a_mount_without_converted_views_never_loads_numpy(tmp_path, mount, fmt):
    """A model with no converted view: the mount command, its daemon, and what a reader of
    files/, metadata.json, the tree's listing (``ls -l``: every .npy's size) and a native
    .npy asks do without numpy, and the daemon never imports it."""
    model = tmp_path / f"model.{fmt}"
    f32, _ = small_model(model, fmt, converted=False)
    mnt = mount(model)
    pid = daemon_pid(mnt)
    assert (mnt / "files" / model.name).read_bytes() == model.read_bytes()
    metadata = json.loads((mnt / "metadata.json").read_text())["metadata"]
    assert metadata.get("test.scale", 0.1) == 0.1
    assert metadata.get("test.types", [1, 1, 3]) == [1, 1, 3]
    listing = subprocess.run(["ls", "-lR", mnt], capture_output=True, text=True, check=True)
    assert "w.npy" in listing.stdout
    assert np.array_equal(np.load(mnt / "a" / "w.npy"), f32)
    time.sleep(0.5)             # what a background import would have done by now
    assert not numpy_in(pid)


@pytest.mark.parametrize("fmt", ["safetensors", "gguf"])
def test_numpy_comes_once_the_mount_serves_before_anyone_asks(tmp_path, fmt):
    """A model with a converted view: neither the mount command nor its daemon until it
    serves imports numpy (the imports Python reports on the command's stderr: the daemon's
    until it is ready); the daemon then imports it without a read asking, so that the first
    converted read does not pay for it."""
    model = tmp_path / f"model.{fmt}"
    _, bf16 = small_model(model, fmt)
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    done = run_tensorfs("mount", model, mnt, env={**os.environ, "PYTHONPROFILEIMPORTTIME": "1"})
    assert done.returncode == 0, done.stderr
    try:
        imported = [line.rsplit("|", 1)[-1].strip() for line in done.stderr.splitlines()
                    if line.startswith("import time:")]
        assert "tensorfs.mount.tree" in imported             # the report is there
        assert [m for m in imported if m.split(".")[0] in ("numpy", "gguf")] == []
        pid = daemon_pid(mnt)
        deadline = time.monotonic() + 30
        while not numpy_in(pid) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert numpy_in(pid), "numpy not imported in the background"
        assert np.array_equal(np.load(mnt / "b" / "w.npy").reshape(-1), bf16)
    finally:
        assert run_tensorfs("unmount", mnt).returncode == 0


FIRST_USES = """
import sys, threading
from tensorfs.convert import conversion_for
from tensorfs.convert.blocks import converted_array
from tensorfs.formats import gguf as gguf_format
from tensorfs.formats.metadata_text import parse_text
from tensorfs.model import TensorInfo
from tensorfs.views.byteviews import npy_header

def tensor(dtype, ggml_type=None, shape=(32,)):
    return TensorInfo("t", dtype, shape, 0, 0, "model", ggml_type=ggml_type)

class Zeros:
    def read_into(self, offset, buf):
        buf[:] = bytes(len(buf))
        return len(buf)

uses = {
    "npy_header": lambda: npy_header("<f4", (3, 4)),
    "bf16": lambda: conversion_for(tensor("BF16")).convert(bytearray(64)).tolist(),
    "q8_0": lambda: conversion_for(tensor("Q8_0", 8)).convert(bytearray(34)).tolist(),
    "iq4_nl": lambda: conversion_for(tensor("IQ4_NL", 20)).convert(bytearray(18)).tolist(),
    "whole": lambda: converted_array(Zeros(), 0, conversion_for(tensor("BF16")), 32).tolist(),
    "text": lambda: parse_text("float32", b"0.1"),
    "f32_list": lambda: gguf_format._numeric_list(bytes(8), 6, "<", 2, 0),
}
start = threading.Barrier(len(uses) * 2)
results, errors = {}, []

def run(name):
    start.wait()
    try:
        results[name] = uses[name]()
    except BaseException as error:
        errors.append(f"{name}: {type(error).__name__}: {error}")

threads = [threading.Thread(target=run, args=(n,)) for n in uses for _ in range(2)]
for t in threads:
    t.start()
for t in threads:
    t.join()
assert "numpy" in sys.modules
print(repr((sorted(errors), sorted(results))))
"""


@pytest.mark.parametrize("run", range(8))
def test_functions_that_first_need_numpy_at_once_in_a_fresh_process(run):
    """In a new interpreter, threads started together each call a function that is the
    first to need numpy or gguf: every one returns, none sees a partial numpy."""
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(FIRST_USES)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    errors, names = eval(done.stdout)
    assert errors == []
    assert len(names) == 7
