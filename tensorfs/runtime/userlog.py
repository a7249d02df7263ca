"""``--log FILE``: the user's own choice of file, opened to append without letting another
user make tensorfs write to theirs or through their link (``open_user_log``)."""

from __future__ import annotations

import errno
import os
import stat

from tensorfs.runtime.paths import walk_problem

_NO_READER = "a FIFO that no process reads, or a socket: not a file to append to"


def open_user_log(path: str) -> int:
    """A descriptor to append to ``path`` (``--log FILE``), the user's own choice of file,
    but never a way for another user to make us write to theirs or through their link: the
    last component is not followed unless it is a link the user or root made (``/dev/stderr``),
    an existing regular file must be the user's own with one name, a FIFO nobody reads is
    refused at once instead of blocking.  Raises OSError with a reason in ``strerror``."""
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOCTTY | os.O_NONBLOCK | os.O_CLOEXEC
    uid = os.geteuid()
    why = walk_problem(os.path.dirname(os.path.abspath(path)), uid)
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
