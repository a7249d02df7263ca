"""Faults of remote models (docs/reference/remote.md): each refusal at mount is one line saying which; an
object replaced under a live mount gives EIO, never new bytes (or, where the version is
addressable, the pinned version's bytes); a server that goes away or stalls gives EIO within
``--timeout`` with the daemon alive; dropped connections, 503 and 429 are retried (a fault
proxy in front of nginx, sequences drawn by hypothesis)."""

from __future__ import annotations

import contextlib
import errno
import os
import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from tests.support import fuse_mounts_under, run_tensorfs
from tests.support.reliability_models import alive, daemon_pid, read_errno, write_mixed_gguf
from tests.support.remote_checks import HF_TOKEN, assert_matches_reference, doc_of, reference
from tests.support.servers import HubRepo, free_port

EIO = errno.EIO
RETRIES = 5          # docs/reference/remote.md: up to 5 tries per read


# -- refusals at mount ------------------------------------------------------------------------

def _refusals(nginx):
    closed = free_port()
    return [   # (id, url, extra env, words the one line must hold)
        ("http-404", f"{nginx.url}/files/nope/model.gguf", {}, ["not found", "404"]),
        ("http-401", f"{nginx.url}/private/model.gguf", {}, ["access denied", "401"]),
        ("http-403", f"{nginx.url}/forbidden/model.gguf", {}, ["access denied", "403"]),
        ("http-no-range", f"{nginx.url}/norange/mixed/mixed.gguf", {}, ["Range"]),
        ("http-unreachable", f"http://127.0.0.1:{closed}/model.gguf", {}, ["cannot connect"]),
        ("http-no-such-host", "http://no-such-host.invalid/model.gguf", {},
         ["cannot connect", "does not resolve"]),
        ("hf-gated-no-token", "hf://tfs/gated/model.safetensors", {}, ["401", "HF_TOKEN"]),
        ("hf-gated-wrong-token", "hf://tfs/gated/model.safetensors",
         {"HF_TOKEN": "hf_wrongTOKENnotgranted42"}, ["403"]),
        ("hf-missing-file", "hf://tfs/safetensors/nope.safetensors", {}, ["not found"]),
        ("hf-missing-revision", "hf://tfs/safetensors@nosuch/model.safetensors", {}, ["nosuch"]),
        ("s3-missing-key", "s3://models/nope/model.gguf", {}, ["not found"]),
        ("s3-missing-bucket", "s3://no-such-bucket/model.gguf", {}, ["not found"]),
    ]


REFUSAL_IDS = [r[0] for r in _refusals(type("N", (), {"url": "http://x"}))]


@pytest.mark.parametrize("case", REFUSAL_IDS)
def test_a_refused_url_is_one_line_saying_which(case, nginx, s3, remote_env, tmp_path):
    _, url, env, words = next(r for r in _refusals(nginx) if r[0] == case)
    env = {**remote_env, **env}
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    with ThreadPoolExecutor(2) as pool:
        inspected = pool.submit(run_tensorfs, "inspect", url, env=env)
        mounted = pool.submit(run_tensorfs, "mount", url, mnt, env=env)
        inspected, mounted = inspected.result(), mounted.result()
    for result in (inspected, mounted):
        assert result.returncode == 1, result.stdout
        lines = result.stderr.splitlines()
        assert len(lines) == 1 and lines[0].startswith("tensorfs: error: "), result.stderr
        print(lines[0])
        for word in words:
            assert word.lower() in lines[0].lower(), lines[0]
        assert "Traceback" not in result.stderr
        for secret in (HF_TOKEN, env.get("HF_TOKEN", HF_TOKEN)):
            assert secret not in result.stderr
    assert fuse_mounts_under(tmp_path) == [] and os.listdir(mnt) == []


def test_python_http_server_is_refused_naming_servers_that_answer_ranges(corpus, tmp_path):
    """The server everyone tries first: a real ``python3 -m http.server`` started here.  The
    one line says what it does wrong and names servers that work (nginx: the suite's own)."""
    import sys

    from tests.support.servers import wait_port

    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "http.server", "-b", "127.0.0.1", str(port)],
                              cwd=corpus.models["safetensors"].folder, stdin=subprocess.DEVNULL,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_port(port, server)
        result = run_tensorfs("inspect", f"http://127.0.0.1:{port}/model.safetensors")
    finally:
        server.terminate()
        server.wait()
    assert result.returncode == 1, result.stdout
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("tensorfs: error: "), result.stderr
    assert "ignores Range requests" in lines[0] and "nginx" in lines[0], lines[0]
    assert "npx http-server" in lines[0], lines[0]


