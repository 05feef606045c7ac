"""A prompt's prefill time from the price of one iteration, chunk by chunk.

Both cost models price single iterations; the engine also asks what a whole prefill would cost
(to choose between loading a cached prefix and recomputing it), so this base class derives that
from `iteration_time_s` once for both.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


class ChunkedPrefill:
    """`prefill_time_s` for any cost model that prices one iteration."""

    _alone: dict[tuple[int, int, int | None], float] | None = None  # prefill_time_s memo

    def iteration_time_s(
        self, prefill: list[tuple[int, int]], decode_contexts: Sequence[float] | np.ndarray
    ) -> float:
        raise NotImplementedError

    def prefill_time_s(
        self,
        tokens: int,
        context: int = 0,
        chunk: int | None = None,
        decode_contexts: np.ndarray | None = None,
    ) -> float:
        """Seconds to prefill `tokens` after `context` in chunks of at most `chunk`: alone, or
        beside a batch of decoding sequences (`decode_contexts`) that share every iteration's
        token budget and time. Alone it is a pure function of its arguments, and a queued
        request's load-or-recompute choice asks it the same questions at every look: memoised."""
        if decode_contexts is None:
            memo = self._alone
            if memo is None or len(memo) > 1 << 16:
                memo = self._alone = {}
            key = (tokens, context, chunk)
            seconds = memo.get(key)
            if seconds is None:
                seconds = memo[key] = self._chunked_s(tokens, context, chunk, np.zeros(0))
            return seconds
        return self._chunked_s(tokens, context, chunk, decode_contexts)

    def _chunked_s(self, tokens: int, context: int, chunk: int | None, decode: np.ndarray) -> float:
        chunk = max((chunk or tokens) - len(decode), 1)
        total = 0.0
        done = 0
        while done < tokens:
            n = min(chunk, tokens - done)
            total += self.iteration_time_s([(n, context + done)], decode)
            done += n
        return total
