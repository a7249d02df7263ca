"""A Hugging Face model directory's files/ serves the GGUF files llama.cpp's converter writes,
byte for byte (issue 44).  The oracle is the converter itself (convert_hf_to_gguf.py as
vendored in llama-cpp-python 0.3.36, in its own virtualenv: ``make convert-oracle``, named by
TENSORFS_CONVERT_ORACLE); each architecture's tiny random-weight model is converted once per
module, to the source's own type and to q8_0, and the mounted files are compared with ``cmp``
(on a difference: the first differing key or tensor, read by GGUFReader)."""

from __future__ import annotations

import contextlib
import filecmp
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.hfgguf.compare import first_difference
from tests.hfgguf.tiny import write_bert, write_gemma3, write_llama, write_qwen
from tests.support import mounts_in, run_tensorfs

ORACLE_ENV = "TENSORFS_CONVERT_ORACLE"

# each test runs llama.cpp's converter (seconds) or shares a model it converted
pytestmark = pytest.mark.slow


def oracle() -> Path:
    named = os.environ.get(ORACLE_ENV)
    if not named:
        pytest.skip(f"{ORACLE_ENV} is not set: `make convert-oracle` builds llama.cpp's "
                    "converter (the oracle) and `make test` names it")
    root = Path(named)
    assert (root / "bin" / "convert").exists(), f"{ORACLE_ENV}={named}: no bin/convert there"
    return root


def tokenizer(directory: Path, kind: str) -> None:
    """A real tokenizer of ``kind`` in ``directory`` (tests/support/hf_tokenizers.py)."""
    from tests.support.hf_tokenizers import write_tokenizer
    write_tokenizer(directory, kind)


def vocab_size(directory: Path) -> int:
    """The tokenizer's size: tokenizer.json's vocabulary and added tokens (or vocab.txt's
    lines), what config.json's vocab_size must cover."""
    if (directory / "tokenizer.model").exists() and not (directory / "tokenizer.json").exists():
        return 96
    path = directory / "tokenizer.json"
    if path.exists():
        doc = json.loads(path.read_text())
        ids = list(doc["model"]["vocab"].values()) if isinstance(doc["model"]["vocab"], dict) \
            else list(range(len(doc["model"]["vocab"])))
        ids += [t["id"] for t in doc.get("added_tokens", [])]
        return max(ids) + 1
    return len((directory / "vocab.txt").read_text().splitlines())


