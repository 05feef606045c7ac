"""A request's KV blocks on one replica: what it holds, what it has offered to the cache.

Kept apart from the request so that a request can hold blocks on two replicas at once (under
prefill/decode disaggregation the prefill replica keeps its copy until the decode replica has
pulled it), and so that the scheduler sees block state only through the KV-cache manager.
"""

from __future__ import annotations

from collections.abc import Sequence


class BlockTable:
    """Slotted, allocation-free block state of one request on one replica."""

    __slots__ = (
        "cache_limit",
        "compacted",
        "hashes",
        "held_blocks",
        "held_cached",
        "hit_memo",
        "kinds",
        "pic_next",
        "pic_segments",
        "processed_blocks",
        "reserved",
        "rope_ranges",
    )

    def __init__(self) -> None:
        self.hashes: list[int] | None = None  # full-block hashes of prompt + reply
        self.kinds: Sequence[int] | None = None  # kind code of each block, for policies that ask
        # position-independent reuse: (start, end, hash) of reusable segments, and the token
        # ranges this admission takes from cached copies elsewhere
        self.pic_segments: list[tuple[int, int, int]] | None = None
        # (pool, its version, limit, hit, evictable) of the last prefix lookup
        self.hit_memo: tuple[object, int, int, int, int] | None = None
        # compression: leading blocks that may be offered to the prefix cache (the rest are
        # compacted, no longer at their prefix positions); set at admission
        self.cache_limit = 1 << 62
        self.reset()

    def reset(self) -> None:
        """Forget every held block (after release); the chain itself is kept."""
        self.held_blocks = 0  # blocks allocated to this request (cached or not)
        self.held_cached: list[int] = []  # positions of held blocks that are in the prefix cache
        self.processed_blocks = 0  # leading full blocks already offered to the cache
        self.compacted = False  # a token-dropping compression shrank the prompt's KV
        self.reserved = 0  # blocks held beside the token blocks (quant's full-width residual)
        self.pic_next = 0
        self.rope_ranges: list[tuple[int, int]] | None = None

    def drop_chain(self) -> None:
        """The request is done here: the trace can rebuild the chain, so memory stays flat."""
        self.hashes = self.kinds = None
