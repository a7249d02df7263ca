"""The model file as served: opened once, read with bounds the header promised.

Reads use ``os.pread`` on one descriptor rather than slices of an mmap: the two cost the
same copy (see docs/serving.md), but a page of a map that the file no longer has kills the
process with SIGBUS, which Python cannot catch, while ``pread`` just comes back short.  A
short read of bytes that ``stat`` promised is turned into ``SourceError`` (EIO), and the log
says why; the daemon stays up and other files keep working.
"""

from __future__ import annotations

import logging
import os
import threading

log = logging.getLogger("tensorfs")


class SourceError(OSError):
    """The model file no longer holds the bytes it held at mount time."""


class ModelSource:
    def __init__(self, path: str, expected_size: int):
        self.path = path
        self.expected_size = expected_size
        self.fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
        self._warned = False
        self._warn_lock = threading.Lock()

    def read(self, offset: int, size: int) -> bytes:
        """Exactly ``size`` bytes at ``offset`` (the caller keeps inside the promised size)."""
        if size <= 0:
            return b""
        data = os.pread(self.fd, size, offset)
        if len(data) != size:
            self._gone(offset, size, len(data))
        return data

    def _gone(self, offset: int, size: int, got: int) -> None:
        actual = os.fstat(self.fd).st_size
        with self._warn_lock:
            if not self._warned:
                self._warned = True
                log.error("%s: the model file changed under the mount: it is %d bytes now, "
                          "%d at mount time; reads past its end fail with EIO",
                          self.path, actual, self.expected_size)
        raise SourceError(5, f"{self.path}: read of {size} bytes at {offset} got {got} "
                             f"(file is {actual} bytes, was {self.expected_size})")

    def close(self) -> None:
        try:
            os.close(self.fd)
        except OSError:
            pass
