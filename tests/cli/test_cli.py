"""The command line as a user meets it: inspect, mount, unmount, and every refusal."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.support import TENSORFS, fuse_mounts_under, run_tensorfs, safetensors_corpus, usage_error
from tests.support.models import write_gguf, write_safetensors

try:
    from tests.support import gguf_corpus
    GGUF_MALFORMED = list(gguf_corpus.MALFORMED)
except (ImportError, AttributeError):          # pragma: no cover - corpus not written yet
    GGUF_MALFORMED = []

MALFORMED = [("safetensors-" + n, d) for n, d in safetensors_corpus.MALFORMED] + \
            [("gguf-" + n, d) for n, d in GGUF_MALFORMED] + \
            [("unknown-format", b"PK\x03\x04 not a model"), ("text", b"hello world\n" * 10)]


def _assert_one_error_line(result, code=1):
    assert result.returncode == code, (result.returncode, result.stderr)
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("tensorfs: error: "), lines[0]
    assert "Traceback" not in result.stderr
    return lines[0]


@pytest.mark.parametrize("name,data", MALFORMED, ids=[n for n, _ in MALFORMED])
def test_malformed_files_are_refused_with_one_line(tmp_path, name, data):
    model = tmp_path / "bad.model"
    model.write_bytes(data)
    line = _assert_one_error_line(run_tensorfs("inspect", model))
    assert str(model) in line
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    assert _assert_one_error_line(run_tensorfs("mount", model, mnt)) == line
    assert fuse_mounts_under(tmp_path) == [] and os.listdir(mnt) == []


@pytest.mark.parametrize("name,data", safetensors_corpus.VALID_ODD,
                         ids=[n for n, _ in safetensors_corpus.VALID_ODD])
def test_odd_but_valid_safetensors_mount(tmp_path, mount, name, data):
    from safetensors import deserialize

    model = tmp_path / "odd.safetensors"
    model.write_bytes(data)
    mnt = mount(model)
    doc = json.loads((mnt / "metadata.json").read_bytes())
    reference = dict(deserialize(data))
    assert sorted(doc["tensors"]) == sorted(reference)
    for tensor_name, info in reference.items():
        entry = doc["tensors"][tensor_name]
        assert (mnt / entry["path"]).read_bytes() == bytes(info["data"])
        assert entry["shape"] == list(info["shape"])


def test_inspect_summary_and_json(tmp_path, mount):
    model = tmp_path / "m.gguf"
    tensors = write_gguf(model)
    result = run_tensorfs("inspect", model)
    assert result.returncode == 0 and result.stderr == ""
    out = result.stdout
    assert "gguf v3" in out and f"tensors:    {len(tensors)}," in out
    for name, array in tensors.items():
        row = next(line for line in out.splitlines() if line.startswith(name + " "))
        assert row.split()[-1] == str(array.nbytes)
    as_json = run_tensorfs("inspect", "--json", model)
    assert as_json.returncode == 0
    mnt = mount(model)
    assert as_json.stdout.encode() == (mnt / "metadata.json").read_bytes()


def test_mount_point_problems(tmp_path, mount):
    model = tmp_path / "m.safetensors"
    write_safetensors(model)
    line = _assert_one_error_line(run_tensorfs("mount", model, tmp_path / "missing"))
    assert "does not exist" in line
    full = tmp_path / "full"
    full.mkdir()
    (full / "x").write_text("x")
    assert "not empty" in _assert_one_error_line(run_tensorfs("mount", model, full))
    assert "not a directory" in _assert_one_error_line(run_tensorfs("mount", model, full / "x"))
    assert "mkdir -p" in line
    mnt = mount(model)
    assert "already a mount" in _assert_one_error_line(run_tensorfs("mount", model, mnt))


def test_usage_errors_exit_2(tmp_path):
    for args in ([], ["frobnicate"], ["mount"], ["mount", "a", "b", "--cache-size", "lots"],
                 ["mount", "a", "b", "--layout", "spiral"], ["inspect"]):
        usage_error(run_tensorfs(*args))
    assert run_tensorfs("--version").stdout.startswith("tensorfs ")
    assert run_tensorfs("--help").returncode == 0


def test_unmount_of_something_not_mounted(tmp_path):
    assert "not mounted" in _assert_one_error_line(run_tensorfs("unmount", tmp_path))


def test_mount_is_live_on_the_next_line_and_unmount_waits(tmp_path):
    model = tmp_path / "m.safetensors"
    tensors = write_safetensors(model)
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    for _ in range(3):
        assert run_tensorfs("mount", model, mnt).returncode == 0
        assert (mnt / "lm_head" / "weight").read_bytes() == tensors["lm_head.weight"].tobytes()
        assert run_tensorfs("unmount", mnt).returncode == 0
        assert fuse_mounts_under(tmp_path) == [] and os.listdir(mnt) == []


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_foreground_unmounts_cleanly_on_signal(tmp_path, sig):
    model = tmp_path / "m.safetensors"
    tensors = write_safetensors(model)
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    proc = subprocess.Popen([*TENSORFS, "mount", "--foreground", str(model), str(mnt)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 30
        while not fuse_mounts_under(mnt) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert (mnt / "lm_head" / "weight").read_bytes() == tensors["lm_head.weight"].tobytes()
        proc.send_signal(sig)
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            subprocess.run(["fusermount", "-uz", str(mnt)])
    assert fuse_mounts_under(tmp_path) == []


name_strategy = st.text(st.characters(codec="utf-8", exclude_characters="\ud800"), max_size=30)


@pytest.mark.slow
@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(names=st.lists(name_strategy, min_size=1, max_size=25, unique=True),
       layout=st.sampled_from(["tree", "flat"]))
def test_any_names_are_reachable_through_the_mount(tmp_path_factory, names, layout):
    from safetensors.numpy import save_file

    base = tmp_path_factory.mktemp("names")
    arrays = {name: np.full((2,), i, dtype=np.int32) for i, name in enumerate(names)}
    model = base / "m.safetensors"
    save_file(arrays, str(model))
    mnt = base / "mnt"
    mnt.mkdir()
    assert run_tensorfs("mount", model, mnt, "--layout", layout).returncode == 0
    try:
        doc = json.loads((mnt / "metadata.json").read_bytes())
        root = os.path.realpath(mnt)
        for name, array in arrays.items():
            path = os.path.join(mnt, doc["tensors"][name]["path"])
            assert os.path.realpath(path).startswith(root + os.sep)
            assert open(path, "rb").read() == array.tobytes()
            assert np.array_equal(np.load(path.removesuffix(".raw") + ".npy"), array)
        listed = subprocess.run(["find", str(mnt), "-type", "f"], capture_output=True,
                                text=True, check=True).stdout.split("\n")[:-1]
        # split("\n"), not splitlines(): a name may hold U+0085 or U+2028, which the
        # escaping rule leaves as they are and splitlines() would break on
        assert len(listed) == 2 * len(names) + 3       # header.bin, metadata.json, files/m.safetensors
    finally:
        assert run_tensorfs("unmount", mnt).returncode == 0


def test_debug_shows_the_traceback(tmp_path):
    model = tmp_path / "bad.gguf"
    model.write_bytes(b"GGUF\x03\x00\x00\x00" + b"\xff" * 8)
    quiet = run_tensorfs("inspect", model)
    assert quiet.returncode == 1 and "Traceback" not in quiet.stderr
    loud = run_tensorfs("--debug", "inspect", model)
    assert loud.returncode == 1 and "Traceback" in loud.stderr and "GGUFError" in loud.stderr


# -- messages that say what to do ------------------------------------------------------------

def _usage_line_of(command: str, result) -> str:
    line = usage_error(result)
    assert result.stderr.splitlines()[0].startswith(f"usage: tensorfs {command} [OPTIONS] ")
    return line


@pytest.mark.parametrize("command,args", [
    ("mount", ["m"]), ("mount", ["m", "d", "--frob"]), ("unmount", []),
    ("inspect", ["m", "--json=1"]), ("list", ["extra"]), ("hash", []), ("stats", []),
    ("diff", ["a"]), ("mount", ["m", "d", "-o", "rw"]),
    ("inspect", ["m", "--storage-option", "a=b"]), ("stats", ["m", "--storage-option", "a=b"]),
    ("inspect", ["https://h/m.gguf", "--timeout", "0"])])
def test_every_usage_error_shows_the_commands_usage_line(command, args, tmp_path):
    """Whether argparse, an -o check or a check after parsing refused it."""
    (tmp_path / "d").mkdir()
    _usage_line_of(command, run_tensorfs(command, *args, cwd=tmp_path))


@pytest.mark.parametrize("words", [["--cache-size", "-5G"], ["--cache-size=-5G"],
                                   ["--cache", "-5G"], ["--disk-cache", "/tmp/c:-1G"]])
def test_a_negative_size_is_said_to_be_negative(words, tmp_path):
    line = _usage_line_of("mount", run_tensorfs("mount", "m.gguf", tmp_path, *words))
    assert "cannot be negative" in line and "expected one argument" not in line


@pytest.mark.parametrize("words,said", [(["--cache-size", "0"], "64K or more"),
                                        (["--cache-size", "1k"], "64K or more"),
                                        (["--disk-cache", "/tmp/c:0"], "keeps nothing")])
def test_a_size_too_small_to_work_is_refused_saying_why(words, said, tmp_path):
    line = _usage_line_of("mount", run_tensorfs("mount", "m.gguf", tmp_path, *words))
    assert said in line


@pytest.mark.parametrize("command", ["inspect", "list", "hash", "stats", "diff", "unmount"])
def test_debug_help_says_what_debug_does_for_that_command(command):
    text = " ".join(run_tensorfs(command, "--help").stdout.split())
    assert "--debug show the traceback of a failure instead of one line" in text
    assert "FUSE" not in text.split("--debug", 1)[1].split("--", 1)[0]


def test_mount_debug_help_names_fuse_errors():
    text = " ".join(run_tensorfs("mount", "--help").stdout.split())
    assert "--debug log every FUSE error" in text


@pytest.mark.parametrize("kind", ["text", "empty", "passwd"])
def test_a_file_as_mount_point_is_named_as_a_mount_point_problem(kind, tmp_path):
    model = tmp_path / "m.safetensors"
    write_safetensors(model)
    target = {"text": tmp_path / "notes.txt", "empty": tmp_path / "empty",
              "passwd": "/etc/passwd"}[kind]
    if kind == "text":
        target.write_text("some notes\n")
    elif kind == "empty":
        target.write_bytes(b"")
    line = _assert_one_error_line(run_tensorfs("mount", model, target))
    assert line == f"tensorfs: error: {target}: not a directory: the mount point is an empty directory"
    assert "model" not in line


def test_a_model_as_mount_point_is_taken_for_swapped_arguments(tmp_path):
    model = tmp_path / "m.safetensors"
    write_safetensors(model)
    other = tmp_path / "n.safetensors"
    write_safetensors(other)
    line = _assert_one_error_line(run_tensorfs("mount", model, other))
    assert "not a directory" in line and "looks like a model" in line


@pytest.mark.parametrize("size", ["64K", "4M", "8388607"])
def test_a_cache_size_too_small_for_a_remote_model_is_refused_naming_the_minimum(size, tmp_path):
    """A remote model's cache holds the block being read and the one fetched ahead of it
    (tensorfs.budget.REMOTE_MIN_BYTES): less is refused before any request, in one line."""
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    result = run_tensorfs("mount", "http://127.0.0.1:9/m.safetensors", mnt, "--cache-size", size,
                          "--timeout", "2")
    lines = result.stderr.strip().splitlines()
    assert result.returncode != 0 and len(lines) == 1, result.stderr
    assert "too small for a remote model" in lines[0] and "8M or more" in lines[0], lines
    assert not os.listdir(mnt)
