"""A fleet on one origin fetch (docs/guide/fleet.md): nodes mount one URL through a caching nginx
(``slice``, ``proxy_cache``, ``proxy_cache_lock``: ``servers.CacheTier``, the config the page
shows) in front of an origin nginx.  Four mounts reading the whole model at once get every
byte right while the origin sends the file about once (its access log); a model replaced at
the origin never mixes versions within one mount, nor within one answer of the tier.  The
other pieces of the page: sharded models, hf:// through a mirror, unsigned s3://, one
--disk-cache per node, an origin that stops answering, and the DaemonSet's serving
container with its readiness command."""

from __future__ import annotations

import ctypes
import http.client
import json
import os
import re
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from tests.support import (
    EIO,
    TENSORFS,
    alive,
    daemon_pid,
    mount_expecting_refusal,
    mounts_in,
    read_errno,
    run_tensorfs,
    wait_for,
)
from tests.support.remote_checks import MiB, assert_matches_reference, doc_of, fetched, reference
from tests.support.servers import (
    CACHE_TIER_EXAMPLE,
    CACHE_TIER_SITE,
    CacheTier,
    HubRepo,
    Nginx,
    parse_range,
)
from tests.support.shards import INDEX, write_hf_shards, write_split_gguf

ROOT = Path(__file__).resolve().parents[2]
NAME = "model.safetensors"
PATH = f"files/fleet/{NAME}"
SLICE = 4 * MiB                         # the tier's slice (CACHE_TIER_SITE)
NODES = 4


def model_tensors(seed: int) -> dict[str, np.ndarray]:
    """About 23 MiB in six tensors, big and small; every seed gives the same names, dtypes
    and shapes, so two versions differ only in their tensors' bytes."""
    rng = np.random.default_rng(seed)
    return {"a.small": rng.standard_normal(7).astype(np.float32),
            "b.big": rng.integers(-128, 127, (9 << 20) + 1, dtype=np.int8),
            "c.f32": rng.standard_normal((1000, 2000)).astype(np.float32),
            "d.tiny": np.arange(3, dtype=np.int16) + seed,
            "e.f16": rng.standard_normal((2000, 1500)).astype(np.float16),
            "f.i32": rng.integers(-9, 9, 1000, dtype=np.int32)}


@pytest.fixture(scope="module")
def versions(tmp_path_factory) -> tuple[Path, Path]:
    """Two versions of one safetensors file (same header, other tensor bytes), each NAME in a
    folder of its own."""
    from safetensors.numpy import save_file

    d = tmp_path_factory.mktemp("fleet-models")
    v1, v2 = d / "v1" / NAME, d / "v2" / NAME
    for seed, path in ((1, v1), (2, v2)):
        path.parent.mkdir()
        save_file(model_tensors(seed), str(path))
    head = int.from_bytes(v1.read_bytes()[:8], "little") + 8
    assert v1.read_bytes()[:head] == v2.read_bytes()[:head]
    return v1, v2


@pytest.fixture(scope="module")
def forms(tmp_path_factory) -> dict[str, tuple[list[Path], str]]:
    """The same tensors as a sharded safetensors index and as a split GGUF: (every file, the
    one a user names)."""
    d = tmp_path_factory.mktemp("fleet-forms")
    index, _, weight_map = write_hf_shards(d / "sharded", 3, tensors=model_tensors(3))
    shards = [index.parent / s for s in sorted(set(weight_map.values()))]
    split, _ = write_split_gguf(d / "split", per_shard=2, tensors=model_tensors(4))
    return {"sharded": ([index, *shards], INDEX), "split": (split, split[0].name)}


@pytest.fixture
def servers(tmp_path):
    """servers(*files, repos=(), **tier_options) -> (origin, tier): an origin nginx serving
    ``files`` under /files/fleet/ (and ``repos``) and a caching tier of this test's own in
    front of it; both stopped at the end."""
    started = []

    def _start(*files: Path, repos=(), **tier_options) -> tuple[Nginx, CacheTier]:
        origin = Nginx(tmp_path / "origin", list(repos))
        for path in files:
            origin.put(f"files/fleet/{path.name}", path)
        started.append(origin.start())
        tier = CacheTier(tmp_path / "tier", origin.port, **tier_options)
        started.append(tier.start())
        return origin, tier

    yield _start
    for server in reversed(started):
        server.stop()


