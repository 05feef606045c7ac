"""A request as the scheduler and the KV-cache manager see it: slotted, allocation-free on the
hot path. It lives beside the manager, the lowest layer that reads it, so kvcache and metrics
import nothing from the engine."""

from __future__ import annotations

from typing import Any, Protocol

from kvsim.kvcache.block_table import BlockTable
from kvsim.policies.base import RequestHint


class PageCompression(Protocol):
    """What the KV-cache manager asks of a request's KV compression (the engine's
    kvsim.engine.compress.EngineCompression): pages held, reserved and cacheable."""

    code: int  # its index into the run's compression labels
    salt: int  # its own range of block ids, so requests of other compressions never hit them
    drops: bool  # it drops tokens: the scheduler compacts its pages once its prompt is scored

    def kept_blocks(self, context: int, generated: int = 0) -> int: ...

    def cache_limit(self, prompt_tokens: int, total_tokens: int) -> int: ...

    def reserved_blocks(self, total_tokens: int) -> int: ...


class Request:
    """One model call. Token accounting follows vLLM V1:

    - ``known``: tokens the request has (prompt + generated so far);
    - ``computed``: tokens whose KV is in HBM; a step processes tokens [computed, computed + n)
      and samples a new token when it reaches ``known``;
    - preemption (recompute) drops all KV: ``computed`` returns to 0, ``known`` is kept.

    Its blocks on the replica serving it are in ``table`` (a `BlockTable`), which only the
    KV-cache manager changes.
    """

    __slots__ = (
        "arrival_s",
        "attention_mass_lost",
        "cached_tokens",
        "comp",
        "computed",
        "finish_s",
        "first_token_s",
        "gate",
        "generated",
        "handoff",
        "hint",
        "index",
        "input_tokens",
        "known",
        "kv_peak_blocks",
        "load_started_s",
        "load_wait_s",
        "lossy_hits",
        "lower_tokens",
        "output_tokens",
        "preemptions",
        "recomputed_tokens",
        "replica",
        "reply_hint",
        "rope_tokens",
        "scheduled_s",
        "table",
        "transfer_bytes",
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
        self.rope_tokens = 0  # tokens reused at a new position by re-rotating their keys
        self.preemptions = 0
        # head-granular HBM (kvsim.kvcache.group_pool): hit blocks missing KV-head groups, and
        # the share of the request's attention those groups held (summed over the blocks)
        self.lossy_hits = 0
        self.attention_mass_lost = 0.0
        self.replica = 0  # the replica that serves (under P/D: decodes) it
        # prefill/decode disaggregation: the stage this request is in on its current replica
        # (None: aggregated; "prefill": compute the prompt and hand it on; "decode": pull the
        # prompt's KV from the prefill replica), and the KV bytes it pulled
        self.handoff: str | None = None
        self.transfer_bytes = 0
        self.table = BlockTable()
        # its KV compression (kvsim.engine.compress.EngineCompression; None: uncompressed,
        # chosen at admission under auto) and the most blocks it held at once
        self.comp: PageCompression | None = None
        self.kv_peak_blocks = 0
        # a load from below its compute overlaps (kvsim.engine.gates.LoadGate: a layer up)
        self.gate: Any = None
        self.hint: RequestHint | None = None  # what policies may know of it (session, turn, ...)
        self.reply_hint: RequestHint | None = None  # the same once its reply is known (finish)

    # read-only views of the block table (tests and reports read them)
    @property
    def hashes(self) -> list[int] | None:
        return self.table.hashes

    @property
    def held_blocks(self) -> int:
        return self.table.held_blocks

    @property
    def held_cached(self) -> list[int]:
        return self.table.held_cached

    def reset_kv(self) -> None:
        """Forget every block (after release): the request will recompute from scratch."""
        self.recomputed_tokens += self.computed
        self.computed = 0
        self.table.reset()
