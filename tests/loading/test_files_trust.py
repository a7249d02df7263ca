"""files/ never grants more than its source: a planted link to a file outside the model's
directory is not served, a file keeps its owner and mode (masked read-only) so that a second
user under ``-o allow_other`` is refused what the source refuses, a FIFO or socket is not
served (and does not hang the mount), a Hugging Face cache snapshot (links into its own
``../../blobs``) still mounts; the same rule for shards.  A directory of many files mounts
and serves under a low descriptor limit.  A file changed under an open descriptor of files/
reads EIO, never new bytes nor a short file."""

from __future__ import annotations

import errno
import json
import os
import shutil
import socket
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save_file

from tests.support import mount_expecting_refusal
from tests.support.commands import TENSORFS, run_tensorfs
from tests.support.mounts import fuse_mounts_under
from tests.support.shards import write_hf_shards
from tests.support.users import needs_users


def _model(directory: Path) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    directory.chmod(0o755)
    save_file({"w": np.arange(64, dtype=np.float32)}, str(directory / "model.safetensors"))
    (directory / "model.safetensors").chmod(0o644)
    (directory / "config.json").write_text('{"model_type": "llama"}\n')
    (directory / "config.json").chmod(0o644)
    return directory


def _mount(model, mnt: Path, *options, env=None) -> subprocess.CompletedProcess:
    mnt.mkdir()
    mnt.chmod(0o755)
    return run_tensorfs("mount", model, mnt, *options, env=env, timeout=60)


def _unmount(mnt: Path) -> None:
    result = run_tensorfs("unmount", mnt)
    assert result.returncode == 0, result.stderr


@needs_users
def test_a_second_user_gets_no_more_than_the_source_grants(shared_dir, users):
    """allow_other: a planted link to /etc/shadow is not served; a root 0600 file beside
    the model shows 0400 root and the other user is refused it; a 0644 one is read."""
    _, attacker = users
    model = _model(shared_dir / "model")
    os.symlink("/etc/shadow", model / "notes.txt")
    secret = model / "hf_token.txt"
    secret.write_text("hf_secret\n")
    secret.chmod(0o600)
    outside = shared_dir / "elsewhere.txt"
    outside.write_text("not the model's\n")
    os.symlink("../elsewhere.txt", model / "relative.txt")
    log = shared_dir / "daemon.log"
    mnt = shared_dir / "mnt"
    result = _mount(model, mnt, "-o", "allow_other", "--log", log)
    assert result.returncode == 0, result.stderr
    try:
        files = mnt / "files"
        assert sorted(os.listdir(files)) == ["config.json", "hf_token.txt", "model.safetensors"]
        st = os.stat(files / "hf_token.txt")
        assert (st.st_mode & 0o777, st.st_uid, st.st_gid) == (0o400, 0, 0)
        refused = attacker.run("cat", str(files / "hf_token.txt"))
        assert refused.returncode != 0 and "Permission denied" in refused.stderr, refused
        assert "hf_secret" not in refused.stdout
        read = attacker.run("cat", str(files / "config.json"))
        assert read.returncode == 0 and read.stdout == '{"model_type": "llama"}\n', read
        assert attacker.run("cat", str(files / "notes.txt")).returncode != 0
        text = log.read_text()
        assert "notes.txt: not served in files/" in text and "outside the model's directory" in text
        assert "relative.txt: not served in files/" in text
    finally:
        _unmount(mnt)


@needs_users
def test_a_private_model_stays_private_under_allow_other(shared_dir, users):
    """Tensors, headers and metadata are made from the model: a root 0600 model mounted
    with allow_other grants the other user nothing (0400 files, 0500 directories); a
    0644 one is read."""
    _, attacker = users
    private = _model(shared_dir / "private")
    (private / "model.safetensors").chmod(0o600)
    public = _model(shared_dir / "public")
    mounts = {}
    try:
        for name, model in (("private", private), ("public", public)):
            mnt = shared_dir / f"mnt-{name}"
            result = _mount(model / "model.safetensors", mnt, "-o", "allow_other")
            assert result.returncode == 0, result.stderr
            mounts[name] = mnt
        private_mnt, public_mnt = mounts["private"], mounts["public"]
        assert os.stat(private_mnt / "w").st_mode & 0o777 == 0o400
        assert os.stat(private_mnt).st_mode & 0o777 == 0o700   # owner write: a copy can be removed
        assert os.stat(public_mnt / "w").st_mode & 0o777 == 0o444
        for path in ("w", "metadata.json", "header.bin", "files/model.safetensors"):
            refused = attacker.run("cat", str(private_mnt / path))
            assert refused.returncode != 0 and "Permission denied" in refused.stderr, path
        assert attacker.run("ls", str(private_mnt)).returncode != 0
        read = attacker.run("sh", "-c", f"cat {public_mnt / 'w'} | wc -c")
        assert read.returncode == 0 and int(read.stdout) == 64 * 4, read
    finally:
        for mnt in mounts.values():
            _unmount(mnt)


