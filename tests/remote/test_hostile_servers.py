"""Hostile and broken servers (issue 21): every answer is bounded by what was asked
(at mount and on reads), every wait by --timeout, each bad answer is one error line; an
https:// URL never goes to http://, a token never crosses to another origin, an S3 version
named in the URL is the one mounted, ~/.netrc is read as docs/reference/remote.md says.  The servers
are small asyncio servers started here on 127.0.0.1; how much a hostile server managed to
send is what bounds the client's memory (it cannot send what is not read)."""

from __future__ import annotations

import asyncio
import functools
import json
import os
import ssl
import subprocess
import threading
import time
import zlib

import pytest

from tests.support import run_tensorfs
from tests.support.hostile import _from_nginx, _hub_api, _json_answer, _one_line
from tests.support.reliability_models import alive, daemon_pid, read_errno
from tests.support.remote_checks import HF_TOKEN, assert_matches_reference, doc_of
from tests.support.servers import BASIC_PASSWORD, BASIC_USER

MiB = 1 << 20


def _range(headers: dict) -> tuple[int, int]:
    first, _, last = headers["range"].removeprefix("bytes=").partition("-")
    return int(first), int(last)


# -- bounded answers ------------------------------------------------------------------------

def _lying(kind: str, data: bytes, honest_first: bool = False):
    """Answers to ranged GETs of ``data``, each lying the ``kind`` way (after an honest
    first answer when ``honest_first``: the probe passes, the reads meet the lie)."""
    state = {"n": 0}

    async def answer(method, path, headers):
        state["n"] += 1
        start, last = _range(headers)
        last = min(last, len(data) - 1)
        body = data[start:last + 1]
        head = (f"HTTP/1.1 206 Partial Content\r\nContent-Range: bytes {start}-{last}/{len(data)}"
                f"\r\nETag: \"e1\"\r\n")
        if honest_first and state["n"] == 1:
            yield (head + f"Content-Length: {len(body)}\r\n\r\n").encode() + body
            return
        if kind == "long":              # a 206 for the range, with 1000 MiB behind it
            yield (head + f"Content-Length: {1000 * MiB}\r\n\r\n").encode()
            for _ in range(1000 * 16):
                yield b"\0" * (64 << 10)
        elif kind == "endless":         # chunked, never ending
            yield (head + "Transfer-Encoding: chunked\r\n\r\n").encode()
            while True:
                yield b"10000\r\n" + b"\0" * (64 << 10) + b"\r\n"
        elif kind == "gzip":            # encoded although identity was asked for: 1000 MiB
            packed = _gzip_bomb()
            yield (head + f"Content-Encoding: gzip\r\nContent-Length: {len(packed)}\r\n\r\n"
                   ).encode() + packed
        elif kind == "negative-total":
            yield (f"HTTP/1.1 206 Partial Content\r\nContent-Range: bytes {start}-{last}/-5\r\n"
                   f"Content-Length: {len(body)}\r\n\r\n").encode() + body
        elif kind == "other-range":     # an answer for bytes that were not asked for
            yield (f"HTTP/1.1 206 Partial Content\r\nContent-Range: bytes {start + 1}-{last + 1}/"
                   f"{len(data)}\r\nContent-Length: {len(body)}\r\n\r\n").encode() + body
    return answer


KINDS = ["long", "endless", "gzip", "negative-total", "other-range"]


@functools.lru_cache(1)
def _gzip_bomb() -> bytes:
    """1000 MiB of zeros, gzipped (about 1 MB)."""
    packer = zlib.compressobj(1, zlib.DEFLATED, 31)
    zeros = b"\0" * (8 * MiB)
    return b"".join([packer.compress(zeros) for _ in range(125)] + [packer.flush()])


