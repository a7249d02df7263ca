"""The composed safetensors of a large PyTorch checkpoint (288 MiB), read whole through a
mount, with the daemon's memory bounded: nothing is copied whole, a tensor's bytes go from
the checkpoint to the reader one request at a time (issue 38)."""

from __future__ import annotations

import hashlib

import pytest

from tests.support import daemon_pid

pytestmark = pytest.mark.slow
torch = pytest.importorskip("torch")

MIB = 1 << 20
# What the daemon may hold at its peak beyond what it held once mounted: its read buffers,
# one 16 MiB non-contiguous tensor gathered whole, slack.  The model is 288 MiB.
GROWTH_BOUND = 64 * MIB


def _hwm(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        return int(next(line for line in f if line.startswith("VmHWM:")).split()[1]) * 1024


def _sha(path, chunk=8 * MIB) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def test_composed_file_of_a_large_checkpoint_reads_whole_in_bounded_memory(tmp_path, mount):
    torch.manual_seed(1)
    state = {f"layers.{i}.weight": torch.randn(4096, 4096) for i in range(4)}   # 4 x 64 MiB
    state["layers.4.weight"] = torch.randn(2048, 2048)                        # 16 MiB
    state["layers.4.weight_t"] = state["layers.4.weight"].t()                 # gathered
    state["head.weight"] = state["layers.0.weight"]                           # tied
    path = tmp_path / "big.pt"
    torch.save(state, path)
    # what safetensors' own writer makes of it (tied key dropped, views made contiguous)
    from safetensors.torch import save_file

    reference = tmp_path / "reference.safetensors"
    kept = {k: v.contiguous() for k, v in state.items() if k != "layers.0.weight"}
    kept["layers.4.weight_t"] = kept["layers.4.weight_t"].clone()
    save_file(kept, reference)
    del state, kept

    mnt = mount(path)
    pid = daemon_pid(mnt)
    before = _hwm(pid)
    served = mnt / "files" / "big.safetensors"
    assert served.stat().st_size >= 256 * MIB
    got = _sha(served)
    grown = _hwm(pid) - before
    assert grown < GROWTH_BOUND, f"the daemon grew by {grown / MIB:.0f} MiB"
    # the same tensors, byte for byte, as safetensors' writer puts them
    from safetensors import safe_open

    with safe_open(served, "pt") as ours, safe_open(reference, "pt") as theirs:
        assert sorted(ours.keys()) == sorted(theirs.keys())
        for key in theirs.keys():
            assert torch.equal(ours.get_tensor(key), theirs.get_tensor(key)), key
    assert got == _sha(served)                              # read again: the same bytes
    assert (mnt / "files" / "big.pt").stat().st_size == path.stat().st_size
