"""The disk cache touches nothing it did not write (issue 21, docs/internals/reliability.md
"The disk cache"), at the unit level: ``tensorfs.sources.diskcache.DiskCache`` on a real directory,
several processes sharing it, no FUSE and no network.  The same classes through real mounts
and nginx: tests/remote/test_remote_cache.py."""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import stat
import subprocess
import sys
import tempfile
import textwrap
import threading
from pathlib import Path

import pytest

from tensorfs.sources.diskcache import DiskCache
from tests.support import bytes_at_one_moment
from tests.support.users import needs_users

ROOT = "tensorfs-blocks.v1"     # the cache's own directory in DIR (written out: the contract)
BLOCK = 64 << 10
KEY = DiskCache.object_key("http://127.0.0.1:1/m.safetensors", "etag-1", BLOCK)
REPO = Path(__file__).resolve().parents[2]


def _block(i: int, n: int = BLOCK) -> bytes:
    return hashlib.sha256(b"%d" % i).digest() * (n // 32) + b"\x5a" * (n % 32)


def _user_files(directory: Path) -> dict[str, Path]:
    """A user's files, in DIR itself and in subdirectories private as a cache's were."""
    ssh = directory / ".ssh"
    ssh.mkdir(mode=0o700)
    files = {"thesis.tex": b"\\documentclass{article}\n", "data.csv": b"a,b\n1,2\n",
             ".ssh/authorized_keys": b"ssh-ed25519 AAAA user@host\n",
             "notes/2024/todo.txt": b"write the thesis\n",
             # names a cache of an older layout used, and a block's name of this one
             "0123456789abcdef0123456789abcdef01234567/0": b"not a block\n",
             f"{KEY}.0": b"not a block either\n"}
    out = {}
    for name, data in files.items():
        path = directory / name
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        path.write_bytes(data)
        out[name] = path
    return out


def _snapshot(files: dict[str, Path]) -> dict[str, tuple]:
    return {name: (p.read_bytes(), p.stat().st_mtime_ns, p.stat().st_ino) if p.exists() else None
            for name, p in files.items()}


def _cache_bytes(directory: Path, theirs: dict[str, Path] = {}) -> int:
    """Every byte under DIR but the user's files (blocks, temporary files, marker, ledger)."""
    skip = set(theirs.values())
    return sum(p.lstat().st_size for p in directory.rglob("*")
               if p.is_file() and not p.is_symlink() and p not in skip)


def _block_file(directory: Path, data: bytes) -> Path:
    """The file under DIR that holds ``data`` (whatever the layout)."""
    found = [p for p in directory.rglob("*") if p.is_file() and not p.is_symlink()
             and p.stat().st_size >= len(data) and p.read_bytes().endswith(data)]
    assert len(found) == 1, found
    return found[0]


def _blocks(directory: Path) -> list[Path]:
    root = directory / ROOT
    return sorted(p for p in root.iterdir() if p.name.startswith(KEY[:8])) if root.exists() else []


# -- only what it wrote ----------------------------------------------------------------------

def test_a_users_files_in_dir_are_never_counted_nor_removed(tmp_path):
    """DIR is a directory of the user's (a home, a project): reading far past SIZE removes
    none of their files, in DIR or in its private subdirectories, whatever their names."""
    directory = tmp_path / "home"
    directory.mkdir(mode=0o700)
    files = _user_files(directory)
    before = _snapshot(files)
    size = 4 * BLOCK + 8192
    cache = DiskCache(str(directory), size)
    for i in range(40):
        cache.put(KEY, i, _block(i))
    again = DiskCache(str(directory), size)          # a later mount scans DIR
    again.put(KEY, 99, _block(99))
    assert _snapshot(files) == before
    assert 0 < _cache_bytes(directory, files) <= size
    assert again.get(KEY, 99, BLOCK) == _block(99)


def test_a_file_in_the_cache_directory_that_is_not_a_block_is_left_alone(tmp_path):
    """In the cache's own directory too: a file without a block's header, even under a
    block's name, is never served, counted nor removed."""
    directory = tmp_path / "cache"
    cache = DiskCache(str(directory), 4 * BLOCK + 8192)
    root = directory / ROOT
    key2 = DiskCache.object_key("http://127.0.0.1:1/other", "etag-1", BLOCK)
    planted = {"readme.txt": root / "readme.txt", "block-named": root / f"{key2}.0",
               "sized": root / f"{key2}.1"}
    planted["readme.txt"].write_bytes(b"mine\n")
    planted["block-named"].write_bytes(b"my own bytes\n")
    planted["sized"].write_bytes(b"x" * (BLOCK + 1024))
    before = _snapshot(planted)
    assert cache.get(key2, 0, 13) is None and cache.get(key2, 1, BLOCK) is None
    for i in range(20):
        cache.put(KEY, i, _block(i))
    cache.put(key2, 0, _block(0, 13))                # never written over a file not ours
    DiskCache(str(directory), 4 * BLOCK + 8192)
    assert _snapshot(planted) == before


def test_a_symlinked_dir_is_refused_and_nothing_is_written_through_it(tmp_path):
    victim = tmp_path / "victim"
    victim.mkdir(mode=0o700)
    report = victim / "report.pdf"
    report.write_bytes(b"%PDF-1.7 the victim's\n")
    link = tmp_path / "cache"
    link.symlink_to(victim)
    before = sorted(os.listdir(victim)), report.read_bytes()
    with pytest.raises(PermissionError) as refused:
        DiskCache(str(link), 1 << 20)
    assert str(link) in str(refused.value) and "symbolic link" in str(refused.value)
    assert (sorted(os.listdir(victim)), report.read_bytes()) == before


# -- the whole way to DIR (ssh's StrictModes) ------------------------------------------------

@pytest.fixture
def shared(request):
    """shared(mode) -> a root-owned directory every user can reach, of ``mode`` (1777: as
    /tmp; 0777: writable by all and not sticky); removed at the end."""
    made = []

    def _make(mode: int) -> Path:
        path = Path(tempfile.mkdtemp(prefix="tensorfs-shared-"))
        path.chmod(mode)
        made.append(path)
        return path

    yield _make
    for path in made:
        shutil.rmtree(path, ignore_errors=True)


def _tree(directory: Path) -> list[tuple[str, int]]:
    return sorted((str(p.relative_to(directory)), p.lstat().st_mode) for p in directory.rglob("*"))


@needs_users
@pytest.mark.parametrize("mode", [0o1777, 0o777])
@pytest.mark.parametrize("target", ["attacker", "nobody"])
def test_a_link_another_user_planted_on_the_way_to_dir_is_never_followed(users, shared, mode,
                                                                        target):
    """``--disk-cache /shared/link/sub``, where another user made ``link`` (pointing to a
    directory of theirs, or of nobody's): refused in one line naming the link; nothing is
    created in the directory it points to."""
    _, attacker = users
    base = shared(mode)
    theirs = base / "theirs"
    assert attacker.run("mkdir", "-m", "777", theirs).returncode == 0
    if target == "nobody":
        os.chown(theirs, 65534, 65534)
    link = base / "link"
    assert attacker.run("ln", "-s", theirs, link).returncode == 0
    assert link.lstat().st_uid == attacker.uid
    with pytest.raises(PermissionError) as refused:
        DiskCache(str(link / "sub"), 1 << 20)
    message = str(refused.value)
    assert "\n" not in message
    if mode & stat.S_ISVTX:
        assert f"{link} is a symbolic link of uid {attacker.uid}" in message
    else:                           # the shared directory itself already lets them swap DIR
        assert f"{base} (on the way to it)" in message and "not sticky" in message
    assert os.listdir(theirs) == []


@needs_users
@pytest.mark.parametrize("mode", [0o1777, 0o777])
def test_a_directory_another_user_owns_on_the_way_to_dir_is_refused(users, shared, mode):
    """``/shared/theirs/mine``: the victim's own private DIR, inside a directory another user
    owns (who can rename it away and put anything in its place)."""
    _, attacker = users
    theirs = shared(mode) / "theirs"
    assert attacker.run("mkdir", "-m", "777", theirs).returncode == 0
    with pytest.raises(PermissionError) as refused:
        DiskCache(str(theirs / "mine"), 1 << 20)
    why = (f"{theirs} (on the way to it): it belongs to uid {attacker.uid}" if mode & stat.S_ISVTX
           else f"{theirs.parent} (on the way to it): group or others can write it")
    assert why in str(refused.value)
    assert os.listdir(theirs) == []


def test_a_dir_below_a_world_writable_directory_that_is_not_sticky_is_refused(shared):
    """Under a 0777 directory anyone can rename the victim's own directory away and put a
    link in its place; under a sticky one (/tmp) no one but its owner can."""
    loose = shared(0o777)
    (loose / "mine").mkdir(mode=0o700)
    with pytest.raises(PermissionError) as refused:
        DiskCache(str(loose / "mine" / "cache"), 1 << 20)
    assert f"{loose} (on the way to it)" in str(refused.value)
    assert "not sticky" in str(refused.value)
    assert os.listdir(loose / "mine") == []
    sticky = shared(0o1777)
    (sticky / "mine").mkdir(mode=0o700)
    DiskCache(str(sticky / "mine" / "cache"), 1 << 20).close()


def test_links_of_the_users_own_on_the_way_to_dir_are_followed(tmp_path):
    """The rule refuses nothing a user's own links make: ``~/cache -> /data/me`` (absolute
    and relative links, ``..`` in a link)."""
    real = tmp_path / "data" / "me"
    real.mkdir(parents=True)
    (tmp_path / "abs").symlink_to(real)
    (tmp_path / "rel").symlink_to("data/me")
    (tmp_path / "up").mkdir()
    (tmp_path / "up" / "back").symlink_to("../data")
    for named in (tmp_path / "abs" / "c1", tmp_path / "rel" / "c2", tmp_path / "up/back/me/c3"):
        cache = DiskCache(str(named), 1 << 20)
        cache.put(KEY, 0, _block(0))
        cache.close()
    assert sorted(os.listdir(real)) == ["c1", "c2", "c3"]
    assert all((real / c / ROOT).is_dir() for c in ("c1", "c2", "c3"))


@needs_users
def test_a_link_of_the_users_own_that_leads_up_into_another_users_directory_is_refused(
        users, shared, tmp_path):
    """``..`` in a link is checked where it leads: ``mine/up -> ../theirs``, ``theirs`` another
    user's: refused naming it."""
    _, attacker = users
    base = shared(0o1777)
    (base / "mine").mkdir(mode=0o700)
    theirs = base / "theirs"
    assert attacker.run("mkdir", "-m", "777", theirs).returncode == 0
    (base / "mine" / "up").symlink_to("../theirs")
    with pytest.raises(PermissionError) as refused:
        DiskCache(str(base / "mine" / "up" / "cache"), 1 << 20)
    assert f"{theirs} (on the way to it): it belongs to uid {attacker.uid}" in str(refused.value)
    assert os.listdir(theirs) == []


def test_a_loop_of_links_on_the_way_is_one_line(tmp_path):
    (tmp_path / "a").symlink_to("b")
    (tmp_path / "b").symlink_to("a")
    with pytest.raises(PermissionError) as refused:
        DiskCache(str(tmp_path / "a" / "cache"), 1 << 20)
    assert "symbolic links on the way" in str(refused.value)


@pytest.mark.parametrize("mode", [0o770, 0o707, 0o777, 0o1777, 0o720])
def test_a_dir_others_can_write_is_refused(tmp_path, mode):
    directory = tmp_path / "cache"
    directory.mkdir()
    directory.chmod(mode)
    with pytest.raises(PermissionError) as refused:
        DiskCache(str(directory), 1 << 20)
    assert "can write" in str(refused.value) and str(directory) in str(refused.value)
    assert os.listdir(directory) == []


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give a directory to another user")
def test_a_dir_of_another_user_is_refused(tmp_path):
    directory = tmp_path / "cache"
    directory.mkdir(mode=0o700)
    os.chown(directory, 65534, 65534)
    with pytest.raises(PermissionError) as refused:
        DiskCache(str(directory), 1 << 20)
    assert "belongs to uid 65534" in str(refused.value)


def test_a_missing_dir_is_made_private(tmp_path):
    directory = tmp_path / "new" / "cache"
    cache = DiskCache(str(directory), 1 << 20)
    cache.put(KEY, 0, _block(0))
    for path in (directory, directory / ROOT):
        assert stat.S_IMODE(path.lstat().st_mode) == 0o700
    assert all(stat.S_IMODE(p.lstat().st_mode) == 0o600 for p in (directory / ROOT).iterdir())


@pytest.mark.parametrize("planted", ["symlink", "no-marker", "wrong-marker", "lax-mode"])
def test_a_cache_directory_not_made_by_the_cache_is_refused(tmp_path, planted):
    """DIR/tensorfs-blocks.v1 that the cache did not make (no marker, a link, a lax mode) is
    refused: its files are not the cache's to count or remove."""
    directory = tmp_path / "cache"
    directory.mkdir(mode=0o700)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o700)
    (elsewhere / "keep.txt").write_bytes(b"keep\n")
    root = directory / ROOT
    if planted == "symlink":
        root.symlink_to(elsewhere)
    elif planted == "lax-mode":
        DiskCache(str(directory), 1 << 20)          # ours: then someone opens it up
        (root / "keep.txt").write_bytes(b"keep\n")
        root.chmod(0o777)
    else:
        root.mkdir(mode=0o700)
        (root / "keep.txt").write_bytes(b"keep\n")
        if planted == "wrong-marker":
            (root / "TENSORFS-DISK-CACHE").write_bytes(b"something else\n")
    with pytest.raises(PermissionError) as refused:
        DiskCache(str(directory), 1 << 20)
    assert str(root) in str(refused.value)
    assert (elsewhere / "keep.txt").read_bytes() == b"keep\n"
    if planted != "symlink":
        assert (root / "keep.txt").read_bytes() == b"keep\n"


