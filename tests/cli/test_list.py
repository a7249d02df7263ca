"""``tensorfs list`` as a person reads it: which file changed and what still reads, columns
in line whatever the lengths, and counts that agree with their nouns."""

from __future__ import annotations

import errno
import json
import os

from safetensors.numpy import load_file

from tests.support import read_errno, run_tensorfs
from tests.support.models import write_safetensors


def _row(mnt) -> dict:
    rows = json.loads(run_tensorfs("list", "--json").stdout)
    return next(r for r in rows if r["mountpoint"] == str(mnt.resolve()))


def _line(mnt) -> str:
    return next(line for line in run_tensorfs("list").stdout.splitlines()
                if line.startswith(str(mnt.resolve()) + " "))


def test_a_changed_companion_is_named_and_the_tensors_still_read(tmp_path, mount):
    directory = tmp_path / "model"
    directory.mkdir()
    write_safetensors(directory / "model.safetensors")
    config = directory / "config.json"
    config.write_text('{"model_type": "llama"}')
    mnt = mount(directory)
    assert (mnt / "files" / "config.json").read_text() == config.read_text()
    config.write_text('{"model_type": "mamba"}')        # same size: rewritten in place
    os.utime(config, (1, 1))
    assert read_errno(mnt / "files" / "config.json") == errno.EIO
    tensors = load_file(str(directory / "model.safetensors"))
    assert (mnt / "lm_head" / "weight").read_bytes() == tensors["lm_head.weight"].tobytes()
    row = _row(mnt)
    assert row["state"] == "source changed"
    reason = row["reason"]
    assert reason.startswith(f"{config} (files/config.json) changed: rewritten in place"), reason
    assert reason.endswith("it reads EIO, the tensors serve"), reason
    assert "model file" not in reason and "every read" not in reason
    assert _line(mnt).endswith("source changed: " + reason)


def test_columns_stay_in_line_past_any_width(tmp_path, mount):
    model = tmp_path / "m.safetensors"
    write_safetensors(model)
    short = mount(model, name="s")
    long = mount(model, name="a-mount-point-with-a-name-much-longer-than-sixty-characters-" * 2)
    lines = run_tensorfs("list").stdout.splitlines()
    ours = [lines[0]] + [line for line in lines[1:]
                         if line.split()[0] in (str(short.resolve()), str(long.resolve()))]
    assert len(ours) == 3
    # each column starts at the same place on every line: where the header puts it
    for column in ("SOURCE", "PID", "TENSORS", "STATE"):
        at = ours[0].index(column)
        for line in ours[1:]:
            assert line[at - 2:at] == "  " and line[at] != " ", (column, ours)
    assert all(not line.endswith(" ") for line in ours)


def test_the_log_counts_one_tensor_as_one(tmp_path, mount):
    import numpy as np
    from safetensors.numpy import save_file

    model = tmp_path / "one.safetensors"
    save_file({"w": np.ones(4, dtype=np.float32)}, str(model))
    log = tmp_path / "log"
    mount(model, "--log", log)
    text = log.read_text()
    assert "(1 tensor)" in text and "(1 tensors)" not in text


