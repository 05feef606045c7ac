"""An example kvsim policy plugin: most-recently-used eviction, registered by entry point.

MRU is what a plugin author would write in ten lines; ``Broken`` raises on purpose so tests can
check that kvsim reports a plugin's fault as the plugin's.
"""

from __future__ import annotations

from kvsim.policies import BlockInfo, EvictionPolicy


class MRU(EvictionPolicy):
    """Evict the block touched most recently (good for cyclic scans larger than the cache)."""

    name = "example-mru"

    def __init__(self) -> None:
        self._order: dict[int, None] = {}

    def add(self, key: int, info: BlockInfo) -> None:
        self._order[key] = None

    def access(self, key: int, info: BlockInfo) -> None:
        if key in self._order:
            del self._order[key]
            self._order[key] = None

    def discard(self, key: int) -> None:
        self._order.pop(key, None)

    def victim(self) -> int:
        if not self._order:
            raise LookupError("no evictable block")
        return next(reversed(self._order))

    def __len__(self) -> int:
        return len(self._order)


class Broken(MRU):
    """Fails when asked for a victim."""

    name = "example-broken"

    def victim(self) -> int:
        raise ValueError("this plugin is broken on purpose")
