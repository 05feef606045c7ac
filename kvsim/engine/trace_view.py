"""A canonical trace as the engine reads it: columns, block chains and what an oracle needs.

Requests are made from these columns on demand (kvsim.engine.workload); a request's chain of
block ids, its blocks' kinds and its position-independent segments are filled in when the
KV-cache manager first asks (`load_chain`), so a request that is never routed costs nothing.
"""

from __future__ import annotations

import numpy as np

from kvsim.kvcache.hints import TraceHints
from kvsim.kvcache.request import Request
from kvsim.policies.oracle import FutureUses
from kvsim.traces import Trace
from kvsim.traces.blocks import block_kinds, sequence_block_ids
from kvsim.traces.replay import previous_turns
from kvsim.traces.schema import KIND_CODES, segment_columns
from kvsim.traces.stats import reused_from_ids

# segments whose KV can be reused at another position (a document, a tool's output)
_POSITION_INDEPENDENT = np.array([KIND_CODES["document"], KIND_CODES["tool"]], dtype=np.uint8)


class TraceRequests:
    """Columnar view of a canonical trace, turned into engine Requests on demand."""

    def __init__(self, trace: Trace, block_size: int) -> None:
        t = trace.table
        self.n = t.num_rows
        self.block_size = block_size
        self.request_id = t.column("request_id").to_numpy()
        self.session_id = t.column("session_id").to_numpy()
        self.turn = t.column("turn").to_numpy()
        self.arrival_s = t.column("arrival_s").to_numpy()
        think = t.column("think_time_s")
        self.closed_loop = think.is_valid().to_numpy(zero_copy_only=False) & (self.turn > 0)
        self.think_time_s = think.fill_null(0.0).to_numpy()
        self.input_tokens = t.column("input_tokens").to_numpy().astype(np.int64)
        self.output_tokens = t.column("output_tokens").to_numpy().astype(np.int64)
        self.output_hash = t.column("output_hash").to_numpy()
        self.hints = TraceHints(t)
        segments = segment_columns(t)
        self.seg_offsets = segments.offsets
        self.seg_hash = segments.hashes
        self.seg_tokens = segments.tokens
        self.seg_kinds = segments.kinds
        self._ids: tuple[np.ndarray, np.ndarray] | None = None
        self._id_span = 0  # ids are 1 .. span - 1: a salt's range starts at a multiple of it
        self._salt_slots: dict[int, int] = {0: 0}

    def block_ids(self) -> tuple[np.ndarray, np.ndarray]:
        """(block offsets, block ids) of every request's chain (`sequence_block_hashes`:
        prompt, then a content-addressed reply), numbered by first appearance in trace order
        (kvsim.traces.blocks.sequence_block_ids). Built once, on first use, in numpy passes
        over the whole trace."""
        if self._ids is None:
            self._ids = sequence_block_ids(
                self.seg_offsets,
                self.seg_hash,
                self.seg_tokens,
                self.output_hash,
                self.output_tokens,
                self.block_size,
            )
            self._id_span = int(self._ids[1].max(initial=0)) + 1
        return self._ids

    def reused_blocks(self) -> np.ndarray:
        """kvsim.traces.stats.reused_blocks at the engine's cap (at least one prompt token is
        computed), from the chains' ids."""
        offsets, ids = self.block_ids()
        return reused_from_ids(offsets, ids, (self.input_tokens - 1) // self.block_size)

    def _salted(self, ids: np.ndarray, salt: int) -> np.ndarray:
        """Block ids under a compression's salt (kvsim.compression; 0 for none): each salt gets
        its own range of ids, so blocks of different compressions never match."""
        if not salt:
            return ids
        slot = self._salt_slots.setdefault(salt, len(self._salt_slots))
        self.block_ids()
        return ids.astype(np.int64) + slot * self._id_span

    def load_chain(self, req: Request, with_kinds: bool, with_segments: bool = False) -> None:
        """Fill `req.table.hashes` (full blocks of prompt + reply) and, if asked, each block's
        kind and the request's reusable segments."""
        i = req.index
        table = req.table
        lo, hi = self.seg_offsets[i], self.seg_offsets[i + 1]
        block_offsets, ids = self.block_ids()
        chain = ids[block_offsets[i] : block_offsets[i + 1]]
        comp = req.comp
        if comp is not None and comp.salt:  # blocks of another compression never match
            chain = self._salted(chain, comp.salt)
        table.hashes = chain.tolist()
        if with_segments:
            kinds, tokens = self.seg_kinds[lo:hi], self.seg_tokens[lo:hi]
            ends = np.cumsum(tokens)
            starts = ends - tokens
            hashes = self.seg_hash[lo:hi]
            table.pic_segments = [
                (int(starts[j]), int(ends[j]), int(hashes[j]))
                for j in np.flatnonzero(np.isin(kinds, _POSITION_INDEPENDENT))
            ] or None
        if with_kinds:
            kinds, tokens = self.seg_kinds[lo:hi], self.seg_tokens[lo:hi]
            if self.output_hash[i]:
                kinds = np.append(kinds, np.uint8(KIND_CODES["assistant"]))
                tokens = np.append(tokens, int(self.output_tokens[i]))
            table.kinds = block_kinds(kinds, tokens, self.block_size)

    def future_uses(self, salt: int = 0) -> FutureUses:
        """For an offline oracle (Belady): when is a block next part of an arriving prompt?

        Uses each request's nominal `arrival_s`; closed-loop turns arrive when the simulation
        says, so for them this is the trace's estimate, the best an oracle given the trace can
        know. `salt`: the run's compression (under auto, chosen per request, the oracle sees
        none). A request's full prompt blocks lead its chain (a block's hash covers only the
        tokens up to its end), so their keys are the chain's first ones."""
        offsets, ids = self.block_ids()
        tokens = np.concatenate(([0], np.cumsum(self.seg_tokens, dtype=np.int64)))
        counts = (tokens[self.seg_offsets[1:]] - tokens[self.seg_offsets[:-1]]) // self.block_size
        row = np.repeat(np.arange(self.n), np.diff(offsets))
        first = (np.arange(ids.size) - offsets[row]) < counts[row]
        return FutureUses(self._salted(ids[first], salt), np.repeat(self.arrival_s, counts))

    def next_turns(self) -> np.ndarray:
        """Per row, the row of the closed-loop turn that follows it, or -1. A closed-loop turn
        whose earlier turn is not in this trace (a window's slice) is replayed at its time."""
        prev = previous_turns(self.session_id, self.turn, self.closed_loop)
        self.closed_loop &= prev >= 0
        follows = np.full(self.n, -1, dtype=np.int64)
        linked = np.flatnonzero(prev >= 0)
        follows[prev[linked]] = linked
        return follows
