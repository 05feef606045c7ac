"""EMA head scoring: blocks split into KV-head groups, each scored by an EMA of its attention.

Head-granular eviction named in arXiv 2604.26968 (abstract only) and described by a public design
(sampooni.github.io kv-cache-docs ch. 7; shared/reference/algorithms.md): per head,
score_t = w·attention_t + (1 − w)·score_{t−1} with w = 0.2, and a position is kept while any head
needs it (max over heads). Our reconstruction:

- Attention is a documented synthetic profile (``EmaHeadParams``), not measured: the first
  ``retrieval_groups`` of ``head_groups`` groups are retrieval heads that spread their attention
  evenly over the whole context; the rest are local/streaming heads, each putting ``sink_mass`` on
  the first block (an attention sink) and the remainder on recent blocks, decaying as
  exp(−distance / decay) with decay = ``local_decay_blocks`` × 2^i for the i-th local group. Each
  head's attention over a request's context sums to 1.
- A touch (hit or insertion by a request) adds that request's attention; between touches every
  score decays by (1 − w) per ``step_s`` of simulated time, so old blocks fade. Decay is common to
  all blocks, so the order is a static key ln(score) + t·ln(1/(1 − w))/step_s in one heap.
- Whole-block mode (the engine's default, and ``EvictionPolicy`` here): a block's key is its
  best head group's; the lowest goes. Head-granular mode (``kvsim mrc`` by default, kvsim.mrc.heads;
  the engine with ``head_granular=True``, kvsim.kvcache.group_pool): each group is evicted on its
  own and frees 1/``head_groups`` of a block; a hit needs every group, or, with
  ``tolerate_loss`` > 0, a missing share of attention at most that large (a lossy hit whose lost
  mass is reported). Here the policy is a ``GroupScorer``: the pool keeps the order.

The context length in blocks is request_tokens / block size; the block size is inferred as the
smallest request_tokens / (position + 1) seen (exact in the mrc replay, within a partial block in
the engine). Does not respect the prefix tree by construction (retrieval heads keep deep blocks as
well as shallow ones).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from kvsim.policies.base import BlockInfo, check_param
from kvsim.policies.priority import PriorityPolicy


@dataclass(frozen=True)
class EmaHeadParams:
    head_groups: int = 4
    """KV-head groups per block (the unit freed in head-granular mode)."""
    retrieval_groups: int = 1
    """Groups that are retrieval heads (attention spread over the whole context)."""
    local_decay_blocks: float = 2.0
    """Decay length, in blocks, of the first local group; each further local group doubles it."""
    sink_mass: float = 0.1
    """Share of a local head's attention on the first block of the context (attention sink)."""
    ema_weight: float = 0.2
    """w in score = w·attention + (1 − w)·score (the public design's 0.2)."""
    step_s: float = 1.0
    """Simulated seconds per EMA step between touches (our assumption)."""
    head_granular: bool | None = None
    """Evict head groups (True) or whole blocks (False). None keeps each tool's default:
    head groups in ``kvsim mrc``, whole blocks in ``kvsim run`` (so existing engine results do not
    change); ``ema-head.head_granular=true`` makes the engine's HBM tier a GroupPool."""
    tolerate_loss: float = 0.0
    """Head-granular only: a block missing groups still hits (lossily) if the attention share
    it loses is at most this; 0 = lossless, any missing group is a miss."""

    def __post_init__(self) -> None:
        check_param(1 <= self.head_groups <= 1024, "head_groups", "must be an integer in [1, 1024]")
        check_param(0 <= self.retrieval_groups <= self.head_groups, "retrieval_groups",
                    f"must be an integer in [0, head_groups = {self.head_groups}]")  # fmt: skip
        for name in ("local_decay_blocks", "step_s"):
            check_param(0 < getattr(self, name) <= 1e9, name, "must be in (0, 1e9]")
        check_param(0 < self.ema_weight <= 1, "ema_weight", "must be in (0, 1]")
        for name in ("sink_mass", "tolerate_loss"):
            check_param(0 <= getattr(self, name) <= 1, name, "must be in [0, 1]")


