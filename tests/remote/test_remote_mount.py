"""Remote models mounted through the real command (docs/reference/remote.md) over plain HTTP (nginx), the
Hugging Face Hub's layout (nginx behind HF_ENDPOINT) and S3 (moto), in every form: one file,
a sharded index, a split GGUF's first shard, a repo or prefix as a directory.  Each mount's
raw files and .npy views equal the reference readers' (safe_open, GGUFReader,
gguf.quants.dequantize) on the same bytes, and its whole tree equals the local mount's."""

from __future__ import annotations

import json
import os
import random
import threading

import numpy as np
import pytest

from tests.support import run_tensorfs
from tests.support.remote_checks import (
    MiB,
    assert_matches_reference,
    assert_mount_fetched_headers_only,
    assert_same_tree,
    doc_of,
    header_size,
    url_of,
    without_remote_keys,
)
from tests.support.servers import parse_range

KEYS = ["safetensors", "mixed", "sharded", "split"]


def log_prefix(transport: str, nginx, key: str) -> str:
    """What the URIs of a model's files start with in nginx's access log."""
    if transport == "http":
        return f"/files/{key}/"
    return f"/tfs/{key}/resolve/{nginx.hub[key].main}/"


@pytest.mark.parametrize("key", KEYS)
@pytest.mark.parametrize("transport", ["http", "hf", "s3"])
def test_a_remote_model_reads_as_the_reference_readers_and_the_local_mount(
        transport, key, nginx, s3, corpus, rmount, mount):
    model = corpus.models[key]
    url = url_of(transport, nginx, key, model.entry)
    mark = nginx.log_mark()
    rmnt = rmount(url)
    if transport != "s3":
        log = nginx.requests(mark)
        assert_mount_fetched_headers_only(log, model.files, log_prefix(transport, nginx, key))
    assert_matches_reference(rmnt, model.files, model.expected)
    assert_same_tree(rmnt, mount(model.local))
    doc = doc_of(rmnt)
    assert doc["source"] == url
    # the version pinned at mount: each shard's, or the one file's (docs/reference/remote.md)
    versions = [s["version"] for s in doc["shards"]] if "shards" in doc else [doc["source_version"]]
    assert all(versions), doc
    if transport == "hf":
        assert versions == [nginx.hub[key].main] * len(versions)        # the commit


@pytest.mark.parametrize("form", ["hf://tfs/sharded@main", "hf://tfs/split@COMMIT",
                                  "hf://tfs/safetensors",
                                  "s3://models/sharded/", "s3://models/split"])
def test_a_repo_or_prefix_mounts_as_its_directory(form, nginx, s3, corpus, rmount, mount):
    key = form.split("/")[3].split("@")[0]
    url = form.replace("COMMIT", nginx.hub[key].main)
    model = corpus.models[key]
    rmnt = rmount(url)
    assert_matches_reference(rmnt, model.files, model.expected)
    assert_same_tree(rmnt, mount(model.folder))
    assert doc_of(rmnt)["source"] == url


def test_a_tensor_of_several_blocks_reads_back_at_every_offset(nginx, corpus, rmount):
    """Random ranges from 4 threads, across block boundaries, against the file's bytes."""
    model = corpus.models["big"]
    source = model.local.read_bytes()
    rmnt = rmount(f"{nginx.url}/files/big/big.safetensors")
    entries = list(doc_of(rmnt)["tensors"].values())
    failures = []

    def reader(seed):
        rng = random.Random(seed)
        for _ in range(150):
            entry = rng.choice(entries)
            offset = rng.randrange(entry["nbytes"])
            size = rng.randrange(1, min(entry["nbytes"] - offset, 3 * MiB) + 1)
            with open(rmnt / entry["path"], "rb") as f:
                got = os.pread(f.fileno(), size, offset)
            if got != source[entry["offset"] + offset:entry["offset"] + offset + size]:
                failures.append((entry["path"], offset, size))

    threads = [threading.Thread(target=reader, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert failures == []
    assert_matches_reference(rmnt, model.files)


def test_mount_fetches_the_header_and_a_read_fetches_its_tensor(nginx, corpus, rmount):
    """Mount: ≤ header + 1 MiB.  numpy.load of one small tensor: its bytes and nothing far
    from them (at most one 4 MiB block beyond, docs/reference/remote.md)."""
    model = corpus.models["big"]
    mark = nginx.log_mark()
    rmnt = rmount(f"{nginx.url}/files/big/big.safetensors")
    log = nginx.requests(mark)
    assert_mount_fetched_headers_only(log, model.files, "/files/big/")
    entry = doc_of(rmnt)["tensors"]["c.mid"]
    mark = nginx.log_mark()
    values = np.load(rmnt / (entry["path"] + ".npy"))
    assert values.shape == (300, 1000)
    log = nginx.wait_quiet(mark)
    ranges = [parse_range(r["range"]) for r in log if r["method"] == "GET"]
    assert ranges and all(ranges), log                       # only ranged reads
    sent = sum(r["bytes"] for r in log)
    assert entry["nbytes"] <= sent <= entry["nbytes"] + 4 * MiB, log
    lo = min(a for a, _ in ranges)
    hi = max(b for _, b in ranges)
    assert lo <= entry["offset"] and hi >= entry["offset"] + entry["nbytes"] - 1


@pytest.mark.parametrize("transport", ["http", "hf", "s3"])
def test_inspect_of_a_url_says_what_inspect_of_the_local_file_says(transport, nginx, s3, corpus,
                                                                   remote_env):
    for key in ("mixed", "sharded"):
        model = corpus.models[key]
        url = url_of(transport, nginx, key, model.entry)
        remote = run_tensorfs("inspect", url, "--json", env=remote_env)
        local = run_tensorfs("inspect", model.local, "--json")
        assert remote.returncode == 0 and remote.stderr == "", remote.stderr
        doc = json.loads(remote.stdout)
        assert without_remote_keys(doc) == without_remote_keys(json.loads(local.stdout))
        assert doc["source"] == url
        remote = run_tensorfs("inspect", url, env=remote_env)
        local = run_tensorfs("inspect", model.local)
        assert remote.returncode == 0, remote.stderr
        # the first line names the file (the URL, the path); the rest is the same
        assert remote.stdout.splitlines()[1:] == local.stdout.splitlines()[1:]
        assert url in remote.stdout.splitlines()[0]


def test_inspect_fetches_headers_only(nginx, corpus, remote_env):
    model = corpus.models["split"]
    mark = nginx.log_mark()
    result = run_tensorfs("inspect", f"{nginx.url}/files/split/{model.entry}", env=remote_env)
    assert result.returncode == 0, result.stderr
    assert_mount_fetched_headers_only(nginx.requests(mark), model.files, "/files/split/")
    assert sum(header_size(p) for p in model.files) > 0
