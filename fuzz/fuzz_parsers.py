"""Long-run, coverage-guided fuzzing of the parsers (GGUF, safetensors, PyTorch) with atheris
(libFuzzer for Python).

    make fuzz                                      # 300 s, corpus under build/fuzz/
    python fuzz/fuzz_parsers.py -max_total_time=600 [-jobs=2 -workers=2] [CORPUS_DIR ...]
    python fuzz/fuzz_parsers.py build/fuzz/artifacts/crash-...   # replay one finding

Every input goes through every parser and must satisfy ``fuzz.check`` (the contract of
issue 5: a model whose tensors lie inside the file, or the parser's own error; a prefix
grown as the loader grows it gives the same answer; memory linear in the input).  A
violation is an uncaught exception: libFuzzer stops and writes the input to
``build/fuzz/artifacts/``.  Keep each one in ``tests/regressions/`` (``tests/test_fuzz.py``
replays them all).

Mutations: libFuzzer's own (coverage-guided, with a dictionary of the formats' tokens and
boundary integers) half the time, and the structure-aware mutators of ``fuzz.check`` (GGUF
header fields set to boundary values, safetensors JSON headers mutated as JSON, a PyTorch
checkpoint's data.pkl mutated inside a rebuilt zip) the other half.  The seed corpus is the
valid files of the test suite (and checkpoints as torch.save lays them out) plus both
malformed corpora.

Hangs are libFuzzer's ``-timeout`` (default here 10 s per input: it owns SIGALRM, so the
per-input alarm of the suite is off); memory is the tracemalloc bound of ``fuzz.check``
(``TENSORFS_FUZZ_MEMORY=0`` turns it off for speed) and ``-rss_limit_mb`` (default 2048).
"""

from __future__ import annotations

import hashlib
import os
import random
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import atheris  # noqa: E402
import numpy  # noqa: E402,F401  (imported first so that only tensorfs is instrumented)

with atheris.instrument_imports(include=["tensorfs"]):
    import tensorfs.convert.plan
    import tensorfs.errors
    import tensorfs.formats.gguf
    import tensorfs.formats.pytorch
    import tensorfs.formats.safetensors
    import tensorfs.loading.checkpoints
    import tensorfs.mount.metadata_json
    import tensorfs.views.names  # noqa: F401

from fuzz import check  # noqa: E402

MEMORY = os.environ.get("TENSORFS_FUZZ_MEMORY", "1") != "0"
LAST = os.environ.get("TENSORFS_FUZZ_LAST")     # write each input here first (OOM hunting)
BUILD = os.path.join(ROOT, "build", "fuzz")

DICTIONARY = [b"GGUF", b"general.alignment", b"__metadata__", b'"dtype"', b'"shape"',
              b'"data_offsets"', b'"F32"', b'"BF16"', b'"U8"', b'"F4"', b'"F8_E4M3"',
              b"\\ud800", b"\\udc00", b"-0", b"1e400", b"NaN", b"[[[[", b"]]]]"]
DICTIONARY += [b"PK\x03\x04", b"PK\x01\x02", b"PK\x05\x06", b"ctorch\nFloatStorage\n",
               b"ctorch._utils\n_rebuild_tensor_v2\n", b"ccollections\nOrderedDict\n",
               b"PK\x06\x06", b"PK\x06\x07", b"ctorch\nUntypedStorage\n", b"\x95", b"\x93",
               b"X\x03\x00\x00\x00neg", b"X\x04\x00\x00\x00conj", b"\x8a\xff"]
DICTIONARY += [v.to_bytes(8, "little") for v in (2**31 - 1, 2**32 - 1, 2**63 - 1, 2**64 - 1)]
DICTIONARY += [str(v).encode() for v in (2**32 - 1, 2**63 - 1, 2**64 - 1, 2**64)]

_count = 0
_GGUF_SEEDS: list[bytes] = []
_ST_SEEDS: list[bytes] = []
_PT_SEEDS: list[bytes] = []


