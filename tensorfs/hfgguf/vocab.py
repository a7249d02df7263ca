"""The tokenizer of a Hugging Face model directory as llama.cpp's ``convert_hf_to_gguf.py``
writes it: the GGUF metadata fields of the converter's ``set_vocab``.

The reference is the converter vendored in llama-cpp-python 0.3.36 (``conversion/base.py``:
``get_vocab_base``, ``get_vocab_base_pre``, ``_set_vocab_gpt2``, ``_set_vocab_sentencepiece``,
``_create_vocab_sentencepiece``; ``llama.py``, ``qwen.py``, ``gemma.py``, ``bert.py``: each
``set_vocab``; gguf-py 0.19.0's ``SpecialVocab``).  Three kinds:

- BPE (``gpt2``): the converter loads the tokenizer with transformers and names its
  pre-tokenizer by the hash of the ids of a fixed text; here the ``tokenizers`` library (the
  optional extra ``hf``) encodes the same text from ``tokenizer.json`` and the hash is looked
  up in the converter's table, copied below as facts;
- SentencePiece (``llama``): ``tokenizer.model`` is read as the protobuf it is (a small
  wire-format reader: no sentencepiece, no protobuf), with ``added_tokens.json`` and
  ``tokenizer_config.json``'s added tokens applied as the converter applies them;
- WordPiece (``bert``): as BPE, with the converter's "phantom space" rewriting.

What the converter would refuse, and what could not be reproduced exactly (a tokenizer that
transformers would change on load, a llama ``tokenizer.json`` with byte fallback that the
converter hands to transformers' slow path...), raises ``NoVocab`` with one line.
"""

from __future__ import annotations

import copy
import json
import re
import struct
from collections.abc import Callable, Mapping
from hashlib import sha256
from typing import TYPE_CHECKING, Any

from tensorfs.runtime.libraries import gguf as _gguf

if TYPE_CHECKING:
    from gguf import GGUFValueType, Keys, TokenType
else:               # gguf imported whole under the one lock (tensorfs.runtime.libraries)
    GGUFValueType, Keys, TokenType = _gguf.GGUFValueType, _gguf.Keys, _gguf.TokenType

# One metadata field: (key, value type, value).  A scalar's value is a str, int, bool or
# float; an array's (type ARRAY) is (element type, list of elements): strings as str,
# token types as int, scores as float.
Field = tuple[str, GGUFValueType, Any]

Reader = Callable[[str], "bytes | None"]


class NoVocab(Exception):
    """Why the converter would not write this tokenizer, or why it cannot be reproduced."""


# -- the writer's order -------------------------------------------------------------------------

class _Writer:
    """The part of GGUFWriter that set_vocab uses: keys in first-insertion order, a key
    written again keeps its place and takes the new value."""

    def __init__(self) -> None:
        self.fields: dict[str, tuple[GGUFValueType, Any]] = {}

    def add(self, key: str, vtype: GGUFValueType, value: Any) -> None:
        self.fields[key] = (vtype, value)

    def add_array(self, key: str, values: list[Any], element: GGUFValueType) -> None:
        if values:  # GGUFWriter.add_array skips an empty list
            self.add(key, GGUFValueType.ARRAY, (element, values))

    def string(self, key: str, value: str) -> None:
        self.add(key, GGUFValueType.STRING, value)

    def boolean(self, key: str, value: bool) -> None:
        self.add(key, GGUFValueType.BOOL, bool(value))

    def uint32(self, key: str, value: int) -> None:
        self.add(key, GGUFValueType.UINT32, int(value))

    def remove(self, key: str) -> None:
        self.fields.pop(key, None)

    def list(self) -> list[Field]:
        return [(key, vtype, value) for key, (vtype, value) in self.fields.items()]


# -- reading the directory ------------------------------------------------------------------------

class _Files:
    """``read`` with each file read once and each JSON file parsed once (tokenizer.json is
    megabytes); the parsed values are shared: whoever changes one copies it first."""

    def __init__(self, read: Reader) -> None:
        self.read = read
        self.data: dict[str, bytes | None] = {}
        self.parsed: dict[str, Any] = {}

    def __call__(self, name: str) -> bytes | None:
        if name not in self.data:
            self.data[name] = self.read(name)
        return self.data[name]


def _json(read: Reader, name: str) -> Any:
    """A JSON file of the directory, None when it is absent."""
    if isinstance(read, _Files) and name in read.parsed:
        return read.parsed[name]
    data = read(name)
    if data is None:
        return None
    try:
        value = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        raise NoVocab(f"{name} is not valid JSON: {_one_line(e)}") from None
    if isinstance(read, _Files):
        read.parsed[name] = value
    return value


def _json_object(read: Reader, name: str) -> dict[str, Any] | None:
    value = _json(read, name)
    if value is not None and not isinstance(value, dict):
        raise NoVocab(f"{name} is not a JSON object")
    return value


def _one_line(e: BaseException) -> str:
    text = " ".join(str(e).split())
    return text[:200] if text else type(e).__name__


# -- the entry point ------------------------------------------------------------------------------

def vocab_fields(read: Reader, hparams: Mapping[str, Any], arch: str) -> list[Field]:
    """The fields the converter's ``set_vocab`` writes for this directory, in its order.

    ``read(name)`` gives a file of the model directory (``tokenizer.json``, ``tokenizer.model``,
    ...) or None; ``hparams`` is ``config.json`` parsed; ``arch`` its ``architectures[0]``.
    Each field is ``(key, GGUFValueType, value)``: for a scalar the value itself (str, int,
    bool), for an array (``GGUFValueType.ARRAY``) a pair ``(element type, list)``
    (``tokenizer.ggml.tokens``: STRING, str items; ``.token_type``: INT32, int items;
    ``.scores``: FLOAT32, float items; ``.merges``: STRING).  A key the writer already holds
    from ``set_gguf_parameters`` keeps its earlier place in the file with the value given here.

    Raises ``NoVocab`` (one line) where the converter would stop or where its output cannot be
    reproduced exactly.  One thing ``read`` cannot see: beside ``chat_template.jinja`` the
    converter also takes ``additional_chat_templates/*.jinja`` (then writes named templates);
    a caller whose directory has that folder should not offer the GGUF."""
    try:
        return _vocab_fields(_Files(read), hparams, arch)
    except NoVocab:
        raise
    except (KeyError, TypeError, ValueError, AttributeError, IndexError) as e:
        # the converter stops on the same broken file, with a traceback
        raise NoVocab(f"the tokenizer files are malformed: {type(e).__name__}: {_one_line(e)}") from None