def test_a_fifo_or_socket_beside_the_model_is_not_served(tmp_path, mount):
    model = _model(tmp_path / "model")
    os.mkfifo(model / "pipe.txt")
    os.symlink("pipe.txt", model / "link-to-pipe.txt")
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(model / "sock.txt"))
    try:
        mnt = mount(model)          # the mount returns (a FIFO opened for reading would wait)
        assert sorted(os.listdir(mnt / "files")) == ["config.json", "model.safetensors"]
    finally:
        server.close()


def test_local_names_that_are_not_plain_file_names_are_not_served(tmp_path, mount):
    model = _model(tmp_path / "model")
    hostile = ["esc\x1b[31mred.txt", "rtl\u202etxt.exe", "a%252F..%252Fb", "nul%00byte.txt",
               "\uff0e\uff0e", "new\nline.txt"]
    for name in hostile:
        (model / name).write_text("x\n")
    log = tmp_path / "daemon.log"
    mnt = mount(model, "--log", log)
    assert sorted(os.listdir(mnt / "files")) == ["config.json", "model.safetensors"]
    text = log.read_text()
    assert text.count("not served in files/") == len(hostile), text
    assert "\x1b" not in text and "\u202e" not in text


def _hf_cache(root: Path, repo: str = "models--org--name") -> Path:
    """A Hugging Face cache repo as huggingface_hub lays it out: blobs named by hash,
    snapshots/REV/NAME -> ../../blobs/HASH."""
    plain = _model(root / "download")
    snapshot = root / repo / "snapshots" / "0123abcd"
    blobs = root / repo / "blobs"
    snapshot.mkdir(parents=True)
    blobs.mkdir()
    for i, local in enumerate(sorted(plain.iterdir())):
        blob = blobs / f"{i:040x}"
        shutil.copyfile(local, blob)
        os.symlink(f"../../blobs/{blob.name}", snapshot / local.name)
    return snapshot


def test_a_hugging_face_cache_snapshot_mounts_and_serves(tmp_path, mount):
    snapshot = _hf_cache(tmp_path)
    other = tmp_path / "models--someone--else" / "blobs"
    other.mkdir(parents=True)
    (other / ("f" * 40)).write_text("another repo's blob\n")
    os.symlink(f"../../../models--someone--else/blobs/{'f' * 40}", snapshot / "stolen.txt")
    log = tmp_path / "daemon.log"
    mnt = mount(snapshot, "--log", log)
    assert sorted(os.listdir(mnt / "files")) == ["config.json", "model.safetensors"]
    for name in ("config.json", "model.safetensors"):
        assert (mnt / "files" / name).read_bytes() == (snapshot / name).read_bytes()
    assert "stolen.txt: not served in files/" in log.read_text()


def test_hf_shards_through_links_mount_and_a_shard_linked_outside_is_refused(tmp_path, mount):
    plain = tmp_path / "plain"
    _, _, weight_map = write_hf_shards(plain)
    repo = tmp_path / "models--org--sharded"
    snapshot, blobs = repo / "snapshots" / "rev", repo / "blobs"
    snapshot.mkdir(parents=True)
    blobs.mkdir()
    for i, local in enumerate(sorted(plain.iterdir())):
        shutil.copyfile(local, blobs / f"{i:040x}")
        os.symlink(f"../../blobs/{i:040x}", snapshot / local.name)
    mnt = mount(snapshot)
    for name in sorted(set(weight_map.values())):
        assert (mnt / "files" / name).read_bytes() == (plain / name).read_bytes()
    # a plain directory whose shard is a link out of it: refused, in one line
    hostile = tmp_path / "hostile"
    shutil.copytree(plain, hostile)
    shard = min(weight_map.values())
    (hostile / shard).unlink()
    os.symlink(plain / shard, hostile / shard)
    (tmp_path / "refused").mkdir()
    result, mounted = mount_expecting_refusal(hostile, tmp_path / "refused")
    assert result.returncode != 0
    assert not mounted
    assert result.stderr.count("\n") == 1 and "outside the model's directory" in result.stderr, \
        result.stderr


