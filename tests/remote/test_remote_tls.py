"""TLS trust as curl, requests and pip users expect it (docs/reference/remote.md, "TLS"): a server
certificate that is not trusted is one line that says so, why (rustls's own word) and what
to do; a private CA is trusted through ``--storage-option root_certificate=`` (a PEM file's
path or its text), SSL_CERT_FILE or SSL_CERT_DIR, up to reads in the daemon; a certificate
rustls refuses even when trusted (``openssl req -x509``'s default: a CA's certificate serving
as the server's own) is one line naming the reason and the way forward.  A real nginx serves
https on 127.0.0.1 with certificates made here by the openssl command."""

from __future__ import annotations

import os

import pytest

from tests.remote.conftest import hub_repos, publish_files
from tests.support import mounts_in, run_tensorfs
from tests.support.remote_checks import assert_matches_reference
from tests.support.servers import Nginx
from tests.support.tls import authority_and_server, hashed_directory, needs_openssl, self_signed

pytestmark = needs_openssl

# the trust a test names is the only one in effect
NO_TRUST_ENV = {"SSL_CERT_FILE": None, "SSL_CERT_DIR": None}


@pytest.fixture(scope="module")
def private_ca(tmp_path_factory):
    return authority_and_server(tmp_path_factory.mktemp("ca"))


@pytest.fixture(scope="module")
def https_nginx(corpus, private_ca, tmp_path_factory):
    """nginx serving the corpus over https with a certificate the private CA signed."""
    server = Nginx(tmp_path_factory.mktemp("tls-nginx"), tls=(private_ca.cert, private_ca.key))
    publish_files(server, corpus)
    server.start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def https_hub(corpus, private_ca, tmp_path_factory):
    """nginx in the Hub's layout over https (HF_ENDPOINT=https://...), the private CA's."""
    server = Nginx(tmp_path_factory.mktemp("tls-hub"), list(hub_repos(corpus).values()),
                   tls=(private_ca.cert, private_ca.key))
    server.start()
    yield server
    server.stop()


@pytest.fixture
def https_server(fresh_nginx):
    """https_server(certificate) -> a started nginx presenting ``certificate``."""
    return lambda certificate: fresh_nginx(tls=(certificate.cert, certificate.key))


@pytest.fixture
def plain_env(tmp_path, receiver) -> dict:
    """This process's environment without trust settings or endpoints of its own (and the
    receiver of http(s) reads a ``receivers`` test runs with)."""
    env = {k: v for k, v in os.environ.items()
           if k not in NO_TRUST_ENV and not k.startswith(("HF_", "AWS_"))}
    if receiver is not None:
        env["TENSORFS_HTTP_TRANSPORT"] = receiver
    return env


@pytest.fixture
def tmount(tmp_path, plain_env, mount):         # after `mount`: torn down before it
    yield from mounts_in(tmp_path, "tmnt", plain_env)


def _env(base, **changes) -> dict:
    return {**base, **changes}


def _one_line(result) -> str:
    assert result.returncode == 1, result.stdout
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("tensorfs: error: "), result.stderr
    assert "internal error" not in lines[0] and "Traceback" not in result.stderr, lines[0]
    return lines[0]


def test_an_untrusted_certificate_says_so_why_and_what_to_do(https_nginx, plain_env):
    url = f"{https_nginx.url}/files/safetensors/model.safetensors"
    line = _one_line(run_tensorfs("inspect", url, env=_env(plain_env)))
    assert "certificate is not trusted" in line and "UnknownIssuer" in line, line
    assert "root_certificate=PATH" in line and "SSL_CERT_FILE" in line, line
    assert "no connection" not in line, line


def test_a_trust_file_that_cannot_be_read_is_named(https_nginx, plain_env, tmp_path):
    url = f"{https_nginx.url}/files/safetensors/model.safetensors"
    missing = tmp_path / "no-such-bundle.pem"
    line = _one_line(run_tensorfs("inspect", url, env=_env(plain_env,
                                                           SSL_CERT_FILE=str(missing))))
    assert f"SSL_CERT_FILE={missing} cannot be read" in line and "root_certificate=PATH" in line, line


@pytest.mark.receivers
@pytest.mark.slow
@pytest.mark.parametrize("way", ["root_certificate=PATH", "root_certificate=TEXT",
                                 "SSL_CERT_FILE", "SSL_CERT_DIR"])