def _vocab_fields(read: Reader, hparams: Mapping[str, Any], arch: str) -> list[Field]:
    if not isinstance(hparams, Mapping):
        raise NoVocab("config.json is not a JSON object")
    merged = dict(hparams)
    if isinstance(hparams.get("text_config"), dict):  # TextModel.__init__
        merged = {**merged, **hparams["text_config"]}
    w = _Writer()
    if arch == "LlamaForCausalLM":
        _set_vocab_llama(w, read, hparams, merged)
    elif arch in ("Qwen2ForCausalLM", "Qwen3ForCausalLM"):
        if read("tokenizer.model") is not None:
            _set_vocab_sentencepiece(w, read, hparams, merged)
        else:
            _set_vocab_gpt2(w, read, hparams, merged)
    elif arch == "Gemma3ForCausalLM":
        if read("tokenizer.model") is not None:
            _set_vocab_sentencepiece(w, read, hparams, merged)
            w.boolean(Keys.Tokenizer.ADD_PREFIX, False)
        else:
            _set_vocab_gpt2(w, read, hparams, merged)
    elif arch == "BertModel":
        _set_vocab_bert(w, read, hparams, merged)
    else:
        raise NoVocab(f"no tokenizer conversion for architecture {arch!r}")
    return w.list()


def _set_vocab_llama(w: _Writer, read: Reader, hparams: Mapping[str, Any], merged: dict[str, Any]) -> None:
    """llama.py's LlamaModel.set_vocab, for a Hugging Face directory."""
    if read("tekken.json") is not None and read("tokenizer.json") is None:
        raise NoVocab("a Mistral tekken.json tokenizer is not supported")
    config = _json_object(read, "tokenizer_config.json")
    if config is not None:
        if (add_prefix_space := config.get("add_prefix_space")) is not None:
            w.boolean(Keys.Tokenizer.ADD_PREFIX, add_prefix_space)
        if config.get("tokenizer_class") == "HybridDNATokenizer":
            raise NoVocab("the HybridDNATokenizer is not supported")
    if read("tokenizer.model") is not None:
        _set_vocab_sentencepiece(w, read, hparams, merged)
    else:
        # _set_vocab_llama_hf (gguf's LlamaHfVocab) first: it takes a tokenizer.json of a BPE
        # with byte fallback and a Sequence decoder; Llama 3's (ignore_merges, no byte
        # fallback) and every other one fall through to _set_vocab_gpt2.
        tokenizer = _json_object(read, "tokenizer.json")
        if tokenizer is not None:
            model = tokenizer["model"]
            is_llama3 = (model["type"] == "BPE" and model.get("ignore_merges", False)
                         and not model.get("byte_fallback", True))
            decoder = tokenizer["decoder"]
            if not is_llama3 and decoder is not None and model["type"] == "BPE" \
                    and model.get("byte_fallback", False) and decoder["type"] == "Sequence":
                raise NoVocab("a llama tokenizer.json with byte fallback and no tokenizer.model "
                              "(the converter's LlamaHfVocab) is not supported")
        _set_vocab_gpt2(w, read, hparams, merged)
    vocab_size = merged.get("vocab_size", 32000)
    if vocab_size == 32016:
        raise NoVocab("CodeLlama's infill tokens (vocab_size 32016) are not supported")
    if vocab_size == 49152:  # "granite small models": SmolLM's vocabulary size too
        w.boolean(Keys.Tokenizer.ADD_BOS, False)


# -- BPE and WordPiece: get_vocab_base ------------------------------------------------------------

# get_vocab_base_pre's text and table (llama-cpp-python 0.3.36's converter), in its order:
# each hash is tested in turn and the last match wins (two hashes are listed twice).
CHKTXT = (
    "\n \n\n \n\n\n \t \t\t \t\n  \n   \n    \n     \n🚀 (normal) 😶\u200d🌫️ (multiple emojis concatenated) "
    "✅ 🦙🦙 3 33 333 3333 33333 333333 3333333 33333333 3.3 3..3 3...3 កាន់តែពិសេសអាច😁 ?我想在apple工作1314151天～ "
    "------======= нещо на Български ''''''```````\"\"\"\"......!!!!!!?????? I've been 'told he's there, "
    "'RE you sure? 'M not sure I'll make it, 'D you like some tea? We'Ve a'lL"
)

