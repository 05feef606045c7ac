"""Head-granular cache-only replay for ``ema-head``: the cache holds KV-head groups, not blocks.

A tier of ``capacity`` blocks holds ``capacity × head_groups`` group slots. Each group of each
block is ordered by its own EMA key (kvsim.policies.ema_head); evicting one frees 1/head_groups
of a block. A block access hits only when every group is resident, or — with the policy's
``tolerate_loss`` > 0 — when the attention share held by its missing groups is at most that
(a lossy hit: the request runs without them, and the mass is added to ``attention_mass_lost``).

``plain``: each block access is a cache request; a miss recomputes and inserts its missing
groups, evicting the lowest-keyed resident groups (of any block but itself).

``prefix``: the engine's protocol (kvsim.kvcache.group_pool, one request at a time), written
again independently as a check on it: the hit is the leading blocks that hit, capped at
input − 1 tokens; a request needing more blocks than the tier holds is refused (counted in
``unserved_requests``); the hit is pinned, then ``G`` slots per other block of the prompt
(its partial last block included) are taken, evicting unpinned groups; then its full blocks are
cached whole (a copy still resident takes only its missing groups and the spare slots go back)
and all are released. A block past the first miss is recomputed in full, so it never counts a
loss.
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
    if semantics == "prefix":
        return _replay_prefix_heads(seq, policy, capacity)
    return _replay_plain_heads(seq, policy, capacity)


def _replay_plain_heads(seq: BlockSequence, policy: EmaHead, capacity: int) -> ReplayResult:
    from kvsim.mrc.replay import ReplayResult  # replay imports this module: import late

    groups = policy.params.head_groups
    tolerate = policy.params.tolerate_loss
    full = (1 << groups) - 1
    slots = capacity * groups
    keys = seq.keys.tolist()
    kinds = [SEGMENT_KINDS[k] if k < len(SEGMENT_KINDS) else "" for k in seq.kinds.tolist()]
    offsets = seq.offsets.tolist()
    arrivals = seq.arrival_s.tolist()
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
        for i in range(start, end):
            key = keys[i]
            info.position = position = i - start
            info.kind = kinds[i]
            old = scores.get(key)
            new = touch(old[1] if old else None, old[0] if old else now, info)
            scores[key] = (now, new)
            mask = resident.get(key, 0)
            if mask == full:
                hits += 1
                for g in range(groups):  # refresh the order of every group
                    queue(key, g, new[g], now, position)
                continue
            if mask and tolerate > 0:
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
    return ReplayResult(policy.name, capacity, "plain", len(keys), hits, extra=extra)


def _replay_prefix_heads(seq: BlockSequence, policy: EmaHead, capacity: int) -> ReplayResult:
    from kvsim.mrc.replay import ReplayResult  # replay imports this module: import late

    groups = policy.params.head_groups
    tolerate = policy.params.tolerate_loss
    full = (1 << groups) - 1
    block_size = seq.block_size
    keys = seq.keys.tolist()
    offsets = seq.offsets.tolist()
    arrivals = seq.arrival_s.tolist()
    prompt = seq.prompt_tokens().tolist()
    touch, key_of, attention = policy.touch, policy.key_of, policy.group_attention
    resident: dict[int, int] = {}  # key -> bit mask of resident groups
    scores: dict[int, tuple[float, list[float]]] = {}  # key -> (time of last touch, group EMAs)
    live: dict[tuple[int, int], tuple[float, int, int, int]] = {}  # unpinned (key, group) -> entry
    heap: list[tuple[float, int, int, int]] = []
    free = capacity * groups  # slots holding nothing
    hits = lossy = unserved = 0
    lost_total = 0.0
    info = BlockInfo()

    def refresh(key: int, position: int) -> None:
        old = scores.get(key)
        info.position = position
        scores[key] = (
            info.now_s,
            touch(old[1] if old else None, old[0] if old else info.now_s, info),
        )

    def lost_share(mask: int, position: int) -> float:
        info.position = position
        share = attention(info)
        return sum(a for g, a in enumerate(share) if not mask >> g & 1) / groups

    def unqueue(key: int, mask: int) -> None:
        for g in range(groups):
            if mask >> g & 1:
                del live[(key, g)]

    for row in range(len(offsets) - 1):
        chain = keys[offsets[row] : offsets[row + 1]]
        tokens = prompt[row]
        info.now_s = arrivals[row]
        info.request_tokens = tokens
        limit = min((tokens - 1) // block_size, len(chain))
        hit = 0
        for position in range(limit):
            mask = resident.get(chain[position])
            if mask is None:
                break
            if mask != full and (tolerate <= 0 or lost_share(mask, position) > tolerate):
                break
            hit += 1
        need = -(-tokens // block_size) - hit
        if hit + need > capacity:  # it could never run: an engine refuses it
            unserved += 1
            continue
        hits += hit
        for position in range(hit):  # pin and touch the hit
            key = chain[position]
            mask = resident[key]
            if mask != full:
                lossy += 1
                lost_total += lost_share(mask, position)
            unqueue(key, mask)
            refresh(key, position)
        pinned = set(chain[:hit])
        want = need * groups  # the rest of the prompt, recomputed into new slots
        take = min(want, free)
        free -= take
        want -= take
        while want:  # evict the lowest-keyed unpinned groups
            entry = heapq.heappop(heap)
            vkey, vgroup = entry[2], entry[3]
            if live.get((vkey, vgroup)) is not entry:
                continue
            del live[(vkey, vgroup)]
            want -= 1
            left = resident[vkey] & ~(1 << vgroup)
            if left:
                resident[vkey] = left
            else:
                del resident[vkey], scores[vkey]
        cached = min(tokens // block_size, len(chain))
        for position in range(hit, cached):  # cache the computed full blocks, pinned
            key = chain[position]
            mask = resident.get(key)
            if mask is not None:  # a copy is still here: it takes the missing groups
                if key not in pinned:
                    unqueue(key, mask)
                free += mask.bit_count()
            resident[key] = full
            pinned.add(key)
            refresh(key, position)
        free += (need - (cached - hit)) * groups  # the partial last block's slots
        for position in range(cached - 1, -1, -1):  # release, deepest first
            key = chain[position]
            touched, group_scores = scores[key]
            mask = resident[key]
            for g in range(groups):
                if mask >> g & 1:
                    entry = (key_of(group_scores[g], touched), -position, key, g)
                    live[(key, g)] = entry
                    heapq.heappush(heap, entry)
        if len(heap) > 2 * len(live) + 4096:
            heap = list(live.values())
            heapq.heapify(heap)
    requests = max(len(offsets) - 1, 1)
    extra = {
        "attention_mass_lost": lost_total / requests,
        "lossy_hits": lossy,
        "unserved_requests": unserved,
    }
    return ReplayResult(policy.name, capacity, "prefix", len(keys), hits, extra=extra)
