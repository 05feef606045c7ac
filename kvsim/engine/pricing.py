"""Iteration pricers: how long one scheduled iteration, or a coalesced run of decode steps, takes.

A scheduler prices every iteration through one `IterationPricer`, chosen once when the replica
is built (`make_pricer`) and passed to its constructor:

- `PlainPricer`: the cost model as it is, for a run without KV compression.
- `LinearPricer`: one compression profile for every request whose reads grow one token a step
  (quant): the batch's equivalent reads summed exactly, so iterations and decode runs are priced
  in one pass as uncompressed ones are.
- `CompressedPricer`: anything else (token-dropping profiles, InfiniGen, a per-request choice):
  each request's reads and extra work priced on its own profile; a token-dropping profile's
  decoding requests hold only their kept tokens' blocks (`compacting`); InfiniGen fetches each
  step's tokens over the host link, which tier traffic to DRAM shares.

A pricer holds no request state: it reads the requests it is given and, for InfiniGen, starts
transfers on the host link. Nothing in the scheduler tests which pricer it has.
"""

from __future__ import annotations

from collections.abc import Generator
from itertools import chain, repeat
from operator import attrgetter
from typing import Protocol

import numpy as np
import simpy

from kvsim.costmodel import CostModel
from kvsim.engine.compress import EngineCompression
from kvsim.kvcache.link import Link
from kvsim.kvcache.request import Request

_computed = attrgetter("computed")

# (tokens to compute, context before them) of each prefill chunk in the iteration
Prefill = list[tuple[int, int]]


class IterationPricer(Protocol):
    """What the scheduler asks of a pricer."""

    cost: CostModel  # the replica's cost model (the front end's overhead is read from it too)
    compacting: bool  # compacted requests hold only their kept tokens' blocks

    def iteration_s(
        self,
        decoders: list[Request],
        batch: list[tuple[Request, int]],
        prefill: Prefill,
        decode: list[int],
    ) -> tuple[float, float]:
        """(seconds, bytes to fetch from CPU DRAM) of one iteration: `decoders` decode a token
        of a started output, `batch` holds (request, tokens) for the rest; `prefill` and
        `decode` are the same iteration as the cost model takes it (chunks less re-rotated
        tokens; the context of each decode)."""
        ...

    def fetching(self, compute_s: float, fetch_bytes: float) -> Generator[simpy.Event, None, None]:
        """Run an iteration of `compute_s` whose KV fetch of `fetch_bytes` overlaps it (only
        after `iteration_s` reported bytes to fetch)."""
        ...

    def run_ends_s(self, running: list[Request], steps: int) -> np.ndarray:
        """Cumulative end of each of `steps` decode steps of the unchanged batch `running`."""
        ...


class PlainPricer:
    """The cost model as it is: no request carries a compression."""

    compacting = False

    def __init__(self, cost: CostModel) -> None:
        self.cost = cost

    def iteration_s(
        self,
        decoders: list[Request],
        batch: list[tuple[Request, int]],
        prefill: Prefill,
        decode: list[int],
    ) -> tuple[float, float]:
        return self.cost.iteration_time_s(prefill, decode), 0.0

    def fetching(self, compute_s: float, fetch_bytes: float) -> Generator[simpy.Event, None, None]:
        raise AssertionError("only offloaded KV is fetched")

    def run_ends_s(self, running: list[Request], steps: int) -> np.ndarray:
        return self.cost.decode_run_ends_s(list(map(_computed, running)), steps)


class LinearPricer(PlainPricer):
    """Every request's profile is `comp`, whose reads are linear in the context (quant)."""

    def __init__(self, cost: CostModel, comp: EngineCompression) -> None:
        super().__init__(cost)
        self.comp = comp

    def iteration_s(
        self,
        decoders: list[Request],
        batch: list[tuple[Request, int]],
        prefill: Prefill,
        decode: list[int],
    ) -> tuple[float, float]:
        """The batch's equivalent reads summed exactly (a model with windows takes them per
        sequence), plus its dequantising and quantising."""
        cost = self.cost
        linear = self.comp
        if cost.windowed:
            equivalent = linear.equivalent_array(np.asarray(decode, dtype=np.float64))
            seconds = cost.iteration_time_s(prefill, equivalent)
        else:
            seconds = cost.iteration_time_s(prefill, decode, linear.equivalent_sum(decode))
        seconds += (
            linear.read_s * sum(decode)
            + linear.new_token_s * len(decode)
            + linear.prefill_token_s * sum(n for n, _ in prefill)
        )
        return seconds, 0.0

    def run_ends_s(self, running: list[Request], steps: int) -> np.ndarray:
        """Each step adds one packed token per sequence, and its dequantising and quantising."""
        linear = self.comp
        contexts = list(map(_computed, running))
        last = steps - 1
        start = linear.equivalent_sum(contexts)
        growth = (linear.equivalent_sum(contexts, last) - start) / last if last else 0.0
        array = np.asarray(contexts, dtype=np.float64)
        ends = self.cost.decode_run_ends_s(array, steps, growth, start)
        n = len(contexts)
        work = linear.read_s * (sum(contexts) + n * np.arange(steps, dtype=np.float64))
        return ends + np.cumsum(work + linear.new_token_s * n)


