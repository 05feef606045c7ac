"""What calibration measures: the sweep (sizes, held-out points, forward-pass batches) and the
shapes it times, the model's per-rank shapes or a proxy small enough for the budget.

A full-size layer of a large model cannot be timed on a laptop-class CPU in seconds, nor held
in 2 GB: one llama-3.1-405b layer is 6.4 GB in bf16 at tp=1, and the old ``--quick`` built the
whole model (llama-3.1-8b: 20 GB). So calibration times a *proxy* when the budget asks for one:
the model's layer at one rank's shapes with the hidden and MLP widths divided by a power of two
(``factor``) but none below ``Budget.min_width``, the attention heads divided by whole GQA groups
(KV heads with their query heads; MLA's heads are kept, since its latent is shared by all of
them), the vocabulary cut to fit, and only a few layers. The measured times are then scaled back
to the model's shapes, family by family, by exact ratios of work:

- a GEMM ``M x k @ k x n`` by ``(k n) / (k' n')``, the ratio of weight elements, which is the
  ratio of both its FLOPs and its weight bytes at any M;
- attention by the ratio of heads (KV and query heads divide together, so both the FLOPs and the
  KV bytes scale by it);
- the elementwise work by the ratio of bytes it moves per token
  (``kvsim.costmodel.shapes.elementwise_bytes_per_token``).

Per-call fixed costs (a few microseconds on a CPU) are scaled too, which overstates the smallest
elementwise and attention calls of a proxied model; next to its GEMMs (milliseconds a layer)
that is well under 1% of an iteration. The forward-pass check runs the proxy decoder and is
compared with the proxy's own (unscaled) tables, so it checks the timing method, and the fixed
per-iteration overhead it fits does not depend on widths. Checked against decoders of the real
shapes on the build machine (docs/calibration.md): forward passes of llama-3.1-8b (6 layers) and
llama-3.1-70b (2 layers) came within 2.9% and 3.5% (median) of what the proxied tables predicted.

This module does not import torch: plans and their size estimates are plain arithmetic.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from dataclasses import dataclass, field

from kvsim.costmodel.shapes import elementwise_bytes_per_token, gemm_shapes
from kvsim.models import ModelSpec, kv_heads_per_rank

MiB = 1 << 20
GiB = 1 << 30
LAYER_ROLES = ("qkv", "o", "gate_up", "down")  # the roles a GQA decoder layer times in context


@dataclass(frozen=True)
class Batch:
    """One iteration: prefill chunks (new tokens, cached context) and ``decode`` sequences that
    all sit at ``decode_context`` (one context keeps the batched decode kernel honest)."""

    name: str
    prefill: tuple[tuple[int, int], ...] = ()
    decode: int = 0
    decode_context: int = 0
    kind: str = field(default="")

    @property
    def tokens(self) -> int:
        return sum(n for n, _ in self.prefill) + self.decode

    @property
    def cached(self) -> int:
        """KV-cache positions the batch's caches hold (prefix, new tokens, decode slots)."""
        return sum(n + c for n, c in self.prefill) + self.decode * (self.decode_context + 1)

    @property
    def decode_contexts(self) -> list[int]:
        return [self.decode_context] * self.decode

    @property
    def label(self) -> str:
        parts = [f"prefill {n}+{c}" if c else f"prefill {n}" for n, c in self.prefill]
        if self.decode:
            parts.append(f"decode {self.decode}x{self.decode_context}")
        return ", ".join(parts)


@dataclass(frozen=True)
class Plan:
    """What to measure: fit grids, held-out points, transfer sizes and forward-pass batches."""

    tokens: list[int]
    tokens_held: list[int]
    prefill: list[int]
    prefill_held: list[int]
    cached_ratio: int  # cached prefix = ratio x new tokens
    decode_batch: list[int]
    decode_context: list[int]
    decode_held: list[tuple[int, int]]
    copy_bytes: list[int]
    storage_bytes: list[int]
    storage_file_bytes: int
    fit_batches: list[Batch]
    batches: list[Batch]
    warmup: int = 2
    reps: int = 2  # timed calls of each point per round
    rounds: int = 3  # interleaved passes over every point
    target_s: float = 1e-3  # a point's calls per round fill this (copies: one repetition)


def midpoints(values: list[int]) -> list[int]:
    return [round(math.sqrt(a * b)) for a, b in itertools.pairwise(values)]


