"""The memory a mount holds for what it serves (``--cache-size``), split here once: the
command makes one ``MemoryBudget`` and hands it down, and each part takes its share from it
rather than deriving one of its own.  The shares are carved out of the size the user gave,
never added to it: whatever the caches hold together is at most ``total_bytes``.

- ``cache``: the shared LRU: blocks fetched from a server, generated content (metadata.json,
  metadata/ files), converted chunks of random reads; ``total_bytes`` less ``stream``;
- ``stream``: converted chunks for sequential readers and ahead of them, a store of their
  own, a quarter of the budget and at most ``STREAM_BYTES``: the kernel's page cache keeps
  what they served, so holding a whole tensor's chunks would only cost memory and, worse,
  fresh memory: touching new pages costs more than converting into recycled ones
  (docs/internals/serving.md).  A budget whose quarter is less than ``STREAM_FLOOR`` (under
  16 MiB) has no store of its own for them: ``stream`` is ``cache``, one LRU for every chunk;
- the worker pool's slots are chunks, as many as the caches hold (``held_bytes``); a remote
  file's read-ahead is at most a quarter of ``cache`` (``tensorfs.sources.blockcache``), and a
  remote model needs ``REMOTE_MIN_BYTES`` at least (``remote_problem``).
"""

from __future__ import annotations

from tensorfs.cache import ByteLRU

STREAM_BYTES = 16 << 20
STREAM_FLOOR = 4 << 20          # four converted chunks: less is no store of its own
# A remote model's cache holds the block being read and the one fetched ahead of it
# (tensorfs.sources.blockcache.BLOCK_SIZE, 4 MiB): with less, a block would be fetched again
# for every read of it.
REMOTE_MIN_BYTES = 8 << 20


class MemoryBudget:
    def __init__(self, total_bytes: int):
        self.total_bytes = total_bytes
        stream = min(STREAM_BYTES, total_bytes // 4)
        self.cache: ByteLRU
        self.stream: ByteLRU
        if stream < STREAM_FLOOR:
            self.cache = self.stream = ByteLRU(total_bytes)
        else:
            self.cache = ByteLRU(total_bytes - stream)
            self.stream = ByteLRU(stream)

    @property
    def held_bytes(self) -> int:
        """What the caches may hold at most, together: ``total_bytes``."""
        if self.stream is self.cache:
            return self.cache.max_bytes
        return self.cache.max_bytes + self.stream.max_bytes

    @property
    def current_bytes(self) -> int:
        """What the caches hold now, together (by their own counters)."""
        if self.stream is self.cache:
            return self.cache.current_bytes
        return self.cache.current_bytes + self.stream.current_bytes


def _size(n: int) -> str:
    """``n`` as --cache-size takes it (8M, 64K)."""
    for unit, shift in (("G", 30), ("M", 20), ("K", 10)):
        if n and n % (1 << shift) == 0:
            return f"{n >> shift}{unit}"
    return str(n)


def remote_problem(total_bytes: int) -> str | None:
    """Why ``--cache-size`` cannot serve a remote model, or None."""
    if total_bytes >= REMOTE_MIN_BYTES:
        return None
    return (f"--cache-size {_size(total_bytes)} is too small for a remote model: it needs "
            f"{_size(REMOTE_MIN_BYTES)} or more (the block being read and the one "
            f"fetched ahead of it)")
