"""The test servers themselves, checked with the clients tensorfs builds on (fsspec's HTTP
filesystem, huggingface_hub's HfFileSystem, s3fs) and plain urllib: if one of these fails,
the remote tests' failures say nothing about tensorfs."""

from __future__ import annotations

import base64
import http.client
import json
import os
import socket
import time
import urllib.error
import urllib.request

import pytest

from tests.support.remote_checks import HF_TOKEN
from tests.support.servers import BASIC_PASSWORD, BASIC_USER, parse_range


def get(url: str, headers: dict | None = None, method: str = "GET", timeout: float = 10):
    """(status, headers, body) without raising on 4xx/5xx and without following redirects."""
    u = urllib.parse.urlsplit(url)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=timeout)
    try:
        conn.request(method, u.path + (f"?{u.query}" if u.query else ""), headers=headers or {})
        r = conn.getresponse()
        return r.status, {k.lower(): v for k, v in r.getheaders()}, r.read()
    finally:
        conn.close()


def test_nginx_serves_ranges_with_an_etag_and_logs_them(nginx, corpus):
    data = corpus.models["big"].local.read_bytes()
    url = f"{nginx.url}/files/big/big.safetensors"
    mark = nginx.log_mark()
    status, headers, body = get(url, {"Range": "bytes=100-1123"})
    assert status == 206 and body == data[100:1124]
    assert headers["content-range"] == f"bytes 100-1123/{len(data)}"
    assert headers["etag"].startswith('"')
    status, headers2, body = get(url, {"Range": "bytes=100-1123"}, method="HEAD")
    assert headers2["etag"] == headers["etag"]
    status, _, body = get(f"{nginx.url}/norange/big/big.safetensors", {"Range": "bytes=0-9"})
    assert status == 200 and body == data                       # Range ignored
    assert get(f"{nginx.url}/private/x")[0] == 401
    assert get(f"{nginx.url}/forbidden/x")[0] == 403
    basic = f"{nginx.url}/basic/big/big.safetensors"
    assert get(basic, ranged := {"Range": "bytes=0-9"})[0] == 401
    auth = "Basic " + base64.b64encode(f"{BASIC_USER}:{BASIC_PASSWORD}".encode()).decode()
    assert get(basic, {**ranged, "Authorization": auth})[2] == data[:10]
    assert get(f"{nginx.url}/files/nope")[0] == 404
    log = nginx.wait_quiet(mark, quiet=0.1)
    assert not any(BASIC_PASSWORD in json.dumps(r) for r in log)
    assert [(r["method"], r["range"], r["status"], r["bytes"]) for r in log[:3]] == [
        ("GET", "bytes=100-1123", 206, 1024), ("HEAD", "bytes=100-1123", 206, 0),
        ("GET", "bytes=0-9", 200, len(data))]
    assert parse_range(log[0]["range"]) == (100, 1123)


def test_a_replaced_file_gets_another_etag(fresh_nginx, tmp_path):
    server = fresh_nginx()
    server.put("files/x.bin", b"a" * 1000)
    before = get(f"{server.url}/files/x.bin", method="HEAD")[1]["etag"]
    server.put("files/x.bin", b"b" * 1000)
    os.utime(server.www / "files/x.bin", (time.time() + 5, time.time() + 5))
    assert get(f"{server.url}/files/x.bin", method="HEAD")[1]["etag"] != before