def test_a_gated_repo_mounts_with_its_token(rmount, corpus):
    rmnt = rmount("hf://tfs/gated/model.safetensors", env={"HF_TOKEN": HF_TOKEN})
    assert_matches_reference(rmnt, corpus.models["safetensors"].files)


def test_a_stalled_server_at_mount_is_one_line_within_the_timeout(nginx, proxy, remote_env, tmp_path):
    p = proxy(nginx.port)
    p.push(*["stall"] * 50, match="/files/")
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    t0 = time.monotonic()
    result = run_tensorfs("mount", f"{p.url}/files/mixed/mixed.gguf", mnt, "--timeout", "2",
                          env=remote_env, timeout=60)
    elapsed = time.monotonic() - t0
    assert result.returncode == 1
    assert len(result.stderr.splitlines()) == 1 and "no answer within" in result.stderr, result.stderr
    assert elapsed < 30, elapsed               # bounded by --timeout, not by the 50 stalls
    assert fuse_mounts_under(tmp_path) == []


# -- one version per mount --------------------------------------------------------------------

@pytest.fixture(scope="module")
def versions(tmp_path_factory):
    """Two GGUFs of the same layout and other bytes, 8x the mixed model (~15 MiB, several
    blocks)."""
    d = tmp_path_factory.mktemp("versions")
    old = write_mixed_gguf(d / "old.gguf", seed=10, scale=8)
    new = write_mixed_gguf(d / "new.gguf", seed=11, scale=8)
    assert [e.offset for e in old.values()] == [e.offset for e in new.values()]
    return d / "old.gguf", old, d / "new.gguf", new


def _reads_never_new(mnt: Path, old: dict, new: dict) -> dict[str, object]:
    """Read every tensor twice; each read is the old bytes or EIO, never the new bytes."""
    out = {}
    for name, e in old.items():
        for _ in range(2):
            got = read_errno(mnt / e.path)
            assert got != new[name].raw, f"{name}: bytes of the new version"
            assert got == e.raw or got == EIO, (name, got if isinstance(got, int) else len(got))
            out[name] = got
    return out


def _error_lines(log: Path) -> list[str]:
    return [line for line in log.read_text().splitlines() if "ERROR" in line]


@pytest.mark.receivers
def test_an_http_object_replaced_under_a_live_mount_gives_eio(fresh_nginx, versions, rmount, tmp_path):
    old_path, old, new_path, new = versions
    server = fresh_nginx()
    url = server.put("files/v/model.gguf", old_path)
    log = tmp_path / "daemon.log"
    mnt = rmount(url, "--log", log)
    server.put("files/v/model.gguf", new_path)
    later = time.time() + 100
    os.utime(server.www / "files/v/model.gguf", (later, later))       # another ETag
    got = _reads_never_new(mnt, old, new)
    assert set(got.values()) == {EIO}              # that read and every later one
    assert alive(daemon_pid(mnt))
    assert len(_error_lines(log)) == 1, log.read_text()


def test_an_s3_object_replaced_under_a_live_mount_gives_eio(s3, versions, rmount, tmp_path):
    old_path, old, new_path, new = versions
    s3.mkdir("replaced")
    s3.put_file(str(old_path), "replaced/model.gguf")
    log = tmp_path / "daemon.log"
    mnt = rmount("s3://replaced/model.gguf", "--log", log)
    s3.put_file(str(new_path), "replaced/model.gguf")
    got = _reads_never_new(mnt, old, new)
    assert set(got.values()) == {EIO}
    errors = _error_lines(log)
    assert len(errors) == 1 and "changed" in errors[0], errors       # told as a new version


def test_a_versioned_s3_object_keeps_serving_the_pinned_version(s3, moto, versions, rmount):
    old_path, old, new_path, new = versions
    s3.put_file(str(old_path), "versioned/model.gguf")
    v1 = moto.s3fs(version_aware=True).info("versioned/model.gguf")["VersionId"]
    mnt = rmount("s3://versioned/model.gguf")
    s3.put_file(str(new_path), "versioned/model.gguf")
    got = _reads_never_new(mnt, old, new)
    assert all(v == old[n].raw for n, v in got.items())      # VersionId pinned: old bytes
    assert v1 in (mnt / "metadata.json").read_text()
    later = rmount("s3://versioned/model.gguf")
    assert all((later / e.path).read_bytes() == new[n].raw for n, e in new.items())


