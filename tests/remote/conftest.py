"""Fixtures of the remote tests (docs/reference/remote.md): the models, written by the reference writers, served
by a real nginx (plain HTTP and the Hugging Face Hub's layout) and by moto's S3 server, all
started here for the session on 127.0.0.1 and stopped at its end; ``rmount`` mounts a URL
through the real ``tensorfs`` command with the endpoints in its environment."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest

from tests.support import mounts_in
from tests.support.hostile import Hostile
from tests.support.remote_checks import HF_TOKEN, Corpus, Model
from tests.support.servers import HubRepo, MotoServer, Nginx, Proxy

REMOTE_LIBS = ("obstore", "fsspec", "s3fs", "huggingface_hub")
MISSING = [m for m in REMOTE_LIBS if importlib.util.find_spec(m) is None]
SKIP_REASON = (f"the remote extra is not installed (missing {', '.join(MISSING)}): "
               "pip install -e '.[remote]' (make test installs it)")



# the receivers of a mount's http(s) reads (docs/internals/receive.md): a test
# marked ``receivers`` runs once with each, the others with the default
RECEIVERS = ["http.client", "obstore"]


def pytest_generate_tests(metafunc):
    if metafunc.definition.get_closest_marker("receivers") and "receiver" in metafunc.fixturenames:
        metafunc.parametrize("receiver", RECEIVERS, indirect=True)


@pytest.fixture
def receiver(request) -> str | None:
    """The receiver a ``receivers`` test runs with (None: the default)."""
    return getattr(request, "param", None)


def pytest_collection_modifyitems(config, items):
    if not MISSING:
        return
    here = Path(__file__).parent
    for item in items:
        if here in Path(item.fspath).parents:
            item.add_marker(pytest.mark.skip(reason=SKIP_REASON))


# -- the models -----------------------------------------------------------------------------

def _write_corpus(root: Path) -> Corpus:
    import numpy as np
    from safetensors.numpy import save_file

    from tests.support.models import write_gguf, write_safetensors
    from tests.support.reliability_models import write_mixed_gguf
    from tests.support.shards import INDEX, write_hf_shards, write_split_gguf

    models = {}
    d = root / "single"
    d.mkdir(parents=True)
    write_safetensors(d / "model.safetensors")
    (d / "config.json").write_text('{"model_type": "test"}')
    models["safetensors"] = Model([d / "model.safetensors"], "model.safetensors")

    d = root / "gguf"
    d.mkdir()
    write_gguf(d / "model.gguf", big_endian=False)
    models["gguf"] = Model([d / "model.gguf"], "model.gguf")

    d = root / "mixed"
    d.mkdir()
    expected = write_mixed_gguf(d / "mixed.gguf", seed=3)
    models["mixed"] = Model([d / "mixed.gguf"], "mixed.gguf", expected)

    index, _, weight_map = write_hf_shards(root / "sharded")
    (root / "sharded" / "config.json").write_text('{"model_type": "test"}')
    models["sharded"] = Model([index] + [index.parent / s for s in sorted(set(weight_map.values()))],
                              INDEX)

    files, _ = write_split_gguf(root / "split")
    models["split"] = Model(files, files[0].name)

    # several blocks, whatever the block size: a 9 MiB + 1 byte tensor between small ones
    d = root / "big"
    d.mkdir()
    rng = np.random.default_rng(7)
    save_file({"a.small": rng.standard_normal(5).astype(np.float32),
               "b.big": rng.integers(0, 255, (9 << 20) + 1, dtype=np.uint8),
               "c.mid": rng.standard_normal((300, 1000)).astype(np.float32),
               "d.tiny": np.arange(3, dtype=np.int16)}, str(d / "big.safetensors"))
    models["big"] = Model([d / "big.safetensors"], "big.safetensors")
    for key, model in models.items():
        (model.folder / "README.md").write_text(f"# {key}\n")
    return Corpus(root, models)


def folder_files(model: Model) -> dict[str, Path]:
    """Every regular file of the model's folder: a repo or prefix holds what the local
    directory does, so that their mounts' files/ agree (docs/internals/design.md)."""
    return {p.name: p for p in sorted(model.folder.iterdir()) if p.is_file()}


@pytest.fixture(scope="session")
def corpus(tmp_path_factory) -> Corpus:
    return _write_corpus(tmp_path_factory.mktemp("corpus"))


