"""An index cannot reach outside its directory (issue 21, docs/reference/inputs.md "Shard
names"): every name a model's own files or a directory listing give for a sibling file is
checked by one rule (``tensorfs.sources.location.name_problem``) before anything is opened, the same
for a local directory and every transport.  Where the name is a real file here, the old code
opened it: each case below is a file the mount must not read."""

from __future__ import annotations

import json
import os

import pytest

from tensorfs.loading.shards import MAX_SHARDS
from tensorfs.sources.location import MAX_NAME_BYTES, name_problem
from tests.support.shards import (
    INDEX,
    one,
    refused_by_both,
    write_gguf_shard,
    write_hf_shards,
    write_split_gguf,
)

# Names a hostile index may give, each a different way of leaving the directory or of
# meaning another file to some server; the comment says who would decode it.
HOSTILE = [
    "..%2Fsecret%2Fx.safetensors",          # nginx decodes %2F: /secret/x.safetensors
    "..%252Fsecret%252Fx.safetensors",      # decoded twice by a proxy and a server
    "%2e%2e",                               # ".." once decoded
    "x%00.safetensors",                     # NUL once decoded
    "..\\secret\\x.safetensors",            # a separator to some servers
    "．．／secret.safetensors",             # fullwidth: "../secret..." after NFKC
    "．．",                                 # ".." after NFKC
    "sub/x.safetensors",                    # not in the directory
    "./x.safetensors",
    "../x.safetensors",
    "/etc/x.safetensors",
    ".",
    "..",
    "",
    "x\x00.safetensors",
    "x\n.safetensors",                      # a second line in every message
    "x\x1b[2J.safetensors",                 # a terminal escape
    "x\u202e.safetensors",                  # a right-to-left override
    "x\u2028.safetensors",                  # a line separator
    "a" * (MAX_NAME_BYTES + 1),
]
PLAIN = ["model-00001-of-00002.safetensors", "model.safetensors", "100%.safetensors",
         "model v2.safetensors", "модель.safetensors", "a" * MAX_NAME_BYTES, "...x", "%zz"]


@pytest.mark.parametrize("name", HOSTILE, ids=repr)
def test_the_one_rule_refuses_every_hostile_name(name):
    assert name_problem(name) is not None


@pytest.mark.parametrize("name", PLAIN, ids=repr)
def test_the_one_rule_accepts_real_shard_names(name):
    assert name_problem(name) is None


def _local_name(name: str) -> bool:
    """Whether ``name`` can be a file in a local directory (no / or NUL, not . or ..)."""
    return name not in ("", ".", "..") and "/" not in name and "\0" not in name \
        and len(name.encode()) <= 255


@pytest.mark.parametrize("name", HOSTILE, ids=repr)
def test_an_index_naming_a_hostile_shard_is_refused_in_one_line(tmp_path, name):
    index, _, _ = write_hf_shards(tmp_path / "m", 1)
    shard = tmp_path / "m" / "model-00001-of-00001.safetensors"
    if _local_name(name):       # the file is there: only the rule keeps it from being read
        os.replace(shard, tmp_path / "m" / name)
    doc = json.loads(index.read_text())
    doc["weight_map"] = {tensor: name for tensor in doc["weight_map"]}
    index.write_text(json.dumps(doc))
    line = refused_by_both(tmp_path, index, "a shard must be a plain file name in the same directory")
    assert "\n" not in line and "\x1b" not in line


def test_a_split_gguf_whose_siblings_would_have_hostile_names_is_refused(tmp_path):
    files, _ = write_split_gguf(tmp_path / "s", per_shard=4)
    renamed = []
    for path in files:      # a prefix that decodes to "..": the siblings' names carry it
        target = path.with_name(path.name.replace("model", "x%2e%2e", 1))
        os.replace(path, target)
        renamed.append(target)
    refused_by_both(tmp_path, renamed[0], "x%2e%2e-00002-of-00002.gguf", "percent-escape")


def test_a_directory_listing_with_a_hostile_name_is_not_a_candidate(tmp_path):
    d = tmp_path / "d"
    index, _, _ = write_hf_shards(d, 1)
    os.replace(index, d / ("%2e%2e" + "x.safetensors.index.json"))
    os.replace(d / "model-00001-of-00001.safetensors", d / "x%2Fy.safetensors")
    refused_by_both(tmp_path, d, "directory holds no", "2 left out", "percent-escape")


def test_an_index_naming_more_shards_than_the_limit_is_refused_before_opening_any(tmp_path):
    d = tmp_path / "many"
    d.mkdir()
    weight_map = {f"t{i}": f"model-{i:06d}.safetensors" for i in range(MAX_SHARDS + 1)}
    (d / INDEX).write_text(json.dumps({"weight_map": weight_map}))
    # none of the shards exists: the count is refused first, not the missing files
    refused_by_both(tmp_path, d / INDEX, f"{MAX_SHARDS + 1} shards: at most {MAX_SHARDS}")


def test_a_split_gguf_counting_more_shards_than_the_limit_is_refused(tmp_path):
    count = MAX_SHARDS + 1
    first = write_gguf_shard(tmp_path / f"x-00001-of-{count:05d}.gguf", one("a"), no=0,
                             count=count)
    refused_by_both(tmp_path, first, f"{count} shards: at most {MAX_SHARDS}")


def test_plain_names_still_mount(tmp_path, mount):
    index, tensors, _ = write_hf_shards(tmp_path / "m", 2)
    for k, name in enumerate(["100%.safetensors", "модель v2.safetensors"], start=1):
        old = f"model-{k:05d}-of-00002.safetensors"
        os.replace(tmp_path / "m" / old, tmp_path / "m" / name)
        index.write_text(index.read_text().replace(old, name))
    mnt = mount(index)
    name = next(iter(tensors))
    assert (mnt / name.replace(".", "/")).read_bytes() == tensors[name].tobytes()
