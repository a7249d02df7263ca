"""The tokenizer fields of the HF-as-GGUF file against llama.cpp's converter itself:
``convert_hf_to_gguf.py --vocab-only`` (``make convert-oracle``, named by
TENSORFS_CONVERT_ORACLE) on a directory with a tiny config.json and a real tokenizer, read
back with gguf's GGUFReader; every ``tokenizer.*`` field's key, order, type and value must be
what ``vocab_fields`` gives.  Bad tokenizer files give NoVocab with one line."""

from __future__ import annotations

import json
import os
import subprocess
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import gguf
import pytest

from tensorfs.hfgguf.vocab import CHKTXT, NoVocab, _HfTokenizer, vocab_fields
from tests.support.hf_tokenizers import oracle_dir, write_tokenizer

pytestmark = pytest.mark.slow

# The smallest config.json of each architecture the converter takes with --vocab-only, the
# vocabulary sizes of the real models.
CONFIGS: dict[str, dict[str, Any]] = {
    "llama-bpe": {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 128256,
                  "bos_token_id": 128000, "eos_token_id": [128001, 128008, 128009]},
    "qwen2": {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "vocab_size": 151936,
              "bos_token_id": 151643, "eos_token_id": 151645},
    "llama-spm": {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 32000,
                  "bos_token_id": 1, "eos_token_id": 2},
    "gemma3": {"architectures": ["Gemma3ForCausalLM"], "model_type": "gemma3_text", "vocab_size": 384,
               "bos_token_id": 2, "eos_token_id": [1, 15], "pad_token_id": 0},
    "smollm2": {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 49152,
                "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 2},
    "bert": {"architectures": ["BertModel"], "model_type": "bert", "vocab_size": 30522, "pad_token_id": 0,
             "type_vocab_size": 2},
}
SIZES = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 1, "num_attention_heads": 4,
         "num_key_value_heads": 2, "max_position_embeddings": 512, "rms_norm_eps": 1e-5}

# The kinds whose fields are compared with the converter's.
KINDS = ["llama-bpe", "qwen2", "llama-spm", "gemma3", "bert", "smollm2"]


