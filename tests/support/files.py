"""What a directory holds, measured while others write into it."""

from __future__ import annotations

import stat
from pathlib import Path


def bytes_at_one_moment(directory: Path) -> int:
    """DIR's bytes at one moment, each file once: the files listed that are still the same
    files once all are listed (a listing made while others link and evict may name a file
    removed before another was made; a block being linked has two names)."""
    seen = {}
    for f in directory.rglob("*"):
        try:
            st = f.lstat()
        except FileNotFoundError:
            continue
        if stat.S_ISREG(st.st_mode):
            seen[f] = (st.st_dev, st.st_ino)
    sizes = {}
    for f, inode in seen.items():
        try:
            st = f.lstat()
        except FileNotFoundError:
            continue
        if (st.st_dev, st.st_ino) == inode:
            sizes[inode] = st.st_size
    return sum(sizes.values())
