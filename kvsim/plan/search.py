"""The smallest replica count that meets the SLOs: gallop from a hint, then bisect.

Goodput grows with replicas, so "meets the SLOs at n replicas" is taken as monotone in n and
the answer is found in O(log n) runs instead of n: probe the hint (and the count below it, so a
good hint settles in one round of two runs), double the step away from it until the answer is
bracketed, then bisect. The search is driven in rounds (`probes`, then `update` with their
verdicts), so a caller can batch the probes of many searches into one executor call.

Whatever the runs say, a finished search's answer was observed to pass and the count below it
was observed to fail (or the answer is 1): the search trusts only what it ran, so a slightly
non-monotone response (a router's luck at one count) cannot make it report an untested count.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class ReplicaSearch:
    """One search over replica counts in [1, `cap`], starting at `hint`."""

    hint: int = 1
    cap: int = 64
    tested: dict[int, bool] = field(default_factory=dict)  # count -> met the SLOs
    _step: int = 1

    def __post_init__(self) -> None:
        if self.cap < 1:
            raise ValueError(f"cap must be at least 1, got {self.cap}")
        self.hint = min(max(self.hint, 1), self.cap)

    @property
    def hi(self) -> int | None:
        """The smallest count seen to pass, if any."""
        passed = [n for n, ok in self.tested.items() if ok]
        return min(passed) if passed else None

    @property
    def lo(self) -> int:
        """The largest count seen to fail below `hi` (0: none)."""
        hi = self.hi
        failed = [n for n, ok in self.tested.items() if not ok and (hi is None or n < hi)]
        return max(failed, default=0)

    @property
    def done(self) -> bool:
        hi = self.hi
        return (hi is not None and hi == self.lo + 1) or (hi is None and self.lo >= self.cap)

    @property
    def answer(self) -> int | None:
        """The smallest passing count, or None when even `cap` fails."""
        if not self.done:
            raise RuntimeError("the search has not finished")
        return self.hi

    def probes(self) -> list[int]:
        """The counts to run next (none once done)."""
        if self.done:
            return []
        hi, lo = self.hi, self.lo
        if not self.tested:
            return [self.hint, self.hint - 1] if self.hint > 1 else [self.hint]
        if hi is None:  # only failures: gallop up
            return [min(self.cap, lo + self._step)]
        if lo == 0:  # only passes: gallop down
            return [max(1, hi - self._step)]
        return [(lo + hi) // 2]

    def update(self, verdicts: dict[int, bool]) -> None:
        """Record one round's verdicts (count -> met the SLOs)."""
        galloping = self.hi is None or self.lo == 0
        self.tested.update(verdicts)
        if galloping:
            self._step *= 2
