"""Named owners for what a process remembers between calls: each bounded, each with `clear()`.

Module-level state lives in one of these (or in a small class of its own module, or on the
object it belongs to), never in a bare dict, list or set: what is kept, how much of it, and how
to forget it are then written in one place. Imports nothing (config and the bootstrap's
neighbours use it too).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable
from typing import Any

__all__ = ["Lru", "Seen"]


class Lru:
    """A mapping of at most `size` entries; the least recently used one goes first."""

    __slots__ = ("size", "_items")

    def __init__(self, size: int) -> None:
        self.size = size
        self._items: OrderedDict[Hashable, Any] = OrderedDict()

    def get(self, key: Hashable, default: Any = None) -> Any:
        hit = self._items.get(key, default)
        if hit is not default:
            self._items.move_to_end(key)
        return hit

    def put(self, key: Hashable, value: Any) -> None:
        self._items[key] = value
        self._items.move_to_end(key)
        if len(self._items) > self.size:
            self._items.popitem(last=False)

    def clear(self) -> None:
        self._items.clear()

    def __contains__(self, key: Hashable) -> bool:
        return key in self._items

    def __len__(self) -> int:
        return len(self._items)


class Seen:
    """Keys met before, at most `size` (the oldest is forgotten first: met again, it counts as
    new), for what is done once per key (a log line, a warning, a trial run)."""

    __slots__ = ("_keys",)

    def __init__(self, size: int) -> None:
        self._keys = Lru(size)

    def first(self, key: Hashable) -> bool:
        """True the first time `key` is met (it is then remembered)."""
        if self._keys.get(key) is not None:
            return False
        self.add(key)
        return True

    def add(self, key: Hashable) -> None:
        self._keys.put(key, True)

    def __contains__(self, key: Hashable) -> bool:
        return key in self._keys

    def clear(self) -> None:
        self._keys.clear()

    def __len__(self) -> int:
        return len(self._keys)