@pytest.fixture
def node_env(tmp_path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("HF_", "HUGGING_FACE_", "AWS_"))}
    env.update({"HF_HOME": str(tmp_path / "hf-home"), "HF_HUB_DISABLE_TELEMETRY": "1",
                "HF_HUB_DISABLE_IMPLICIT_TOKEN": "1"})
    return env


@pytest.fixture
def node(tmp_path, node_env):
    """node(url, *options, env=None) -> a mount point: one node's ``tensorfs mount``."""
    yield from mounts_in(tmp_path, "node", node_env)


def replace_at_origin(origin: Nginx, model: Path) -> None:
    """Another version under the same URL: new bytes and mtime, so another ETag."""
    origin.put(PATH, model)
    later = time.time() + 100
    os.utime(origin.www / PATH, (later, later))


def read_node(mnt: Path, files: list[Path], tensors_first: bool) -> None:
    """What one node's users do: cmp each of the model's files in files/ with the original,
    and read every tensor, raw and as .npy, against the reference reader's."""
    def whole_files():
        for path in files:
            done = subprocess.run(["cmp", str(mnt / "files" / path.name), str(path)],
                                  capture_output=True, text=True)
            assert done.returncode == 0, (mnt, done.stdout, done.stderr)

    def tensors():
        assert_matches_reference(mnt, files)

    for step in ((tensors, whole_files) if tensors_first else (whole_files, tensors)):
        step()


def test_four_nodes_behind_the_tier_read_every_byte_with_one_origin_fetch(versions, servers,
                                                                          node):
    model = versions[0]
    origin, tier = servers(model)
    url = f"{tier.url}/{PATH}"
    nodes = [node(url) for _ in range(NODES)]
    with ThreadPoolExecutor(NODES) as pool:
        for done in [pool.submit(read_node, mnt, [model], i % 2 == 1)
                     for i, mnt in enumerate(nodes)]:
            done.result()
    size = model.stat().st_size
    sent = fetched(origin.wait_quiet(), f"/{PATH}")
    assert sent <= 1.1 * size, (sent, size)
    # and every node was served through the tier: each fetched every tensor byte at least once
    data = size - (int.from_bytes(model.read_bytes()[:8], "little") + 8)
    served = fetched(tier.wait_quiet(), f"/{PATH}")
    assert served >= NODES * data, (served, NODES * data)


def test_each_node_keeps_its_own_disk_cache_of_the_tiers_blocks(versions, servers, node,
                                                                tmp_path):
    """``--disk-cache`` per node, as docs/guide/fleet.md says: two nodes fill their own caches
    through the tier (the origin sends the file once); a node mounted again reads every
    block from its disk, asking the tier only for the header at mount."""
    model = versions[0]
    origin, tier = servers(model)
    url = f"{tier.url}/{PATH}"
    caches = [tmp_path / f"disk{i}" for i in range(2)]
    nodes = [node(url, "--disk-cache", cache) for cache in caches]
    with ThreadPoolExecutor(2) as pool:
        for done in [pool.submit(read_node, mnt, [model], i == 1) for i, mnt in enumerate(nodes)]:
            done.result()
    assert fetched(origin.wait_quiet(), f"/{PATH}") <= 1.1 * model.stat().st_size
    assert all(any(cache.rglob("*.[0-9]*")) for cache in caches)
    assert run_tensorfs("unmount", nodes[0]).returncode == 0
    tier.wait_quiet()
    mark = tier.log_mark()
    again = node(url, "--disk-cache", caches[0])
    read_node(again, [model], False)
    asked = fetched(tier.wait_quiet(mark), f"/{PATH}")
    assert asked <= MiB + int.from_bytes(model.read_bytes()[:8], "little") + 8, asked


@pytest.mark.parametrize("form", ["sharded", "split"])
def test_a_sharded_model_behind_the_tier_is_fetched_once(forms, form, servers, node):
    """An index and its shards, a split GGUF's shards: each file through the tier, once."""
    files, entry = forms[form]
    origin, tier = servers(*files)
    nodes = [node(f"{tier.url}/files/fleet/{entry}") for _ in range(2)]
    with ThreadPoolExecutor(2) as pool:
        for done in [pool.submit(read_node, mnt, files, i == 1) for i, mnt in enumerate(nodes)]:
            done.result()
    log = origin.wait_quiet()
    for path in files:
        assert fetched(log, f"/files/fleet/{path.name}") <= 1.1 * path.stat().st_size, path.name


