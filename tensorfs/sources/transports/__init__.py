"""Transports: the requests that fetch a remote file's bytes (docs/reference/remote.md).

One module per protocol family, each turning its library's failures into ``FetchError``:

- ``tensorfs.sources.transports.http``: ``http://``, ``https://`` through obstore (Rust
  ``object_store`` and reqwest: the body is received outside the GIL);
- ``tensorfs.sources.transports.hub``: ``hf://``, huggingface_hub for the revision's commit and the
  listings, then the commit's files over HTTP(S) as above;
- ``tensorfs.sources.transports.cloud``: ``s3://`` (and ``gs://``, ``az://``) through obstore;
- ``tensorfs.sources.transports.generic``: any other protocol fsspec knows.

``transport_for`` is the one place a URL picks its transport.  Above this package,
``tensorfs.sources.remote`` keeps a file's size and version, the retries and the block cache; a
transport answers one request at a time and says, for each failure, what kind it is and
whether another try may help.
"""

from __future__ import annotations


def transport_for(url: str, settings):
    """The one place a URL becomes a transport (ratarmount's factory, STYLE.md)."""
    scheme = url.split("://", 1)[0].lower()
    # the one transport the URL needs: each pulls in its own extra (obstore, fsspec,
    # huggingface_hub), which a mount of another kind never imports
    if scheme in ("http", "https"):
        from tensorfs.sources.transports.http import HttpTransport

        return HttpTransport(url, settings)
    if scheme == "hf":
        from tensorfs.sources.transports.hub import HubTransport

        return HubTransport(url, settings)
    from tensorfs.sources.transports.cloud import SCHEMES, CloudTransport

    if scheme in SCHEMES:
        return CloudTransport(url, settings)
    from tensorfs.sources.transports.generic import FsspecTransport

    return FsspecTransport(url, settings)


OBSTORE_SCHEMES = ("http", "https", "hf", "s3", "gs", "az")


def start_early(url: str) -> None:
    """For a process that will fork (the mount command): start now, without waiting, what
    reading ``url`` will need in this process: obstore's helper process, whose start then
    overlaps with this one's imports and checks instead of following them."""
    if url.split("://", 1)[0].lower() in OBSTORE_SCHEMES:
        from tensorfs.sources.transports import objects

        objects.start_helper()