PRE_TOKENIZER_HASHES: list[tuple[str, str]] = [
    ("b6e8e1518dc4305be2fe39c313ed643381c4da5db34a98f6a04c093f8afbe99b", "chatglm-bpe"),
    ("81d72c7348a9f0ebe86f23298d37debe0a5e71149e29bd283904c02262b27516", "chatglm-bpe"),
    ("a1336059768a55c99a734006ffb02203cd450fed003e9a71886c88acf24fdbc2", "glm4"),
    ("9ca2dd618e8afaf09731a7cf6e2105b373ba6a1821559f258b272fe83e6eb902", "glm4"),
    ("cdf5f35325780597efd76153d4d1c16778f766173908894c04afc20108536267", "glm4"),
    ("1431a23e583c97432bc230bff598d103ddb5a1f89960c8f1d1051aaa944d0b35", "minerva-7b"),
    ("7e57df22b1fe23a7b1e1c7f3dc4e3f96d43a4eb0836d0c6bdc3436d7b2f1c664", "hunyuan"),
    ("bba3b3366b646dbdded5dbc42d59598b849371afc42f7beafa914afaa5b70aa6", "hunyuan-dense"),
    ("e6ddf9c6686791c12d698d34c31ab9be1fea9af5a3d9a6909783ab382198ae1c", "hy_v4"),
    ("a6b57017d60e6edb4d88ecc2845188e0eb333a70357e45dcc9b53964a73bbae6", "falcon-h1"),
    ("60476e1243776c4fb1b993dbd7a5f15ac22f83c80afdf425fa5ae01c8d44ef86", "falcon-h1"),
    ("3eda48b4c4dc7de733d1a8b3e3b4a85243dbbf704da2ee9d42c6beced8897896", "falcon-h1"),
    ("48f8e02c0359c0bbdd82f26909171fac1c18a457bb47573ed1fe3bbb2c1cfd4b", "falcon-h1"),
    ("81212dc7cdb7e0c1074ca62c5aeab0d43c9f52b8a737be7b12a777c953027890", "kimi-k2"),
    ("d4540891389ea895b53b399da6ac824becc30f2fba0e9ddbb98f92e55ca0e97c", "qwen2"),
    ("1444df51289cfa8063b96f0e62b1125440111bc79a52003ea14b6eac7016fd5f", "qwen35"),
    ("66b8d4e19ab16c3bfd89bce5d785fb7e0155e8648708a1f42077cb9fe002c273", "grok-2"),
    ("b3d1dd861f1d4c5c0d2569ce36baf3f90fe8a102db3de50dd71ff860d91be3df", "jina-v2-de"),
    ("0fe1cf6eda062318a1af7270f3331a85c539a01778ff948e24388e949c5282f4", "gpt-2"),
    ("9e454714343b69b99b71795c1d27a68c2a1d15dab111f4d353109f966af29da7", "lfm2"),
    ("846deafc5b0fa786186fa4ae6c7b49903cf2f1d1895bdb80b9120d60be135252", "gemma4"),
    ("0a766d034107bc736a3f2dc4968fd62e54a3570f1454443e0c5a4cc6bd7941ed", "spark2_5"),
    ("0ef9807a4087ebef797fc749390439009c3b9eda9ad1a097abbe738f486c01e5", "llama-bpe"),
    ("049ecf7629871e3041641907f3de7c733e4dbfdc736f57d882ba0b0845599754", "deepseek-llm"),
    ("347715f544604f9118bb75ed199f68779f423cabb20db6de6f31b908d04d7821", "deepseek-coder"),
    ("8aeee3860c56296a157a1fe2fad249ec40aa59b1bb5709f4ade11c4e6fe652ed", "falcon"),
    ("0876d13b50744004aa9aeae05e7b0647eac9d801b5ba4668afc01e709c15e19f", "bert-bge"),
    ("9d032fcbd5501f4a38150912590928bfb36091efb5df11b8e2124b0390e3fb1e", "falcon3"),
    ("8e62295832751ca1e8f92f2226f403dea30dc5165e448b5bfa05af5340c64ec7", "bert-bge-large"),
    ("b6dc8df998e1cfbdc4eac8243701a65afe638679230920b50d6f17d81c098166", "mpt"),
    ("35d91631860c815f952d711435f48d356ebac988362536bed955d43bfa436e34", "starcoder"),
    ("3ce83efda5659b07b1ad37ca97ca5797ea4285d9b9ab0dc679e4a720c9da7454", "gpt-2"),
    ("32d85c31273f8019248f2559fed492d929ea28b17e51d81d3bb36fff23ca72b3", "stablelm2"),
    ("6221ad2852e85ce96f791f476e0b390cf9b474c9e3d1362f53a24a06dc8220ff", "refact"),
    ("9c2227e4dd922002fb81bde4fc02b0483ca4f12911410dee2255e4987644e3f8", "command-r"),
    ("d772b220ace2baec124bed8cfafce0ead7d6c38a4b65ef11261cf9d5d62246d1", "tiny_aya"),
    ("52df12b4c8d4176e7481aab4b6e8454d1fd0a210a04a574f6d4e067d10e23c3e", "cohere2moe"),
    ("e636dc30a262dcc0d8c323492e32ae2b70728f4df7dfe9737d9f920a282b8aea", "qwen2"),
    ("b6dc8df998e1cfbdc4eac8243701a65afe638679230920b50d6f17d81c098166", "olmo"),
    ("a8594e3edff7c29c003940395316294b2c623e09894deebbc65f33f1515df79e", "dbrx"),
    ("c7699093ba4255a91e702aa38a596aa81669f3525dae06c2953267dde580f448", "jina-v1-en"),
    ("0876d13b50744004aa9aeae05e7b0647eac9d801b5ba4668afc01e709c15e19f", "jina-v2-en"),
    ("171aeeedd6fb548d418a7461d053f11b6f1f1fc9b387bd66640d28a4b9f5c643", "jina-v2-es"),
    ("27949a2493fc4a9f53f5b9b029c82689cfbe5d3a1929bb25e043089e28466de6", "jina-v2-de"),
    ("a023e9fdc5a11f034d3ef515b92350e56fb2af1f66c6b6811a4444ea9bf8763d", "jina-v5-nano"),
    ("c136ed14d01c2745d4f60a9596ae66800e2b61fa45643e72436041855ad4089d", "smaug-bpe"),
    ("c7ea5862a53e4272c035c8238367063e2b270d51faa48c0f09e9d5b54746c360", "poro-chat"),
    ("7967bfa498ade6b757b064f31e964dddbb80f8f9a4d68d4ba7998fcf281c531a", "jina-v2-code"),
    ("7fc505bd3104ca1083b150b17d088b59534ede9bde81f0dd2090967d7fe52cee", "viking"),
    ("b53802fb28e26d645c3a310b34bfe07da813026ec7c7716883404d5e0f8b1901", "jais"),
    ("bc5108ee1eb6a3d600cadd065f63190fbd0554dbc9e4bbd6a0d977970afc8d2a", "jais-2"),
    ("7b3e7548e4308f52a76e8229e4e6cc831195d0d1df43aed21ac6c93da05fec5f", "codeshell"),
    ("63b97e4253352e6f357cc59ea5b583e3a680eaeaf2632188c2b952de2588485e", "tekken"),
    ("855059429035d75a914d1eda9f10a876752e281a054a7a3d421ef0533e5b6249", "smollm"),
    ("3c30d3ad1d6b64202cd222813e7736c2db6e1bd6d67197090fc1211fbc612ae7", "bloom"),
    ("bc01ce58980e1db43859146dc51b1758b3b88729b217a74792e9f8d43e479d21", "gpt3-finnish"),
    ("4e2b24cc4770243d65a2c9ec19770a72f08cffc161adbb73fcbb6b7dd45a0aae", "exaone"),
    ("fcace8b9cac38ce847670c970cd5892031a753a1ef381abd1d9af00f713da085", "phi-2"),
    ("60824e3c0d9401f89943cbb2fff727f0e2d4c545ba4df2d6e4f09a6db0f5b450", "chameleon"),
    ("8b5a93ed704057481f240da0be7e7dca721d7f8f4755263b6807227a2cbeae65", "roberta-bpe"),
    ("ad851be1dba641f2e3711822f816db2c265f788b37c63b4e1aeacb9ee92de8eb", "gigachat"),
    ("d4c8f286ea6b520b3d495c4455483cfa2302c0cfcd4be05d781b6a8a0a7cdaf1", "megrez"),
    ("877081d19cf6996e2c4ff0e1236341e9b7bde288f5311a56a937f0afbbb3aeb5", "deepseek-v3"),
    ("b3f499bb4255f8ca19fccd664443283318f2fd2414d5e0b040fbdd0cc195d6c5", "deepseek-r1-qwen"),
    ("ccc2ef013c104be7bae2965776d611e1d7a8a2a9c547dd93a682c9a9fc80352e", "gpt-4o"),
    ("7dec86086fcc38b66b7bc1575a160ae21cf705be7718b9d5598190d7c12db76f", "superbpe"),
    ("1994ffd01900cfb37395608534236ecd63f2bd5995d6cb1004dda1af50240f15", "trillion"),
    ("96a5f08be6259352137b512d4157e333e21df7edd3fcd152990608735a65b224", "bailingmoe"),
    ("d353350c764d8c3b39c763113960e4fb4919bea5fbf208a0e3b22e8469dc7406", "llama4"),
    ("0e9433cbbb161f89e264eb32e8e64bfe69e834973ffca5d41d3948a604a3e2a3", "pixtral"),
    ("d5f1dd6f980fec569fb218a81a7658ac45fc56b38c5a0adeb1c232fbe04ef5ec", "seed-coder"),
    ("b0a6b1c0bd5998ebd9df08611efde34a4ff03faed45ae09c43e6b31ebd4b94cf", "a.x-4.0"),
    ("f6791d196f87ce6b56a7d234be618e0d58f8cda3549416635b2bebcd22cd95c4", "midm-2.0"),
    ("169bf0296a13c4d9b7672313f749eb36501d931022de052aad6e36f2bf34dd51", "lfm2"),
    ("2085e1638f6c377a0aa4ead21b27bb4cb941bf800df86ed391011769c1758dfb", "exaone4"),
    ("a1e163ecab2e718a4c829d1148b6e86824ec36163bb71941c3dca9cd5ac25756", "mellum"),
    ("a0b64b4385f123663873756336c085744376d015ff328bb1d901598f63c44152", "modern-bert"),
    ("49fc0303c9e0d2c2c565c510f64b2d9b271276acdcdadff733249eda9f7d59df", "afmoe"),
    ("9b1be57e70d20d9501b2b3186e792d81181ae36ada3903c26f9fea418cf87206", "bailingmoe2"),
    ("53e325976a6e142379c19b09afcae354f2f496f147afa8f9e189a33fe4e3024e", "granite-docling"),
    ("f4f37b6c8eb9ea29b3eac6bb8c8487c5ab7885f8d8022e67edc1c68ce8403e95", "minimax-m2"),
    ("4a2e2abae11ca2b86d570fc5b44be4d5eb5e72cc8f22dd136a94b37da83ab665", "kormo"),
    ("9d70134b369a70e5735009b6de918f7581b5211f7c074d1f89f753aea8248af1", "youtu"),
    ("16389f0a1f51ee53e562ffd51c371dc508639ab0e4261502071836e50e223e91", "solar-open"),
    ("6c81ce329e0802883b22eabab0d3fa48357337ef1ecb45443828bf1f6254833f", "exaone-moe"),
    ("d30d75d9059f1aa2c19359de71047b3ae408c70875e8a3ccf8c5fba56c9d8af4", "qwen35"),
    ("b4b8ca1f9769494fbd956ebc4c249de6131fb277a4a3345a7a92c7dd7a55808d", "joyai-llm"),
    ("e4d54df1ebc1f2b91acd986c5b51aa50837d5faf7c7398e73c1f9e9ee5d19869", "kanana2"),
    ("862f827721df956049dff5ca81a57f29e575280bc622e290d3bf4e35eca29015", "f2llmv2"),
    ("62f6fb0a6fd5098caeabb19b07a5c1099cafc8b9c40eab6ea89ece4ec02fbc57", "sarvam-moe"),
    ("f728162c1315c26e40249849799b4ba3fe584c32084b4795b03eb295e63cb5af", "talkie"),
    ("36f3066e97b7f3994b379aaacde306c1444c6ae84e81a5ae3cd2b7ed3b8c42d4", "minicpm5"),
    ("f241072145675bf8322086f115aebad05e9f869557a238bf2150a2a417d1bf60", "granite-embed-multi-97m"),
    ("789696f5946cc0fc59371f39f6097cafed196b3acded6140432f26bbb1ae1669", "granite-embed-multi-311m"),
    ("9dcf830ee9990cdbf78cc523a5f7bd9ad8f3f9890c2d3581d2785ad10f07049d", "mellum2"),
    ("972da7b59cec44d1f0a490a86c96df53859e486e481563e5dddac155013d87ac", "laguna"),
    ("653660222fb704f61cbf2b618a8ae6502b7f8b20c980f9a5de07ed78e13319cd", "ufakzeka"),
]

