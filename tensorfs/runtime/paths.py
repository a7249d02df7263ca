"""Paths someone else controls, and the user's private directories (docs/internals/reliability.md).

One rule (``others_control``) says whether a step of a path lets someone other than the user
and root change what the path leads to: a symbolic link of another user's (who can point it
anywhere), a directory of another user's (who can move what is in it), or a directory
anyone may write without the sticky bit (who can rename what is in it away and put a link in
its place), much as ssh's StrictModes and the kernel's protected_symlinks reason.  A group
may write (``/var/log`` is root:syslog 0775 on Ubuntu): its members are the machine's
trusted.  Every path tensorfs writes below, or reads a secret from, passes it:

- ``open_private_dir``: DIR of ``--disk-cache`` and ``--edits``, walked one component at a
  time from ``/`` through descriptors, made 0700 if missing, then private itself
  (``unsafe_directory``);
- ``walk_problem``: the directory of ``--log FILE`` and of the files ``hash``/``stats``/
  ``diff`` write (``-o``), checked by its path before the file is opened.
"""

from __future__ import annotations

import os
import stat

_OPEN_PRIVATE_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
MAX_LINKS = 40                      # links followed on the way to DIR, as the kernel's ELOOP


def others_control(st: os.stat_result, uid: int) -> str | None:
    """Why the step of a path with this lstat (a link, or a directory on the way) lets
    someone other than ``uid`` and root change what the path leads to, or None."""
    if stat.S_ISLNK(st.st_mode):
        if st.st_uid not in (0, uid):
            return f"a symbolic link of uid {st.st_uid}, who can point it anywhere"
        return None
    if st.st_uid not in (0, uid):
        return f"it belongs to uid {st.st_uid}, who can move what is in it"
    if stat.S_ISDIR(st.st_mode) and st.st_mode & 0o002 and not st.st_mode & stat.S_ISVTX:
        return (f"anyone can write it (mode {stat.S_IMODE(st.st_mode):04o}) and it is not "
                "sticky, so they can move what is in it")
    return None


def walk_problem(directory: str, uid: int) -> str | None:
    """Why ``directory`` (made absolute) is a path someone else controls, naming the step
    (``/shared/link is a symbolic link of uid 1001, who can point it anywhere``), or None.
    A missing step is not a problem here: opening the file says so."""
    here = "/"
    for part in [p for p in os.path.abspath(directory).split("/") if p]:
        here = os.path.join(here, part)
        try:
            st = os.lstat(here)
        except OSError:
            return None
        why = others_control(st, uid)
        if why is not None:
            return f"{here} is {why}" if why.startswith("a ") else f"{here}: {why}"
    return None


def unsafe_directory(st: os.stat_result, uid: int) -> str | None:
    """Why a directory with this lstat cannot hold uid's private files (runtime files, the
    disk cache's blocks, the edit store), or None: stricter than ``others_control``, since
    what is in it is trusted as written by the user."""
    if stat.S_ISLNK(st.st_mode):
        return "it is a symbolic link"
    if not stat.S_ISDIR(st.st_mode):
        return "it is not a directory"
    if st.st_uid != uid:
        return f"it belongs to uid {st.st_uid}, not {uid}"
    if st.st_mode & 0o022:
        return f"group or others can write it (mode {stat.S_IMODE(st.st_mode):04o})"
    return None


def open_private_dir(directory: str, euid: int, refused) -> int:
    """DIR (absolute: the disk cache's, the edit store's), opened one component at a time
    from ``/`` without following a link the system did not vet, made (0700; missing parents
    0755) if missing, and checked through its descriptor: refused if it is a link, someone
    else's or others can write it (``unsafe_directory``).

    Every step on the way passes ``others_control``, the directories through their
    descriptors, the links before they are followed; the directories a link leads to pass
    the same rule.  Nothing is created before the directory it is created in has passed.
    ``refused(directory, why)`` makes the exception raised."""
    pending = [c for c in directory.split("/") if c]
    fd = os.open("/", _OPEN_PRIVATE_DIR)
    shown = ["/"]                       # the path walked so far, as resolved
    links = 0
    try:
        why = _unsafe_step(os.fstat(fd), euid)
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
                why = others_control(st, euid)
                if why is not None:
                    raise refused(directory, f"{here} is {why}")
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
                why = _unsafe_step(os.fstat(fd), euid)
                if why is not None:
                    raise refused(directory, f"{os.path.join(*shown)} (on the way to it): {why}")
        return fd
    except BaseException:
        os.close(fd)
        raise


def _unsafe_step(st: os.stat_result, euid: int) -> str | None:
    """A directory on the way to a private directory: ``others_control``, and (as ssh's
    StrictModes) no group may write it either unless it is sticky, since the files kept
    below are trusted as the user's own."""
    if not stat.S_ISDIR(st.st_mode):
        return "it is not a directory"
    if st.st_mode & 0o020 and not st.st_mode & stat.S_ISVTX and st.st_uid in (0, euid):
        return (f"group or others can write it (mode {stat.S_IMODE(st.st_mode):04o}) and it is "
                "not sticky, so they can move what is in it")
    return others_control(st, euid)


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


_KINDS = ((stat.S_ISLNK, "a symbolic link"), (stat.S_ISDIR, "a directory"),
          (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"),
          (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"))


class NotOwnFile(Exception):
    """A file of a store's own directory that is not a regular file of the user's: why, in
    words (``open_own_file``)."""


def _not_regular(st: os.stat_result, euid: int, size: int | None, limit: int | None) -> str | None:
    for test, kind in _KINDS:
        if test(st.st_mode):
            return f"is {kind}, not a regular file"
    if not stat.S_ISREG(st.st_mode):
        return "is not a regular file"
    if st.st_uid != euid:
        return f"belongs to uid {st.st_uid}, not to the user ({euid})"
    if size is not None and st.st_size != size:
        return f"holds {st.st_size} bytes, not the {size} recorded"
    if limit is not None and st.st_size > limit:
        return f"holds {st.st_size} bytes, more than the {limit} it may"
    return None


def open_own_file(dir_fd: int, name: str, euid: int, flags: int = os.O_RDONLY, *,
                  size: int | None = None, limit: int | None = None, mode: int = 0o600) -> int:
    """``name`` in the directory ``dir_fd`` (a store's own directory: everything in it is
    input), opened only if it is a regular file of the user's (``size``: of exactly that
    many bytes; ``limit``: of at most that many), without following a link and without
    blocking: a FIFO, a device, a socket, a directory or a link in its place is never
    opened (checked by ``lstat`` first, and again through the descriptor).  ``NotOwnFile``
    says why not; ``FileNotFoundError`` where there is none (``O_CREAT`` in ``flags`` makes
    one, ``mode``)."""
    try:
        st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        if not flags & os.O_CREAT:
            raise
    else:
        why = _not_regular(st, euid, size, limit)
        if why is not None:
            raise NotOwnFile(f"{name} {why}")
    fd = os.open(name, flags | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC,
                 mode, dir_fd=dir_fd)
    try:
        why = _not_regular(os.fstat(fd), euid, size, limit)
    except BaseException:
        os.close(fd)
        raise
    if why is not None:
        os.close(fd)
        raise NotOwnFile(f"{name} {why}")
    return fd
