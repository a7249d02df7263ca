"""Shard names and shard counts against a real server (issue 21, docs/reference/inputs.md "Shard
names" and "Cost per shard"): an index served over HTTP, with the user's basic-auth
credentials in its URL, cannot make tensorfs request anything outside the index's directory,
and a many-shard index costs memory by the shard's header, not by the bytes fetched."""

from __future__ import annotations

import json
import subprocess

import numpy as np
import pytest
from safetensors.numpy import save

from tests.support import TENSORFS
from tests.support.servers import BASIC_PASSWORD, BASIC_USER
from tests.support.shards import INDEX

HOSTILE = ["..%2Fsecret%2Fx.safetensors", "..%252Fsecret%252Fx.safetensors",
           "%2e%2e%2fsecret%2fx.safetensors", "..\\secret\\x.safetensors",
           "．．／secret／x.safetensors"]


def _basic_url(nginx, rel: str) -> str:
    return nginx.url.replace("http://", f"http://{BASIC_USER}:{BASIC_PASSWORD}@") + "/basic/" + rel


def _inspect(url: str, env) -> subprocess.CompletedProcess:
    return subprocess.run([*TENSORFS, "inspect", url], capture_output=True, text=True,
                          timeout=120, env=env, stdin=subprocess.DEVNULL)


@pytest.mark.parametrize("name", HOSTILE, ids=repr)
def test_a_remote_index_cannot_reach_outside_its_directory(nginx, remote_env, name):
    shard = save({"w": np.arange(4, dtype=np.float32)})
    case = f"names-{abs(hash(name)) % 10**8}"
    nginx.put(f"files/{case}/secret/x.safetensors", shard)       # what the attack wants
    nginx.put(f"files/{case}/m/{INDEX}", json.dumps({"weight_map": {"w": name}}).encode())
    mark = nginx.log_mark()
    result = _inspect(_basic_url(nginx, f"{case}/m/{INDEX}"), remote_env)
    assert result.returncode == 1, result.stdout
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and "a shard must be a plain file name" in lines[0], result.stderr
    assert BASIC_PASSWORD not in result.stderr
    asked = [r["uri"] for r in nginx.wait_quiet(mark)]
    assert asked and all(uri.endswith(INDEX) for uri in asked), asked


_MEASURE = """
import resource, subprocess, sys
result = subprocess.run(sys.argv[1:], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
print(result.returncode, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)
"""


def _max_rss_kib(argv, env) -> int:
    """The largest RSS of ``argv`` run from a small process (a fork of pytest would count
    pytest's own memory: the high-water mark survives exec)."""
    out = subprocess.run(["python3", "-c", _MEASURE, *argv], env=env, capture_output=True,
                         text=True, timeout=300)
    code, rss = map(int, out.stdout.split())
    assert code == 0, out.stderr
    return rss


@pytest.mark.slow
def test_memory_grows_with_the_shards_headers_not_with_what_was_fetched(nginx, remote_env):
    """400 shards of 256 KiB: each first answer is 64 KiB; before, every one was kept until
    the whole set was loaded (+26 MB here, +265 MB for 2000 shards in the report)."""
    n = 400
    data = np.zeros(256 << 10, dtype=np.uint8)
    weight_map = {}
    for k in range(n):
        name = f"model-{k + 1:05d}-of-{n:05d}.safetensors"
        nginx.put(f"files/many/{name}", save({f"t{k}": data}))
        weight_map[f"t{k}"] = name
    nginx.put(f"files/many/{INDEX}", json.dumps({"weight_map": weight_map}).encode())
    nginx.put(f"files/one/{INDEX}", json.dumps({"weight_map": {"t0": "a.safetensors"}}).encode())
    nginx.put("files/one/a.safetensors", save({"t0": data}))
    base = _max_rss_kib([*TENSORFS, "inspect", f"{nginx.url}/files/one/{INDEX}"], remote_env)
    many = _max_rss_kib([*TENSORFS, "inspect", f"{nginx.url}/files/many/{INDEX}"], remote_env)
    print(f"max RSS: one shard {base} KiB, {n} shards {many} KiB")
    assert many - base < n * 24, (base, many)      # 64 KiB per shard before; 24 KiB: headroom
