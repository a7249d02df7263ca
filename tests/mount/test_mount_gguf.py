"""GGUF files written by gguf-py, mounted for real, read back with Unix tools and numpy,
compared with gguf-py's GGUFReader on the same file."""

from __future__ import annotations

import hashlib
import json
import os
import random
import subprocess
import threading

import gguf
import numpy as np
import pytest

from tests.support.models import GGUF_ARRAYS, GGUF_KV, finish_gguf, write_gguf

TYPE_NAMES = {t: t.name.lower() for t in gguf.GGUFValueType}


@pytest.fixture(params=["little", "big"])
def gguf_model(request, tmp_path):
    path = tmp_path / f"model-{request.param}.gguf"
    write_gguf(path, big_endian=request.param == "big")
    return path


def _paths(mnt):
    return json.loads((mnt / "metadata.json").read_bytes())


def test_raw_files_and_npy_views_match_the_reference_reader(gguf_model, mount):
    mnt = mount(gguf_model)
    reader = gguf.GGUFReader(gguf_model)
    doc = _paths(mnt)
    assert len(doc["tensors"]) == len(reader.tensors)
    for tensor in reader.tensors:
        entry = doc["tensors"][tensor.name]
        raw = (mnt / entry["path"]).read_bytes()
        assert raw == tensor.data.tobytes()
        assert entry["offset"] == tensor.data_offset
        assert entry["shape"] == [int(n) for n in reversed(tensor.shape.tolist())]
        assert entry["dtype"] == tensor.tensor_type.name
        expected = np.asarray(tensor.data).reshape(entry["shape"])
        for mode in (None, "r"):
            loaded = np.load(mnt / (entry["path"] + ".npy"), mmap_mode=mode)
            assert loaded.dtype == expected.dtype          # big-endian stays '>'
            assert loaded.shape == expected.shape
            assert np.array_equal(loaded, expected)


def test_header_bin_is_everything_before_the_data(gguf_model, mount):
    mnt = mount(gguf_model)
    reader = gguf.GGUFReader(gguf_model)
    assert (mnt / "header.bin").read_bytes() == gguf_model.read_bytes()[:reader.data_offset]


def test_metadata_json_matches_the_reader(gguf_model, mount):
    mnt = mount(gguf_model)
    reader = gguf.GGUFReader(gguf_model)
    doc = _paths(mnt)
    assert doc["format"] == "gguf" and doc["version"] == 3
    assert doc["endianness"] == ("big" if "big" in gguf_model.name else "little")
    assert doc["file_size"] == gguf_model.stat().st_size
    assert doc["data_offset"] == reader.data_offset
    fields = {k: f for k, f in reader.fields.items() if not k.startswith("GGUF.")}
    assert list(doc["metadata"]) == list(fields)
    for key, field in fields.items():
        ours = doc["metadata"][key]
        main = field.types[0]
        if main == gguf.GGUFValueType.ARRAY:
            inner = field.types[1:]
            assert doc["metadata_types"][key] == _array_type(field.types)
            if len(inner) > 1:
                continue                       # nested: gguf-py cannot decode it, checked below
            theirs = field.contents()
        else:
            assert doc["metadata_types"][key] == TYPE_NAMES[main]
            theirs = field.contents()
        if main == gguf.GGUFValueType.FLOAT32 or field.types[-1] == gguf.GGUFValueType.FLOAT32:
            assert np.array_equal(np.float32(ours), np.float32(theirs))
        else:
            assert ours == theirs, key
    written = dict((k, v) for k, v, _ in GGUF_KV) | dict(GGUF_ARRAYS)
    assert doc["metadata"]["test.array_nested"] == written["test.array_nested"]
    assert doc["metadata_types"]["test.array_nested"] == "array[array[int32]]"
    assert doc["metadata"]["test.u64"] == 2**64 - 1 and doc["metadata"]["test.f32"] == 0.1


def _array_type(types) -> str:
    names = [TYPE_NAMES[t] for t in types]
    out = names[-1]
    for _ in names[:-1]:
        out = f"array[{out}]"
    return out


