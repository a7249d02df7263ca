"""Where a mount's daemon keeps its runtime files, and how to tell what is mounted.

Runtime files (docs/reliability.md "Runtime files and process hygiene"): the pid
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
"""

from __future__ import annotations

import errno
import hashlib
import os
import re
import stat
import threading


class RuntimeDirError(Exception):
    """No safe place for the runtime files: said in one line by the CLI."""


def unsafe_directory(st: os.stat_result, uid: int) -> str | None:
    """Why a directory with this lstat cannot hold uid's private files (runtime files, the
    disk cache's blocks), or None."""
    if stat.S_ISLNK(st.st_mode):
        return "it is a symbolic link"
    if not stat.S_ISDIR(st.st_mode):
        return "it is not a directory"
    if st.st_uid != uid:
        return f"it belongs to uid {st.st_uid}, not {uid}"
    if st.st_mode & 0o022:
        return f"group or others can write it (mode {stat.S_IMODE(st.st_mode):04o})"
    return None


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


def descriptor_of(mountpoint: str) -> int | None:
    """N when ``mountpoint`` is ``/dev/fd/N``: a /dev/fuse descriptor a privileged mounter
    opened and mounted, handed to this process (libfuse 3.3 and later serve it as is)."""
    match = re.fullmatch(r"/dev/fd/(\d+)", mountpoint)
    return int(match.group(1)) if match else None


def real_mountpoint(mountpoint: str) -> str:
    """The path a mount is known by: resolved, but ``/dev/fd/N`` as it is (resolved, it is
    /dev/fuse, whichever mount the descriptor belongs to)."""
    return mountpoint if descriptor_of(mountpoint) is not None else os.path.realpath(mountpoint)


def _stem(mountpoint: str) -> str:
    real = real_mountpoint(mountpoint)
    readable = "".join(c if c.isalnum() else "_" for c in real.strip("/"))[-60:]
    return f"{readable}-{hashlib.sha256(real.encode('utf-8', 'surrogateescape')).hexdigest()[:12]}"


def pid_file(mountpoint: str) -> str:
    return os.path.join(runtime_dir(), _stem(mountpoint) + ".pid")


def status_file(mountpoint: str) -> str:
    return os.path.join(runtime_dir(), _stem(mountpoint) + ".json")


def find_files(mountpoint: str, suffix: str) -> list[str]:
    """``mountpoint``'s runtime file with ``suffix`` (".pid", ".json") in every known
    runtime directory where there is one."""
    name = _stem(mountpoint) + suffix
    return [os.path.join(d, name) for d in known_dirs() if os.path.lexists(os.path.join(d, name))]


def default_log_file(mountpoint: str) -> str:
    return os.path.join(runtime_dir(), _stem(mountpoint) + ".log")


def _unescape_mountinfo(field: str) -> str:
    out, i = [], 0
    while i < len(field):
        if field[i] == "\\" and i + 3 < len(field) and field[i + 1:i + 4].isdigit():
            out.append(chr(int(field[i + 1:i + 4], 8)))
            i += 4
        else:
            out.append(field[i])
            i += 1
    return "".join(out)


def _mountinfo(real: str) -> tuple[str, str] | None:
    """(device "major:minor", filesystem type) of what is mounted exactly at the resolved
    path ``real``.

    Read from /proc/self/mountinfo, which also lists a FUSE mount whose daemon died (a stat
    of it fails with ENOTCONN, so os.path.ismount cannot see it).  The last mount wins.
    """
    found = None
    try:
        with open("/proc/self/mountinfo", encoding="utf-8", errors="surrogateescape") as f:
            for line in f:
                left, _, right = line.partition(" - ")
                fields = left.split()
                if len(fields) >= 5 and _unescape_mountinfo(fields[4]) == real:
                    found = fields[2], right.split()[0] if right else "unknown"
    except OSError:
        return None
    return found


def mount_type(mountpoint: str) -> str | None:
    """The filesystem type mounted exactly at ``mountpoint`` ("fuse.tensorfs" ...), or None."""
    found = _mountinfo(os.path.realpath(mountpoint))
    return found[1] if found else None


def mount_device(real_mountpoint: str) -> str | None:
    """The device ("0:54") of the mount at ``real_mountpoint``: its /sys/class/bdi entry's
    name.  The path must be resolved already: resolving it would stat the mount, and a
    single-threaded daemon asking about its own mount waits for itself."""
    found = _mountinfo(real_mountpoint)
    return found[0] if found else None


def tensorfs_mounts(uid: int | None = None) -> list[str]:
    """Mount points of the tensorfs mounts (type fuse.tensorfs) that ``uid`` made (the
    kernel's user_id of a FUSE mount), in mount order; every user's when ``uid`` is None."""
    found = []
    try:
        with open("/proc/self/mountinfo", encoding="utf-8", errors="surrogateescape") as f:
            for line in f:
                left, _, right = line.partition(" - ")
                fields, tail = left.split(), right.split()
                if len(fields) < 5 or len(tail) < 3 or tail[0] != "fuse.tensorfs":
                    continue
                options = dict(o.partition("=")[::2] for o in tail[2].split(","))
                if uid is None or options.get("user_id") == str(uid):
                    found.append(_unescape_mountinfo(fields[4]))
    except OSError:
        return []
    return found


