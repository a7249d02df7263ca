"""The memory a mount holds for what it serves (``--cache-size``), split here once: the
command makes one ``MemoryBudget`` and hands it down, and each part takes its share from it
rather than deriving one of its own.

- ``cache``: the shared LRU: blocks fetched from a server, generated content (metadata.json,
  metadata/ files), converted chunks of random reads;
- ``stream``: converted chunks for sequential readers and ahead of them, a store of their
  own, at most ``STREAM_BYTES`` and a quarter of the budget: the kernel's page cache keeps
  what they served, so holding a whole tensor's chunks would only cost memory and, worse,
  fresh memory: touching new pages costs more than converting into recycled ones
  (docs/internals/serving.md);
- the worker pool's slots are chunks, as many as ``cache`` and ``stream`` hold
  (``held_bytes``); a remote file's read-ahead is at most a quarter of ``cache``
  (``tensorfs.sources.blockcache``).
"""

from __future__ import annotations

from tensorfs.cache import ByteLRU

STREAM_BYTES = 16 << 20
STREAM_FLOOR = 4 << 20          # four converted chunks, whatever the budget


class MemoryBudget:
    def __init__(self, total_bytes: int):
        self.total_bytes = total_bytes
        self.cache = ByteLRU(total_bytes)
        self.stream = ByteLRU(max(STREAM_FLOOR, min(STREAM_BYTES, total_bytes // 4)))

    @property
    def held_bytes(self) -> int:
        """What the caches may hold at most, together."""
        return self.cache.max_bytes + self.stream.max_bytes
