"""What tensorfs asks of the machine, one concern per module (the lowest layer: it imports
nothing else of tensorfs):

- ``paths``: the one rule for a path someone else controls; the user's private directories
  (``--disk-cache DIR``, ``--edits DIR``);
- ``files``: the runtime directory and a mount's runtime files in it (pid, status, log);
- ``mounts``: the mount table, and the names a mount is known by;
- ``claims``: one owner of a directory (``--edits DIR``), held for a daemon's life;
- ``userlog``: ``--log FILE``, opened without letting another user redirect it;
- ``cmdline``: secrets overwritten in what ``ps`` shows;
- ``libraries``: numpy and gguf, imported whole under one lock (the only way tensorfs
  imports them: the first request that needs numpy may come on several threads at once).

The names below are the modules' own, kept here for callers that import them from
``tensorfs.runtime``.
"""

from tensorfs.runtime.cmdline import hide_from_cmdline
from tensorfs.runtime.files import (
    RuntimeDirError,
    _stem,
    default_log_file,
    find_files,
    known_dirs,
    open_runtime_dir,
    pid_file,
    read_file,
    runtime_dir,
    status_file,
    write_file,
)
from tensorfs.runtime.mounts import (
    descriptor_of,
    mount_device,
    mount_type,
    real_mountpoint,
    tensorfs_mounts,
)
from tensorfs.runtime.paths import (
    open_private_dir,
    open_private_subdir,
    others_control,
    unsafe_directory,
    walk_problem,
)
from tensorfs.runtime.userlog import open_user_log

__all__ = ["RuntimeDirError", "_stem", "default_log_file", "descriptor_of", "find_files",
           "hide_from_cmdline", "known_dirs", "mount_device", "mount_type", "open_private_dir",
           "open_private_subdir", "open_runtime_dir", "open_user_log", "others_control",
           "pid_file", "read_file", "real_mountpoint", "runtime_dir", "status_file",
           "tensorfs_mounts", "unsafe_directory", "walk_problem", "write_file"]
