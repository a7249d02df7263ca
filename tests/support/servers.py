"""Real servers on 127.0.0.1 for the remote tests and bench/rows/remote.py.

* ``Nginx``: Debian's nginx, run in the foreground from a generated config (``-c``, ``-p`` a
  tmp prefix, pid and logs there), serving ``www/`` with ``Range`` and ``ETag``:
  ``/files/...`` as plain HTTP (or https: ``tls``), ``/norange/...`` ignoring ``Range``
  (``max_ranges 0``), ``/noetag/...`` the same files without ``ETag``,
  ``/private/...`` 401, ``/forbidden/...`` 403, and Hugging Face repos (``HubRepo``) in the
  Hub's layout with the few API answers ``huggingface_hub`` asks for, as static files, so
  that ``HF_ENDPOINT=http://127.0.0.1:PORT`` makes ``hf://ORG/REPO/...`` work offline.  Its
  access log is JSON lines (method, URI, Range header, status, body bytes sent).
* ``MotoServer``: moto's standalone S3 server, from its own virtualenv (build/moto-venv, made by
  the Makefile: beside s3fs in one environment pip may settle botocore by picking ancient
  releases).
* ``Proxy``: a small asyncio HTTP/1.1 proxy in front of nginx that applies queued faults to
  the next requests (drop the connection mid-body, answer 503 or 429, stall forever) and can
  add round-trip time with a window-limited delay line, as a long link does (tc netem is not
  in this VM's kernel).
* ``CacheTier``: a caching nginx in front of an origin (the ``slice`` module, ``proxy_cache``
  and ``proxy_cache_lock``), from ``CACHE_TIER_SITE``, the config docs/guide/fleet.md shows.
"""

from __future__ import annotations

import asyncio
import collections
import hashlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import quote

REPO = Path(__file__).resolve().parents[2]
MOTO_SERVER = REPO / "build" / "moto-venv" / "bin" / "moto_server"
# /basic/ (the same files as /files/) wants HTTP basic auth with these: a secret in a URL
BASIC_USER, BASIC_PASSWORD = "tfs", "pw-tensorfsBASIC-9f3"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(port: int, proc: subprocess.Popen | None = None, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return
        except OSError:
            if proc is not None and proc.poll() is not None:
                raise RuntimeError(f"{proc.args[0]} exited with {proc.returncode} before listening")
            if time.monotonic() > deadline:
                raise RuntimeError(f"nothing listens on 127.0.0.1:{port} after {timeout} s")
            time.sleep(0.02)


def _die_with_parent() -> None:
    """In the child before exec: SIGTERM when the test process dies, however it dies, so that
    no server outlives a killed test run on a shared machine."""
    import ctypes

    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)      # PR_SET_PDEATHSIG


def _stop(proc: subprocess.Popen, sig=signal.SIGTERM, timeout: float = 10.0) -> None:
    if proc.poll() is None:
        proc.send_signal(sig)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


# -- the Hugging Face Hub's layout ---------------------------------------------------------

def commit_sha(*parts: str) -> str:
    """A made-up 40-hex commit id, fixed by its parts."""
    return hashlib.sha1("/".join(parts).encode()).hexdigest()


@dataclass
class HubRepo:
    """A model repo: commits (sha -> {path in repo: local file}) and branches (name -> sha).
    ``token``: the repo is gated; its files need ``Authorization: Bearer TOKEN`` (401 without,
    403 with another token, each with the Hub's ``X-Error-Code: GatedRepo``), its API answers
    do not (as on the Hub)."""
    repo_id: str
    commits: dict[str, dict[str, Path]] = field(default_factory=dict)
    branches: dict[str, str] = field(default_factory=dict)
    token: str | None = None

    def commit(self, files: dict[str, Path], branch: str = "main", sha: str | None = None) -> str:
        sha = sha or commit_sha(self.repo_id, str(len(self.commits)))
        self.commits[sha] = dict(files)
        self.branches[branch] = sha
        return sha

    @property
    def main(self) -> str:
        return self.branches["main"]