def test_a_private_ca_is_trusted_every_way_up_to_the_daemons_reads(https_nginx, private_ca,
                                                                   corpus, plain_env, tmount,
                                                                   tmp_path, way):
    options, env = [], _env(plain_env)
    if way == "root_certificate=PATH":
        options = ["--storage-option", f"root_certificate={private_ca.trust}"]
    elif way == "root_certificate=TEXT":
        options = ["--storage-option", f"root_certificate={private_ca.trust.read_text()}"]
    elif way == "SSL_CERT_FILE":
        env["SSL_CERT_FILE"] = str(private_ca.trust)
    else:
        env["SSL_CERT_DIR"] = str(hashed_directory(tmp_path / "certs", private_ca.trust))
    model = corpus.models["big"]
    mnt = tmount(f"{https_nginx.url}/files/big/{model.entry}", *options, env=env)
    assert_matches_reference(mnt, model.files)


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root for a private mount namespace")
def test_the_system_store_is_trusted(https_nginx, private_ca, plain_env, tmp_path):
    """No SSL_CERT_* and no option: the CA in the system's store (/etc/ssl/certs, as
    update-ca-certificates fills it) is trusted.  The store is replaced in a private mount
    namespace only (a bind mount), so the machine's own is untouched."""
    import shlex
    import subprocess

    from tests.support import TENSORFS
    from tests.support.users import private_namespace_problem

    problem = private_namespace_problem()
    if problem is not None:
        pytest.skip(problem)
    store = hashed_directory(tmp_path / "store", private_ca.trust)
    (store / "ca-certificates.crt").write_bytes(private_ca.trust.read_bytes())
    url = f"{https_nginx.url}/files/safetensors/model.safetensors"
    inspect = shlex.join([*TENSORFS, "inspect", url])
    script = f"mount --bind {shlex.quote(str(store))} /etc/ssl/certs && exec {inspect}"
    result = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c", script],
                            capture_output=True, text=True, env=_env(plain_env), timeout=120,
                            stdin=subprocess.DEVNULL)
    if "unshare failed" in result.stderr or "mount: " in result.stderr:
        pytest.skip(f"no private mount namespace here: {result.stderr.strip()}")
    assert result.returncode == 0, result.stderr
    untrusted = _one_line(run_tensorfs("inspect", url, env=_env(plain_env)))   # outside it
    assert "UnknownIssuer" in untrusted


def test_root_certificate_takes_a_path_relative_to_the_working_directory(https_nginx,
                                                                         private_ca, plain_env):
    url = f"{https_nginx.url}/files/safetensors/model.safetensors"
    result = run_tensorfs("inspect", url, "--storage-option", f"root_certificate={private_ca.trust.name}",
                          env=_env(plain_env), cwd=private_ca.trust.parent)
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize("option", ["root_certificate", "proxy_ca_certificate"])
@pytest.mark.parametrize("given, says", [("missing.pem", "neither PEM text nor a readable file"),
                                         (".", "neither PEM text nor a readable file"),
                                         ("server.ext", "holds no PEM certificate"),
                                         ("a-fifo", "not a regular file")])
def test_a_certificate_option_that_is_no_certificate_is_one_line(https_nginx, private_ca,
                                                                 plain_env, given, says, option):
    """A FIFO nobody writes is refused at once, not waited on."""
    url = f"{https_nginx.url}/files/safetensors/model.safetensors"
    fifo = private_ca.trust.parent / "a-fifo"
    if given == "a-fifo" and not fifo.exists():
        os.mkfifo(fifo)
    line = _one_line(run_tensorfs("inspect", url, "--storage-option", f"{option}={given}",
                                  env=_env(plain_env), cwd=private_ca.trust.parent))
    assert says in line and f"{option}={given}" in line, line


def test_openssl_req_x509s_self_signed_certificate_is_refused_with_the_way_forward(
        https_server, plain_env, tmp_path):
    """curl --cacert and Python take it; rustls refuses a CA's certificate as the server's
    own, however it is trusted."""
    certificate = self_signed(tmp_path / "self")
    server = https_server(certificate)
    url = f"{server.url}/files/safetensors/model.safetensors"
    for trust in (["--storage-option", f"root_certificate={certificate.trust}"], []):
        line = _one_line(run_tensorfs("inspect", url, *trust,
                                      env=_env(plain_env, SSL_CERT_FILE=str(certificate.trust))))
        assert "CaUsedAsEndEntity" in line and "basicConstraints=critical,CA:FALSE" in line, line
        assert "make a CA" in line, line