def test_hf_file_system_reads_the_hub_layout(nginx, corpus, monkeypatch, tmp_path):
    from huggingface_hub import HfApi, HfFileSystem
    from huggingface_hub.errors import GatedRepoError

    monkeypatch.setenv("HF_HOME", str(tmp_path))
    data = corpus.models["big"].local.read_bytes()
    repo = nginx.hub["big"]
    fs = HfFileSystem(endpoint=nginx.url, token=False, skip_instance_cache=True)
    assert fs.info("tfs/big/big.safetensors")["size"] == len(data)
    assert sorted(fs.ls("tfs/big", detail=False)) == ["tfs/big/README.md", "tfs/big/big.safetensors"]
    assert fs.cat_file("tfs/big/big.safetensors", start=5, end=4000) == data[5:4000]
    assert fs.cat_file(f"tfs/big@{repo.main}/big.safetensors", start=5, end=10) == data[5:10]
    assert fs.resolve_path("tfs/big@main/big.safetensors").revision == "main"
    assert HfApi(endpoint=nginx.url, token=False).repo_info("tfs/big", revision="main").sha == repo.main
    # the branch redirects to its commit, which names itself in X-Repo-Commit
    status, headers, _ = get(f"{nginx.url}/tfs/big/resolve/main/big.safetensors", method="HEAD")
    assert status == 302 and headers["location"] == f"/tfs/big/resolve/{repo.main}/big.safetensors"
    assert headers["x-repo-commit"] == repo.main
    with pytest.raises(FileNotFoundError):
        fs.info("tfs/big/nope.safetensors")
    with pytest.raises(FileNotFoundError, match="repository not found"):
        fs.info("tfs/nosuch/model.safetensors")
    with pytest.raises(FileNotFoundError, match="revision not found"):
        fs.info("tfs/big@nosuch/big.safetensors")
    with pytest.raises(GatedRepoError):
        fs.cat_file("tfs/gated/model.safetensors", start=0, end=8)
    authed = HfFileSystem(endpoint=nginx.url, token=HF_TOKEN, skip_instance_cache=True)
    gated = corpus.models["safetensors"].local.read_bytes()
    assert authed.cat_file("tfs/gated/model.safetensors", start=0, end=8) == gated[:8]
    wrong = HfFileSystem(endpoint=nginx.url, token="hf_wrong", skip_instance_cache=True)
    with pytest.raises(GatedRepoError, match="403"):
        wrong.cat_file("tfs/gated/model.safetensors", start=0, end=8)


def test_s3fs_reads_moto_and_its_versions(s3, moto, corpus):
    data = corpus.models["big"].local.read_bytes()
    assert s3.cat_file("models/big/big.safetensors", start=7, end=70000) == data[7:70000]
    s3.pipe("versioned/self-test.bin", b"1" * 100)
    v1 = s3.info("versioned/self-test.bin")
    s3.pipe("versioned/self-test.bin", b"2" * 100)
    v2 = s3.info("versioned/self-test.bin", refresh=True)
    assert v1["ETag"] != v2["ETag"]
    versioned = moto.s3fs(version_aware=True)
    old = versioned.cat_file("versioned/self-test.bin", version_id=v1["VersionId"], start=0, end=4)
    assert old == b"1111"


def test_the_proxy_passes_and_applies_each_fault(nginx, proxy, corpus):
    data = corpus.models["big"].local.read_bytes()
    p = proxy(nginx.port)
    url = f"{p.url}/files/big/big.safetensors"
    ranged = {"Range": "bytes=0-1048575"}
    assert get(url, ranged)[2] == data[:1 << 20]
    p.push("503", "429", "drop", "pass")
    assert get(url, ranged)[0] == 503
    assert get(url, ranged)[0] == 429
    with pytest.raises(http.client.IncompleteRead):
        get(url, ranged)
    assert get(url, ranged)[2] == data[:1 << 20]
    assert get(url, method="HEAD")[0] == 200          # not a ranged GET: no fault taken
    p.push("stall")
    with pytest.raises((socket.timeout, TimeoutError)):
        get(url, ranged, timeout=0.5)
    assert [f for *_, f in p.log] == ["pass", "503", "429", "drop", "pass", "pass", "stall"]


def test_the_delaying_proxy_delivers_the_same_bytes(nginx, proxy, corpus):
    data = corpus.models["big"].local.read_bytes()
    p = proxy(nginx.port, rtt=0.02, window=1 << 20)
    with urllib.request.urlopen(f"{p.url}/files/big/big.safetensors") as r:
        assert r.read() == data
    assert get(f"{p.url}/files/big/big.safetensors", {"Range": "bytes=10-19"})[2] == data[10:20]