class HeadProfile:
    """The synthetic per-head-group attention a request puts on one of its blocks."""

    __slots__ = ("decays", "norms", "params")

    def __init__(self, params: EmaHeadParams) -> None:
        if not 0 <= params.retrieval_groups <= params.head_groups or params.head_groups < 1:
            raise ValueError("need 1 <= head_groups and 0 <= retrieval_groups <= head_groups")
        self.params = params
        local = params.head_groups - params.retrieval_groups
        self.decays = [params.local_decay_blocks * 2.0**i for i in range(local)]
        self.norms: dict[tuple[int, int], float] = {}  # (local group, context) -> 1 / Σ weights

    def attention(self, position: int, context: int) -> list[float]:
        """Attention of each group on the block at ``position`` of a ``context``-block prompt."""
        p = self.params
        context = max(context, position + 1)
        out = [1.0 / context] * p.retrieval_groups
        distance = context - 1 - position
        sink = p.sink_mass if context > 1 else 0.0
        for i, decay in enumerate(self.decays):
            norm = self.norms.get((i, context))
            if norm is None:
                ratio = math.exp(-1.0 / decay)
                norm = self.norms[(i, context)] = (1.0 - ratio) / (1.0 - ratio**context)
            a = (1.0 - sink) * math.exp(-distance / decay) * norm
            out.append(a + sink if position == 0 else a)
        return out


class EmaHead(PriorityPolicy):
    name = "ema-head"
    Params = EmaHeadParams

    def __init__(self, params: EmaHeadParams | None = None) -> None:
        super().__init__()
        self.params = p = params or EmaHeadParams()
        if not 0 < p.ema_weight <= 1 or p.step_s <= 0:
            raise ValueError("ema_weight must be in (0, 1] and step_s > 0")
        self.profile = HeadProfile(p)
        # Ordering key per second: ln(1 / (1 - w)) / step_s (0 when w = 1: no memory, no decay).
        self.rate = -math.log(1.0 - p.ema_weight) / p.step_s if p.ema_weight < 1 else 0.0
        self.block_tokens = math.inf  # inferred: min request_tokens / (position + 1)
        self.tolerate_loss = p.tolerate_loss
        self._scores: dict[int, tuple[float, list[float]]] = {}  # key -> (time, group scores)

    def context_blocks(self, info: BlockInfo) -> int:
        """The touching request's prompt length in blocks (at least the block's own depth)."""
        if info.request_tokens <= 0:
            return info.position + 1
        per = info.request_tokens / (info.position + 1)
        if per < self.block_tokens:
            self.block_tokens = per
        return max(info.position + 1, math.ceil(info.request_tokens / self.block_tokens - 1e-9))

    def touch(self, scores: list[float] | None, since_s: float, info: BlockInfo) -> list[float]:
        """Group scores after a touch now: decay the old ones, blend in this attention."""
        attention = self.profile.attention(info.position, self.context_blocks(info))
        w = self.params.ema_weight
        if scores is None:
            return [w * a for a in attention]
        keep = (1.0 - w) ** ((info.now_s - since_s) / self.params.step_s) * (1.0 - w)
        return [w * a + keep * s for a, s in zip(attention, scores, strict=True)]

    def head_groups(self) -> int:
        """Groups the engine frees one by one: ``head_groups`` only when asked for explicitly."""
        return self.params.head_groups if self.params.head_granular is True else 1

    def group_attention(self, info: BlockInfo) -> list[float]:
        """Each group's attention on ``info.position`` of the touching request's prompt."""
        return self.profile.attention(info.position, self.context_blocks(info))

    def key_of(self, score: float, now_s: float) -> float:
        """Static ordering key of a score set at ``now_s`` (lower leaves first)."""
        return (math.log(score) if score > 0 else -math.inf) + self.rate * now_s

    def _touch(self, key: int, info: BlockInfo) -> list[float]:
        old = self._scores.get(key)
        scores = self.touch(old[1] if old else None, old[0] if old else info.now_s, info)
        self._scores[key] = (info.now_s, scores)
        return scores

    def add(self, key: int, info: BlockInfo) -> None:
        old = self._scores.get(key)
        if old is None:
            old = (info.now_s, self._touch(key, info))
        self._push(key, (self.key_of(max(old[1]), old[0]), -info.position))

    def access(self, key: int, info: BlockInfo) -> None:
        scores = self._touch(key, info)
        if key in self._live:
            self._push(key, (self.key_of(max(scores), info.now_s), -info.position))

    def forget(self, key: int) -> None:
        self._scores.pop(key, None)