def hide_from_cmdline(secrets: list[str]) -> None:
    """Overwrite ``secrets`` with ``*`` where ``/proc/PID/cmdline`` reads the command line
    from: this process's own argument memory (``arg_start``..``arg_end`` in
    ``/proc/self/stat``), as setproctitle does.  The daemon is a fork of this process and
    shows what it shows; done right after the arguments are parsed, before any request.
    Best effort: where the memory is not what cmdline shows, nothing is touched."""
    import ctypes  # only with a secret to hide: runtime is on every command's path

    wanted = [s.encode("utf-8", "surrogateescape") for s in secrets if s]
    if not wanted:
        return
    try:
        with open("/proc/self/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        start, end = int(fields[45]), int(fields[46])      # fields 48, 49: arg_start, arg_end
        with open("/proc/self/cmdline", "rb") as f:
            shown = f.read()
        if end <= start or ctypes.string_at(start, end - start) != shown:
            return
        for secret in wanted:
            at = shown.find(secret)
            while at >= 0:
                ctypes.memmove(start + at, b"*" * len(secret), len(secret))
                at = shown.find(secret, at + len(secret))
    except (OSError, ValueError, IndexError):
        pass


_NO_READER = "a FIFO that no process reads, or a socket: not a file to append to"


def open_user_log(path: str) -> int:
    """A descriptor to append to ``path`` (``--log FILE``), the user's own choice of file,
    but never a way for another user to make us write to theirs or through their link: the
    last component is not followed unless it is a link the user or root made (``/dev/stderr``),
    an existing regular file must be the user's own with one name, a FIFO nobody reads is
    refused at once instead of blocking.  Raises OSError with a reason in ``strerror``."""
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOCTTY | os.O_NONBLOCK | os.O_CLOEXEC
    uid = os.geteuid()
    why = _others_control(os.path.dirname(os.path.abspath(path)), uid)
    if why is not None:
        raise OSError(errno.EPERM, why)
    try:
        fd = os.open(path, flags | os.O_NOFOLLOW, 0o600)
    except OSError as error:
        if error.errno == errno.ENXIO:              # O_NONBLOCK on a FIFO without a reader
            raise OSError(error.errno, _NO_READER) from None
        try:            # a link says ELOOP, or EACCES where O_CREAT meets it in a sticky dir
            link = os.lstat(path)
        except OSError:
            raise error from None
        if not stat.S_ISLNK(link.st_mode):
            raise
        if link.st_uid not in (uid, 0):
            raise OSError(errno.EPERM, f"a symbolic link of uid {link.st_uid}, which is not "
                          "followed (another user's link could name any file)") from None
        try:
            fd = os.open(path, flags, 0o600)
        except OSError as again:
            if again.errno == errno.ENXIO:
                raise OSError(again.errno, _NO_READER) from None
            raise
        now = os.lstat(path)
        if (now.st_ino, now.st_dev, now.st_uid) != (link.st_ino, link.st_dev, link.st_uid):
            os.close(fd)
            raise OSError(errno.EPERM, "the symbolic link changed while it was opened") from None
    try:
        st = os.fstat(fd)
        if stat.S_ISREG(st.st_mode) and st.st_uid != uid:
            raise OSError(errno.EPERM, f"the file belongs to uid {st.st_uid}: tensorfs appends "
                          "only to a log of your own")
        if stat.S_ISREG(st.st_mode) and st.st_nlink > 1:
            raise OSError(errno.EPERM, f"the file has {st.st_nlink} hard links: tensorfs "
                          "appends only to a log with one name")
        os.set_blocking(fd, True)
    except OSError:
        os.close(fd)
        raise
    return fd


def _others_control(directory: str, uid: int) -> str | None:
    """Why another user could retarget what ``directory`` names, or None: a symbolic link of
    another user on the way, or a directory on the way that is another user's, or that anyone
    can write without the sticky bit (much as ssh's StrictModes checks)."""
    here = "/"
    for part in [p for p in directory.split("/") if p]:
        here = os.path.join(here, part)
        try:
            st = os.lstat(here)
        except OSError:
            return None                 # missing: the open says so
        if st.st_uid not in (uid, 0):
            kind = "a symbolic link" if stat.S_ISLNK(st.st_mode) else "a directory"
            return f"{here} is {kind} of uid {st.st_uid}, who could retarget the path"
        # a group may write (/var/log is root:syslog 0775 on Ubuntu): its members are the
        # machine's trusted; anyone may only where the sticky bit keeps them to their own
        if stat.S_ISDIR(st.st_mode) and st.st_mode & 0o002 and not st.st_mode & stat.S_ISVTX:
            return (f"{here} can be written by anyone (mode {stat.S_IMODE(st.st_mode):04o}, "
                    "no sticky bit), who could retarget the path")
    return None


_OPEN_PRIVATE_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
MAX_LINKS = 40                      # links followed on the way to DIR, as the kernel's ELOOP


def open_private_dir(directory: str, euid: int, refused) -> int:
    """DIR (absolute: the disk cache's, the edit store's), opened one component at a time
    from ``/`` without following a link the system did not vet, made (0700; missing parents
    0755) if missing, and checked through its descriptor: refused if it is a link, someone
    else's or others can write it.

    Every directory on the way must be one nobody else can change it under: owned by root or
    the user, and writable by group or others only if sticky (as /tmp): the rule of ssh's
    StrictModes.  A link on the way is followed only if root or the user owns it (another
    user could point it anywhere, as the kernel's protected_symlinks says), and the
    directories it leads to pass the same rule.  Nothing is created before the directory it
    is created in has passed.  ``refused(directory, why)`` makes the exception raised."""
    pending = [c for c in directory.split("/") if c]
    fd = os.open("/", _OPEN_PRIVATE_DIR)
    shown = ["/"]                       # the path walked so far, as resolved
    links = 0
    try:
        why = unsafe_ancestor(os.fstat(fd), euid)
        if why is not None:
            raise refused(directory, f"/: {why}")
        while pending:
            name = pending.pop(0)
            last = not pending
            if name == ".":
                continue
            here = os.path.join(*shown, name)
            try:
                st = os.stat(name, dir_fd=fd, follow_symlinks=False)
            except FileNotFoundError:
                try:
                    os.mkdir(name, 0o700 if last else 0o755, dir_fd=fd)
                except FileExistsError:
                    pass
                except OSError as error:
                    raise refused(directory, f"cannot create {here}: {error.strerror}") from None
                st = os.stat(name, dir_fd=fd, follow_symlinks=False)
            if stat.S_ISLNK(st.st_mode) and not last:
                if st.st_uid not in (0, euid):
                    raise refused(directory, f"{here} is a symbolic link of uid {st.st_uid}, "
                                              "who can point it anywhere")
                links += 1
                if links > MAX_LINKS:
                    raise refused(directory, f"more than {MAX_LINKS} symbolic links on the way")
                target = os.readlink(name, dir_fd=fd)
                pending[:0] = [c for c in target.split("/") if c]
                if target.startswith("/"):
                    os.close(fd)
                    fd = os.open("/", _OPEN_PRIVATE_DIR)
                    shown = ["/"]
                continue
            try:
                child = os.open(name, _OPEN_PRIVATE_DIR, dir_fd=fd)
            except OSError as error:
                why = unsafe_directory(st, euid) if last else None
                raise refused(directory, why or (error.strerror if last
                                                  else f"{here}: {error.strerror}")) from None
            os.close(fd)
            fd = child
            # ``shown`` holds directories only (links are resolved), so ".." is its dirname
            shown = [os.path.dirname(os.path.join(*shown))] if name == ".." else shown + [name]
            if last:
                why = unsafe_directory(os.fstat(fd), euid)
                if why is not None:
                    raise refused(directory, why)
            else:
                why = unsafe_ancestor(os.fstat(fd), euid)
                if why is not None:
                    raise refused(directory, f"{os.path.join(*shown)} (on the way to it): {why}")
        return fd
    except BaseException:
        os.close(fd)
        raise


def open_private_subdir(dir_fd: int, name: str, euid: int, refused, shown: str) -> int:
    """``name`` in the directory ``dir_fd`` (one ``open_private_dir`` gave): made 0700 if
    missing, opened without following a link and checked through its descriptor
    (``unsafe_directory``): the own directory of a store kept in DIR (the disk cache's, the
    edit store's).  ``refused(shown, why)`` makes the exception raised."""
    try:
        os.mkdir(name, 0o700, dir_fd=dir_fd)
    except FileExistsError:
        pass
    except OSError as error:
        raise refused(shown, f"cannot create it: {error.strerror}") from None
    try:
        fd = os.open(name, _OPEN_PRIVATE_DIR, dir_fd=dir_fd)
    except OSError as error:
        try:                            # a link or a file in its place: say which
            why = unsafe_directory(os.stat(name, dir_fd=dir_fd, follow_symlinks=False), euid)
        except OSError:
            why = None
        raise refused(shown, why or error.strerror) from None
    why = unsafe_directory(os.fstat(fd), euid)
    if why is not None:
        os.close(fd)
        raise refused(shown, why)
    return fd


def unsafe_ancestor(st: os.stat_result, euid: int) -> str | None:
    """Why a directory on the way to DIR lets someone else swap what DIR is, or None."""
    if not stat.S_ISDIR(st.st_mode):
        return "it is not a directory"
    if st.st_uid not in (0, euid):
        return f"it belongs to uid {st.st_uid}, who can move what is in it"
    if st.st_mode & 0o022 and not st.st_mode & stat.S_ISVTX:
        return (f"group or others can write it (mode {stat.S_IMODE(st.st_mode):04o}) and it is "
                "not sticky, so they can move what is in it")
    return None