def convert(src: Path, outtype: str, out: Path) -> Path:
    """The oracle's file for ``src`` in ``outtype``, under its default name in ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    before = set(out.iterdir())
    result = subprocess.run([str(oracle() / "bin" / "convert"), str(src), "--outtype", outtype,
                             "--outfile", str(out)], capture_output=True, text=True,
                            timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    made = sorted(set(out.iterdir()) - before)
    assert len(made) == 1, made
    return made[0]


WRITERS = {
    "llama": (lambda d, n: write_llama(d, n), "llama-spm", "SmolTest-135M-Instruct"),
    "smollm2": (lambda d, n: write_llama(d, n, tie_word_embeddings=True, rope_theta=100000.0),
                "smollm2", "SmolLM2-135M-Instruct"),
    "llama3": (lambda d, n: write_llama(
        d, n, hidden_size=32, intermediate_size=64, tie_word_embeddings=True,
        rope_theta=500000.0, bos_token_id=128000, eos_token_id=128009,
        rope_scaling={"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                      "original_max_position_embeddings": 8192, "rope_type": "llama3"}),
        "llama-bpe", "Llama-3.2-Tiny-Instruct"),
    "qwen2": (lambda d, n: write_qwen(d, n, hidden_size=32, intermediate_size=64,
                                      tie_word_embeddings=True), "qwen2", "Qwen2.5-Tiny-Instruct"),
    "qwen3": (lambda d, n: write_qwen(d, n, qwen3=True, hidden_size=32, intermediate_size=64,
                                      tie_word_embeddings=True), "qwen2", "Qwen3-Tiny"),
    "gemma3": (lambda d, n: write_gemma3(d, n), "gemma3", "gemma-3-tiny-it"),
    "bert": (lambda d, n: write_bert(d, n), "bert", "all-MiniLM-tiny-v2"),
}


class Converted:
    """One architecture's tiny model, its directory and the oracle's two files."""

    def __init__(self, root: Path, arch: str):
        write, kind, name = WRITERS[arch]
        self.dir = root / name
        self.dir.mkdir(parents=True)
        tokenizer(self.dir, kind)
        write(self.dir, vocab_size(self.dir))
        if arch == "bert":                     # sentence-transformers' pooling
            (self.dir / "modules.json").write_text(json.dumps([
                {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
                {"idx": 1, "name": "1", "path": "1_Pooling",
                 "type": "sentence_transformers.models.Pooling"}]))
            (self.dir / "1_Pooling").mkdir(exist_ok=True)
            (self.dir / "1_Pooling" / "config.json").write_text(json.dumps(
                {"word_embedding_dimension": 64, "pooling_mode_mean_tokens": True}))
        own = {"BF16": "bf16", "F16": "f16", "F32": "f32"}[
            "F32" if arch == "bert" else "BF16"]
        self.expected = [convert(self.dir, own, root / "out"),
                         convert(self.dir, "q8_0", root / "out")]


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    made: dict[str, Converted] = {}

    def get(arch: str) -> Converted:
        if arch not in made:
            made[arch] = Converted(tmp_path_factory.mktemp(arch), arch)
        return made[arch]
    return get


@pytest.fixture(scope="module")
def module_mount(tmp_path_factory):
    yield from mounts_in(tmp_path_factory.mktemp("mnt"))


def _same(expected: Path, served: Path) -> None:
    assert served.stat().st_size == expected.stat().st_size, first_difference(expected, served)
    if not filecmp.cmp(expected, served, shallow=False):
        pytest.fail(f"{served.name}: {first_difference(expected, served)}")


@pytest.mark.parametrize("arch", ["llama", "smollm2", "llama3", "qwen2", "qwen3", "gemma3", "bert"])
def test_files_serve_the_converters_gguf(arch, converted, module_mount):
    """ls shows both files with their size before any read; each is cmp-equal to the
    converter's."""
    oracle()
    model = converted(arch)
    mnt = module_mount(model.dir)
    listed = sorted(os.listdir(mnt / "files"))
    for expected in model.expected:
        assert expected.name in listed, (expected.name, listed)
        assert (mnt / "files" / expected.name).stat().st_size == expected.stat().st_size
    for expected in model.expected:
        _same(expected, mnt / "files" / expected.name)
    # a whole-file comparison with the command line's cmp too
    result = subprocess.run(["cmp", str(model.expected[0]), str(mnt / "files" / model.expected[0].name)],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_inspect_and_list_say_which_gguf_files_are_offered(converted, module_mount):
    oracle()
    model = converted("llama")
    result = run_tensorfs("inspect", model.dir)
    assert result.returncode == 0, result.stderr
    for expected in model.expected:
        assert expected.name in result.stdout
    mnt = module_mount(model.dir, name="listed")
    result = run_tensorfs("list", "--json")
    row = next(r for r in json.loads(result.stdout) if r["mountpoint"] == str(mnt))
    assert row["gguf"] == [f"files/{e.name}" for e in sorted(model.expected)]
    text = run_tensorfs("list").stdout.splitlines()
    at = next(i for i, line in enumerate(text) if line.startswith(str(mnt) + " "))
    assert text[at + 1].startswith("  offers files/") and model.expected[0].name in text[at + 1]


BAD = {
    "architecture": (lambda c: c.update(architectures=["FalconForCausalLM"]), "architecture FalconForCausalLM"),
    "quantized": (lambda c: c.update(quantization_config={"quant_method": "gptq"}), "quantization_config"),
    "moe": (lambda c: c.update(num_local_experts=8), "experts"),
    "heads": (lambda c: c.update(num_attention_heads=5), "head"),
}


@pytest.mark.parametrize("bad", sorted(BAD))
def test_a_directory_the_converter_refuses_still_serves_its_tensors(bad, converted, tmp_path, mount):
    """config.json lies, or names what is not offered: the mount serves as without the
    feature, and inspect says why in one line."""
    model = converted("llama")
    d = tmp_path / "model"
    shutil.copytree(model.dir, d)
    config = json.loads((d / "config.json").read_text())
    change, said = BAD[bad]
    change(config)
    (d / "config.json").write_text(json.dumps(config))
    result = run_tensorfs("inspect", d)
    assert result.returncode == 0, result.stderr
    lines = [line for line in result.stdout.splitlines() if "GGUF" in line]
    assert len(lines) == 1 and said in lines[0], result.stdout
    mnt = mount(d)
    names = os.listdir(mnt / "files")
    assert not [n for n in names if n.endswith(".gguf")], names
    row = next(r for r in json.loads(run_tensorfs("list", "--json").stdout)
               if r["mountpoint"] == str(mnt))      # list and the log say why too
    assert row["gguf"] == [] and said in row["gguf_note"], row
    text = run_tensorfs("list").stdout.splitlines()
    at = next(i for i, line in enumerate(text) if line.startswith(str(mnt) + " "))
    assert text[at + 1].startswith("  offers no GGUF: ") and said in text[at + 1], text
    logged = [line for line in Path(row["log"]).read_text().splitlines() if "GGUF: " in line]
    assert len(logged) == 1 and said in logged[0], logged
    assert (mnt / "files" / "model.safetensors").read_bytes() == (d / "model.safetensors").read_bytes()


def test_a_missing_tokenizer_still_serves_the_tensors(converted, tmp_path, mount):
    model = converted("llama")
    d = tmp_path / "model"
    shutil.copytree(model.dir, d)
    for name in ("tokenizer.model", "tokenizer.json"):
        (d / name).unlink(missing_ok=True)
    result = run_tensorfs("inspect", d)
    assert result.returncode == 0, result.stderr
    assert len([line for line in result.stdout.splitlines() if "GGUF" in line]) == 1
    mnt = mount(d)
    assert not [n for n in os.listdir(mnt / "files") if n.endswith(".gguf")]


def _sharded(src: Path, d: Path) -> None:
    """``src``'s model in two shards with an index, as save_pretrained writes them."""
    from safetensors import safe_open

    from tests.hfgguf.tiny import write_safetensors
    d.mkdir()
    for p in src.iterdir():
        if p.is_file() and p.name != "model.safetensors":
            shutil.copy(p, d / p.name)
    with safe_open(str(src / "model.safetensors"), "numpy") as f:
        names = list(f.keys())
    raw = (src / "model.safetensors").read_bytes()
    header = json.loads(raw[8:8 + int.from_bytes(raw[:8], "little")])
    base = 8 + int.from_bytes(raw[:8], "little")
    tensors = {n: (header[n]["dtype"], tuple(header[n]["shape"]),
                   raw[base + header[n]["data_offsets"][0]:base + header[n]["data_offsets"][1]])
               for n in names}
    half = len(names) // 2
    weight_map = {}
    for i, part in enumerate((names[:half], names[half:])):
        shard = f"model-0000{i + 1}-of-00002.safetensors"
        write_safetensors(d / shard, {n: tensors[n] for n in part})
        weight_map.update({n: shard for n in part})
    (d / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {"total_size": sum(len(t[2]) for t in tensors.values())},
         "weight_map": weight_map}))


