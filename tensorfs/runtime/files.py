"""Where a mount's daemon keeps its runtime files: the pid file, the status file, the log.

Runtime files (docs/internals/reliability.md "Runtime files and process hygiene"): the pid
file, the status file ``tensorfs list`` reads and the default log live in a directory that
only the user can write, because a directory someone else can write lets them plant a
symlink where the daemon is about to create a file, and the daemon would then write its pid
over, or append its log to, whatever the link names:

- ``$XDG_RUNTIME_DIR/tensorfs``, if ``$XDG_RUNTIME_DIR`` is a directory (not a symlink)
  owned by the user that neither group nor others can write; otherwise it is passed over;
- ``/run/tensorfs`` for root;
- else ``/tmp/tensorfs-UID``, created 0700.

The directory chosen is created 0700 if missing and refused, with one line, if it is a
symlink, is not a directory, belongs to someone else or can be written by group or others.
Files in it are created with ``O_NOFOLLOW | O_EXCL`` (a file written whole goes to a fresh
temporary name, then is renamed over the old one) through a descriptor of the checked
directory, so nothing in it is reached through a symlink.

A mount's files are named for it (``_stem``), uniquely among live mounts: the resolved
mount point, or for ``/dev/fd/N`` the serving process's pid too.
"""

from __future__ import annotations

import hashlib
import os
import stat
import threading

from tensorfs.runtime.mounts import descriptor_of, real_mountpoint
from tensorfs.runtime.paths import unsafe_directory


class RuntimeDirError(Exception):
    """No safe place for the runtime files: said in one line by the CLI."""


def _private_dir(path: str, uid: int) -> str:
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    except OSError as error:
        raise RuntimeDirError(f"{path}: cannot create the runtime directory: "
                              f"{error.strerror}") from None
    why = unsafe_directory(os.lstat(path), uid)
    if why is not None:
        raise RuntimeDirError(f"{path}: refused as the runtime directory: {why} (remove it, "
                              "or set XDG_RUNTIME_DIR to a directory only you can write)")
    return path


def runtime_dir() -> str:
    uid = os.geteuid()
    base = os.environ.get("XDG_RUNTIME_DIR")
    if base and os.path.isabs(base):
        try:
            trusted = unsafe_directory(os.lstat(base), uid) is None
        except OSError:
            trusted = False
        if trusted:
            return _private_dir(os.path.join(base, "tensorfs"), uid)
    if uid == 0 and os.path.isdir("/run"):
        return _private_dir("/run/tensorfs", uid)
    return _private_dir(f"/tmp/tensorfs-{uid}", uid)


def known_dirs() -> list[str]:
    """Every safe runtime directory this user's mounts may have used, the current choice
    first: a mount from fstab ran without the shell's XDG_RUNTIME_DIR.  Nothing is created."""
    uid = os.geteuid()
    candidates = []
    base = os.environ.get("XDG_RUNTIME_DIR")
    if base and os.path.isabs(base):
        candidates.append((base, os.path.join(base, "tensorfs")))
    if uid == 0:
        candidates.append((None, "/run/tensorfs"))
    candidates.append((None, f"/tmp/tensorfs-{uid}"))
    found = []
    for parent, path in candidates:
        try:
            if parent is not None and unsafe_directory(os.lstat(parent), uid) is not None:
                continue
            if unsafe_directory(os.lstat(path), uid) is None:
                found.append(path)
        except OSError:
            continue
    return found


def open_runtime_dir() -> tuple[str, int]:
    """(path, descriptor) of the runtime directory, checked again through the descriptor:
    what is opened is what was checked, whatever happens to the path afterwards."""
    path = runtime_dir()
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    why = unsafe_directory(os.fstat(fd), os.geteuid())
    if why is not None:
        os.close(fd)
        raise RuntimeDirError(f"{path}: refused as the runtime directory: {why}")
    return path, fd


def write_file(dir_fd: int, name: str, data: bytes, durable: bool = False) -> None:
    """Replace ``name`` in the directory ``dir_fd`` with ``data``, whole or not at all:
    written to a fresh name (``O_EXCL | O_NOFOLLOW``, one per thread), renamed over.  A
    failure (ENOSPC) leaves no temporary file behind.  ``durable``: the file is fsynced
    before the rename and the directory after it, so that a crash leaves the old or the
    new bytes (the edit store's journal)."""
    tmp = f".{name}.{os.getpid()}.{threading.get_ident()}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                 0o600, dir_fd=dir_fd)
    try:
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            if durable:
                os.fsync(fd)
        finally:
            os.close(fd)
        os.rename(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except BaseException:
        try:
            os.unlink(tmp, dir_fd=dir_fd)
        except OSError:
            pass
        raise
    if durable:
        try:
            os.fsync(dir_fd)
        except OSError:
            pass


def read_file(path: str, limit: int = 1 << 16) -> bytes | None:
    """A runtime file's bytes (never through a symlink), or None."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        return os.read(fd, limit)
    except OSError:
        return None
    finally:
        os.close(fd)


def _stem(mountpoint: str, pid: int | None = None) -> str:
    """The runtime files' name of a mount, unique among live mounts: the resolved mount
    point (``NAME-HASH``), or for ``/dev/fd/N`` (a descriptor: any number of mounts share
    the name) the serving process's too, ``pid`` or this process's (``dev_fd_N-pidPID``)."""
    fd = descriptor_of(mountpoint)
    if fd is not None:
        return f"{_descriptor_prefix(fd)}{os.getpid() if pid is None else pid}"
    real = real_mountpoint(mountpoint)
    readable = "".join(c if c.isalnum() else "_" for c in real.strip("/"))[-60:]
    return f"{readable}-{hashlib.sha256(real.encode('utf-8', 'surrogateescape')).hexdigest()[:12]}"


def _descriptor_prefix(fd: int) -> str:
    return f"dev_fd_{fd}-pid"


def pid_file(mountpoint: str) -> str:
    return os.path.join(runtime_dir(), _stem(mountpoint) + ".pid")


def status_file(mountpoint: str) -> str:
    return os.path.join(runtime_dir(), _stem(mountpoint) + ".json")


def find_files(mountpoint: str, suffix: str) -> list[str]:
    """``mountpoint``'s runtime files with ``suffix`` (".pid", ".json") in every known
    runtime directory where there is one; for ``/dev/fd/N``, every mount's of that name."""
    fd = descriptor_of(mountpoint)
    found = []
    for directory in known_dirs():
        if fd is None:
            name = _stem(mountpoint) + suffix
            if os.path.lexists(os.path.join(directory, name)):
                found.append(os.path.join(directory, name))
            continue
        try:
            names = sorted(os.listdir(directory))
        except OSError:
            continue
        prefix = _descriptor_prefix(fd)
        found += [os.path.join(directory, n) for n in names if n.startswith(prefix)
                  and n.endswith(suffix) and n[len(prefix):-len(suffix)].isdigit()]
    return found


def default_log_file(mountpoint: str) -> str:
    return os.path.join(runtime_dir(), _stem(mountpoint) + ".log")


