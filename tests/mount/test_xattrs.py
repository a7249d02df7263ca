"""Extended attributes (docs/reference/shards-and-metadata.md): user.tensorfs.{dtype,shape,offset,shard} on every tensor
file, read with os.getxattr / os.listxattr and getfattr, compared with the reference readers;
nothing on directories and generated files."""

from __future__ import annotations

import errno
import hashlib
import json
import os
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor

import gguf
import pytest
from safetensors import safe_open

from tests.support import in_fuse_request, run_tensorfs, wait_for
from tests.support.bigmodels import sha256_of_range, write_sparse_safetensors
from tests.support.models import write_gguf, write_safetensors
from tests.support.reliability_models import slow_filesystem
from tests.support.shards import write_hf_shards, write_split_gguf

NAMES = ["user.tensorfs.dtype", "user.tensorfs.offset", "user.tensorfs.shape", "user.tensorfs.shard"]


def _xattrs(path) -> dict[str, str]:
    return {name: os.getxattr(path, name).decode() for name in os.listxattr(path)}


def _safetensors_offsets(path) -> dict[str, int]:
    """Absolute data offsets, from the header as safe_open's file declares it."""
    data = open(path, "rb").read()
    n = int.from_bytes(data[:8], "little")
    header = json.loads(data[8:8 + n])
    return {k: 8 + n + v["data_offsets"][0] for k, v in header.items() if k != "__metadata__"}


def test_tensor_files_of_a_gguf_carry_their_description(tmp_path, mount):
    model = tmp_path / "x.gguf"
    write_gguf(model)
    mnt = mount(model)
    doc = json.loads((mnt / "metadata.json").read_bytes())
    for t in gguf.GGUFReader(model).tensors:
        entry = doc["tensors"][t.name]
        for path in (mnt / entry["path"], mnt / (entry["path"] + ".npy")):
            assert sorted(os.listxattr(path)) == NAMES
            assert _xattrs(path) == {
                "user.tensorfs.dtype": t.tensor_type.name,
                "user.tensorfs.shape": json.dumps([int(n) for n in reversed(t.shape.tolist())]),
                "user.tensorfs.offset": str(t.data_offset),
                "user.tensorfs.shard": "x.gguf",
            }


def test_sharded_safetensors_name_the_shard_holding_each_tensor(tmp_path, mount):
    index, _, _ = write_hf_shards(tmp_path / "hf")
    mnt = mount(index)
    doc = json.loads((mnt / "metadata.json").read_bytes())
    for shard in sorted(set(json.loads(index.read_text())["weight_map"].values())):
        offsets = _safetensors_offsets(index.parent / shard)
        with safe_open(str(index.parent / shard), "numpy") as f:
            for name in f.keys():
                tensor = f.get_tensor(name)
                attrs = _xattrs(mnt / doc["tensors"][name]["path"])
                assert attrs["user.tensorfs.shard"] == shard
                assert json.loads(attrs["user.tensorfs.shape"]) == list(tensor.shape)
                assert int(attrs["user.tensorfs.offset"]) == offsets[name]
                assert attrs["user.tensorfs.dtype"] == doc["tensors"][name]["dtype"]


@pytest.mark.skipif(shutil.which("getfattr") is None, reason="getfattr (attr package) not installed")
def test_getfattr_dump_of_a_split_gguf_tensor(tmp_path, mount):
    files, _ = write_split_gguf(tmp_path / "gg")
    mnt = mount(files[0])
    reader = gguf.GGUFReader(files[-1])
    t = reader.tensors[0]
    path = mnt / json.loads((mnt / "metadata.json").read_bytes())["tensors"][t.name]["path"]
    out = subprocess.run(["getfattr", "-d", "--absolute-names", path], capture_output=True,
                         text=True, check=True).stdout
    assert f'user.tensorfs.shard="{files[-1].name}"' in out.splitlines()
    assert f'user.tensorfs.offset="{t.data_offset}"' in out.splitlines()
    assert f'user.tensorfs.dtype="{t.tensor_type.name}"' in out.splitlines()


def test_missing_attributes_directories_and_generated_files(tmp_path, mount):
    model = tmp_path / "m.safetensors"
    write_safetensors(model)
    mnt = mount(model)
    doc = json.loads((mnt / "metadata.json").read_bytes())
    tensor = mnt / doc["tensors"]["lm_head.weight"]["path"]
    with pytest.raises(OSError) as caught:
        os.getxattr(tensor, "user.tensorfs.nope")
    assert caught.value.errno == errno.ENODATA
    generated = [mnt / "metadata.json", mnt / "header.bin", mnt / "metadata" / "format"]
    directories = [mnt, mnt / "metadata", tensor.parent]
    for path in generated + directories:
        assert os.listxattr(path) == [], path
        with pytest.raises(OSError) as caught:
            os.getxattr(path, "user.tensorfs.dtype")
        assert caught.value.errno == errno.ENODATA
    with pytest.raises(OSError) as caught:
        os.setxattr(tensor, "user.tensorfs.dtype", b"F16")
    assert caught.value.errno == errno.EROFS
    assert os.getxattr(tensor, "user.tensorfs.dtype") == b"F32"