def _read_chunks(path: Path, size: int, chunk: int = MiB) -> list[bytes | int]:
    """The file read in order, ``chunk`` bytes at a time: each read's bytes or its errno."""
    out = []
    fd = os.open(path, os.O_RDONLY)
    try:
        for offset in range(0, size, chunk):
            try:
                out.append(os.pread(fd, chunk, offset))
            except OSError as error:
                out.append(error.errno)
    finally:
        os.close(fd)
    return out


def test_a_model_replaced_at_the_origin_never_mixes_versions_in_a_mount(versions, servers, node):
    v1, v2 = versions
    old = v1.read_bytes()
    origin, tier = servers(v1)
    url = f"{tier.url}/{PATH}"
    before = node(url)                                  # pins version 1's ETag
    status, _, body, _ = _get(tier.port, SLICE, SLICE + 99)      # the tier keeps slices 0, 1
    assert (status, body) == (206, old[SLICE:SLICE + 100])
    replace_at_origin(origin, v2)
    after = node(url)          # opened after the change: the tier still holds version 1's head
    ref1, ref2 = reference([v1]), reference([v2])
    for mnt in (before, after):
        chunks = _read_chunks(mnt / "files" / NAME, len(old))
        assert chunks[0] == old[:MiB], mnt                        # the tier's version 1 slices
        assert EIO in chunks, mnt           # version 1 is nowhere whole: some reads must fail
        for i, got in enumerate(chunks):
            assert got == EIO or got == old[i * MiB:(i + 1) * MiB], (mnt, i)   # never version 2
        doc = doc_of(mnt)
        for name, (raw, _) in ref1.items():
            got = read_errno(mnt / doc["tensors"][name]["path"])
            assert got == EIO or got == raw, (mnt, name)
            assert got != ref2[name][0] or raw == ref2[name][0], (mnt, name)
        assert alive(daemon_pid(mnt))
    # the origin did change: a node that reads it directly gets version 2 whole
    direct = node(f"{origin.url}/{PATH}")
    assert subprocess.run(["cmp", str(direct / "files" / NAME), str(v2)]).returncode == 0


def test_a_new_version_reaches_new_nodes_once_the_tier_revalidates(versions, servers, node):
    """Past ``proxy_cache_valid`` the tier asks the origin again (If-None-Match): nodes
    mounted then read the new version whole, fetched from the origin once (a slice not
    changed since is a 304), while the node that opened the old one reads it or EIO, never
    the new bytes."""
    v1, v2 = versions
    old = v1.read_bytes()
    origin, tier = servers(v1, valid="1s")
    url = f"{tier.url}/{PATH}"
    first = node(url)
    assert subprocess.run(["cmp", str(first / "files" / NAME), str(v1)]).returncode == 0
    etag1 = _get(tier.port, 0, 0)[1]["ETag"]
    mark = origin.log_mark()
    replace_at_origin(origin, v2)
    # each slice expires on its own clock: until the last has, a new mount may meet version 1
    starts = range(0, len(old), SLICE)
    assert wait_for(lambda: all(_get(tier.port, at, at)[1].get("ETag") not in (None, etag1)
                                for at in starts), timeout=30)
    for _ in range(2):          # one after the other: the lock covers new entries, not expired
        later = node(url)
        assert subprocess.run(["cmp", str(later / "files" / NAME), str(v2)]).returncode == 0
    assert fetched(origin.wait_quiet(mark), f"/{PATH}") <= 1.1 * v2.stat().st_size
    for i, got in enumerate(_read_chunks(first / "files" / NAME, len(old))):
        assert got == EIO or got == old[i * MiB:(i + 1) * MiB], i


def test_an_origin_down_behind_the_tier_is_one_line_at_mount_and_eio_on_reads(versions, servers,
                                                                               node, tmp_path):
    """The tier answers 502 for what it lacks while the origin does not answer: a mount of a
    file it holds nothing of says so in one line; a live mount's read of a slice it lacks
    fails with EIO within --timeout, the daemon stays up and reads what the tier holds."""
    v1, other = versions
    old = v1.read_bytes()
    origin, tier = servers(v1)
    origin.put("files/fleet/other.safetensors", other)
    url = f"{tier.url}/{PATH}"
    live = node(url, "--timeout", "5")                  # the tier holds slice 0 now
    origin.stop()
    (tmp_path / "refused").mkdir()
    lacking = f"{tier.url}/files/fleet/other.safetensors"
    refused, mounted = mount_expecting_refusal(lacking, tmp_path / "refused", "--timeout", "5")
    assert not mounted and refused.returncode == 1, refused.stderr
    assert refused.stderr == f"tensorfs: error: {lacking}: HTTP 502\n"
    assert read_errno(live / "files" / NAME, 2 * SLICE, MiB) == EIO
    assert alive(daemon_pid(live))
    assert read_errno(live / "files" / NAME, 0, MiB) == old[:MiB]


