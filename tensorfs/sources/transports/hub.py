"""``hf://[datasets/|spaces/]ORG/REPO[@REVISION][/PATH]``: huggingface_hub resolves the
revision to its commit (at mount) and lists directories; the files are read from the
commit's resolve URLs (``ENDPOINT/ORG/REPO/resolve/COMMIT/PATH``) over HTTP(S) like any URL
(``tensorfs.sources.transports.http``), with the token huggingface_hub finds sent as
``Authorization: Bearer`` (which reqwest drops on the redirect to the Hub's CDN, another
origin).  Every huggingface_hub call is waited for at most ``--timeout``
(``tensorfs.sources.transports.base.bounded``), and its answers are bounded too (``_bound_answers``: at
most ``MAX_ANSWER_BYTES`` a page, as they are, at most ``MAX_LISTING_ENTRIES`` a listing); each
failure is one line: a gated repo, a missing repo or revision, an answer that is not the
Hub's JSON, or more of it than any repository's.
"""

from __future__ import annotations

import functools
import os
import ssl
import sys
import threading
from itertools import islice
from urllib.parse import quote

from tensorfs.errors import ModelError
from tensorfs.sources.location import DIRECTORY, FILE
from tensorfs.sources.transports.base import FetchError, bounded, missing_extra
from tensorfs.sources.transports.http import HttpTransport
from tensorfs.sources.transports.objects import obstore, python_tls_problem, trusted_roots
from tensorfs.sources.transports.receive import trust_context
from tensorfs.sources.urls import display_url

# The Hub answers a revision's info and a listing's page in JSON of a few hundred KiB (a
# repository of 100,000 files: ~15 MiB of siblings); a server that sends more, or an endless
# listing, is refused before it fills the memory.
MAX_ANSWER_BYTES = 64 << 20
MAX_LISTING_ENTRIES = 1 << 17

_our_call = threading.local()       # set while a call of ours runs in this thread


@functools.cache
def _bounded_body_type(http_library):
    """A byte stream of ``http_library`` (httpx, or httpx2 from huggingface_hub 2 on: the
    client's response checks the stream's base class) that fails past its limit."""

    class BoundedBody(http_library.SyncByteStream):
        def __init__(self, stream, limit: int):
            self._stream, self._limit = stream, limit

        def __iter__(self):
            given = 0
            for chunk in self._stream:
                given += len(chunk)
                if given > self._limit:
                    raise FetchError("too_long", f"an answer of more than {self._limit >> 20} MiB")
                yield chunk

        def close(self):
            self._stream.close()
    return BoundedBody


def _ask_plain(request) -> None:
    if getattr(_our_call, "active", False):
        request.headers["Accept-Encoding"] = "identity"


def _bound_body(response) -> None:
    if not getattr(_our_call, "active", False):
        return                      # the program's own huggingface_hub calls: not ours to bound
    encoding = response.headers.get("Content-Encoding", "").strip().lower()
    if encoding not in ("", "identity"):
        raise FetchError("encoding", f"the server sent the answer encoded ({encoding}) although "
                         f"asked for it as it is (Accept-Encoding: identity)")
    http_library = sys.modules[type(response).__module__.partition(".")[0]]
    response.stream = _bounded_body_type(http_library)(response.stream, MAX_ANSWER_BYTES)


def _bound_answers() -> None:
    """Hooks on huggingface_hub's shared HTTP client (made anew after a fork) that ask for
    bodies as they are and stop reading one past ``MAX_ANSWER_BYTES``, for the calls made by
    ``HubTransport._hub_call`` only."""
    from huggingface_hub.utils import get_session  # the remote extra: hf:// only

    client = get_session()
    if getattr(client, "_tensorfs_bounded", False):
        return
    hooks = client.event_hooks
    client.event_hooks = {"request": [*hooks.get("request", []), _ask_plain],
                          "response": [*hooks.get("response", []), _bound_body]}
    client._tensorfs_bounded = True  # type: ignore[attr-defined]  # httpx's, tagged


_trusted: tuple | None = None       # the trust huggingface_hub's client was made with