PRE_TOKENIZERS: dict[str, str] = dict(PRE_TOKENIZER_HASHES)  # later entries win, as in the converter

# transformers' tokenizer classes whose __init__ rebuilds the post-processor from
# add_bos_token/add_eos_token (update_post_processor), with their defaults (4.57)
_TEMPLATE_CLASSES = {
    "LlamaTokenizer": (True, False), "LlamaTokenizerFast": (True, False),
    "CodeLlamaTokenizer": (True, False), "CodeLlamaTokenizerFast": (True, False),
    "GemmaTokenizer": (True, False), "GemmaTokenizerFast": (True, False),
    "GPTNeoXTokenizer": (False, False), "GPTNeoXTokenizerFast": (False, False),
    "CohereTokenizer": (True, False), "CohereTokenizerFast": (True, False),
}

# AutoTokenizer's class for a config's model_type, where tokenizer_config.json names none
_CLASS_BY_MODEL_TYPE = {"llama": "LlamaTokenizerFast", "gemma": "GemmaTokenizerFast",
                        "gemma3": "GemmaTokenizerFast", "gemma3_text": "GemmaTokenizerFast",
                        "qwen2": "Qwen2TokenizerFast", "qwen3": "Qwen2TokenizerFast",
                        "bert": "BertTokenizerFast"}

# AddedToken's flags and their defaults, as tokenizer_config.json's added_tokens_decoder has them
_ADDED_FLAGS = (("lstrip", False), ("rstrip", False), ("single_word", False), ("normalized", True),
                ("special", False))

_SPECIAL_ATTRS = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")


def _tokenizers() -> Any:
    try:
        import tokenizers
    except ImportError:
        raise NoVocab("a BPE/WordPiece tokenizer needs the `tokenizers` package "
                      "(pip install 'tensorfs-fuse[hf]')") from None
    return tokenizers


def _content(entry: Any) -> str | None:
    if isinstance(entry, str):
        return entry
    if isinstance(entry, dict) and isinstance(entry.get("content"), str):
        return entry["content"]
    return None


