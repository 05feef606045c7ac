"""`kvsim plan`: the cheapest deployment, in $ per million tokens, that meets p99 SLOs per rate.

For each rate the search runs in stages, each sizing replicas with `ReplicaSearch` (gallop from
a hint, then bisect: goodput grows with replicas):

1. routers: the first router from one replica up; the others in lockstep, capped at the first
   one's count (a router that needs more GPUs than another cannot be cheaper: GPUs are most of
   the cost);
2. tiers, one at a time (dram, cxl, nvme, then the shared rdma pool), coarse to fine: from the
   profile's capacity down by factors of 4 (c, c/4, c/16, c/64, then off), stopping where the
   larger size buys less than `min_gain` of $/M tokens over the smaller; an off-by-default tier
   is tried at full size first and dropped if that buys less than `min_gain`. The cheapest size
   seen, then its half, is kept. Each candidate is capped at the incumbent's replica count;
3. P/D: prefill shares of the winning count (1/4, 1/2), capped at that count.

The winner is the cheapest deployment seen that meets both SLOs (ties go to the simpler: fewer
replicas, smaller tiers, the earlier router, aggregated serving). Every rate's search is a
generator of batches, and the rates advance in lockstep, so one round hands all the independent
runs of every rate to the runner at once (kvsim.sweep spreads them over a pool or a Ray cluster).
Identical configurations run once per plan (`CachedRunner`).

A run meets the SLOs when every request completes and its TTFT p99 and TPOT p99 are at most the
objectives. Runs share one seed, so a plan is deterministic.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from kvsim.errors import ConfigError, KvsimError
from kvsim.hardware.tier_kinds import tier_kind
from kvsim.plan.deployment import (
    SEARCHED_TIERS,
    Deployment,
    Shape,
    Tiers,
    base_tiers,
)
from kvsim.plan.rates import Rate
from kvsim.plan.runner import CachedRunner, Runner, Summary
from kvsim.plan.search import ReplicaSearch
from kvsim.run import RunConfig
from kvsim.units import format_bytes

#: A load-only baseline and the two KV-aware routers that led the fleet table (README).
DEFAULT_ROUTERS = ("round-robin", "dynamo-kv", "llm-d")
DEFAULT_PD_SHARES = (0.25, 0.5)
DEFAULT_MIN_GAIN = 0.01
DEFAULT_MAX_REPLICAS = 64
COARSE_FACTOR = 4  # tier sizes step by this factor, then one halving
COARSE_STEPS = 4  # sizes tried below and at the profile's: c, c/4, c/16, c/64 (then off)

T = TypeVar("T")
#: A stage: yields the deployments it needs run, receives their evaluations, returns T.
Step = Generator[list[Deployment], list["Evaluation"], T]


@dataclass(frozen=True)
class PlanSettings:
    """Everything a plan needs besides its rates; `base` carries trace, model, hardware, seed."""

    base: RunConfig
    slo_ttft_p99_s: float
    slo_tpot_p99_s: float
    routers: tuple[str, ...] = DEFAULT_ROUTERS
    max_replicas: int = DEFAULT_MAX_REPLICAS
    min_gain: float = DEFAULT_MIN_GAIN
    pd_shares: tuple[float, ...] = DEFAULT_PD_SHARES
    search_tiers: tuple[str, ...] = SEARCHED_TIERS

    def config(self, rate: Rate, deployment: Deployment) -> RunConfig:
        """The run of `deployment` at `rate`, with the SLOs as goodput bounds."""
        return dataclasses.replace(
            self.base,
            rate_scale=rate.rate_scale,
            engine=deployment.engine(self.base.engine),
            slo_ttft_s=self.slo_ttft_p99_s,
            slo_tpot_s=self.slo_tpot_p99_s,
        )


def check_settings(settings: PlanSettings) -> None:
    """Refuse a plan that cannot mean what was asked, before any run (one ConfigError line)."""
    from kvsim.resolve import resolve
    from kvsim.routers import resolve_router

    for name, value in (
        ("--slo-ttft-p99", settings.slo_ttft_p99_s),
        ("--slo-tpot-p99", settings.slo_tpot_p99_s),
    ):
        if not (isinstance(value, int | float) and math.isfinite(value) and value > 0):
            raise ConfigError(f"{name}: expected a positive number of seconds, got {value}")
    if not settings.routers:
        raise ConfigError("--routers: expected at least one router name")
    for router in settings.routers:
        if not router.strip():
            raise ConfigError("--routers: expected router names, got an empty one")
        resolve_router(router)
    if len(set(settings.routers)) != len(settings.routers):
        raise ConfigError("--routers: a router is named twice")
    if not (isinstance(settings.max_replicas, int) and settings.max_replicas >= 1):
        raise ConfigError(
            f"--max-replicas: expected a positive integer, got {settings.max_replicas}"
        )
    if not (0 <= settings.min_gain < 1):
        raise ConfigError(f"--min-gain: expected a fraction in [0, 1), got {settings.min_gain}")
    for share in settings.pd_shares:
        if not 0 < share < 1:
            raise ConfigError(f"P/D prefill share: expected a fraction in (0, 1), got {share}")
    resolve(settings.base)


def check_runs(settings: PlanSettings, rates: Sequence[Rate]) -> None:
    """Refuse, before any run, a plan some of whose runs `resolve` would refuse. An invalid
    configuration is not an unmet SLO, so it must not surface as one after many runs.

    Checked: each rate on each router's largest fleet (`max_replicas`, the most GPUs the search
    may ask for), and at the highest rate every kind of deployment the stages build (`_shapes`):
    each searched tier at its full size, all of them at once, and each P/D share at two replicas
    and at `max_replicas`. What `resolve` checks grows with the fleet, not the other way round
    (GPUs, nodes that P/D spans), so the extremes stand for the counts between them."""
    from kvsim.resolve import resolve

    def check(rate: Rate, deployment: Deployment, why: str) -> None:
        try:
            resolve(settings.config(rate, deployment))
        except KvsimError as exc:
            raise ConfigError(
                f"--rates {rate.label} on {deployment.describe()} ({why}): {exc}"
            ) from None

    for rate in rates:
        for router in settings.routers:
            check(rate, Deployment(settings.max_replicas, router), "--max-replicas")
    if not rates:
        return
    top = max(rates, key=lambda r: r.rate_scale)
    for deployment, why in _shapes(settings, _profile_tiers(settings.base.hardware)):
        check(top, deployment, why)


def _profile_tiers(hardware: str) -> dict[str, tuple[int, bool]]:
    """The profile's lower tiers: name -> (capacity bytes, on by default)."""
    from kvsim.hardware import load_profile

    profile = load_profile(hardware)
    return {
        t.name: (int(t.capacity_bytes), bool(t.enabled)) for t in profile.tiers if t.name != "hbm"
    }


