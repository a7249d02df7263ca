"""The PyTorch reader fuzzed in the suite, under ``fuzz.check.check_pytorch``'s contract: any
bytes give a model whose tensors lie inside the file (and whose composed safetensors reads
whole) or one ``PytorchError`` line; nothing else escapes, within the time and memory
bounds.  The seeds are checkpoints as torch.save lays them out, and real torch.save files."""

from __future__ import annotations

import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fuzz import check as fz

SEEDS = fz.pytorch_seeds()


def _torch_seeds() -> list[bytes]:
    torch = pytest.importorskip("torch")
    import io

    from tests.support.pytorch_models import tricky_state_dict

    out = []
    for protocol in (2, 3):          # the protocols torch.load(weights_only=True) reads
        buf = io.BytesIO()
        torch.save(tricky_state_dict(), buf, pickle_protocol=protocol)
        out.append(buf.getvalue())
    return out


def _settings(n: int) -> settings:
    return settings(max_examples=n, deadline=None, database=None,
                    suppress_health_check=[HealthCheck.too_slow])


def test_seeds_are_accepted():
    for seed in SEEDS + _torch_seeds():
        assert fz.check_pytorch(seed) == {"outcome": "model"}


@_settings(150)
@given(st.integers(0, 2**32 - 1))
def test_pickle_mutations(n):
    rng = random.Random(n)
    pool = SEEDS
    fz.check_pytorch(fz.mutate_pytorch(rng.choice(SEEDS), rng, pool))


@_settings(150)
@given(st.integers(0, 2**32 - 1))
def test_byte_mutations(n):
    rng = random.Random(n)
    fz.check_pytorch(fz.mutate_bytes(rng.choice(SEEDS), rng, SEEDS))


def test_real_checkpoint_mutations():
    seeds = _torch_seeds()
    rng = random.Random(38)
    for _ in range(60):
        fz.check_pytorch(fz.mutate_pytorch(rng.choice(seeds), rng, seeds))


@pytest.mark.parametrize("data", [
    b"PK\x03\x04", b"PK\x05\x06" + bytes(18), b"PK\x03\x04" + bytes(100) + b"PK\x05\x06" +
    b"\x00\x00\x00\x00\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\x00\x00",
])
def test_tiny_zips_claiming_everything(data):
    assert fz.check_pytorch(data)["outcome"] in ("zip", "pickle")


@_settings(150)
@given(st.integers(0, 2**32 - 1))
def test_spliced_pickles_and_zip_tricks(n):
    """What torch's weights-only reader meets (every opcode, globals on and off its list,
    rebuild arguments, huge integers) spliced into data.pkl, and the container given the
    tricks zip readers disagree on: one model or one line, never more."""
    rng = random.Random(n)
    seed = rng.choice(SEEDS)
    data = fz.mutate_pytorch(seed, rng, SEEDS) if rng.random() < 0.5 else \
        fz.zip_trick(seed, rng)
    fz.check_pytorch(data)


def test_mutants_tensorfs_serves_are_what_torch_loads():
    """Differential: real torch.save files, spliced and tricked; each one tensorfs serves,
    torch.load(weights_only=True) loads too, with the same values."""
    from tests.formats.test_pytorch_agrees import served_or_refused

    seeds = _torch_seeds()
    rng = random.Random(43)
    import tempfile
    from pathlib import Path

    served = 0
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(120):
            seed = rng.choice(seeds)
            data = fz.mutate_pytorch(seed, rng, seeds) if rng.random() < 0.7 else \
                fz.zip_trick(seed, rng)
            path = Path(tmp) / f"m{i}.pt"
            path.write_bytes(data)
            if served_or_refused(path) is None:
                served += 1
    assert served                        # some mutants stay valid checkpoints