class _HfTokenizer:
    """The fast tokenizer transformers would load from tokenizer.json and
    tokenizer_config.json, where loading it changes nothing; NoVocab where it would."""

    def __init__(self, read: Reader, hparams: Mapping[str, Any]) -> None:
        data = read("tokenizer.json")
        if data is None:
            raise NoVocab("no tokenizer.json (a tokenizer built from vocab.txt or "
                          "merges.txt alone is not supported)")
        self.json = _json_object(read, "tokenizer.json")
        self.config = _json_object(read, "tokenizer_config.json") or {}
        # PreTrainedTokenizerFast.__init__ sets a top-level pre-tokenizer's add_prefix_space
        # to tokenizer_config.json's (False when unset)
        pre = self.json.get("pre_tokenizer")
        add_prefix_space = self.config.get("add_prefix_space", False)
        if isinstance(pre, dict) and "add_prefix_space" in pre and pre["add_prefix_space"] != add_prefix_space:
            self.json = {**self.json, "pre_tokenizer": {**pre, "add_prefix_space": add_prefix_space}}
            text = json.dumps(self.json)
        else:
            text = data.decode("utf-8")
        lib = _tokenizers()
        try:
            self.tok = lib.Tokenizer.from_str(text)
        except Exception as e:  # the library's own error type
            raise NoVocab(f"tokenizer.json cannot be loaded: {_one_line(e)}") from None
        # transformers' encode() without truncation or padding turns both off in the backend
        self.tok.no_truncation()
        self.tok.no_padding()
        self.cls = self.config.get("tokenizer_class") or _CLASS_BY_MODEL_TYPE.get(str(hparams.get("model_type")))
        if self.cls is None:
            raise NoVocab("tokenizer_config.json names no tokenizer_class and the model_type is not known")
        self.added = {idx: tok for idx, tok in self.tok.get_added_tokens_decoder().items()}
        self._check_config_tokens()
        self._check_template_class()
        self._check_bert_normalizer()

    def _check_config_tokens(self) -> None:
        """transformers adds to the tokenizer what tokenizer_config.json declares and
        tokenizer.json lacks (added_tokens_decoder entries, special tokens): not reproduced."""
        by_content = {tok.content for tok in self.added.values()}
        for idx, entry in (self.config.get("added_tokens_decoder") or {}).items():
            have = self.added.get(int(idx))
            same = have is not None and isinstance(entry, dict) and have.content == entry.get("content")
            if same:
                special = entry.get("special", False)
                same = all(getattr(have, flag) == entry.get(flag, default if flag != "normalized" else not special)
                           for flag, default in _ADDED_FLAGS)
            if not same:
                raise NoVocab(f"tokenizer_config.json's added token {idx} is not tokenizer.json's")
        specials = [_content(self.config.get(attr)) for attr in _SPECIAL_ATTRS]
        specials += [_content(e) for e in self.config.get("additional_special_tokens") or []]
        for content in specials:
            if content is not None and content not in by_content:
                raise NoVocab(f"special token {content!r} of tokenizer_config.json is not an added "
                              "token of tokenizer.json")

    def _check_template_class(self) -> None:
        base = self.cls.removesuffix("Fast")
        if base + "Fast" in _TEMPLATE_CLASSES and self.config.get("add_prefix_space") is not None:
            raise NoVocab(f"{self.cls} with add_prefix_space is rebuilt from its slow tokenizer: not supported")
        if base == "CodeLlamaTokenizer" or base == "CohereTokenizer":
            raise NoVocab(f"{self.cls} is not supported")

    def _check_bert_normalizer(self) -> None:
        if self.cls.removesuffix("Fast") != "BertTokenizer":
            return
        normalizer = self.json.get("normalizer") or {}
        if normalizer.get("type") != "BertNormalizer":
            raise NoVocab("a BertTokenizer whose tokenizer.json has no BertNormalizer is not supported")
        wanted = {"lowercase": self.config.get("do_lower_case", True),
                  "strip_accents": self.config.get("strip_accents"),
                  "handle_chinese_chars": self.config.get("tokenize_chinese_chars", True)}
        for key, value in wanted.items():
            if normalizer.get(key, value) != value:  # BertTokenizerFast.__init__ would rebuild it
                raise NoVocab(f"tokenizer_config.json's {key} differs from tokenizer.json's normalizer")

    def vocab(self) -> dict[str, int]:
        return dict(self.tok.get_vocab(with_added_tokens=True))

    def encode_with_specials(self, text: str) -> list[int]:
        defaults = _TEMPLATE_CLASSES.get(self.cls.removesuffix("Fast") + "Fast")
        if defaults is None:
            return list(self.tok.encode(text, add_special_tokens=True).ids)
        # update_post_processor: [bos] $A [eos] from add_bos_token/add_eos_token
        add_bos = self.config.get("add_bos_token", defaults[0])
        add_eos = self.config.get("add_eos_token", defaults[1])
        ids = list(self.tok.encode(text, add_special_tokens=False).ids)
        for add, attr, at in ((add_bos, "bos_token", 0), (add_eos, "eos_token", len(ids) + 1)):
            if add:
                content = _content(self.config.get(attr))
                token_id = self.tok.token_to_id(content) if content is not None else None
                if token_id is None:
                    raise NoVocab(f"add_{attr} is set but {attr} is not in the vocabulary")
                ids.insert(at, token_id)
        return ids

    def round_trip(self, token: str) -> str:
        """tokenizer.decode(tokenizer.encode(token, add_special_tokens=False)), transformers'."""
        ids = self.tok.encode(token, add_special_tokens=False).ids
        text = self.tok.decode(ids, skip_special_tokens=False)
        cleaned = _clean_up_tokenization(text)
        if cleaned != text:
            flag = self.config.get("clean_up_tokenization_spaces")
            if flag is None:
                raise NoVocab("clean_up_tokenization_spaces is unset and changes an added token")
            if flag:
                text = cleaned
        return text


def _clean_up_tokenization(out: str) -> str:
    """transformers' PreTrainedTokenizerBase.clean_up_tokenization."""
    return (out.replace(" .", ".").replace(" ?", "?").replace(" !", "!").replace(" ,", ",")
            .replace(" ' ", "'").replace(" n't", "n't").replace(" 'm", "'m").replace(" 's", "'s")
            .replace(" 've", "'ve").replace(" 're", "'re"))


def _does_token_look_special(token_text: str) -> bool:
    """TextModel.does_token_look_special."""
    seems_special = token_text in ("<pad>", "<mask>", "<2mass>", "[@BOS@]")
    seems_special = seems_special or (token_text.startswith("<|") and token_text.endswith("|>"))
    seems_special = seems_special or (token_text.startswith("<｜") and token_text.endswith("｜>"))
    seems_special = seems_special or (token_text.startswith("<unused") and token_text.endswith(">"))
    return seems_special


def _get_vocab_base(read: Reader, merged: Mapping[str, Any],
                    hparams: Mapping[str, Any]) -> tuple[list[str], list[int], str]:
    """TextModel.get_vocab_base: tokens, token types and the pre-tokenizer's name."""
    tokenizer = _HfTokenizer(read, hparams)
    vocab = tokenizer.vocab()
    vocab_size = merged.get("vocab_size", len(vocab))
    if not isinstance(vocab_size, int) or max(vocab.values()) >= vocab_size:
        raise NoVocab(f"config.json's vocab_size {vocab_size} is below the tokenizer's ids")
    chkhsh = sha256(str(tokenizer.encode_with_specials(CHKTXT)).encode()).hexdigest()
    pre = PRE_TOKENIZERS.get(chkhsh)
    if pre is None:
        raise NoVocab(f"the BPE pre-tokenizer is not one the converter recognises (chkhsh {chkhsh})")
    reverse = {id_: tok for tok, id_ in vocab.items()}
    added_vocab = {tok.content: idx for idx, tok in sorted(tokenizer.added.items())}
    tokens: list[str] = []
    toktypes: list[int] = []
    for i in range(vocab_size):
        if i not in reverse:
            tokens.append(f"[PAD{i}]")
            toktypes.append(TokenType.UNUSED)
            continue
        token = reverse[i]
        if token in added_vocab:
            added = tokenizer.added[i]
            if not added.normalized:
                token = tokenizer.round_trip(token)
            if added.special or _does_token_look_special(token):
                toktypes.append(TokenType.CONTROL)
            else:
                token = token.replace("\u2581", " ")
                toktypes.append(TokenType.USER_DEFINED)
        else:
            toktypes.append(TokenType.NORMAL)
        tokens.append(token)
    return tokens, [int(t) for t in toktypes], pre


def _set_vocab_gpt2(w: _Writer, read: Reader, hparams: Mapping[str, Any], merged: Mapping[str, Any]) -> None:
    tokens, toktypes, pre = _get_vocab_base(read, merged, hparams)
    w.string(Keys.Tokenizer.MODEL, "gpt2")
    w.string(Keys.Tokenizer.PRE, pre)
    w.add_array(Keys.Tokenizer.LIST, tokens, GGUFValueType.STRING)
    w.add_array(Keys.Tokenizer.TOKEN_TYPE, toktypes, GGUFValueType.INT32)
    _SpecialVocab(read, hparams, load_merges=True).add_to(w)


