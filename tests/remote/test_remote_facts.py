"""``tensorfs hash``, ``stats`` and ``diff`` of a URL: the same answers as
for the local files with the same bytes, over plain HTTP from nginx (hf:// and s3:// for one
model), each byte fetched once, no credential in what is printed."""

from __future__ import annotations

import json

import pytest

from tensorfs.sources.transports.base import PROBE_BYTES
from tests.support import run_tensorfs
from tests.support.remote_checks import url_of


def tfs(*args, env):
    return run_tensorfs(*args, env=env, timeout=300)


@pytest.mark.parametrize("key", ["mixed", "big", "sharded", "split", "safetensors"])
def test_hash_of_a_url_is_hash_of_the_local_files(key, nginx, corpus, remote_env):
    model = corpus.models[key]
    url = url_of("http", nginx, key, model.entry)
    mark = nginx.log_mark()
    remote = tfs("hash", "--all", "--uuid", url, env=remote_env)
    assert remote.returncode == 0 and remote.stderr == "", remote.stderr
    local = tfs("hash", "--all", "--uuid", model.local, env=remote_env)
    assert remote.stdout == local.stdout.replace(str(model.local), url)
    # each byte fetched once: no more than the files hold, but for each file's first
    # request (its header, PROBE_BYTES), which the block cache does not keep
    fetched = sum(r["bytes"] for r in nginx.wait_quiet(mark) if r["status"] in (200, 206))
    assert fetched <= sum(f.stat().st_size + PROBE_BYTES for f in model.files)
    manifest = model.folder.parent / f"{key}.manifest"
    manifest.write_text(remote.stdout)
    checked = tfs("hash", "--check", manifest, url, env=remote_env)
    assert checked.returncode == 0, checked.stdout + checked.stderr


@pytest.mark.parametrize("transport", ["hf", "s3"])
def test_hash_over_the_hub_and_s3(transport, nginx, s3, corpus, remote_env):
    model = corpus.models["mixed"]
    url = url_of(transport, nginx, "mixed", model.entry)
    remote = tfs("hash", "--sha256", url, env=remote_env)
    local = tfs("hash", "--sha256", model.local, env=remote_env)
    assert remote.returncode == 0, remote.stderr
    assert remote.stdout == local.stdout.replace(str(model.local), url)


def test_stats_and_diff_of_a_url(nginx, corpus, remote_env):
    model = corpus.models["mixed"]
    url = url_of("http", nginx, "mixed", model.entry)
    remote = json.loads(tfs("stats", "--json", url, env=remote_env).stdout)
    local = json.loads(tfs("stats", "--json", model.local, env=remote_env).stdout)
    assert remote["model"] == url and remote["tensors"] == local["tensors"]
    same = tfs("diff", url, model.local, env=remote_env)
    assert same.returncode == 0, same.stderr
    assert same.stdout.splitlines()[-1] == f"# {len(local['tensors'])} names: " \
                                           f"{len(local['tensors'])} identical"
    other = corpus.models["gguf"]
    differ = tfs("diff", "--json", url, url_of("http", nginx, "gguf", other.entry),
                 env=remote_env)
    assert differ.returncode == 1, differ.stderr
    statuses = {r["status"] for r in json.loads(differ.stdout)["tensors"]}
    assert statuses == {"only_in_a", "only_in_b"}


def test_credentials_are_not_printed(nginx, corpus, remote_env):
    model = corpus.models["mixed"]
    url = url_of("http", nginx, "mixed", model.entry)
    with_secret = url.replace("http://", "http://user:s3cret@") + "?token=s3cret"
    result = tfs("hash", "--sha256", with_secret, env=remote_env)
    assert result.returncode == 0, result.stderr
    assert "s3cret" not in result.stdout + result.stderr
    assert result.stdout.splitlines()[-1].endswith(f"  {url}")
    missing = tfs("diff", with_secret, url.replace("mixed.gguf", "none.gguf"), env=remote_env)
    assert missing.returncode == 2 and "s3cret" not in missing.stderr
    assert missing.stderr.count("\n") == 1