def _shapes(
    settings: PlanSettings, profile_tiers: dict[str, tuple[int, bool]]
) -> list[tuple[Deployment, str]]:
    """One deployment of each kind the plan's stages build, at the sizes `check_runs` checks."""
    top = settings.max_replicas
    base = Shape(settings.routers[0], base_tiers([(n, c, on) for n, (c, on) in
                                                  profile_tiers.items()]))  # fmt: skip
    searched = [n for n in settings.search_tiers if n in profile_tiers]
    full = base
    out: list[tuple[Deployment | None, str]] = [(base.at(1), "one replica")]
    for name in searched:
        full = full.with_tier(name, profile_tiers[name][0])
        alone = base.with_tier(name, profile_tiers[name][0]).at(top)
        out.append((alone, f"{tier_kind(name).label} at its full size, which the plan tries"))
    out.append((full.at(top), "every searched tier at its full size"))
    for share in settings.pd_shares:
        for tiers in dict.fromkeys([base, full]):
            for n in dict.fromkeys([2, top]):
                at = dataclasses.replace(tiers, pd_share=share).at(n)
                if at is not None:
                    out.append((at, f"a P/D split the plan tries, prefill share {share:g}"))
    first: dict[Deployment, str] = {}
    for deployment, why in out:
        if deployment is not None:
            first.setdefault(deployment, why)
    return list(first.items())