def test_a_symlink_under_a_blocks_name_is_never_followed(tmp_path):
    directory = tmp_path / "cache"
    cache = DiskCache(str(directory), 1 << 20)
    secret = tmp_path / "secret"
    secret.write_bytes(b"s" * BLOCK)
    (directory / ROOT / f"{KEY}.0").symlink_to(secret)
    assert cache.get(KEY, 0, BLOCK) is None
    cache.put(KEY, 0, _block(0))
    assert secret.read_bytes() == b"s" * BLOCK
    assert (directory / ROOT / f"{KEY}.0").is_symlink()


def test_a_relative_dir_stays_where_it_was_named(tmp_path, monkeypatch):
    """The daemon leaves the caller's directory for "/" after the cache is made: its blocks
    still go to DIR as named from where the command ran."""
    work, later = tmp_path / "work", tmp_path / "later"
    work.mkdir()
    later.mkdir(mode=0o777)
    monkeypatch.chdir(work)
    cache = DiskCache("rel", 1 << 20)
    monkeypatch.chdir(later)
    cache.put(KEY, 0, _block(0))
    assert cache.get(KEY, 0, BLOCK) == _block(0)
    assert os.listdir(later) == []
    assert [p.name for p in _blocks(work / "rel")] == [f"{KEY}.0"]


