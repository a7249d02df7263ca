"""``tensorfs hash`` against llama.cpp's own ``llama-gguf-hash`` (built from the
llama-cpp-python sdist by ``make llama-gguf-hash``) and against hashlib/xxhash of the bytes the
reference readers give: every type, every flag, manifests checked both ways; safetensors,
shards, odd names; the ``user.tensorfs.sha256`` xattr of a mount."""

from __future__ import annotations

import errno
import hashlib
import json
import os
import shutil
import subprocess
from pathlib import Path

import gguf
import numpy as np
import pytest
import xxhash

from tests.support import run_tensorfs
from tests.support.facts_models import (
    write_every_type_gguf,
    write_every_type_safetensors,
    write_hand_gguf,
)
from tests.support.models import write_safetensors
from tests.support.shards import write_hf_shards, write_split_gguf

LLAMA_NAMESPACE = bytes.fromhex("ef001206dadc5f6da15f3359e577d4e5")


def llama_gguf_hash() -> str:
    """The oracle: what ``make test`` built (and names in TENSORFS_LLAMA_GGUF_HASH), else
    one a ``make llama-gguf-hash`` left in the cache."""
    named = os.environ.get("TENSORFS_LLAMA_GGUF_HASH")
    if named:
        assert os.access(named, os.X_OK), f"TENSORFS_LLAMA_GGUF_HASH={named} is not built"
        return named
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "tensorfs-build"
    found = sorted(cache.glob("llama-cpp-python-*/llama-gguf-hash"))
    if not found:
        pytest.skip("llama-gguf-hash is not built: make llama-gguf-hash (make test builds it)")
    return str(found[-1])


def run_llama(*args, cwd) -> subprocess.CompletedProcess:
    return subprocess.run([llama_gguf_hash(), *map(str, args)], capture_output=True, text=True,
                          cwd=cwd, timeout=300)


def tfs(*args, cwd=None) -> subprocess.CompletedProcess:
    return run_tensorfs("hash", *args, cwd=cwd)


def llama_uuid(data_chunks) -> str:
    """gguf-hash.cpp's generate_uuidv5, written out: sha1(namespace + data), bits set."""
    h = hashlib.sha1(LLAMA_NAMESPACE)
    for chunk in data_chunks:
        h.update(chunk)
    u = bytearray(h.digest()[:16])
    u[6] = (u[6] & 0x0F) | 0x50
    u[8] = (u[8] & 0x3F) | 0x80
    x = u.hex()
    return f"{x[:8]}-{x[8:12]}-{x[12:16]}-{x[16:20]}-{x[20:]}"


def reference_lines(shown: str, tensors: list[tuple[str, bytes]], algorithms, uuid=False,
                    per_tensor=True) -> str:
    """What the lines must be, from the reference bytes (tensors in stored order)."""
    makers = {"xxh64": lambda d: xxhash.xxh64(d, seed=0).hexdigest(),
              "sha1": lambda d: hashlib.sha1(d).hexdigest(),
              "sha256": lambda d: hashlib.sha256(d).hexdigest()}
    out = []
    if per_tensor:
        for name, data in tensors:
            out += [f"{a:<8}  {makers[a](data)}  {shown}:{name}" for a in algorithms]
    whole = b"".join(data for _, data in tensors)
    out += [f"{a:<8}  {makers[a](whole)}  {shown}" for a in algorithms]
    if uuid:
        out.append(f"{'uuid':<8}  {llama_uuid(d for _, d in tensors)}  {shown}")
    return "".join(line + "\n" for line in out)


@pytest.fixture(scope="module")
def every(tmp_path_factory):
    d = tmp_path_factory.mktemp("every")
    expected = write_every_type_gguf(d / "every.gguf")
    hand = write_hand_gguf(d / "hand.gguf")
    return d, expected, hand


def gguf_reference(path) -> list[tuple[str, bytes]]:
    return [(t.name, t.data.tobytes()) for t in gguf.GGUFReader(str(path), "r").tensors]


FLAG_SETS = [(), ("--xxh64",), ("--sha1",), ("--sha256",), ("--uuid",), ("--all",),
             ("--all", "--uuid"), ("--sha256", "--no-layer"), ("--sha1", "--xxh64", "--uuid")]