def _tree_entry(path: str, local: Path) -> dict:
    data = local.read_bytes()
    entry = {"type": "file", "oid": hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest(),
             "size": len(data), "path": path}
    if local.suffix in (".safetensors", ".gguf"):      # as the Hub stores weights: in LFS
        entry["lfs"] = {"oid": hashlib.sha256(data).hexdigest(), "size": len(data),
                        "pointerSize": 134}
    return entry


def _write_json(path: Path, doc) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc))


def _publish_repo(www: Path, repo: HubRepo) -> None:
    """Files under www/hub/ORG/REPO/commits/SHA/..., API answers under www/api/models/...:
    the repo's info per revision (branch or sha) and a tree listing per directory, flat
    (``list.json``) and recursive (``recursive.json``)."""
    api = www / "api" / "models" / repo.repo_id
    for sha, files in repo.commits.items():
        base = www / "hub" / repo.repo_id / "commits" / sha
        entries = {}
        for path, local in files.items():
            target = base / path
            target.parent.mkdir(parents=True, exist_ok=True)
            if target.exists() or target.is_symlink():
                target.unlink()
            os.link(local, target) if _same_fs(local, base) else shutil.copyfile(local, target)
            entries[path] = _tree_entry(path, local)
        dirs = {""}
        for path in files:
            parts = path.split("/")[:-1]
            dirs.update("/".join(parts[:i + 1]) for i in range(len(parts)))
        for d in dirs:
            prefix = d + "/" if d else ""
            flat, deep = [], []
            for sub in sorted(x for x in dirs if x and x.startswith(prefix)):
                item = {"type": "directory", "oid": commit_sha(sha, sub), "size": 0, "path": sub}
                deep.append(item)
                if "/" not in sub[len(prefix):]:
                    flat.append(item)
            for path in sorted(p for p in files if p.startswith(prefix)):
                deep.append(entries[path])
                if "/" not in path[len(prefix):]:
                    flat.append(entries[path])
            for rev in [sha] + [b for b, s in repo.branches.items() if s == sha]:
                tree = api / "tree" / _rev_dir(rev) / d
                _write_json(tree / "list.json", flat)
                _write_json(tree / "recursive.json", deep)
        info = {"_id": commit_sha(repo.repo_id), "id": repo.repo_id, "modelId": repo.repo_id,
                "author": repo.repo_id.split("/")[0], "sha": sha, "private": False,
                "gated": "manual" if repo.token else False, "disabled": False,
                "lastModified": "2026-12-01T00:00:00.000Z", "createdAt": "2026-12-01T00:00:00.000Z",
                "tags": [], "downloads": 0, "likes": 0, "library_name": "safetensors",
                "siblings": [{"rfilename": p} for p in sorted(files)]}
        for rev in [sha] + [b for b, s in repo.branches.items() if s == sha]:
            _write_json(api / "revision" / f"{_rev_dir(rev)}.json", info)
            if rev == "main":
                _write_json(api / "info.json", info)


def _rev_dir(rev: str) -> str:
    return quote(rev, safe="")


def _same_fs(a: Path, b: Path) -> bool:
    b.mkdir(parents=True, exist_ok=True)
    return os.stat(a).st_dev == os.stat(b).st_dev


# -- nginx -----------------------------------------------------------------------------------

# What every nginx of the tests starts with: its process, its access log (one JSON line a
# request, ending with one field of its own, LOG_FIELD) and its temporary files, all under
# {prefix}.
_NGINX_HEAD = r"""
daemon off;
master_process on;
worker_processes {workers};
pid {prefix}/nginx.pid;
error_log {prefix}/error.log warn;
{user}
events {{ worker_connections 1024; }}
http {{
    log_format tfs escape=json '{{"t":$msec,"method":"$request_method","uri":"$request_uri",'
                               '"range":"$http_range","status":$status,'
                               '"bytes":$body_bytes_sent,LOG_FIELD}}';
    access_log {prefix}/access.log tfs;
    client_body_temp_path {prefix}/tmp/body;
    proxy_temp_path {prefix}/tmp/proxy;
    fastcgi_temp_path {prefix}/tmp/fastcgi;
    uwsgi_temp_path {prefix}/tmp/uwsgi;
    scgi_temp_path {prefix}/tmp/scgi;
"""