def test_other_namespaces_are_unsupported_so_ls_stops_asking(tmp_path, mount):
    """ls -l asks every file for its SELinux label and ACLs; EOPNOTSUPP (not ENODATA) is the
    answer coreutils remembers per file system (docs/internals/serving.md)."""
    model = tmp_path / "m.safetensors"
    write_safetensors(model)
    mnt = mount(model)
    doc = json.loads((mnt / "metadata.json").read_bytes())
    tensor = mnt / doc["tensors"]["lm_head.weight"]["path"]
    for path in (tensor, mnt, mnt / "metadata.json"):
        for name in ("security.selinux", "system.posix_acl_access", "trusted.x"):
            with pytest.raises(OSError) as caught:
                os.getxattr(path, name)
            assert caught.value.errno == errno.EOPNOTSUPP, (path, name)


# -- the sha256 of a large tensor: an ask that waits, holding no libfuse thread -------------

def _sha256_xattr(path) -> bytes | int:
    """The value, or the errno the ask was answered with."""
    try:
        return os.getxattr(path, "user.tensorfs.sha256")
    except OSError as error:
        return error.errno


@pytest.mark.slow
def test_the_sha256_of_large_tensors_never_holds_a_request(tmp_path, mount):
    """Twelve asks at once for the sha256 of twelve 64 MiB tensors (the review's eleven 4 GiB
    ones, smaller), more than libfuse's ten request threads: each waits for its value, the
    hashing done in the background; meanwhile every other request is answered; each value
    is the sha256 of the tensor's bytes, kept."""
    model = tmp_path / "big.safetensors"
    tensors = write_sparse_safetensors(model, {f"t{i:02d}": 64 << 20 for i in range(12)})
    mnt = mount(model)
    with ThreadPoolExecutor(12) as pool:
        asked = pool.map(lambda name: _sha256_xattr(mnt / name), tensors)
        with ThreadPoolExecutor(12) as others:
            stats = list(others.map(lambda _: os.stat(mnt / "metadata.json").st_size,
                                    range(12)))
        doc = json.loads((mnt / "metadata.json").read_bytes())
        assert (mnt / "t05").open("rb").read(2) == b"\x06\x00"
        assert os.getxattr(mnt / "t05", "user.tensorfs.dtype") == b"U8"
        asked = list(asked)
    assert len(stats) == 12 and set(stats) == {len((mnt / "metadata.json").read_bytes())}
    assert sorted(doc["tensors"]) == sorted(tensors)
    assert asked == [sha256_of_range(model, *tensors[name]).encode() for name in tensors]
    assert _sha256_xattr(mnt / "t00") == asked[0]              # kept


@pytest.fixture
def slow_source(tmp_path_factory):
    """``(src, slow)``: a model written to ``src`` is read from ``slow``, each read taking
    as long as ``src/DELAY`` says (tests/support/reliability_models.slow_filesystem)."""
    with slow_filesystem(tmp_path_factory.mktemp("slowfs"), 0.0) as (src, slow):
        yield src, slow


def _getfattr_sha256(path) -> subprocess.Popen:
    return subprocess.Popen(["getfattr", "--absolute-names", "--only-values", "-n", "user.tensorfs.sha256",
                             str(path)], stdout=subprocess.PIPE, stderr=subprocess.PIPE)


@pytest.mark.slow
def test_the_first_getfattr_gets_the_sha256_while_one_thread_serves_the_rest(
        tmp_path, slow_source):
    """The first `getfattr -n user.tensorfs.sha256` of a tensor over 1 MiB gives the value
    (exit 0): it waits for the hash, and no libfuse thread waits with it: a mount served by
    one thread (`-o nothreads`) answers stat, listings and other attributes meanwhile.  The
    hash cannot end before its reads of the slow source do (32 of 128 KiB, 0.1 s each)."""
    src, slow = slow_source
    tensors = write_sparse_safetensors(src / "m.safetensors", {"big": 4 << 20, "small": 16})
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    assert run_tensorfs("mount", slow / "m.safetensors", mnt, "-o", "nothreads").returncode == 0
    try:
        (src / "DELAY").write_text("0.1")
        asker = _getfattr_sha256(mnt / "big")
        assert wait_for(lambda: asker.poll() is not None or in_fuse_request(asker.pid, asker.pid),
                        30)
        assert os.stat(mnt / "small").st_size == 16
        assert {"big", "small", "metadata.json"} <= set(os.listdir(mnt))
        assert os.getxattr(mnt / "small", "user.tensorfs.dtype") == b"U8"
        assert asker.poll() is None, asker.communicate()          # still waiting for its value
        (src / "DELAY").unlink()
        out, err = asker.communicate(timeout=120)
        assert (asker.returncode, err) == (0, b"")
        assert out == sha256_of_range(src / "m.safetensors", *tensors["big"]).encode()
    finally:
        (src / "DELAY").unlink(missing_ok=True)
        assert run_tensorfs("unmount", mnt).returncode == 0