def _get(port: int, first: int, last: int, **headers) -> tuple[int | str, dict, bytes, bool]:
    """One ranged GET of PATH: (status, headers, body, whether the body came whole); a
    connection closed before the answer's head gives the status 'closed'."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        conn.request("GET", f"/{PATH}", headers={"Range": f"bytes={first}-{last}",
                                                 **{k.replace("_", "-"): v for k, v in headers.items()}})
        try:
            answer = conn.getresponse()
        except (http.client.RemoteDisconnected, ConnectionError):
            return "closed", {}, b"", False
        try:
            return answer.status, dict(answer.getheaders()), answer.read(), True
        except http.client.IncompleteRead as cut:
            return answer.status, dict(answer.getheaders()), cut.partial, False
    finally:
        conn.close()


def test_the_tier_never_answers_one_range_from_two_versions(versions, servers):
    """The slice module checks each slice's ETag against the first's: a range over a slice of
    version 1 (cached) and one of version 2 (fetched now) is cut, never completed from both;
    a slice of version 2 asked with If-Match of version 1 is refused (412), as tensorfs asks;
    If-Range of version 1 never gets version 2's bytes either."""
    v1, v2 = versions
    old = v1.read_bytes()
    origin, tier = servers(v1)
    status, headers, body, whole = _get(tier.port, 0, 65535)
    assert (status, body, whole) == (206, old[:65536], True)
    etag1 = headers["ETag"]
    replace_at_origin(origin, v2)
    # slice 0: version 1 from the cache; slice 1: version 2 from the origin
    status, headers, body, whole = _get(tier.port, SLICE - 1000, SLICE + 999)
    assert not whole, (status, headers)
    assert body == old[SLICE - 1000:SLICE - 1000 + len(body)]
    assert "etag mismatch in slice response" in tier.error_log()
    # slice 2, never fetched: version 2 now, refused to whoever pinned version 1
    status, headers, body, whole = _get(tier.port, 2 * SLICE, 2 * SLICE + 99, If_Match=etag1)
    assert status == 412, (status, headers)
    # slice 0 again: still version 1, and served as such
    status, headers, body, whole = _get(tier.port, 0, 99, If_Match=etag1)
    assert (status, headers.get("ETag"), body) == (206, etag1, old[:100])
    # If-Range: the range is served only from the version named; for another, the whole file
    # would be sent instead, and the tier, holding slices of both, cuts it before its head
    status, _, body, _ = _get(tier.port, 0, 99, If_Range=etag1)
    assert (status, body) == (206, old[:100])
    status, _, body, whole = _get(tier.port, 2 * SLICE, 2 * SLICE + 99, If_Range=etag1)
    assert not whole and body == old[:len(body)], status


def test_hf_through_the_tier_fetches_a_commit_once(versions, servers, node):
    """HF_ENDPOINT at the tier: the API answers (the revision, the repo's listing) pass
    through it, a commit's files are cached (two nodes, one origin fetch of the file)."""
    model = versions[0]
    repo = HubRepo("tfs/fleet")
    sha = repo.commit({NAME: model})
    origin, tier = servers(model, repos=[repo])
    env = {"HF_ENDPOINT": tier.url}
    nodes = [node(f"hf://tfs/fleet/{NAME}", env=env), node("hf://tfs/fleet", env=env)]   # a file, the repo
    with ThreadPoolExecutor(2) as pool:
        for done in [pool.submit(subprocess.run, ["cmp", str(mnt / "files" / NAME), str(model)])
                     for mnt in nodes]:
            assert done.result().returncode == 0
    sent = fetched(origin.wait_quiet(), f"/tfs/fleet/resolve/{sha}/{NAME}")
    assert 0 < sent <= 1.1 * model.stat().st_size, sent
    api = [r for r in tier.wait_quiet() if r["uri"].startswith("/api/")]
    assert api and all(r["cache"] == "" for r in api), api          # never cached


