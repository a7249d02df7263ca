"""What the user named as MODEL, when it may be a URL: the one place where the remote
options are checked, become the settings a URL is read with, and where the secrets of a
command line are found.

How a URL is shown without its credentials (``display_url``) and which parts of it are
secret (``url_secrets``) are ``tensorfs.sources.location``'s; the reading itself is
``tensorfs.sources.remote``'s.
"""

from __future__ import annotations

import json

from tensorfs.sources.location import display_url, is_url, url_secrets


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


def remote_settings(model: str, *, storage_options=None, timeout: float | None = None,
                    cache=None, disk_cache: tuple[str, int] | None = None):
    """The ``tensorfs.sources.remote.RemoteSettings`` a URL is read with, or None for a local path.
    ``cache``: the mount's LRU, which holds the fetched blocks too (one ``--cache-size``);
    ``storage_options``: a dict, or the (KEY, value) pairs of ``--storage-option``."""
    if not is_url(model):
        return None
    from tensorfs.sources.remote import RemoteSettings  # a URL only: it imports the transports

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