NGINX_CONF = _NGINX_HEAD.replace("LOG_FIELD", '"auth":"$auth_kind"') + r"""    types {{ application/json json; text/plain txt md; }}
    default_type application/octet-stream;
    sendfile on;
    tcp_nopush on;
    keepalive_timeout 75s;
    keepalive_requests 100000;
    server_tokens off;
    map_hash_bucket_size 256;
    absolute_redirect off;           # Location: /path, so a proxy in front stays in front

    # which tree listing a ?recursive= asks for
    map $arg_recursive $tree_file {{ default list.json; ~^(?i:true|1)$ recursive.json; }}
    map $http_authorization $auth_kind {{ "" none; default bearer; }}
    # the Hub's X-Error-Code on a 404 (an empty value adds no header)
    map $status $entry_error {{ 404 EntryNotFound; default ""; }}
    # branch -> commit, per repo ("ORG/REPO/BRANCH")
    map "$org/$repo/$rev" $branch_commit {{
        default "";
{branch_map}
    }}
    # a gated repo's files: "ORG/REPO|Authorization" -> ok, 401 or 403
    map "$org/$repo|$http_authorization" $hub_auth {{
        default ok;
{auth_map}
    }}

    server {{
        listen 127.0.0.1:{port}{tls};
        server_name localhost;
        root {www};

        location /files/ {{ }}
        location /norange/ {{ max_ranges 0; }}
        location /noetag/ {{ etag off; alias {www}/files/; }}
        location /private/ {{ return 401; }}
        location /basic/ {{
            auth_basic tensorfs;
            auth_basic_user_file {prefix}/htpasswd;
            alias {www}/files/;
        }}
        location /forbidden/ {{ return 403; }}

        location ~ "^/api/models/(?<org>[^/]+)/(?<repo>[^/]+)$" {{
            default_type application/json;
            try_files /api/models/$org/$repo/info.json @missing;
        }}
        location ~ "^/api/models/(?<org>[^/]+)/(?<repo>[^/]+)/revision/(?<rev>.+)$" {{
            default_type application/json;
            try_files /api/models/$org/$repo/revision/$rev.json @missing;
        }}
        # as the Hub answers without a token: 401 RepoNotFound for a repo that is not there
        location @missing {{
            if (!-f $document_root/api/models/$org/$repo/info.json) {{
                add_header X-Error-Code RepoNotFound always;
                add_header X-Error-Message "Repository not found" always;
                return 401;
            }}
            add_header X-Error-Code RevisionNotFound always;
            add_header X-Error-Message "Invalid rev id: $rev" always;
            return 404;
        }}
        location ~ "^/api/models/(?<org>[^/]+)/(?<repo>[^/]+)/tree/(?<rev>[^/]+)(?<dir>/.*)?$" {{
            default_type application/json;
            add_header X-Error-Code $entry_error always;
            try_files /api/models/$org/$repo/tree/$rev$dir/$tree_file =404;
        }}
        location ~ "^/(?<org>[^/]+)/(?<repo>[^/]+)/resolve/(?<rev>[0-9a-f]{{40}})/(?<file>.+)$" {{
            if ($hub_auth = 401) {{
                add_header X-Error-Code GatedRepo always;
                add_header X-Error-Message "Access to model $org/$repo is restricted. You must have access to it and be authenticated to access it. Please log in." always;
                return 401;
            }}
            if ($hub_auth = 403) {{
                add_header X-Error-Code GatedRepo always;
                add_header X-Error-Message "Access to model $org/$repo is restricted and you are not in the authorized list." always;
                return 403;
            }}
            add_header X-Repo-Commit $rev always;
            add_header X-Error-Code $entry_error always;
            try_files /hub/$org/$repo/commits/$rev/$file =404;
        }}
        # the Hub's redirect from a branch to its commit
        location ~ "^/(?<org>[^/]+)/(?<repo>[^/]+)/resolve/(?<rev>[^/]+)/(?<file>.+)$" {{
            if (!-f $document_root/api/models/$org/$repo/info.json) {{
                add_header X-Error-Code RepoNotFound always;
                add_header X-Error-Message "Repository not found" always;
                return 401;
            }}
            if ($branch_commit = "") {{
                add_header X-Error-Code RevisionNotFound always;
                add_header X-Error-Message "Invalid rev id: $rev" always;
                return 404;
            }}
            add_header X-Repo-Commit $branch_commit always;
            return 302 /$org/$repo/resolve/$branch_commit/$file;
        }}
    }}
}}
"""