@pytest.mark.slow
def test_many_files_under_a_low_descriptor_limit(tmp_path):
    """40 shards, their index and 999 other files mount and serve under 256 descriptors: companions
    are opened when read, a few at a time."""
    model = tmp_path / "many"
    tensors = {f"t{i}": np.full(8, i, dtype=np.float32) for i in range(80)}
    _, _, weight_map = write_hf_shards(model, n_shards=40, tensors=tensors)
    for i in range(999):
        (model / f"extra{i:04d}.txt").write_text(f"file {i}\n")
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    result = subprocess.run(["prlimit", "--nofile=256", "--", *TENSORFS, "mount", str(model),
                             str(mnt), "--log", str(tmp_path / "daemon.log")],
                            check=False, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    try:
        files = mnt / "files"
        assert len(os.listdir(files)) == 999 + 40 + 1
        for i in range(999):
            assert (files / f"extra{i:04d}.txt").read_text() == f"file {i}\n"

        def read(i: int) -> str:           # at once: files closed to make room, none in use
            fd = os.open(files / f"extra{i % 999:04d}.txt", os.O_RDONLY)
            try:        # not from the page cache: the daemon reads it again
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                return os.pread(fd, 100, 0).decode()
            finally:
                os.close(fd)
        with ThreadPoolExecutor(8) as pool:
            assert list(pool.map(read, range(2000))) == [f"file {i % 999}\n" for i in range(2000)]
        doc = json.loads((mnt / "metadata.json").read_text())
        for name in ("t0", "t39", "t79"):
            data = (mnt / doc["tensors"][name]["path"]).read_bytes()
            assert data == tensors[name].tobytes(), name
        for shard in sorted(set(weight_map.values()))[:5]:
            assert (files / shard).read_bytes() == (model / shard).read_bytes()
    finally:
        _unmount(mnt)


def test_running_out_of_descriptors_is_named_in_one_line(tmp_path):
    model = tmp_path / "many"
    write_hf_shards(model, n_shards=40,
                    tensors={f"t{i}": np.full(4, i, dtype=np.float32) for i in range(40)})
    (tmp_path / "mnt").mkdir()
    result = subprocess.run(["prlimit", "--nofile=30", "--", *TENSORFS, "mount", str(model),
                             str(tmp_path / "mnt")], check=False, capture_output=True, text=True, timeout=60)
    assert result.returncode != 0
    assert fuse_mounts_under(tmp_path / "mnt") == []
    assert result.stderr.count("\n") == 1, result.stderr
    assert "too many open files" in result.stderr and "internal error" not in result.stderr


def _change(path: Path, how: str) -> None:
    data = path.read_bytes()
    if how == "rewritten":
        with open(path, "r+b") as f:
            f.write(b"PWNED")
        os.utime(path, ns=(path.stat().st_atime_ns, path.stat().st_mtime_ns + 10**9))
    elif how == "truncated":
        os.truncate(path, len(data) // 2)
    else:
        with open(path, "ab") as f:
            f.write(b"more bytes than st_size said")


@pytest.mark.parametrize("how", ["rewritten", "truncated", "grown"])
def test_an_open_file_changed_under_it_reads_eio(tmp_path, mount, how):
    """A descriptor opened on files/X before X changed: EIO, on the default serving path,
    for the model file and a companion alike; never new bytes, never a short file."""
    model = _model(tmp_path / "model")
    (model / "tokenizer.json").write_bytes(os.urandom(256 << 10))
    mnt = mount(model)
    for name in ("model.safetensors", "tokenizer.json"):
        served = mnt / "files" / name
        size = served.stat().st_size
        with open(served, "rb", buffering=0) as f:
            _change(model / name, how)
            try:
                got = os.pread(f.fileno(), size + 100, 0)
            except OSError as error:
                assert error.errno == errno.EIO, name
            else:
                pytest.fail(f"{name}: read {len(got)} bytes after it was {how}")
