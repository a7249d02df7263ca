"""``--cache-size`` is what a mount's caches hold at most, together (tensorfs.budget,
docs/reference/limits.md): the stream store of sequential readers' converted chunks is carved
out of it, not added to it.  Checked by the caches' own counters, sampled while threads read
several tensors of one mount at once — raw files, converted .npy views, read sequentially and
at random, and metadata.json — each byte compared with the oracle's; for a local model and
for the same model served by a real nginx (its fetched blocks share the budget)."""

from __future__ import annotations

import importlib.util
import random
import threading
import time

import pytest

from tests.support.reliability_models import npy_bytes, write_mixed_gguf

pytestmark = pytest.mark.slow       # a few seconds of readers per case

MiB = 1 << 20
READERS = 6
DURATION_S = 3.0
REMOTE = pytest.mark.skipif(importlib.util.find_spec("obstore") is None,
                            reason="the remote extra is not installed")


@pytest.fixture(scope="module")
def model_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("budget") / "model.gguf"
    expected = write_mixed_gguf(path, scale=8)     # 43 MiB of .npy views, 27 MiB of them costly
    return path, expected


@pytest.fixture(scope="module")
def nginx(tmp_path_factory, model_file):
    from tests.support.servers import Nginx

    server = Nginx(tmp_path_factory.mktemp("budget-srv")).start()
    server.put("files/model.gguf", model_file[0])
    yield server
    server.stop()


def _files(mounted, expected) -> dict:
    """path in the mount -> (view, the bytes it must serve)."""
    files = {}
    for t in expected.values():
        path = "/" + t.name.replace(".", "/")
        files[path] = (mounted.tree.lookup(path).view, t.raw)
        files[path + ".npy"] = (mounted.tree.lookup(path + ".npy").view, npy_bytes(t.values))
    meta = mounted.tree.lookup("/metadata.json").view
    files["/metadata.json"] = (meta, meta.read(0, meta.size))
    return files


def _reader(index: int, files: dict, deadline: float, problems: list) -> None:
    rng = random.Random(index)
    names = sorted(files)
    while time.monotonic() < deadline and not problems:
        name = rng.choice(names)
        view, want = files[name]
        if rng.random() < 0.4:              # a sequential reader: the stream store
            start = rng.randrange(len(want)) // (128 << 10) * (128 << 10)
            reads = [(pos, 128 << 10) for pos in range(start, min(len(want), start + 4 * MiB),
                                                        128 << 10)]
        else:                               # a random one: the shared LRU
            reads = [(rng.randrange(len(want)), rng.randint(1, 2 * MiB))]
        for offset, size in reads:
            got = view.read(offset, size)
            if got != want[offset:offset + size]:
                problems.append((name, offset, size))
                return


def _held(budget, also=None) -> int:
    """What the budget's caches (and ``also``) hold now, by their own counters."""
    stores = {id(store): store for store in (budget.cache, budget.stream, also) if store}
    return sum(store.current_bytes for store in stores.values())


def _read_and_sample(budget, files: dict, also=None) -> int:
    """The most the caches held at once while the readers ran."""
    problems: list = []
    deadline = time.monotonic() + DURATION_S
    threads = [threading.Thread(target=_reader, args=(i, files, deadline, problems))
               for i in range(READERS)]
    for t in threads:
        t.start()
    peak = 0
    while any(t.is_alive() for t in threads):
        peak = max(peak, _held(budget, also))
        time.sleep(0.001)
    for t in threads:
        t.join()
    assert not problems, problems[:3]
    return max(peak, _held(budget, also))


def _check(model, budget, expected) -> None:
    from tensorfs.mount.tree import build_mount

    size = budget.total_bytes
    mounted = build_mount(model, budget, workers=0)
    try:
        peak = _read_and_sample(budget, _files(mounted, expected))
    finally:
        mounted.close()
    # the caches were used: the bound is not met by holding nothing
    assert peak > size // 2, (peak, size)
    assert peak <= size, f"the caches held {peak / MiB:.1f} MiB with --cache-size {size / MiB:.0f} MiB"
    assert budget.held_bytes <= size        # what the worker pool's arena is sized for


def _budget(size: int):
    from tensorfs.budget import MemoryBudget

    return MemoryBudget(size)


@pytest.mark.parametrize("size", [8 * MiB, 24 * MiB])
def test_a_local_mounts_caches_hold_at_most_the_cache_size_under_concurrent_readers(model_file, size):
    from tensorfs.loading.loader import load_model

    path, expected = model_file
    model = load_model(str(path), None)
    _check(model, _budget(size), expected)


@REMOTE
@pytest.mark.parametrize("size", [8 * MiB, 24 * MiB])
def test_a_remote_mounts_caches_and_blocks_hold_at_most_the_cache_size(model_file, nginx, size):
    """The fetched blocks share the budget with the converted chunks."""
    from tensorfs.loading.loader import load_model
    from tensorfs.sources.remote import RemoteSettings

    _, expected = model_file
    budget = _budget(size)
    model = load_model(f"{nginx.url}/files/model.gguf", RemoteSettings(cache=budget.cache))
    _check(model, budget, expected)


def test_a_checkpoints_gathered_tensors_are_kept_within_the_cache_size(tmp_path):
    """A PyTorch checkpoint's transposed matrices are gathered whole at their first read and
    kept: in the mount's cache (a quarter of it at most per tensor), not in a store of their
    own beside it.  Six of 3 MiB read at once under --cache-size 16M: what every cache holds,
    the process's store of gathered tensors included, stays within it."""
    torch = pytest.importorskip("torch")
    from tensorfs.loading import checkpoints
    from tensorfs.loading.loader import load_model

    torch.manual_seed(0)
    state = {f"layers.{i}.weight": torch.randn(1024, 768).t() for i in range(6)}
    path = tmp_path / "pytorch_model.bin"
    torch.save(state, path)
    expected = {name: t.contiguous().numpy().tobytes() for name, t in state.items()}
    size = 16 * MiB
    budget = _budget(size)
    from tensorfs.mount.tree import build_mount

    model = load_model(str(path), None, budget.cache)
    mounted = build_mount(model, budget, workers=0)
    try:
        files = {"/" + n.replace(".", "/"): (mounted.tree.lookup("/" + n.replace(".", "/")).view, b)
                 for n, b in expected.items()}
        held = _read_and_sample(budget, files, also=checkpoints._GATHERED)
    finally:
        mounted.close()
    assert held > size // 2, held
    assert held <= size, f"the caches held {held / MiB:.1f} MiB with --cache-size {size / MiB:.0f} MiB"