def test_s3_through_the_tier_fetches_an_object_once(versions, moto, proxy, node, tmp_path):
    """``endpoint_url`` at the tier, a bucket read without signing (``anon=true``): two nodes
    read the object whole while the tier asks S3 (moto, behind a proxy that logs what it
    asks) for each byte once."""
    model = versions[0]
    fs = moto.s3fs()
    fs.mkdir("fleet", acl="public-read")
    fs.put_file(str(model), f"fleet/{NAME}")
    fs.chmod(f"fleet/{NAME}", acl="public-read")
    s3 = proxy(moto.port)
    tier = CacheTier(tmp_path / "tier", s3.port).start()
    try:
        options = ("--storage-option", f"endpoint_url={tier.url}", "--storage-option", "anon=true")
        nodes = [node(f"s3://fleet/{NAME}", *options) for _ in range(2)]
        with ThreadPoolExecutor(2) as pool:
            for done in [pool.submit(subprocess.run, ["cmp", str(mnt / "files" / NAME), str(model)])
                         for mnt in nodes]:
                assert done.result().returncode == 0
        tier.wait_quiet()
    finally:
        tier.stop()
    size = model.stat().st_size
    asked = 0
    for method, uri, header, _ in s3.log:
        if method == "GET" and uri.startswith(f"/fleet/{NAME}"):
            first, last = parse_range(header)
            asked += min(size - 1, last) - first + 1
    assert 0 < asked <= 1.1 * size, (asked, s3.log)


def _readiness_probe() -> str:
    """The readiness command of docs/reference/fleet.md's DaemonSet, as ``sh -c`` runs it."""
    page = (ROOT / "docs" / "reference" / "fleet.md").read_text()
    line = re.search(r"^ +command: \[sh, -c, (\".*tensorfs list --json.*\")\]$", page, re.M)
    return json.loads(line.group(1))


@pytest.mark.skipif(os.geteuid() != 0 or not os.path.exists("/dev/fuse"),
                    reason="mount(2) of a FUSE descriptor needs root and /dev/fuse")
def test_a_node_served_through_a_descriptor_is_ready_by_the_pages_probe(versions, servers,
                                                                         node_env, tmp_path):
    """The DaemonSet's serving container: ``tensorfs mount URL --foreground /dev/fd/N`` on a
    descriptor a mounter mounted (here the test, as tests/fuse/test_fd_mount.py does); the page's
    readiness command says ready while it serves; the mounter's unmount ends it."""
    model = versions[0]
    _, tier = servers(model)
    directory = tmp_path / "models"
    directory.mkdir()
    fd = os.open("/dev/fuse", os.O_RDWR)
    data = f"fd={fd},rootmode=40000,user_id=0,group_id=0"
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.mount(b"tensorfs", os.fsencode(directory), b"fuse.tensorfs", 2 | 4, data.encode()):
        os.close(fd)
        pytest.skip(f"mount(2) of a FUSE descriptor: {os.strerror(ctypes.get_errno())}")
    env = {**node_env, "PATH": f"{Path(sys.executable).parent}:{node_env.get('PATH', '')}",
           "PYTHONPATH": str(ROOT)}
    server = subprocess.Popen([*TENSORFS, "mount", f"{tier.url}/{PATH}", "--foreground",
                               f"/dev/fd/{fd}"], pass_fds=(fd,), env=env,
                              stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE)
    os.close(fd)
    try:
        probe = ["sh", "-c", _readiness_probe()]
        assert wait_for(lambda: subprocess.run(probe, env=env).returncode == 0, 60)
        assert subprocess.run(["cmp", str(directory / "files" / NAME), str(model)]).returncode == 0
    finally:
        libc.umount2(os.fsencode(directory), 2)                 # the mounter stops: MNT_DETACH
        try:
            server.wait(60)
        finally:
            if server.poll() is None:
                server.kill()
                server.wait()
            server.stderr.close()
    assert server.returncode == 0


def test_the_docs_show_the_config_the_tier_runs():
    """docs/reference/fleet.md's nginx block is CACHE_TIER_SITE with the page's example values."""
    page = (ROOT / "docs" / "reference" / "fleet.md").read_text()
    blocks = re.findall(r"```nginx\n(.*?)```", page, re.S)
    assert CACHE_TIER_SITE.format(**CACHE_TIER_EXAMPLE) in blocks