def test_one_input(data: bytes) -> None:
    if LAST:
        global _count
        _count += 1
        with open(f"{LAST}.{_count % 64}", "wb") as f:
            f.write(data)
    check.check_both(data, memory=MEMORY, seconds=None)


def custom_mutator(data: bytes, max_size: int, seed: int) -> bytes:
    rng = random.Random(seed)
    if rng.random() < 0.5:
        return atheris.Mutate(data, max_size)
    try:
        if data[:2] == b"PK" and rng.random() < 0.8:
            try:
                out = check.mutate_pytorch(data, rng, _PT_SEEDS)
            except Exception:             # not a readable zip: start from a seed
                out = check.mutate_pytorch(rng.choice(_PT_SEEDS), rng, _PT_SEEDS)
        elif data[:4] == b"GGUF" and rng.random() < 0.8:
            base = data if rng.random() < 0.5 else rng.choice(_GGUF_SEEDS)
            try:
                out = check.mutate_gguf(base, rng, _GGUF_SEEDS)
            except Exception:             # not a valid GGUF: no field map, mutate bytes
                out = check.mutate_bytes(data, rng, _GGUF_SEEDS, 1024)
        elif rng.random() < 0.8:
            try:
                out = check.mutate_safetensors(data, rng, _ST_SEEDS)
            except Exception:             # not parseable JSON: start from a seed
                out = check.mutate_safetensors(rng.choice(_ST_SEEDS), rng, _ST_SEEDS)
        else:
            out = check.mutate_bytes(data, rng, _GGUF_SEEDS + _ST_SEEDS, 1024)
    except Exception:
        return atheris.Mutate(data, max_size)
    return out[:max_size]


def _write_seed_corpus(directory: str) -> None:
    from tests.support import gguf_corpus, safetensors_corpus

    os.makedirs(directory, exist_ok=True)
    seeds = _GGUF_SEEDS + _ST_SEEDS + _PT_SEEDS
    seeds += [d for _, d in gguf_corpus.MALFORMED if len(d) < 65536]
    seeds += [d for _, d in safetensors_corpus.MALFORMED if len(d) < 65536]
    for data in seeds:
        name = hashlib.sha1(data).hexdigest()
        path = os.path.join(directory, name)
        if not os.path.exists(path):
            with open(path, "wb") as f:
                f.write(data)


def _write_dictionary(path: str) -> None:
    with open(path, "w") as f:
        for token in DICTIONARY:
            f.write('"' + "".join(f"\\x{b:02x}" for b in token) + '"\n')


def main(argv: list[str]) -> None:
    _GGUF_SEEDS.extend(check.gguf_seeds())
    _ST_SEEDS.extend(check.safetensors_seeds())
    _PT_SEEDS.extend(check.pytorch_seeds())
    args = list(argv)
    flags = [a for a in args[1:] if a.startswith("-")]
    paths = [a for a in args[1:] if not a.startswith("-")]
    replay = paths and all(os.path.isfile(p) for p in paths)
    if not replay:
        os.makedirs(os.path.join(BUILD, "artifacts"), exist_ok=True)
        if not paths:
            corpus = os.path.join(BUILD, "corpus")
            _write_seed_corpus(corpus)
            args.append(corpus)
        for path in paths:                 # an empty corpus directory starts from the seeds
            if os.path.isdir(path) and not os.listdir(path):
                _write_seed_corpus(path)
        dictionary = os.path.join(BUILD, "parsers.dict")
        _write_dictionary(dictionary)
        defaults = {"-timeout": "10", "-rss_limit_mb": "2048", "-max_len": "65536",
                    "-dict": dictionary,
                    "-artifact_prefix": os.path.join(BUILD, "artifacts") + os.sep}
        for flag, value in defaults.items():
            if not any(f.startswith(flag + "=") for f in flags):
                args.insert(1, f"{flag}={value}")
    atheris.Setup(args, test_one_input, custom_mutator=custom_mutator)
    atheris.Fuzz()


if __name__ == "__main__":
    main(sys.argv)