# -- every block verified ----------------------------------------------------------------

def _corrupt(path: Path, how: str) -> None:
    data = bytearray(path.read_bytes())
    if how == "data":
        data[-100:-96] = bytes(b ^ 0xFF for b in data[-100:-96])
    elif how == "header":
        data[20:24] = bytes(b ^ 0xFF for b in data[20:24])   # inside the key
    elif how == "truncated":
        data = data[:-1]
    elif how == "longer":
        data += b"\0" * 4
    elif how == "swapped":
        data = bytearray(_block_file(path.parents[1], _block(1)).read_bytes())
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("how", ["data", "header", "truncated", "longer", "swapped"])
def test_a_block_changed_on_disk_is_never_served(tmp_path, caplog, how):
    """4 bytes overwritten, a header changed, a file cut or grown, another block's file
    under its name: not served, removed (the caller fetches it again) and logged."""
    directory = tmp_path / "cache"
    cache = DiskCache(str(directory), 1 << 20)
    cache.put(KEY, 0, _block(0))
    cache.put(KEY, 1, _block(1))
    path = _block_file(directory, _block(0))
    _corrupt(path, how)
    with caplog.at_level(logging.WARNING, logger="tensorfs"):
        assert cache.get(KEY, 0, BLOCK) is None
    assert not path.exists()
    assert "block 0 failed its check" in caplog.text
    assert cache.get(KEY, 1, BLOCK) == _block(1)
    cache.put(KEY, 0, _block(0))                        # fetched again, kept again
    assert cache.get(KEY, 0, BLOCK) == _block(0)


