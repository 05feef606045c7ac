"""What a router sees and decides: replica snapshots in, a replica index out.

A router never imports the engine (DESIGN.md). The cluster hands it a `ClusterView`: each
replica's load (`ReplicaLoad`) and, per replica, how much of a request's prefix it holds and in
which tier (`PrefixMatch`). Both may be stale: with `--router-refresh-s` > 0 the view is a
snapshot refreshed at that interval, as event-fed indexers are. Approximate routers (SGLang's
cache-aware, production-stack's prefix trie, llm-d's approximate prefix scorer) ignore the
cache side of the view and learn only from their own decisions, as they do in their engines.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol

from kvsim.errors import ConfigError
from kvsim.policies.base import RequestHint


@dataclass(frozen=True, slots=True)
class PrefixMatch:
    """The consecutive leading blocks of a request held by one replica, each counted once, in
    the fastest place it lives: its HBM (`device`), node memory (`host`: dram, cxl), node
    storage (`disk`: nvme), or the pool shared by every node (`shared`: rdma, pfs)."""

    device: int = 0
    host: int = 0
    disk: int = 0
    shared: int = 0

    @property
    def blocks(self) -> int:
        return self.device + self.host + self.disk + self.shared


@dataclass(frozen=True, slots=True)
class ReplicaLoad:
    """One replica's load as the router last saw it."""

    index: int
    node: int
    role: str  # "mixed" (aggregated serving), "prefill" or "decode"
    waiting: int  # requests queued
    running: int  # requests admitted (computing, decoding or loading KV)
    prefill_tokens: int  # prompt tokens queued or in progress that still need computing
    decode_blocks: int  # KV blocks held by admitted requests
    kv_usage: float  # fraction of the replica's HBM blocks held by admitted requests
    capacity_blocks: int  # the replica's HBM KV blocks

    @property
    def active(self) -> int:
        return self.waiting + self.running


@dataclass(frozen=True, slots=True)
class RouteRequest:
    """A request as a router sees it: its prompt's full-block hash chain, nothing simulated."""

    index: int  # row of the trace
    session_id: int
    input_tokens: int
    block_size: int
    hashes: Sequence[int]  # chained hashes of the prompt's full blocks, first block first
    hint: RequestHint | None = None  # what the serving system knows of it (turn, category, ...)

    @property
    def blocks(self) -> int:
        """Prompt blocks, counting a partial last block (ISL / B rounded up)."""
        return -(-self.input_tokens // self.block_size)


class ClusterView(Protocol):
    """The cluster as routers see it (possibly stale)."""

    @property
    def now_s(self) -> float: ...

    @property
    def loads(self) -> Sequence[ReplicaLoad]:
        """Every replica's load, indexed by replica."""
        ...

    def match(self, replica: int, request: RouteRequest) -> PrefixMatch:
        """How much of `request`'s prefix `replica` holds, and where."""
        ...

    def queue_s(self, replica: int) -> float:
        """Estimated seconds before `replica` starts a new request's prefill (its queued and
        running prefill work, priced by the cost model)."""
        ...

    def prefill_s(self, replica: int, tokens: int, context: int) -> float:
        """Seconds to prefill `tokens` new tokens after `context` cached ones on `replica`."""
        ...

    def load_s(self, replica: int, match: PrefixMatch) -> float:
        """Seconds to bring the part of `match` below HBM into `replica`'s HBM."""
        ...


class ParamError(ConfigError):
    """A router parameter out of its range, raised by a `Params` dataclass; the registry adds
    the router's name so the message reads as one line naming router and parameter."""

    def __init__(self, field: str, why: str) -> None:
        self.field, self.why = field, why
        super().__init__(f"parameter {field!r} {why}")


def check_param(ok: bool, field: str, why: str) -> None:
    """Raise `ParamError(field, why)` unless `ok` (for `Params.__post_init__`)."""
    if not ok:
        raise ParamError(field, why)


class Router:
    """Chooses a replica for each request. Subclasses set `name` and implement `choose`.

    `rng` is the run's seeded generator (ties, sampling); `Params`, when set, is a dataclass of
    the router's parameters with its engine's defaults, filled from `--router-param`."""

    name: ClassVar[str] = ""
    Params: ClassVar[type | None] = None
    pd_threshold_tokens: int | None = None
    """Under P/D, the router's own rule for when to disaggregate: prefill on a separate replica
    when the request's tokens not cached on its decode replica are at least this many (llm-d's
    decode-first rule). None: the cluster's own setting applies."""

    def __init__(self, params: Any = None, rng: random.Random | None = None) -> None:
        self.params = params if params is not None else (self.Params() if self.Params else None)
        self.rng = rng if rng is not None else random.Random(0)

    def choose(self, request: RouteRequest, view: ClusterView, candidates: Sequence[int]) -> int:
        """The replica (one of `candidates`, never empty) that serves `request`."""
        raise NotImplementedError

    def choose_prefill(
        self, request: RouteRequest, view: ClusterView, candidates: Sequence[int]
    ) -> int:
        """Under P/D, the prefill replica for a request whose decode replica is chosen.
        By default the same rule as `choose`."""
        return self.choose(request, view, candidates)
