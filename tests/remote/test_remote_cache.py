"""--disk-cache (docs/reference/remote.md): a second mount of the same object version reads the blocks the
first fetched from disk (counted from nginx's access log: no block fetched twice), another
version never sees them, and the directory stays within its size.

The disk cache touches nothing it did not write (issue 21; docs/internals/reliability.md "The disk
cache"): a user's files in DIR, a DIR that is another user's symlink, a block changed on
disk, a relative DIR, a mirror of the same commit, two mounts sharing DIR, a killed writer's
temporary file.  The unit-level twins: tests/sources/test_diskcache.py."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from tests.support import TENSORFS, fuse_mounts_under, mount_expecting_refusal, run_tensorfs
from tests.support.reliability_models import wait_for
from tests.support.remote_checks import MiB, assert_matches_reference, doc_of, header_size
from tests.support.servers import HubRepo, parse_range
from tests.support.users import needs_users, planted_link

ROOT = "tensorfs-blocks.v1"             # the cache's own directory in DIR


def _read_all(mnt: Path) -> None:
    for entry in doc_of(mnt)["tensors"].values():
        (mnt / entry["path"]).read_bytes()


def _unmount(mnt: Path, env) -> None:
    result = run_tensorfs("unmount", mnt, env=env)
    assert result.returncode == 0, result.stderr


def _du(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def _intervals(log: list[dict]) -> list[tuple[int, int]]:
    out = []
    for r in log:
        rng = parse_range(r["range"]) if r["method"] == "GET" and r["status"] == 206 else None
        if rng:
            out.append((rng[0], rng[0] + r["bytes"]))
    return out


def test_a_second_mount_with_disk_cache_fetches_no_block_twice(nginx, corpus, rmount, remote_env,
                                                              tmp_path):
    model = corpus.models["big"]
    url = f"{nginx.url}/files/big/big.safetensors"
    cache = tmp_path / "cache"
    mark = nginx.log_mark()
    first = rmount(url, "--disk-cache", cache)
    _read_all(first)
    _unmount(first, remote_env)
    fetched = _intervals(nginx.wait_quiet(mark))
    assert sum(b - a for a, b in fetched) >= model.local.stat().st_size - header_size(model.local)
    mark = nginx.log_mark()
    second = rmount(url, "--disk-cache", cache)
    at_mount = nginx.requests(mark)
    mark = nginx.log_mark()
    _read_all(second)
    assert_matches_reference(second, model.files)
    reads = nginx.wait_quiet(mark)
    assert reads == [], reads                                 # every block from disk
    assert sum(r["bytes"] for r in at_mount) <= header_size(model.local) + MiB


def test_the_disk_cache_is_keyed_by_version(fresh_nginx, corpus, rmount, remote_env, tmp_path):
    server = fresh_nginx()
    old, new = corpus.models["big"], corpus.models["safetensors"]
    url = server.put("files/swap/model.safetensors", old.local)
    cache = tmp_path / "cache"
    first = rmount(url, "--disk-cache", cache)
    _read_all(first)
    _unmount(first, remote_env)
    server.put("files/swap/model.safetensors", new.local)
    later = time.time() + 100
    os.utime(server.www / "files/swap/model.safetensors", (later, later))
    second = rmount(url, "--disk-cache", cache)
    assert_matches_reference(second, new.files)


def test_a_disk_cache_over_a_server_without_etags_is_said_on_the_terminal_once(
        nginx, corpus, remote_env, tmp_path):
    """nginx with ``etag off``: the mount serves the model, and its stderr says, in one
    warning line, that --disk-cache keeps nothing of it (not only the daemon's log)."""
    model = corpus.models["sharded"]
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    result = run_tensorfs("mount", f"{nginx.url}/noetag/sharded/{model.entry}", mnt,
                          "--disk-cache", tmp_path / "cache", env=remote_env)
    assert result.returncode == 0, result.stderr
    try:
        lines = result.stderr.splitlines()
        assert len(lines) == 1 and lines[0].startswith("tensorfs: warning: "), result.stderr
        assert "no version (ETag)" in lines[0] and "--disk-cache keeps none" in lines[0], lines[0]
        assert_matches_reference(mnt, model.files)
    finally:
        _unmount(mnt, remote_env)
    with_etags = tmp_path / "mnt2"
    with_etags.mkdir()
    result = run_tensorfs("mount", f"{nginx.url}/files/sharded/{model.entry}", with_etags,
                          "--disk-cache", tmp_path / "cache", env=remote_env)
    assert result.returncode == 0 and result.stderr == "", result.stderr
    _unmount(with_etags, remote_env)


def test_the_disk_cache_stays_within_its_size(nginx, corpus, rmount, tmp_path):
    cache = tmp_path / "cache"
    mnt = rmount(f"{nginx.url}/files/big/big.safetensors", "--disk-cache", f"{cache}:9M")
    _read_all(mnt)
    assert_matches_reference(mnt, corpus.models["big"].files)
    assert 0 < _du(cache) <= 9 * MiB


@pytest.mark.parametrize("mode", [0o777, 0o770, 0o1733])
def test_a_disk_cache_others_can_write_is_refused(nginx, remote_env, tmp_path, mode):
    cache = tmp_path / "cache"
    cache.mkdir()
    cache.chmod(mode)
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    result = run_tensorfs("mount", f"{nginx.url}/files/big/big.safetensors", mnt,
                          "--disk-cache", cache, env=remote_env)
    assert result.returncode == 1
    assert len(result.stderr.splitlines()) == 1 and str(cache) in result.stderr, result.stderr
    assert os.listdir(cache) == []


# -- nothing but what it wrote (issue 21) ---------------------------------------------------------

def _user_files(home: Path) -> dict[str, Path]:
    files = {"thesis.tex": b"\\documentclass{article}\n", "data.csv": b"a,b\n1,2\n",
             ".ssh/authorized_keys": b"ssh-ed25519 AAAA user@host\n",
             "projects/x/report.pdf": b"%PDF-1.7\n"}
    out = {}
    for name, data in files.items():
        path = home / name
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        path.write_bytes(data)
        out[name] = path
    return out


def _snapshot(files: dict[str, Path]) -> dict:
    return {n: (p.read_bytes(), p.stat().st_mtime_ns) if p.exists() else None
            for n, p in files.items()}


def _cache_bytes(cache: Path, mine: dict[str, Path] = {}) -> int:
    """Every byte under ``cache`` but the user's own files."""
    theirs = {p.resolve() for p in mine.values()}
    return sum(p.lstat().st_size for p in cache.rglob("*")
               if p.is_file() and p.resolve() not in theirs)


def test_a_users_files_in_the_disk_cache_dir_are_never_touched(nginx, corpus, rmount, remote_env,
                                                               tmp_path):
    """--disk-cache ~/ with a small SIZE: reading far past it (two mounts, 20 MiB) removes
    none of the user's files, and the cache's own stay within SIZE."""
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    files = _user_files(home)
    before = _snapshot(files)
    url = f"{nginx.url}/files/big/big.safetensors"
    for _ in range(2):
        mnt = rmount(url, "--disk-cache", f"{home}:5M")
        _read_all(mnt)
        assert_matches_reference(mnt, corpus.models["big"].files)
        _unmount(mnt, remote_env)
    assert _snapshot(files) == before
    assert 0 < _cache_bytes(home, files) <= 5 * MiB


@needs_users
def test_a_disk_cache_dir_that_another_user_made_a_symlink_is_refused(users, nginx, remote_env,
                                                                     tmp_path):
    """A shared sticky directory (/tmp): another user plants DIR as a symlink to the victim's
    documents before the victim's mount.  Refused in one line; the victim's files as they
    were, nothing added."""
    _, attacker = users
    shared = Path(tempfile.mkdtemp(prefix="tensorfs-shared-"))
    try:
        shared.chmod(0o1777)
        documents = tmp_path / "documents"
        documents.mkdir(mode=0o700)
        files = _user_files(documents)
        before = _snapshot(files), sorted(os.listdir(documents))
        planted = shared / "cache"
        assert attacker.run("ln", "-s", documents, planted).returncode == 0
        assert planted.is_symlink() and planted.lstat().st_uid == attacker.uid
        mnt = tmp_path / "mnt"
        mnt.mkdir()
        result = run_tensorfs("mount", f"{nginx.url}/files/big/big.safetensors", mnt,
                              "--disk-cache", f"{planted}:5M", env=remote_env)
        assert result.returncode == 1, result.stderr
        assert len(result.stderr.splitlines()) == 1 and str(planted) in result.stderr
        assert "symbolic link" in result.stderr
        assert fuse_mounts_under(mnt) == []
        assert (_snapshot(files), sorted(os.listdir(documents))) == before
    finally:
        shutil.rmtree(shared, ignore_errors=True)


@needs_users
def test_a_disk_cache_below_another_users_link_is_refused(users, nginx, remote_env, tmp_path):
    """``--disk-cache /shared/link/sub`` where another user's ``link`` points into a
    directory of theirs: the mount is refused in one line naming the link, and nothing is
    created where it points (the parent chain, not only DIR's last component)."""
    _, attacker = users
    with planted_link(attacker) as (theirs, link):
        mnt = tmp_path / "mnt"
        mnt.mkdir()
        result, mounted = mount_expecting_refusal(
            f"{nginx.url}/files/big/big.safetensors", mnt, "--disk-cache", f"{link}/sub:5M",
            env=remote_env)
        assert result.returncode == 1, result.stderr
        assert len(result.stderr.splitlines()) == 1, result.stderr
        assert f"{link} is a symbolic link of uid {attacker.uid}" in result.stderr
        assert not mounted and os.listdir(theirs) == []


def test_a_block_changed_on_disk_is_fetched_again_and_logged(nginx, corpus, rmount, remote_env,
                                                            tmp_path):
    """4 bytes of every block file overwritten between two mounts: the second serves the
    model's bytes (fetched again) and its log says which block failed."""
    model = corpus.models["big"]
    url = f"{nginx.url}/files/big/big.safetensors"
    cache = tmp_path / "cache"
    first = rmount(url, "--disk-cache", cache)
    _read_all(first)
    _unmount(first, remote_env)
    blocks = [p for p in cache.rglob("*") if p.is_file() and p.stat().st_size > MiB]
    assert blocks
    for path in blocks:
        with open(path, "r+b") as f:
            f.seek(path.stat().st_size - 1000)
            f.write(b"\xde\xad\xbe\xef")
    log = tmp_path / "second.log"
    mark = nginx.log_mark()
    second = rmount(url, "--disk-cache", cache, "--log", log)
    _read_all(second)
    assert_matches_reference(second, model.files)
    assert sum(r["bytes"] for r in nginx.wait_quiet(mark)) > MiB      # fetched again
    said = log.read_text()
    assert said.count("failed its check (checksum mismatch)") == len(blocks), said


def test_relative_paths_are_where_the_command_ran(nginx, corpus, remote_env, tmp_path):
    """--disk-cache rel and --log x.log from a working directory: the daemon works from /,
    yet its blocks and log are where the command was run."""
    work = tmp_path / "work"
    (work / "mnt").mkdir(parents=True)
    rel = f"tfs-rel-cache-{os.getpid()}"
    stray = Path("/") / rel
    assert not stray.exists()
    try:
        result = subprocess.run([*TENSORFS, "mount", f"{nginx.url}/files/big/big.safetensors",
                                 "mnt", "--disk-cache", f"{rel}:64M", "--log", "x.log"],
                                cwd=work, env=remote_env, capture_output=True, text=True,
                                timeout=120)
        assert result.returncode == 0, result.stderr
        try:
            _read_all(work / "mnt")
            assert_matches_reference(work / "mnt", corpus.models["big"].files)
        finally:
            _unmount(work / "mnt", remote_env)
        assert [p for p in (work / rel).rglob("*") if p.is_file() and p.stat().st_size > MiB]
        assert not stray.exists()
        assert "mounted" in (work / "x.log").read_text()
    finally:
        shutil.rmtree(stray, ignore_errors=True)


def test_a_foreground_mounts_relative_log_is_listed_where_it_is(nginx, remote_env, tmp_path):
    work = tmp_path / "work"
    (work / "mnt").mkdir(parents=True)
    proc = subprocess.Popen([*TENSORFS, "mount", "--foreground",
                             f"{nginx.url}/files/big/big.safetensors", "mnt", "--log", "x.log"],
                            cwd=work, env=remote_env, stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert wait_for(lambda: fuse_mounts_under(work / "mnt"), timeout=60), proc.stderr
        rows = json.loads(run_tensorfs("list", "--json", env=remote_env).stdout)
        row = next(r for r in rows if r["mountpoint"] == str(work / "mnt"))
        assert row["log"] == str(work / "x.log")
    finally:
        run_tensorfs("unmount", work / "mnt", env=remote_env)
        proc.communicate(timeout=60)


def _forged(real: Path, where: Path) -> Path:
    """The same header (names, shapes, offsets, size), other tensor bytes."""
    data = bytearray(real.read_bytes())
    start = header_size(real)
    data[start:] = bytes(b ^ 0x5A for b in data[start:])
    where.parent.mkdir(parents=True, exist_ok=True)
    where.write_bytes(bytes(data))
    return where


def test_mirrors_of_one_commit_do_not_share_blocks(fresh_nginx, corpus, rmount, remote_env,
                                                  tmp_path):
    """hf:// through a mirror (another HF_ENDPOINT) claiming the same commit id with other
    bytes: its blocks are never served for the real endpoint."""
    real = corpus.models["big"].local
    genuine, mirror = HubRepo("tfs/mirrored"), HubRepo("tfs/mirrored")
    sha = genuine.commit({"big.safetensors": real})
    mirror.commit({"big.safetensors": _forged(real, tmp_path / "forged" / "big.safetensors")},
                  sha=sha)
    hub, fake = fresh_nginx([genuine]), fresh_nginx([mirror])
    cache = tmp_path / "cache"
    url = "hf://tfs/mirrored/big.safetensors"
    first = rmount(url, "--disk-cache", cache, env={"HF_ENDPOINT": fake.url})
    _read_all(first)
    _unmount(first, remote_env)
    second = rmount(url, "--disk-cache", cache, env={"HF_ENDPOINT": hub.url})
    assert_matches_reference(second, [real])


def test_two_mounts_sharing_a_disk_cache_stay_within_its_size(fresh_nginx, corpus, rmount,
                                                              tmp_path):
    server = fresh_nginx()
    big = corpus.models["big"].local
    urls = [server.put(f"files/copy{k}/big.safetensors", big) for k in range(2)]
    cache = tmp_path / "cache"
    mounts = [rmount(url, "--disk-cache", f"{cache}:6M") for url in urls]
    for _ in range(2):
        for mnt in mounts:
            _read_all(mnt)
    for mnt in mounts:
        assert_matches_reference(mnt, corpus.models["big"].files)
    assert 0 < _cache_bytes(cache) <= 6 * MiB


def test_a_dead_writers_temporary_file_is_removed(nginx, rmount, remote_env, tmp_path):
    """A daemon killed while writing a block leaves its temporary file: the next mount
    sharing DIR removes it (its writer is gone)."""
    url = f"{nginx.url}/files/big/big.safetensors"
    cache = tmp_path / "cache"
    _unmount(rmount(url, "--disk-cache", f"{cache}:64M"), remote_env)
    dead = subprocess.Popen(["true"])
    dead.wait()
    stale = cache / ROOT / f".{'ab' * 32}.0.{dead.pid}.12345.140000000000.tmp"
    stale.parent.mkdir(mode=0o700, exist_ok=True)
    stale.write_bytes(b"\0" * (3 * MiB))
    mnt = rmount(url, "--disk-cache", f"{cache}:64M")
    _read_all(mnt)
    assert not stale.exists()


def test_an_s3_objects_blocks_are_kept_and_served_again(s3, corpus, rmount, remote_env, tmp_path):
    """S3's identity (the endpoint botocore resolved, bucket, key) keys its blocks: a second
    mount serves them from disk, the model's bytes."""
    url = "s3://models/big/big.safetensors"
    cache = tmp_path / "cache"
    first = rmount(url, "--disk-cache", cache)
    _read_all(first)
    _unmount(first, remote_env)
    kept = {p: p.stat().st_mtime_ns for p in (cache / ROOT).iterdir() if p.stat().st_size > MiB}
    assert kept
    time.sleep(0.02)                    # a later mtime than the first mount's, on any clock
    second = rmount(url, "--disk-cache", cache)
    assert_matches_reference(second, corpus.models["big"].files)
    served = [p for p, mtime in kept.items() if p.stat().st_mtime_ns > mtime]
    assert served, kept                 # a block served from disk is touched