def test_a_self_signed_certificate_that_is_not_a_cas_is_trusted(https_server, plain_env,
                                                                tmp_path):
    """The way forward the refusal names works."""
    certificate = self_signed(tmp_path / "self", "basicConstraints=critical,CA:FALSE")
    server = https_server(certificate)
    result = run_tensorfs("inspect", f"{server.url}/files/safetensors/model.safetensors",
                          "--storage-option", f"root_certificate={certificate.trust}",
                          env=_env(plain_env))
    assert result.returncode == 0, result.stderr


def test_a_certificate_for_another_name_names_the_names_it_has(https_server, plain_env,
                                                               tmp_path):
    certificate = authority_and_server(tmp_path / "other", host_san="DNS:models.example")
    server = https_server(certificate)
    line = _one_line(run_tensorfs("inspect", f"{server.url}/files/safetensors/model.safetensors",
                                  "--storage-option", f"root_certificate={certificate.trust}",
                                  env=_env(plain_env)))
    assert "NotValidForName" in line and "DNS:models.example" in line, line


def test_https_to_a_plain_http_port_says_the_handshake_failed(nginx, plain_env):
    url = nginx.url.replace("http://", "https://") + "/files/safetensors/model.safetensors"
    line = _one_line(run_tensorfs("inspect", url, env=_env(plain_env)))
    assert "TLS handshake failed" in line and "speak https" in line, line


def _hub_env(plain_env, hub, tmp_path, **changes) -> dict:
    return _env(plain_env, HF_ENDPOINT=hub.url, HF_HOME=str(tmp_path / "hf-home"),
                HF_HUB_DISABLE_TELEMETRY="1", HF_HUB_DISABLE_IMPLICIT_TOKEN="1", **changes)


def test_an_untrusted_hub_endpoint_says_so_in_one_line(https_hub, plain_env, tmp_path):
    """huggingface_hub's own requests (the revision) meet the certificate first."""
    line = _one_line(run_tensorfs("inspect", "hf://tfs/safetensors/model.safetensors",
                                  env=_hub_env(plain_env, https_hub, tmp_path)))
    assert "certificate is not trusted" in line and "SSL_CERT_FILE" in line, line


@pytest.mark.slow
def test_a_hub_endpoint_of_a_private_ca_is_trusted_through_ssl_cert_file(https_hub, private_ca,
                                                                         corpus, plain_env,
                                                                         tmp_path, tmount):
    model = corpus.models["safetensors"]
    mnt = tmount(f"hf://tfs/safetensors/{model.entry}",
                 env=_hub_env(plain_env, https_hub, tmp_path, SSL_CERT_FILE=str(private_ca.trust)))
    assert_matches_reference(mnt, model.files)


def test_an_s3_endpoint_takes_root_certificate_as_its_clients(https_nginx, private_ca, plain_env,
                                                              tmp_path):
    """root_certificate given for s3:// reaches the HTTP client (not the store's config): the
    certificate error without it, another answer (not an S3 server) with it."""
    env = _env(plain_env, AWS_ENDPOINT_URL=https_nginx.url, AWS_ACCESS_KEY_ID="testing",
               AWS_SECRET_ACCESS_KEY="testing", AWS_DEFAULT_REGION="us-east-1",
               AWS_EC2_METADATA_DISABLED="true")
    url = "s3://models/safetensors/model.safetensors"
    untrusted = _one_line(run_tensorfs("inspect", url, env=env))
    assert "certificate is not trusted" in untrusted, untrusted
    trusted = _one_line(run_tensorfs("inspect", url, "--storage-option",
                                     f"root_certificate={private_ca.trust}", env=env))
    assert "certificate" not in trusted and "root_certificate" not in trusted, trusted


# the system's own bundle, which SSL_CERT_FILE names beside a private SSL_CERT_DIR
SYSTEM_BUNDLE = "/etc/ssl/certs/ca-certificates.crt"


