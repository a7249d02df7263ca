"""``tensorfs list`` as a person reads it: which file changed and what still reads, columns
in line whatever the lengths, and counts that agree with their nouns."""

from __future__ import annotations

import errno
import json
import os

from safetensors.numpy import load_file

from tests.models import write_safetensors
from tests.support import read_errno, run_tensorfs


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