class CompressedPricer:
    """Requests carry compressions priced one by one: decode attention reads what each keeps
    (in uncompressed-token equivalents), prefill attention the whole prompt, plus each
    profile's own work; InfiniGen's fetches and DRAM writes go over `host_link`."""

    def __init__(
        self,
        env: simpy.Environment,
        cost: CostModel,
        *,
        compacting: bool = False,
        host_link: Link | None = None,
    ) -> None:
        self.env = env
        self.cost = cost
        self.compacting = compacting
        self.host_link = host_link

    def iteration_s(
        self,
        decoders: list[Request],
        batch: list[tuple[Request, int]],
        prefill: Prefill,
        decode: list[int],
    ) -> tuple[float, float]:
        reads: list[int | float] = []  # each decode's equivalent reads (`decode` is its context)
        extra = 0.0
        fetch = 0.0
        written = 0.0
        for req, n in chain(zip(decoders, repeat(1)), batch):
            comp: EngineCompression | None = req.comp  # type: ignore[assignment]
            if n != 1:  # a prefill chunk: scored, quantised, written to DRAM as it is computed
                if comp is not None:
                    extra += n * comp.prefill_token_s
                    written += n * comp.host_bytes_per_new_token
                continue
            c = req.computed
            if comp is None or (comp.drops and not req.table.compacted):
                reads.append(c)  # uncompressed, or its last prompt token: all KV is there
                continue
            g = max(c - req.input_tokens, 0)
            reads.append(comp.equivalent_tokens(c, g))
            extra += comp.decode_extra_s(c, g)
            if comp.offload:
                fetch += comp.fetch_bytes(c)
                written += comp.host_bytes_per_new_token
        if written and self.host_link is not None:  # new KV written to DRAM in the background
            self.host_link.transfer(int(written), write=True)
        return self.cost.iteration_time_s(prefill, reads) + extra, fetch

    def fetching(self, compute_s: float, fetch_bytes: float) -> Generator[simpy.Event, None, None]:
        """InfiniGen: layer l's KV is fetched while layer l-1 computes (arXiv 2406.19707, S5),
        so an iteration takes max(compute, fetch); the fetch shares the host link with tier
        traffic to DRAM."""
        assert self.host_link is not None
        done = self.host_link.transfer(int(fetch_bytes))
        yield self.env.timeout(compute_s)
        if not done.triggered:
            yield done

    def run_ends_s(self, running: list[Request], steps: int) -> np.ndarray:
        """Each sequence's reads and work are taken at the run's first and last step and
        interpolated in between (exact where they are linear in the context); InfiniGen's
        fetch bounds each step from below (`_fetch_bound`)."""
        last = steps - 1
        eq0 = np.empty(len(running))
        eq1 = np.empty(len(running))
        extra0 = extra1 = fetch0 = fetch1 = written = 0.0
        for i, req in enumerate(running):
            comp: EngineCompression | None = req.comp  # type: ignore[assignment]
            c = req.computed
            if comp is None:
                eq0[i], eq1[i] = c, c + last
                continue
            g = max(c - req.input_tokens, 0)
            eq0[i] = comp.equivalent_tokens(c, g)
            eq1[i] = comp.equivalent_tokens(c + last, g + last)
            extra0 += comp.decode_extra_s(c, g)
            extra1 += comp.decode_extra_s(c + last, g + last)
            if comp.offload:
                fetch0 += comp.fetch_bytes(c)
                fetch1 += comp.fetch_bytes(c + last)
                written += comp.host_bytes_per_new_token
        growth = float(eq1.sum() - eq0.sum()) / last if last else 0.0
        ends = self.cost.decode_run_ends_s(eq0, steps, growth)
        if extra0 or extra1:
            slope = (extra1 - extra0) / last if last else 0.0
            ends = ends + np.cumsum(extra0 + slope * np.arange(steps, dtype=np.float64))
        if written and self.host_link is not None:
            self.host_link.transfer(int(written * steps), write=True)
        fetch = (fetch0 + fetch1) / 2 * steps
        return self._fetch_bound(ends, fetch) if fetch else ends

    def _fetch_bound(self, ends: np.ndarray, fetch_bytes: float) -> np.ndarray:
        """InfiniGen in a coalesced run: step k ends no sooner than k/steps of the run's fetch,
        at the host link's rate shared with the transfers on it as the run starts; the fetch
        goes on the link as one transfer, so tier traffic shares the link with it."""
        link = self.host_link
        assert link is not None
        steps = len(ends)
        alone = link.work_s(int(fetch_bytes))
        fetch_s = link.latency_s + alone * link.read_slowdown()
        link.transfer(int(fetch_bytes))
        fetched = fetch_s * np.arange(1, steps + 1, dtype=np.float64) / steps
        return np.maximum(ends, fetched)


def make_pricer(
    env: simpy.Environment,
    cost: CostModel,
    *,
    compressed: bool,
    comp: EngineCompression | None,
    compacting: bool = False,
    host_link: Link | None = None,
) -> IterationPricer:
    """The pricer of a replica: `compressed` when requests may carry a compression, `comp` the
    profile every request carries (None under a per-request choice), `compacting` when a
    profile drops tokens, `host_link` the path to DRAM when a profile offloads KV there."""
    if comp is not None and comp.linear_reads and not comp.offload:
        assert not compacting and host_link is None  # quant keeps every token in HBM
        return LinearPricer(cost, comp)
    if compressed:
        return CompressedPricer(env, cost, compacting=compacting, host_link=host_link)
    return PlainPricer(cost)