def make_plan(device: str, quick: bool) -> Plan:
    """Grids sized so ``--quick`` finishes in seconds on a CPU (tiny model) and in under five
    minutes on a GPU; the full plan sweeps further."""
    cuda = device == "cuda"
    if cuda:
        tokens = [1, 4, 16, 64, 256, 1024, 4096] + ([] if quick else [8192, 16384])
        prefill = [64, 256, 1024, 4096] + ([] if quick else [8192, 16384])
        batch = [1, 4, 16, 64, 256]
        context = [128, 512, 2048, 8192] + ([] if quick else [32768])
        copy = [4096 * 4**i for i in range(10 if quick else 12)]
        storage = [MiB, 4 * MiB, 16 * MiB, 64 * MiB]
        fit = [
            Batch("fit-prefill", ((64, 0),)),
            Batch("fit-decode", (), 1, 128),
            Batch("fit-decode-4", (), 4, 512),
            Batch("fit-mixed", ((64, 0),), 4, 256),
        ]
        batches = [
            Batch("prefill 1x2048", ((2048, 0),), kind="prefill-only"),
            Batch("prefill 3 prompts", ((512, 0), (1024, 0), (300, 0)), kind="prefill-only"),
            Batch("prefill after prefix", ((512, 1536),), kind="prefill-only"),
            Batch("decode 32x1000", (), 32, 1000, kind="decode-only"),
            Batch("decode 128x3000", (), 128, 3000, kind="decode-only"),
            Batch("decode 8x6000", (), 8, 6000, kind="decode-only"),
            Batch("mixed 512 + 64x1500", ((512, 0),), 64, 1500, kind="mixed"),
            Batch("mixed 256+768 + 24x4000", ((256, 768),), 24, 4000, kind="mixed"),
        ]
        return Plan(
            tokens,
            midpoints(tokens),
            prefill,
            midpoints(prefill),
            3,
            batch,
            context,
            [(2, 256), (8, 1024), (32, 4096), (128, 1000)],
            copy,
            storage,
            256 * MiB,
            fit,
            batches,
            warmup=2,
            reps=3 if quick else 5,
            rounds=3 if quick else 5,
            target_s=2e-3,
        )
    tokens = [1, 4, 16, 64, 256] + ([] if quick else [1024, 4096])
    prefill = [16, 64, 256] + ([] if quick else [1024])
    batch = [1, 4, 16] + ([] if quick else [64])
    context = [64, 256, 1024] + ([] if quick else [4096])
    copy = [64 * 1024 * 4**i for i in range(5 if quick else 7)]
    storage = [MiB, 4 * MiB] + ([] if quick else [16 * MiB])
    fit = [  # small, and none of the compositions checked below
        Batch("fit-prefill", ((16, 0),)),
        Batch("fit-decode", (), 1, 64),
        Batch("fit-decode-4", (), 4, 128),
        Batch("fit-mixed", ((16, 0),), 2, 64),
    ]
    batches = [
        Batch("prefill 1x200", ((200, 0),), kind="prefill-only"),
        Batch("prefill 3 prompts", ((64, 0), (100, 0), (30, 0)), kind="prefill-only"),
        Batch("prefill after prefix", ((48, 144),), kind="prefill-only"),
        Batch("decode 8x300", (), 8, 300, kind="decode-only"),
        Batch("decode 12x700", (), 12, 700, kind="decode-only"),
        Batch("mixed 64 + 8x200", ((64, 0),), 8, 200, kind="mixed"),
        Batch("mixed 32+96 + 6x500", ((32, 96),), 6, 500, kind="mixed"),
    ]
    return Plan(
        tokens,
        midpoints(tokens),
        prefill,
        midpoints(prefill),
        3,
        batch,
        context,
        [(2, 128), (8, 512)],
        copy,
        storage,
        16 * MiB if quick else 64 * MiB,
        fit,
        batches,
        warmup=1 if quick else 2,
        reps=1 if quick else 2,
        rounds=3 if quick else 7,
        target_s=6e-3 if quick else 2e-2,
    )


