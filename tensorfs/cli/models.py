"""What the commands that read a model share (mount, inspect): the settings a URL is read
with, from the command line's options, and the collector held off while a model is loaded.
"""

from __future__ import annotations

import contextlib
import gc

from tensorfs.cli.errors import UsageError


def settings_of(args, cache):
    """How a URL's files are read (tensorfs.sources.remote); nothing for a local file.  ``cache``:
    the mount's LRU, which holds the fetched blocks too (one --cache-size)."""
    from tensorfs.sources.urls import option_problem, remote_settings

    disk_cache = getattr(args, "disk_cache", None)      # mount only
    problem = option_problem([args.model], storage_options=args.storage_options,
                             timeout=args.timeout, disk_cache=disk_cache)
    if problem is not None:
        raise UsageError(problem)
    return remote_settings(args.model, storage_options=args.storage_options,
                           timeout=args.timeout, cache=cache, disk_cache=disk_cache)


@contextlib.contextmanager
def no_gc_while_building():
    """Parsing and building a tree make ~5 long-lived objects per tensor, none of them
    cyclic garbage: collection passes over them cost half the mount time of a 100k-tensor
    model (measured).  Frozen afterwards, they are never scanned again."""
    gc.disable()
    try:
        yield
    finally:
        gc.enable()
        gc.freeze()
