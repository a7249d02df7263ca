"""PyTorch checkpoints over https:// (plain HTTP here) and hf:// (the Hub's layout), served by a
real nginx (issue 38): the tree holds torch.load's values, files/ the checkpoint unchanged and
the safetensors composed from it; a hostile pickle is refused in one line."""

from __future__ import annotations

import os

import pytest

from tests.support import mount_expecting_refusal, mounts_in
from tests.support.pytorch_models import tricky_state_dict, write_transformers_bin
from tests.support.servers import HubRepo, Nginx

torch = pytest.importorskip("torch")
safetensors_torch = pytest.importorskip("safetensors.torch")


def _bytes(t) -> bytes:
    t = t.detach().contiguous().reshape(-1)
    return t.view(torch.uint8).numpy().tobytes() if t.numel() else b""


@pytest.fixture
def served(tmp_path):
    """An nginx of this test's own: /files/ckpt.pt, /files/repo/* (a sharded checkpoint
    directory) and hf repo tfs/pt (the same directory)."""
    ckpt = tmp_path / "ckpt.pt"
    torch.save(tricky_state_dict(), ckpt)
    repo_dir = write_transformers_bin(tmp_path / "repo", shards=2)
    repo = HubRepo("tfs/pt")
    repo.commit({p.name: p for p in sorted(repo_dir.iterdir())})
    server = Nginx(tmp_path / "nginx", [repo])
    server.put("files/ckpt.pt", ckpt)
    server.put("files/hostile.pt", _hostile(tmp_path, ckpt))
    for p in sorted(repo_dir.iterdir()):
        server.put(f"files/repo/{p.name}", p)
    server.start()
    yield server, ckpt, repo_dir
    server.stop()


def _hostile(tmp_path, valid):
    import zipfile

    from tests.support.pytorch_models import rewrite_entries

    evil = b"\x80\x02cos\nsystem\nX\x04\x00\x00\x00true\x85R."
    return rewrite_entries(valid, tmp_path / "hostile.pt",
                           lambda n, d: (n, evil if n.endswith("/data.pkl") else d,
                                         zipfile.ZIP_STORED))


@pytest.fixture
def env(served, tmp_path) -> dict[str, str]:
    """What a user sets: HF_ENDPOINT at this nginx, a private HF_HOME, no token."""
    out = {k: v for k, v in os.environ.items()
           if not k.startswith(("HF_", "HUGGING_FACE_", "AWS_"))}
    out.update({"HF_ENDPOINT": served[0].url, "HF_HOME": str(tmp_path / "hf-home"),
                "HF_HUB_DISABLE_TELEMETRY": "1", "HF_HUB_DISABLE_IMPLICIT_TOKEN": "1"})
    return out


@pytest.fixture
def rmount(tmp_path, env):
    yield from mounts_in(tmp_path, "rmnt", env)


def test_a_checkpoint_over_http(served, rmount):
    server, ckpt, _ = served
    mnt = rmount(f"{server.url}/files/ckpt.pt")
    expected = torch.load(ckpt, weights_only=True)
    for name, t in expected.items():
        assert mnt.joinpath(*name.split(".")).read_bytes() == _bytes(t), name
    assert (mnt / "files" / "ckpt.pt").read_bytes() == ckpt.read_bytes()
    composed = safetensors_torch.load(mnt.joinpath("files", "ckpt.safetensors").read_bytes())
    for name, t in composed.items():
        assert _bytes(t) == _bytes(expected[name]), name


@pytest.mark.parametrize("how", ["index", "hf"])
def test_sharded_checkpoint_over_http_and_hf(served, rmount, how):
    server, _, repo_dir = served
    url = (f"{server.url}/files/repo/pytorch_model.bin.index.json" if how == "index"
           else "hf://tfs/pt")
    mnt = rmount(url)
    names = set(os.listdir(mnt / "files"))
    assert {"model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors",
            "model.safetensors.index.json", "pytorch_model.bin.index.json"} <= names
    loaded = {}
    for n in ("model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"):
        loaded.update(safetensors_torch.load((mnt / "files" / n).read_bytes()))
    for shard in sorted(repo_dir.glob("pytorch_model-*.bin")):
        assert (mnt / "files" / shard.name).read_bytes() == shard.read_bytes()
        for key, t in torch.load(shard, weights_only=True).items():
            assert torch.equal(loaded[key], t), key


def test_a_hostile_checkpoint_over_http_is_refused(served, tmp_path, env):
    server, _, _ = served
    mnt = tmp_path / "hostile-mnt"
    mnt.mkdir()
    result, mounted = mount_expecting_refusal(f"{server.url}/files/hostile.pt", mnt,
                                              env=env)
    assert result.returncode != 0 and not mounted
    assert len(result.stderr.splitlines()) == 1
    assert "forbidden global os.system at byte 2" in result.stderr