@pytest.mark.parametrize("flags", FLAG_SETS, ids=lambda f: "+".join(f) or "default")
def test_every_type_the_same_lines_as_llama_gguf_hash(every, flags):
    d, _, _ = every
    for model in ("every.gguf", "hand.gguf"):
        ours, theirs = tfs(*flags, model, cwd=d), run_llama(*flags, model, cwd=d)
        assert theirs.returncode == 0, theirs.stderr
        assert ours.returncode == 0 and ours.stderr == "", ours.stderr
        assert ours.stdout == theirs.stdout
        assert ours.stdout


def test_a_path_is_named_as_given(every):
    d, _, _ = every
    for model in (d / "every.gguf", "./every.gguf"):
        ours, theirs = tfs("--sha256", model, cwd=d), run_llama("--sha256", model, cwd=d)
        assert ours.stdout == theirs.stdout
        assert ours.stdout.splitlines()[-1].endswith(f"  {model}")


def test_every_type_equals_hashlib_and_xxhash_of_gguf_py_bytes(every):
    d, expected, hand = every
    reference = gguf_reference(d / "every.gguf")
    assert [name for name, _ in reference] == list(expected)           # the writer's order
    assert all(data == expected[name].raw for name, data in reference)
    hand_reference = [(name, e.raw) for name, e in hand.items()]    # gguf-py cannot read Q2_0
    for model, reference in (("every.gguf", reference), ("hand.gguf", hand_reference)):
        result = tfs("--all", "--uuid", model, cwd=d)
        assert result.returncode == 0, result.stderr
        assert result.stdout == reference_lines(model, reference, ("xxh64", "sha1", "sha256"),
                                                uuid=True)


def test_manifests_written_by_either_are_checked_by_the_other(every, tmp_path):
    d, _, _ = every
    ours = tmp_path / "ours.manifest"
    theirs = tmp_path / "theirs.manifest"
    ours.write_text(tfs("--all", "--uuid", "every.gguf", cwd=d).stdout)
    theirs.write_text(run_llama("--all", "--uuid", "every.gguf", cwd=d).stdout)
    for manifest in (ours, theirs):
        for flags in ((), ("--xxh64",), ("--all",)):
            mine = tfs(*flags, "--check", manifest, "every.gguf", cwd=d)
            llama = run_llama(*flags, "--check", manifest, "every.gguf", cwd=d)
            assert llama.returncode == 0, llama.stdout
            assert mine.returncode == 0, mine.stderr
            # the same report, line for line
            assert mine.stdout == llama.stdout
            assert mine.stdout.rstrip().endswith(" - Success")


def _corrupt(manifest: Path, victim: str, algorithm: str = "sha256") -> None:
    lines = manifest.read_text().splitlines()
    for i, line in enumerate(lines):
        fields = line.split()
        if fields[0] == algorithm and fields[2] == victim:
            value = fields[1]
            lines[i] = line.replace(value, ("0" if value[0] != "0" else "1") + value[1:])
    manifest.write_text("\n".join(lines) + "\n")


def test_check_exits_1_naming_the_first_mismatching_tensor(every, tmp_path):
    d, expected, _ = every
    names = list(expected)
    manifest = tmp_path / "m"
    manifest.write_text(run_llama("--all", "every.gguf", cwd=d).stdout)
    _corrupt(manifest, f"every.gguf:{names[5]}")
    _corrupt(manifest, f"every.gguf:{names[9]}")
    mine = tfs("--check", manifest, "every.gguf", cwd=d)
    llama = run_llama("--check", manifest, "every.gguf", cwd=d)
    assert llama.returncode == 1 and mine.returncode == 1
    assert mine.stdout == llama.stdout
    assert mine.stderr == f"tensorfs: error: {manifest}: every.gguf:{names[5]}: sha256 mismatch\n"
    # another algorithm the manifest has: still good
    assert tfs("--xxh64", "--check", manifest, "every.gguf", cwd=d).returncode == 0


