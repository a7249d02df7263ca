"""One LRU cache, bounded in bytes, shared by every generated file of a mount.

Generated content (metadata.json, .npy headers, metadata/ files, costly converted chunks) is
kept here; cheap conversions and raw bytes are not (the kernel page cache holds those).
Concurrent requests for the same missing key compute it once: the others wait for it.
"""

from __future__ import annotations

import threading
from typing import Callable, Hashable

import cachetools


class ByteLRU:
    def __init__(self, max_bytes: int):
        self.max_bytes = max_bytes
        self._lru: cachetools.LRUCache = cachetools.LRUCache(maxsize=max(1, max_bytes), getsizeof=len)
        self._mutex = threading.Lock()
        self._in_flight: dict[Hashable, threading.Event] = {}
        self.hits = 0
        self.misses = 0

    def get(self, key: Hashable, compute: Callable[[], bytes]) -> bytes:
        """The cached value for ``key``, computing (once, whoever asks) when it is missing.

        A value larger than the whole cache is returned but not kept.
        """
        while True:
            with self._mutex:
                try:
                    value = self._lru[key]
                    self.hits += 1
                    return value
                except KeyError:
                    pass
                waiting = self._in_flight.get(key)
                if waiting is None:
                    done = self._in_flight[key] = threading.Event()
                    self.misses += 1
                    break
            waiting.wait()
        try:
            value = compute()
            with self._mutex:
                if len(value) <= self.max_bytes:
                    self._lru[key] = value
            return value
        finally:
            with self._mutex:
                del self._in_flight[key]
            done.set()

    def lookup(self, key: Hashable):
        """The cached value for ``key``, or None (nothing is computed)."""
        with self._mutex:
            value = self._lru.get(key)
            if value is not None:
                self.hits += 1
            return value

    def put(self, key: Hashable, value: bytes) -> None:
        """Keep ``value`` (a remote block: tensorfs.sources.blockcache), unless larger than the cache."""
        with self._mutex:
            if len(value) <= self.max_bytes:
                self._lru[key] = value

    def pop(self, key: Hashable):
        """Forget ``key`` and return its value, or None (a remote block the kernel's page
        cache now holds: tensorfs.sources.blockcache)."""
        with self._mutex:
            return self._lru.pop(key, None)

    def peek(self, key: Hashable) -> bool:
        """Whether ``key`` is kept or being computed."""
        with self._mutex:
            return key in self._lru or key in self._in_flight

    def holds(self, key: Hashable) -> bool:
        """Whether ``key`` is kept (a ``get`` of it returns at once)."""
        with self._mutex:
            return key in self._lru

    @property
    def current_bytes(self) -> int:
        with self._mutex:
            return int(self._lru.currsize)