# -- results -----------------------------------------------------------------------------------
def _secs(s: float) -> str:
    return f"{s * 1000:,.0f} ms" if s < 1 else f"{s:,.2f} s"


@dataclass(frozen=True)
class Evaluation:
    """One run of the plan: where, what it measured, and why it misses the SLOs (None: meets)."""

    rate: Rate
    deployment: Deployment
    summary: Summary
    miss: str | None

    @property
    def meets(self) -> bool:
        return self.miss is None

    @property
    def cost(self) -> float:
        """$/M tokens; infinite for a run that misses or has no figure."""
        cost = self.summary.get("cost_per_million_tokens_usd")
        ok = self.meets and isinstance(cost, float) and math.isfinite(cost)
        return cost if ok else math.inf  # type: ignore[return-value]


def miss_reason(summary: Summary, slo_ttft_s: float, slo_tpot_s: float) -> str | None:
    """'TTFT p99 3.10 s > 2.00 s' and the like; None when the run meets both objectives."""
    if "error" in summary:
        return f"fails: {summary['error']}"
    reasons = []
    if summary["completed"] < summary["requests"]:
        reasons.append(f"{summary['requests'] - summary['completed']} requests do not complete")
    for name, key, slo in (("TTFT", "ttft_p99_s", slo_ttft_s), ("TPOT", "tpot_p99_s", slo_tpot_s)):
        value = summary.get(key)
        if value is None or (isinstance(value, float) and math.isnan(value)):
            if name == "TTFT":  # no completed request; a one-token reply has no TPOT and passes
                reasons.append("no TTFT p99")
            continue
        if value > slo:
            reasons.append(f"{name} p99 {_secs(value)} > {_secs(slo)}")
    return " and ".join(reasons) or None


@dataclass(frozen=True)
class Found:
    """What a replica search found for one shape: the smallest count that meets, if any."""

    shape: Shape
    replicas: int | None
    cap: int
    best: Evaluation | None  # the run at `replicas`
    below: Evaluation | None  # the run one replica fewer (or at `cap` when none meets)

    @property
    def cost(self) -> float:
        return self.best.cost if self.best else math.inf

    def short(self) -> str:
        """'$0.254/M at 6' or 'misses at 6: TTFT p99 …' for explanations."""
        if self.best is not None:
            return f"${self.cost:.3f}/M at {self.replicas}"
        if self.below is not None:
            return f"misses at {self.cap}: {self.below.miss}"
        return f"cannot run at {self.cap} replicas"


@dataclass
class RatePlan:
    """A rate's answer: the winning run (None when nothing up to the cap meets) and why."""

    rate: Rate
    winner: Evaluation | None
    explanation: str

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "rate": self.rate.requests_per_s,
            "rate_label": self.rate.label,
            "rate_scale": self.rate.rate_scale,
            "feasible": self.winner is not None,
        }
        keys = ("ttft_p99_s", "tpot_p99_s", "goodput_tokens_per_s", "slo_attainment",
                "prefix_hit_ratio", "cost_per_million_tokens_usd")  # fmt: skip
        if self.winner is None:
            out.update({"replicas": None, "router": None, "tiers": None, "pd": None})
            out.update(dict.fromkeys(keys))
        else:
            out.update(self.winner.deployment.as_dict())
            out.update({k: self.winner.summary.get(k) for k in keys})
        out["explanation"] = self.explanation
        return out