def test_check_of_a_changed_model_names_the_changed_tensor(every, tmp_path):
    d, expected, _ = every
    manifest = tmp_path / "m"
    manifest.write_text(tfs("--sha256", "every.gguf", cwd=d).stdout)
    changed = tmp_path / "every.gguf"
    shutil.copy(d / "every.gguf", changed)
    victim = "blk.7.q4_k.weight"
    offset = next(t.data_offset for t in gguf.GGUFReader(str(changed), "r").tensors
                  if t.name == victim)
    with open(changed, "r+b") as f:
        f.seek(offset + 1000)
        byte = f.read(1)
        f.seek(offset + 1000)
        f.write(bytes([byte[0] ^ 0x40]))
    mine = tfs("--check", manifest, "every.gguf", cwd=tmp_path)
    assert mine.returncode == 1
    assert mine.stderr == f"tensorfs: error: {manifest}: every.gguf:{victim}: sha256 mismatch\n"
    assert f"every.gguf:{victim}  -  Mismatch" in mine.stdout
    assert run_llama("--check", manifest, "every.gguf", cwd=tmp_path).returncode == 1


def test_check_of_a_manifest_that_names_nothing_here(every, tmp_path):
    d, _, _ = every
    manifest = tmp_path / "m"
    manifest.write_text(tfs("--sha256", "every.gguf", cwd=d).stdout)
    mine = tfs("--check", manifest, d / "every.gguf")           # named otherwise
    assert run_llama("--check", manifest, d / "every.gguf", cwd=d).returncode == 3
    assert mine.returncode == 1
    assert mine.stderr.startswith(f"tensorfs: error: {manifest}: no line names {d}/every.gguf")
    assert mine.stderr.count("\n") == 1
    assert "Manifest Missing Entry" in mine.stdout


@pytest.mark.parametrize("content", ["", "hello world\n", "md5  abc  x\n"], ids=["empty", "text", "md5"])
def test_check_of_a_manifest_without_hash_lines(every, tmp_path, content):
    d, _, _ = every
    manifest = tmp_path / "m"
    manifest.write_text(content)
    mine = tfs("--check", manifest, "every.gguf", cwd=d)
    assert mine.returncode == 1 and mine.stdout == ""
    assert mine.stderr == f"tensorfs: error: {manifest}: no line of the manifest is a hash " \
                          f"line (xxh64, sha1, sha256 or uuid)\n"
    assert run_llama("--check", manifest, "every.gguf", cwd=d).returncode == 4


def test_check_of_a_missing_manifest(every, tmp_path):
    d, _, _ = every
    mine = tfs("--check", tmp_path / "nope", "every.gguf", cwd=d)
    assert mine.returncode == 1 and mine.stdout == ""
    assert mine.stderr.startswith(f"tensorfs: error: {tmp_path}/nope: cannot read the manifest")


