"""Named owners for what a process remembers between calls, each bounded, each with `clear()`:
module-level state lives in one of these, in a small class of its module, or on the object it
belongs to, never in a bare dict, list or set (tests/unit/test_caches.py checks)."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable
from typing import Any

__all__ = ["Lru", "Seen"]


class Lru:
    """A mapping of at most `size` entries; the least recently used one goes first."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._items: OrderedDict[Hashable, Any] = OrderedDict()

    def get(self, key: Hashable, default: Any = None) -> Any:
        hit = self._items.get(key, default)
        if hit is not default:
            self._items.move_to_end(key)
        return hit

    def put(self, key: Hashable, value: Any = True) -> None:
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


class Seen(Lru):
    """Keys met before, at most `size` (the oldest forgotten first: met again, it is new), for
    what is done once per key (a log line, a warning, a trial run); `put(key)` remembers one."""

    def first(self, key: Hashable) -> bool:
        """True the first time `key` is met (it is then remembered)."""
        if key in self._items:
            return False
        self.put(key)
        return True