class Nginx:
    """One nginx in the foreground; ``start()`` writes its config (repos published first)."""

    def __init__(self, base: Path, repos: list[HubRepo] = (), workers: int = 1,
                 tls: tuple[Path, Path] | None = None):
        """``tls``: (certificate chain PEM, key PEM): https on the port, not http."""
        self.tls = tls
        self.base = Path(base)
        self.www = self.base / "www"
        self.prefix = self.base / "nginx"
        self.repos = list(repos)
        self.workers = workers
        self.port = 0
        self.proc: subprocess.Popen | None = None
        self.www.mkdir(parents=True, exist_ok=True)
        for d in ("files", "norange", "hub", "api"):
            (self.www / d).mkdir(exist_ok=True)

    @property
    def url(self) -> str:
        return f"{'https' if self.tls else 'http'}://127.0.0.1:{self.port}"

    @property
    def access_log(self) -> Path:
        return self.prefix / "access.log"

    def put(self, rel: str, local: Path | bytes) -> str:
        """Serve ``local`` (a file, linked or copied, or bytes) at /REL; its URL."""
        target = self.www / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(target.name + ".tmp")
        if isinstance(local, (bytes, bytearray)):
            tmp.write_bytes(local)
        else:
            shutil.copyfile(local, tmp)
        os.replace(tmp, target)
        return f"{self.url}/{rel}"

    def publish(self) -> None:
        for repo in self.repos:
            _publish_repo(self.www, repo)

    def config(self) -> str:
        branch_map = []
        auth_map = []
        for repo in self.repos:
            for branch, sha in repo.branches.items():
                branch_map.append(f'        "{repo.repo_id}/{branch}" {sha};')
            if repo.token:
                auth_map.append(f'        "{repo.repo_id}|Bearer {repo.token}" ok;')
                auth_map.append(f'        "{repo.repo_id}|" 401;')
                auth_map.append(f'        "~^{repo.repo_id}\\|" 403;')
        user = "user root;" if os.geteuid() == 0 else ""
        tls = (f" ssl;\n        ssl_certificate {self.tls[0]};\n        ssl_certificate_key {self.tls[1]}"
               if self.tls else "")
        return NGINX_CONF.format(prefix=self.prefix, www=self.www, port=self.port, user=user,
                                 tls=tls,
                                 workers=self.workers, branch_map="\n".join(branch_map),
                                 auth_map="\n".join(auth_map))

    def start(self) -> "Nginx":
        nginx = shutil.which("nginx") or "/usr/sbin/nginx"
        if not os.path.exists(nginx):
            raise RuntimeError("nginx is not installed (make test-venv installs Debian's nginx)")
        self.publish()
        (self.prefix / "tmp").mkdir(parents=True, exist_ok=True)
        if not self.port:
            self.port = free_port()
        conf = self.prefix / "nginx.conf"
        conf.write_text(self.config())
        (self.prefix / "htpasswd").write_text(f"{BASIC_USER}:{{PLAIN}}{BASIC_PASSWORD}\n")
        self.proc = subprocess.Popen(
            [nginx, "-c", str(conf), "-p", str(self.prefix), "-e", str(self.prefix / "error.log")],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
            preexec_fn=_die_with_parent)
        try:
            wait_port(self.port, self.proc)
        except RuntimeError as error:
            err = self.proc.stderr.read().decode(errors="replace") if self.proc.poll() is not None else ""
            raise RuntimeError(f"{error}: {err}{self.error_log()}") from None
        return self

    def stop(self) -> None:
        """Fast shutdown (SIGTERM): open connections are closed, as a server that goes away."""
        if self.proc is not None:
            _stop(self.proc)
            self.proc.stderr.close()
            self.proc = None

    def reload(self) -> None:
        """Publish the repos again and load the new config (SIGHUP); returns once the
        workers answer from it (nginx swaps its workers asynchronously)."""
        self.publish()
        (self.prefix / "nginx.conf").write_text(self.config())
        self.proc.send_signal(signal.SIGHUP)
        probe = [(r, b, s) for r in self.repos for b, s in r.branches.items()]
        deadline = time.monotonic() + 10
        while probe and time.monotonic() < deadline:
            import http.client

            conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=5)
            try:
                repo, branch, sha = probe[0]
                conn.request("HEAD", f"/{repo.repo_id}/resolve/{branch}/x")
                if conn.getresponse().getheader("X-Repo-Commit") == sha:
                    probe.pop(0)
                    continue
            except OSError:
                pass
            finally:
                conn.close()
            time.sleep(0.05)

    def restart(self) -> None:
        self.stop()
        self.start()

    def error_log(self) -> str:
        try:
            return (self.prefix / "error.log").read_text()
        except OSError:
            return ""

    # -- the access log ------------------------------------------------------------------
    def log_mark(self) -> int:
        """Where the access log ends now: pass it to ``requests(since=...)``."""
        try:
            return self.access_log.stat().st_size
        except OSError:
            return 0

    def requests(self, since: int = 0) -> list[dict]:
        try:
            with open(self.access_log, "rb") as f:
                f.seek(since)
                data = f.read()
        except OSError:
            return []
        return [json.loads(line) for line in data.splitlines() if line.strip()]

    def wait_quiet(self, since: int = 0, quiet: float = 0.3, timeout: float = 10.0) -> list[dict]:
        """The requests since ``since`` once the log has not grown for ``quiet`` seconds
        (requests are logged when they finish: read-ahead may still be in flight)."""
        deadline = time.monotonic() + timeout
        size = -1
        while time.monotonic() < deadline:
            now = self.log_mark()
            if now == size:
                break
            size = now
            time.sleep(quiet)
        return self.requests(since)


