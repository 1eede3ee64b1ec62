"""A small store that keeps its most recently used entries: the one least-recently-used rule for
the server's per-session stores (adapted drafters, asked prompts, Stop flags)."""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Callable, Generic, Hashable, TypeVar

__all__ = ["LRU"]

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class LRU(Generic[K, V]):
    """At most ``capacity`` entries; putting or getting an entry makes it the most recent, and a
    put past the capacity drops the least recent. Each call holds the store's own lock."""

    def __init__(self, capacity: int):
        if capacity < 1:
            raise ValueError(f"an LRU store keeps at least one entry, got capacity {capacity}")
        self.capacity = capacity
        self._entries: OrderedDict[K, V] = OrderedDict()
        self._lock = threading.Lock()

    def put(self, key: K, value: V) -> None:
        """Keep ``value`` under ``key`` (replacing an entry of that key) as the most recent."""
        with self._lock:
            self._entries.pop(key, None)
            self._entries[key] = value
            while len(self._entries) > self.capacity:
                self._entries.popitem(last=False)

    def get(self, key: K, default: V | None = None) -> V | None:
        """The entry of ``key``, now the most recent; ``default`` when there is none."""
        with self._lock:
            if key not in self._entries:
                return default
            self._entries.move_to_end(key)
            return self._entries[key]

    def get_or_put(self, key: K, make: Callable[[], V]) -> V:
        """The entry of ``key``, or ``make()`` kept under it; either way now the most recent."""
        with self._lock:
            value = self._entries.pop(key) if key in self._entries else make()
            self._entries[key] = value
            while len(self._entries) > self.capacity:
                self._entries.popitem(last=False)
            return value

    def peek(self, key: K, default: V | None = None) -> V | None:
        """The entry of ``key`` without making it more recent."""
        with self._lock:
            return self._entries.get(key, default)

    def keys(self) -> list[K]:
        """The keys, least recent first."""
        with self._lock:
            return list(self._entries)

    def values(self) -> list[V]:
        """The entries, least recent first."""
        with self._lock:
            return list(self._entries.values())

    def __len__(self) -> int:
        return len(self._entries)