def _checkpoint(src: Path, d: Path) -> None:
    """``src``'s model as a PyTorch checkpoint (pytorch_model.bin), its keys in another
    order, written by the oracle's torch."""
    d.mkdir()
    for p in src.iterdir():
        if p.is_file() and p.name != "model.safetensors":
            shutil.copy(p, d / p.name)
    script = ("import sys, torch\nfrom safetensors.torch import load_file\n"
              "sd = load_file(sys.argv[1])\n"
              "torch.save({k: sd[k] for k in sorted(sd, reverse=True)}, sys.argv[2])\n")
    subprocess.run([str(oracle() / "venv" / "bin" / "python"), "-c", script,
                    str(src / "model.safetensors"), str(d / "pytorch_model.bin")], check=True)


@pytest.mark.parametrize("form", ["sharded", "checkpoint"])
def test_sharded_and_checkpoint_directories(form, converted, tmp_path, mount):
    """Shards with an index, and a PyTorch checkpoint (served through its composed
    safetensors' tensors): the GGUF is still the converter's, byte for byte."""
    model = converted("llama")
    d = tmp_path / model.dir.name
    (_sharded if form == "sharded" else _checkpoint)(model.dir, d)
    expected = [convert(d, "bf16", tmp_path / "out"), convert(d, "q8_0", tmp_path / "out")]
    mnt = mount(d)
    for e in expected:
        _same(e, mnt / "files" / e.name)