@dataclass(frozen=True)
class Budget:
    """How large the timed shapes may be.

    ``layer_bytes``: one proxy layer's weights at most (the factor doubles until it fits);
    ``lm_head_bytes``: the LM head's weight (and the proxy's tied embedding) at most;
    ``decoder_bytes``: all decoder layers together at most; ``forward_all``: the forward check
    runs as many of the model's layers as ``decoder_bytes`` holds (a GPU, where launch overheads
    hide behind the layer before), else just enough copies to keep the caches as cold as in the
    whole model, and at least ``min_layers``. ``min_width``: no proxy width (hidden, MLP, the
    query heads' width) goes below this unless the model's is smaller: on the 2-core build
    machine a bf16 GEMM with a 1024-wide reduction took 10-25% longer per weight than one
    2048 wide or more, at 1, 8 and 64 rows, so narrower proxies overstated the model's GEMMs.
    ``total_bytes``: what the run holds at its peak (``estimate_bytes``) at most; a model whose
    KV caches would take more times shorter decode contexts (``plan_calibration``).
    ``scrub_bytes``: the cache scrub before a kernel timed alone (the LM head) is twice the
    last-level cache, or the model's weights if fewer, but at most this (a CPU with a larger
    cache than half of it times the LM head a little warm).
    """

    layer_bytes: int
    lm_head_bytes: int
    decoder_bytes: int
    forward_all: bool
    total_bytes: int = GiB
    min_layers: int = 2
    min_width: int = 2048
    scrub_bytes: int = 256 * MiB


