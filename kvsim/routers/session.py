"""Session affinity by consistent hashing, after vLLM production-stack's `session` router
(`src/vllm_router/routers/routing_logic.py`, `SessionRouter`, which puts the endpoints on a
hash ring and looks up the request's session id).

Each replica owns `virtual_nodes` points on a 64-bit ring; a session goes to the owner of the
first point at or after its own hash, wrapping around. Hashes are BLAKE2b (8-byte digest) of the
replica index and of the session id, not Python's salted `hash()`, so the mapping is the same in
every process and run. Because points belong to replicas, not to positions in a list, taking a
replica out of the candidate set moves only the sessions it owned; the others stay where they
were. Every turn of a session lands on the same replica, which is what makes the router
prefix-friendly without looking at any cache. Single-turn traces give each request its own
session, so the ring spreads them like a hash.

Default: 160 virtual nodes per replica (the count ketama-style rings such as `uhashring`, which
production-stack uses, place per node).
"""

from __future__ import annotations

import random
from bisect import bisect_left
from collections.abc import Sequence
from dataclasses import dataclass
from hashlib import blake2b
from typing import Any

from kvsim.routers.base import ClusterView, Router, RouteRequest, check_param


@dataclass(frozen=True)
class SessionParams:
    virtual_nodes: int = 160  # uhashring ring.py HashRing: self._default_vnodes = 160
    """Points each replica owns on the ring; more points, more even spread."""

    def __post_init__(self) -> None:
        check_param(self.virtual_nodes >= 1, "virtual_nodes", "must be at least 1")


def ring_hash(data: bytes) -> int:
    """A 64-bit position on the ring, the same in every process."""
    return int.from_bytes(blake2b(data, digest_size=8).digest(), "little")


class HashRing:
    """Sorted ring points and the replica owning each."""

    __slots__ = ("owners", "points")

    def __init__(self, replicas: Sequence[int], virtual_nodes: int) -> None:
        placed = sorted(
            (ring_hash(f"replica-{w}#{v}".encode()), w)
            for w in replicas
            for v in range(virtual_nodes)
        )
        self.points = [p for p, _ in placed]
        self.owners = [w for _, w in placed]

    def owner(self, key: int) -> int:
        """The replica owning the first point at or after `key`, wrapping around."""
        i = bisect_left(self.points, key)
        return self.owners[i if i < len(self.points) else 0]


class SessionRouter(Router):
    """Every request of a session goes to the replica its id hashes to on the ring."""

    name = "session"
    Params = SessionParams

    def __init__(self, params: Any = None, rng: random.Random | None = None) -> None:
        super().__init__(params, rng)
        self._rings: dict[tuple[int, ...], HashRing] = {}  # one per candidate set, built once

    def choose(self, request: RouteRequest, view: ClusterView, candidates: Sequence[int]) -> int:
        key = tuple(candidates)
        ring = self._rings.get(key)
        if ring is None:
            ring = self._rings[key] = HashRing(key, self.params.virtual_nodes)
        return ring.owner(ring_hash(b"session-%d" % request.session_id))
