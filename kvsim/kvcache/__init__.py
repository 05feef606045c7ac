"""KV block bookkeeping: which prefix blocks are resident, pinned, or evictable."""

from kvsim.kvcache.block_pool import BlockPool, PoolStats

__all__ = ["BlockPool", "PoolStats"]
