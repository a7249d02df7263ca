"""Limits: sizes the kernel cannot represent, generated files
larger than the cache, names whose shape used to cost memory quadratic in their depth,
strict JSON and surrogates, directory entries over NAME_MAX, split GGUF keys out of range,
and an index refused by its size before it is read.  Each test goes through the real CLI or
a real mount; docs/internals/reliability.md §5 lists the classes and these tests.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import gguf
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from safetensors.numpy import save_file

from tests.support import TENSORFS, fuse_mounts_under, run_tensorfs
from tests.support import gguf_corpus as gc
from tests.support import safetensors_corpus as sc
from tests.support.reliability_models import daemon_pid
from tests.support.shards import INDEX, one, refused_by_both, write_hf_shards


def _strict(text):
    def refuse(token):
        raise ValueError(f"{token} is not JSON")
    return json.loads(text, parse_constant=refuse)


def _one_error_line(result) -> str:
    lines = result.stderr.splitlines()
    assert result.returncode == 1 and len(lines) == 1, result.stderr
    assert lines[0].startswith("tensorfs: error: ") and "internal error" not in lines[0]
    return lines[0]


# -- sizes past int64 --------------------------------------------------------------------------

@pytest.fixture
def sparse_dir(tmp_path):
    """A directory that holds sparse files of exabytes: tmpfs (ext4 stops at 16 TiB)."""
    for base in ("/dev/shm",):
        if os.path.isdir(base):
            try:
                d = Path(tempfile.mkdtemp(dir=base, prefix="tensorfs-sparse-"))
            except OSError:
                continue
            probe = d / "probe"
            try:
                os.truncate(os.open(probe, os.O_CREAT | os.O_WRONLY), 0)
                os.truncate(probe, 4 << 60)
            except OSError:
                subprocess.run(["rm", "-rf", str(d)])
                continue
            probe.unlink()
            yield d
            subprocess.run(["rm", "-rf", str(d)])
            return
    pytest.skip("no filesystem here holds exabyte sparse files (tmpfs at /dev/shm)")


def _sparse_safetensors(path: Path, dtype: str, n: int, bits: int) -> None:
    nbytes = n * bits // 8
    path.write_bytes(sc.build([("t", sc.tensor(dtype, [n], 0, nbytes)),
                               ("small", sc.tensor("F32", [2], nbytes, nbytes + 8))]))
    os.truncate(path, path.stat().st_size + nbytes + 8)


def _sparse_gguf(path: Path, ggml_type: int, ne: list[int]) -> None:
    from tensorfs.dtypes import GGML_TYPES

    block = GGML_TYPES[ggml_type]
    nbytes = ne[0] // block.block_size * block.type_size * int(np.prod(ne[1:], dtype=object))
    header = gc.encode_gguf(kvs=[("general.architecture", gc.STR, "llama")],
                            tensors=[("t", ne, ggml_type, 0)], data=b"\0")
    path.write_bytes(header[:-1])
    os.truncate(path, len(header) - 1 + nbytes)


@pytest.mark.parametrize("fmt", ["safetensors F8_E4M3", "gguf IQ1_S", "gguf Q4_0"])
def test_a_view_larger_than_int64_is_refused_at_mount(sparse_dir, tmp_path, fmt):
    """An exabyte tensor whose float32 view is 2**63 bytes or more: before, st_size wrapped
    (128) or stat failed with EIO; now the mount is refused with one line."""
    model = sparse_dir / ("m.gguf" if fmt.startswith("gguf") else "m.safetensors")
    if fmt == "safetensors F8_E4M3":
        _sparse_safetensors(model, "F8_E4M3", 2**61 - 1, 8)      # the .npy header tips it over
    elif fmt == "gguf IQ1_S":
        _sparse_gguf(model, 19, [2**61 + 256])                    # 0.4 EiB stored, 20x as f32
    else:
        _sparse_gguf(model, gc.Q4_0_T, [2**61 + 32])             # 1.1 EiB stored, 7x as f32
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    result = run_tensorfs("mount", model, mnt)
    if result.returncode == 0:
        run_tensorfs("unmount", mnt)
    line = _one_error_line(result)
    assert "more than a file can have" in line and "'t'" in line, line
    assert fuse_mounts_under(tmp_path) == [] and os.listdir(mnt) == []
    assert run_tensorfs("inspect", model).returncode == 0      # describing it is fine


def test_a_view_just_under_int64_mounts_with_its_exact_size(sparse_dir, mount):
    n = (2**63 - 1 - 128) // 4                  # .npy: 128-byte header + 4n <= 2**63 - 1
    model = sparse_dir / "edge.safetensors"
    _sparse_safetensors(model, "F8_E4M3", n, 8)
    mnt = mount(model)
    assert os.stat(mnt / "t").st_size == n
    assert os.stat(mnt / "t.npy").st_size == 128 + 4 * n
    assert np.load(mnt / "small.npy").shape == (2,)


# -- generated files larger than the cache ------------------------------------------------

def _generations(log: Path, what: str) -> int:
    return len(re.findall(re.escape(what) + r".*: generating \(start \d+\)", log.read_text()))


@pytest.mark.slow
def test_generated_files_larger_than_the_cache_cost_one_generation(tmp_path, mount):
    """metadata.json of ~6 MB and a 3 MB vocabulary file, mounted with a 64 KiB cache and
    read with cat: before, each kernel read regenerated the whole document (metadata.json
    was rebuilt per 128 KiB; the vocabulary decoded per read).  The debug log counts the
    producer's starts: one for the first stat, one for the read."""
    tokens = [f"tok{i}\u00e9\n" if i % 1000 == 0 else f"tok{i}" for i in range(250_000)]
    model = tmp_path / "vocab.gguf"
    writer = gguf.GGUFWriter(str(model), "llama")
    writer.add_array("tokenizer.ggml.tokens", tokens)
    writer.add_array("tokenizer.ggml.scores", [float(i) / 7 for i in range(50_000)])
    tensors = {f"blk.{i}.w": np.full(2, i, np.float32) for i in range(2000)}
    for name, array in tensors.items():
        writer.add_tensor(name, array)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    log = tmp_path / "daemon.log"
    mnt = mount(model, "--cache-size", "64K", "--debug", "--log", log)

    text = subprocess.run(["cat", mnt / "metadata.json"], capture_output=True, check=True).stdout
    assert len(text) > 4 << 20 and len(text) == os.stat(mnt / "metadata.json").st_size
    inspected = subprocess.run([*TENSORFS, "inspect", "--json", str(model)], capture_output=True,
                               check=True).stdout
    assert text == inspected
    doc = _strict(text)
    assert doc["metadata"]["tokenizer.ggml.tokens"] == tokens
    assert sorted(doc["tensors"]) == sorted(tensors)

    vocab = subprocess.run(["cat", mnt / "metadata" / "tokenizer.ggml.tokens"],
                           capture_output=True, check=True).stdout
    assert vocab == "".join(t.replace("\n", "\\n") + "\n" for t in tokens).encode()
    assert 1 <= _generations(log, "metadata.json") <= 2, \
        [line for line in log.read_text().splitlines() if "metadata.json" in line]
    assert 1 <= _generations(log, "tokenizer.ggml.tokens") <= 2
    # two more readers at once, uncached by the kernel (O_DIRECT): each keeps its own cursor
    readers = [subprocess.Popen(["dd", f"if={mnt / 'metadata.json'}", "bs=64k",
                                 "iflag=direct"], stdout=subprocess.PIPE,
                                stderr=subprocess.DEVNULL) for _ in range(2)]
    for reader in readers:
        assert reader.communicate()[0] == text
    assert _generations(log, "metadata.json") <= 4