def parse_range(header: str) -> tuple[int, int | None] | None:
    """``bytes=A-B`` -> (A, B inclusive or None)."""
    if not header.startswith("bytes="):
        return None
    first = header[6:].split(",")[0]
    a, _, b = first.partition("-")
    return (int(a), int(b) if b else None) if a else None


# -- moto's S3 server ------------------------------------------------------------------------

class MotoServer:
    def __init__(self, base: Path):
        self.base = Path(base)
        self.port = 0
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def env(self) -> dict[str, str]:
        """What a client needs to reach it (botocore reads AWS_ENDPOINT_URL)."""
        return {"AWS_ENDPOINT_URL": self.url, "AWS_ENDPOINT_URL_S3": self.url,
                "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                "AWS_DEFAULT_REGION": "us-east-1", "AWS_EC2_METADATA_DISABLED": "true"}

    def start(self) -> "MotoServer":
        if not MOTO_SERVER.exists():
            raise RuntimeError(f"{MOTO_SERVER} is missing: `make test-venv` builds it")
        self.base.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.log = open(self.base / "moto.log", "wb")
        self.proc = subprocess.Popen([str(MOTO_SERVER), "-H", "127.0.0.1", "-p", str(self.port)],
                                     stdin=subprocess.DEVNULL, stdout=self.log, stderr=subprocess.STDOUT,
                                     preexec_fn=_die_with_parent)
        wait_port(self.port, self.proc, timeout=60)
        return self

    def stop(self) -> None:
        if self.proc is not None:
            _stop(self.proc)
            self.proc = None
            self.log.close()

    def s3fs(self, **kwargs):
        """An s3fs filesystem on this server (the fixtures upload with it)."""
        import s3fs

        return s3fs.S3FileSystem(key="testing", secret="testing", endpoint_url=self.url,
                                 skip_instance_cache=True,
                                 **kwargs)


# -- the fault and delay proxy ---------------------------------------------------------------

FAULTS = ("pass", "drop", "503", "429", "stall")


class Proxy:
    """HTTP/1.1 proxy to ``127.0.0.1:upstream`` on its own event loop thread.

    ``push(*faults, match=...)`` queues faults for the next requests whose URI contains
    ``match`` (default: GETs with a ``Range`` header, i.e. reads): ``pass``; ``drop`` (the
    response head and half the body, then both connections closed); ``503`` and ``429``
    (answered here, ``Retry-After: 0``); ``stall`` (the request read, never answered until
    the client gives up or the proxy stops; ``left``: (uri, range, time.monotonic()) of each
    stalled request whose client closed its connection).  ``rtt``: seconds added to every request and a
    window of ``window`` bytes in flight per connection, so one stream moves at most
    window / rtt bytes a second, as over a long link.  ``log``: (method, uri, range, fault).
    """

    def __init__(self, upstream_port: int, rtt: float = 0.0, window: int = 4 << 20):
        self.upstream_port = upstream_port
        self.rtt = rtt
        self.window = window
        self.port = 0
        self.log: list[tuple[str, str, str, str]] = []
        self.left: list[tuple[str, str, float]] = []
        self._faults: collections.deque = collections.deque()
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._server = None
        self._tasks: set = set()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def push(self, *faults: str, match: str | None = None) -> None:
        for fault in faults:
            assert fault in FAULTS, fault
        with self._lock:
            self._faults.extend((fault, match) for fault in faults)

    def clear(self) -> None:
        with self._lock:
            self._faults.clear()

    def pending(self) -> int:
        with self._lock:
            return len(self._faults)

    def _take(self, method: str, uri: str, headers: dict) -> str:
        with self._lock:
            for i, (fault, match) in enumerate(self._faults):
                hit = (match in uri) if match is not None else (method == "GET" and "range" in headers)
                if hit:
                    del self._faults[i]
                    return fault
        return "pass"

    def start(self) -> "Proxy":
        ready = threading.Event()

        def run():
            self._loop = asyncio.new_event_loop()
            asyncio.set_event_loop(self._loop)

            async def serve():
                self._server = await asyncio.start_server(self._client, "127.0.0.1", 0,
                                                          limit=1 << 20)
                self.port = self._server.sockets[0].getsockname()[1]
                ready.set()

            self._loop.run_until_complete(serve())
            self._loop.run_forever()
            self._loop.close()

        self._thread = threading.Thread(target=run, name="proxy", daemon=True)
        self._thread.start()
        ready.wait(10)
        return self

    def stop(self) -> None:
        if self._loop is None:
            return

        async def shutdown():
            self._server.close()
            for task in list(self._tasks):
                task.cancel()
            await asyncio.sleep(0)

        asyncio.run_coroutine_threadsafe(shutdown(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop = None

    # -- one client connection ------------------------------------------------------------
    async def _client(self, creader, cwriter):
        task = asyncio.current_task()
        self._tasks.add(task)
        upstream = None
        try:
            while True:
                head = await _read_head(creader)
                if head is None:
                    return
                method, uri, headers = _parse_request(head)
                body = b""
                if int(headers.get("content-length", "0") or 0):
                    body = await creader.readexactly(int(headers["content-length"]))
                fault = self._take(method, uri, headers)
                self.log.append((method, uri, headers.get("range", ""), fault))
                if fault == "stall":                      # until cancelled or the client leaves
                    while await creader.read(1 << 16):
                        pass
                    self.left.append((uri, headers.get("range", ""), time.monotonic()))
                    return
                if fault in ("503", "429"):
                    reason = "Service Unavailable" if fault == "503" else "Too Many Requests"
                    cwriter.write(f"HTTP/1.1 {fault} {reason}\r\nContent-Length: 0\r\n"
                                  f"Retry-After: 0\r\n\r\n".encode())
                    await cwriter.drain()
                    continue
                if self.rtt:
                    await asyncio.sleep(self.rtt / 2)
                if upstream is None:
                    upstream = await asyncio.open_connection("127.0.0.1", self.upstream_port,
                                                             limit=1 << 20)
                ureader, uwriter = upstream
                uwriter.write(head + body)
                await uwriter.drain()
                rhead = await _read_head(ureader)
                if rhead is None:
                    return
                status, rheaders = _parse_response(rhead)
                length = None
                if method == "HEAD" or status in (204, 304) or 100 <= status < 200:
                    length = 0
                elif "content-length" in rheaders:
                    length = int(rheaders["content-length"])
                cut = length // 2 if fault == "drop" and length else None
                await self._relay(rhead, ureader, cwriter, length, cut)
                if cut is not None or length is None or rheaders.get("connection", "").lower() == "close":
                    return
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.CancelledError):
            return
        finally:
            self._tasks.discard(task)
            for w in ([cwriter] + ([upstream[1]] if upstream else [])):
                try:
                    w.close()
                except Exception:
                    pass

    async def _relay(self, rhead: bytes, ureader, cwriter, length: int | None, cut: int | None):
        """The response head and body to the client; with ``rtt``, through a delay line of
        rtt/2 whose window holds at most ``window`` bytes (released after a full rtt, as ACKs
        return), so the reader's rate is bounded by window/rtt."""
        loop = asyncio.get_running_loop()
        budget = cut if cut is not None else length
        in_flight: collections.deque = collections.deque()     # (ack time, nbytes)
        flying = 0
        pending = [rhead]
        sent = 0
        while True:
            if pending:
                chunk = pending.pop()
            else:
                if budget is not None and sent >= budget:
                    break
                want = 1 << 18 if budget is None else min(1 << 18, budget - sent)
                chunk = await ureader.read(want)
                if not chunk:
                    break
                sent += len(chunk)
            if self.rtt:
                now = loop.time()
                while flying + len(chunk) > self.window and in_flight:
                    ack, n = in_flight.popleft()
                    if ack > now:
                        await asyncio.sleep(ack - now)
                        now = loop.time()
                    flying -= n
                in_flight.append((now + self.rtt, len(chunk)))
                flying += len(chunk)
                loop.call_later(self.rtt / 2, _write_if_open, cwriter, chunk)
                if cwriter.transport.get_write_buffer_size() > self.window:
                    await cwriter.drain()          # a reader slower than the link
            else:
                cwriter.write(chunk)
                await cwriter.drain()
        if self.rtt and in_flight:
            await asyncio.sleep(max(0.0, in_flight[-1][0] - self.rtt / 2 - loop.time()) + 0.001)
            await cwriter.drain()


def _write_if_open(writer, chunk: bytes) -> None:
    if not writer.is_closing():
        writer.write(chunk)


async def _read_head(reader) -> bytes | None:
    try:
        return await reader.readuntil(b"\r\n\r\n")
    except (asyncio.IncompleteReadError, ConnectionError):
        return None


def _headers(lines: list[bytes]) -> dict[str, str]:
    out = {}
    for line in lines:
        name, _, value = line.decode("latin-1").partition(":")
        out[name.strip().lower()] = value.strip()
    return out


def _parse_request(head: bytes) -> tuple[str, str, dict]:
    lines = head.split(b"\r\n")
    method, uri, _ = lines[0].decode("latin-1").split(" ", 2)
    return method, uri, _headers([line for line in lines[1:] if line])


def _parse_response(head: bytes) -> tuple[int, dict]:
    lines = head.split(b"\r\n")
    status = int(lines[0].split(b" ", 2)[1])
    return status, _headers([line for line in lines[1:] if line])


# -- a caching tier in front of an origin (docs/guide/fleet.md) ----------------------------------

# What goes in nginx's http {} block: the same text, with the example values below, is the
# config docs/guide/fleet.md shows (tests/remote/test_fleet.py compares the two).
CACHE_TIER_SITE = r"""proxy_cache_path {cache_dir} levels=1:2 keys_zone=tensorfs:64m
                 max_size={max_size} inactive=30d use_temp_path=off;

upstream origin {{
    server {origin};
    keepalive 16;                    # reuse connections to the origin
}}

server {{
    listen {listen};
    proxy_http_version 1.1;          # keep-alive to the origin needs HTTP/1.1 ...
    proxy_set_header Connection "";  # ... and no "Connection: close"

    # model files: fetched from the origin in 4 MiB slices, each cached on its own
    location / {{
        slice 4m;                                   # tensorfs's block size
        proxy_set_header Range $slice_range;        # ask the origin for the slice only
        proxy_cache tensorfs;
        proxy_cache_key $uri$is_args$args$slice_range;
        proxy_cache_valid 200 206 {valid};               # then asked again, with If-None-Match:
        proxy_cache_revalidate on;                  # 304 (no body) if the origin has not changed
        proxy_cache_lock on;                        # one origin fetch per slice; the
        proxy_cache_lock_timeout 5m;                # other nodes wait for it
        proxy_cache_lock_age 5m;
        add_header X-Cache-Status $upstream_cache_status always;
        proxy_pass http://origin;
    }}

    # a Hub mirror's API answers (a branch's commit, listings) change: passed, not cached
    location /api/ {{
        proxy_pass http://origin;
    }}
}}
"""
# the values docs/guide/fleet.md shows
CACHE_TIER_EXAMPLE = {"cache_dir": "/var/cache/nginx/tensorfs", "max_size": "500g",
                      "origin": "models.internal:80", "listen": "8080", "valid": "1m"}

CACHE_TIER_CONF = _NGINX_HEAD.replace("LOG_FIELD", '"cache":"$upstream_cache_status"') + r"""    server_tokens off;
{site}
}}
"""


class CacheTier(Nginx):
    """A caching nginx on 127.0.0.1 in front of the origin at ``127.0.0.1:origin_port``, from
    ``CACHE_TIER_SITE``; its cache under the prefix.  The access log (``requests``) is what it
    sent to its clients, with ``cache``: HIT, MISS ... per request."""

    def __init__(self, base: Path, origin_port: int, workers: int = 1, max_size: str = "4g",
                 valid: str = "1m"):
        """``valid``: how long a cached slice is served before the origin is asked again."""
        super().__init__(base, workers=workers)
        self.origin_port = origin_port
        self.max_size = max_size
        self.valid = valid

    @property
    def cache_dir(self) -> Path:
        return self.prefix / "cache"

    def publish(self) -> None:
        """Nothing of its own to serve."""

    def config(self) -> str:
        site = CACHE_TIER_SITE.format(cache_dir=self.cache_dir, max_size=self.max_size,
                                      valid=self.valid,
                                      origin=f"127.0.0.1:{self.origin_port}",
                                      listen=f"127.0.0.1:{self.port}")
        return CACHE_TIER_CONF.format(prefix=self.prefix, workers=self.workers,
                                      user="user root;" if os.geteuid() == 0 else "",
                                      site="\n".join("    " + line if line else line
                                                     for line in site.splitlines()))


def _main(argv: list[str]) -> None:
    """python tests/support/servers.py nginx DIR | proxy UPSTREAM_PORT [RTT_S [WINDOW_BYTES]]: one
    server in the foreground, its URL on the first line of stdout, until SIGTERM or Ctrl-C
    (bench/rows/remote.py runs the proxy this way, out of the benchmark's own process)."""
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    if argv[0] == "nginx":
        server = Nginx(Path(argv[1] if len(argv) > 1 else "/tmp/tensorfs-servers")).start()
        print(server.url, "serving", server.www, flush=True)
    else:
        rtt = float(argv[2]) if len(argv) > 2 else 0.0
        window = int(argv[3]) if len(argv) > 3 else 4 << 20
        server = Proxy(int(argv[1]), rtt=rtt, window=window).start()
        print(server.url, flush=True)
    try:
        stop.wait()
    except KeyboardInterrupt:
        pass
    server.stop()


if __name__ == "__main__":
    _main(sys.argv[1:] or ["nginx"])