@pytest.mark.slow
def test_a_killed_getfattr_ends_its_wait_and_the_hash_no_one_waits_for(tmp_path, slow_source):
    """FUSE INTERRUPT: a getfattr waiting for the sha256 of a large tensor is killed
    (SIGKILL): its request is answered at once (EINTR), so the process goes without waiting
    for the hash (minutes here: 256 MiB read 128 KiB at a time, 0.05 s each), the hash that
    no one waits for any more stops, and the mount goes on serving: asked again, the value
    comes."""
    src, slow = slow_source
    tensors = write_sparse_safetensors(src / "m.safetensors", {"big": 256 << 20, "small": 16})
    mnt, log = tmp_path / "mnt", tmp_path / "daemon.log"
    mnt.mkdir()
    assert run_tensorfs("mount", slow / "m.safetensors", mnt, "--log", log,
                        "--debug").returncode == 0
    try:
        (src / "DELAY").write_text("0.05")
        asker = _getfattr_sha256(mnt / "big")
        assert wait_for(lambda: "sha256 of tensor 'big': started" in log.read_text(), 30)
        assert asker.poll() is None, asker.communicate()          # waiting for its value
        asker.kill()
        asker.wait(timeout=20)                                    # not the hash's minutes
        assert wait_for(lambda: "sha256 of tensor 'big': cancelled (no one waits for it any "
                                "more)" in log.read_text(), 30), log.read_text()[-3000:]
        assert os.getxattr(mnt / "small", "user.tensorfs.dtype") == b"U8"
        (src / "DELAY").unlink()
        asker = _getfattr_sha256(mnt / "big")
        out, err = asker.communicate(timeout=300)
        assert (asker.returncode, err) == (0, b"")
        assert out == sha256_of_range(src / "m.safetensors", *tensors["big"]).encode()
    finally:
        (src / "DELAY").unlink(missing_ok=True)
        assert run_tensorfs("unmount", mnt).returncode == 0


@pytest.mark.slow
def test_a_killed_getfattr_leaves_the_hash_to_another_that_waits(tmp_path, slow_source):
    """Two getfattr wait for one tensor's sha256; one is killed: the hash goes on for the
    other, which gets the value."""
    src, slow = slow_source
    tensors = write_sparse_safetensors(src / "m.safetensors", {"big": 16 << 20})
    mnt, log = tmp_path / "mnt", tmp_path / "daemon.log"
    mnt.mkdir()
    assert run_tensorfs("mount", slow / "m.safetensors", mnt, "--log", log,
                        "--debug").returncode == 0
    try:
        (src / "DELAY").write_text("0.05")
        killed, kept = _getfattr_sha256(mnt / "big"), _getfattr_sha256(mnt / "big")
        assert wait_for(lambda: "sha256 of tensor 'big': started" in log.read_text(), 30)
        assert wait_for(lambda: in_fuse_request(kept.pid, kept.pid), 30)
        assert killed.poll() is None, killed.communicate()
        killed.kill()
        killed.wait(timeout=20)
        assert wait_for(lambda: "request 1 interrupted" in log.read_text()
                        or "request 2 interrupted" in log.read_text(), 30)
        out, err = kept.communicate(timeout=300)
        assert (kept.returncode, err) == (0, b"")
        assert out == sha256_of_range(src / "m.safetensors", *tensors["big"]).encode()
        assert "cancelled" not in log.read_text()
    finally:
        (src / "DELAY").unlink(missing_ok=True)
        assert run_tensorfs("unmount", mnt).returncode == 0


def test_an_edited_large_tensor_answers_the_sha256_of_its_new_bytes(tmp_path, mount):
    """With --edits, a raw tensor file over 1 MiB rewritten in place: its sha256, hashed by
    the mount's long work like the model's, is of the new bytes (not the value the model's
    bytes had under the same tensor name), and the first ask after the edit gets it."""
    model = tmp_path / "m.safetensors"
    tensors = write_sparse_safetensors(model, {"big": 2 << 20})
    mnt = mount(model, "--edits", tmp_path / "edits")
    before = os.getxattr(mnt / "big", "user.tensorfs.sha256")
    assert before == sha256_of_range(model, *tensors["big"]).encode()
    new = bytes(range(256)) * (8 << 10)
    (mnt / "big").write_bytes(new)
    assert os.getxattr(mnt / "big", "user.tensorfs.sha256") == \
        hashlib.sha256(new).hexdigest().encode() != before


def test_the_sha256_of_a_tensor_up_to_1_mib_is_answered_by_the_ask(tmp_path, mount):
    """What one read request may ask for is hashed in the request; one byte more is not."""
    model = tmp_path / "m.safetensors"
    tensors = write_sparse_safetensors(model, {"small": 1 << 20, "large": (1 << 20) + 1})
    mnt = mount(model)
    assert _sha256_xattr(mnt / "small") == sha256_of_range(model, *tensors["small"]).encode()
    assert _sha256_xattr(mnt / "large") == sha256_of_range(model, *tensors["large"]).encode()