def hub_repos(corpus: Corpus) -> dict[str, HubRepo]:
    """One repo per model (repo-as-directory needs one model per repo), plus a gated one."""
    repos = {}
    for key, model in corpus.models.items():
        repo = HubRepo(f"tfs/{key}")
        repo.commit(folder_files(model))
        repos[key] = repo
    gated = HubRepo("tfs/gated", token=HF_TOKEN)
    gated.commit({"model.safetensors": corpus.models["safetensors"].local})
    repos["gated"] = gated
    return repos


def publish_files(server: Nginx, corpus: Corpus) -> None:
    """Every model under /files/KEY/ and /norange/KEY/."""
    for key, model in corpus.models.items():
        for path in model.files:
            server.put(f"files/{key}/{path.name}", path)
            server.put(f"norange/{key}/{path.name}", path)


@pytest.fixture(scope="session")
def nginx(corpus, tmp_path_factory):
    """The session's nginx: read-only tests only (a test that changes what is served or stops
    the server starts its own with ``fresh_nginx``)."""
    repos = hub_repos(corpus)
    server = Nginx(tmp_path_factory.mktemp("nginx"), list(repos.values()))
    publish_files(server, corpus)
    server.start()
    server.hub = repos
    yield server
    server.stop()


@pytest.fixture
def fresh_nginx(corpus, tmp_path):
    """fresh_nginx(repos=(), tls=None) -> an nginx of this test's own, serving the corpus
    under /files/ (``tls``: (certificate, key) to serve https); stopped at the end."""
    servers = []

    def _start(repos=(), tls=None) -> Nginx:
        server = Nginx(tmp_path / f"nginx{len(servers)}", list(repos), tls=tls)
        publish_files(server, corpus)
        servers.append(server)
        return server.start()

    yield _start
    for server in servers:
        server.stop()


@pytest.fixture(scope="session")
def moto(tmp_path_factory):
    server = MotoServer(tmp_path_factory.mktemp("moto")).start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def s3(moto, corpus):
    """Bucket ``models``: every model under KEY/; bucket ``versioned`` (versioning on) is left to
    the tests that replace objects."""
    fs = moto.s3fs()
    fs.mkdir("models")
    for key, model in corpus.models.items():
        for path in folder_files(model).values():
            fs.put_file(str(path), f"models/{key}/{path.name}")
    fs.mkdir("versioned")
    fs.make_bucket_versioned("versioned")
    return fs


@pytest.fixture
def proxy():
    """proxy(upstream_port, **kw) -> a started Proxy; all stopped at the end."""
    started = []

    def _start(port: int, **kw) -> Proxy:
        p = Proxy(port, **kw).start()
        started.append(p)
        return p

    yield _start
    for p in started:
        p.stop()


# -- running tensorfs against them ------------------------------------------------------------

@pytest.fixture
def remote_env(nginx, moto, tmp_path, receiver) -> dict[str, str]:
    """The environment a user would set: HF_ENDPOINT at nginx, the AWS endpoint at moto; a
    private HF_HOME (no token saved on this machine reaches the tests), no HF_TOKEN; the
    receiver of http(s) reads a ``receivers`` test runs with."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("HF_", "HUGGING_FACE_", "AWS_"))}
    if receiver is not None:
        env["TENSORFS_HTTP_TRANSPORT"] = receiver
    env.update(moto.env())
    env.update({"HF_ENDPOINT": nginx.url, "HF_HOME": str(tmp_path / "hf-home"),
                "HF_HUB_DISABLE_TELEMETRY": "1", "HF_HUB_DISABLE_IMPLICIT_TOKEN": "1"})
    return env


@pytest.fixture
def rmount(tmp_path, remote_env, mount):       # after `mount`: torn down before it
    """rmount(url, *options, env=None, name=None) -> mount point, mounted by the real command
    with ``remote_env`` updated by ``env`` (None: removed); everything mounted is unmounted
    afterwards."""
    yield from mounts_in(tmp_path, "rmnt", remote_env)


@pytest.fixture
def hostile():
    started = []

    def _start(answer, tls=None) -> Hostile:
        server = Hostile(answer, tls)
        started.append(server)
        return server

    yield _start
    for server in started:
        server.stop()
