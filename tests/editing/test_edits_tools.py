"""The tools a user edits with, through a real ``--edits`` mount (docs/reference/editing.md, "Works
with"): sed -i, perl -pi, vim, Python's temporary-file-and-rename, cp, dd, echo, numpy.
Each leaves the file gguf-py's ``GGUFWriter`` writes for the same change -- a key keeps its
type, a tool's temporary, swap and backup files never reach the model -- and what the
format or its readers refuse is refused.  Also: DIR's journal is input, checked at mount.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile

import gguf
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from safetensors import safe_open
from safetensors.numpy import save_file

from tests.support import mount_expecting_refusal, run_tensorfs
from tests.support.edit_models import GV, field_types, tool_kvs, tool_tensors, write_kv_gguf

VIM = shutil.which("vim") or shutil.which("vim.tiny")
needs_vim = pytest.mark.skipif(VIM is None, reason="vim is not installed (make test-system-deps)")
needs_perl = pytest.mark.skipif(shutil.which("perl") is None, reason="perl is not installed")


@pytest.fixture
def model(tmp_path):
    return write_kv_gguf(tmp_path / "model.gguf", tool_kvs(), tool_tensors())


def _run(args, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(args, capture_output=True, text=True, check=False,
                          stdin=subprocess.DEVNULL, timeout=60, **kwargs)


def _python_atomic_write(path, text: str) -> None:
    """The usual atomic write: a temporary file beside the target, renamed over it."""
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path))
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def _python_atomic_write_inside(path, text: str) -> None:
    """The same with the rename before the close (flushed, fsynced, renamed, then closed)."""
    with open(f"{path}.tmp", "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
        os.replace(f"{path}.tmp", path)


_VIM_SETS = {"defaults": [],
             "backup copied": ["set backup backupskip= backupcopy=yes"],
             "backup renamed": ["set backup backupskip= backupcopy=no"],
             "writebackup renamed": ["set nobackup writebackup backupskip= backupcopy=no"]}


def _edit(tool: str, path, old: str, new: str) -> subprocess.CompletedProcess | None:
    if tool == "sed":
        return _run(["sed", "-i", f"s/{old}/{new}/", str(path)])
    if tool == "perl":
        return _run(["perl", "-pi", "-e", f"s/{old}/{new}/", str(path)])
    if tool.startswith("vim"):
        sets = _VIM_SETS[tool.split(":", 1)[1]]
        args = [VIM, "-es", "-N"]
        for command in sets + [f"s/{old}/{new}/", "wq"]:
            args += ["-c", command]
        return _run(args + [str(path)], cwd=path.parent)
    if tool == "python":
        _python_atomic_write(path, path.read_text().replace(old, new))
        return None
    if tool == "python-inside":
        _python_atomic_write_inside(path, path.read_text().replace(old, new))
        return None
    text = path.read_text().replace(old, new)
    if tool == "echo":
        return _run(["sh", "-c", 'printf "%s" "$1" > "$2"', "sh", text, str(path)])
    source = path.parent.parent.parent / "new-value.txt"        # beside the mount point
    source.write_text(text)
    if tool == "cp":
        return _run(["cp", str(source), str(path)])
    if tool == "dd":
        return _run(["dd", f"if={source}", f"of={path}", "status=none"])
    if tool == "mv":                # from another file system: unlink KEY, create KEY, copy
        return _run(["mv", str(source), str(path)])
    raise AssertionError(tool)


TOOLS = ["sed", pytest.param("perl", marks=needs_perl), "python", "python-inside", "echo", "cp",
         "dd", "mv",
         *(pytest.param(f"vim:{v}", marks=needs_vim) for v in _VIM_SETS)]


@pytest.mark.parametrize("tool", TOOLS)
def test_a_tool_rewriting_a_key_keeps_its_type(tmp_path, model, mount, tool):
    """The EOS id (a uint32) and the name (a string) rewritten by the tool: files/ is the
    file GGUFWriter writes with the new values, the id still a uint32 (llama.cpp refuses a
    string there), and nothing the tool made on the way is a key or left in metadata/."""
    edits = tmp_path / "fixes"
    mnt = mount(model, "--edits", edits)
    meta = mnt / "metadata"
    names = sorted(os.listdir(meta))
    before = (mnt / "files" / "model.gguf").read_bytes()
    # two readers open across the edits: each keeps the version it opened
    with open(mnt / "files" / "model.gguf", "rb") as old_file, \
            open(mnt / "metadata.json", "rb") as old_json:
        old_file.read(16)
        old_json.read(16)
        for key, old, new in (("tokenizer.ggml.eos_token_id", "1", "3"),
                              ("general.name", "tiny", "small")):
            result = _edit(tool, meta / key, old, new)
            assert result is None or result.returncode == 0, (tool, result.stderr)
        old_file.seek(0)
        assert old_file.read() == before
        old_json.seek(0)
        assert json.loads(old_json.read())["metadata"]["tokenizer.ggml.eos_token_id"] == 1
    reference = write_kv_gguf(tmp_path / "reference.gguf", tool_kvs(eos=3, name="small"),
                              tool_tensors())
    # vim's 'backup' keeps KEY~ (a scratch file of the mount, never a key); nothing else stays
    assert sorted(n for n in os.listdir(meta) if not n.endswith("~")) == names
    _check_tool_edit(mnt, reference)
    result = run_tensorfs("unmount", mnt)
    assert result.returncode == 0, result.stderr
    _check_tool_edit(mount(model, "--edits", edits, name="again"), reference)


def _check_tool_edit(mnt, reference) -> None:
    """Every view of the two keys the tool test rewrote: the metadata files, their type
    xattr, metadata.json, and files/ as GGUFWriter writes the same values."""
    meta = mnt / "metadata"
    assert (meta / "tokenizer.ggml.eos_token_id").read_text() == "3\n"
    assert (meta / "general.name").read_text() == "small\n"
    assert os.getxattr(meta / "tokenizer.ggml.eos_token_id", "user.tensorfs.type") == b"uint32"
    assert os.getxattr(meta / "general.name", "user.tensorfs.type") == b"string"
    shown = json.loads((mnt / "metadata.json").read_bytes())["metadata"]
    assert (shown["tokenizer.ggml.eos_token_id"], shown["general.name"]) == (3, "small")
    served = mnt / "files" / "model.gguf"
    types = field_types(served)
    assert types["tokenizer.ggml.eos_token_id"] == (3, [GV.UINT32])
    assert types["general.name"] == ("small", [GV.STRING])
    assert served.read_bytes() == reference.read_bytes()


@pytest.mark.parametrize("tool", ["sed", pytest.param("perl", marks=needs_perl), "python"])
def test_text_that_does_not_read_in_the_keys_type_is_refused_and_the_value_stays(
        tmp_path, model, mount, tool):
    mnt = mount(model, "--edits", tmp_path / "fixes")
    eos = mnt / "metadata" / "tokenizer.ggml.eos_token_id"
    if tool == "python":
        with pytest.raises(OSError) as caught:
            _python_atomic_write(eos, "one\n")
        assert caught.value.errno == 22
        with pytest.raises(OSError) as caught:
            _python_atomic_write_inside(eos, "one\n")         # KEY.tmp: never a key either
        assert caught.value.errno == 22
        os.unlink(f"{eos}.tmp")
    else:
        result = _edit(tool, eos, "1", "one")
        assert result.returncode != 0
    assert eos.read_text() == "1\n"
    served = mnt / "files" / "model.gguf"
    assert field_types(served)["tokenizer.ggml.eos_token_id"] == (1, [GV.UINT32])
    assert served.read_bytes() == model.read_bytes()


def test_scratch_files_never_reach_the_model(tmp_path, model, mount):
    """Files a tool makes in metadata/ under names no key has (vim's swap file and 4913
    probe, a backup, sed's temporary) are the mount's, never keys: files/ stays the model,
    and a remount of DIR shows none of them."""
    edits = tmp_path / "fixes"
    mnt = mount(model, "--edits", edits)
    meta = mnt / "metadata"
    scratch = [".general.name.swp", "4913", "general.name~", "sedAbC123", "tmpk2j3x9ab"]
    for name in scratch:
        (meta / name).write_bytes(b"b0VIM 9.0\0\x01\x02" * 100)
        assert (meta / name).read_bytes() == b"b0VIM 9.0\0\x01\x02" * 100
    os.unlink(meta / "4913")
    assert (mnt / "files" / "model.gguf").read_bytes() == model.read_bytes()
    assert not set(scratch) & set(json.loads((mnt / "metadata.json").read_text())["metadata"])
    # a scratch file renamed to a key name is that key
    os.rename(meta / "tmpk2j3x9ab", meta / "x.note")
    assert field_types(mnt / "files" / "model.gguf")["x.note"][1] == [GV.STRING]
    assert run_tensorfs("unmount", mnt).returncode == 0
    again = mount(model, "--edits", edits)
    assert not set(scratch) & set(os.listdir(again / "metadata"))
    assert "x.note" in os.listdir(again / "metadata")


def test_a_key_renamed_over_another_takes_its_type(tmp_path, model, mount):
    mnt = mount(model, "--edits", tmp_path / "fixes")
    meta = mnt / "metadata"
    (meta / "my.id").write_text("7\n")
    os.rename(meta / "my.id", meta / "tokenizer.ggml.eos_token_id")
    assert field_types(mnt / "files" / "model.gguf")["tokenizer.ggml.eos_token_id"] \
        == (7, [GV.UINT32])
    assert not (meta / "my.id").exists()
    (meta / "my.word").write_text("seven\n")
    with pytest.raises(OSError) as caught:
        os.rename(meta / "my.word", meta / "tokenizer.ggml.eos_token_id")
    assert caught.value.errno == 22
    assert (meta / "tokenizer.ggml.eos_token_id").read_text() == "7\n"
    # another spelling of a key's file name would be a second file of one key
    with pytest.raises(OSError) as caught:
        (meta / "general.na%6De").write_text("twin\n")
    assert caught.value.errno == 22
    assert field_types(mnt / "files" / "model.gguf")["general.name"] == ("tiny", [GV.STRING])


def test_cp_and_dd_replace_a_tensors_bytes(tmp_path, model, mount):
    """cp of a file of the tensor's size over its raw file, dd conv=notrunc of a part of it:
    files/ is the file GGUFWriter writes with those bytes."""
    mnt = mount(model, "--edits", tmp_path / "fixes")
    tensors = tool_tensors()
    new = np.linspace(-1, 1, 8, dtype=np.float32)
    (tmp_path / "norm.bin").write_bytes(new.tobytes())
    assert _run(["cp", str(tmp_path / "norm.bin"), str(mnt / "output_norm" / "weight")]) \
        .returncode == 0
    part = np.full(8, 7, np.float32)
    (tmp_path / "part.bin").write_bytes(part.tobytes())
    result = _run(["dd", f"if={tmp_path / 'part.bin'}", f"of={mnt / 'token_embd' / 'weight'}",
                   "conv=notrunc", "bs=32", "seek=2", "status=none"])
    assert result.returncode == 0, result.stderr
    tensors["output_norm.weight"] = new
    tensors["token_embd.weight"] = tensors["token_embd.weight"].copy()
    tensors["token_embd.weight"][2] = part
    reference = write_kv_gguf(tmp_path / "reference.gguf", tool_kvs(), tensors)
    assert (mnt / "files" / "model.gguf").read_bytes() == reference.read_bytes()


# -- names and values the format or its readers refuse -----------------------------------------

def test_names_and_values_readers_refuse_are_refused(tmp_path, model, mount):
    mnt = mount(model, "--edits", tmp_path / "fixes")
    before = (mnt / "files" / "model.gguf").read_bytes()
    refused = [(mnt / "output_norm" / "weight", mnt / "output_norm" / ("x" * 60)),  # 64+ bytes
               (mnt / "output_norm" / "weight", mnt / "%"),                          # empty
               (mnt / "output_norm" / "weight", mnt / "output_norm" / "a%00b")]      # a NUL
    for source, target in refused:
        with pytest.raises(OSError, match="Invalid argument"):
            os.rename(source, target)
    with pytest.raises(OSError) as caught:                                    # a name taken
        os.rename(mnt / "output_norm" / "weight", mnt / "token_embd" / "weight")
    assert caught.value.errno == 17
    for bad in ("2147483648\n", "3\n", "0\n", f"{1 << 17}\n"):
        with pytest.raises(OSError) as caught, \
                open(mnt / "metadata" / "general.alignment", "w") as f:
            f.write(bad)
        assert caught.value.errno == 22, bad
    assert (mnt / "files" / "model.gguf").read_bytes() == before
    os.rename(mnt / "output_norm" / "weight", mnt / "output_norm" / ("x" * 51))   # 63 bytes
    names = [t.name for t in gguf.GGUFReader(str(mnt / "files" / "model.gguf")).tensors]
    assert names == ["token_embd.weight", "output_norm." + "x" * 51]


def test_safetensors_header_names_are_refused(tmp_path, mount):
    model = tmp_path / "model.safetensors"
    save_file({"b.bias": np.zeros(3, np.float32), "w": np.ones(2, np.float32)}, str(model),
              metadata={"format": "pt"})
    mnt = mount(model, "--edits", tmp_path / "fixes")
    before = (mnt / "files" / "model.safetensors").read_bytes()
    with pytest.raises(OSError) as caught:
        os.rename(mnt / "b" / "bias", mnt / "__metadata__")
    assert caught.value.errno == 22
    assert (mnt / "files" / "model.safetensors").read_bytes() == before


def test_safetensors_keys_by_sed_and_a_tools_left_over_temporary(tmp_path, mount):
    """safetensors keys need no dot, so a new ``added`` is a key, but sed's temporary file is
    not: sed -i rewrites ``note``, and a temporary file an interrupted sed left (written,
    closed, never renamed) never reaches the model."""
    model = tmp_path / "model.safetensors"
    save_file({"w": np.ones(2, np.float32)}, str(model), metadata={"format": "pt", "note": "a"})
    mnt = mount(model, "--edits", tmp_path / "fixes")
    meta = mnt / "metadata"
    assert _run(["sed", "-i", "s/a/b/", str(meta / "note")]).returncode == 0
    (meta / "sedAbC123").write_text("left over\n")
    (meta / "tmpk2j3x9ab").write_text("left over\n")
    (meta / "added").write_text("yes\n")
    with safe_open(str(mnt / "files" / "model.safetensors"), "np") as served:
        assert served.metadata() == {"format": "pt", "note": "b", "added": "yes"}
        assert list(served.keys()) == ["w"]


# -- DIR is input --------------------------------------------------------------------------------

def _journal_cases(original: dict, data_name: str) -> list:
    """(what is wrong, the journal's new text or a change to DIR, words the refusal says)."""
    def doc(**changes):
        out = json.loads(json.dumps(original))
        for path, value in changes.items():
            section, key = path.split("/")
            (out if section == "top" else out[section])[key] = value
        return json.dumps(out)
    eos = "tokenizer.ggml.eos_token_id"
    return [
        ("a uint8 of 300", doc(**{f"metadata/{eos}": {"type": "uint8", "value": 300}}),
         "out of range"),
        ("a string for a uint32", doc(**{f"metadata/{eos}": {"type": "uint32", "value": "2"}}),
         "not an integer"),
        ("an unknown type", doc(**{f"metadata/{eos}": {"type": "uint128", "value": 2}}),
         "uint128"),
        ("alignment 3", doc(**{"metadata/general.alignment": {"type": "uint32", "value": 3}}),
         "power of two"),
        ("alignment 2 GiB", doc(**{"metadata/general.alignment":
                                   {"type": "uint32", "value": 2147483648}}), "65536"),
        ("a value not an object", doc(**{f"metadata/{eos}": 5}), eos),
        ("a tensor the model lacks", doc(**{"tensors/nope": {"name": "x", "data": None}}), "nope"),
        ("a 64-byte name", doc(**{"tensors/token_embd.weight": {"name": "y" * 64, "data": None}}),
         "GGML_MAX_NAME"),
        ("a name taken", doc(**{"tensors/token_embd.weight":
                                {"name": "output_norm.weight", "data": None}}), "two tensors"),
        ("a name not a string", doc(**{"tensors/token_embd.weight": {"name": 5, "data": None}}),
         "not a string"),
        ("a data file missing", doc(**{"tensors/token_embd.weight":
                                       {"name": "token_embd.weight",
                                        "data": "data-" + "0" * 32 + ".bin"}}), "cannot be opened"),
        ("a data file cut short", f"truncate:{data_name}", "bytes"),
        ("a key twice", json.dumps(original)[:-1] + ', "format": 1}', "twice"),
        ("not JSON", "{", "cannot be read"),
        ("deeply nested", "[" * 100000, "cannot be read"),
        ("a deleted key the model lacks", doc(**{"metadata/no.such": None}), "no.such"),
        ("a log line not JSON", "log:garbage\n", "line 1"),
        ("a log line of a bad value", 'log:{"metadata":{"%s":{"type":"uint8","value":300}}}\n'
         % eos, "out of range"),
        ("a log the journal does not name", doc(**{"top/log": "../edits.json"}), "not a log"),
    ]


def test_a_bad_journal_is_refused_at_mount_in_one_line(tmp_path, model, mount):
    edits = tmp_path / "fixes"
    mnt = mount(model, "--edits", edits)
    np.save(mnt / "output_norm" / "weight.npy", np.ones(8, np.float32))
    assert run_tensorfs("unmount", mnt).returncode == 0
    root = edits / "tensorfs-edits.v1"
    journal = (root / "edits.json").read_text()
    data_name = next(p.name for p in root.glob("data-*.bin"))
    log = root / json.loads(journal)["log"]
    for what, change, words in _journal_cases(json.loads(journal), data_name):
        if change.startswith("truncate:"):
            os.truncate(root / change.split(":", 1)[1], 5)
        elif change.startswith("log:"):
            log.write_text(change[len("log:"):])
        else:
            (root / "edits.json").write_text(change)
        target = tmp_path / "refused"
        target.mkdir(exist_ok=True)
        result, mounted = mount_expecting_refusal(model, target, "--edits", edits)
        assert (result.returncode, mounted) == (1, False), (what, result.stderr)
        assert result.stderr.count("\n") == 1 and words in result.stderr, (what, result.stderr)
        assert "internal error" not in result.stderr and "Traceback" not in result.stderr
        (root / "edits.json").write_text(journal)
        log.unlink(missing_ok=True)
        if change.startswith("truncate:"):
            with open(root / data_name, "wb") as f:
                f.write(np.ones(8, np.float32).tobytes())
    # a last log line cut short (a daemon killed while writing it) is an edit never made
    log.write_text('{"metadata":{"general.name":{"type":"string","value":"log"}}}\n'
                   '{"metadata":{"general.na')
    again = mount(model, "--edits", edits)
    assert np.array_equal(np.load(again / "output_norm" / "weight.npy"), np.ones(8, np.float32))
    assert (again / "metadata" / "general.name").read_text() == "log\n"
    (again / "metadata" / "general.name").write_text("after\n")
    assert run_tensorfs("unmount", again).returncode == 0
    third = mount(model, "--edits", edits)
    assert (third / "metadata" / "general.name").read_text() == "after\n"


# -- the journal's values, fuzzed: a refusal in one line, never another exception ------------

_VALUES = st.one_of(st.none(), st.booleans(), st.integers(-2**70, 2**70),
                    st.floats(allow_nan=True), st.text(max_size=5),
                    st.lists(st.integers(-300, 300), max_size=3),
                    st.lists(st.text(max_size=3), max_size=3),
                    st.dictionaries(st.text(max_size=3), st.integers(), max_size=2))
_TYPES = st.sampled_from(["uint8", "int8", "uint16", "int32", "uint64", "float32", "float64",
                          "bool", "string", "array[uint8]", "array[string]",
                          "array[array[int8]]", "array", "nope", ""])


@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
@given(entries=st.dictionaries(st.sampled_from(["k.a", "general.alignment", "", "k\0b"]),
                               st.one_of(st.none(), st.tuples(_TYPES, _VALUES)), max_size=3))
def test_journal_values_compose_or_are_refused_in_one_line(tmp_path_factory, entries):
    """Any (type, value) a journal may hold: the composer makes a file GGUFReader reads with
    those values, or refuses with an EditError (the mount's one line), never another
    exception."""
    from tensorfs.editing.compose import EditError, compose
    from tensorfs.editing.store import EditState
    from tensorfs.loading.loader import load_model

    work = tmp_path_factory.mktemp("fuzz")
    path = write_kv_gguf(work / "m.gguf", tool_kvs(), tool_tensors())
    model = load_model(str(path))
    try:
        f = model.files[0]
        source = model.sources[f.path]
        state = EditState({k: v for k, v in entries.items() if v is not None or k == "k.a"}, {})
        try:
            composed = compose(f, source.read(0, f.header_size), source, state, None)
        except EditError as error:
            assert "\n" not in str(error)
            return
        (work / "out.gguf").write_bytes(composed.read(0, composed.size))
        fields = field_types(work / "out.gguf")
        for key, typed in state.metadata.items():
            if typed is not None and typed[0] in ("uint8", "int32", "string", "bool"):
                assert fields[key][0] == typed[1]
    finally:
        model.close()


def test_the_journal_log_folds_and_a_reopened_store_has_every_edit(tmp_path):
    """1,200 edits (keys set, deleted, re-added, tensors renamed): each appended to the log,
    folded into edits.json as the log grows; a store opened again has the same state, the
    keys in the same order, and one log."""
    from tensorfs.editing.store import EditState, EditStore, TensorEdit

    store = EditStore(str(tmp_path / "edits"), [])
    state = EditState()
    rng = np.random.default_rng(0)
    for i in range(1200):
        key = f"k.{rng.integers(300)}"
        action = rng.integers(4)
        if action == 0:
            state = state.without_metadata(key)
        elif action == 1:
            state = state.with_metadata(key, None)
        elif action == 2:
            state = state.with_tensor(f"t{rng.integers(5)}", TensorEdit(f"u{i}"))
        else:
            state = state.with_metadata(key, ("string", "v" * int(rng.integers(40))))
        store.commit(state)
    store.close()
    again = EditStore(str(tmp_path / "edits"), [])
    assert list(again.state.metadata.items()) == list(state.metadata.items())
    assert again.state.tensors == state.tensors
    root = tmp_path / "edits" / "tensorfs-edits.v1"
    assert len(list(root.glob("edits-*.log"))) == 1
    assert (root / "edits.json").stat().st_size > 4096          # folded at least once
    again.close()


def test_a_journal_written_before_the_log_still_opens(tmp_path):
    """A DIR of an earlier tensorfs (edits.json indented, no log named): its edits load, the
    next edit folds the journal into the new form, and it opens again."""
    from tensorfs.editing.store import EditState, EditStore

    store = EditStore(str(tmp_path / "edits"), [])
    store.close()
    root = tmp_path / "edits" / "tensorfs-edits.v1"
    (root / "edits.json").write_text(json.dumps(
        {"format": 1, "source": [], "metadata": {"a.b": {"type": "uint32", "value": 3}},
         "tensors": {"t": {"name": "u", "data": None}}}, indent=1) + "\n")
    store = EditStore(str(tmp_path / "edits"), [])
    assert store.state == EditState({"a.b": ("uint32", 3)}, store.state.tensors)
    assert store.state.tensors["t"].name == "u"
    store.commit(store.state.with_metadata("c.d", ("string", "x")))
    store.close()
    again = EditStore(str(tmp_path / "edits"), [])
    assert list(again.state.metadata) == ["a.b", "c.d"]
    again.close()


def _scratch_sizes(meta, names) -> int:
    return sum((meta / n).stat().st_size for n in names if (meta / n).exists())


def test_scratch_files_hold_their_bound_grown_by_truncate_or_by_writers_at_once(
        tmp_path, model, mount):
    """Files of metadata/ not yet keys hold 64 MiB at most in all (ENOSPC past it), however
    they grow: a truncate that lengthens counts as a write (five files of 16 MiB each were
    made: 80 MiB), and writers of several files at once cannot all pass the check before any
    of them writes."""
    from concurrent.futures import ThreadPoolExecutor

    mnt = mount(model, "--edits", tmp_path / "fixes")
    meta = mnt / "metadata"
    names = [f"grown{i}.tmp" for i in range(5)]
    refused = 0
    for name in names:
        try:            # a refused truncate fails the close too (the write session is refused)
            with open(meta / name, "wb") as f:
                f.truncate(16 << 20)
        except OSError as error:
            assert error.errno == 28, error           # ENOSPC
            refused += 1
    assert refused >= 1 and _scratch_sizes(meta, names) <= 64 << 20
    for name in names:
        os.unlink(meta / name)

    writers = [f"w{i}.tmp" for i in range(8)]

    def write(name):
        piece = b"x" * (1 << 20)
        try:
            with open(meta / name, "wb", buffering=0) as f:
                for _ in range(12):
                    f.write(piece)
        except OSError as error:
            assert error.errno == 28, error

    with ThreadPoolExecutor(len(writers)) as pool:
        list(pool.map(write, writers))
    assert _scratch_sizes(meta, writers) <= 64 << 20