def _tree_rss(pid: int) -> int:
    """Resident bytes of ``pid`` and its descendants (the request helper among them)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat", "rb") as f:
                    ppid = int(f.read().rsplit(b")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    total, todo = 0, [pid]
    while todo:
        p = todo.pop()
        todo.extend(children.get(p, []))
        try:
            with open(f"/proc/{p}/statm") as f:
                total += int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
        except (OSError, ValueError, IndexError):
            pass
    return total


def _run_watching_rss(args: list, env: dict, timeout: float = 120):
    """(CompletedProcess, peak resident bytes of the command's process tree), sampled."""
    from tests.support import TENSORFS

    proc = subprocess.Popen([*TENSORFS, *map(str, args)], env=env, text=True,
                            stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    peak = 0
    out: list = []
    reader = threading.Thread(target=lambda: out.append(proc.communicate(timeout=timeout)))
    reader.start()
    while reader.is_alive():
        peak = max(peak, _tree_rss(proc.pid))
        time.sleep(0.02)
    stdout, stderr = out[0]
    return subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr), peak


@pytest.mark.parametrize("kind", KINDS)
def test_a_lying_answer_at_mount_is_one_line_and_is_not_read_past_the_range(kind, corpus, hostile,
                                                                           remote_env):
    data = corpus.models["big"].local.read_bytes()
    _gzip_bomb()                    # made before the clock runs
    server = hostile(_lying(kind, data))
    result, peak = _run_watching_rss(["inspect", f"{server.url}/m.safetensors", "--timeout", "10"],
                                     remote_env)
    line = _one_line(result)
    print(line, peak >> 20, "MiB")
    assert server.sent < 300 * MiB, server.sent      # what the client read, and so held
    assert peak < 300 * MiB, peak


@pytest.mark.receivers
@pytest.mark.parametrize("kind", ["long", "endless", "gzip", "other-range"])
def test_a_lying_answer_to_a_read_is_eio_and_is_not_read_past_the_range(kind, corpus, hostile,
                                                                       rmount, tmp_path):
    data = corpus.models["big"].local.read_bytes()
    server = hostile(_lying(kind, data, honest_first=True))
    log = tmp_path / "daemon.log"
    mnt = rmount(f"{server.url}/m.safetensors", "--timeout", "10", "--log", log)
    tensors = doc_of(mnt)["tensors"]
    assert read_errno(mnt / tensors["b.big"]["path"]) == 5
    assert server.sent < 300 * MiB, server.sent
    assert alive(daemon_pid(mnt))


# -- --timeout bounds the Hub's listing and revision ------------------------------------------

async def _never(method, path, headers):
    await asyncio.Event().wait()
    yield b""


@pytest.mark.parametrize("url", ["hf://tfs/safetensors/model.safetensors", "hf://tfs/safetensors"])
def test_a_hub_that_never_answers_is_one_line_within_the_timeout(url, hostile, remote_env):
    server = hostile(_never)
    t0 = time.monotonic()
    line = _one_line(run_tensorfs("inspect", url, "--timeout", "3",
                                  env={**remote_env, "HF_ENDPOINT": server.url}, timeout=120))
    assert time.monotonic() - t0 < 30            # bounded by --timeout, not a hang
    assert "no answer within 3 s" in line, line


def test_a_hub_tree_that_is_not_json_is_one_line(nginx, hostile, remote_env):
    server = hostile(_hub_api(nginx, tree=b"<html>not the Hub</html>"))
    line = _one_line(run_tensorfs("inspect", "hf://tfs/safetensors",
                                  env={**remote_env, "HF_ENDPOINT": server.url}, timeout=120))
    assert "JSON" in line, line


# -- the Hub's own answers are bounded too ----------------------------------------------------

HUB_SENDS_AT_MOST = 512 * MiB       # then it stalls: a client that reads on holds all of it


def _chunked(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


def _hub_answering(nginx, where: str, how: str):
    """A Hub whose API answers for paths containing ``where`` (``/revision/``, ``/tree/``)
    lie the ``how`` way; its other answers are nginx's Hub layout's."""

    async def answer(method, path, headers):
        if where not in path:
            yield _json_answer(_from_nginx(nginx, path))
            return
        head = "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
        if how == "endless":            # JSON that never ends, chunked
            yield (head + "Transfer-Encoding: chunked\r\n\r\n").encode()
            yield _chunked(b'{"sha": "' if where == "/revision/" else b'[{"path": "')
            for _ in range(HUB_SENDS_AT_MOST // MiB):
                yield _chunked(b"a" * MiB)
            await asyncio.Event().wait()
        elif how == "long":             # a Content-Length of 1000 MiB, and the bytes
            yield (head + f"Content-Length: {1000 * MiB}\r\n\r\n").encode() + b"["
            for _ in range(HUB_SENDS_AT_MOST // MiB):
                yield b" " * MiB
            await asyncio.Event().wait()
        elif how == "gzip":             # encoded although identity was asked for: 1000 MiB
            packed = _gzip_bomb()
            yield (head + f"Content-Encoding: gzip\r\nContent-Length: {len(packed)}\r\n\r\n"
                   ).encode() + packed
        elif how == "pages":            # a listing whose next page never is the last
            entries = json.dumps([{"type": "file", "oid": "0" * 40, "size": 1,
                                   "path": f"f{n:06d}-{len(path)}.bin"} for n in range(1000)])
            link = f"<http://{headers['host']}{path}&p=1>" if "?" in path else \
                f"<http://{headers['host']}{path}?p=1>"
            yield (head + f'Link: {link}; rel="next"\r\nContent-Length: {len(entries)}\r\n\r\n'
                   ).encode() + entries.encode()
    return answer


@pytest.mark.parametrize("where,how", [("/revision/", "endless"), ("/revision/", "long"),
                                       ("/revision/", "gzip"), ("/tree/", "endless"),
                                       ("/tree/", "gzip"), ("/tree/", "pages")])
def test_the_hubs_answers_are_bounded(where, how, nginx, hostile, remote_env):
    _gzip_bomb()                    # made before the clock runs
    server = hostile(_hub_answering(nginx, where, how))
    result, peak = _run_watching_rss(["inspect", "hf://tfs/safetensors", "--timeout", "60"],
                                     {**remote_env, "HF_ENDPOINT": server.url}, timeout=180)
    line = _one_line(result)
    print(line, peak >> 20, "MiB", server.sent >> 20, "MiB sent")
    assert "more than" in line or "encoded" in line, line    # refused as such, not timed out
    assert server.sent < 300 * MiB, server.sent
    assert peak < 300 * MiB, peak


@pytest.mark.receivers
def test_the_token_is_not_sent_to_another_origin(nginx, corpus, hostile, rmount):
    server = hostile(_hub_api(nginx))
    mark = nginx.log_mark()
    mnt = rmount("hf://tfs/safetensors/model.safetensors",
                 env={"HF_ENDPOINT": server.url, "HF_TOKEN": HF_TOKEN})
    assert_matches_reference(mnt, corpus.models["safetensors"].files)
    files = [r for r in nginx.requests(mark) if "/resolve/" in r["uri"]]
    assert files and all(r["auth"] == "none" for r in files), files
    ours = [h for m, p, h in server.requests if "/resolve/" in p]
    assert ours and all(h.get("authorization") == f"Bearer {HF_TOKEN}" for h in ours)


# -- https never goes to http -----------------------------------------------------------------

@pytest.fixture(scope="module")
def certificate(tmp_path_factory):
    """(server context, the CA's PEM): a CA of the test's own and a certificate for
    127.0.0.1 it signed (rustls takes no self-signed CA as the server's own certificate)."""
    d = tmp_path_factory.mktemp("tls")

    def openssl(*args):
        subprocess.run(["openssl", *args], check=True, capture_output=True, cwd=d)

    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=tfs-ca",
            "-keyout", "ca.key", "-out", "ca.pem")
    openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=127.0.0.1",
            "-keyout", "key.pem", "-out", "cert.csr")
    (d / "ext").write_text("subjectAltName=IP:127.0.0.1\nbasicConstraints=CA:FALSE\n")
    openssl("x509", "-req", "-in", "cert.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
            "-CAcreateserial", "-days", "2", "-extfile", "ext", "-out", "cert.pem")
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(d / "cert.pem", d / "key.pem")
    return context, (d / "ca.pem").read_text()


def test_an_https_url_never_follows_a_redirect_to_http(nginx, corpus, hostile, certificate,
                                                       remote_env):
    context, pem = certificate
    data = corpus.models["big"].local.read_bytes()

    async def answer(method, path, headers):
        if path.startswith("/down/"):
            yield (f"HTTP/1.1 302 Found\r\nLocation: {nginx.url}/files/big/big.safetensors\r\n"
                   f"Content-Length: 0\r\n\r\n").encode()
            return
        async for chunk in _lying("", data, honest_first=True)(method, path, headers):
            yield chunk

    server = hostile(answer, tls=context)
    trust = ["--storage-option", f"root_certificate={pem}"]
    served = run_tensorfs("inspect", f"{server.url}/files/m.safetensors", *trust, env=remote_env)
    assert served.returncode == 0, served.stderr         # the certificate is trusted
    line = _one_line(run_tensorfs("inspect", f"{server.url}/down/m.safetensors", *trust,
                                  env=remote_env))
    assert "http://" in line, line


# -- versions and credentials -----------------------------------------------------------------

def test_an_s3_version_named_in_the_url_is_the_one_mounted(s3, moto, corpus, rmount):
    first, second = corpus.models["safetensors"].local, corpus.models["big"].local
    s3.put_file(str(first), "versioned/pinned.safetensors")
    v1 = moto.s3fs(version_aware=True).info("versioned/pinned.safetensors")["VersionId"]
    s3.put_file(str(second), "versioned/pinned.safetensors")
    mnt = rmount(f"s3://versioned/pinned.safetensors?versionId={v1}")
    assert_matches_reference(mnt, [first])
    assert v1 in (mnt / "metadata.json").read_text()


def test_a_query_other_than_a_version_is_refused_in_one_line(s3, remote_env):
    line = _one_line(run_tensorfs("inspect", "s3://models/big/big.safetensors?partNumber=2",
                                  env=remote_env))
    assert "versionId" in line, line


def test_netrc_gives_the_login_of_its_host(nginx, corpus, rmount, remote_env, tmp_path):
    """docs/reference/remote.md: a URL without user:password takes its host's login from ~/.netrc
    (as curl --netrc-optional), shown nowhere."""
    home = tmp_path / "home"
    home.mkdir()
    netrc = home / ".netrc"
    netrc.write_text(f"machine 127.0.0.1 login {BASIC_USER} password {BASIC_PASSWORD}\n")
    netrc.chmod(0o600)
    url = f"{nginx.url}/basic/mixed/mixed.gguf"
    refused = run_tensorfs("inspect", url, env=remote_env)
    assert refused.returncode == 1 and "401" in refused.stderr
    log = tmp_path / "daemon.log"
    mnt = rmount(url, "--log", log, "--debug", env={"HOME": str(home)})
    model = corpus.models["mixed"]
    assert_matches_reference(mnt, model.files, model.expected)
    assert BASIC_PASSWORD not in log.read_text() + json.dumps(doc_of(mnt))


def test_debug_logs_no_s3_credential(s3, corpus, rmount, tmp_path):
    token = "FwoGZXIvYXdzEXAMPLEsessionTOKEN0123456789"
    log = tmp_path / "daemon.log"
    mnt = rmount("s3://models/big/big.safetensors", "--log", log, "--debug",
                 env={"AWS_SESSION_TOKEN": token})
    for entry in doc_of(mnt)["tensors"].values():
        (mnt / entry["path"]).read_bytes()
    text = log.read_text()
    for secret in (token, "X-Amz-Security-Token", "Signature=", "Authorization"):
        assert secret not in text, secret
    assert os.path.getsize(log) > 0