def _trust_hub_client(root_certificate: str | None) -> None:
    """huggingface_hub's shared client (its API requests: the revision, the listings) made
    to trust what ``trust_context`` says; left as huggingface_hub makes it where that is
    the same (no ``root_certificate``, not both SSL_CERT_FILE and SSL_CERT_DIR)."""
    global _trusted
    wanted = (root_certificate, os.environ.get("SSL_CERT_FILE"), os.environ.get("SSL_CERT_DIR"))
    if _trusted == wanted or (_trusted is None and not root_certificate
                              and not (wanted[1] and wanted[2])):
        return
    from huggingface_hub import close_session, set_client_factory  # the remote extra
    from huggingface_hub.utils import _http

    context = trust_context(root_certificate)

    def client():       # huggingface_hub's own client, but for what it trusts
        made = _http.default_client_factory()
        library = sys.modules[type(made).__module__.partition(".")[0]]     # httpx or httpx2
        hooks, timeout = made.event_hooks, made.timeout
        made.close()
        return library.Client(event_hooks=hooks, follow_redirects=True, timeout=timeout,
                              verify=context)
    set_client_factory(client)
    close_session()
    _trusted = wanted


class HubTransport(HttpTransport):
    etag_checked = False            # the commit pins the bytes (a CDN's ETag may differ)
    commit: str | None = None       # the revision's, resolved at the first connect
    listable = True

    def normalize(self, path):
        shown = display_url(path)
        return shown.rstrip("/") if shown.rstrip("/") != "hf:" else shown
    hint_401 = "a gated or private repo: set HF_TOKEN to a token with access"

    def _connect(self) -> None:
        try:
            import huggingface_hub  # the remote extra: hf:// only
        except ImportError:
            raise missing_extra("huggingface_hub", self.url) from None
        obstore(self.url)
        self._stores: dict[str, object] = {}
        self._query = ("", "")
        options = dict(self.settings.storage_options)
        self.token = options.pop("token", None) or huggingface_hub.get_token()
        self.endpoint = (options.pop("endpoint", None)
                         or huggingface_hub.constants.ENDPOINT).rstrip("/")
        self._headers = dict(options.pop("headers", None) or {})
        self._extra = trusted_roots(options, display_url(self.url))
        try:
            _trust_hub_client(self._extra.get("root_certificate"))
        except ssl.SSLError as error:   # a PEM block OpenSSL cannot read, a trust path it cannot
            raise ModelError("remote_options", "the certificates to trust cannot be loaded "
                             f"({error.reason or error})", file=display_url(self.url)) from None
        if self.token:
            self._headers["Authorization"] = f"Bearer {self.token}"
        self._choose_receiver(https_only=self.endpoint.lower().startswith("https://"))
        self.api = huggingface_hub.HfApi(endpoint=self.endpoint, token=self.token or False)
        rest = self.url.split("://", 1)[1]
        self.repo_type, self.type_prefix = "model", ""
        for kind in ("datasets", "spaces"):
            if rest.startswith(kind + "/"):
                self.repo_type, self.type_prefix, rest = kind[:-1], kind + "/", rest[len(kind) + 1:]
        parts = rest.split("/")
        if len(parts) < 2 or not parts[0] or not parts[1]:
            raise ModelError("remote_url", "an hf:// URL is hf://ORG/REPO[@REVISION][/PATH]",
                             file=display_url(self.url))
        repo, _, revision = parts[1].partition("@")
        self.repo_id = f"{parts[0]}/{repo}"
        self.root = f"hf://{self.type_prefix}{parts[0]}/{parts[1]}"
        self.revision = revision or "main"
        if self.commit is None:         # resolved once, not again at a reopen (fork)
            self.commit = self._resolve()
        self._listings: dict[str, tuple[set, set]] = {}
        self._sizes: dict[str, dict[str, int]] = {}

    def _hub_call(self, fn, what: str):
        """``fn()`` (a huggingface_hub call), within ``--timeout``; a failure the Hub's
        errors do not name (no network, an answer that is not JSON) as one line."""
        shown = display_url(self.url)

        def ours():
            _our_call.active = True
            try:
                _bound_answers()
                return fn()
            finally:
                _our_call.active = False
        try:
            return bounded(ours, self.settings.timeout)
        except FetchError as error:
            kind = "remote_timeout" if error.kind == "timeout" else "remote_error"
            raise ModelError(kind, f"{what}: {error.message} from {self.endpoint}",
                             file=shown) from None
        except (ValueError, RecursionError) as error:     # not the Hub's JSON (or too deep)
            raise ModelError("remote_error", f"{what}: {self.endpoint} answered something "
                             f"that is not the Hub's JSON ({type(error).__name__})",
                             file=shown) from None

    def _resolve(self) -> str:
        """The revision's commit, at mount: every read names it."""
        # the remote extra: hf:// only
        from huggingface_hub.utils import (
            GatedRepoError,
            HfHubHTTPError,
            RepositoryNotFoundError,
            RevisionNotFoundError,
        )

        shown = display_url(self.url)
        try:
            info = self._hub_call(lambda: self.api.repo_info(
                self.repo_id, revision=self.revision, repo_type=self.repo_type,
                timeout=self.settings.timeout), "resolving the revision")
        except GatedRepoError:
            raise ModelError("remote_denied", f"access denied: {self.hint_401}", file=shown) from None
        except RepositoryNotFoundError:
            raise ModelError("remote_not_found", f"repository {self.repo_id} not found (or private: "
                             "set HF_TOKEN)", file=shown) from None
        except RevisionNotFoundError:
            raise ModelError("remote_not_found", f"revision {self.revision!r} not found in "
                             f"{self.repo_id}", file=shown) from None
        except HfHubHTTPError as error:
            status = getattr(getattr(error, "response", None), "status_code", None)
            raise ModelError("remote_error", f"the Hub answered HTTP {status}", file=shown) from None
        except ModelError:
            raise
        except Exception as error:      # no network: httpx / requests connection errors
            raise ModelError("remote_unreachable", f"cannot connect to {self.endpoint}: "
                             f"{python_tls_problem(error) or type(error).__name__}",
                             file=shown) from None
        sha = getattr(info, "sha", None)
        if not isinstance(sha, str) or not sha:
            raise ModelError("remote_error", f"{self.endpoint} named no commit for revision "
                             f"{self.revision!r}", file=shown)
        return sha

    def probe(self, path, timeout):
        pin, first, mtime = super().probe(path, timeout)
        return pin._replace(version=self.commit), first, mtime      # its size checked still

    def _in_repo(self, path: str) -> str:
        if path == self.root:
            return ""
        if not path.startswith(self.root + "/"):
            raise ModelError("shard_path", "outside the repository", file=path)
        return path[len(self.root) + 1:].strip("/")

    def real(self, path):
        return (f"{self.endpoint}/{self.type_prefix}{self.repo_id}/resolve/{self.commit}/"
                f"{quote(self._in_repo(path))}")

    def located(self, path):
        """Every file of the repo asked of one store, the endpoint's (not one per file)."""
        return (self.endpoint + "/",
                f"{self.type_prefix}{self.repo_id}/resolve/{self.commit}/{self._in_repo(path)}")

    def _listing(self, directory: str) -> tuple[set, set]:
        if directory not in self._listings:
            from huggingface_hub.utils import EntryNotFoundError, HfHubHTTPError  # the extra

            shown = f"{self.root}/{directory}".rstrip("/")
            files, dirs, sizes = set(), set(), {}
            try:
                entries = self._hub_call(lambda: list(islice(self.api.list_repo_tree(
                    self.repo_id, path_in_repo=directory or None, revision=self.commit,
                    repo_type=self.repo_type), MAX_LISTING_ENTRIES + 1)), "listing")
            except EntryNotFoundError:
                entries = []
            except HfHubHTTPError as error:
                status = getattr(getattr(error, "response", None), "status_code", None)
                if status != 404:
                    raise ModelError("remote_error", f"listing failed: HTTP {status}",
                                     file=shown) from None
                entries = []
            except ModelError:
                raise
            except Exception as error:      # any exception: no network, a broken answer
                raise ModelError("remote_error", "listing failed: "
                                 f"{python_tls_problem(error) or type(error).__name__}",
                                 file=shown) from None
            if len(entries) > MAX_LISTING_ENTRIES:
                raise ModelError("remote_error", f"listing: more than {MAX_LISTING_ENTRIES} "
                                 "entries in one directory", file=shown)
            for entry in entries:
                name = str(getattr(entry, "path", "")).rsplit("/", 1)[-1]
                if name:
                    (dirs if type(entry).__name__ == "RepoFolder" else files).add(name)
                    size = getattr(entry, "size", None)
                    if type(entry).__name__ != "RepoFolder" and type(size) is int and size >= 0:
                        sizes[name] = size
            self._listings[directory] = (files, dirs)
            self._sizes[directory] = sizes
        return self._listings[directory]

    def kind(self, path):
        in_repo = self._in_repo(path)
        if not in_repo:
            return DIRECTORY
        parent, _, name = in_repo.rpartition("/")
        files, dirs = self._listing(parent)
        return FILE if name in files else DIRECTORY if name in dirs else None

    def files(self, directory):
        return sorted(n for n in self._listing(self._in_repo(directory))[0]
                      if not n.startswith("."))

    def sizes(self, directory):
        in_repo = self._in_repo(directory)
        self._listing(in_repo)
        return dict(self._sizes.get(in_repo, {}))
