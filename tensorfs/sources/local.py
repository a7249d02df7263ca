"""The local model file: ``ModelSource``, the ``Source`` (``tensorfs.sources.source``) of a
path on this machine, and the checks on what a path or a listing may open.

``ModelSource`` is opened  It is opened with ``O_NONBLOCK`` and refused unless
``fstat`` says it is a regular file: a FIFO given as MODEL is refused before anything reads
it, instead of blocking the mount forever.

Reads use ``os.pread`` / ``os.preadv`` on one descriptor rather than slices of an mmap: a
page of a map that the file no longer has kills the process with SIGBUS, which Python cannot
catch, while ``pread`` just comes back short.  It costs nothing: ``read_into`` preads straight
into the buffer the kernel's reply is sent from, which is one copy fewer than slicing a map
and handing the slice over (docs/internals/serving.md, benchmark rows 1 and 6).  ``pread`` on one shared
descriptor is also safe and parallel across threads (no file position is shared).  A
short read of bytes that ``stat`` promised is turned into ``SourceError`` (EIO), and the log
says why; the daemon stays up and other files keep working.

The model is promised immutable while mounted; what happens when it is not (docs/internals/reliability.md):

- every read is followed by an ``fstat`` of the descriptor (a few us: measured in
  docs/internals/reliability.md).  Size and mtime as at mount time: the bytes just read are the
  file's bytes at mount time, since a write updates mtime before it copies data;
- any other size or mtime (truncated, grown, rewritten in place, copied over): no byte can
  be vouched for -- a file that shrank may have been rewritten before it was cut, whatever
  its first bytes still say -- so every read of the file fails with EIO until it is
  remounted;
- renamed over or deleted: the descriptor still holds the file as mounted, which keeps
  serving, consistent; the log says so once (checked at most every ``PATH_CHECK_S``).

Each change is logged once, at ERROR for a changed file and WARNING for a replaced one.
"""

from __future__ import annotations

import errno
import logging
import os
import resource
import stat
import threading
import time

from tensorfs import status
from tensorfs.errors import ModelError
from tensorfs.sources.source import Source, SourceError

log = logging.getLogger("tensorfs")


PATH_CHECK_S = 1.0              # how often the path is checked for a rename-replacement


def _stamp(st: os.stat_result) -> tuple[int, int]:
    """What a change of the file's bytes changes.  Not ctime: chmod, a new hard link or the
    rename that replaces the path change it, and leave the bytes alone."""
    return st.st_size, st.st_mtime_ns


def open_regular_file(path: str, within: str | None = None) -> int:
    """A descriptor of ``path`` if it is a regular file; ``ModelError`` saying what it is
    otherwise.  ``O_NONBLOCK``: opening a FIFO does not wait for a writer (and it is refused
    before any read); it changes nothing for a regular file.

    ``within``: the directory whose listing (or index) named ``path``, rather than the
    user: the file opened must then lie inside it (``contained_problem``), checked on the
    descriptor itself (``/proc/self/fd``), not on a path that can change between a check
    and the open; a path that is not a symbolic link is opened with ``O_NOFOLLOW``, so
    that one swapped for a link meanwhile is refused too."""
    flags = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
    if within is not None:
        try:
            if not stat.S_ISLNK(os.lstat(path).st_mode):
                flags |= os.O_NOFOLLOW
        except OSError:
            pass                            # the open says why
    try:
        fd = os.open(path, flags)
    except OSError as error:
        raise ModelError("unreadable", f"cannot open: {open_error(error)}", file=path) from None
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        what = "is a directory" if stat.S_ISDIR(mode) else f"not a regular file ({file_kind(mode)})"
        raise ModelError("not_a_file", what, file=path)
    if within is not None:
        problem = contained_problem(within, opened_path(fd, path))
        if problem is not None:
            os.close(fd)
            raise ModelError("outside", problem, file=path)
    return fd