@pytest.mark.clients
def test_llama_cpp_generates_the_same_from_the_mounted_file(converted, module_mount):
    """llama.cpp loads the mounted GGUF and the converter's and gives the same tokens and
    logits."""
    pytest.importorskip("llama_cpp")
    import numpy as np
    from llama_cpp import Llama

    model = converted("llama")
    mnt = module_mount(model.dir, name="client")
    results = []
    for path in (model.expected[0], mnt / "files" / model.expected[0].name):
        llm = Llama(model_path=str(path), n_ctx=64, n_threads=1, logits_all=True, verbose=False,
                    seed=0)
        tokens = llm.tokenize(b"Hello world", add_bos=True)
        llm.eval(tokens)
        logits = np.array(llm.scores[:llm.n_tokens])
        out = llm(prompt="Hello", max_tokens=8, temperature=0.0)
        results.append((tokens, logits, out["choices"][0]["text"]))
        llm.close()
    assert results[0][0] == results[1][0]
    assert np.array_equal(results[0][1], results[1][1])
    assert results[0][2] == results[1][2]


def test_an_hf_repository_serves_the_gguf_reading_only_what_is_read(converted, tmp_path):
    """hf://ORG/NAME (the Hub's layout, served by nginx): the GGUF is the converter's, and
    reading one tensor of it fetches that tensor's bytes, not the model."""
    for module in ("fsspec", "aiohttp", "huggingface_hub"):
        pytest.importorskip(module)
    from tests.support.servers import HubRepo, Nginx

    model = converted("llama")
    repo = HubRepo(f"tiny/{model.dir.name}")
    repo.commit({p.name: p for p in model.dir.iterdir() if p.is_file()})
    server = Nginx(tmp_path / "nginx", [repo])
    server.start()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGING_FACE_"))}
    env.update({"HF_ENDPOINT": server.url, "HF_HOME": str(tmp_path / "hf-home"),
                "HF_HUB_DISABLE_TELEMETRY": "1", "HF_HUB_DISABLE_IMPLICIT_TOKEN": "1"})
    mounts = mounts_in(tmp_path, "rmnt", env)
    mount = next(mounts)
    try:
        mnt = mount(f"hf://tiny/{model.dir.name}")
        expected = model.expected[0]
        served = mnt / "files" / expected.name
        assert served.stat().st_size == expected.stat().st_size
        import gguf
        reader = gguf.GGUFReader(expected)
        last = reader.tensors[-1]
        mark = server.log_mark()
        with open(served, "rb") as f:
            f.seek(last.data_offset)
            assert f.read(last.n_bytes) == bytes(last.data.tobytes())
        fetched = sum(r["bytes"] for r in server.wait_quiet(mark)
                      if "model.safetensors" in r["uri"])
        size = (model.dir / "model.safetensors").stat().st_size
        assert fetched < size / 2, (fetched, size)
        for e in model.expected:
            _same(e, mnt / "files" / e.name)
    finally:
        with contextlib.suppress(StopIteration):
            next(mounts)
        server.stop()


def _tensor_bytes(path: Path, name: str) -> tuple[list[int], bytes]:
    """A safetensors file's tensor: (shape, bytes), read by its header (numpy has no
    bfloat16 for safe_open)."""
    raw = path.read_bytes()
    size = int.from_bytes(raw[:8], "little")
    entry = json.loads(raw[8:8 + size])[name]
    start, end = entry["data_offsets"]
    return entry["shape"], raw[8 + size + start:8 + size + end]