def test_a_hub_branch_that_moves_under_a_live_mount_changes_nothing(fresh_nginx, versions, rmount,
                                                                    remote_env):
    old_path, old, new_path, new = versions
    repo = HubRepo("tfs/moving")
    first = repo.commit({"model.gguf": old_path})
    server = fresh_nginx([repo])
    env = {"HF_ENDPOINT": server.url}
    mnt = rmount("hf://tfs/moving/model.gguf", env=env)
    assert first in (mnt / "metadata.json").read_text()
    second = repo.commit({"model.gguf": new_path})
    server.reload()
    got = _reads_never_new(mnt, old, new)
    assert all(v == old[n].raw for n, v in got.items())      # the commit pinned at mount
    later = rmount("hf://tfs/moving@main/model.gguf", env=env)
    assert second in (later / "metadata.json").read_text()
    assert all((later / e.path).read_bytes() == new[n].raw for n, e in new.items())


# -- the server goes away, stalls, fails ------------------------------------------------------

@pytest.mark.receivers
def test_nginx_stopped_under_a_live_mount_gives_eio_within_the_timeout(fresh_nginx, corpus, rmount):
    server = fresh_nginx()
    model = corpus.models["big"]
    mnt = rmount(f"{server.url}/files/big/big.safetensors", "--timeout", "3")
    tensors = doc_of(mnt)["tensors"]
    ref = reference(model.files)
    assert (mnt / tensors["a.small"]["path"]).read_bytes() == ref["a.small"][0]
    pid = daemon_pid(mnt)
    server.stop()
    t0 = time.monotonic()
    # a.small's read fetched the first 4 MiB block (c.mid and d.tiny are in it too): a read
    # beyond it needs the server
    far = 4 << 20
    assert read_errno(mnt / tensors["b.big"]["path"], far, 4096) == EIO
    assert time.monotonic() - t0 < 3 + 15          # --timeout, plus the kernel's own round trips
    assert alive(pid)
    assert read_errno(mnt / tensors["d.tiny"]["path"], 0, 2) in (EIO, ref["d.tiny"][0][:2])
    server.start()                                 # the same port: reads go on
    assert read_errno(mnt / tensors["b.big"]["path"], far, 4096) == ref["b.big"][0][far:far + 4096]
    assert (mnt / tensors["c.mid"]["path"]).read_bytes() == ref["c.mid"][0]
    assert alive(pid)


@pytest.fixture(scope="module")
def many_tensors(nginx, tmp_path_factory):
    """16 tensors of 256 KiB, each 1 MiB into a 4 MiB block of its own (the block size of
    docs/reference/remote.md), served by the session's nginx: a fresh tensor for each fault sequence,
    fetched in one request."""
    from safetensors.numpy import save_file

    rng = np.random.default_rng(5)
    block, size = 4 << 20, 256 << 10
    values = {f"t{i:02d}.w": rng.integers(0, 255, size, dtype=np.uint8) for i in range(16)}
    path = tmp_path_factory.mktemp("many") / "many.safetensors"
    data_start = 0
    while True:                  # the header's length depends on the offsets it lists
        lead = (block - data_start % block) % block + (1 << 20)
        tensors = {}
        for i, (name, array) in enumerate(values.items()):
            tensors[name.replace(".w", ".a")] = np.zeros(lead if i == 0 else block - size, np.uint8)
            tensors[name] = array
        save_file(tensors, str(path))
        with open(path, "rb") as f:
            start = 8 + int.from_bytes(f.read(8), "little")
        if start == data_start:
            break
        data_start = start
    from tensorfs.sources.modelfile import parse_model_file

    for t in parse_model_file(str(path)).tensors:
        if t.name.endswith(".w"):
            assert t.offset % block == 1 << 20, (t.name, t.offset)
    nginx.put("files/many/many.safetensors", path)
    return {n: a.tobytes() for n, a in values.items()}


