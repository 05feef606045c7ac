"""Prefill/decode disaggregation's hand-off between replicas.

The router picks a request's decode replica first (llm-d's order); when that replica lacks at
least `pd_threshold` prompt tokens, a prefill replica computes the prompt (`send`). When it is
done (`prefilled`) the request queues on its decode replica, which pulls the KV it lacks
(`pull`): over NVLink within a node, else over the fabric, the same link the rdma tier's loads,
write-backs and prefetches use. The prefill replica keeps its blocks until the pull is done.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import simpy

from kvsim.kvcache.block_table import BlockTable
from kvsim.kvcache.link import Link
from kvsim.kvcache.manager import KVCacheManager
from kvsim.kvcache.request import Request


class HandoffReplica(Protocol):
    """What the hand-off needs of a replica (kvsim.engine.scheduler.Scheduler)."""

    node: int
    kv: KVCacheManager

    def enqueue(self, request: Request) -> None: ...

    def wake(self) -> None: ...


class Handoff:
    """Moves P/D requests from their prefill replica to their decode replica.

    `replicas` is the fleet's list of replicas, filled by the assembler as it builds them (each
    takes this hand-off in its constructor); it is complete before the first request arrives."""

    def __init__(
        self,
        env: simpy.Environment,
        replicas: Sequence[HandoffReplica],
        *,
        block_size: int,
        kv_bytes_per_token: int,
        fabric: Link | None,
        nvlinks: dict[int, Link],
    ) -> None:
        self.env = env
        self.replicas = replicas
        self.block_size = block_size
        self.kv_bytes_per_token = kv_bytes_per_token  # every rank's share of a token
        self.fabric = fabric
        self.nvlinks = nvlinks  # per prefill replica: its link to the decode replicas of its node
        self._decode_of: dict[int, int] = {}  # request index -> its decode replica
        # request index -> (prefill replica, its block table) while the decode replica pulls
        self._pending: dict[int, tuple[int, BlockTable]] = {}

    def send(self, req: Request, decode_replica: int) -> None:
        """`req` is prefilled elsewhere first, then decodes on `decode_replica`."""
        self._decode_of[req.index] = decode_replica
        req.handoff = "prefill"

    def prefilled(self, req: Request, table: BlockTable) -> None:
        """Replica `req.replica` computed the prompt: queue the request on its decode replica."""
        self._pending[req.index] = (req.replica, table)
        self.replicas[self._decode_of.pop(req.index)].enqueue(req)

    def pull(self, req: Request, hit_blocks: int) -> simpy.Event:
        """Move the prompt KV the decode replica lacks; then the prefill replica lets go."""
        source, table = self._pending[req.index]
        dest = self.replicas[req.replica]
        tokens = max(req.input_tokens - hit_blocks * self.block_size, 0)
        nbytes = tokens * self.kv_bytes_per_token
        req.transfer_bytes += nbytes
        same_node = self.replicas[source].node == dest.node
        link = self.nvlinks[source] if same_node else self.fabric
        assert link is not None, "kvsim.engine.resolve refuses P/D across nodes without a fabric"
        done = link.transfer(nbytes)
        done.callbacks.append(lambda _ev: self._release(req, source, table))
        return done

    def _release(self, req: Request, source: int, table: BlockTable) -> None:
        del self._pending[req.index]
        replica = self.replicas[source]
        replica.kv.free(req, self.env.now, table)
        replica.wake()
