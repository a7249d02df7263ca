"""Editing a model (``tensorfs mount MODEL MNT --edits DIR``, docs/reference/editing.md).

Oracles: the edited file composed by tensorfs is compared with the file gguf-py's
``GGUFWriter`` (byte for byte) or safetensors' ``save_file`` (through ``safe_open``) writes
for the same change; through real mounts, with the commands a user types.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import tempfile
from pathlib import Path

import gguf
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from safetensors import safe_open
from safetensors.numpy import save_file

from tensorfs.editing.store import TensorEdit
from tests.support import mount_expecting_refusal
from tests.support.commands import run_tensorfs
from tests.support.edit_models import write_kv_gguf
from tests.support.processes import daemon_pid, wait_for
from tests.support.users import needs_users, planted_link

GV = gguf.GGUFValueType
TEMPLATE = "{% for m in messages %}\n{{ m.content }}\n{% endfor %}"
NEW_TEMPLATE = "{% for m in messages %}<|{{ m.role }}|>{{ m.content }}\n{% endfor %}"


def base_kvs():
    return [("tokenizer.chat_template", TEMPLATE, GV.STRING, None),
            ("tokenizer.ggml.eos_token_id", 1, GV.UINT32, None),
            ("general.name", "tiny", GV.STRING, None),
            ("general.source.url", "https://example.com/tiny", GV.STRING, None),
            ("tokenizer.ggml.tokens", ["<s>", "a\nb", "c"], GV.ARRAY, GV.STRING),
            ("test.scores", [0.5, -1.25], GV.ARRAY, GV.FLOAT32)]


def base_tensors(seed=0):
    rng = np.random.default_rng(seed)
    q8 = rng.standard_normal((4, 64)).astype(np.float32)
    return {"token_embd.weight": rng.standard_normal((6, 8)).astype(np.float32),
            "blk.0.attn_q.weight": rng.standard_normal((8, 8)).astype(np.float16),
            "blk.0.ffn_up.weight": (gguf.quants.quantize(q8, gguf.GGMLQuantizationType.Q8_0),
                                    (4, 64), gguf.GGMLQuantizationType.Q8_0),
            "output_norm.weight": rng.standard_normal((8,)).astype(np.float32),
            "blk.0.ids": np.arange(12, dtype=np.int32).reshape(3, 4)}


def gguf_tensor(path, name: str) -> np.ndarray:
    """A copy of one tensor's data as GGUFReader reads it (the reader's map of the file
    goes with it: a map left behind would keep the mount busy)."""
    reader = gguf.GGUFReader(str(path))
    return np.array({t.name: t for t in reader.tensors}[name].data)


def gguf_fields(path) -> dict:
    reader = gguf.GGUFReader(str(path))
    return {name: (f.contents(), list(f.types)) for name, f in reader.fields.items()}


def gguf_names(path) -> list:
    return [t.name for t in gguf.GGUFReader(str(path)).tensors]


def sha256(path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


# -- the composer, without a mount -------------------------------------------------------------

def _compose(model_path, state, store):
    from tensorfs.editing.compose import compose
    from tensorfs.loading.loader import load_model

    model = load_model(str(model_path))
    f = model.files[0]
    source = model.sources[f.path]
    try:
        return compose(f, source.read(0, f.header_size), source, state, store.data).read(0, 1 << 30)
    finally:
        model.close()


@pytest.mark.parametrize("endian", [gguf.GGUFEndian.LITTLE, gguf.GGUFEndian.BIG])
def test_composed_gguf_is_what_gguf_py_writes(tmp_path, endian):
    """Keys set in place, a key deleted, keys added (string and uint64), a tensor replaced,
    one removed, one renamed: the composed file is the one GGUFWriter writes."""
    from tensorfs.editing.store import EditState, EditStore, TensorEdit

    model = write_kv_gguf(tmp_path / "m.gguf", base_kvs(), base_tensors(), endian)
    store = EditStore(str(tmp_path / "edits"), [])
    new_norm = np.linspace(-1, 1, 8, dtype=np.float32)
    big = endian == gguf.GGUFEndian.BIG
    state = (EditState()
             .with_metadata("tokenizer.chat_template", ("string", NEW_TEMPLATE))
             .with_metadata("tokenizer.ggml.eos_token_id", ("uint32", 2))
             .with_metadata("general.source.url", None)
             .with_metadata("tokenizer.ggml.tokens", ("array[string]", ["<s>", "x\\y", "é"]))
             .with_metadata("my.note", ("string", "fixed"))
             .with_metadata("my.count", ("uint64", 2**40))
             .with_tensor("output_norm.weight", TensorEdit(
                 "output_norm.weight",
                 store.put_data((new_norm.byteswap() if big else new_norm).tobytes())))
             .with_tensor("blk.0.attn_q.weight", TensorEdit(None))
             .with_tensor("blk.0.ids", TensorEdit("blk.0.ids_renamed")))
    kvs = base_kvs()
    kvs[0] = ("tokenizer.chat_template", NEW_TEMPLATE, GV.STRING, None)
    kvs[1] = ("tokenizer.ggml.eos_token_id", 2, GV.UINT32, None)
    del kvs[3]
    kvs[3] = ("tokenizer.ggml.tokens", ["<s>", "x\\y", "é"], GV.ARRAY, GV.STRING)
    kvs += [("my.note", "fixed", GV.STRING, None), ("my.count", 2**40, GV.UINT64, None)]
    tensors = base_tensors()
    tensors["output_norm.weight"] = new_norm
    del tensors["blk.0.attn_q.weight"]
    tensors["blk.0.ids_renamed"] = tensors.pop("blk.0.ids")
    order = ["token_embd.weight", "blk.0.ffn_up.weight", "output_norm.weight", "blk.0.ids_renamed"]
    reference = write_kv_gguf(tmp_path / "ref.gguf", kvs, {n: tensors[n] for n in order}, endian)
    assert _compose(model, state, store) == reference.read_bytes()
    store.close()


def test_the_edit_session_edits_a_model_in_model_terms(tmp_path):
    """``EditSession`` without a mount or a tree: a key set from a file's text, a key
    deleted, a tensor replaced by an ``.npy``, one removed, one renamed; a name taken and a
    text that is not a value refused (errno, the state unchanged).  The composed file is
    what GGUFWriter writes, and a new session on the same DIR composes it again."""
    import errno
    import io

    from tensorfs.editing.session import EditRefused, EditSession
    from tensorfs.editing.store import EditStore
    from tensorfs.loading.loader import load_model

    path = write_kv_gguf(tmp_path / "m.gguf", base_kvs(), base_tensors())
    model = load_model(str(path))
    store = EditStore(str(tmp_path / "edits"), [])
    session = EditSession(model, model.sources, store)
    session.set_key("tokenizer.ggml.eos_token_id", session.parsed(
        "tokenizer.ggml.eos_token_id", "uint32", b"2\n", "kept"))
    session.delete_key("general.source.url")
    new_norm = np.linspace(-1, 1, 8, dtype=np.float64)     # stored in the tensor's float32
    npy = io.BytesIO()
    np.save(npy, new_norm)
    committed, data_name = session.replace_npy("output_norm.weight", npy.getvalue())
    assert committed.state.tensors["output_norm.weight"].data == data_name
    session.remove_tensor("blk.0.attn_q.weight")
    session.commit(session.renamed({"blk.0.ids": "blk.0.ids_renamed"}))
    kept = session.state
    with pytest.raises(EditRefused) as taken:
        session.renamed({"token_embd.weight": "blk.0.ids_renamed"})
    with pytest.raises(EditRefused) as not_a_value:
        session.parsed("tokenizer.ggml.eos_token_id", "uint32", b"two\n", "kept")
    assert (taken.value.errno, not_a_value.value.errno) == (errno.EEXIST, errno.EINVAL)
    assert session.state is kept
    composed = session.composed().read(0, 1 << 30)
    store.close()

    kvs = base_kvs()
    kvs[1] = ("tokenizer.ggml.eos_token_id", 2, GV.UINT32, None)
    del kvs[3]
    tensors = base_tensors()
    tensors["output_norm.weight"] = new_norm.astype(np.float32)
    del tensors["blk.0.attn_q.weight"]
    tensors["blk.0.ids_renamed"] = tensors.pop("blk.0.ids")
    order = ["token_embd.weight", "blk.0.ffn_up.weight", "output_norm.weight", "blk.0.ids_renamed"]
    reference = write_kv_gguf(tmp_path / "ref.gguf", kvs, {n: tensors[n] for n in order})
    assert composed == reference.read_bytes()
    again = EditSession(model, model.sources, EditStore(str(tmp_path / "edits"), []))
    assert again.composed().read(0, 1 << 30) == composed
    again.store.close()
    model.close()


def test_composed_safetensors_loads_as_save_file_wrote_it(tmp_path):
    from tensorfs.editing.store import EditState, EditStore, TensorEdit

    rng = np.random.default_rng(1)
    tensors = {"a": rng.standard_normal((3, 5)).astype(np.float32),
               "b": rng.standard_normal((7,)).astype(np.float16),
               "c": np.arange(6, dtype=np.int64)}
    save_file(tensors, str(tmp_path / "m.safetensors"), metadata={"format": "pt", "x": "1"})
    store = EditStore(str(tmp_path / "edits"), [])
    new_a = tensors["a"] * 2
    state = (EditState().with_metadata("x", None).with_metadata("y", ("string", "new"))
             .with_tensor("a", TensorEdit("a", store.put_data(new_a.tobytes())))
             .with_tensor("b", TensorEdit(None)).with_tensor("c", TensorEdit("c2")))
    composed = tmp_path / "composed.safetensors"
    composed.write_bytes(_compose(tmp_path / "m.safetensors", state, store))
    reference = tmp_path / "ref.safetensors"
    save_file({"a": new_a, "c2": tensors["c"]}, str(reference), metadata={"format": "pt", "y": "new"})
    _same_safetensors(composed, reference)
    assert len(json.loads(composed.read_bytes()[8:8 + int.from_bytes(
        composed.read_bytes()[:8], "little")])) == 3
    store.close()


def _same_safetensors(path, reference):
    with safe_open(str(path), "np") as got, safe_open(str(reference), "np") as want:
        assert got.metadata() == want.metadata()
        assert sorted(got.keys()) == sorted(want.keys())
        for name in want.keys():
            a, b = got.get_tensor(name), want.get_tensor(name)
            assert a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


# random sequences of edits: the composed file is always the one gguf-py writes for the
# model they make
_KEYS = ["k.a", "k.b", "tokenizer.ggml.eos_token_id", "general.name", "new.one", "new.two"]
_EDITS = st.lists(st.one_of(
    st.tuples(st.just("set"), st.sampled_from(_KEYS), st.integers(0, 2**32 - 1)),
    st.tuples(st.just("text"), st.sampled_from(_KEYS), st.text(max_size=20)),
    st.tuples(st.just("del"), st.sampled_from(_KEYS), st.none()),
    st.tuples(st.just("rm"), st.sampled_from(["t0", "t1", "t2"]), st.none()),
    st.tuples(st.just("mv"), st.sampled_from(["t0", "t1", "t2"]), st.sampled_from(["u0", "u1"])),
    st.tuples(st.just("data"), st.sampled_from(["t0", "t1", "t2"]), st.floats(-4, 4, width=32)),
), max_size=12)


def _tensor_edit(state, store, op: str, target: str, arg, names: dict, data: dict, arrays: dict):
    """One tensor edit of a random sequence -- ``rm``, ``mv`` to ``arg``, or the tensor
    filled with ``arg`` -- applied to ``state`` and to what the composed file must then hold
    (``names``: original -> current name or None, ``data``: original -> values); an edit of
    a removed tensor, or a move onto a taken name, changes nothing."""
    if names[target] is None:
        return state
    if op == "rm":
        names[target] = None
        return state.with_tensor(target, TensorEdit(None))
    if op == "mv":
        if arg in names.values():
            return state
        edit = state.tensors.get(target)
        names[target] = arg
        return state.with_tensor(target, TensorEdit(arg, edit.data if edit else None))
    data[target] = np.full_like(arrays[target], arg)
    return state.with_tensor(target, TensorEdit(names[target],
                                                store.put_data(data[target].tobytes())))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(edits=_EDITS)
def test_random_edit_sequences_compose_as_gguf_py_writes(tmp_path_factory, edits):
    from tensorfs.editing.store import EditState, EditStore

    work = tmp_path_factory.mktemp("random")
    kvs = {"k.a": (1, GV.UINT32), "k.b": ("b", GV.STRING),
           "tokenizer.ggml.eos_token_id": (2, GV.UINT32), "general.name": ("n", GV.STRING)}
    arrays = {f"t{i}": np.full((i + 1, 3), i, dtype=np.float32) for i in range(3)}
    model = write_kv_gguf(work / "m.gguf", [(k, v, t, None) for k, (v, t) in kvs.items()], arrays)
    store = EditStore(str(work / "edits"), [])
    state = EditState()
    expected_kvs = dict(kvs)
    names = {n: n for n in arrays}              # original -> current (None: removed)
    data = dict(arrays)                          # original -> array now
    for op, target, arg in edits:
        if op in ("set", "text"):
            typed = ("uint32", arg) if op == "set" else ("string", arg)
            state = state.with_metadata(target, typed)
            expected_kvs[target] = (arg, GV.UINT32 if op == "set" else GV.STRING)
        elif op == "del":
            state = state.with_metadata(target, None) if target in kvs \
                else state.without_metadata(target)
            expected_kvs.pop(target, None)
        else:
            state = _tensor_edit(state, store, op, target, arg, names, data, arrays)
    # a key deleted then set again is a new key: appended after the model's own
    ordered = [k for k in kvs if k in expected_kvs and state.metadata.get(k, ...) is not None]
    ordered += [k for k in state.metadata if k not in kvs and k in expected_kvs]
    reference = write_kv_gguf(work / "ref.gguf",
                           [(k, *expected_kvs[k], None) for k in ordered],
                           {names[n]: data[n] for n in arrays if names[n] is not None})
    assert _compose(model, state, store) == reference.read_bytes()
    store.close()


# -- the store ---------------------------------------------------------------------------------

def test_edits_dir_checked_like_the_disk_cache(tmp_path):
    from tensorfs.editing.store import EditsError, EditStore

    open_dir = tmp_path / "open"
    open_dir.mkdir(mode=0o777)
    open_dir.chmod(0o777)
    with pytest.raises(EditsError, match="group or others can write it"):
        EditStore(str(open_dir), [])
    (tmp_path / "real").mkdir(mode=0o700)
    (tmp_path / "link").symlink_to(tmp_path / "real")
    with pytest.raises(EditsError, match="symbolic link"):
        EditStore(str(tmp_path / "link"), [])
    foreign = tmp_path / "foreign"
    (foreign / "tensorfs-edits.v1").mkdir(parents=True, mode=0o700)
    (foreign / "tensorfs-edits.v1" / "mine.txt").write_text("not tensorfs's")
    with pytest.raises(EditsError, match="not a tensorfs edits directory"):
        EditStore(str(foreign), [])
    assert (foreign / "tensorfs-edits.v1" / "mine.txt").read_text() == "not tensorfs's"


# -- through a mount ---------------------------------------------------------------------------

@pytest.fixture
def llama_model(tmp_path):
    return write_kv_gguf(tmp_path / "model.gguf", base_kvs(), base_tensors())


def _sh(command: str, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(["sh", "-c", command], capture_output=True, text=True, check=False,
                          **kwargs)


def test_the_issue_commands_edit_the_served_model(tmp_path, llama_model, mount):
    """cat > metadata/KEY, echo 2 > the EOS id, rm a key, np.save into an .npy view: files/
    is then the file gguf-py writes with the same changes, and MODEL is untouched."""
    before = (sha256(llama_model), os.stat(llama_model).st_mtime_ns)
    edits = tmp_path / "fixes"
    mnt = mount(llama_model, "--edits", edits)
    (tmp_path / "my-template.jinja").write_text(NEW_TEMPLATE)
    for command in (f"cat {tmp_path}/my-template.jinja > {mnt}/metadata/tokenizer.chat_template",
                    f"echo 2 > {mnt}/metadata/tokenizer.ggml.eos_token_id",
                    f"rm {mnt}/metadata/general.source.url",
                    f"echo fixed > {mnt}/metadata/general.name"):
        result = _sh(command)
        assert result.returncode == 0, (command, result.stderr)
    norm = np.load(mnt / "output_norm" / "weight.npy")
    np.save(mnt / "output_norm" / "weight.npy", norm * 1.5)

    assert (mnt / "metadata" / "tokenizer.ggml.eos_token_id").read_text() == "2\n"
    assert not (mnt / "metadata" / "general.source.url").exists()
    shown = json.loads((mnt / "metadata.json").read_text())
    assert shown["metadata"]["tokenizer.chat_template"] == NEW_TEMPLATE
    assert "general.source.url" not in shown["metadata"]
    assert np.array_equal(np.load(mnt / "output_norm" / "weight.npy"), norm * 1.5)

    kvs = base_kvs()
    kvs[0] = ("tokenizer.chat_template", NEW_TEMPLATE, GV.STRING, None)
    kvs[1] = ("tokenizer.ggml.eos_token_id", 2, GV.UINT32, None)
    kvs[2] = ("general.name", "fixed", GV.STRING, None)
    del kvs[3]
    tensors = base_tensors()
    tensors["output_norm.weight"] = norm * 1.5
    reference = write_kv_gguf(tmp_path / "reference.gguf", kvs, tensors)
    served = mnt / "files" / "model.gguf"
    assert served.read_bytes() == reference.read_bytes()
    assert gguf_fields(served)["tokenizer.ggml.eos_token_id"][0] == 2
    assert (sha256(llama_model), os.stat(llama_model).st_mtime_ns) == before
    pid = daemon_pid(mnt)                       # the daemon holds MODEL read-only
    held = [fd for fd in os.listdir(f"/proc/{pid}/fd")
            if os.path.realpath(f"/proc/{pid}/fd/{fd}") == str(llama_model.resolve())]
    assert held
    for fd in held:
        flags = int(Path(f"/proc/{pid}/fdinfo/{fd}").read_text().split("flags:")[1].split()[0], 8)
        assert flags & os.O_ACCMODE == os.O_RDONLY
    # a metadata-only edit keeps no tensor bytes; the .npy edit keeps the one tensor's
    kept = list((edits / "tensorfs-edits.v1").glob("data-*.bin"))
    assert [p.stat().st_size for p in kept] == [8 * 4]


def test_edits_persist_and_bind_to_the_model(tmp_path, llama_model, mount):
    edits = tmp_path / "fixes"
    mnt = mount(llama_model, "--edits", edits)
    (mnt / "metadata" / "tokenizer.ggml.eos_token_id").write_text("7\n")
    os.rename(mnt / "blk" / "0" / "ids", mnt / "blk" / "0" / "token_ids")
    os.unlink(mnt / "blk" / "0" / "attn_q" / "weight")
    first = (mnt / "files" / "model.gguf").read_bytes()
    # no tensor bytes kept for a metadata edit, a removal or a rename: a few KiB
    assert sum(p.stat().st_size for p in (edits / "tensorfs-edits.v1").iterdir()) < 8192
    assert run_tensorfs("unmount", mnt).returncode == 0     # one mount at a time uses DIR
    again = mount(llama_model, "--edits", edits)
    assert (again / "files" / "model.gguf").read_bytes() == first
    assert (again / "metadata" / "tokenizer.ggml.eos_token_id").read_text() == "7\n"
    assert (again / "blk" / "0" / "token_ids").exists()
    assert not (again / "blk" / "0" / "ids").exists()
    assert not (again / "blk" / "0" / "attn_q" / "weight").exists()
    assert run_tensorfs("unmount", again).returncode == 0
    other = write_kv_gguf(tmp_path / "other.gguf", base_kvs()[:2], base_tensors(seed=3))


    (tmp_path / "m-other").mkdir()
    result = run_tensorfs("mount", other, tmp_path / "m-other", "--edits", edits)
    assert result.returncode == 1
    assert result.stderr.count("\n") == 1 and "edits of another model (model.gguf)" in result.stderr


def test_text_that_does_not_parse_fails_close_and_the_value_stays(tmp_path, llama_model, mount):
    mnt = mount(llama_model, "--edits", tmp_path / "fixes")
    eos = mnt / "metadata" / "tokenizer.ggml.eos_token_id"
    for bad in ("two\n", "-1\n", f"{2**32}\n", "1\n2\n"):
        with pytest.raises(OSError) as caught, open(eos, "w") as f:
            f.write(bad)
        assert caught.value.errno == 22
        assert eos.read_text() == "1\n"
    shell = subprocess.run(["bash", "-c", f"echo two > {eos}"], capture_output=True, text=True,
                           check=False)
    assert shell.returncode != 0 and "write error: Invalid argument" in shell.stderr
    assert eos.read_text() == "1\n"
    with pytest.raises(OSError) as caught, open(mnt / "metadata" / "test.scores", "w") as f:
        f.write("0.5\nlots\n")
    assert caught.value.errno == 22
    (mnt / "metadata" / "test.scores").write_text("1.5\n2\n-inf\n")
    assert gguf_fields(mnt / "files" / "model.gguf")["test.scores"][0] == [1.5, 2.0, float("-inf")]


def test_new_keys_string_by_default_typed_by_xattr(tmp_path, llama_model, mount):
    mnt = mount(llama_model, "--edits", tmp_path / "fixes")
    (mnt / "metadata" / "my.string").write_text("hello\n")
    fd = os.open(mnt / "metadata" / "my.count", os.O_CREAT | os.O_WRONLY, 0o644)
    try:
        os.setxattr(fd, "user.tensorfs.type", b"int32")
        os.write(fd, b"-5\n")
    finally:
        os.close(fd)
    assert os.getxattr(mnt / "metadata" / "my.count", "user.tensorfs.type") == b"int32"
    fields = gguf_fields(mnt / "files" / "model.gguf")
    assert fields["my.string"][0] == "hello"
    assert fields["my.count"] == (-5, [GV.INT32])
    # an O_TRUNC open with nothing written sets the empty string
    assert _sh(f"cp /dev/null {mnt}/metadata/my.string").returncode == 0
    assert gguf_fields(mnt / "files" / "model.gguf")["my.string"][0] == ""
    # a new key whose text does not read as its type is not made
    fd = os.open(mnt / "metadata" / "my.bad", os.O_CREAT | os.O_WRONLY, 0o644)
    os.setxattr(fd, "user.tensorfs.type", b"uint8")
    with pytest.raises(OSError) as caught:
        os.write(fd, b"300\n")
    assert caught.value.errno == 22                     # the line is complete: the write fails
    with pytest.raises(OSError):
        os.close(fd)                                    # and so does the close
    assert not (mnt / "metadata" / "my.bad").exists()


def test_tensor_raw_file_overwritten_at_its_size_only(tmp_path, llama_model, mount):
    mnt = mount(llama_model, "--edits", tmp_path / "fixes")
    raw = mnt / "token_embd" / "weight"
    size = raw.stat().st_size
    fd = os.open(raw, os.O_WRONLY | os.O_TRUNC)
    with pytest.raises(OSError) as caught:
        os.write(fd, bytes(size + 1))
    assert caught.value.errno == 27                     # EFBIG: a write past the end
    with pytest.raises(OSError) as caught:
        os.close(fd)
    assert caught.value.errno == 22                     # and nothing of its size was written
    with pytest.raises(OSError) as caught, open(raw, "wb") as f:
        f.write(bytes(size - 4))
    assert caught.value.errno == 22
    new = np.arange(48, dtype=np.float32).reshape(6, 8)
    raw.write_bytes(new.tobytes())
    assert np.array_equal(gguf_tensor(mnt / "files" / "model.gguf", "token_embd.weight"), new)


def test_quantized_npy_written_through_gguf_py_quantize(tmp_path, llama_model, mount):
    mnt = mount(llama_model, "--edits", tmp_path / "fixes")
    view = mnt / "blk" / "0" / "ffn_up" / "weight.npy"
    values = np.load(view)
    np.save(view, values * 2)
    want = gguf.quants.quantize(values * 2, gguf.GGMLQuantizationType.Q8_0)
    got = gguf_tensor(mnt / "files" / "model.gguf", "blk.0.ffn_up.weight")
    assert got.tobytes() == want.tobytes()
    with pytest.raises(OSError) as caught:              # another shape: refused
        np.save(view, np.zeros((2, 2), dtype=np.float32))
    assert caught.value.errno == 22


def test_rm_and_mv_of_tensors(tmp_path, llama_model, mount):
    mnt = mount(llama_model, "--edits", tmp_path / "fixes")
    removed = _sh(f"rm -r {mnt}/blk/0/attn_q")
    assert removed.returncode == 0, removed.stderr
    assert not (mnt / "blk" / "0" / "attn_q").exists()
    assert _sh(f"mv {mnt}/output_norm/weight {mnt}/output_norm/scale").returncode == 0
    assert sorted(os.listdir(mnt / "output_norm")) == ["scale", "scale.npy"]
    names = gguf_names(mnt / "files" / "model.gguf")
    assert names == ["token_embd.weight", "blk.0.ffn_up.weight", "output_norm.scale", "blk.0.ids"]
    assert "blk.0.attn_q.weight" not in json.loads((mnt / "metadata.json").read_text())["tensors"]


def test_a_reader_keeps_its_view_until_it_closes(tmp_path, llama_model, mount):
    mnt = mount(llama_model, "--edits", tmp_path / "fixes")
    served = mnt / "files" / "model.gguf"
    with open(served, "rb") as before:
        (mnt / "metadata" / "general.name").write_text("a much longer name than before\n")
        old = before.read()
    assert old == llama_model.read_bytes()
    assert served.read_bytes() != old
    assert gguf_fields(served)["general.name"][0] == "a much longer name than before"


def test_without_edits_the_mount_is_read_only(tmp_path, llama_model, mount):
    mnt = mount(llama_model)
    for command in (f"echo 2 > {mnt}/metadata/tokenizer.ggml.eos_token_id",
                    f"rm {mnt}/metadata/general.name", f"echo x > {mnt}/metadata/new"):
        result = _sh(command)
        assert result.returncode != 0 and "Read-only file system" in result.stderr


def test_files_outside_metadata_and_tensors_stay_read_only(tmp_path, llama_model, mount):
    mnt = mount(llama_model, "--edits", tmp_path / "fixes")
    for path in (mnt / "header.bin", mnt / "metadata.json", mnt / "files" / "model.gguf"):
        with pytest.raises(PermissionError):
            path.write_bytes(b"x")
    with pytest.raises(OSError):
        (mnt / "new-file").write_text("x")
    assert (mnt / "header.bin").read_bytes() == llama_model.read_bytes()[:len(
        (mnt / "header.bin").read_bytes())]


@pytest.mark.slow
def test_a_daemon_killed_mid_edit_leaves_the_old_value(tmp_path, llama_model, mount):
    edits = tmp_path / "fixes"
    mnt = mount(llama_model, "--edits", edits)
    pid = daemon_pid(mnt)
    writer = subprocess.Popen(
        ["python3", "-c", ("import sys, time\n"
                           f"f = open({str(mnt / 'metadata' / 'general.name')!r}, 'w')\n"
                           "f.write('half'); f.flush()\n"
                           f"g = open({str(mnt / 'token_embd' / 'weight')!r}, 'r+b')\n"
                           "g.write(b'x' * 64); g.flush(); print('written', flush=True); "
                           "time.sleep(60)")],
        stdout=subprocess.PIPE, text=True)
    try:
        assert writer.stdout.readline() == "written\n"
        os.kill(pid, signal.SIGKILL)
        wait_for(lambda: not os.path.exists(f"/proc/{pid}"))
    finally:
        writer.kill()
        writer.wait()
    subprocess.run(["fusermount3", "-uz", str(mnt)], capture_output=True, check=False)
    assert [p for p in (edits / "tensorfs-edits.v1").iterdir() if p.name.endswith(".tmp")]
    again = mount(llama_model, "--edits", edits)
    assert (again / "metadata" / "general.name").read_text() == "tiny\n"
    assert np.array_equal(np.load(again / "token_embd" / "weight.npy"), base_tensors()[
        "token_embd.weight"])
    assert not [p for p in (edits / "tensorfs-edits.v1").iterdir() if p.name.endswith(".tmp")]


@needs_users
@pytest.mark.parametrize("model_owner", ["root", "attacker"])
def test_only_the_owner_edits_under_allow_other(tmp_path, llama_model, users, model_owner):
    """Another user may read, never edit: refused by the kernel (the files are the model's
    owner's, 0644), and by tensorfs, which checks each request's user against the mount's
    (root mounting a model the other user owns: the kernel lets the owner write)."""


    _, attacker = users
    if model_owner == "attacker":
        os.chown(llama_model, attacker.uid, attacker.uid)
    shared = Path(tempfile.mkdtemp(prefix="tensorfs-edits-"))
    shared.chmod(0o755)
    mnt = shared / "mnt"
    mnt.mkdir()
    try:
        result = run_tensorfs("mount", llama_model, mnt, "--edits", tmp_path / "fixes",
                              "-o", "allow_other")
        assert result.returncode == 0, result.stderr
        try:
            eos = mnt / "metadata" / "tokenizer.ggml.eos_token_id"
            read = attacker.run("cat", eos)
            assert read.returncode == 0 and read.stdout == "1\n"
            for command in (f"echo 5 > {eos}", f"rm {eos}", f"echo x > {mnt}/metadata/new",
                            f"mv {mnt}/output_norm/weight {mnt}/output_norm/w2"):
                attempt = attacker.run("sh", "-c", command)
                assert attempt.returncode != 0
                assert "Permission denied" in attempt.stderr or \
                    "Operation not permitted" in attempt.stderr
            assert eos.read_text() == "1\n"
            assert (mnt / "files" / "model.gguf").read_bytes() == llama_model.read_bytes()
        finally:
            run_tensorfs("unmount", mnt)
    finally:
        shutil.rmtree(shared, ignore_errors=True)


def test_safetensors_metadata_and_npy_edits(tmp_path, mount):
    rng = np.random.default_rng(2)
    tensors = {"model.embed.weight": rng.standard_normal((4, 3)).astype(np.float32),
               "model.norm.weight": rng.standard_normal((3,)).astype(np.float16)}
    model = tmp_path / "model.safetensors"
    save_file(tensors, str(model), metadata={"format": "pt", "note": "old"})
    mnt = mount(model, "--edits", tmp_path / "fixes")
    (mnt / "metadata" / "note").write_text("new note\n")
    (mnt / "metadata" / "added").write_text("yes\n")
    np.save(mnt / "model" / "norm" / "weight.npy", tensors["model.norm.weight"] * 2)
    os.unlink(mnt / "model" / "embed" / "weight.npy")
    reference = tmp_path / "reference.safetensors"
    save_file({"model.norm.weight": tensors["model.norm.weight"] * 2}, str(reference),
              metadata={"format": "pt", "note": "new note", "added": "yes"})
    _same_safetensors(mnt / "files" / "model.safetensors", reference)
    fd = os.open(mnt / "metadata" / "typed", os.O_CREAT | os.O_WRONLY, 0o644)
    with pytest.raises(OSError) as caught:
        os.setxattr(fd, "user.tensorfs.type", b"uint32")
    os.close(fd)
    assert caught.value.errno == 22


# -- shards and splits -------------------------------------------------------------------------

def test_sharded_safetensors_each_shard_composed_and_the_index_follows(tmp_path, mount):
    from tests.support.shards import safetensors_reference, write_hf_shards

    index, tensors, weight_map = write_hf_shards(tmp_path / "hf")
    mnt = mount(index, "--edits", tmp_path / "fixes")
    new_q = tensors["model.layers.1.self_attn.q_proj.weight"] * 2
    np.save(mnt / "model" / "layers" / "1" / "self_attn" / "q_proj" / "weight.npy", new_q)
    assert _sh(f"rm {mnt}/model/layers/2/mlp/mask").returncode == 0
    os.rename(mnt / "lm_head" / "weight", mnt / "lm_head" / "bias")
    files = mnt / "files"
    served = json.loads((files / index.name).read_text())
    want_map = {n: s for n, s in weight_map.items() if n != "model.layers.2.mlp.mask"}
    want_map["lm_head.bias"] = want_map.pop("lm_head.weight")
    assert served["weight_map"] == want_map
    assert served["metadata"] == json.loads(index.read_text())["metadata"]
    expected = dict(tensors)
    expected["model.layers.1.self_attn.q_proj.weight"] = new_q
    del expected["model.layers.2.mlp.mask"]
    expected["lm_head.bias"] = expected.pop("lm_head.weight")
    got = safetensors_reference(files / index.name)
    assert sorted(got) == sorted(expected)
    for name, (array, shard) in got.items():
        assert shard == want_map[name]
        assert array.dtype == expected[name].dtype and array.tobytes() == expected[name].tobytes()
    for shard in sorted(set(weight_map.values())):          # each shard as save_file writes it
        reference = tmp_path / "ref" / shard
        reference.parent.mkdir(exist_ok=True)
        save_file({n: expected[n] for n, s in want_map.items() if s == shard}, str(reference),
                  metadata={"format": "np"})
        _same_safetensors(files / shard, reference)
    # the index's metadata is not edited here
    assert _sh(f"echo 1 > {mnt}/metadata/total_size").returncode != 0


def test_split_gguf_each_split_composed(tmp_path, mount):
    from tests.support.shards import write_split_gguf

    files, tensors = write_split_gguf(tmp_path / "gg")
    mnt = mount(files[0], "--edits", tmp_path / "fixes")
    (mnt / "metadata" / "general.name").write_text("split, edited\n")
    names = list(tensors)
    assert _sh(f"rm {mnt}/blk/4/weight").returncode == 0
    reader_total = 0
    seen = {}
    for path in files:
        served = mnt / "files" / path.name
        fields = gguf_fields(served)
        if path == files[0]:
            assert fields["general.name"][0] == "split, edited"
            assert fields["split.tensors.count"][0] == len(names) - 1
        else:
            assert "general.name" not in fields
        for name in gguf_names(served):
            seen[name] = gguf_tensor(served, name)
            reader_total += 1
    assert sorted(seen) == sorted(n for n in names if n != "blk.4.weight")
    for name, array in seen.items():
        assert array.tobytes() == tensors[name].tobytes()


def test_mv_of_a_directory_renames_every_tensor_below(tmp_path, llama_model, mount):
    edits = tmp_path / "fixes"
    mnt = mount(llama_model, "--edits", edits)
    assert _sh(f"mv {mnt}/blk/0 {mnt}/blk/7").returncode == 0
    assert sorted(os.listdir(mnt / "blk")) == ["7"]
    names = gguf_names(mnt / "files" / "model.gguf")
    assert names == ["token_embd.weight", "blk.7.attn_q.weight", "blk.7.ffn_up.weight",
                     "output_norm.weight", "blk.7.ids"]
    np.save(mnt / "blk" / "7" / "ids.npy", np.ones((3, 4), dtype=np.int32))
    assert np.array_equal(gguf_tensor(mnt / "files" / "model.gguf", "blk.7.ids"),
                          np.ones((3, 4), dtype=np.int32))
    listed = sorted(os.listdir(mnt / "blk" / "7"))
    assert run_tensorfs("unmount", mnt).returncode == 0     # one mount at a time uses DIR
    again = mount(llama_model, "--edits", edits)
    assert gguf_names(again / "files" / "model.gguf") == names
    assert sorted(os.listdir(again / "blk" / "7")) == listed


def test_general_alignment_edited_moves_the_data(tmp_path, mount):
    """general.alignment set to 64: every tensor's data moves to a multiple of it, as
    GGUFWriter writes a file of that alignment; a value that is not a power of two is
    refused and the old one stays."""
    model = write_kv_gguf(tmp_path / "model.gguf", base_kvs(), base_tensors(), alignment=32)
    mnt = mount(model, "--edits", tmp_path / "fixes")
    alignment = mnt / "metadata" / "general.alignment"
    with pytest.raises(OSError) as caught, open(alignment, "w") as f:
        f.write("48\n")
    assert caught.value.errno == 22
    alignment.write_text("64\n")
    reference = write_kv_gguf(tmp_path / "reference.gguf", base_kvs(), base_tensors(), alignment=64)
    assert (mnt / "files" / "model.gguf").read_bytes() == reference.read_bytes()


@pytest.mark.remote
def test_a_remote_model_edited_its_bytes_through_the_block_cache(tmp_path, llama_model, mount):
    """A URL as MODEL: the edits live in DIR, the unchanged bytes come over HTTP."""
    pytest.importorskip("aiohttp")
    from tests.support.servers import Nginx

    nginx = Nginx(tmp_path / "srv").start()
    try:
        url = nginx.put("files/model.gguf", llama_model)
        mnt = mount(url, "--edits", tmp_path / "fixes")
        (mnt / "metadata" / "tokenizer.ggml.eos_token_id").write_text("2\n")
        kvs = base_kvs()
        kvs[1] = ("tokenizer.ggml.eos_token_id", 2, GV.UINT32, None)
        reference = write_kv_gguf(tmp_path / "reference.gguf", kvs, base_tensors())
        assert (mnt / "files" / "model.gguf").read_bytes() == reference.read_bytes()
    finally:
        nginx.stop()


def test_a_version_the_kernel_holds_outlives_any_number_of_edits(tmp_path, llama_model, mount):
    """metadata.json and files/ are a new inode at each edit; one the kernel still holds (a
    path just looked up, an O_PATH descriptor, a cwd) is kept however many edits follow, so
    that its open reads that version whole, never ENOENT (a reader racing a burst of edits
    got ENOENT once 16 versions had passed between its lookup and its open)."""
    mnt = mount(llama_model, "--edits", tmp_path / "fixes")
    held = {name: os.open(mnt / name, os.O_PATH)
            for name in ("metadata.json", "files/model.gguf")}
    before = {name: (mnt / name).read_bytes() for name in held}
    try:
        for i in range(40):
            (mnt / "metadata" / "general.name").write_text(f"edited {i}\n")
        for name, fd in held.items():
            assert os.fstat(fd).st_size == len(before[name]), name
            with open(f"/proc/self/fd/{fd}", "rb") as f:    # an OPEN of the held inode
                assert f.read() == before[name], name
        assert json.loads((mnt / "metadata.json").read_text())["metadata"]["general.name"] \
            == "edited 39"
    finally:
        for fd in held.values():
            os.close(fd)


@pytest.mark.slow
def test_concurrent_edits_and_reads(tmp_path, llama_model, mount):
    """Writers of several keys and a tensor, readers of files/, metadata.json and the
    tree, all at once: every reader sees a whole file, and the model ends with each key's
    last value."""
    import threading

    mnt = mount(llama_model, "--edits", tmp_path / "fixes")
    errors = []
    stop = threading.Event()

    def writer(key, n):
        for i in range(n):
            try:
                (mnt / "metadata" / key).write_text(f"{key} {i}\n")
            except OSError as error:
                errors.append(error)

    def tensor_writer(n):
        for i in range(n):
            np.save(mnt / "output_norm" / "weight.npy", np.full(8, i, dtype=np.float32))

    def reader():
        while not stop.is_set():
            try:
                fields = gguf_fields(mnt / "files" / "model.gguf")
                assert fields["tokenizer.ggml.eos_token_id"][0] == 1
                json.loads((mnt / "metadata.json").read_text())
                os.listdir(mnt / "metadata")
            except (OSError, ValueError, AssertionError) as error:
                errors.append(error)

    threads = [threading.Thread(target=writer, args=(k, 20))
               for k in ("general.name", "my.a", "my.b")]
    threads.append(threading.Thread(target=tensor_writer, args=(10,)))
    readers = [threading.Thread(target=reader) for _ in range(2)]
    for t in threads + readers:
        t.start()
    for t in threads:
        t.join()
    stop.set()
    for t in readers:
        t.join()
    assert errors == [], [str(e) for e in errors]
    fields = gguf_fields(mnt / "files" / "model.gguf")
    assert [fields[k][0] for k in ("general.name", "my.a", "my.b")] == \
        ["general.name 19", "my.a 19", "my.b 19"]
    assert np.array_equal(gguf_tensor(mnt / "files" / "model.gguf", "output_norm.weight"),
                          np.full(8, 9, dtype=np.float32))


_ST_EDITS = st.lists(st.one_of(
    st.tuples(st.just("meta"), st.sampled_from(["format", "note", "new"]), st.text(max_size=12)),
    st.tuples(st.just("del"), st.sampled_from(["format", "note", "new"]), st.none()),
    st.tuples(st.just("rm"), st.sampled_from(["a", "b", "c"]), st.none()),
    st.tuples(st.just("mv"), st.sampled_from(["a", "b", "c"]), st.sampled_from(["x", "y"])),
    st.tuples(st.just("data"), st.sampled_from(["a", "b", "c"]), st.integers(-50, 50)),
), max_size=10)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(edits=_ST_EDITS)
def test_random_edit_sequences_compose_as_save_file_writes(tmp_path_factory, edits):
    """The composed safetensors file loads (safe_open) as the one save_file writes for the
    same tensors and metadata."""
    from tensorfs.editing.store import EditState, EditStore

    work = tmp_path_factory.mktemp("st")
    arrays = {"a": np.arange(6, dtype=np.float32).reshape(2, 3),
              "b": np.arange(5, dtype=np.int16), "c": np.ones((2, 2), dtype=np.float64)}
    metadata = {"format": "pt", "note": "n"}
    save_file(arrays, str(work / "m.safetensors"), metadata=metadata)
    store = EditStore(str(work / "edits"), [])
    state = EditState()
    expected_meta = dict(metadata)
    names = {n: n for n in arrays}
    data = dict(arrays)
    for op, target, arg in edits:
        if op == "meta":
            state = state.with_metadata(target, ("string", arg))
            expected_meta[target] = arg
        elif op == "del":
            state = state.with_metadata(target, None) if target in metadata \
                else state.without_metadata(target)
            expected_meta.pop(target, None)
        else:
            state = _tensor_edit(state, store, op, target, arg, names, data, arrays)
    composed = work / "composed.safetensors"
    composed.write_bytes(_compose(work / "m.safetensors", state, store))
    reference = work / "reference.safetensors"
    save_file({names[n]: data[n] for n in arrays if names[n] is not None}, str(reference),
              metadata=expected_meta or None)
    _same_safetensors(composed, reference)
    store.close()


@needs_users
def test_a_link_another_user_planted_on_the_way_to_the_edits_dir_is_never_followed(
        tmp_path, llama_model, users):
    """``--edits /shared/link/sub`` where another user made ``link`` in a sticky shared
    directory: refused in one line naming the link, as the disk cache's DIR is; nothing is
    created in the directory it points to."""
    _, attacker = users
    with planted_link(attacker) as (theirs, link):
        mnt = tmp_path / "m"
        mnt.mkdir()
        result, mounted = mount_expecting_refusal(llama_model, mnt, "--edits", link / "sub")
        assert result.returncode == 1 and result.stderr.count("\n") == 1, result.stderr
        assert f"{link} is a symbolic link of uid {attacker.uid}" in result.stderr
        assert not mounted and os.listdir(theirs) == []


def test_a_refused_edit_is_never_seen_however_late_the_release_comes(tmp_path, llama_model,
                                                                      mount):
    """Issue 43 class 10: whatever a close (or a write) refuses is gone for every other open
    the moment it answers, whenever the kernel's FUSE_RELEASE of that open arrives.  A
    ``dup`` of the descriptor holds the open after the close, as a late RELEASE does (under
    load, the kernel sends it after the close has returned): deterministically."""
    mnt = mount(llama_model, "--edits", tmp_path / "fixes")
    eos = mnt / "metadata" / "tokenizer.ggml.eos_token_id"

    def refused_close(path, data, flags=os.O_WRONLY | os.O_TRUNC):
        fd = os.open(path, flags)
        held = os.dup(fd)
        os.write(fd, data)                  # taken: the text is judged at close
        with pytest.raises(OSError) as caught:
            os.close(fd)
        assert caught.value.errno == 22
        return held

    held = refused_close(eos, b"-1")        # no newline: the write itself is taken
    assert eos.read_text() == "1\n" and eos.stat().st_size == 2
    eos.write_text("3\n")                   # a new writer meanwhile: from the kept value
    assert eos.read_text() == "3\n"
    with pytest.raises(OSError):
        os.close(held)                      # the held open's own close says it again
    assert eos.read_text() == "3\n"

    # a write refused (a scalar's line complete): not seen before the close either
    fd = os.open(eos, os.O_WRONLY | os.O_TRUNC)
    held = os.dup(fd)
    with pytest.raises(OSError) as caught:
        os.write(fd, b"-1\n")
    assert caught.value.errno == 22
    assert eos.read_text() in ("", "3\n")   # the open's own bytes (emptied), never "-1"
    with pytest.raises(OSError):
        os.close(fd)
    assert eos.read_text() == "3\n"
    with pytest.raises(OSError):
        os.close(held)

    # a tensor's raw bytes of the wrong size, and an .npy of another shape
    raw = mnt / "token_embd" / "weight"
    npy = mnt / "output_norm" / "weight.npy"
    before_raw, before_npy = raw.read_bytes(), np.load(npy)
    held_raw = refused_close(raw, bytes(len(before_raw) // 2))
    assert raw.read_bytes() == before_raw and raw.stat().st_size == len(before_raw)
    import io
    wrong = io.BytesIO()
    np.save(wrong, np.zeros((2, 2), np.float32))
    held_npy = refused_close(npy, wrong.getvalue())
    assert np.array_equal(np.load(npy), before_npy)
    for held in (held_raw, held_npy):
        with pytest.raises(OSError):
            os.close(held)
    assert raw.read_bytes() == before_raw and np.array_equal(np.load(npy), before_npy)

    # a new key whose text a close refused is not there, though its open lives on
    fd = os.open(mnt / "metadata" / "my.count", os.O_CREAT | os.O_WRONLY, 0o644)
    os.setxattr(fd, "user.tensorfs.type", b"uint8")
    held = os.dup(fd)
    os.write(fd, b"300")
    with pytest.raises(OSError):
        os.close(fd)
    assert not (mnt / "metadata" / "my.count").exists()
    assert "my.count" not in os.listdir(mnt / "metadata")
    with pytest.raises(OSError):
        os.close(held)
    assert "my.count" not in gguf_fields(mnt / "files" / "model.gguf")
