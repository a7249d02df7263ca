"""What a newcomer meets: the files that sit beside a model, or that are a model in another
format, each refused by ``inspect``, ``mount`` and ``tensorfs.open`` with one line saying
what the file is."""

from __future__ import annotations

import json
import os
import pickle
import zipfile

import numpy as np
import pytest

import tensorfs
from tests.support import fuse_mounts_under, run_tensorfs


def _torch_zip(path):
    """The layout torch.save has written since PyTorch 1.6: a zip holding data.pkl and the
    storages (torch itself is not a test dependency)."""
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as z:
        z.writestr("archive/data.pkl", pickle.dumps({"w": "storage 0"}, protocol=2))
        z.writestr("archive/data/0", np.arange(16, dtype=np.float32).tobytes())
        z.writestr("archive/version", "3\n")


def _legacy_pickle(protocol):
    def write(path):
        path.write_bytes(pickle.dumps({"state_dict": {"w": list(range(64))}}, protocol=protocol))
    return write


CASES = {
    "empty": (lambda p: p.write_bytes(b""), "model.safetensors", ["the file is empty"]),
    # a torch.save zip is read (docs/reference/pytorch.md); this one holds no tensor
    "torch-zip": (_torch_zip, "pytorch_model.bin", ["PyTorch checkpoint", "no tensor"]),
    **{f"pickle-{n}": (_legacy_pickle(n), "model.pt", ["Python pickle", "torch.save",
                                                       "does not run pickles"])
       for n in (2, 3, 4, 5)},
    "config.json": (lambda p: p.write_text(json.dumps(
        {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 32000})),
        "config.json", ["not a safetensors index"]),
    "tokenizer.json": (lambda p: p.write_text(json.dumps(
        {"version": "1.0", "added_tokens": [], "model": {"type": "BPE", "vocab": {"a": 0}}})),
        "tokenizer.json", ["not a safetensors index"]),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_each_lookalike_is_named_in_one_line(tmp_path, case):
    write, filename, expect = CASES[case]
    model = tmp_path / filename
    write(model)
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    inspected = run_tensorfs("inspect", model)
    mounted = run_tensorfs("mount", model, mnt)
    for result in (inspected, mounted):
        assert result.returncode == 1, result.stdout
        lines = result.stderr.splitlines()
        assert len(lines) == 1 and lines[0].startswith(f"tensorfs: error: {model}: "), lines
        for text in expect:
            assert text in lines[0], lines[0]
        assert "weight_map" not in lines[0] or "without" in lines[0]
    assert mounted.stderr == inspected.stderr
    assert fuse_mounts_under(tmp_path) == [] and os.listdir(mnt) == []
    with pytest.raises(tensorfs.ModelError) as caught:
        tensorfs.open(model)
    assert inspected.stderr.strip() == f"tensorfs: error: {caught.value}"


def test_an_index_with_a_broken_weight_map_is_still_called_an_index(tmp_path):
    index = tmp_path / "model.safetensors.index.json"
    index.write_text(json.dumps({"metadata": {}, "weight_map": ["a", "b"]}))
    result = run_tensorfs("inspect", index)
    assert result.returncode == 1
    assert 'index "weight_map" must be an object' in result.stderr and "array" in result.stderr
