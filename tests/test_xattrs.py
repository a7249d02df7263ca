"""Extended attributes (SPEC §7): user.tensorfs.{dtype,shape,offset,shard} on every tensor
file, read with os.getxattr / os.listxattr and getfattr, compared with the reference readers;
nothing on directories and generated files."""

from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess

import gguf
import pytest
from safetensors import safe_open

from tests.support.models import write_gguf, write_safetensors
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
    answer coreutils remembers per file system (docs/serving.md)."""
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
