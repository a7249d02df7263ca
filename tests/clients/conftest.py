"""Fixtures of the real-client tests (issue 24): the tiny models of tests/support/tiny_models.py,
written once per session, served by a real nginx on 127.0.0.1 (plain HTTP and the Hugging Face
Hub's layout, tests/support/servers.py), and ``model_mount(where, key)`` that mounts one of them through
the real ``tensorfs`` command from a local path, an http:// URL or an hf:// repo."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest

from tests.support import mounts_in

CLIENT_LIBS = ("llama_cpp", "torch", "transformers")
REMOTE_LIBS = ("fsspec", "aiohttp", "huggingface_hub")


def missing(modules) -> list[str]:
    return [m for m in modules if importlib.util.find_spec(m) is None]


def need(*modules: str) -> None:
    """Skip, naming the make target, where a client is not installed (`make test` installs
    them all, so there they run)."""
    gone = missing(modules)
    if gone:
        pytest.skip(f"not installed: {', '.join(gone)} (make clients-venv installs the real "
                    "clients: requirements-clients.txt)")


GGUF_TYPES = ("F16", "Q8_0")
KEYS = tuple(f"gguf-{q}" for q in GGUF_TYPES) + ("hf", "hf-sharded")


class Tiny:
    """The session's tiny models, each written on first use (the GGUF tests need no torch):
    gguf-F16, gguf-Q8_0: one file each; hf: a transformers directory with one
    model.safetensors; hf-sharded: the same model in shards with an index.  A mount of a local
    path or of an hf:// repo names the model's directory (a GGUF: its file); over plain HTTP,
    which has no listing, the model file or the index is named."""

    def __init__(self, root: Path):
        self.root = root
        self._files: dict[str, list[Path]] = {}

    def files(self, key: str) -> list[Path]:
        """The model's files, the first being what a mount names."""
        if key not in self._files:
            self._files[key] = self._write(key)
        return self._files[key]

    def local(self, key: str) -> Path:
        return self.files(key)[0]

    def _write(self, key: str) -> list[Path]:
        from tests.support.tiny_models import write_llama_gguf, write_transformers_model

        d = self.root / key
        if key.startswith("gguf-"):
            d.mkdir()
            qtype = key.removeprefix("gguf-")
            return [write_llama_gguf(d / f"tiny-{qtype}.gguf", qtype)]
        need("torch", "transformers")
        os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
        sharded = key == "hf-sharded"
        write_transformers_model(d, "100KB" if sharded else None)
        named = d / ("model.safetensors.index.json" if sharded else "model.safetensors")
        return [named] + sorted(p for p in d.iterdir() if p != named)


@pytest.fixture(scope="session")
def tiny(tmp_path_factory) -> Tiny:
    return Tiny(tmp_path_factory.mktemp("tiny"))


@pytest.fixture(scope="session")
def tiny_server(tiny, tmp_path_factory):
    """nginx serving every tiny model under /files/KEY/ and as the Hub repo tiny/KEY (those
    of transformers only where it is installed)."""
    gone = missing(REMOTE_LIBS)
    if gone:
        pytest.skip(f"the remote extra is not installed (missing {', '.join(gone)})")
    from tests.support.servers import HubRepo, Nginx

    gone = missing(CLIENT_LIBS[1:])
    keys = [k for k in KEYS if k.startswith("gguf-") or not gone]
    repos = []
    for key in keys:
        repo = HubRepo(f"tiny/{key}")
        repo.commit({p.name: p for p in tiny.files(key)})
        repos.append(repo)
    server = Nginx(tmp_path_factory.mktemp("tiny-nginx"), repos)
    for key in keys:
        for p in tiny.files(key):
            server.put(f"files/{key}/{p.name}", p)
    server.start()
    yield server
    server.stop()


WHERE = ("local", "http", "hf")


@pytest.fixture
def model_mount(request, tiny, tmp_path, mount):       # after `mount`: torn down before it
    """model_mount(where, key) -> mount point of tiny model ``key`` read from ``where``:
    local (its directory, or its file for a GGUF), http (the URL of its file or index) or
    hf (the repo tiny/KEY, as a directory)."""
    state = {}

    def _mount(where: str, key: str) -> Path:
        if where == "local":
            source = tiny.local(key).parent if key.startswith("hf") else tiny.local(key)
            return mount(source)
        server = request.getfixturevalue("tiny_server")
        if "remote" not in state:
            env = {k: v for k, v in os.environ.items()
                   if not k.startswith(("HF_", "HUGGING_FACE_", "AWS_"))}
            env.update({"HF_ENDPOINT": server.url, "HF_HOME": str(tmp_path / "hf-home"),
                        "HF_HUB_DISABLE_TELEMETRY": "1", "HF_HUB_DISABLE_IMPLICIT_TOKEN": "1"})
            state["remote"] = mounts_in(tmp_path, "rmnt", env)
            state["mount"] = next(state["remote"])
        if where == "http":
            return state["mount"](f"{server.url}/files/{key}/{tiny.local(key).name}")
        return state["mount"](f"hf://tiny/{key}")

    yield _mount
    if "remote" in state:
        for _ in state["remote"]:       # the generator's teardown: unmount, check
            pass