def test_unix_tools_on_the_mount(gguf_model, mount, tmp_path):
    mnt = mount(gguf_model)
    doc = _paths(mnt)
    source = gguf_model.read_bytes()
    for name, entry in doc["tensors"].items():
        path = mnt / entry["path"]
        listing = subprocess.run(["ls", "-l", str(path)], capture_output=True, text=True, check=True)
        assert int(listing.stdout.split()[4]) == entry["nbytes"]
        assert subprocess.run(["cat", str(path)], capture_output=True, check=True).stdout == \
            source[entry["offset"]:entry["offset"] + entry["nbytes"]]
        dd = subprocess.run(["dd", f"if={gguf_model}", "bs=1", f"skip={entry['offset']}",
                             f"count={entry['nbytes']}", "status=none"], capture_output=True, check=True)
        cmp = subprocess.run(["cmp", str(path), "-"], input=dd.stdout, capture_output=True)
        assert cmp.returncode == 0, cmp.stdout
        sha = subprocess.run(["sha256sum", str(path)], capture_output=True, text=True, check=True)
        assert sha.stdout.split()[0] == hashlib.sha256(dd.stdout).hexdigest()
    found = subprocess.run(["find", str(mnt), "-name", "*.npy"], capture_output=True, text=True, check=True)
    assert len(found.stdout.split()) == len(doc["tensors"])
    st = os.stat(mnt / "header.bin")
    assert st.st_mtime_ns == os.stat(gguf_model).st_mtime_ns
    assert st.st_mode & 0o777 == 0o444 and os.stat(mnt / "blk").st_mode & 0o777 == 0o755
    inodes = {os.stat(mnt / e["path"]).st_ino for e in doc["tensors"].values()}
    assert len(inodes) == len(doc["tensors"])
    copy = tmp_path / "copy"
    subprocess.run(["cp", "-r", str(mnt), str(copy)], check=True)
    for entry in doc["tensors"].values():
        assert (copy / entry["path"]).read_bytes() == (mnt / entry["path"]).read_bytes()
        assert (copy / (entry["path"] + ".npy")).read_bytes() == (mnt / (entry["path"] + ".npy")).read_bytes()


def test_writes_are_refused_with_erofs(gguf_model, mount):
    mnt = mount(gguf_model)
    target = mnt / "blk" / "0" / "float32" / "weight"
    attempts = [
        lambda: open(target, "r+b"),
        lambda: open(mnt / "new", "wb"),
        lambda: os.mkdir(mnt / "d"),
        lambda: os.unlink(target),
        lambda: os.rename(target, mnt / "moved"),
        lambda: os.chmod(target, 0o644),
        lambda: os.truncate(target, 0),
        lambda: os.utime(target),
        lambda: os.setxattr(target, "user.x", b"1"),
        lambda: os.symlink("x", mnt / "link"),
    ]
    for attempt in attempts:
        with pytest.raises(OSError) as error:
            attempt()
        assert error.value.errno == 30, attempt      # EROFS


def test_four_threads_reading_random_ranges(gguf_model, mount):
    mnt = mount(gguf_model)
    doc = _paths(mnt)
    source = gguf_model.read_bytes()
    entries = list(doc["tensors"].values())
    failures = []

    def reader(seed):
        rng = random.Random(seed)
        for _ in range(300):
            entry = rng.choice(entries)
            offset = rng.randrange(entry["nbytes"])
            size = rng.randrange(1, entry["nbytes"] - offset + 1)
            with open(mnt / entry["path"], "rb") as f:
                got = os.pread(f.fileno(), size, offset)
            want = source[entry["offset"] + offset:entry["offset"] + offset + size]
            if got != want:
                failures.append((entry["path"], offset, size))

    threads = [threading.Thread(target=reader, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert failures == []


def test_flat_layout(tmp_path, mount):
    path = tmp_path / "m.gguf"
    arrays = write_gguf(path)
    mnt = mount(path, "--layout", "flat")
    names = sorted(os.listdir(mnt))
    assert names == sorted(["header.bin", "metadata.json", "metadata", "files"] + list(arrays)
                           + [n + ".npy" for n in arrays])
    for name, array in arrays.items():
        assert (mnt / name).read_bytes() == array.tobytes()
        assert np.array_equal(np.load(mnt / (name + ".npy")), array)


def test_vocabulary_only_file_mounts(tmp_path, mount):
    path = tmp_path / "vocab.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    tokens = [f"tok{i}" for i in range(1000)] + ["a\nb", ""]
    writer.add_token_list(tokens)
    finish_gguf(writer)
    mnt = mount(path)
    doc = _paths(mnt)
    assert doc["tensors"] == {} and doc["metadata"]["tokenizer.ggml.tokens"] == tokens
    assert (mnt / "header.bin").read_bytes() == path.read_bytes()[:doc["data_offset"]]
