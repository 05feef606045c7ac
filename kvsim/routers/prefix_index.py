"""A router's own guess of which blocks a replica holds, learnt from where it sent requests.

Approximate routers (SGLang cache-aware, production-stack's prefix trie, llm-d's approximate
prefix scorer, Dynamo without KV events) keep one of these per replica. A request's blocks form a
hash chain (each hash covers its whole prefix), so a set of chain hashes is a prefix tree: a walk
down the request's hashes that stops at the first unknown one is a trie's longest-prefix match.

Entries are kept oldest first in an OrderedDict (O(1) touch, evict and peek), each with the
simulated time it was last routed, so trimming by size (LRU) and by age (TTL) are both a pop from
the front. Within one request the deepest block is stamped first, so a size trim removes a
chain's leaves before its root, as a radix tree's leaf-first eviction does.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence


class BlockIndex:
    """Block hash -> simulated time it was last routed to this replica, oldest first."""

    __slots__ = ("_at",)

    def __init__(self) -> None:
        self._at: OrderedDict[int, float] = OrderedDict()

    def __len__(self) -> int:
        return len(self._at)

    def __contains__(self, block: int) -> bool:
        return block in self._at

    def match(self, hashes: Sequence[int], limit: int | None = None) -> int:
        """Leading blocks of `hashes` (at most `limit`) held here, stopping at the first miss."""
        at = self._at
        n = 0
        for h in hashes if limit is None else hashes[:limit]:
            if h not in at:
                break
            n += 1
        return n

    def insert(self, hashes: Sequence[int], now_s: float, limit: int | None = None) -> None:
        """Record the leading `limit` blocks of `hashes` as routed here at `now_s`."""
        at = self._at
        move = at.move_to_end
        chain = hashes if limit is None else hashes[:limit]
        for h in reversed(chain):  # deepest first, so the root ends up most recent
            at[h] = now_s
            move(h)

    def trim(self, max_blocks: int) -> int:
        """Drop least recently routed blocks until at most `max_blocks` remain; how many went."""
        at = self._at
        over = len(at) - max_blocks
        for _ in range(max(0, over)):
            at.popitem(last=False)
        return max(0, over)

    def oldest_s(self) -> float | None:
        """When the least recently routed block was routed; None when empty."""
        at = self._at
        return at[next(iter(at))] if at else None

    def pop_oldest(self) -> None:
        """Drop the least recently routed block (for a trim whose budget spans several indexes)."""
        self._at.popitem(last=False)

    def expire(self, before_s: float) -> int:
        """Drop blocks last routed before `before_s` (a TTL); how many went."""
        at = self._at
        n = 0
        while at:
            first = next(iter(at))
            if at[first] >= before_s:
                break
            del at[first]
            n += 1
        return n
