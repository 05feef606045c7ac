"""A KV compression profile (kvsim.compression) as the engine uses it.

The models layer says what a profile keeps and reads, exactly, for one sequence; this module
turns that into the few numbers the scheduler and the cost model ask for on the hot path:

- page (block) bytes: ``ceil(block_size x bytes_per_kept_token)``, so HBM holds more pages and
  lower tiers store and move smaller ones (`none`: today's ``kv_bytes_per_block``);
- the salt that gives a request's blocks their own range of block ids, so a request never hits
  blocks written under another compression (`none`: salt 0, the unsalted ids);
- for a token-dropping profile, the pages a request keeps at a context once its prompt is
  compacted, ``ceil(compressed bytes / page bytes)`` (never more than uncompressed), and how
  many leading pages stay position-exact, hence reusable by hash;
- quant's unquantised residual (KIVI keeps the most recent tokens at full width in a buffer of
  its own): a fixed number of pages per request, reserved at admission;
- what one decode step's attention reads, as uncompressed-token equivalents (bytes read /
  bytes of an uncompressed token), and the profile's own work (scoring, top-k, quantising,
  dequantising, InfiniGen's speculation) in seconds at the hardware's rates.

Bytes follow kvsim.compression.sizing exactly (tests compare them with `compressed_kv_bytes`);
they are computed here from each layer's token bytes, memoised per context, because the hot
path asks about every running request at every step.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from kvsim.compression import (
    Compression,
    CompressionWork,
    bytes_per_kept_token,
    choose,
    compression_work,
    layer_bytes,
    parse_compression,
)
from kvsim.costmodel.kernels import KernelRates
from kvsim.models import ModelSpec, kv_bytes_per_block, kv_bytes_per_token

if TYPE_CHECKING:  # the replica imports this module
    from kvsim.costmodel import CostModel
    from kvsim.engine.scheduler import Scheduler
    from kvsim.kvcache.request import Request

#: Cacheable leading blocks of a request that never compacts (no limit).
NO_LIMIT = 1 << 62
#: Bytes one top-k selection item costs: its fp32 score read once by the selection pass (our
#: assumption; the papers publish no selection kernel figures).
SELECT_ITEM_BYTES = 4.0


def parse(text: str) -> Compression:
    """The profile `text` names (a KvsimError naming the valid ones if it names none)."""
    return parse_compression(text)


def page_bytes(model: ModelSpec, comp: Compression, block_size: int, kv_dtype: str, tp: int) -> int:
    """Bytes of one page of `block_size` tokens under `comp` on one rank."""
    if comp.identity:
        return kv_bytes_per_block(model, block_size, kv_dtype, tp)
    return math.ceil(block_size * bytes_per_kept_token(model, comp, kv_dtype, tp))


@dataclass
class _LayerClass:
    """Layers that keep and store alike: one representative, how many, their token bytes."""

    layer: int
    count: int
    base_bytes: float
    token_bytes: float
    quantised: bool


def _layer_classes(
    model: ModelSpec, comp: Compression, kv_dtype: str, tp: int
) -> list[_LayerClass]:
    """The model's KV layers grouped by what they keep and how wide their tokens are, so a
    lookup sums over a few classes rather than every layer."""
    layers = layer_bytes(model, comp, kv_dtype, tp) if not comp.identity else []
    per_layer = comp.layer_count is not None
    classes: dict[tuple, _LayerClass] = {}
    for i, lb in enumerate(layers):
        key = (i if per_layer else -1, lb.base_bytes, lb.token_bytes, lb.quantised)
        if per_layer:  # group layers with the same keep rule and widths
            key = (comp.keep_ratio(i), lb.base_bytes, lb.token_bytes, lb.quantised)
        got = classes.get(key)
        if got is None:
            classes[key] = _LayerClass(i, 1, lb.base_bytes, lb.token_bytes, lb.quantised)
        else:
            got.count += 1
    return list(classes.values())


def _work_seconds(
    work: CompressionWork | None, rates: KernelRates | None
) -> tuple[float, float, float, float]:
    """A profile's own work in seconds at the hardware's rates: per read token, per context
    token and per new token of a decode step, and per prefill token."""
    if work is None or rates is None:
        return 0.0, 0.0, 0.0, 0.0
    flops_s = 1.0 / rates.attention_flops_per_s
    bytes_s = 1.0 / rates.elementwise_bytes_per_s
    item_s = SELECT_ITEM_BYTES * bytes_s
    read_s = (
        (work.score_flops_per_read_token + work.dequant_flops_per_read_token) * flops_s
        + work.select_items_per_read_token * item_s
        + work.dequant_bytes_per_read_token * bytes_s
    )
    context_s = (
        work.speculate_flops_per_context_token * flops_s
        + work.select_items_per_context_token * item_s
    )
    new_token_s = work.quant_bytes_per_token * bytes_s
    prefill_token_s = (
        work.score_flops_per_prompt_token * flops_s
        + work.select_items_per_prompt_token * item_s
        + work.quant_bytes_per_token * bytes_s
    )
    return read_s, context_s, new_token_s, prefill_token_s


class EngineCompression:
    """One profile in one run: its code (index into the run's labels), pages and lookups."""

    def __init__(
        self,
        comp: Compression,
        code: int,
        model: ModelSpec,
        kv_dtype: str,
        tp: int,
        block_size: int,
        block_bytes: int,
        rates: KernelRates | None = None,
    ) -> None:
        self.comp = comp
        self.code = code
        self.label: str = comp.label
        self.identity = comp.identity  # none: today's engine, byte for byte
        self.salt: int = int(comp.salt)
        self.block_size = block_size
        self.block_bytes = block_bytes  # the run's page bytes (auto: the largest candidate's)
        self.offload = comp.offloaded  # infinigen: KV in CPU DRAM
        self.prompt_only = comp.prompt_only
        self.base_token_bytes = float(kv_bytes_per_token(model, kv_dtype, tp))
        self.base_page_bytes = kv_bytes_per_block(model, block_size, kv_dtype, tp)
        self._classes = _layer_classes(model, comp, kv_dtype, tp)
        self.residual = comp.residual_tokens()
        # gap between a full-width and a packed token over the quantised layers (quant's residual)
        self._residual_gap = sum(
            c.count * (c.base_bytes - c.token_bytes) for c in self._classes if c.quantised
        )
        self._generated_bytes = sum(c.count * c.token_bytes for c in self._classes)
        # requests this long hold a whole residual, and never more pages than uncompressed
        self._long, self._long_reserved = self._whole_residual()
        self.drops = comp.drops  # infinigen keeps (a summary of) every token
        # our model: a page of tokens that stay at their positions (streaming's sinks) only
        self.exact_blocks = comp.exact_tokens // block_size
        self._bytes: dict[int, int] = {}
        self._read: dict[int, int] = {}
        work = compression_work(model, comp, kv_dtype, tp) if not comp.identity else None
        self.work = work
        self.host_bytes_per_read_token = work.host_bytes_per_read_token if work else 0.0
        self.host_bytes_per_new_token = work.host_bytes_per_new_token if work else 0.0
        # the profile's own work, in seconds: per decode step (per read token, per context
        # token, per new token) and per prefill token
        self.read_s, self.context_s, self.new_token_s, self.prefill_token_s = _work_seconds(
            work, rates
        )
        self.has_work = bool(self.read_s or self.context_s or self.new_token_s)
        # attention reads the packed width (quant) or, infinigen, the full width of the fetch
        self.read_scale = (
            (work.kv_read_bytes_per_read_token / self.base_token_bytes) if work else 1.0
        )
        self.linear_reads = comp.linear_reads  # none, quant: reads grow one token a step

    def _whole_residual(self) -> tuple[int, int]:
        """(the shortest request that holds a whole residual and never more pages than
        uncompressed, the pages that residual takes); (NO_LIMIT, 0) without a residual."""
        if not (self.residual and self._residual_gap):
            return NO_LIMIT, 0
        block_size, block_bytes = self.block_size, self.block_bytes
        pages = -(-math.ceil(self.residual * self._residual_gap) // block_bytes)
        blocks = -(-self.residual // block_size)
        while blocks < 100_000:  # the fewest token pages from which the cap cannot bind
            if blocks * self.base_page_bytes // block_bytes - blocks >= pages:
                return (blocks - 1) * block_size + 1, pages
            blocks += 1
        return NO_LIMIT, 0

    # -- bytes and pages ---------------------------------------------------------------------
    def kv_bytes(self, context: int, generated: int = 0) -> int:
        """Bytes of one sequence's KV on one rank (kvsim.compression.compressed_kv_bytes)."""
        if self.identity:
            return int(context * self.base_token_bytes)
        if self.prompt_only:  # the prompt compressed once, every generated token kept
            return math.ceil(
                self._prompt_bytes(context - generated) + generated * self._generated_bytes
            )
        return self._prompt_bytes(context)

    def _prompt_bytes(self, tokens: int) -> int:
        got = self._bytes.get(tokens)
        if got is None:
            comp = self.comp
            residual = self.residual
            total = 0.0
            for c in self._classes:
                kept = comp.kept_tokens(tokens, c.layer)
                full = min(kept, residual) if c.quantised else 0
                total += c.count * (full * c.base_bytes + (kept - full) * c.token_bytes)
            got = self._bytes[tokens] = math.ceil(total)
        return got

    def full_bytes(self, context: int) -> int:
        """Bytes of a sequence that keeps every token (none, quant with its residual,
        infinigen's partial keys)."""
        if self.identity:
            return int(context * self.base_token_bytes)
        return self._prompt_bytes(context)

    def kept_blocks(self, context: int, generated: int = 0) -> int:
        """Pages a compacted request holds at `context` tokens, `generated` of them produced
        (never more than uncompressed: compression never raises memory)."""
        full = -(-context // self.block_size)
        if not self.drops:
            return full
        return min(-(-self.kv_bytes(context, generated) // self.block_bytes), full)

    def compacts(self, tokens: int) -> bool:
        """Whether a prompt of `tokens` loses any token when compressed."""
        if not self.drops:
            return False
        comp = self.comp
        return any(comp.kept_tokens(tokens, c.layer) < tokens for c in self._classes)

    def cache_limit(self, prompt_tokens: int, total_tokens: int) -> int:
        """Leading pages of a request reusable by hash: all when nothing of its context is ever
        dropped, else only those that stay position-exact (streaming's sink pages)."""
        if not self.drops:
            return NO_LIMIT
        dropped = self.compacts(prompt_tokens) or (
            not self.prompt_only and self.compacts(total_tokens)
        )
        return self.exact_blocks if dropped else NO_LIMIT

    def reserved_blocks(self, total_tokens: int) -> int:
        """Pages of quant's full-width residual buffer (KIVI's most recent tokens), held for
        the request's whole life; 0 for every other profile."""
        if not self.residual or not self._residual_gap:
            return 0
        if total_tokens >= self._long:  # the common case: a whole residual, computed once
            return self._long_reserved
        nbytes = min(total_tokens, self.residual) * self._residual_gap
        pages = -(-math.ceil(nbytes) // self.block_bytes)
        # a request shorter than the residual is held whole at full width: in pages no more
        # than uncompressed pages would take (compression never raises memory)
        blocks = -(-total_tokens // self.block_size)
        return min(pages, blocks * self.base_page_bytes // self.block_bytes - blocks)

    # -- what attention reads ------------------------------------------------------------------
    def read_tokens(self, context: int, generated: int = 0) -> int:
        """Tokens one decode step's attention reads per layer (the mean over layers)."""
        if self.linear_reads:
            return context
        if self.offload:
            got = self._read.get(context)
            if got is None:
                got = self._read[context] = self.comp.read_tokens(context, 0)
            return got
        comp = self.comp
        classes = self._classes
        if len(classes) == 1:
            return comp.read_tokens(context, 0, generated)
        layers = sum(c.count for c in classes)
        return round(
            sum(c.count * comp.read_tokens(context, c.layer, generated) for c in classes) / layers
        )

    def equivalent_tokens(self, context: int, generated: int = 0) -> float:
        """Uncompressed tokens whose KV bytes equal what a decode step at `context` reads."""
        if self.identity:
            return float(context)
        if self.offload:
            return self.read_tokens(context) * self.read_scale
        if self.linear_reads:  # quant: packed tokens plus the full-width residual
            return (
                context * self._generated_bytes + min(context, self.residual) * self._residual_gap
            ) / self.base_token_bytes
        return self.kv_bytes(context, generated) / self.base_token_bytes

    def equivalent_array(self, contexts: np.ndarray) -> np.ndarray:
        """`equivalent_tokens` of many contexts at once, for a profile whose reads are linear
        in the context (none, quant): one numpy pass instead of a call per sequence."""
        if self.identity:
            return contexts
        packed = contexts * (self._generated_bytes / self.base_token_bytes)
        if self.residual:
            packed += np.minimum(contexts, self.residual) * (
                self._residual_gap / self.base_token_bytes
            )
        return packed

    def equivalent_sum(self, contexts: list[int], ahead: int = 0) -> float:
        """Summed `equivalent_tokens` of `contexts`, each `ahead` tokens on, for a profile whose
        reads are linear in the context (quant): from the exact integer sums of the contexts
        and of their full-width residuals, without a pass per sequence."""
        n = len(contexts)
        tokens = sum(contexts) + n * ahead
        residual = self.residual
        if not residual or not n:
            full = 0
        elif min(contexts) + ahead >= residual:  # the usual case: every residual is full
            full = n * residual
        else:
            full = sum(min(c + ahead, residual) for c in contexts)
        return (tokens * self._generated_bytes + full * self._residual_gap) / self.base_token_bytes

    def decode_extra_s(self, context: int, generated: int = 0) -> float:
        """The profile's own work in one decode step of one sequence."""
        if not self.has_work:
            return 0.0
        return (
            self.read_s * self.read_tokens(context, generated)
            + self.context_s * context
            + self.new_token_s
        )

    def fetch_bytes(self, context: int) -> float:
        """Bytes InfiniGen fetches from CPU DRAM for one decode step of one sequence."""
        return self.host_bytes_per_read_token * self.read_tokens(context)


class AutoChooser:
    """MetaKV-style selection (``--compression auto``): each request, as it arrives, gets the
    highest-quality candidate whose predicted decode step and memory fit the budgets
    (kvsim.compression.choose). Our reconstruction of the predictor: one decode step of the
    least busy replica's running batch plus this request at its final context (prompt and
    reply), priced by the run's cost model; its memory is its KV at that context. With no
    candidate inside both budgets, the one with the fewest bytes."""

    def __init__(
        self,
        engines: list[EngineCompression],
        cost: CostModel,
        latency_budget_s: float,
        memory_budget_bytes: float,
        replicas: list[Scheduler],
    ) -> None:
        self.engines = {e.label: e for e in engines}
        self.candidates = [e.comp for e in engines]
        self.cost = cost
        self.latency_budget_s = latency_budget_s
        self.memory_budget_bytes = memory_budget_bytes
        self.replicas = replicas

    def choose(self, req: Request) -> EngineCompression:
        total = req.input_tokens + req.output_tokens
        generated = req.output_tokens
        running = min(self.replicas, key=lambda r: len(r.running)).running
        batch = [
            r.comp.equivalent_tokens(r.computed, max(r.computed - r.input_tokens, 0))
            if r.comp is not None
            else float(r.computed)
            for r in running
        ]
        engines = self.engines

        def latency(c: Compression) -> float:
            e = engines[c.label]
            step = self.cost.iteration_time_s([], [*batch, e.equivalent_tokens(total, generated)])
            return step + e.decode_extra_s(total, generated)

        def nbytes(c: Compression) -> int:
            e = engines[c.label]
            return e.kv_bytes(total, generated) if e.drops else e.full_bytes(total)

        picked = choose(
            self.candidates,
            total,
            latency,
            self.latency_budget_s,
            self.memory_budget_bytes,
            nbytes,
        )
        return engines[picked.label]