@dataclass
class PlanResult:
    """The frontier (one `RatePlan` per rate, lowest first) and every distinct run of the plan."""

    settings: PlanSettings
    frontier: list[RatePlan]
    evaluations: list[Evaluation]
    runs: int
    rounds: int
    wall_s: float

    def as_dict(self) -> dict[str, Any]:
        s = self.settings
        return {
            "frontier": [p.as_dict() for p in self.frontier],
            "runs": self.runs,
            "rounds": self.rounds,
            "wall_s": self.wall_s,
            "trace": s.base.trace,
            "max_requests": s.base.max_requests,
            "model": s.base.model,
            "hardware": s.base.hardware,
            "slo": {"ttft_p99_s": s.slo_ttft_p99_s, "tpot_p99_s": s.slo_tpot_p99_s},
            "routers": list(s.routers),
            "min_gain": s.min_gain,
            "max_replicas": s.max_replicas,
            "evaluated": [
                {
                    "rate": e.rate.requests_per_s,
                    "rate_label": e.rate.label,
                    **e.deployment.as_dict(),
                    "meets": e.meets,
                    "miss": e.miss,
                    **{k: v for k, v in e.summary.items() if k != "hit_ratio_by_tier"},
                }
                for e in self.evaluations
            ],
        }


# -- one rate's search ---------------------------------------------------------------------------
@dataclass
class _RatePlanner:
    settings: PlanSettings
    rate: Rate
    profile_tiers: dict[str, tuple[int, bool]]  # lower tier -> (capacity bytes, on by default)
    seen: dict[Deployment, Evaluation] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def _evaluate(self, deployments: list[Deployment]) -> Step[list[Evaluation]]:
        if not deployments:
            return []
        evaluations = yield deployments
        self.seen.update(zip(deployments, evaluations, strict=True))
        return evaluations

    def min_replicas(self, shapes: Sequence[Shape], hint: int, cap: int) -> Step[list[Found]]:
        """The smallest count meeting the SLOs for each shape, all searched in lockstep."""
        searches = [ReplicaSearch(hint, cap) for _ in shapes]
        while True:
            asks = [(i, n) for i, s in enumerate(searches) for n in s.probes()]
            if not asks:
                break
            wanted = [shapes[i].at(n) for i, n in asks]
            runnable = list(dict.fromkeys(d for d in wanted if d is not None))
            yield from self._evaluate(runnable)
            verdicts: list[dict[int, bool]] = [{} for _ in searches]
            for (i, n), d in zip(asks, wanted, strict=True):
                verdicts[i][n] = d is not None and self.seen[d].meets
            for search, verdict in zip(searches, verdicts, strict=True):
                search.update(verdict)
        found = []
        for shape, search in zip(shapes, searches, strict=True):
            n = search.answer
            at = shape.at(n) if n is not None else None
            near = shape.at(n - 1) if n is not None and n > 1 else shape.at(cap)
            found.append(
                Found(
                    shape,
                    n,
                    cap,
                    self.seen[at] if at is not None else None,
                    self.seen.get(near) if near is not None and near != at else None,
                )
            )
        return found

    def run(self) -> Step[RatePlan]:
        s = self.settings
        shape = Shape(s.routers[0], base_tiers([(n, c, on) for n, (c, on) in
                                                self.profile_tiers.items()]))  # fmt: skip
        best = yield from self._routers(shape)
        if best.best is None:
            why = best.below.miss if best.below else "cannot run"
            return RatePlan(
                self.rate, None, f"even {s.max_replicas} replicas miss the SLOs ({why})"
            )
        for name in s.search_tiers:
            if name in self.profile_tiers:
                best = yield from self._tier(best, name)
        best = yield from self._pd(best)
        assert best.best is not None
        below = best.below
        if best.replicas == 1:
            head = "1 replica meets the SLOs"
        elif below is not None:
            split = (
                f" (P/D {below.deployment.pd[0]}:{below.deployment.pd[1]})"
                if (below.deployment.pd)
                else ""
            )
            head = f"{below.deployment.replicas} replicas{split} miss ({below.miss})"
        else:
            head = f"{best.replicas} replicas are the fewest that meet the SLOs"
        return RatePlan(self.rate, best.best, "; ".join([head, *self.notes]))

    def _routers(self, shape: Shape) -> Step[Found]:
        s = self.settings
        rest = s.routers[1:]
        [lead] = yield from self.min_replicas([shape], 1, s.max_replicas)
        found = [lead]
        if rest:
            cap = lead.replicas or s.max_replicas
            shapes = [dataclasses.replace(shape, router=r) for r in rest]
            found += yield from self.min_replicas(shapes, cap if lead.replicas else 1, cap)
        order = {f.shape.router: i for i, f in enumerate(found)}
        best = min(found, key=lambda f: (f.cost, f.replicas or math.inf, order[f.shape.router]))
        if len(found) > 1 and best.best is not None:
            others = ", ".join(f"{f.shape.router} ({f.short()})" for f in found if f is not best)
            self.notes.append(f"router {best.shape.router} ({best.short()}) beats {others}")
        return best

    def _tier(self, best: Found, name: str) -> Step[Found]:
        """Size tier `name` coarse to fine against the incumbent `best`."""
        gain = self.settings.min_gain
        capacity, _ = self.profile_tiers[name]
        assert best.replicas is not None
        cap = best.replicas
        tried: dict[int, Found] = {best.shape.tier_size(name): best}

        def size(bytes_: int) -> Step[Found]:
            if bytes_ not in tried:
                [f] = yield from self.min_replicas([best.shape.with_tier(name, bytes_)], cap, cap)
                tried[bytes_] = f
            return tried[bytes_]

        def buys(larger: Found, smaller: Found) -> bool:
            if larger.best is None:
                return False
            return smaller.best is None or larger.cost < smaller.cost * (1 - gain)

        ladder = [capacity // COARSE_FACTOR**k for k in range(COARSE_STEPS)]
        ladder = [b for b in ladder if b > 0] + [0]
        current = best.shape.tier_size(name)
        label = tier_kind(name).label
        if current == 0:
            top = yield from size(capacity)
            if not buys(top, best):
                self.notes.append(self._tier_note(label, 0, tried))
                return best
            current = capacity
        if current not in ladder:
            ladder = sorted({*ladder, current}, reverse=True)
        larger_size = current
        for smaller_size in ladder[ladder.index(current) + 1 :]:
            smaller = yield from size(smaller_size)
            if buys(tried[larger_size], smaller):
                break
            larger_size = smaller_size

        def key(item: tuple[int, Found]) -> tuple[float, int]:
            return (item[1].cost, item[0])

        chosen, _ = min(tried.items(), key=key)
        if chosen > 0 and chosen // 2 not in tried:
            yield from size(chosen // 2)  # the fine step
        chosen, winner = min(tried.items(), key=key)
        self.notes.append(self._tier_note(label, chosen, tried))
        return winner

    def _tier_note(self, label: str, chosen: int, tried: dict[int, Found]) -> str:
        """'DRAM 116.4 GiB: more buys < 1 % (…); 29.1 GiB costs 3.2 % more (…)'."""
        gain = self.settings.min_gain
        here = tried[chosen]

        def figures(f: Found) -> str:
            if f.best is None:
                return f.short()
            return f"hit ratio {f.best.summary['prefix_hit_ratio']:.3f}, {f.short()}"

        larger = [b for b in tried if b > chosen]
        smaller = [b for b in tried if b < chosen]
        parts = []
        if larger:
            big = max(larger)
            more = "more" if chosen else format_bytes(min(larger))
            upto = f" up to {format_bytes(big)}" if chosen or len(larger) > 1 else ""
            parts.append(
                f"{more}{upto} buys < {gain:.0%} ({figures(here)} → {format_bytes(big)}: "
                f"{figures(tried[big])})"
            )
        if smaller:
            low = max(smaller)
            lost = tried[low]
            what = format_bytes(low) if low else "off"
            if lost.best is not None:
                parts.append(f"{what} costs {lost.cost / here.cost - 1:.1%} more ({figures(lost)})")
            else:
                parts.append(f"{what} {lost.short()}")
        head = f"{label} {format_bytes(chosen)}" if chosen else f"{label} off"
        return f"{head}: " + "; ".join(parts) if parts else head

    def _pd(self, best: Found) -> Step[Found]:
        s = self.settings
        n = best.replicas
        assert n is not None
        if n < 2 or not s.pd_shares:
            return best
        by_split: dict[Deployment, Shape] = {}  # shares that give the same split run once
        for share in s.pd_shares:
            shape = dataclasses.replace(best.shape, pd_share=share)
            at = shape.at(n)
            if at is not None:
                by_split.setdefault(at, shape)
        shapes = list(by_split.values())
        found = yield from self.min_replicas(shapes, n, n)
        ranked = [best, *found]
        winner = min(ranked, key=lambda f: (f.cost, f.replicas or math.inf, ranked.index(f)))
        parts = []
        for f in found:
            at = f.shape.at(f.replicas or n)
            pd = f"P/D {at.pd[0]}:{at.pd[1]}" if at and at.pd else "P/D"
            parts.append(f"{pd} {f.short()}")
        verdict = "wins" if winner is not best else "loses to aggregated"
        self.notes.append(f"P/D {verdict} ({', '.join(parts)}; aggregated {best.short()})")
        return winner


# -- the driver ----------------------------------------------------------------------------------
def plan(
    settings: PlanSettings,
    rates: Sequence[Rate],
    runner: Runner,
    on_round: Callable[[int, int], None] | None = None,
) -> PlanResult:
    """Search every rate, advancing all rates' searches one round at a time (see module doc)."""
    check_runs(settings, rates)
    start = time.perf_counter()
    profile_tiers = _profile_tiers(settings.base.hardware)
    cached = CachedRunner(runner, on_round)
    planners = [_RatePlanner(settings, rate, profile_tiers) for rate in rates]
    steps = [p.run() for p in planners]
    results: dict[int, RatePlan] = {}
    pending: dict[int, list[Deployment]] = {}
    evaluations: dict[tuple[int, Deployment], Evaluation] = {}

    def advance(i: int, sent: list[Evaluation] | None) -> None:
        try:
            pending[i] = steps[i].send(sent)  # type: ignore[arg-type]
        except StopIteration as stop:
            results[i] = stop.value
            pending.pop(i, None)

    for i in range(len(steps)):
        advance(i, None)
    while pending:
        batch = [(i, d) for i, wanted in pending.items() for d in wanted]
        summaries = cached([settings.config(planners[i].rate, d) for i, d in batch])
        got: dict[int, list[Evaluation]] = {i: [] for i in pending}
        for (i, d), summary in zip(batch, summaries, strict=True):
            miss = miss_reason(summary, settings.slo_ttft_p99_s, settings.slo_tpot_p99_s)
            e = Evaluation(planners[i].rate, d, summary, miss)
            evaluations.setdefault((i, d), e)
            got[i].append(e)
        for i in list(pending):
            advance(i, got[i])
    return PlanResult(
        settings,
        [results[i] for i in range(len(steps))],
        list(evaluations.values()),
        cached.runs,
        cached.rounds,
        time.perf_counter() - start,
    )


__all__ = [
    "DEFAULT_ROUTERS",
    "Evaluation",
    "PlanResult",
    "PlanSettings",
    "RatePlan",
    "Tiers",
    "check_settings",
    "miss_reason",
    "plan",
]