def _set_vocab_bert(w: _Writer, read: Reader, hparams: Mapping[str, Any], merged: Mapping[str, Any]) -> None:
    """bert.py's BertModel.set_vocab."""
    tokens, toktypes, pre = _get_vocab_base(read, merged, hparams)
    w.uint32(Keys.Tokenizer.TOKEN_TYPE_COUNT, merged.get("type_vocab_size", 1))

    def phantom(tok: str, toktype: int) -> str:
        if toktype == TokenType.CONTROL:
            return tok
        if tok.startswith("##"):
            return tok[2:]
        return "\u2581" + tok

    tokens = [phantom(t, ty) for t, ty in zip(tokens, toktypes)]
    w.string(Keys.Tokenizer.MODEL, "bert")
    w.string(Keys.Tokenizer.PRE, pre)
    w.add_array(Keys.Tokenizer.LIST, tokens, GGUFValueType.STRING)
    w.add_array(Keys.Tokenizer.TOKEN_TYPE, toktypes, GGUFValueType.INT32)
    _SpecialVocab(read, hparams, n_vocab=len(tokens)).add_to(w)


# -- SentencePiece --------------------------------------------------------------------------------

_NORMAL, _UNKNOWN, _CONTROL, _USER_DEFINED, _UNUSED, _BYTE = 1, 2, 3, 4, 5, 6


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if pos >= len(data) or shift > 63:
            raise NoVocab("tokenizer.model is not a SentencePiece model (a truncated varint)")
        b = data[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, pos
        shift += 7


def _protobuf_fields(data: bytes) -> list[tuple[int, int, Any]]:
    """The (field number, wire type, value) of one protobuf message: a varint's int, a
    length-delimited field's bytes, a fixed32's/fixed64's raw bytes."""
    fields = []
    pos = 0
    while pos < len(data):
        key, pos = _varint(data, pos)
        number, wire = key >> 3, key & 7
        value: Any
        if wire == 0:
            value, pos = _varint(data, pos)
        elif wire == 1:
            value, pos = data[pos:pos + 8], pos + 8
        elif wire == 2:
            length, pos = _varint(data, pos)
            value, pos = data[pos:pos + length], pos + length
        elif wire == 5:
            value, pos = data[pos:pos + 4], pos + 4
        else:
            raise NoVocab(f"tokenizer.model is not a SentencePiece model (wire type {wire})")
        if pos > len(data) or number == 0:
            raise NoVocab("tokenizer.model is not a SentencePiece model (truncated)")
        fields.append((number, wire, value))
    return fields


def sentencepiece_pieces(data: bytes) -> list[tuple[str, float, int]]:
    """The pieces of a SentencePiece ModelProto: (piece, score, type), type as sentencepiece's
    enum (1 normal, 2 unknown, 3 control, 4 user defined, 5 unused, 6 byte)."""
    pieces = []
    for number, wire, value in _protobuf_fields(data):
        if number != 1:
            continue
        if wire != 2:
            raise NoVocab("tokenizer.model is not a SentencePiece model")
        text, score, typ = None, 0.0, _NORMAL
        for n, w, v in _protobuf_fields(value):
            if n == 1 and w == 2:
                try:
                    text = v.decode("utf-8")
                except UnicodeDecodeError:
                    raise NoVocab("tokenizer.model has a piece that is not UTF-8") from None
            elif n == 2 and w == 5:
                score = struct.unpack("<f", v)[0]
            elif n == 3 and w == 0:
                typ = v
        if text is None or typ not in (_NORMAL, _UNKNOWN, _CONTROL, _USER_DEFINED, _UNUSED, _BYTE):
            raise NoVocab("tokenizer.model has a piece without text or of an unknown type")
        pieces.append((text, score, typ))
    if not pieces:
        raise NoVocab("tokenizer.model holds no pieces")
    if sum(1 for p in pieces if p[2] == _UNKNOWN) != 1:
        raise NoVocab("tokenizer.model does not define exactly one unknown piece")
    if len({p[0] for p in pieces}) != len(pieces):
        raise NoVocab("tokenizer.model has a piece twice")
    for text, _, typ in pieces:
        if typ == _BYTE and not re.fullmatch(r"<0x[0-9A-F]{2}>", text):
            raise NoVocab(f"tokenizer.model has a byte piece {text!r} that sentencepiece refuses")
    return pieces


def _create_vocab_sentencepiece(read: Reader, merged: Mapping[str, Any]) -> tuple[list[str], list[float], list[int]]:
    """TextModel._create_vocab_sentencepiece."""
    data = read("tokenizer.model")
    if data is None:
        raise NoVocab("no tokenizer.model")
    pieces = sentencepiece_pieces(data)
    vocab_size = None
    for key in ("vocab_size_per_layer_input", "vocab_size"):  # find_hparam: the first present
        if key in merged:
            vocab_size = merged[key]
            break
    vocab_size = vocab_size or len(pieces)
    if not isinstance(vocab_size, int) or vocab_size < 0:
        raise NoVocab(f"config.json's vocab_size {vocab_size!r} is not a count")
    tokens = [f"[PAD{i}]" for i in range(vocab_size)]
    scores = [-10000.0] * vocab_size
    toktypes = [_UNUSED] * vocab_size
    for token_id, (text, score, typ) in enumerate(pieces):
        if token_id >= vocab_size:
            break
        toktype = _NORMAL
        if typ == _UNKNOWN:
            toktype = _UNKNOWN
        elif typ == _CONTROL:
            toktype = _CONTROL
        elif typ == _UNUSED:
            toktype = _UNUSED
        elif typ == _BYTE:
            toktype = _BYTE
        tokens[token_id] = text
        scores[token_id] = score
        toktypes[token_id] = toktype
    added_tokens = _json(read, "added_tokens.json")
    if added_tokens is not None:
        for key in added_tokens:
            token_id = added_tokens[key]
            if token_id >= vocab_size:
                continue
            tokens[token_id] = key
            scores[token_id] = -1000.0
            toktypes[token_id] = _USER_DEFINED
    config = _json_object(read, "tokenizer_config.json")
    if config is not None:
        for token_id_text, token_data in config.get("added_tokens_decoder", {}).items():
            token_id = int(token_id_text)
            token = token_data["content"]
            if token_id >= vocab_size:
                continue
            if token_data.get("special") or _does_token_look_special(token):
                toktypes[token_id] = _CONTROL
            else:
                token = token.replace("\u2581", " ")
                toktypes[token_id] = _USER_DEFINED
            scores[token_id] = -1000.0
            tokens[token_id] = token
    return tokens, scores, toktypes


def _set_vocab_sentencepiece(w: _Writer, read: Reader, hparams: Mapping[str, Any], merged: Mapping[str, Any]) -> None:
    tokens, scores, toktypes = _create_vocab_sentencepiece(read, merged)
    w.string(Keys.Tokenizer.MODEL, "llama")
    w.string(Keys.Tokenizer.PRE, "default")
    w.add_array(Keys.Tokenizer.LIST, tokens, GGUFValueType.STRING)
    w.add_array(Keys.Tokenizer.SCORES, scores, GGUFValueType.FLOAT32)
    w.add_array(Keys.Tokenizer.TOKEN_TYPE, toktypes, GGUFValueType.INT32)
    _SpecialVocab(read, hparams, n_vocab=len(tokens)).add_to(w)


def gemma3_token_rows(read: Reader, hparams: Mapping[str, Any]) -> int:
    """The rows of token_embd the converter keeps for gemma3 (Gemma3Model.modify_tensors
    drops the others): the SentencePiece vocabulary's length, else tokenizer.json's
    vocabulary and added tokens."""
    merged = dict(hparams)
    if isinstance(hparams.get("text_config"), dict):
        merged = {**merged, **hparams["text_config"]}
    try:
        if read("tokenizer.model") is not None:
            return len(_create_vocab_sentencepiece(read, merged)[0])
        tokenizer = _json_object(read, "tokenizer.json")
        if tokenizer is None:
            raise NoVocab("no tokenizer.model and no tokenizer.json")
        return len(tokenizer["model"]["vocab"]) + len(tokenizer["added_tokens"])
    except (KeyError, TypeError, ValueError, AttributeError, IndexError) as e:
        raise NoVocab(f"the tokenizer files are malformed: {type(e).__name__}: {_one_line(e)}") from None


# -- gguf-py's SpecialVocab -----------------------------------------------------------------------

# the GGUFWriter methods add_{typ}_token_id and add_add_{typ}_token that exist: other types
# are skipped with a warning by SpecialVocab.add_to_gguf
_ID_KEYS = {"bos": Keys.Tokenizer.BOS_ID, "eos": Keys.Tokenizer.EOS_ID, "unk": Keys.Tokenizer.UNK_ID,
            "sep": Keys.Tokenizer.SEP_ID, "pad": Keys.Tokenizer.PAD_ID, "mask": Keys.Tokenizer.MASK_ID,
            "eot": Keys.Tokenizer.EOT_ID, "eom": Keys.Tokenizer.EOM_ID}
# newer than the gguf release on PyPI: the converter's vendored gguf-py has them
_NORMALIZER_LOWERCASE = "tokenizer.ggml.normalizer.lowercase"
_NORMALIZER_STRIP_ACCENTS = "tokenizer.ggml.normalizer.strip_accents"
_ADD_KEYS = {"bos": Keys.Tokenizer.ADD_BOS, "eos": Keys.Tokenizer.ADD_EOS, "sep": Keys.Tokenizer.ADD_SEP}


class _SpecialVocab:
    """gguf-py 0.19.0's SpecialVocab, reading through ``read``."""

    def __init__(self, read: Reader, config_json: Mapping[str, Any], load_merges: bool = False,
                 n_vocab: int | None = None) -> None:
        self.read = read
        self.special_token_ids: dict[str, int] = {}
        self.add_special_token: dict[str, bool] = {}
        self.n_vocab = n_vocab
        self.load_merges = load_merges
        self.merges: list[str] = []
        self.chat_template: Any = None
        self.normalizer_lowercase: bool | None = None
        self.normalizer_strip_accents: bool | None = None
        self.special_token_types: tuple[str, ...] = ("bos", "eos", "unk", "sep", "pad", "cls", "mask")
        self._try_load_from_tokenizer_json()
        self._try_load_from_config_json(config_json)
        if self.load_merges and not self.merges:
            self._try_load_merges_txt()

    def add_to(self, w: _Writer) -> None:
        if self.merges:
            w.add_array(Keys.Tokenizer.MERGES, self.merges, GGUFValueType.STRING)
        for typ, tokid in self.special_token_ids.items():
            if typ in _ID_KEYS:
                w.uint32(_ID_KEYS[typ], tokid)
        for typ, value in self.add_special_token.items():
            if typ in _ADD_KEYS:
                w.add(_ADD_KEYS[typ], GGUFValueType.BOOL, value)
        if self.chat_template is not None:
            _add_chat_template(w, self.chat_template)
        if self.normalizer_lowercase is not None:
            w.add(_NORMALIZER_LOWERCASE, GGUFValueType.BOOL, self.normalizer_lowercase)
        if self.normalizer_strip_accents is not None:
            w.add(_NORMALIZER_STRIP_ACCENTS, GGUFValueType.BOOL, self.normalizer_strip_accents)

    def _try_load_merges_txt(self) -> None:
        data = self.read("merges.txt")
        if data is None:
            return
        try:
            lines = data.decode("utf-8").splitlines()
        except UnicodeDecodeError:
            raise NoVocab("merges.txt is not UTF-8") from None
        if lines and lines[0].strip().startswith("#"):
            lines = lines[1:]
        merges = []
        for line in lines:
            line = line.strip()
            if not line:
                continue
            parts = line.split(None, 3)
            if len(parts) != 2:
                continue
            merges.append(f"{parts[0]} {parts[1]}")
        self.merges = merges

    def _set_special_token(self, typ: str, tid: Any) -> None:
        if not isinstance(tid, int):
            return
        if tid < 0:
            raise NoVocab(f"invalid value for special token type {typ}: {tid}")
        if self.n_vocab is None or tid < self.n_vocab:
            if typ in self.special_token_ids:
                return
            self.special_token_ids[typ] = tid

    def _parse_normalizer(self, normalizer: dict[str, Any]) -> None:
        normalizer_type = normalizer.get("type")
        if normalizer_type == "Lowercase":
            self.normalizer_lowercase = True
        elif normalizer_type == "StripAccents":
            self.normalizer_strip_accents = True
        elif normalizer_type == "BertNormalizer":
            if "lowercase" in normalizer:
                self.normalizer_lowercase = normalizer["lowercase"]
            if "strip_accents" in normalizer:
                self.normalizer_strip_accents = normalizer["strip_accents"]
        elif normalizer_type == "Sequence":
            for norm in normalizer.get("normalizers", []):
                self._parse_normalizer(norm)

    def _try_load_from_tokenizer_json(self) -> None:
        tokenizer = _json_object(self.read, "tokenizer.json")
        if tokenizer is not None:
            if self.load_merges:
                merges = tokenizer.get("model", {}).get("merges")
                if isinstance(merges, list) and merges:
                    if isinstance(merges[0], str):
                        self.merges = merges
                    elif isinstance(merges[0], list) and len(merges[0]) == 2 and isinstance(merges[0][0], str):
                        self.merges = [
                            " ".join("".join(chr(ord(c) + 256) if c == " " else c for c in part) for part in pair)
                            for pair in merges]
                    else:
                        raise NoVocab("Unknown tokenizer merges format")
            if normalizer := tokenizer.get("normalizer"):
                self._parse_normalizer(normalizer)
            added_tokens = tokenizer.get("added_tokens", {})
        else:
            added_tokens = {}
        # changed below as SpecialVocab changes its own copy
        tokenizer_config = copy.deepcopy(_json_object(self.read, "tokenizer_config.json"))
        if tokenizer:
            self._post_processor(tokenizer, tokenizer_config)
        if not tokenizer_config:
            return
        chat_template_alt: Any = None
        jinja = self.read("chat_template.jinja")
        if jinja is not None:
            try:
                chat_template_alt = jinja.decode("utf-8")
            except UnicodeDecodeError:
                raise NoVocab("chat_template.jinja is not UTF-8") from None
            # the converter also lists additional_chat_templates/*.jinja, which a read of
            # named files cannot: a directory with that folder is refused by the caller
        else:
            chat_json = _json(self.read, "chat_template.json")
            if chat_json is not None:
                chat_template_alt = chat_json.get("chat_template")
        chat_template = tokenizer_config.get("chat_template", chat_template_alt)
        if chat_template is None or isinstance(chat_template, (str, list)):
            self.chat_template = chat_template
        for typ in self.special_token_types:
            add_entry = tokenizer_config.get(f"add_{typ}_token")
            if isinstance(add_entry, bool):
                if typ not in self.add_special_token:
                    self.add_special_token[typ] = add_entry
            entry = tokenizer_config.get(f"{typ}_token")
            if isinstance(entry, str):
                tc_content = entry
            elif isinstance(entry, dict):
                entry_content = entry.get("content")
                if not isinstance(entry_content, str):
                    continue
                tc_content = entry_content
            else:
                continue
            maybe_token_id = next(
                (atok.get("id") for atok in added_tokens if atok.get("content") == tc_content), None)
            self._set_special_token(typ, maybe_token_id)

    def _post_processor(self, tokenizer: dict[str, Any], tokenizer_config: dict[str, Any] | None) -> None:
        special_bos = (tokenizer_config or {}).get("bos_token")
        special_cls = (tokenizer_config or {}).get("cls_token")
        special_eos = (tokenizer_config or {}).get("eos_token")
        special_sep = (tokenizer_config or {}).get("sep_token")
        if not special_bos and special_cls and tokenizer_config:
            tokenizer_config["bos_token"] = special_bos = special_cls
        if not special_eos and special_sep and tokenizer_config:
            tokenizer_config["eos_token"] = special_eos = special_sep
        post_processor = tokenizer.get("post_processor")
        if not post_processor:
            return
        for processor in post_processor.get("processors", [post_processor]):
            processor_type = processor.get("type")
            if processor_type == "ByteLevel":
                self.add_special_token.setdefault("bos", False)
                self.add_special_token.setdefault("eos", False)
            elif processor_type == "RobertaProcessing":
                self.add_special_token["bos"] = True
                self.add_special_token["eos"] = True
                self.add_special_token["sep"] = True
                if not special_cls and tokenizer_config:
                    special_cls = processor.get("cls", [special_bos])[0]
                    tokenizer_config["cls_token"] = special_cls
                if not special_sep and tokenizer_config:
                    special_sep = processor.get("sep", [special_eos])[0]
                    tokenizer_config["sep_token"] = special_sep
                continue
            elif processor_type == "TemplateProcessing":
                tmpl_single = processor.get("single", [])
                tmpl_pair = processor.get("pair", [])
                special_first = None
                special_last = None
                if len(tmpl_single) > 1:
                    if special_first := tmpl_single[0].get("SpecialToken", {}).get("id"):
                        if not tokenizer_config:
                            special_bos = special_first
                        elif special_first not in (special_bos, special_cls):
                            if not special_bos:
                                tokenizer_config["bos_token"] = special_bos = special_first
                            if not special_cls:
                                tokenizer_config["cls_token"] = special_cls = special_first
                        self.add_special_token["bos"] = special_first in (special_bos, special_cls)
                    if special_last := tmpl_single[-1].get("SpecialToken", {}).get("id"):
                        if not tokenizer_config:
                            special_eos = special_last
                        elif special_last != special_eos:
                            if "eot" not in self.special_token_types:
                                self.special_token_types = tuple(self.special_token_types) + ("eot",)
                                tokenizer_config["eot_token"] = special_eos
                            elif "eom" not in self.special_token_types:
                                self.special_token_types = tuple(self.special_token_types) + ("eom",)
                                tokenizer_config["eom_token"] = special_eos
                            tokenizer_config["eos_token"] = special_eos = special_last
                        self.add_special_token["eos"] = special_last == special_eos
                if tmpl_pair:
                    first_id = tmpl_pair[0].get("SpecialToken", {}).get("id")
                    last_id = tmpl_pair[-1].get("SpecialToken", {}).get("id")
                    seq_start = 1 if special_first and first_id == special_first else 0
                    seq_stop = -1 if special_last and last_id == special_last else None
                    if tmpl_pair := tmpl_pair[slice(seq_start, seq_stop)]:
                        tmpl_a = tmpl_pair[0].get("Sequence", {}).get("id")
                        tmpl_b = tmpl_pair[-1].get("Sequence", {}).get("id")
                        if tmpl_a == "A" and tmpl_b == "B" and (tmpl_pair := tmpl_pair[1:-1]):
                            add_sep = False
                            if special_entry := tmpl_pair[0].get("SpecialToken", {}).get("id"):
                                if special_entry in (special_sep, special_eos) and not special_last:
                                    add_sep = True
                            if len(tmpl_pair) == 2:
                                if special_entry := tmpl_pair[1].get("SpecialToken", {}).get("id"):
                                    if special_entry in (special_sep, special_eos):
                                        add_sep = True
                            self.add_special_token["sep"] = add_sep
                            if add_sep and not special_sep and tokenizer_config:
                                tokenizer_config["sep_token"] = special_eos
                continue

    def _try_load_from_config_json(self, config: Mapping[str, Any]) -> None:
        for typ in self.special_token_types:
            token_id = config.get(f"{typ}_token_id")
            if token_id is None and "text_config" in config:
                token_id = config["text_config"].get(f"{typ}_token_id")
            self._set_special_token(typ, token_id)


def _add_chat_template(w: _Writer, value: Any) -> None:
    """GGUFWriter.add_chat_template."""
    if not isinstance(value, str):
        template_default = None
        template_names: list[str] = []
        for choice in value:
            name = choice.get("name", "")
            template = choice.get("template")
            name = "".join(c if c.isascii() and c.isalnum() else "_" for c in name)
            if name and template is not None:
                if name == "default":
                    template_default = template
                else:
                    if name not in template_names:
                        template_names.append(name)
                    w.string(Keys.Tokenizer.CHAT_TEMPLATE_N.format(name=name), template)
        if template_names:
            if len(template_names) > 1:
                # the converter lists them from a set: their order changes from run to run
                raise NoVocab("several named chat templates: the converter's order of them is not reproducible")
            w.add_array(Keys.Tokenizer.CHAT_TEMPLATES, template_names, GGUFValueType.STRING)
        if template_default is None:
            return
        value = template_default
    w.string(Keys.Tokenizer.CHAT_TEMPLATE, value)