def budget_for(device: str, quick: bool, device_bytes: int) -> Budget:
    """The budget of a run: a CPU ``--quick`` run times layers of at most 48 MiB (the widths of
    a 1B model; qwen2.5-0.5b is timed at its real widths), a 32 MiB LM head and two or three
    layers, so any model calibrates in well under a minute and 1 GB. Otherwise shapes are real
    whenever a layer fits in 1/16 of the device's memory, and the forward check runs as many
    layers as half of it holds with their KV caches (on a CPU, whose forward probes all stay
    built, a quarter); proxies there keep widths of 4096 (a guess for GPUs, not yet measured).
    A run holds at most 1 GiB (CPU ``--quick``), half the memory (CPU) or 80% of it (GPU: the
    CUDA context and the allocator's slack come on top); past that, decode contexts shorten.
    """
    if device == "cpu" and quick:
        return Budget(48 * MiB, 16 * MiB, 256 * MiB, forward_all=False)
    return Budget(
        layer_bytes=max(48 * MiB, device_bytes // 16),
        lm_head_bytes=max(32 * MiB, device_bytes // 16),
        decoder_bytes=max(96 * MiB, device_bytes // (4 if device == "cpu" else 2)),
        forward_all=True,
        total_bytes=max(GiB, device_bytes // 2 if device == "cpu" else device_bytes * 4 // 5),
        min_width=2048 if device == "cpu" else 4096,
        scrub_bytes=max(256 * MiB, device_bytes // 8),
    )


def layer_batches(sweep: Plan) -> list[Batch]:
    """The batches the single-layer probes run: token sweeps (one prompt), prompts without and
    after a cached prefix, the decode grid; fit and held-out points alike."""
    out = [Batch("layer", ((m, 0),)) for m in sweep.tokens + sweep.tokens_held]
    for ratio in (0, sweep.cached_ratio):
        for n in sweep.prefill + sweep.prefill_held:
            out.append(Batch("layer", ((n, ratio * n),)))
    grid = [(b, c) for b in sweep.decode_batch for c in sweep.decode_context]
    return out + [Batch("layer", (), b, c) for b, c in grid + sweep.decode_held]


def shorter(sweep: Plan) -> Plan:
    """``sweep`` with every decode context halved (the grid's, the held-out points' and the
    forward batches'): half the KV positions, for a model whose KV per token is too large for
    the budget. Halving keeps fitted and held-out points apart."""

    def half(c: int) -> int:
        return max(1, c // 2)

    def batch(b: Batch) -> Batch:
        if not b.decode:
            return b
        c = half(b.decode_context)
        name = b.name.replace(f"{b.decode}x{b.decode_context}", f"{b.decode}x{c}")
        return dataclasses.replace(b, name=name, decode_context=c)

    return dataclasses.replace(
        sweep,
        decode_context=[half(c) for c in sweep.decode_context],
        decode_held=[(b, half(c)) for b, c in sweep.decode_held],
        fit_batches=[batch(b) for b in sweep.fit_batches],
        batches=[batch(b) for b in sweep.batches],
    )


def kv_tokens(sweep: Plan, device: str) -> tuple[int, int]:
    """KV positions held at once per decoder layer by the forward-pass probes (on a CPU every
    probe stays built across rounds, on a GPU each is rebuilt and the largest counts), and per
    layer copy by the single-layer probes (all of them: an upper bound)."""
    cached = [b.cached for b in sweep.fit_batches + sweep.batches]
    forward = sum(cached) if device == "cpu" else max(cached)
    return forward, sum(b.cached for b in layer_batches(sweep))


@dataclass(frozen=True)
class ShapePlan:
    """The timed model (``spec``: one rank's shapes at tp=1, ``layers`` layers) and the scales
    that turn its times into the real model's (``model`` at ``tp``)."""

    model: ModelSpec
    tp: int
    spec: ModelSpec
    factor: int  # hidden and MLP widths divided by this
    head_factor: int  # attention heads (GQA: whole groups) divided by this
    layers: int  # decoder layers built (the forward check runs them all)
    copies: int  # layers the single-layer probes cycle through (caches as cold as the model's)
    gemm_scale: dict[str, float]  # role -> real k n / timed k n
    attention_scale: float
    elementwise_scale: float
    dtype_bytes: int
    min_width: int  # the budget's floor on proxy widths
    scrub_bytes: int  # the cache scrub before a kernel timed alone
    context_factor: int = 1  # the sweep's decode contexts divided by this (``plan_calibration``)

    @property
    def scaled(self) -> bool:
        """Whether any timed shape differs from the model's (then times are scaled)."""
        return (
            any(s != 1.0 for s in self.gemm_scale.values())
            or self.attention_scale != 1.0
            or self.elementwise_scale != 1.0
        )

    @property
    def layer_bytes(self) -> int:
        """Weights of one timed decoder layer."""
        return _layer_bytes(self.spec, self.dtype_bytes)

    @property
    def lm_head_bytes(self) -> int:
        return self.spec.vocab_size * self.spec.hidden_size * self.dtype_bytes

    def describe(self) -> str:
        """One line for the log and the report: what is timed, and how it is scaled."""
        s, g = self.spec, self.spec.layer_groups[0]
        inter = self.spec.mlp_groups[0].intermediate_size if self.spec.mlp_groups else 0
        what = (
            f"{self.layers} of {self.model.num_layers} layers"
            + (f" (single-layer probes cycle {self.copies})" if self.copies != self.layers else "")
            + f", hidden {s.hidden_size}, {g.num_heads} heads"
            + (f" / {g.num_kv_heads} KV" if g.kind != "mla" else "")
            + f", MLP {inter}, vocab {s.vocab_size}"
        )
        if self.context_factor > 1:
            what += f", decode contexts / {self.context_factor}"
        if not self.scaled:
            return f"{self.model.name} at tp={self.tp}: real shapes, {what}"
        cuts = []
        if self.factor > 1:
            cuts.append(f"widths / up to {self.factor}, none under {self.min_width}")
        if self.head_factor > 1:
            cuts.append(f"heads / {self.head_factor}")
        vocab = max(1, self.model.vocab_size // self.tp) / s.vocab_size
        if vocab != 1:
            cuts.append(f"vocab / {vocab:.3g}")
        lo, hi = min(self.gemm_scale.values()), max(self.gemm_scale.values())
        return (
            f"{self.model.name} at tp={self.tp}: {what} ({'; '.join(cuts)}); times scaled by "
            f"GEMM x{lo:.3g}"
            + (f"-{hi:.3g}" if hi != lo else "")
            + f", attention x{self.attention_scale:.3g}, elementwise x{self.elementwise_scale:.3g}"
        )


def _layer_bytes(spec: ModelSpec, dtype_bytes: int) -> int:
    """Weights of one layer of ``spec`` (at tp=1): every GEMM but the LM head."""
    shapes = gemm_shapes(spec, 1)
    return (
        sum(g.k * g.n * g.calls for n, g in shapes.items() if n != "lm_head")
        * dtype_bytes
        // (max(1, spec.num_layers))
    )


def _proxy(
    model: ModelSpec, tp: int, factor: int, min_width: int, layers: int, vocab: int | None
) -> ModelSpec:
    """``model``'s per-rank shapes at tp=1 with widths divided by ``factor`` but not below
    ``min_width`` (nor above the real width), GQA heads by the largest whole number of groups
    that does not exceed ``factor`` or leave the query width under ``min_width``, ``layers``
    layers."""

    def width(w: int) -> int:
        w = max(1, w)
        return w if w <= min_width else max(min_width, -(-w // factor))

    groups = []
    for g in model.layer_groups:
        heads = max(1, g.num_heads // tp)
        if g.kind == "mla":
            groups.append(
                dataclasses.replace(
                    g,
                    layers=layers,
                    num_heads=heads,
                    num_kv_heads=max(1, g.num_kv_heads // tp) if g.num_kv_heads else 0,
                    q_lora_rank=width(g.q_lora_rank) if g.q_lora_rank else g.q_lora_rank,
                )
            )
            continue
        kvh = kv_heads_per_rank(g.num_kv_heads, tp)
        a = 1
        if heads % kvh == 0:
            q_width = min(heads * g.head_dim_k, min_width)
            a = max(
                d
                for d in range(1, min(kvh, factor) + 1)
                if kvh % d == 0 and (heads // d) * g.head_dim_k >= q_width
            )
        groups.append(
            dataclasses.replace(g, layers=layers, num_heads=heads // a, num_kv_heads=kvh // a)
        )
    mlps = tuple(
        dataclasses.replace(
            m, layers=layers, intermediate_size=width(max(1, m.intermediate_size // tp))
        )
        for m in model.mlp_groups
    )
    hidden = width(model.hidden_size)
    return dataclasses.replace(
        model,
        name=f"{model.name} (timed shapes)",
        hidden_size=hidden,
        num_layers=layers,
        vocab_size=vocab if vocab is not None else max(1, model.vocab_size // tp),
        num_attention_heads=groups[0].num_heads,
        tie_word_embeddings=True,  # one matrix: the embedding lookup costs nothing to speak of
        layer_groups=tuple(groups),
        mlp_groups=mlps,
    )


def plan_shapes(
    model: ModelSpec,
    tp: int,
    dtype_bytes: int,
    budget: Budget,
    llc_bytes: int,
    tokens: tuple[int, int] = (0, 0),
) -> ShapePlan:
    """The timed shapes of ``model`` at ``tp`` under ``budget`` (see the module docstring).

    ``llc_bytes``: the device's last-level cache; the single-layer probes cycle through enough
    layer copies to fill twice that, as before, so weights come back cold as in a whole model.
    ``tokens``: KV positions the forward passes hold per layer and the single-layer probes
    per layer copy (``kv_tokens``); the layers, the copies and their KV caches each fit in
    ``budget.decoder_bytes``.
    """
    factor, spec = 1, _proxy(model, tp, 1, budget.min_width, 1, None)
    while _layer_bytes(spec, dtype_bytes) > budget.layer_bytes:
        narrower = _proxy(model, tp, 2 * factor, budget.min_width, 1, None)
        if narrower == spec:  # every width at its floor: the budget yields to the floor
            break
        factor, spec = 2 * factor, narrower
    layer = _layer_bytes(spec, dtype_bytes)
    vocab = spec.vocab_size
    if vocab * spec.hidden_size * dtype_bytes > budget.lm_head_bytes:
        vocab = max(64, budget.lm_head_bytes // (spec.hidden_size * dtype_bytes) // 64 * 64)
    kv = _kv_bytes(spec, dtype_bytes)
    fits = max(1, budget.decoder_bytes // (layer + tokens[0] * kv))
    cycle = math.ceil(2 * llc_bytes / max(layer, 1))
    copies = min(model.num_layers, fits, cycle, budget.decoder_bytes // (layer + tokens[1] * kv))
    copies = max(1, copies)
    if budget.forward_all:
        layers = min(model.num_layers, fits)
    else:
        layers = min(model.num_layers, max(budget.min_layers, copies))
    spec = _proxy(model, tp, factor, budget.min_width, layers, vocab)

    real, timed = gemm_shapes(model, tp), gemm_shapes(spec, 1)
    weights = sum(g.k * g.n * g.calls for g in real.values())  # the model's, on one rank
    if set(real) != set(timed):  # a proxy keeps every role; a mismatch is a bug here
        raise AssertionError(f"proxy roles {sorted(timed)} differ from {sorted(real)}")
    gemm_scale = {r: (real[r].k * real[r].n) / (timed[r].k * timed[r].n) for r in real}
    g_real, g_timed = model.layer_groups[0], spec.layer_groups[0]
    attention_scale = max(1, g_real.num_heads // tp) / g_timed.num_heads
    elementwise_scale = elementwise_bytes_per_token(model, tp, "bf16") / (
        elementwise_bytes_per_token(spec, 1, "bf16")
    )
    return ShapePlan(
        model=model,
        tp=tp,
        spec=spec,
        factor=factor,
        head_factor=round(attention_scale),
        layers=layers,
        copies=copies,
        gemm_scale=gemm_scale,
        attention_scale=attention_scale,
        elementwise_scale=elementwise_scale,
        dtype_bytes=dtype_bytes,
        min_width=budget.min_width,
        scrub_bytes=min(weights * dtype_bytes, 2 * llc_bytes, budget.scrub_bytes),
    )


def plan_calibration(
    model: ModelSpec,
    tp: int,
    dtype_bytes: int,
    budget: Budget,
    llc_bytes: int,
    sweep: Plan,
    device: str,
) -> tuple[Plan, ShapePlan]:
    """The sweep and the timed shapes of ``model`` together: ``plan_shapes`` for ``sweep``, its
    decode contexts halved (``shorter``) until the estimate fits ``budget.total_bytes``.

    ``plan_shapes`` sizes the layers and copies to ``budget.decoder_bytes`` with their KV
    caches, but builds at least one (a CPU ``--quick`` check: two), and its widths follow the
    weights, not the KV. A model with many KV bytes per token (MHA: as many KV heads as query
    heads; internlm-20b holds 5x llama-3.1-8b's) overruns the budget whatever the widths: on a
    GPU one decode probe of 256 x 8192 positions holds 40 GiB of internlm-20b's KV for a single
    layer. Its heads cannot fold further without narrowing the query width under
    ``budget.min_width``, so the sweep gives way instead: each halving halves the decode KV
    positions and keeps the shapes (real ones where they fit) and the fitted and held-out points
    apart; beyond the shorter grid the measured model relaxes to the roofline. The GQA models
    the budgets were set for keep the whole sweep."""
    factor = 1
    while True:
        shapes = plan_shapes(model, tp, dtype_bytes, budget, llc_bytes, kv_tokens(sweep, device))
        shapes = dataclasses.replace(shapes, context_factor=factor)
        if (
            estimate_bytes(sweep, shapes, device) <= budget.total_bytes
            or min(sweep.decode_context) <= 1
        ):
            return sweep, shapes
        sweep, factor = shorter(sweep), 2 * factor


def _kv_bytes(spec: ModelSpec, dtype_bytes: int) -> int:
    """KV-cache bytes per token and layer as the probes hold them (MLA: the larger of its
    prefill (MHA) and decode (latent) forms)."""
    g = spec.layer_groups[0]
    if g.kind == "mla":
        mha = g.num_heads * (g.qk_nope_head_dim + g.qk_rope_head_dim + g.v_head_dim)
        return max(mha, g.kv_lora_rank + g.qk_rope_head_dim) * dtype_bytes
    return g.num_kv_heads * (g.head_dim_k + g.head_dim_v) * dtype_bytes


def estimate_bytes(sweep: Plan, shapes: ShapePlan, device: str) -> int:
    """Bytes of tensors a calibration with ``sweep`` and ``shapes`` holds at its peak, from
    the shapes alone (an upper estimate; the interpreter, torch and matplotlib come on top):
    the weights, every probe's KV caches and inputs that are kept across rounds (on a GPU,
    the largest forward pass's, rebuilt each round), the cache scrub, the largest transient
    activations, and the copy and storage buffers."""
    spec, b = shapes.spec, shapes.dtype_bytes
    mla = spec.layer_groups[0].kind == "mla"  # kernel probes, no decoder (nor forward pass)
    weights = shapes.lm_head_bytes + shapes.layer_bytes * (2 if mla else shapes.layers)
    kv = _kv_bytes(spec, b)
    hidden = spec.hidden_size * b
    copies = 1 if mla else shapes.copies
    kept = 0
    for batch in layer_batches(sweep):
        held = batch.cached * kv * copies
        kept += (held if held <= GiB else 0) + batch.tokens * hidden
    largest = max(batch.cached * kv * copies for batch in layer_batches(sweep))
    if not mla:
        kept += kv_tokens(sweep, device)[0] * kv * shapes.layers
    timed = gemm_shapes(spec, 1)
    widest = max([x.n for x in timed.values()] + [x.k for x in timed.values()])
    rows = max(sweep.tokens + [x.tokens for x in sweep.batches])
    transient = 8 * rows * widest * b + largest
    scrub = shapes.scrub_bytes
    buffers = 2 * max(sweep.copy_bytes) + max(sweep.storage_bytes) * (3 if device == "cuda" else 1)
    return weights + kept + transient + scrub + buffers