def test_get_into_fills_the_callers_buffer(tmp_path):
    cache = DiskCache(str(tmp_path / "cache"), 1 << 20)
    cache.put(KEY, 3, _block(3, 1000))
    buf = bytearray(1000)
    assert cache.get_into(KEY, 3, buf) and bytes(buf) == _block(3, 1000)
    assert not cache.get_into(KEY, 3, bytearray(999))     # another length: not that block


def test_a_huge_file_under_a_blocks_name_is_not_read(tmp_path):
    """A file far larger than a block is judged by its header alone (never read whole): a
    sparse 64 GiB one would need 64 GiB of memory."""
    directory = tmp_path / "cache"
    cache = DiskCache(str(directory), 1 << 20)
    cache.put(KEY, 0, _block(0))
    path = _block_file(directory, _block(0))
    with open(path, "r+b") as f:
        f.truncate(64 << 30)
    assert cache.get(KEY, 0, BLOCK) is None
    assert not path.exists()                          # ours (its header says so), and bad


# -- one bound for every mount sharing DIR ---------------------------------------------------

WRITER = textwrap.dedent("""
    import sys
    sys.path.insert(0, sys.argv[1])
    from tensorfs.sources.diskcache import DiskCache
    directory, size, name, n, block = sys.argv[2], int(sys.argv[3]), sys.argv[4], int(sys.argv[5]), int(sys.argv[6])
    key = DiskCache.object_key("http://127.0.0.1:1/" + name, "v", block)
    cache = DiskCache(directory, size)
    for i in range(n):
        cache.put(key, i, bytes([i % 251]) * block)
        if i % 3 == 0:
            cache.get(key, i // 2, block)
    print("done")
""")


