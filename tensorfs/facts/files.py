"""The files a fact command reads and writes besides the model: a manifest read only once
it is known to be a small regular text file, and an output written as a new file renamed
over the name, never through a link or into a file someone else planted.
"""

from __future__ import annotations

import os
import stat
from typing import Callable

from tensorfs.facts.models import FactsError
from tensorfs.runtime.paths import walk_problem

# A manifest is at most this big: llama-gguf-hash's lines for 100,000 tensors with every
# algorithm take about 40 MiB.
MANIFEST_LIMIT = 64 << 20


def _kind(mode: int) -> str:
    for test, what in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISSOCK, "a socket"), (stat.S_ISLNK, "a symbolic link")):
        if test(mode):
            return what
    return "not a regular file"


def read_text_input(path: str, what: str, limit: int) -> str:
    """The text of a small file the user named (``what``: "manifest"), read only once it
    is known to be a regular file of at most ``limit`` bytes: opened without blocking (a
    FIFO would wait for a writer), checked with fstat, read up to ``limit`` + 1 bytes (it
    may grow), decoded as strict UTF-8.  Any problem is one ``FactsError`` line."""
    from tensorfs.errors import printable

    shown = printable(path)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except OSError as error:
        raise FactsError(f"{shown}: cannot read the {what}: "
                         f"{error.strerror or error}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise FactsError(f"{shown}: the {what} is {_kind(st.st_mode)}, not a regular file")
        if st.st_size > limit:
            raise FactsError(f"{shown}: the {what} is {st.st_size:,} bytes, more than a "
                             f"{what} can be ({limit:,})")
        chunks, size = [], 0
        while size <= limit:
            chunk = os.read(fd, min(1 << 20, limit + 1 - size))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        if size > limit:
            raise FactsError(f"{shown}: the {what} grew past {limit:,} bytes while read")
    except OSError as error:
        raise FactsError(f"{shown}: cannot read the {what}: "
                         f"{error.strerror or error}") from None
    finally:
        os.close(fd)
    data = b"".join(chunks)
    if b"\0" in data:
        raise FactsError(f"{shown}: the {what} holds NUL bytes: not a text file")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as error:
        line_no = data.count(b"\n", 0, error.start) + 1
        raise FactsError(f"{shown}: line {line_no} of the {what} is not UTF-8 text") from None


def _others_link(directory: str) -> str | None:
    """Why ``directory`` is a path someone else controls (a link or a directory of another
    user's on the way, or one anyone may write without the sticky bit: a file made below it
    could land where they chose), or None: ``tensorfs.runtime.paths``'s one rule."""
    return walk_problem(directory, os.geteuid())


def _open_output_directory(path: str, what: str) -> tuple[int, str]:
    """(a descriptor of the directory ``path`` is in, its last component), after the
    checks ``output_problem`` describes; the file is then made and renamed relative to the
    descriptor, so the directory cannot be swapped between the checks and the writing."""
    from tensorfs.errors import printable

    shown = printable(path)
    directory = os.path.dirname(path) or "."
    base = os.path.basename(path)
    if not base or base in (".", ".."):
        raise FactsError(f"{shown}: cannot write the {what}: not a file name")
    link = _others_link(directory)
    if link is not None:
        raise FactsError(f"{shown}: cannot write the {what}: {printable(link)}")
    try:
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except FileNotFoundError:
        raise FactsError(f"{shown}: cannot write the {what}: no directory "
                         f"{printable(directory)}") from None
    except OSError as error:
        raise FactsError(f"{shown}: cannot write the {what}: "
                         f"{error.strerror or error}") from None
    try:
        st = os.stat(base, dir_fd=fd, follow_symlinks=False)
    except FileNotFoundError:
        return fd, base
    except OSError as error:
        os.close(fd)
        raise FactsError(f"{shown}: cannot write the {what}: "
                         f"{error.strerror or error}") from None
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        if stat.S_ISLNK(st.st_mode):
            raise FactsError(f"{shown}: cannot write the {what}: it is a symbolic link, "
                             f"never written through (name the file itself)")
        raise FactsError(f"{shown}: cannot write the {what}: it is {_kind(st.st_mode)}, "
                         f"not a regular file")
    return fd, base


def _umask() -> int:
    """The process's umask, read where Linux states it (setting it to learn it would change
    it for every thread meanwhile)."""
    try:
        with open("/proc/self/status", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o077)
    os.umask(mask)
    return mask


def output_problem(path: str, what: str = "output") -> str | None:
    """Why ``path`` cannot be an output file, or None.  It is written as a new file in its
    directory renamed over the name (``write_output``), so: its directory exists and is
    reached through no symbolic link that another user owns, and what is at the name is
    nothing or a regular file, never a link (that another user may have planted to make
    us write elsewhere), a directory, a FIFO or a device."""
    try:
        fd, _ = _open_output_directory(path, what)
    except FactsError as error:
        return str(error)
    os.close(fd)
    return None


def write_output(path: str, write: Callable, what: str = "output") -> None:
    """``write(f)`` into a new file (``O_CREAT|O_EXCL|O_NOFOLLOW``, mode 0600 while written)
    in the directory of ``path``, then renamed over ``path`` (both relative to one
    descriptor of the directory): nothing is ever written through a link or into a file
    someone else planted or holds open; the final mode is 0666 less the umask, as any new
    file's.  A problem is one ``FactsError`` line."""
    from tensorfs.errors import printable

    fd_dir, base = _open_output_directory(path, what)
    umask = _umask()
    temp = None
    try:
        for _ in range(100):
            candidate = f".{base}.{os.urandom(6).hex()}.tmp"
            try:
                fd = os.open(candidate, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
                             | os.O_CLOEXEC, 0o600, dir_fd=fd_dir)
            except FileExistsError:
                continue
            temp = candidate
            break
        else:
            raise FactsError(f"{printable(path)}: cannot write the {what}: no free "
                             f"temporary name")
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fchmod(f.fileno(), 0o666 & ~umask)
        os.rename(temp, base, src_dir_fd=fd_dir, dst_dir_fd=fd_dir)
        temp = None
    except OSError as error:
        raise FactsError(f"{printable(path)}: cannot write the {what}: "
                         f"{error.strerror or error}") from None
    finally:
        if temp is not None:
            try:
                os.unlink(temp, dir_fd=fd_dir)
            except OSError:
                pass
        os.close(fd_dir)