def test_a_generated_view_read_by_interleaved_readers_in_process():
    """The view itself: two sequential readers taking turns, a cache that keeps nothing,
    then random reads; every byte right, and the producer started once per reader."""
    import random

    from tensorfs.cache import ByteLRU
    from tensorfs.views.byteviews import GeneratedView

    data = random.Random(1).randbytes(3_000_000)
    view = GeneratedView(ByteLRU(1), "k",
                         lambda: (data[i:i + 70_000] for i in range(0, len(data), 70_000)))
    assert view.size == len(data) and view.generations == 1
    a, b, got_a, got_b = 0, len(data) // 2, [], []
    while a < len(data) // 2 or b < len(data):
        if a < len(data) // 2:
            got_a.append(view.read(a, min(131072, len(data) // 2 - a)))
            a += 131072
        if b < len(data):
            got_b.append(view.read(b, 131072))
            b += 131072
    assert b"".join(got_a) == data[:len(data) // 2] and b"".join(got_b) == data[len(data) // 2:]
    assert view.generations <= 3          # one per reader at most (here the window served A)
    rng = random.Random(2)
    for _ in range(30):
        offset, size = rng.randrange(len(data)), rng.choice([1, 4096, 300_000])
        assert view.read(offset, size) == data[offset:offset + size]


# -- memory linear in the input, for every name shape ----------------------------------------

_PEAK = ("import sys\n"
         "from tensorfs.cli.main import main\n"
         "try:\n"
         "    code = main(sys.argv[2:])\n"
         "finally:\n"
         "    hwm = next(l for l in open('/proc/self/status') if l.startswith('VmHWM:'))\n"
         "    open(sys.argv[1], 'w').write(hwm.split()[1])\n"
         "sys.exit(code)\n")


def _max_rss_kib(*args) -> int:
    """Run the CLI in a fresh process and return its peak resident memory (VmHWM, which
    belongs to the process image: wait4's ru_maxrss would carry pytest's own size across
    the fork and exec)."""
    with tempfile.NamedTemporaryFile("r") as out:
        result = subprocess.run([sys.executable, "-c", _PEAK, out.name, *map(str, args)],
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        assert result.returncode == 0, result.stderr
        return int(out.read())


def _refused_peak_kib(*args) -> int:
    """As ``_max_rss_kib``, for a command that exits 1."""
    with tempfile.NamedTemporaryFile("r") as out:
        result = subprocess.run([sys.executable, "-c", _PEAK, out.name, *map(str, args)],
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        assert result.returncode == 1, result.stderr
        return int(out.read())


def _vm_hwm_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        return int(next(line for line in f if line.startswith("VmHWM:")).split()[1])


@pytest.mark.slow
@pytest.mark.parametrize("shape", ["dots", "deep", "long-dotted", "escapes"])
def test_a_name_shape_costs_memory_linear_in_the_file(tmp_path, mount, shape):
    """One name of 20,000 components (a 20-40 KB file): before, every parent path was kept
    and metadata.json / inspect took ~400 MB; now a few MB over the interpreter."""
    name = {"dots": "." * 20_000, "deep": "a." * 20_000 + "w",
            "long-dotted": ".".join(["x" * 300] * 100),
            "escapes": ".".join(["\n%/"] * 10_000)}[shape]
    model = tmp_path / "deep.safetensors"
    save_file({name: np.arange(4, dtype=np.float32), "w": np.zeros(2, np.float32)}, str(model))
    size = model.stat().st_size
    save_file({"w": np.zeros(2, np.float32)}, str(tmp_path / "small.safetensors"))
    base = _max_rss_kib("inspect", tmp_path / "small.safetensors")
    budget_kib = base + 64 * 1024 + 200 * size // 1024     # 200 bytes per input byte + 64 MiB
    assert _max_rss_kib("inspect", model) < budget_kib
    assert _max_rss_kib("inspect", "--json", model) < budget_kib
    mnt = mount(model)
    pid = daemon_pid(mnt)
    doc = _strict((mnt / "metadata.json").read_bytes())
    path = doc["tensors"][name]["path"]
    assert len(path) < 4 * len(name.encode()) + 64        # linear too
    # walk down the path a component at a time (the whole is past PATH_MAX)
    fd = os.open(mnt, os.O_RDONLY)
    try:
        for part in path.split("/")[:-1]:
            fd, parent = os.open(part, os.O_RDONLY, dir_fd=fd), fd
            os.close(parent)
        leaf = path.rsplit("/", 1)[-1]
        with os.fdopen(os.open(leaf + ".npy", os.O_RDONLY, dir_fd=fd), "rb") as f:
            assert np.array_equal(np.load(f), np.arange(4, dtype=np.float32))
    finally:
        os.close(fd)
    assert os.getxattr(mnt / "w", "user.tensorfs.shape") == b"[2]"
    assert _vm_hwm_kib(pid) < budget_kib + 64 * 1024       # the daemon holds the cache too


# -- strict JSON, surrogates ----------------------------------------------------------------

def test_index_metadata_with_nan_infinity_and_big_numbers_is_strict_json(tmp_path, mount):
    index, tensors, _ = write_hf_shards(tmp_path / "hf", 2)
    index.write_text(index.read_text().replace(
        '"metadata": {', '"metadata": {"nan": NaN, "inf": Infinity, "ninf": -Infinity, '
        '"huge": 1e999, "deep": {"a": [[[[[[NaN, "NaN"]]]]]], "b": -Infinity}, ', 1))
    mnt = mount(index)
    doc = _strict((mnt / "metadata.json").read_bytes())
    meta = doc["metadata"]
    assert (meta["nan"], meta["inf"], meta["ninf"], meta["huge"]) == ("nan", "inf", "-inf", "inf")
    assert meta["deep"] == {"a": [[[[[["nan", "NaN"]]]]]], "b": "-inf"}
    inspected = run_tensorfs("inspect", "--json", index)
    assert inspected.returncode == 0 and _strict(inspected.stdout) == doc
    assert (mnt / "metadata" / "nan").read_text() == "nan\n"
    assert (mnt / "metadata" / "huge").read_text() == "inf\n"
    _strict((mnt / "metadata" / "deep").read_text())


def test_gguf_non_finite_floats_are_the_documented_strings(tmp_path, mount):
    model = tmp_path / "f.gguf"
    writer = gguf.GGUFWriter(str(model), "llama")
    writer.add_float32("f.nan", float("nan"))
    writer.add_float64("f.inf", float("-inf"))
    writer.add_array("f.arr", [1.5, float("nan"), float("inf")])
    writer.add_tensor("w", np.zeros(2, np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    mnt = mount(model)
    meta = _strict((mnt / "metadata.json").read_bytes())["metadata"]
    assert meta["f.nan"] == "nan" and meta["f.inf"] == "-inf"
    assert meta["f.arr"] == [1.5, "nan", "inf"]


@pytest.mark.parametrize("where", ["metadata key", "metadata value", "weight_map key",
                                   "nested value"])
def test_a_lone_surrogate_in_an_index_is_one_line(tmp_path, where):
    """Before: ``internal error: UnicodeEncodeError`` (metadata/ names, the terminal).  Python's
    json accepts ``"\\ud800"``; the index is refused as safetensors headers are."""
    index, _, _ = write_hf_shards(tmp_path / "hf", 2)
    text = index.read_text()
    edit = {"metadata key": ('"metadata": {', '"metadata": {"k\\ud800": 1, '),
            "metadata value": ('"metadata": {', '"metadata": {"k": "v\\udfff", '),
            "weight_map key": ('"weight_map": {', '"weight_map": {"x\\ud83d": "a", '),
            "nested value": ('"metadata": {', '"metadata": {"k": [{"z": "\\udc00\\ud800"}], ')}
    old, new = edit[where]
    index.write_text(text.replace(old, new, 1))
    line = refused_by_both(tmp_path, index, "lone UTF-16 surrogate")
    offset = int(re.search(r"byte offset (\d+)", line).group(1))
    assert index.read_bytes()[offset:offset + 3] == b"\\ud"


def test_a_surrogate_pair_and_escaped_backslashes_are_fine(tmp_path, mount):
    index, _, _ = write_hf_shards(tmp_path / "hf", 2)
    index.write_text(index.read_text().replace(
        '"metadata": {', '"metadata": {"emoji\\ud83d\\ude00": "\\\\ud800", ', 1))
    mnt = mount(index)
    meta = _strict((mnt / "metadata.json").read_bytes())["metadata"]
    assert meta["emoji\U0001F600"] == "\\ud800"
    assert (mnt / "metadata" / "emoji\U0001F600").read_text() == "\\ud800\n"


# -- every directory entry within NAME_MAX ---------------------------------------------------

def _all_entries(mnt: Path):
    for root, dirs, files in os.walk(mnt):
        for name in dirs + files:
            yield name, Path(root) / name


@pytest.mark.parametrize("shard_stem", ["s" * 240, "%" * 120, "\u00e9" * 120, "a b" + "c" * 237,
                                        "x." * 120])
def test_headers_entries_fit_name_max_and_cp_r_copies_the_mount(tmp_path, mount, shard_stem):
    """A 250-byte shard name made a 259-byte headers/ entry (``cp -r`` failed)."""
    directory = tmp_path / "hf"
    index, tensors, weight_map = write_hf_shards(directory, 2)
    renamed = {}
    for k, old in enumerate(sorted(set(weight_map.values()))):
        new = f"{shard_stem}{k}.safetensors"
        assert len(new.encode()) <= 255
        os.rename(directory / old, directory / new)
        renamed[old] = new
    doc = json.loads(index.read_text())
    doc["weight_map"] = {t: renamed[s] for t, s in doc["weight_map"].items()}
    index.write_text(json.dumps(doc))
    mnt = mount(index)
    for name, _ in _all_entries(mnt):
        assert len(os.fsencode(name)) <= 255, name
    headers = sorted(os.listdir(mnt / "headers"))
    assert len(headers) == 2 and len(set(headers)) == 2
    for shard in renamed.values():     # headers/ still has each shard's header bytes
        data = (directory / shard).read_bytes()
        n = int.from_bytes(data[:8], "little")
        assert any((mnt / "headers" / h).read_bytes() == data[:8 + n] for h in headers)
    copy = tmp_path / "copy"
    subprocess.run(["cp", "-r", str(mnt), str(copy)], check=True, capture_output=True)
    assert (copy / "metadata.json").read_bytes() == (mnt / "metadata.json").read_bytes()


name_parts = st.sampled_from(["", "a", "%", "/", "\n", "metadata", "headers", "header.bin",
                              "x" * 120, "\u00e9" * 70, "\U0001F600" * 40, "npy", "raw"])


@pytest.mark.slow
@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
@given(names=st.lists(st.lists(name_parts, min_size=1, max_size=6).map(".".join),
                      min_size=1, max_size=6, unique=True),
       keys=st.lists(st.lists(name_parts, min_size=1, max_size=4).map(".".join),
                     max_size=4, unique=True))
def test_every_entry_of_a_mount_fits_name_max(tmp_path_factory, names, keys):
    """Tensor names and metadata keys of every shape: each entry the tree makes <= 255
    bytes, each tensor reachable at the path metadata.json gives."""
    tmp = tmp_path_factory.mktemp("namemax")
    model = tmp / "m.safetensors"
    save_file({n: np.full(2, i, np.float32) for i, n in enumerate(names)}, str(model),
              metadata={k: "v" for k in keys})
    mnt = tmp / "mnt"
    mnt.mkdir()
    result = run_tensorfs("mount", model, mnt)
    assert result.returncode == 0, result.stderr
    try:
        for name, _ in _all_entries(mnt):
            assert len(os.fsencode(name)) <= 255, name
        doc = _strict((mnt / "metadata.json").read_bytes())
        for i, n in enumerate(names):
            assert (mnt / doc["tensors"][n]["path"]).read_bytes() == np.full(2, i, np.float32).tobytes()
        assert len(os.listdir(mnt / "metadata")) == len(keys)
    finally:
        assert run_tensorfs("unmount", mnt).returncode == 0


# -- split GGUF keys out of range, shards that are not files -----------------------------------

def _split_pair(tmp: Path, no: int, count: int) -> Path:
    first = tmp / f"m-00001-of-{max(count, 2):05d}.gguf"
    writer = gguf.GGUFWriter(str(first), "llama")
    writer.add_key_value("split.no", no, gguf.GGUFValueType.INT32)
    writer.add_key_value("split.count", count, gguf.GGUFValueType.INT32)
    writer.add_tensor("a", np.zeros(2, np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return first


@pytest.mark.parametrize("no,count,expect", [
    (-1, 2, "split.no is -1, outside 0 to 1"),
    (2, 2, "split.no is 2, outside 0 to 1"),
    (7, 3, "split.no is 7, outside 0 to 2"),
    (0, -3, "split.count is -3"),
    (0, 100_000, "split.count is 100000"),
])
def test_split_keys_out_of_range_are_told_as_such(tmp_path, no, count, expect):
    """``split.no=-1`` used to say "this is shard 0 of 2 ...: mount the first one" of the
    very file the user gave."""
    first = _split_pair(tmp_path, no, count)
    line = refused_by_both(tmp_path, first, expect)
    assert "mount the first one" not in line


def test_a_shard_that_is_a_directory_is_not_called_missing(tmp_path):
    index, _, weight_map = write_hf_shards(tmp_path / "hf", 2)
    shard = tmp_path / "hf" / sorted(set(weight_map.values()))[0]
    shard.unlink()
    shard.mkdir()
    line = refused_by_both(tmp_path, index, "is a directory")
    assert "missing" not in line


# -- an index refused by its size before it is read ------------------------------------------

@pytest.mark.parametrize("given", ["index", "directory"])
def test_a_huge_sparse_index_is_refused_before_it_is_read(tmp_path, given):
    """A sparse 900 MB index cost 1.9 GB before it was refused; now its size is checked
    with fstat first (MAX_INDEX_BYTES, docs/reference/limits.md)."""
    from tensorfs.loading.shards import MAX_INDEX_BYTES

    directory = tmp_path / "hf"
    index, _, _ = write_hf_shards(directory, 2)
    with open(index, "r+b") as f:
        f.truncate(900 << 20)
    assert index.stat().st_size > MAX_INDEX_BYTES
    target = index if given == "index" else directory
    result = run_tensorfs("inspect", target)
    assert len(result.stderr.splitlines()) == 1 and \
        f"more than the {MAX_INDEX_BYTES}" in result.stderr, result.stderr
    peak = _refused_peak_kib("inspect", target)
    assert peak < 150 * 1024, peak                 # KiB: nothing of it was read


def test_a_fifo_as_an_index_in_a_directory_does_not_block(tmp_path):
    directory = tmp_path / "hf"
    directory.mkdir()
    save_file(one("c"), str(directory / "consolidated.safetensors"))
    os.mkfifo(directory / INDEX)
    result = run_tensorfs("inspect", directory, timeout=60)
    assert result.returncode in (0, 1) and "Traceback" not in result.stderr


@pytest.mark.parametrize("claim", ["string", "array"])
def test_a_sparse_gguf_claiming_a_huge_header_is_refused_before_it_is_read(tmp_path, claim):
    """A string (or an array) of gigabytes that a sparse file's size allows: it was read
    whole (MemoryError, or the machine's memory).  The header read is capped
    (tensorfs.sources.modelfile.MAX_HEADER_READ), checked before reading."""
    import struct

    from tensorfs.sources.modelfile import MAX_HEADER_READ

    model = tmp_path / "sparse.gguf"
    head = b"GGUF" + struct.pack("<I", 3)
    if claim == "string":
        head += struct.pack("<QQ", 0, 1) + struct.pack("<Q", 1) + b"k" + \
            struct.pack("<IQ", 8, 8 << 30)
    else:
        head += struct.pack("<QQ", 0, 1) + struct.pack("<Q", 1) + b"a" + \
            struct.pack("<IIQ", 9, 6, 1 << 31)                 # 2**31 float32
    model.write_bytes(head)
    os.truncate(model, 9 << 30)
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    result = run_tensorfs("mount", model, mnt)
    line = _one_error_line(result)
    assert f"more than {MAX_HEADER_READ} bytes" in line, line
    assert fuse_mounts_under(tmp_path) == []
    assert _refused_peak_kib("inspect", model) < (MAX_HEADER_READ >> 10) * 3 // 2 + 150 * 1024


@pytest.mark.parametrize("length", [5_000, 1_000_000])
def test_an_error_about_a_huge_name_is_a_bounded_line(tmp_path, length):
    """A refusal quotes the tensor it is about; a name as long as the file must not make a
    line as long as the file (inspect and mount alike, control characters still escaped)."""
    name = "\x1b[31m" + "n" * length
    data = gc.encode_gguf(tensors=[(name, (4,), 9999, 0)], data=bytes(64))
    model = tmp_path / "long-name.gguf"
    model.write_bytes(data)
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    for args in (("inspect", model), ("mount", model, mnt)):
        result = run_tensorfs(*args)
        assert result.returncode == 1, result.stderr
        lines = result.stderr.splitlines()
        assert len(lines) == 1 and lines[0].startswith(f"tensorfs: error: {model}: "), lines
        assert len(lines[0]) < 4200 and "\x1b" not in lines[0]
        assert "unknown ggml type 9999" in lines[0] and lines[0].endswith(")")