def test_what_still_reads_is_said_for_each_kind_of_file():
    """The words of ``list`` for each file a source may report, from the sources' own
    reasons (tensorfs/sources/local.py, tensorfs/sources/remote.py)."""
    from tensorfs.status import explained

    files = {"/m/a.safetensors": {"name": "files/a.safetensors", "tensors": 3},
             "/m/b.safetensors": {"name": "files/b.safetensors", "tensors": 1},
             "/m/config.json": {"name": "files/config.json", "tensors": 0}}
    local = ("the model file was rewritten in place (same size, but its mtime changed) since "
             "it was mounted: every read fails with EIO")
    assert explained(f"/m/a.safetensors: {local}", files, 4) == (
        "/m/a.safetensors (files/a.safetensors) changed: rewritten in place (same size, but "
        "its mtime changed) since it was mounted; it and its 3 tensors read EIO, the other "
        "1 tensor serves")
    assert explained(f"/m/b.safetensors: {local}", files, 4).endswith(
        "it and its 1 tensor read EIO, the other 3 tensors serve")
    assert explained(f"/m/a.safetensors: {local}", files, 3).endswith("it and every tensor read EIO")
    assert explained(f"/m/config.json: {local}", files, 4).endswith(
        "; it reads EIO, the tensors serve")
    remote = "the object's ETag changed; every read of it now fails with EIO (mount again)"
    assert explained(f"/m/config.json: {remote}", files, 4) == (
        "/m/config.json (files/config.json) changed: the object's ETag changed; it reads EIO, "
        "the tensors serve")
    renamed = "another file was renamed over it; the file as mounted still serves"
    assert explained(f"/m/config.json: {renamed}", files, 4) == \
        f"/m/config.json (files/config.json): {renamed}"
    assert explained("/elsewhere: something", files, 4) == "/elsewhere: something"


def test_a_companion_changed_or_replaced_before_its_first_read_is_named(tmp_path, mount):
    """A companion is opened at its first read: one rewritten, or replaced by a rename, since
    the mount reads EIO for good, and ``list`` names it (it said "serving").  Files no GGUF
    plan reads (config.json and the tokenizer's are read at the mount, for files/'s GGUF)."""
    directory = tmp_path / "model"
    directory.mkdir()
    write_safetensors(directory / "model.safetensors")
    config, tokenizer = directory / "notes.json", directory / "vocab.json"
    config.write_text('{"model_type": "llama"}')
    tokenizer.write_text('{"version": "1.0"}')
    mnt = mount(directory)
    assert _row(mnt)["state"] == "serving"
    config.write_text('{"model_type": "mamba", "more": 1}')       # rewritten in place
    new = directory / "vocab.json.part"
    new.write_text('{"version": "2.0"}')
    new.rename(tokenizer)                                          # replaced by a rename
    assert read_errno(mnt / "files" / "notes.json") == errno.EIO
    assert read_errno(mnt / "files" / "vocab.json") == errno.EIO
    row = _row(mnt)
    assert row["state"] == "source changed", row
    for path, name in ((config, "notes.json"), (tokenizer, "vocab.json")):
        said = f"{path} (files/{name}) changed: replaced or rewritten since it was mounted"
        assert said in row["reason"], row
    assert row["reason"].count("it reads EIO, the tensors serve") == 2, row
    tensors = load_file(str(directory / "model.safetensors"))
    assert (mnt / "lm_head" / "weight").read_bytes() == tensors["lm_head.weight"].tobytes()
    assert _line(mnt).endswith("source changed: " + row["reason"])



def test_a_deleted_companion_is_named(tmp_path, mount):
    directory = tmp_path / "model"
    directory.mkdir()
    write_safetensors(directory / "model.safetensors")
    config = directory / "notes.json"             # a file no GGUF plan reads at the mount
    config.write_text('{"model_type": "llama"}')
    mnt = mount(directory)
    config.unlink()
    assert read_errno(mnt / "files" / "notes.json") == errno.EIO
    row = _row(mnt)
    assert row["state"] == "source changed", row
    assert row["reason"] == (f"{config} (files/notes.json) changed: deleted or renamed away "
                             "since it was mounted; it reads EIO, the tensors serve"), row


def test_a_directory_model_is_listed_as_the_directory_named(tmp_path, mount):
    """docs/reference/cli.md: SOURCE is the model as the user named it, a directory too (it showed the
    file the directory resolved to)."""
    directory = tmp_path / "model"
    directory.mkdir()
    write_safetensors(directory / "model.safetensors")
    (directory / "config.json").write_text("{}")
    mnt = mount(directory)
    assert _row(mnt)["source"] == str(directory)
    assert _line(mnt).split()[1] == str(directory)
