"""vLLM's eviction: an alias of LRU, documented separately because users ask for it by name.

vLLM v1 keeps blocks with reference count 0 in a free queue and evicts from its front; a finished
request's blocks are appended deepest-first (docs/design/prefix_caching.md). kvsim's block pool
releases blocks in that order, so LRU over those releases is vLLM's order. Does not respect the
prefix tree by construction (a parent released later than its child outlives it, as in vLLM).
"""

from __future__ import annotations

from kvsim.policies.lru import LRU


class VLLM(LRU):
    name = "vllm"
