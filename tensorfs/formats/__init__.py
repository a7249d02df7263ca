"""Format parsers: bytes in, one ``ModelFile`` out.  Nothing here knows about FUSE.

Each parser takes ``buf`` — a bytes-like prefix of the file (possibly the whole file) — and
``file_size``, the real size of the file.  A parser that needs more of the header than
``buf`` holds (but no more than ``file_size``) raises ``NeedMoreBytes(n)``; the opener then
reads a longer prefix and tries again.  Everything a parser returns refers only to ``buf``,
never to a live map of the file, so a model file truncated under a mount cannot fault the
header-derived views.
"""

from __future__ import annotations


class NeedMoreBytes(Exception):
    """Internal: the header reaches past the prefix given to the parser."""

    def __init__(self, needed: int):
        super().__init__(needed)
        self.needed = needed