def open_error(error: OSError) -> str:
    """Why an open failed, in words; running out of descriptors names the limit, since
    no file is at fault then."""
    if error.errno in (errno.EMFILE, errno.ENFILE):
        return too_many_open_files()
    if error.errno == errno.ELOOP:
        return "it is a symbolic link now (it was not when listed)"
    return error.strerror or str(error)


def too_many_open_files() -> str:
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    return (f"too many open files (this process may hold {soft}: raise `ulimit -n`, or mount "
            "fewer files)")


def opened_path(fd: int, path: str) -> str:
    """The path of the file ``fd`` holds, as the kernel says (links resolved); where
    ``/proc`` is not mounted, ``path`` resolved now."""
    try:
        real = os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return os.path.realpath(path)
    return real.removesuffix(" (deleted)")


# The directories of a Hugging Face cache repo: ``models--ORG--NAME/snapshots/REV/x`` is a
# link to ``../../blobs/HASH`` (datasets-- and spaces-- likewise).
HF_REPO_PREFIXES = ("models--", "datasets--", "spaces--")


def contained_problem(directory: str, real: str) -> str | None:
    """Why the file at ``real`` (a resolved path) is not one that ``directory``'s listing
    may serve, or None: it lies inside ``directory`` (links resolved), or ``directory`` is
    a Hugging Face cache snapshot (``.../models--ORG--NAME/snapshots/REV``) and it lies in
    that repo's own ``blobs/``.  Nothing else: a link planted beside a model never takes
    a file from elsewhere (``/etc/shadow``) into the mount."""
    root = os.path.realpath(directory)
    if _inside(real, root):
        return None
    snapshots, repo = os.path.dirname(root), os.path.dirname(os.path.dirname(root))
    if (os.path.basename(snapshots) == "snapshots"
            and os.path.basename(repo).startswith(HF_REPO_PREFIXES)
            and _inside(real, os.path.join(repo, "blobs"))):
        return None
    return ("a link to a file outside the model's directory (only a Hugging Face cache "
            "snapshot's links into its own blobs/ are followed)")


def _inside(path: str, directory: str) -> bool:
    return path.startswith(directory.rstrip("/") + "/")


def file_kind(mode: int) -> str:
    for test, name in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return "not a regular file"