def test_an_edit_shows_in_the_gguf_as_the_converter_writes_it(converted, tmp_path, mount):
    """--edits: tensors overwritten through their raw files (dd conv=notrunc) show in the
    tensor files, files/model.safetensors and the GGUF files, which are cmp-equal to the
    converter's from the edited directory (a replaced q_proj comes out permuted, a matrix in
    Q8_0 quantized from its new values); never the old bytes.  A removed tensor: no GGUF
    is offered (the converter's plan would be another), the log says why in one line."""
    import numpy as np
    from gguf import GGUFReader

    from tests.hfgguf.tiny import as_dtype

    model = converted("llama")
    mnt = mount(model.dir, "--edits", tmp_path / "edits", name="edited")
    offered = sorted(n for n in os.listdir(mnt / "files") if n.endswith(".gguf"))
    assert offered == sorted(e.name for e in model.expected)
    rng = np.random.default_rng(7)
    new = {}
    for name in ("model.layers.0.mlp.down_proj.weight", "model.layers.1.self_attn.q_proj.weight"):
        shape = _tensor_bytes(model.dir / "model.safetensors", name)[0]
        new[name] = as_dtype(rng.standard_normal(shape) * 0.05, "BF16")
        raw = mnt.joinpath(*name.split("."))
        old = raw.read_bytes()
        assert len(old) == len(new[name]) and old != new[name]
        (tmp_path / "new.bin").write_bytes(new[name])
        result = subprocess.run(["dd", f"if={tmp_path / 'new.bin'}", f"of={raw}", "conv=notrunc",
                                 "status=none"], capture_output=True, text=True)
        assert result.returncode == 0, result.stderr
        assert raw.read_bytes() == new[name]
    edited = tmp_path / model.dir.name
    shutil.copytree(model.dir, edited)
    shutil.copyfile(mnt / "files" / "model.safetensors", edited / "model.safetensors")
    for name, data in new.items():
        assert _tensor_bytes(edited / "model.safetensors", name)[1] == data

    assert sorted(n for n in os.listdir(mnt / "files") if n.endswith(".gguf")) == offered
    expected = {}
    for gguf_file in offered:
        served = mnt / "files" / gguf_file
        if "BF16" in gguf_file:         # the matrix in its own type: its bytes as they are
            copy = shutil.copyfile(served, tmp_path / gguf_file)   # the reader maps it: not the mount
            tensor = next(t for t in GGUFReader(copy).tensors if t.name == "blk.0.ffn_down.weight")
            assert bytes(tensor.data.tobytes()) == new["model.layers.0.mlp.down_proj.weight"]
        outtype = "q8_0" if "Q8_0" in gguf_file else "bf16"
        expected[gguf_file] = convert(edited, outtype, tmp_path / "out")
        _same(expected[gguf_file], served)

    # a tensor renamed: the converter's plan would be another, so none is offered; renamed
    # back: offered again, with the edits
    up = mnt / "model" / "layers" / "1" / "mlp" / "up_proj"
    for there, back in ((up / "weight", up / "moved"), (up / "moved", up / "weight")):
        result = subprocess.run(["mv", str(there), str(back)], capture_output=True, text=True)
        assert result.returncode == 0, result.stderr
        now = sorted(n for n in os.listdir(mnt / "files") if n.endswith(".gguf"))
        assert now == ([] if back.name == "moved" else offered), now
    _same(expected[offered[0]], mnt / "files" / offered[0])
    row = next(r for r in json.loads(run_tensorfs("list", "--json").stdout)
               if r["mountpoint"] == str(mnt))
    logged = [line for line in Path(row["log"]).read_text().splitlines() if "GGUF: " in line]
    assert len(logged) == 2 and "renamed or removed" in logged[0], logged
    # the edits kept in DIR, mounted again: the GGUF files follow them from the start
    assert run_tensorfs("unmount", mnt).returncode == 0
    again = mount(model.dir, "--edits", tmp_path / "edits", name="again")
    for gguf_file in offered:
        _same(expected[gguf_file], again / "files" / gguf_file)
