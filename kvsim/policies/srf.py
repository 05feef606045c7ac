"""Shortest-request-first replacement, after InferMax (Kim et al., arXiv 2411.07447).

InferMax serves the shortest prompts first and, when memory runs out, gives up the longest
request's KV. As a replacement order: blocks last used by the longest request go first, its
deepest blocks before its head; ties by least recent touch. The request length comes from
``BlockInfo.request_tokens``; when the tier leaves it 0 the block's position stands in for it.
Does not respect the prefix tree by construction (a shared head inherits the length of whichever
request touched it last), though within one request it evicts deepest-first.
"""

from __future__ import annotations

from kvsim.policies.base import BlockInfo
from kvsim.policies.priority import PriorityPolicy


class SRF(PriorityPolicy):
    name = "srf"

    def __init__(self) -> None:
        super().__init__()
        self._meta: dict[int, tuple[int, int]] = {}  # resident key -> (-request length, -position)

    def _remember(self, key: int, info: BlockInfo) -> tuple[int, int]:
        length = info.request_tokens or info.position + 1
        meta = self._meta[key] = (-length, -info.position)
        return meta

    def add(self, key: int, info: BlockInfo) -> None:
        meta = self._meta.get(key) if info.request_tokens == 0 else None
        self._push(key, meta or self._remember(key, info))

    def access(self, key: int, info: BlockInfo) -> None:
        if key in self._meta:
            meta = self._remember(key, info)
            if key in self._live:
                self._push(key, meta)

    def forget(self, key: int) -> None:
        self._meta.pop(key, None)
