"""A download cut short is called one: wherever a header (safetensors or GGUF) claims more
bytes than the file has, the one error line says the file looks truncated and what to check
(issue 30, "Errors that say what to do").  Every cut of a reference-written file is tried
through ``tensorfs.open``; the command's line and a shard of an index through ``tensorfs``;
a file longer than its header says is refused without being called truncated."""

from __future__ import annotations

import pytest

import tensorfs
from tensorfs.errors import ModelError
from tests.support import run_tensorfs
from tests.support.models import write_gguf, write_safetensors

TRUNCATED = "the file looks truncated"
# below these sizes no format can be told from the bytes (GGUF's magic; safetensors' length
# and the header's first "{")
SHORTEST_TOLD = {"safetensors": 9, "gguf": 4}


def _write(kind: str, path):
    (write_safetensors if kind == "safetensors" else write_gguf)(path)
    return path.read_bytes()


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["safetensors", "gguf"])
def test_every_cut_of_a_model_file_is_called_truncated(kind, tmp_path):
    data = _write(kind, tmp_path / f"full.{kind}")
    cut_file = tmp_path / f"cut.{kind}"
    not_said = []
    for cut in range(SHORTEST_TOLD[kind], len(data)):
        cut_file.write_bytes(data[:cut])
        with pytest.raises(ModelError) as refused:
            tensorfs.open(cut_file).close()
        if TRUNCATED not in str(refused.value) or "\n" in str(refused.value):
            not_said.append((cut, str(refused.value)))
    assert not_said == []


@pytest.mark.parametrize("kind", ["safetensors", "gguf"])
def test_the_commands_line_says_truncated_and_what_to_check(kind, tmp_path):
    data = _write(kind, tmp_path / f"full.{kind}")
    cut = tmp_path / f"cut.{kind}"
    cut.write_bytes(data[:len(data) * 2 // 3])
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    for args in (["inspect", cut], ["mount", cut, mnt]):
        result = run_tensorfs(*args)
        assert result.returncode == 1
        lines = result.stderr.splitlines()
        assert len(lines) == 1 and lines[0].startswith(f"tensorfs: error: {cut}: "), result.stderr
        assert TRUNCATED in lines[0] and "compare its size" in lines[0], lines[0]


def test_a_truncated_shard_is_named(tmp_path):
    from tests.support.shards import write_hf_shards

    index, _, weight_map = write_hf_shards(tmp_path / "sharded")
    shard = index.parent / sorted(set(weight_map.values()))[-1]
    shard.write_bytes(shard.read_bytes()[:-1])
    result = run_tensorfs("inspect", index)
    assert result.returncode == 1
    assert shard.name in result.stderr and TRUNCATED in result.stderr, result.stderr


def test_a_file_longer_than_its_header_says_is_not_called_truncated(tmp_path):
    path = tmp_path / "long.safetensors"
    path.write_bytes(_write("safetensors", tmp_path / "full.safetensors") + b"\0" * 16)
    with pytest.raises(ModelError) as refused:
        tensorfs.open(path).close()
    assert TRUNCATED not in str(refused.value), str(refused.value)