@pytest.mark.receivers
@settings(max_examples=12, phases=[Phase.generate], database=None, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(faults=st.lists(st.sampled_from(["drop", "503", "429"]), max_size=RETRIES + 2))
def test_dropped_connections_503_and_429_are_retried(faults, nginx, proxy, many_tensors, rmount,
                                                     request):
    """Fewer failed tries than the bound: the right bytes; more: the right bytes or EIO (the
    kernel asks again for a page its failed read-ahead left, and each ask has its own
    tries), never wrong bytes; a fresh tensor per sequence, read through the proxy."""
    state = request.node.__dict__.setdefault("remote_state", {})
    if "mnt" not in state:
        state["proxy"] = proxy(nginx.port)
        state["mnt"] = rmount(f"{state['proxy'].url}/files/many/many.safetensors", "--timeout", "30")
        state["left"] = sorted(many_tensors)
    p, mnt = state["proxy"], state["mnt"]
    name = state["left"].pop(0)
    p.clear()
    p.push(*faults)
    got = read_errno(mnt / name.replace(".", "/"))
    p.clear()
    if len(faults) < RETRIES:
        assert got == many_tensors[name], (faults, got)
    else:
        assert got in (EIO, many_tensors[name]), (faults, got if isinstance(got, int) else len(got))
    assert alive(daemon_pid(mnt))


def test_a_server_that_keeps_failing_gives_eio_and_the_daemon_lives(nginx, proxy, many_tensors,
                                                                    rmount):
    p = proxy(nginx.port)
    mnt = rmount(f"{p.url}/files/many/many.safetensors", "--timeout", "20")
    for i, fault in enumerate(("503", "drop")):
        p.push(*[fault] * 60)
        assert read_errno(mnt / f"t0{i}/w") == EIO, fault
        p.clear()
    assert read_errno(mnt / "t02/w") == many_tensors["t02.w"]
    assert alive(daemon_pid(mnt))


@pytest.mark.receivers
def test_a_stall_ends_in_eio_within_the_timeout_and_other_reads_go_on(nginx, proxy, many_tensors,
                                                                      rmount):
    p = proxy(nginx.port)
    mnt = rmount(f"{p.url}/files/many/many.safetensors", "--timeout", "2")
    p.push(*["stall"] * 20)
    t0 = time.monotonic()
    assert read_errno(mnt / "t00/w") == EIO
    assert time.monotonic() - t0 < 2 + 15
    p.clear()
    assert read_errno(mnt / "t01/w") == many_tensors["t01.w"]
    assert alive(daemon_pid(mnt))


@contextlib.contextmanager
def _a_read_hanging_on_the_server(proxy, nginx, remote_env, tmp_path):
    """A mount through a proxy that stalls every answer (--timeout 120), and a reader whose
    read waits on it: yields (daemon pid, stop), where ``stop()`` waits for the daemon to
    be gone and the read to have ended with an error, far below the timeout.  The proxy
    stops and the mount goes whatever the test did."""
    p = proxy(nginx.port)
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    result = run_tensorfs("mount", f"{p.url}/files/many/many.safetensors", mnt, "--timeout", "120",
                          env=remote_env)
    assert result.returncode == 0, result.stderr
    pid = daemon_pid(mnt)
    p.push(*["stall"] * 50)
    outcome = []
    reader = threading.Thread(target=lambda: outcome.append(read_errno(mnt / "t02/w")))
    reader.start()

    def stopped() -> None:
        deadline = time.monotonic() + 15           # far below the 120 s the request may hang
        while alive(pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not alive(pid)
        reader.join(30)
        assert not reader.is_alive() and outcome and isinstance(outcome[0], int), outcome

    try:
        deadline = time.monotonic() + 10
        while not any(f == "stall" for *_, f in p.log) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert any(f == "stall" for *_, f in p.log)
        yield pid, mnt, stopped
    finally:
        p.clear()
        p.stop()
        if fuse_mounts_under(tmp_path):
            subprocess.run(["fusermount", "-uz", str(mnt)], capture_output=True, check=False)


@pytest.mark.receivers
def test_unmount_does_not_wait_for_a_hanging_request(nginx, proxy, many_tensors, remote_env, tmp_path):
    with _a_read_hanging_on_the_server(proxy, nginx, remote_env, tmp_path) as (_, mnt, stopped):
        result = run_tensorfs("unmount", "--lazy", mnt, env=remote_env, timeout=60)
        assert result.returncode == 0, result.stderr
        stopped()


@pytest.mark.parametrize("sig", ["SIGTERM", "SIGINT"])
def test_a_signal_does_not_wait_for_a_hanging_request(nginx, proxy, many_tensors, remote_env,
                                                      tmp_path, sig):
    """SIGTERM or SIGINT to the daemon while a read waits on a server that never answers
    (--timeout 120): the waiting request ends with an error and the daemon exits, within
    the wait's bound, far below the timeout."""
    import signal

    with _a_read_hanging_on_the_server(proxy, nginx, remote_env, tmp_path) as (pid, _, stopped):
        os.kill(pid, getattr(signal, sig))
        stopped()