def _template_in_jinja(directory: Path) -> None:
    """The chat template in chat_template.jinja (transformers' newer layout), none in
    tokenizer_config.json."""
    config = json.loads((directory / "tokenizer_config.json").read_text(encoding="utf-8"))
    (directory / "chat_template.jinja").write_text(config.pop("chat_template"), encoding="utf-8")
    (directory / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")


def _spm_added_tokens(directory: Path) -> None:
    """added_tokens.json and tokenizer_config.json's added tokens past the SentencePiece
    pieces (one special, one that only looks special, one plain with a \u2581), and
    add_prefix_space."""
    (directory / "added_tokens.json").write_text(json.dumps({"<|im_start|>": 32000, "<extra>": 32001,
                                                             "\u2581plain": 32002}))
    config = json.loads((directory / "tokenizer_config.json").read_text(encoding="utf-8"))
    config["add_prefix_space"] = False
    for idx, content, special in ((32000, "<|im_start|>", False), (32001, "<extra>", True),
                                  (32002, "\u2581plain", False)):
        config["added_tokens_decoder"][str(idx)] = {"content": content, "lstrip": False, "normalized": False,
                                                    "rstrip": False, "single_word": False, "special": special}
    (directory / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")


# Variants of a kind: (kind, config.json changes, a change to the files)
VARIANTS: dict[str, tuple[str, dict[str, Any], Any]] = {
    "llama-bpe-jinja-padded": ("llama-bpe", {"vocab_size": 128300}, _template_in_jinja),
    "llama-spm-added": ("llama-spm", {"vocab_size": 32004}, _spm_added_tokens),
    "qwen3": ("qwen2", {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3"}, lambda directory: None),
}


def _converter() -> Path:
    root = oracle_dir()
    if root is None:
        pytest.skip("TENSORFS_CONVERT_ORACLE is unset: make convert-oracle (make test sets it)")
    assert (root / "bin" / "convert").exists(), f"TENSORFS_CONVERT_ORACLE={root} has no bin/convert"
    return root / "bin" / "convert"


def model_dir(parent: Path, kind: str, **config: Any) -> Path:
    _converter()  # the vocabularies are llama.cpp's, in the oracle's tree
    name = kind
    if kind in VARIANTS:
        kind, changes, change_files = VARIANTS[name]
        config = {**changes, **config}
    directory = parent / name
    write_tokenizer(directory, kind)
    (directory / "config.json").write_text(json.dumps({**CONFIGS[kind], **SIZES, **config}))
    if name in VARIANTS:
        change_files(directory)
    return directory


def run_converter(directory: Path, out: Path) -> subprocess.CompletedProcess:
    return subprocess.run([str(_converter()), str(directory), "--vocab-only", "--outtype", "bf16",
                           "--outfile", str(out)], capture_output=True, text=True, timeout=900,
                          env={**os.environ, "PYTHONHASHSEED": "0"})


def reader_of(directory: Path):
    def read(name: str) -> bytes | None:
        path = directory / name
        return path.read_bytes() if path.is_file() else None
    return read


def ours(directory: Path) -> list[tuple[str, gguf.GGUFValueType, Any]]:
    config = json.loads((directory / "config.json").read_text())
    return vocab_fields(reader_of(directory), config, config["architectures"][0])


@pytest.fixture(scope="module")
def converted(tmp_path_factory) -> dict[str, Future]:
    """The converter's --vocab-only file of each kind, and transformers' ids of the kinds
    whose ids the tokenizers library gives, all started at once (each takes a minute, most of
    it importing torch and transformers)."""
    _converter()
    parent = tmp_path_factory.mktemp("hf")
    pool = ThreadPoolExecutor(max_workers=len(KINDS) + len(VARIANTS) + 1)

    def one(kind: str) -> tuple[Path, Path]:
        directory = model_dir(parent, kind)
        out = parent / f"{kind}.gguf"
        done = run_converter(directory, out)
        assert done.returncode == 0, f"the converter failed on {kind}:\n{done.stderr[-3000:]}"
        return directory, out

    futures = {kind: pool.submit(one, kind) for kind in [*KINDS, *VARIANTS]}
    futures["transformers"] = pool.submit(_transformers_ids, parent)
    yield futures
    pool.shutdown(wait=True)


def tokenizer_fields(path: Path) -> list[tuple[str, list[gguf.GGUFValueType], Any]]:
    """The fields set_vocab writes, as the file has them: tokenizer.* (bert's token type
    count is one of them too)."""
    reader = gguf.GGUFReader(path)
    return [(key, field.types, field.contents()) for key, field in reader.fields.items()
            if key.startswith("tokenizer.")]


@pytest.mark.parametrize("kind", [*KINDS, *VARIANTS])
def test_fields_are_the_converters(converted, kind):
    directory, out = converted[kind].result()
    want = tokenizer_fields(out)
    got = ours(directory)
    assert [k for k, _, _ in got] == [k for k, _, _ in want]
    for (key, vtype, value), (_, types, contents) in zip(got, want):
        if vtype == gguf.GGUFValueType.ARRAY:
            element, items = value
            assert types == [vtype, element], key
            assert len(items) == len(contents), key
            diff = [(i, a, b) for i, (a, b) in enumerate(zip(items, contents)) if a != b]
            assert not diff, f"{key}: {len(diff)} items differ, the first {diff[:5]}"
        else:
            assert types == [vtype], key
            assert value == contents, key


# The kinds whose ids come from the tokenizers library (the pre-tokenizer hash): checked
# against transformers' AutoTokenizer in the oracle's venv, on the hash text and on llama.cpp's
# tokenizer test texts.
ENCODED = ["llama-bpe", "qwen2", "bert", "smollm2"]

_ENCODE = """
import json, sys
from transformers import AutoTokenizer
texts = json.loads(sys.stdin.read())
print(json.dumps({d: [AutoTokenizer.from_pretrained(d).encode(t) for t in texts] for d in sys.argv[1:]}))
"""


def _transformers_ids(parent: Path) -> tuple[list[str], dict[str, tuple[Path, list[list[int]]]]]:
    root = _converter().parent.parent
    texts = [CHKTXT] + (root / "src" / "models" / "ggml-vocab-llama-bpe.gguf.inp").read_text(
        encoding="utf-8").split("\n__ggml_vocab_test__\n")[:-1]
    directories = {kind: model_dir(parent / "encoded", kind) for kind in ENCODED}
    done = subprocess.run([str(root / "venv" / "bin" / "python"), "-c", _ENCODE, *map(str, directories.values())],
                          input=json.dumps(texts), capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    theirs = json.loads(done.stdout.splitlines()[-1])
    return texts, {kind: (directory, theirs[str(directory)]) for kind, directory in directories.items()}


@pytest.mark.parametrize("kind", ENCODED)
def test_ids_are_transformers(converted, kind):
    texts, encoded = converted["transformers"].result()
    directory, theirs = encoded[kind]
    config = json.loads((directory / "config.json").read_text())
    tokenizer = _HfTokenizer(reader_of(directory), config)
    assert [tokenizer.encode_with_specials(t) for t in texts] == theirs


def test_a_pre_tokenizer_the_converter_does_not_know(tmp_path):
    """An unknown BPE pre-tokenizer: the converter refuses it, NoVocab names its hash."""
    directory = model_dir(tmp_path, "qwen2")
    tokenizer = json.loads((directory / "tokenizer.json").read_text(encoding="utf-8"))
    tokenizer["normalizer"] = {"type": "Sequence", "normalizers": [{"type": "NFC"}, {"type": "Lowercase"}]}
    (directory / "tokenizer.json").write_text(json.dumps(tokenizer), encoding="utf-8")
    with pytest.raises(NoVocab) as caught:
        ours(directory)
    message = str(caught.value)
    assert "\n" not in message and "pre-tokenizer" in message and "chkhsh" in message
    done = run_converter(directory, tmp_path / "out.gguf")
    assert done.returncode != 0 and "BPE pre-tokenizer was not recognized" in done.stderr


def _broken(directory: Path, name: str, data: bytes | None) -> None:
    if data is None:
        (directory / name).unlink()
    else:
        (directory / name).write_bytes(data)


@pytest.mark.parametrize(("kind", "name", "data", "words"), [
    ("qwen2", "tokenizer.json", None, "tokenizer.json"),
    ("qwen2", "tokenizer.json", b'{"model": ', "not valid JSON"),
    ("qwen2", "tokenizer_config.json", b"[1, 2]", "not a JSON object"),
    ("llama-bpe", "tokenizer.json", b'{"model": {"type": "BPE"}, "decoder": null}', "tokenizer.json"),
    ("llama-spm", "tokenizer.model", b"\x0a\x05\x0a\x03abc\x12", "SentencePiece"),
    ("llama-spm", "tokenizer.model", b"not a protobuf at all", "SentencePiece"),
    ("gemma3", "tokenizer.model", b"", "no pieces"),
    ("bert", "tokenizer.json", None, "tokenizer.json"),
    ("llama-spm", "tokenizer.model", None, "byte fallback"),
    ("gemma3", "tokenizer.model", None, "pre-tokenizer"),
    ("bert", "tokenizer_config.json", b'{"tokenizer_class": "BertTokenizer", "do_lower_case": false}', "lowercase"),
])
def test_broken_tokenizer_files(tmp_path, kind, name, data, words):
    directory = model_dir(tmp_path, kind)
    _broken(directory, name, data)
    with pytest.raises(NoVocab) as caught:
        ours(directory)
    assert "\n" not in str(caught.value) and words in str(caught.value)


def test_vocab_size_below_the_tokenizers_ids(tmp_path):
    directory = model_dir(tmp_path, "qwen2", vocab_size=151000)
    with pytest.raises(NoVocab, match="vocab_size"):
        ours(directory)


def test_an_architecture_without_a_tokenizer_rule(tmp_path):
    directory = model_dir(tmp_path, "qwen2")
    with pytest.raises(NoVocab, match="MixtralForCausalLM"):
        vocab_fields(reader_of(directory), {}, "MixtralForCausalLM")


def test_a_special_token_transformers_would_add(tmp_path):
    """tokenizer_config.json names a special token tokenizer.json lacks: transformers would add
    it on load, so the result is not reproduced (NoVocab), not guessed."""
    directory = model_dir(tmp_path, "qwen2")
    config = json.loads((directory / "tokenizer_config.json").read_text(encoding="utf-8"))
    config["additional_special_tokens"].append("<|not_there|>")
    (directory / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
    with pytest.raises(NoVocab, match="not_there"):
        ours(directory)
