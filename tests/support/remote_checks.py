"""What the remote tests hold a mount to: the reference readers on the same bytes, and the
local mount of the same files (docs/reference/remote.md: the tree, metadata.json, views and errors are those
of the local file with the same bytes)."""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import gguf
import numpy as np
from safetensors import safe_open

MiB = 1 << 20
HF_TOKEN = "hf_tensorfsTESTtoken0123456789"          # the gated repo's token: must leak nowhere
# the keys a remote mount adds to metadata.json
REMOTE_KEYS = ("source",)
SHARD_REMOTE_KEYS = ("version",)


@dataclass
class Model:
    """One model as a user names it, and the local files holding the same bytes."""
    files: list[Path]                 # every file of the model (shards in order; index first)
    entry: str                        # the file a user names (relative to the model's folder)
    expected: dict = field(default_factory=dict)   # name -> Expected (quantized GGUF)

    @property
    def folder(self) -> Path:
        return self.files[0].parent

    @property
    def local(self) -> Path:
        return self.folder / self.entry


@dataclass
class Corpus:
    root: Path
    models: dict[str, Model]


def doc_of(mnt: Path) -> dict:
    return json.loads((mnt / "metadata.json").read_bytes())


def without_remote_keys(doc: dict) -> dict:
    """The document as the local file's would be: no source, no source_version, no per-shard
    version, and "file" left out (the local name is a path's basename, the remote one a URL's)."""
    out = {k: v for k, v in doc.items() if k not in REMOTE_KEYS and k != "file"}
    if "shards" in out:
        out["shards"] = [{k: v for k, v in s.items() if k not in SHARD_REMOTE_KEYS}
                         for s in out["shards"]]
    out.pop("source_version", None)
    return out


def header_size(path: Path) -> int:
    """Bytes before the data section: what a mount may fetch (plus 1 MiB)."""
    data = path.read_bytes()
    if data[:4] == b"GGUF":
        return gguf.GGUFReader(path).data_offset
    if path.suffix == ".json":
        return len(data)
    return 8 + int.from_bytes(data[:8], "little")


def reference(files: list[Path], expected: dict | None = None) -> dict[str, tuple[bytes, np.ndarray]]:
    """tensor -> (raw bytes, values numpy.load of its .npy must give), from safe_open or
    GGUFReader on each model file (gguf.quants.dequantize's values for quantized tensors,
    via ``expected`` from reliability_models.write_mixed_gguf)."""
    out = {}
    for path in files:
        if path.suffix == ".json":
            continue
        if path.suffix == ".safetensors":
            with safe_open(str(path), "numpy") as f:
                for name in f.keys():
                    array = f.get_tensor(name)
                    out[name] = (array.tobytes(), array)
            continue
        reader = gguf.GGUFReader(path)
        for t in reader.tensors:
            raw = np.array(t.data).tobytes()
            if expected and t.name in expected:
                out[t.name] = (raw, expected[t.name].values)
            else:
                shape = [int(n) for n in reversed(t.shape.tolist())]
                out[t.name] = (raw, np.array(t.data).reshape(shape))
    if expected:
        for name, e in expected.items():
            assert out[name][0] == e.raw, name
    return out


def assert_matches_reference(mnt: Path, files: list[Path], expected: dict | None = None) -> None:
    """Every raw file and .npy of the mount equals the reference reader's."""
    doc = doc_of(mnt)
    ref = reference(files, expected)
    assert sorted(doc["tensors"]) == sorted(ref)
    for name, (raw, values) in ref.items():
        entry = doc["tensors"][name]
        assert (mnt / entry["path"]).read_bytes() == raw, name
        if entry.get("raw_only"):
            continue
        loaded = np.load(mnt / (entry["path"] + ".npy"))
        assert loaded.shape == tuple(np.shape(values)), name
        assert loaded.dtype == values.dtype or entry["converted"], name
        assert np.array_equal(loaded, values, equal_nan=loaded.dtype.kind == "f"), name


def walk(mnt: Path) -> dict[str, Path]:
    out = {}
    for root, _, files in os.walk(mnt):
        for f in files:
            p = Path(root) / f
            out[str(p.relative_to(mnt))] = p
    return out


def assert_same_tree(remote: Path, local: Path) -> None:
    """Every file of the remote mount holds what the local mount's does (metadata.json: the
    same document but for the remote keys)."""
    r, loc = walk(remote), walk(local)
    assert sorted(r) == sorted(loc)
    for rel in sorted(r):
        if rel == "metadata.json":
            rdoc, ldoc = without_remote_keys(doc_of(remote)), without_remote_keys(doc_of(local))
            assert {k: v for k, v in rdoc.items() if ldoc.get(k) != v} == {}
            assert rdoc == ldoc
            continue
        assert r[rel].read_bytes() == loc[rel].read_bytes(), rel
    # and once with a Unix tool, on the largest file
    big = max((rel for rel in r if rel != "metadata.json"), key=lambda rel: r[rel].stat().st_size)
    assert subprocess.run(["cmp", str(r[big]), str(loc[big])]).returncode == 0


def fetched(log: list[dict], path_part: str) -> int:
    """Body bytes nginx sent for requests whose URI contains ``path_part``."""
    return sum(r["bytes"] for r in log if path_part in r["uri"] and r["method"] == "GET")


def assert_mount_fetched_headers_only(log: list[dict], files: list[Path], prefix: str) -> None:
    """Per file: at most its header + 1 MiB was sent while mounting (docs/reference/remote.md)."""
    for path in files:
        sent = fetched(log, f"{prefix}{path.name}")
        assert sent <= header_size(path) + MiB, (path.name, sent, header_size(path))


def url_of(transport: str, nginx, key: str, name: str) -> str:
    """The URL of a corpus file ``name`` under ``key`` through ``transport``."""
    if transport == "http":
        return f"{nginx.url}/files/{key}/{name}"
    if transport == "hf":
        return f"hf://tfs/{key}/{name}"
    return f"s3://models/{key}/{name}"