@pytest.mark.parametrize("way", ["root_certificate=PATH", "SSL_CERT_DIR beside SSL_CERT_FILE"])
def test_a_hub_endpoint_of_a_private_ca_is_trusted_as_https_is(https_hub, private_ca, corpus,
                                                               plain_env, tmp_path, tmount, way):
    """hf:// trusts what https:// does (issue 35 class 11): huggingface_hub's own requests
    (the revision, the listing) read ``root_certificate`` and SSL_CERT_DIR next to a system
    SSL_CERT_FILE too, not only the file reads; before, the mount failed with "certificate
    not trusted" at the revision."""
    options, changes = [], {}
    if way == "root_certificate=PATH":
        options = ["--storage-option", f"root_certificate={private_ca.trust}"]
    else:
        if not os.path.isfile(SYSTEM_BUNDLE):
            pytest.skip(f"no system bundle at {SYSTEM_BUNDLE}")
        changes = {"SSL_CERT_FILE": SYSTEM_BUNDLE,
                   "SSL_CERT_DIR": str(hashed_directory(tmp_path / "certs", private_ca.trust))}
    env = _hub_env(plain_env, https_hub, tmp_path, **changes)
    model = corpus.models["safetensors"]
    url = f"hf://tfs/safetensors/{model.entry}"
    inspected = run_tensorfs("inspect", url, *options, env=env)
    assert inspected.returncode == 0, inspected.stderr
    mnt = tmount(url, *options, env=env)
    assert_matches_reference(mnt, model.files)
    listed = tmount("hf://tfs/safetensors", *options, env=env)       # a listing of the repo
    assert model.entry in os.listdir(listed / "files")


def test_a_hub_endpoint_refused_names_root_certificate_among_the_ways(https_hub, plain_env,
                                                                       tmp_path):
    line = _one_line(run_tensorfs("inspect", "hf://tfs/safetensors/model.safetensors",
                                  env=_hub_env(plain_env, https_hub, tmp_path)))
    assert "certificate is not trusted" in line and "root_certificate=PATH" in line, line


class _ConnectProxy:
    """A forward proxy that only tunnels (``CONNECT host:port``), as HTTPS_PROXY names one;
    ``tunnels``: the targets it was asked for."""

    def __init__(self):
        import asyncio
        import socket
        import threading

        self.tunnels: list[str] = []
        self._loop = asyncio.new_event_loop()
        self._sock = socket.socket()
        self._sock.bind(("127.0.0.1", 0))
        self._sock.listen(64)
        self.url = f"http://127.0.0.1:{self._sock.getsockname()[1]}"
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self):
        import asyncio

        asyncio.set_event_loop(self._loop)
        self._loop.run_until_complete(asyncio.start_server(self._client, sock=self._sock))
        self._loop.run_forever()

    async def _client(self, reader, writer):
        import asyncio

        async def pipe(source, sink):
            try:
                while data := await source.read(1 << 16):
                    sink.write(data)
                    await sink.drain()
            except (ConnectionError, OSError):
                pass
            finally:
                sink.close()
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            method, target, _ = head.decode("latin-1").split(" ", 2)
            if method != "CONNECT":
                writer.write(b"HTTP/1.1 405 Method Not Allowed\r\nContent-Length: 0\r\n\r\n")
                writer.close()
                return
            self.tunnels.append(target)
            host, _, port = target.rpartition(":")
            up_reader, up_writer = await asyncio.open_connection(host, int(port))
            writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
            await writer.drain()
            await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))
        except (ConnectionError, OSError, asyncio.IncompleteReadError):
            writer.close()

    def stop(self):
        """Every tunnel's coroutine ended, then the loop (as ``Hostile.stop``)."""
        import asyncio

        async def end():
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        try:
            asyncio.run_coroutine_threadsafe(end(), self._loop).result(timeout=10)
        except Exception:               # any: the loop is stopped below all the same
            pass
        self._loop.call_soon_threadsafe(self._loop.stop)


@pytest.mark.parametrize("transport", ["http.client", "obstore"])
def test_https_proxy_tunnels_the_daemons_reads(https_nginx, private_ca, corpus, plain_env,
                                               tmount, transport):
    """HTTPS_PROXY, as curl reads it: every https request goes through a CONNECT tunnel,
    the certificate still checked against the host named (the private CA trusted)."""
    proxy = _ConnectProxy()
    try:
        model = corpus.models["big"]
        env = _env(plain_env, HTTPS_PROXY=proxy.url, NO_PROXY="", no_proxy="",
                   TENSORFS_HTTP_TRANSPORT=transport)
        mnt = tmount(f"{https_nginx.url}/files/big/{model.entry}", "--storage-option",
                     f"root_certificate={private_ca.trust}", env=env)
        assert_matches_reference(mnt, model.files)
        where = https_nginx.url.split("://", 1)[1]
        assert len(proxy.tunnels) >= 2 and set(proxy.tunnels) == {where}, proxy.tunnels
    finally:
        proxy.stop()
