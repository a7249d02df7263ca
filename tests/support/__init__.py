"""The suite's shared helpers, in one package imported one way: ``from tests.support import
run_tensorfs, mounts_in, wait_for, ...`` (pyproject puts the repository root on pytest's
path, so this works from ``pytest``, ``python -m pytest``, a subprocess pytest and
tests/remote alike).  ``tests/conftest.py`` holds only fixtures and hooks, and re-exports
what tests imported from it before (``from tests.support import run_tensorfs`` still works).

- ``commands``: the suite's runtime directory, the ``tensorfs`` command, ``run_tensorfs``;
- ``mounts``: ``fuse_mounts_under``, ``mounts_in`` (the generator behind ``mount``/``rmount``);
- ``files``: ``bytes_at_one_moment`` (a directory's bytes while others write into it);
- ``processes``: ``daemon_pid``, ``alive``, ``read_errno``, and the waits on something
  observable (``wait_for``, ``in_fuse_request``, ``waiting_on_fuse``) that replace sleeps.
"""

from tests.support.commands import RUNTIME_DIR, TENSORFS, run_tensorfs, usage_error
from tests.support.files import bytes_at_one_moment
from tests.support.mounts import fuse_mounts_under, mount_expecting_refusal, mounts_in
from tests.support.processes import (
                                     EIO,
                                     alive,
                                     cmdline,
                                     daemon_pid,
                                     direct_read,
                                     in_fuse_request,
                                     read_errno,
                                     wait_for,
                                     waiting_on_fuse,
                                     worker_pids,
)

__all__ = ["RUNTIME_DIR", "TENSORFS", "run_tensorfs", "usage_error", "fuse_mounts_under", "mount_expecting_refusal",
           "mounts_in", "EIO", "bytes_at_one_moment",
           "alive", "cmdline", "daemon_pid", "direct_read", "in_fuse_request", "read_errno", "wait_for",
           "waiting_on_fuse", "worker_pids"]