class ModelSource(Source):

    def __init__(self, path: str, expected_size: int | None = None, within: str | None = None):
        self.path = path
        self._abspath = os.path.abspath(path)     # the daemon works from "/" (tensorfs.cli.daemon)
        self.fd = open_regular_file(path, within)
        self._warn_lock = threading.Lock()
        st = os.fstat(self.fd)
        if expected_size is None:
            expected_size = st.st_size
        self.expected_size = expected_size
        self._stamp = _stamp(st)
        self._identity = (st.st_dev, st.st_ino)
        self.limit = expected_size          # bytes of the file still vouched for (0 once broken)
        self.broken: str | None = None      # why none is, once the file changed
        self._next_path_check = time.monotonic() + PATH_CHECK_S
        self._replaced_logged = False
        if st.st_size != expected_size:     # changed between the parse and this open
            self._reassess(st, force=True)

    @property
    def name(self) -> str:
        return self.path

    @property
    def size(self) -> int:
        return self.expected_size

    def stat(self) -> os.stat_result:
        return os.fstat(self.fd)

    @property
    def local_fd(self) -> int:
        return self.fd

    def read(self, offset: int, size: int) -> bytes:
        """Exactly ``size`` bytes at ``offset`` (the caller keeps inside the promised size)."""
        if size <= 0:
            return b""
        self._admit(offset, size)
        data = os.pread(self.fd, size, offset)
        if len(data) != size:
            self._gone(offset, size, len(data))
        self._verify(offset, size)
        return data

    def read_into(self, offset: int, buf, span: tuple[int, int] | None = None) -> int:
        """Fill the writable buffer ``buf`` with the bytes at ``offset``: one copy, from the
        page cache straight into ``buf`` (the GIL is released while the kernel copies)."""
        size = len(buf)
        if size <= 0:
            return 0
        self._admit(offset, size)
        got = os.preadv(self.fd, [buf], offset)
        if got != size:
            self._gone(offset, size, got)
        self._verify(offset, size)
        return got

    def vouch(self, offset: int = 0, size: int = 0) -> None:
        """The bytes ``[offset, offset + size)`` are still the file's bytes at mount time, or
        ``SourceError`` (EIO): for a reader that is given the descriptor rather than the
        bytes (tensorfs.fuse.session: splice, FUSE passthrough), checked before it reads."""
        self._admit(offset, size)
        self._verify(offset, size)

    # -- the file changed under the mount -------------------------------------------------
    def _admit(self, offset: int, size: int) -> None:
        """Refuse, before reading, what is no longer vouched for."""
        if self.broken is not None or offset + size > self.limit:
            self._refuse(offset, size)

    def _verify(self, offset: int, size: int) -> None:
        """After a read: the file still as at mount time, or the read is refused."""
        st = os.fstat(self.fd)
        if _stamp(st) != self._stamp:
            self._reassess(st)
            self._admit(offset, size)
        if st.st_nlink == 0 or time.monotonic() >= self._next_path_check:
            self._check_path(st)

    def _gone(self, offset: int, size: int, got: int) -> None:
        self._reassess(os.fstat(self.fd), force=True)     # a short read is a change too
        self._refuse(offset, size, got)

    def _refuse(self, offset: int, size: int, got: int | None = None):
        short = f" got {got}" if got is not None else ""
        why = self.broken or "the model file changed since it was mounted"
        raise SourceError(errno.EIO, f"{self.path}: read of {size} bytes at {offset}{short}: "
                                     f"{why}")

    def _reassess(self, st: os.stat_result, force: bool = False) -> None:
        """The descriptor's stat differs from the one at mount time: nothing it holds can be
        vouched for any more.  A shrunk file is not trusted below its new end either: an
        in-place rewrite that keeps the first bytes and then shrinks looks the same."""
        with self._warn_lock:
            if _stamp(st) == self._stamp and not force:
                return                      # another thread got here first
            self._stamp = _stamp(st)
            if self.broken is not None:
                return
            was = self.expected_size
            if st.st_size < was:
                what = (f"truncated or rewritten shorter (it is {st.st_size} bytes now, {was} "
                        "at mount time)")
            elif st.st_size > was:
                what = f"rewritten or grown (it is {st.st_size} bytes now, {was} at mount time)"
            else:
                what = "rewritten in place (same size, but its mtime changed)"
            self.limit = 0
            self.broken = f"the model file was {what} since it was mounted"
            log.error("%s: %s; every read of it now fails with EIO (unmount and mount "
                      "again to serve the new contents)", self.path, self.broken)
            status.report(status.SOURCE_CHANGED, f"{self.path}: {self.broken}: every read fails "
                         "with EIO")

    def _check_path(self, st: os.stat_result) -> None:
        """Rename-replacement or deletion: the descriptor keeps the mounted file."""
        self._next_path_check = time.monotonic() + PATH_CHECK_S
        if self._replaced_logged:
            return
        try:
            now = os.stat(self._abspath)
            what = "another file was renamed over it" if (now.st_dev, now.st_ino) != \
                self._identity else None
        except OSError:
            what = "it was deleted or renamed"
        if what is None and st.st_nlink == 0:
            what = "it was deleted"
        if what is None:
            log.debug("%s: the path still names the mounted file", self.path)
        if what is not None:
            self._replaced_logged = True
            log.warning("%s: the path no longer names the mounted file (%s); this mount keeps "
                        "serving the file as it was at mount time: unmount and mount again to "
                        "serve the new one", self.path, what)
            status.report(status.SOURCE_CHANGED, f"{self.path}: {what}; the file as mounted still "
                         "serves")

    def close(self) -> None:
        try:
            os.close(self.fd)
        except OSError:
            pass
