"""A request's state inside the engine: slotted, allocation-free on the hot path."""

from __future__ import annotations


class Request:
    """One model call. Token accounting follows vLLM V1:

    - ``known``: tokens the request has (prompt + generated so far);
    - ``computed``: tokens whose KV is in HBM; a step processes tokens [computed, computed + n)
      and samples a new token when it reaches ``known``;
    - preemption (recompute) drops all KV: ``computed`` returns to 0, ``known`` is kept.
    """

    __slots__ = (
        "arrival_s",
        "cached_tokens",
        "computed",
        "finish_s",
        "first_token_s",
        "generated",
        "hashes",
        "held_blocks",
        "held_cached",
        "hit_memo",
        "index",
        "input_tokens",
        "kinds",
        "known",
        "load_started_s",
        "load_wait_s",
        "lower_tokens",
        "output_tokens",
        "pic_next",
        "pic_segments",
        "preemptions",
        "processed_blocks",
        "recomputed_tokens",
        "rope_ranges",
        "rope_tokens",
        "scheduled_s",
    )

    def __init__(self, index: int, input_tokens: int, output_tokens: int) -> None:
        self.index = index
        self.input_tokens = input_tokens
        self.output_tokens = output_tokens
        self.arrival_s = 0.0
        self.scheduled_s = -1.0
        self.first_token_s = -1.0
        self.finish_s = -1.0
        self.known = input_tokens
        self.computed = 0
        self.generated = 0
        self.cached_tokens = -1  # prefix-cache hit at first admission; -1 = not yet admitted
        self.recomputed_tokens = 0
        self.lower_tokens: list[int] | None = None  # prompt tokens loaded from each lower tier
        self.load_started_s = 0.0
        self.load_wait_s = 0.0
        # position-independent reuse: (start, end, hash) of reusable segments, and the token
        # ranges this admission takes from cached copies elsewhere
        self.pic_segments: list[tuple[int, int, int]] | None = None
        self.pic_next = 0
        self.rope_ranges: list[tuple[int, int]] | None = None
        self.rope_tokens = 0
        self.preemptions = 0
        self.hashes: list[int] | None = None  # full-block hashes of prompt + reply
        self.kinds = None  # kind code of each block, only for policies that read it
        self.held_blocks = 0  # blocks allocated to this request (cached or not)
        self.held_cached: list[int] = []  # positions of held blocks that are in the prefix cache
        self.processed_blocks = 0  # leading full blocks already offered to the cache
        self.hit_memo: tuple[int, int, int, int] | None = None  # (pool version, limit, hit, ev)

    def reset_kv(self) -> None:
        """Forget every block (after release): the request will recompute from scratch."""
        self.recomputed_tokens += self.computed
        self.computed = 0
        self.held_blocks = 0
        self.held_cached = []
        self.processed_blocks = 0
        self.pic_next = 0
        self.rope_ranges = None
