"""Sharded models (docs/reference/shards-and-metadata.md): a Hugging Face safetensors index
written next to shards saved by safetensors.numpy, and split GGUF written by gguf-py's GGUFWriter(split_max_tensors=…),
mounted for real from each form a user may name, read back and compared with the reference
readers (safe_open per shard, GGUFReader per split file); every broken set refused with one
line by both ``inspect`` and ``mount``."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import gguf
import numpy as np
import pytest
from safetensors import safe_open
from safetensors.numpy import save_file

from tests.support import run_tensorfs
from tests.support.shards import (
    INDEX,
    one,
    refused_by_both,
    safetensors_reference,
    shard_name,
    write_gguf_shard,
    write_hf_shards,
    write_split_gguf,
)


def gguf_reference(files: list[Path]) -> dict[str, tuple[np.ndarray, str, int]]:
    """tensor -> (data, shard file name, absolute offset), read by GGUFReader per split file."""
    out = {}
    for path in files:
        reader = gguf.GGUFReader(path)
        for t in reader.tensors:
            shape = [int(n) for n in reversed(t.shape.tolist())]
            out[t.name] = (np.array(t.data).reshape(shape), path.name, int(t.data_offset))
    return out


def doc_of(mnt: Path) -> dict:
    return json.loads((mnt / "metadata.json").read_bytes())


# -- fixtures ---------------------------------------------------------------------------------

@pytest.fixture
def hf_model(tmp_path):
    index, tensors, weight_map = write_hf_shards(tmp_path / "hf")
    return index


@pytest.fixture
def split_model(tmp_path):
    files, _ = write_split_gguf(tmp_path / "gg")
    return files


# -- serving ----------------------------------------------------------------------------------

@pytest.mark.parametrize("form", ["index", "directory"])
def test_sharded_safetensors_read_back_as_safe_open_sees_them(hf_model, mount, form):
    mnt = mount(hf_model if form == "index" else hf_model.parent)
    reference = safetensors_reference(hf_model)
    doc = doc_of(mnt)
    assert sorted(doc["tensors"]) == sorted(reference)
    for name, (expected, shard) in reference.items():
        entry = doc["tensors"][name]
        assert entry["shard"] == shard
        assert os.getxattr(mnt / entry["path"], "user.tensorfs.shard").decode() == shard
        assert (mnt / entry["path"]).read_bytes() == expected.tobytes()
        loaded = np.load(mnt / (entry["path"] + ".npy"), mmap_mode="r")
        assert loaded.dtype == expected.dtype and loaded.shape == expected.shape
        assert np.array_equal(loaded, expected)
    shard_files = sorted({shard for _, shard in reference.values()})
    assert [s["file"] for s in doc["shards"]] == shard_files
    for entry in doc["shards"]:
        assert entry["size"] == (hf_model.parent / entry["file"]).stat().st_size
        assert entry["format"] == "safetensors"
    assert doc["file"] == (INDEX if form == "index" else "hf")
    assert doc["file_size"] == sum(s["size"] for s in doc["shards"])


def test_sharded_safetensors_headers_and_index_metadata(hf_model, mount):
    mnt = mount(hf_model)
    index = json.loads(hf_model.read_text())
    shards = sorted(set(index["weight_map"].values()))
    assert not (mnt / "header.bin").exists()
    assert sorted(os.listdir(mnt / "headers")) == [s + ".bin" for s in shards]
    for shard in shards:
        data = (hf_model.parent / shard).read_bytes()
        header_size = 8 + int.from_bytes(data[:8], "little")
        assert (mnt / "headers" / (shard + ".bin")).read_bytes() == data[:header_size]
    doc = doc_of(mnt)
    assert doc["metadata"] == index["metadata"]             # total_size stays an integer
    assert doc["metadata_types"] == {"total_size": "integer"}
    assert (mnt / "metadata" / "total_size").read_text() == f"{index['metadata']['total_size']}\n"


def test_index_metadata_of_every_json_type(tmp_path, mount):
    metadata = {"total_size": 10, "ratio": 0.1, "ok": True, "none": None, "name": "x",
                "list": ["a\nb", 1, 2.5, None], "empty": [], "obj": {"k": [1, 2]}}
    index, _, _ = write_hf_shards(tmp_path / "hf", 2, metadata=metadata)
    mnt = mount(index)
    doc = doc_of(mnt)
    assert doc["metadata"] == metadata
    assert doc["metadata_types"] == {"total_size": "integer", "ratio": "number", "ok": "boolean",
                                     "none": "null", "name": "string", "list": "array",
                                     "empty": "array", "obj": "object"}
    meta = mnt / "metadata"
    assert (meta / "ratio").read_text() == "0.1\n"
    assert (meta / "ok").read_text() == "true\n"
    assert (meta / "none").read_text() == "null\n"
    assert (meta / "name").read_text() == "x\n"
    assert (meta / "list").read_text() == "a\\nb\n1\n2.5\nnull\n"
    assert (meta / "empty").read_bytes() == b""
    assert json.loads((meta / "obj").read_text()) == {"k": [1, 2]}


@pytest.mark.parametrize("form", ["first_shard", "directory"])
def test_split_gguf_reads_back_as_gguf_reader_sees_it(split_model, mount, form):
    first = split_model[0]
    mnt = mount(first if form == "first_shard" else first.parent)
    reference = gguf_reference(split_model)
    doc = doc_of(mnt)
    assert sorted(doc["tensors"]) == sorted(reference)
    for name, (expected, shard, offset) in reference.items():
        entry = doc["tensors"][name]
        assert entry["shard"] == shard and entry["offset"] == offset
        assert (mnt / entry["path"]).read_bytes() == expected.tobytes()
        loaded = np.load(mnt / (entry["path"] + ".npy"))
        assert loaded.dtype == expected.dtype and np.array_equal(loaded, expected)
    assert [s["file"] for s in doc["shards"]] == [p.name for p in split_model]
    assert sorted(os.listdir(mnt / "headers")) == [p.name + ".bin" for p in split_model]
    for path in split_model:
        reader = gguf.GGUFReader(path)
        assert (mnt / "headers" / (path.name + ".bin")).read_bytes() == \
            path.read_bytes()[:reader.data_offset]


def test_split_gguf_metadata_is_the_first_shards_kv(split_model, mount):
    mnt = mount(split_model[0])
    reader = gguf.GGUFReader(split_model[0])
    fields = {k: f for k, f in reader.fields.items() if not k.startswith("GGUF.")}
    doc = doc_of(mnt)
    assert list(doc["metadata"]) == list(fields)
    assert doc["metadata"]["split.no"] == 0
    assert doc["metadata"]["split.count"] == len(split_model)
    assert doc["metadata"]["split.tensors.count"] == len(doc["tensors"])
    assert doc["metadata_types"]["split.count"] == "uint16"
    assert sorted(os.listdir(mnt / "metadata")) == sorted(fields)
    assert (mnt / "metadata" / "split.count").read_text() == f"{len(split_model)}\n"


def test_a_non_split_gguf_and_a_single_shard_given_directly_are_single_files(tmp_path, mount):
    index, _, _ = write_hf_shards(tmp_path / "hf")
    shard = tmp_path / "hf" / shard_name(2, 3)
    plain = write_gguf_shard(tmp_path / "plain.gguf", one("x"))
    for model in (shard, plain):
        mnt = mount(model)
        doc = doc_of(mnt)
        assert "shards" not in doc and "headers" not in os.listdir(mnt)
        assert (mnt / "header.bin").exists()
        assert doc["file"] == model.name


def test_a_directory_with_one_model_file_mounts_that_file(tmp_path, mount):
    (tmp_path / "d").mkdir()
    save_file(one("w"), str(tmp_path / "d" / "model.safetensors"))
    (tmp_path / "d" / "config.json").write_text("{}")
    (tmp_path / "d" / ".hidden.gguf").write_bytes(b"junk")
    mnt = mount(tmp_path / "d")
    doc = doc_of(mnt)
    assert "shards" not in doc and (mnt / "header.bin").exists()
    assert doc["file"] == "model.safetensors"


def test_a_shard_tensor_the_index_does_not_list_is_served(tmp_path, mount):
    index, tensors, weight_map = write_hf_shards(tmp_path / "hf", 2)
    doc = json.loads(index.read_text())
    dropped = "lm_head.weight"
    del doc["weight_map"][dropped]
    index.write_text(json.dumps(doc))
    mnt = mount(index)
    entry = doc_of(mnt)["tensors"][dropped]
    assert entry["shard"] == weight_map[dropped]
    assert (mnt / entry["path"]).read_bytes() == tensors[dropped].tobytes()


def test_symlinked_shards_are_followed(tmp_path, mount):
    """A Hugging Face cache snapshot: every file a symlink into ../../blobs."""
    repo = tmp_path / "models--org--name"
    index, tensors, _ = write_hf_shards(repo / "blobs")
    snap = repo / "snapshots" / "rev"
    snap.mkdir(parents=True)
    for path in (repo / "blobs").iterdir():
        (snap / path.name).symlink_to(os.path.relpath(path, snap))
    mnt = mount(snap)
    doc = doc_of(mnt)
    for name, array in tensors.items():
        assert (mnt / doc["tensors"][name]["path"]).read_bytes() == array.tobytes()


@pytest.mark.parametrize("form", ["index", "split"])
def test_inspect_accepts_every_form_and_says_what_the_mount_holds(tmp_path, mount, form):
    if form == "index":
        model, _, _ = write_hf_shards(tmp_path / "m")
    else:
        model = write_split_gguf(tmp_path / "m")[0][0]
    for named in (model, model.parent):
        result = run_tensorfs("inspect", named, "--json")
        assert result.returncode == 0, result.stderr
        assert json.loads(result.stdout) == doc_of(mount(named))
        text = run_tensorfs("inspect", named)
        assert text.returncode == 0 and "3 shards" in text.stdout


# -- refusals ---------------------------------------------------------------------------------

def _edit_index(index: Path, edit) -> Path:
    doc = json.loads(index.read_text())
    edit(doc)
    index.write_text(json.dumps(doc))
    return index


def _missing_safetensors_shard(tmp):
    index, _, _ = write_hf_shards(tmp / "hf")
    (tmp / "hf" / shard_name(2, 3)).unlink()
    return index, ["model-00002-of-00003.safetensors", "missing"]


def _missing_gguf_split(tmp):
    files, _ = write_split_gguf(tmp / "gg")
    files[2].unlink()
    return files[0], [files[2].name, "missing"]


def _missing_first_split_in_directory(tmp):
    files, _ = write_split_gguf(tmp / "gg")
    files[0].unlink()
    return tmp / "gg", [files[0].name, "missing"]


def _split_count_differs(tmp):
    files, _ = write_split_gguf(tmp / "gg")
    write_gguf_shard(files[1], one("blk.x.weight"), no=1, count=4, total=7)
    return files[0], [files[1].name, "split.count 4"]


def _split_no_out_of_order(tmp):
    files, _ = write_split_gguf(tmp / "gg")
    files[1].rename(tmp / "tmp.gguf")
    files[2].rename(files[1])
    (tmp / "tmp.gguf").rename(files[2])
    return files[0], ["split.no 2, expected 1"]


def _split_no_duplicated(tmp):
    files, _ = write_split_gguf(tmp / "gg")
    shutil.copyfile(files[1], files[2])
    return files[0], [files[2].name, "split.no 1, expected 2"]


def _split_tensors_count_wrong(tmp):
    d = tmp / "gg"
    d.mkdir()
    write_gguf_shard(d / "m-00001-of-00002.gguf", one("a"), no=0, count=2, total=3)
    write_gguf_shard(d / "m-00002-of-00002.gguf", one("b"), no=1, count=2, total=3)
    return d / "m-00001-of-00002.gguf", ["split.tensors.count is 3", "2 tensors"]


def _gguf_tensor_in_two_shards(tmp):
    d = tmp / "gg"
    d.mkdir()
    write_gguf_shard(d / "m-00001-of-00002.gguf", one("a"), no=0, count=2, total=2)
    write_gguf_shard(d / "m-00002-of-00002.gguf", one("a", 2.0), no=1, count=2, total=2)
    return d / "m-00001-of-00002.gguf", ["'a'", "two shards"]


def _non_first_split_given(tmp):
    files, _ = write_split_gguf(tmp / "gg")
    return files[1], ["shard 2 of 3", files[0].name]


def _split_first_misnamed(tmp):
    files, _ = write_split_gguf(tmp / "gg")
    renamed = tmp / "gg" / "renamed.gguf"
    files[0].rename(renamed)
    return renamed, ["PREFIX-00001-of-00003.gguf"]


def _safetensors_tensor_in_two_shards(tmp):
    index, tensors, weight_map = write_hf_shards(tmp / "hf", 2)
    shard = tmp / "hf" / shard_name(2, 2)
    with safe_open(str(shard), "numpy") as f:
        content = {n: f.get_tensor(n) for n in f.keys()}
    content["lm_head.weight"] = tensors["lm_head.weight"]
    if weight_map["lm_head.weight"] == shard.name:
        content["model.embed_tokens.weight"] = tensors["model.embed_tokens.weight"]
    save_file(content, str(shard))
    return index, ["two shards"]


def _index_names_a_tensor_its_shard_lacks(tmp):
    index, _, _ = write_hf_shards(tmp / "hf")
    return _edit_index(index, lambda d: d["weight_map"].update({"ghost.weight": shard_name(1, 3)})), \
        ["'ghost.weight'", "does not hold it"]


def _index_puts_a_tensor_in_the_wrong_shard(tmp):
    index, _, weight_map = write_hf_shards(tmp / "hf")
    wrong = shard_name(1, 3) if weight_map["lm_head.weight"] != shard_name(1, 3) else shard_name(2, 3)
    return _edit_index(index, lambda d: d["weight_map"].update({"lm_head.weight": wrong})), \
        ["'lm_head.weight'", f"it is in '{weight_map['lm_head.weight']}'"]


def _index_malformed(tmp):
    index, _, _ = write_hf_shards(tmp / "hf")
    text = index.read_bytes()
    index.write_bytes(text[:len(text) // 2])
    return index, ["not valid JSON", "byte offset"]


def _index_duplicate_key(tmp):
    index, _, _ = write_hf_shards(tmp / "hf")
    index.write_text('{"weight_map": {"a": "%s", "a": "%s"}}' % (shard_name(1, 3), shard_name(2, 3)))
    return index, ["'a' twice"]


def _index_huge_integer(tmp):
    """An integer of more digits than Python converts to int (4,300): one line, not an
    internal error."""
    index, _, _ = write_hf_shards(tmp / "hf")
    text = index.read_text()
    index.write_text(text.replace('"metadata": {', '"metadata": {"n": ' + "9" * 5000 + ", ", 1))
    return index, ["index is not JSON tensorfs reads", "4300 digits"]


def _index_weight_map_not_an_object(tmp):
    index, _, _ = write_hf_shards(tmp / "hf")
    return _edit_index(index, lambda d: d.update(weight_map=["x"])), ["weight_map", "array"]


def _index_empty(tmp):
    index, _, _ = write_hf_shards(tmp / "hf")
    return _edit_index(index, lambda d: d.update(weight_map={})), ["names no tensor"]


def _index_points_outside(tmp):
    index, _, _ = write_hf_shards(tmp / "hf")
    save_file(one("outside"), str(tmp / "outside.safetensors"))      # exists, valid: still refused
    return _edit_index(index, lambda d: d["weight_map"].update({"outside": "../outside.safetensors"})), \
        ["'../outside.safetensors'", "plain file name"]


def _index_points_at_an_absolute_path(tmp):
    index, _, _ = write_hf_shards(tmp / "hf")
    target = str(tmp / "hf" / shard_name(1, 3))
    return _edit_index(index, lambda d: d["weight_map"].update({"abs": target})), \
        ["plain file name"]


def _index_points_at_a_gguf(tmp):
    index, _, _ = write_hf_shards(tmp / "hf")
    write_gguf_shard(tmp / "hf" / "extra.gguf", one("g"))
    return _edit_index(index, lambda d: d["weight_map"].update({"g": "extra.gguf"})), \
        ["'extra.gguf'", "not safetensors"]


def _broken_shard(tmp):
    index, _, _ = write_hf_shards(tmp / "hf")
    shard = tmp / "hf" / shard_name(3, 3)
    shard.write_bytes(shard.read_bytes()[:-1])
    return index, [str(shard)]


def _empty_directory(tmp):
    (tmp / "empty").mkdir()
    (tmp / "empty" / "README.md").write_text("nothing here")
    return tmp / "empty", ["no *.safetensors.index.json"]


def _directory_with_two_models(tmp):
    index, _, _ = write_hf_shards(tmp / "hf")
    save_file(one("c"), str(tmp / "hf" / "consolidated.safetensors"))
    return tmp / "hf", ["2 models", "consolidated.safetensors", INDEX]


REFUSALS = [   # (builder, the ShardError kind, or None for a shard the parser refuses)
    (_missing_safetensors_shard, "missing_shard"), (_missing_gguf_split, "missing_shard"),
    (_missing_first_split_in_directory, "missing_shard"), (_split_count_differs, "split_count"),
    (_split_no_out_of_order, "split_no"), (_split_no_duplicated, "split_no"),
    (_split_tensors_count_wrong, "tensor_count"), (_gguf_tensor_in_two_shards, "duplicate_tensor"),
    (_non_first_split_given, "not_first"), (_split_first_misnamed, "split_name"),
    (_safetensors_tensor_in_two_shards, "duplicate_tensor"),
    (_index_names_a_tensor_its_shard_lacks, "index_tensor"),
    (_index_puts_a_tensor_in_the_wrong_shard, "index_tensor"), (_index_malformed, "index_json"),
    (_index_duplicate_key, "index_json"), (_index_weight_map_not_an_object, "index_json"),
    (_index_huge_integer, "index_json"),
    (_index_empty, "empty_index"), (_index_points_outside, "shard_path"),
    (_index_points_at_an_absolute_path, "shard_path"), (_index_points_at_a_gguf, "shard_format"),
    (_broken_shard, None), (_empty_directory, "no_model"),
    (_directory_with_two_models, "several_models"),
]


@pytest.mark.parametrize("build,kind", REFUSALS, ids=[f.__name__.strip("_") for f, _ in REFUSALS])
def test_broken_shard_sets_are_refused_with_one_line(tmp_path, build, kind):
    from tensorfs.errors import ModelError, ShardError
    from tensorfs.loading import shards
    from tensorfs.loading.loader import load_model

    model, expect = build(tmp_path)
    names_model = model.is_file() and kind is not None      # a broken shard: its own name
    refused_by_both(tmp_path, model, str(model) if names_model else "", *expect)
    with pytest.raises(ModelError) as caught:
        load_model(str(model))
    if kind is None:
        assert not isinstance(caught.value, ShardError)
    else:
        assert isinstance(caught.value, ShardError) and caught.value.kind == kind
        assert kind in shards.KINDS


# -- the index's fast paths (no FUSE) -------------------------------------------------------

@pytest.mark.parametrize("text", [
    '{"weight_map": {"a": "s", "b": "t"}, "metadata": {"n": {"x": [1, {"y": 2}]}}}',
    '{"weight_map": {"a": "s"}, "metadata": {"url": "http://h:1"}}',   # a colon in a string
    '{"weight_map": {"a:b": "s", "c": "s"}}',
    '{"weight_map": {"a": "s"}, "metadata": {"d": ' + "[" * 150 + "]" * 150 + "}}",
])
def test_an_index_without_duplicates_reads_as_json_loads_does(tmp_path, text):
    from tensorfs.loading import shards

    path = tmp_path / INDEX
    path.write_text(text)
    doc = json.loads(text)
    assert shards._read_index(str(path)) == (doc.get("metadata") or {}, doc["weight_map"])
    decided = shards._decoded_if_unique(text)
    if ":" not in text.replace('": ', "") and "[[[" not in text:    # no colon in a string
        assert decided == doc                    # told by the count, without the hook
    else:
        assert decided is shards._UNDECIDED      # left to the hook-based decoder


@pytest.mark.parametrize("text,key", [
    ('{"weight_map": {"a": "s", "a": "t"}}', "a"),
    ('{"weight_map": {"a": "s:", "a": "t"}}', "a"),        # a colon in a string too
    ('{"metadata": {"m": {"k": 1, "k": 2}}, "weight_map": {}}', "k"),
    ('{"weight_map": {}, "weight_map": {}}', "weight_map"),
])
def test_an_index_with_a_duplicate_key_isrefused_by_both(tmp_path, text, key):
    from tensorfs.errors import ShardError
    from tensorfs.loading import shards

    assert shards._decoded_if_unique(text) is shards._UNDECIDED
    path = tmp_path / INDEX
    path.write_text(text)
    with pytest.raises(ShardError) as caught:
        shards._read_index(str(path))
    assert caught.value.kind == "index_json" and caught.value.name == key


def test_the_shards_match_their_index_only_when_each_tensor_is_where_it_says(tmp_path):
    from tensorfs.loading import shards
    from tensorfs.sources.modelfile import parse_model_file

    index, _, weight_map = write_hf_shards(tmp_path / "hf")
    names = sorted(set(weight_map.values()))
    files = [parse_model_file(str(tmp_path / "hf" / n)) for n in names]
    assert shards._shards_match_index(weight_map, names, files)
    moved = dict(weight_map, **{"lm_head.weight": next(n for n in names
                                                       if n != weight_map["lm_head.weight"])})
    assert not shards._shards_match_index(moved, names, files)
    fewer = {k: v for k, v in weight_map.items() if k != "lm_head.weight"}
    assert not shards._shards_match_index(fewer, names, files)     # a shard holds more
    assert len(shards.load(str(_edit_index(index, lambda d: d.update(weight_map=fewer))))
               .tensors) == len(weight_map)
