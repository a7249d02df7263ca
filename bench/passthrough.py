"""The reference ceiling of a Python FUSE daemon: the smallest fusepy filesystem that serves
one byte range of a file, sliced from an mmap.

    python bench/passthrough.py SOURCE OFFSET SIZE MOUNTPOINT

The mount holds one file, ``/data``: bytes ``OFFSET .. OFFSET+SIZE`` of SOURCE.  It runs in
the foreground (the benchmark kills it with SIGTERM / fusermount -u) with fusepy's and
libfuse 2's defaults plus ``ro``: multithreaded, no extra options.  ``read`` returns
``mm[a:b]`` (one copy out of the page cache into a bytes object; fusepy then memmoves it into
the kernel's buffer) — what a straightforward Python daemon does.
"""

from __future__ import annotations

import errno
import mmap
import os
import stat
import sys

from fuse import FUSE, FuseOSError, Operations


class OneRange(Operations):
    def __init__(self, source: str, offset: int, size: int):
        self.fd = os.open(source, os.O_RDONLY)
        self.map = mmap.mmap(self.fd, 0, prot=mmap.PROT_READ)
        self.start = offset
        self.size = size

    def getattr(self, path, fh=None):
        if path == "/":
            return dict(st_mode=stat.S_IFDIR | 0o555, st_nlink=2)
        if path == "/data":
            return dict(st_mode=stat.S_IFREG | 0o444, st_nlink=1, st_size=self.size)
        raise FuseOSError(errno.ENOENT)

    def readdir(self, path, fh):
        return [".", "..", "data"]

    def read(self, path, size, offset, fh):
        lo = self.start + min(offset, self.size)
        hi = self.start + min(offset + size, self.size)
        return self.map[lo:hi]


def main() -> None:
    source, offset, size, mountpoint = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    FUSE(OneRange(source, offset, size), mountpoint, foreground=True, ro=True)


if __name__ == "__main__":
    main()
