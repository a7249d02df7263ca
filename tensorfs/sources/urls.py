"""URLs: every helper about a MODEL that may be a URL lives here.  What is a URL
(``is_url``), how one is shown without its credentials (``display_url``, ``shown_name``,
``shown_source``), which parts of it are secret and which of a command line's words are
(``url_secrets``, ``command_line_secrets``, ``argument_secrets``), and the one place where
the remote options are checked and become the settings a URL is read with
(``option_problem``, ``remote_settings``).  The reading itself is
``tensorfs.sources.remote``'s.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from urllib.parse import urlsplit, urlunsplit


def display_url(url: str) -> str:
    """``url`` as shown anywhere (an error line, the log, ``list``, metadata.json, the
    fsname): without what ``url_secrets`` names."""
    parts = urlsplit(url)
    host = parts.netloc.rpartition("@")[2]
    return urlunsplit((parts.scheme, host, parts.path, "", ""))


def url_secrets(url: str) -> list[str]:
    """The parts of ``url`` that may be credentials, as typed: the user info (a token given
    as the user name, ``user:password``), the query (a signature), the fragment.  The one
    rule: ``display_url`` leaves out exactly these, and the command line hides them
    (``runtime.hide_from_cmdline``)."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return [url]        # not a URL after all: all of it, rather than a part
    return [part for part in (parts.netloc.rpartition("@")[0], parts.query, parts.fragment)
            if part]


def is_url(text: str) -> bool:
    scheme, sep, _ = text.partition("://")
    return bool(sep) and scheme.replace("+", "").replace("-", "").isalnum() and "/" not in scheme


def shown_name(model: str) -> str:
    """How a model is named in output: as given, a URL without its credentials or query."""
    return display_url(model) if is_url(model) else model


def option_problem(models: list[str], *, storage_options=None, timeout: float | None = None,
                   disk_cache=None) -> str | None:
    """What is wrong with the remote options given for ``models`` (one line), or None:
    ``--storage-option`` and ``--disk-cache`` apply to a URL only, a timeout is more than 0."""
    if not any(is_url(m) for m in models):
        given = [name for name, value in (("--storage-option", storage_options),
                                          ("--disk-cache", disk_cache)) if value]
        if given:
            return f"{' and '.join(given)} {'apply' if len(given) > 1 else 'applies'} to a URL only"
    if timeout is not None and not timeout > 0:
        return "--timeout must be more than 0 seconds"
    return None


@dataclass
class RemoteSettings:
    storage_options: dict = field(default_factory=dict)
    timeout: float = 60.0                   # the longest wait of one read, retries included
    cache: object = None                    # the mount's tensorfs.cache.ByteLRU
    cache_bytes: int = 256 << 20            # when no cache is given
    disk_cache: tuple[str, int] | None = None       # (directory, bytes)
    # files the disk cache cannot keep (no version): said once on the terminal at mount
    unkept: list = field(default_factory=list)

    def notices(self) -> list[str]:
        """What the mount command says on the terminal besides errors, once: a disk cache
        that keeps nothing of some files."""
        unkept = list(dict.fromkeys(self.unkept))      # shards are opened in parallel
        if not unkept:
            return []
        more = f" (and {len(unkept) - 1} more files)" if len(unkept) > 1 else ""
        return [f"{unkept[0]}{more}: the server gives no version (ETag), so --disk-cache "
                "keeps none of its blocks: every mount fetches them again (serve it with "
                "ETags, as nginx does by default)"]


def remote_settings(model: str, *, storage_options=None, timeout: float | None = None,
                    cache=None, disk_cache: tuple[str, int] | None = None):
    """The ``RemoteSettings`` a URL is read with, or None for a local path.
    ``cache``: the mount's LRU, which holds the fetched blocks too (one ``--cache-size``);
    ``storage_options``: a dict, or the (KEY, value) pairs of ``--storage-option``."""
    if not is_url(model):
        return None
    settings = RemoteSettings(storage_options=dict(storage_options or {}), cache=cache,
                              disk_cache=disk_cache)
    if timeout is not None:
        settings.timeout = float(timeout)
    return settings


def is_scalar(text: str) -> bool:
    """A number, true, false or null as JSON reads it: a storage option's value that is
    shown as typed (``anon=true`` hides nothing); any other value may be a secret."""
    try:
        value = json.loads(text)
    except (ValueError, RecursionError):        # '[' * 100000 is no scalar either
        return False
    return value is None or isinstance(value, (bool, int, float))


def command_line_secrets(models: list[str], option_values: list[str]) -> list[str]:
    """What of a parsed command line is kept out of ``ps``: the credentials of every URL
    named (``url_secrets``) and every storage option's value but a scalar."""
    secrets = [s for m in models if is_url(m) for s in url_secrets(m)]
    return secrets + [value for value in option_values if not is_scalar(value)]


def argument_secrets(argv: list[str]) -> list[str]:
    """What in ``argv`` may be a secret, whatever the spelling (``--stor KEY=VALUE``,
    ``--storage-option=KEY=VALUE``, a mistyped flag): every URL's credentials
    (``url_secrets``) and every VALUE of an argument holding ``=``, unless it is a
    number, true, false or null (``--storage-option anon=true`` hides nothing)."""
    found = []
    for arg in argv:
        if is_url(arg):
            found += url_secrets(arg)
            continue
        rest = arg
        while "=" in rest:          # --s=KEY=VALUE: "KEY=VALUE" and "VALUE"
            rest = rest.split("=", 1)[1]
            if rest and not is_scalar(rest):
                found.append(rest)
    return sorted(set(found), key=len, reverse=True)        # the longest first


def without_secrets(text: str, argv: list[str]) -> str:
    """``text`` (an error line) with every secret of ``argv`` replaced by ``…``."""
    for secret in argument_secrets(argv):
        text = text.replace(secret, "…")
    return text


def shown_source(source: str) -> str:
    """The source as ``list`` shows it: a path made absolute, or a URL without its
    credentials (``display_url``), "?…" standing for a query string that may hold
    a signed token."""
    if "://" not in source:
        return os.path.abspath(source)
    try:
        return display_url(source) + ("?…" if urlsplit(source).query else "")
    except ValueError:
        return source.split("://", 1)[0] + "://…"
