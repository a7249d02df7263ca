"""The guide pages (docs/guide/) run as written: each ```sh or ```python block of a page is
marked ``<!-- run -->`` (run here, in order, as one script in a fresh shell) or
``<!-- not run: WHY -->`` (shown only: it needs what a test cannot have, such as the Hub or the
llama-cli program; the page runs an equivalent beside it).  The shell starts in an empty
directory holding ``examples/`` (the checkout's, for the bundled sample), with the tiny models
and servers a page's setup below provides; what it mounted is unmounted afterwards."""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.support import RUNTIME_DIR, fuse_mounts_under

ROOT = Path(__file__).resolve().parents[2]
GUIDE = ROOT / "docs" / "guide"
BLOCK = re.compile(r"(?:<!--\s*(run|not run)\b([^>]*)-->\s*\n)?```(\w*)\n(.*?)^```", re.DOTALL | re.MULTILINE)
RUNNABLE = {"sh", "bash", "python"}


def blocks(text: str) -> list[tuple[str | None, str, str, str]]:
    """(mark, why, language, body) of each fenced block of a page, in order."""
    return [(m.group(1), (m.group(2) or "").strip(" :"), m.group(3), m.group(4))
            for m in BLOCK.finditer(text)]


def script(text: str) -> str:
    parts = []
    for mark, _, language, body in blocks(text):
        if mark != "run":
            continue
        if language == "python":
            body = f"python - <<'PYTHON'\n{body}PYTHON\n"
        parts.append(body)
    return "\n".join(parts)


# -- what each page's shell finds besides examples/ ------------------------------------------

Setup = Callable[[Path, dict], contextlib.AbstractContextManager]


@contextlib.contextmanager
def _nothing(work: Path, env: dict) -> Iterator[None]:
    yield


def _sample(work: Path) -> Path:
    path = work.parent / "served" / "sample.gguf"
    path.parent.mkdir(exist_ok=True)
    subprocess.run([sys.executable, str(ROOT / "examples" / "make_sample.py"), str(path)],
                   check=True, capture_output=True)
    return path


@contextlib.contextmanager
def _server(work: Path, env: dict) -> Iterator[None]:
    """An HTTP server answering range requests (nginx), serving the bundled sample as
    $URL; the same file as the Hub repo example/sample, through HF_ENDPOINT."""
    pytest.importorskip("obstore")
    from tests.support.servers import HubRepo, Nginx

    sample = _sample(work)
    repo = HubRepo("example/sample")
    repo.commit({"sample.gguf": sample})
    server = Nginx(work.parent / "nginx", [repo])
    server.put("files/sample.gguf", sample)
    server.start()
    try:
        env.update({"URL": f"{server.url}/files/sample.gguf", "HF_ENDPOINT": server.url,
                    "HF_HOME": str(work.parent / "hf-home"), "HF_HUB_DISABLE_TELEMETRY": "1",
                    "HF_HUB_DISABLE_IMPLICIT_TOKEN": "1"})
        yield
    finally:
        server.stop()


@contextlib.contextmanager
def _clients(work: Path, env: dict) -> Iterator[None]:
    """model.gguf: a tiny llama llama.cpp runs; tiny-llama/: the same shape saved by
    transformers (config.json, model.safetensors)."""
    pytest.importorskip("llama_cpp")
    pytest.importorskip("transformers")
    pytest.importorskip("torch")
    from tests.support.tiny_models import write_llama_gguf, write_transformers_model

    write_llama_gguf(work / "model.gguf", "Q8_0")
    write_transformers_model(work / "tiny-llama")
    yield


@contextlib.contextmanager
def _checkpoint(work: Path, env: dict) -> Iterator[None]:
    """tiny-llama/: a transformers directory saved the old way (config.json,
    pytorch_model.bin)."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from tests.support.pytorch_models import write_transformers_bin

    write_transformers_bin(work / "tiny-llama")
    yield


@contextlib.contextmanager
def _root(work: Path, env: dict) -> Iterator[None]:
    """Mounting a /dev/fuse descriptor is root's (a privileged container's)."""
    if os.geteuid() != 0:
        pytest.skip("the mounter's half needs root")
    yield


SETUPS: dict[str, Setup] = {
    "first-mount.md": _nothing,
    "remote.md": _server,
    "clients.md": _clients,
    "editing.md": _nothing,
    "pytorch.md": _checkpoint,
    "fleet.md": _server,
    "containers.md": _root,
    "troubleshooting.md": _nothing,
}
PAGES = sorted(GUIDE.glob("*.md"))


def test_every_guide_page_has_its_setup():
    assert sorted(p.name for p in PAGES) == sorted(SETUPS)


@pytest.mark.parametrize("page", PAGES, ids=[p.name for p in PAGES])
def test_every_command_a_guide_shows_is_run_or_says_why_not(page):
    unmarked, reasonless = [], []
    for mark, why, language, body in blocks(page.read_text()):
        if language in RUNNABLE and mark is None:
            unmarked.append(body.splitlines()[0] if body else "")
        if mark == "not run" and not why:
            reasonless.append(body.splitlines()[0])
    assert unmarked == [], f"{page.name}: blocks neither run nor marked 'not run: WHY'"
    assert reasonless == [], f"{page.name}: 'not run' without a reason"
    assert script(page.read_text()).strip(), f"{page.name} runs nothing"


# the pages whose setup starts a server (remote) or runs a real client (clients)
MARKS = {_server: [pytest.mark.remote], _clients: [pytest.mark.clients],
         _checkpoint: [pytest.mark.clients]}


@pytest.mark.parametrize("page", [pytest.param(p, marks=MARKS.get(SETUPS.get(p.name), []))
                                  for p in PAGES], ids=[p.name for p in PAGES])
def test_the_guide_runs_as_written_in_a_fresh_shell(page, tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    (work / "examples").symlink_to(ROOT / "examples")
    env = {"HOME": str(tmp_path), "LANG": "C.UTF-8", "XDG_RUNTIME_DIR": RUNTIME_DIR,
           "PATH": f"{Path(sys.executable).parent}:/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin"}
    if os.environ.get("PYTHONPATH"):
        env["PYTHONPATH"] = os.environ["PYTHONPATH"]
    with SETUPS[page.name](work, env):
        try:
            result = subprocess.run(["bash", "--noprofile", "--norc", "-e", "-o", "pipefail",
                                     "-c", script(page.read_text())],
                                    cwd=work, env=env, capture_output=True, text=True,
                                    timeout=600, stdin=subprocess.DEVNULL)
        finally:
            left = fuse_mounts_under(tmp_path)
            for mnt in left:
                subprocess.run(["fusermount3", "-uz", mnt], capture_output=True)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    assert left == [], f"{page.name} left mounted: {left}"
