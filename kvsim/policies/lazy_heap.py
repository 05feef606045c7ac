"""Lazy deletion for heap-ordered policies: a block re-queued or discarded leaves its old heap
entry behind, and the head is read past the entries that are no longer current."""

from __future__ import annotations

import heapq
from collections.abc import Mapping
from typing import Any


def live_head(heap: list[Any], live: Mapping[int, Any]) -> Any | None:
    """The smallest entry of `heap` that is current (``live[entry[2]] is entry``; its key is
    ``entry[2]``), popping the stale ones above it; None when none is left."""
    while heap:
        entry = heap[0]
        if live.get(entry[2]) is entry:
            return entry
        heapq.heappop(heap)
    return None