def test_mounts_sharing_dir_keep_it_within_one_bound(tmp_path):
    """Four processes write to one DIR at once: the bound holds for DIR as a whole, and
    none of them fails on a block another one removed."""
    directory = tmp_path / "cache"
    directory.mkdir(mode=0o700)
    files = _user_files(directory)
    before = _snapshot(files)
    size = 6 * BLOCK + 8192
    writers = [subprocess.Popen([sys.executable, "-c", WRITER, str(REPO), str(directory),
                                 str(size), f"m{k}", "60", str(BLOCK)],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
               for k in range(4)]
    for w in writers:
        out, err = w.communicate(timeout=120)
        assert w.returncode == 0 and out.strip() == "done" and err == "", err
    assert 0 < _cache_bytes(directory, files) <= size
    assert _snapshot(files) == before


def test_two_caches_in_one_process_share_the_bound(tmp_path):
    directory = tmp_path / "cache"
    size = 4 * BLOCK + 8192
    first, second = DiskCache(str(directory), size), DiskCache(str(directory), size)
    other = DiskCache.object_key("http://127.0.0.1:1/other", "etag-1", BLOCK)
    for i in range(12):
        first.put(KEY, i, _block(i))
        second.put(other, i, _block(100 + i))
    assert _cache_bytes(directory) <= size
    # the newest blocks are the ones kept (eviction by age across both)
    assert second.get(other, 11, BLOCK) == _block(111)
    assert first.get(KEY, 0, BLOCK) is None



def test_blocks_being_written_count_toward_the_bound_at_every_moment(tmp_path, monkeypatch):
    """Three mounts' caches on one DIR, eight blocks written at once: DIR holds at most SIZE
    while they are written, not only once they are in place.  (A block's temporary file was
    written before the lock and the ledger counted it: DIR held every block in flight on top
    of a full ledger, 8.4 MB in a 6M DIR under test_remote_cache_shared.)  Each writer is
    held once its bytes are written, until all have written or a second has passed: the
    moment DIR holds the most."""
    from tensorfs.sources import diskcache

    directory = tmp_path / "cache"
    size = 4 * BLOCK + 8192
    caches = [DiskCache(str(directory), size) for _ in range(3)]
    writers = 8
    held = threading.Barrier(writers)
    seen: list[int] = []
    write_all = diskcache._write_all

    def written_then_held(fd, head, data):
        write_all(fd, head, data)
        seen.append(_cache_bytes(directory))
        try:
            held.wait(timeout=1.0)
        except threading.BrokenBarrierError:
            pass
        seen.append(_cache_bytes(directory))

    monkeypatch.setattr(diskcache, "_write_all", written_then_held)
    threads = [threading.Thread(target=caches[k % 3].put, args=(KEY, k, _block(k)))
               for k in range(writers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert seen and max(seen) <= size, (max(seen), size)
    assert not [p for p in (directory / ROOT).iterdir() if p.name.endswith(".tmp")]
    kept = _blocks(directory)
    assert kept and all(caches[0].get(KEY, int(p.name.rsplit(".", 1)[1]), BLOCK) ==
                        _block(int(p.name.rsplit(".", 1)[1])) for p in kept)
    assert 0 < _cache_bytes(directory) <= size
    assert caches[0].usage()[0] == caches[1]._read_ledger()[0]      # the ledger is exact



BUSY_WRITER = textwrap.dedent("""
    import sys, threading
    sys.path.insert(0, sys.argv[1])
    from tensorfs.sources.diskcache import DiskCache
    directory, size, name, block = sys.argv[2], int(sys.argv[3]), sys.argv[4], int(sys.argv[5])
    key = DiskCache.object_key("http://127.0.0.1:1/" + name, "v", block)
    cache = DiskCache(directory, size)
    def run(t):
        for i in range(12):
            cache.put(key, t * 100 + i, bytes([i]) * block)
    threads = [threading.Thread(target=run, args=(t,)) for t in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    print("done")
""")




def test_busy_writers_of_big_blocks_never_pass_the_bound(tmp_path):
    """Three processes of three threads put 4 MiB blocks into a 6M DIR (room for one block)
    while DIR is measured: it never holds more than SIZE.  Two windows held two blocks at
    once: temporary files written outside the ledger, then a temporary file made at full size
    before its room was known and removed for want of it."""
    directory = tmp_path / "cache"
    size, block = 6 << 20, 4 << 20
    writers = [subprocess.Popen([sys.executable, "-c", BUSY_WRITER, str(REPO), str(directory),
                                 str(size), f"m{k}", str(block)],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
               for k in range(3)]
    peak = 0
    while any(w.poll() is None for w in writers):
        peak = max(peak, bytes_at_one_moment(directory))
    for w in writers:
        out, err = w.communicate(timeout=120)
        assert w.returncode == 0 and out.strip() == "done" and err == "", err
    assert 0 < peak <= size, peak


def _start_ticks(pid: int) -> int:
    with open(f"/proc/{pid}/stat", "rb") as f:
        return int(f.read().rsplit(b")", 1)[1].split()[19])


def test_temporary_files_of_a_dead_writer_are_removed_and_a_live_ones_counted(tmp_path):
    directory = tmp_path / "cache"
    size = 4 * BLOCK + 8192
    DiskCache(str(directory), size)
    root = directory / ROOT
    root.mkdir(mode=0o700, exist_ok=True)
    dead = subprocess.Popen(["true"])
    dead.wait()
    live = subprocess.Popen(["sleep", "600"])
    try:
        ticks = _start_ticks(live.pid)
        stale = [root / f".{KEY}.7.{dead.pid}.{ticks}.140000000000.tmp",
                 root / f".{KEY}.8.{live.pid}.{ticks + 1}.140000000000.tmp"]   # pid reused
        writing = root / f".{KEY}.9.{live.pid}.{ticks}.140000000000.tmp"
        for path in stale + [writing]:
            path.write_bytes(b"\0" * (2 * BLOCK))
        cache = DiskCache(str(directory), size)         # a later mount's scan
        assert [p.exists() for p in stale] == [False, False]
        assert writing.exists()
        for i in range(10):
            cache.put(KEY, i, _block(i))
        assert writing.exists()
        assert _cache_bytes(directory) <= size          # the live writer's file counted
        assert len(_blocks(directory)) <= 2
    finally:
        live.kill()
        live.wait()
    DiskCache(str(directory), size).put(KEY, 20, _block(20))
    assert not writing.exists()                         # its writer is gone now


def test_a_full_disk_leaves_no_temporary_file(tmp_path):
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs",
                                            str(tmp_path)], capture_output=True).returncode:
        pytest.skip("needs root to mount a small tmpfs")
    try:
        directory = tmp_path / "cache"
        cache = DiskCache(str(directory), 64 << 20)
        for i in range(8):
            cache.put(KEY, i, _block(i))               # ENOSPC after a few: not kept, no error
        assert not [p for p in (directory / ROOT).iterdir() if p.name.endswith(".tmp")]
        kept = _blocks(directory)
        assert kept and all(cache.get(KEY, int(p.name.rsplit(".", 1)[1]), BLOCK) for p in kept)
        cache.close()
    finally:
        subprocess.run(["umount", "-l", str(tmp_path)], check=True)


# -- keys: endpoint, path, version, block size ------------------------------------------------

def test_the_key_tells_endpoint_path_version_and_block_size_apart():
    base = ("https://huggingface.co/org/m/resolve/abc/model.safetensors", "abc", BLOCK)
    variants = [("https://mirror.example/org/m/resolve/abc/model.safetensors", "abc", BLOCK),
                ("https://huggingface.co/org/m/resolve/abc/model2.safetensors", "abc", BLOCK),
                (base[0], "abd", BLOCK), (base[0], "abc", 2 * BLOCK)]
    keys = {DiskCache.object_key(*v) for v in [base] + variants}
    assert len(keys) == 5


def test_transports_name_their_endpoint(tmp_path):
    """Transport.identity: the same path through two endpoints is two identities (the
    disk cache key), and no credential is in it."""
    pytest.importorskip("obstore")
    from tensorfs.sources.remote import RemoteSettings
    from tensorfs.sources.transports import transport_for

    def s3(endpoint):
        return transport_for("s3://models/m.safetensors",
                             RemoteSettings(storage_options={"endpoint_url": endpoint}))

    one, two = s3("http://127.0.0.1:9000"), s3("http://127.0.0.1:9001")
    assert one.identity("s3://models/m.safetensors") != two.identity("s3://models/m.safetensors")
    assert "127.0.0.1:9000" in one.identity("s3://models/m.safetensors")
    http = transport_for("http://user:pw@127.0.0.1:8080/m.safetensors", RemoteSettings())
    shown = "http://127.0.0.1:8080/m.safetensors"
    assert http.identity(shown) == shown
    other = transport_for("http://127.0.0.1:8081/m.safetensors", RemoteSettings())
    assert other.identity("http://127.0.0.1:8081/m.safetensors") != shown
