"""Head-granular cache-only replay for ``ema-head``: the cache holds KV-head groups, not blocks.

A tier of ``capacity`` blocks holds ``capacity × head_groups`` group slots. Each group of each
block is ordered by its own EMA key (kvsim.policies.ema_head); evicting one frees 1/head_groups
of a block. A block access hits only when every group is resident, or — with the policy's
``tolerate_loss`` > 0 — when the attention share held by its missing groups is at most that
(a lossy hit: the request runs without them, and the mass is added to ``attention_mass_lost``).
Otherwise it misses and its missing groups are recomputed and inserted. Semantics ``plain`` and
``prefix`` are those of kvsim.mrc.replay; a block after the first miss of a request is
recomputed in full, so it never counts a loss.
"""

from __future__ import annotations

import heapq
from typing import TYPE_CHECKING

from kvsim.policies.base import BlockInfo
from kvsim.policies.ema_head import EmaHead
from kvsim.traces import SEGMENT_KINDS

if TYPE_CHECKING:
    from kvsim.mrc.replay import BlockSequence, ReplayResult


def replay_heads(
    seq: BlockSequence, policy: EmaHead, capacity: int, semantics: str
) -> ReplayResult:
    """Replay ``seq`` at head-group granularity; a ReplayResult with the attention mass lost."""
    from kvsim.mrc.replay import ReplayResult  # replay imports this module: import late

    groups = policy.params.head_groups
    tolerate = policy.params.tolerate_loss
    full = (1 << groups) - 1
    slots = capacity * groups
    keys = seq.keys.tolist()
    kinds = [SEGMENT_KINDS[k] if k < len(SEGMENT_KINDS) else "" for k in seq.kinds.tolist()]
    offsets = seq.offsets.tolist()
    arrivals = seq.arrival_s.tolist()
    prefix = semantics == "prefix"
    touch, key_of = policy.touch, policy.key_of
    resident: dict[int, int] = {}  # key -> bit mask of resident groups
    scores: dict[int, tuple[float, list[float]]] = {}  # key -> (time of last touch, group EMAs)
    live: dict[tuple[int, int], tuple[float, int, int, int]] = {}  # (key, group) -> heap entry
    heap: list[tuple[float, int, int, int]] = []
    push, pop = heapq.heappush, heapq.heappop
    used = hits = lossy = 0
    lost_total = 0.0
    info = BlockInfo()

    def queue(key: int, group: int, score: float, now: float, position: int) -> None:
        entry = (key_of(score, now), -position, key, group)
        live[(key, group)] = entry
        push(heap, entry)

    for row in range(len(offsets) - 1):
        start, end = offsets[row], offsets[row + 1]
        info.now_s = now = arrivals[row]
        info.request_tokens = (end - start) * seq.block_size
        hitting = True
        for i in range(start, end):
            key = keys[i]
            info.position = position = i - start
            info.kind = kinds[i]
            old = scores.get(key)
            new = touch(old[1] if old else None, old[0] if old else now, info)
            scores[key] = (now, new)
            mask = resident.get(key, 0)
            if mask == full:
                hits += hitting
                for g in range(groups):  # refresh the order of every group
                    queue(key, g, new[g], now, position)
                continue
            if mask and tolerate > 0 and hitting:
                attention = policy.profile.attention(position, policy.context_blocks(info))
                lost = sum(a for g, a in enumerate(attention) if not mask >> g & 1) / groups
                if lost <= tolerate:  # lossy hit: run without the missing groups
                    hits += 1
                    lossy += 1
                    lost_total += lost
                    for g in range(groups):
                        if mask >> g & 1:
                            queue(key, g, new[g], now, position)
                    continue
            # A miss: the block's missing groups are recomputed and inserted.
            if prefix:
                hitting = False
            for g in range(groups):
                if mask >> g & 1:
                    queue(key, g, new[g], now, position)
                    continue
                while used >= slots:  # evict the lowest-keyed resident group
                    entry = pop(heap)
                    vkey, vgroup = entry[2], entry[3]
                    if live.get((vkey, vgroup)) is not entry:
                        continue
                    del live[(vkey, vgroup)]
                    used -= 1
                    if vkey == key:
                        mask &= ~(1 << vgroup)
                        continue
                    left = resident[vkey] & ~(1 << vgroup)
                    if left:
                        resident[vkey] = left
                    else:
                        del resident[vkey]
                        del scores[vkey]
                mask |= 1 << g
                used += 1
                queue(key, g, new[g], now, position)
            resident[key] = mask
        if len(heap) > 2 * len(live) + 4096:
            heap = list(live.values())
            heapq.heapify(heap)
    requests = max(len(offsets) - 1, 1)
    extra = {"attention_mass_lost": lost_total / requests, "lossy_hits": lossy}
    return ReplayResult(policy.name, capacity, semantics, len(keys), hits, extra=extra)