def test_safetensors_lines_over_stored_bytes_in_offset_order(tmp_path):
    model = tmp_path / "every.safetensors"
    written = write_every_type_safetensors(model)
    data = model.read_bytes()
    header = 8 + int.from_bytes(data[:8], "little")
    ordered = list(written.items())            # written in this order, listed in reverse
    assert b"".join(e.raw for _, e in ordered) == data[header:]
    result = tfs("--all", "--uuid", "every.safetensors", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout == reference_lines("every.safetensors",
                                            [(n, e.raw) for n, e in ordered],
                                            ("xxh64", "sha1", "sha256"), uuid=True)
    # the whole-model sha256 of one file is that of its data section
    assert result.stdout.splitlines()[-2].split()[1] == hashlib.sha256(data[header:]).hexdigest()
    manifest = tmp_path / "m"
    manifest.write_text(result.stdout)
    assert tfs("--check", manifest, "every.safetensors", cwd=tmp_path).returncode == 0


def _safetensors_by_offset(path) -> list[tuple[str, bytes]]:
    """(name, stored bytes) of a safetensors file in data order, from its header."""
    data = Path(path).read_bytes()
    header = 8 + int.from_bytes(data[:8], "little")
    entries = json.loads(data[8:header])
    spans = sorted((info["data_offsets"], name) for name, info in entries.items()
                   if name != "__metadata__")
    return [(name, data[header + begin:header + end]) for (begin, end), name in spans]


def test_shards_file_by_file(tmp_path):
    index, tensors, weight_map = write_hf_shards(tmp_path / "hf")
    expected = [r for shard in sorted(set(weight_map.values()))
                for r in _safetensors_by_offset(tmp_path / "hf" / shard)]
    assert sorted(n for n, _ in expected) == sorted(tensors)
    for named in (index, tmp_path / "hf"):
        result = tfs("--sha256", named)
        assert result.returncode == 0, result.stderr
        assert result.stdout == reference_lines(str(named), expected, ("sha256",))

    files, _ = write_split_gguf(tmp_path / "split")
    reference = [r for f in files for r in gguf_reference(f)]
    result = tfs("--xxh64", "--uuid", files[0])
    assert result.stdout == reference_lines(str(files[0]), reference, ("xxh64",), uuid=True)


def test_names_with_spaces_newlines_and_backslashes_stay_one_field(tmp_path):
    from safetensors.numpy import save_file

    odd = {"a b": np.ones(3, np.float32), "line\nbreak": np.zeros(2, np.int8),
           "back\\slash": np.arange(4, dtype=np.int16), "tab\tand\u2028sep": np.ones(1)}
    save_file(odd, str(tmp_path / "odd.safetensors"))
    result = tfs("--sha256", "odd.safetensors", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert len(lines) == len(odd) + 1
    assert all(len(line.split()) == 3 for line in lines)
    shown = {line.split()[2] for line in lines}
    assert {"odd.safetensors:a\\x20b", "odd.safetensors:line\\nbreak",
            "odd.safetensors:back\\\\slash", "odd.safetensors:tab\\tand\\u2028sep"} < shown
    manifest = tmp_path / "m"
    manifest.write_text(result.stdout)
    assert tfs("--check", manifest, "odd.safetensors", cwd=tmp_path).returncode == 0


def test_pieces_and_lanes_give_the_same_values(every, monkeypatch):
    """The library's pipeline with pieces of a few bytes and one to five lanes: the seams
    between pieces and the hand-over between lanes change nothing."""
    import tensorfs
    from tensorfs.facts import hashing

    d, expected, _ = every
    want = tfs("--all", "--uuid", "every.gguf", cwd=d).stdout
    monkeypatch.setattr(hashing, "HASH_PIECE_BYTES", 4099)
    with tensorfs.open(d / "every.gguf") as m:
        for workers in (1, 2, 5):
            got = hashing.hash_model(m, ("xxh64", "sha1", "sha256", "uuid"), workers=workers)
            rows = hashing.hash_lines(got, "every.gguf", ("xxh64", "sha1", "sha256", "uuid"))
            assert "".join(hashing.line(*r) + "\n" for r in rows) == want


def test_refused_models_and_missing_files_are_one_line(tmp_path):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF\x03\x00\x00\x00" + b"\xff" * 30)
    inspect = run_tensorfs("inspect", bad)
    result = tfs(bad)
    assert result.returncode == 1 and result.stdout == ""
    assert result.stderr == inspect.stderr and result.stderr.count("\n") == 1
    missing = tfs(tmp_path / "nope.gguf")
    assert missing.returncode == 1 and missing.stderr.startswith("tensorfs: error: ")
    assert missing.stderr.count("\n") == 1
    assert tfs("--storage-option", "a=b", bad).returncode == 2


def test_the_sha256_xattr_of_a_mounted_raw_file(tmp_path, mount):
    model = tmp_path / "every.safetensors"
    written = write_every_type_safetensors(model)
    write_safetensors(tmp_path / "plain.safetensors")
    mnt = mount(model)
    for name, e in written.items():
        raw = mnt / name.replace(".", "/")
        value = os.getxattr(raw, "user.tensorfs.sha256").decode()
        assert value == hashlib.sha256(e.raw).hexdigest()
        assert os.getxattr(raw, "user.tensorfs.sha256").decode() == value      # kept
        # not listed: a copy of the xattrs (cp -a, rsync -X) would hash every tensor
        assert "user.tensorfs.sha256" not in os.listxattr(raw)
        if e.values is not None:
            with pytest.raises(OSError) as error:
                os.getxattr(f"{raw}.npy", "user.tensorfs.sha256")
            assert error.value.errno == errno.ENODATA
    got = subprocess.run(["getfattr", "--only-values", "-n", "user.tensorfs.sha256",
                          str(mnt / "model" / "bf16")], capture_output=True, text=True)
    assert got.stdout == hashlib.sha256(written["model.bf16"].raw).hexdigest()
