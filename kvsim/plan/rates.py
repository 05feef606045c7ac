"""Offered load for a plan: `--rates 1x,2x` (multiples of the trace's rate) or `5/s` (requests/s).

A multiple is `--rate-scale` as `kvsim run` takes it. A rate in requests per second becomes a
rate scale against the trace's own mean arrival rate (its requests, less one, over the span of
their arrival times, as loaded with the plan's `--max-requests`), so both forms name the same
runs. A bare number is refused: "2" could mean either, and the two differ by the trace's rate.
"""

from __future__ import annotations

import itertools
import math
import re
from dataclasses import dataclass

from kvsim.errors import ConfigError
from kvsim.traces.schema import Trace

_RATE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*(x|/s)\s*$")


@dataclass(frozen=True)
class Rate:
    """One offered load: as written, and as a rate scale and requests/s on the plan's trace."""

    label: str
    rate_scale: float
    requests_per_s: float


@dataclass(frozen=True)
class RateSpec:
    """A rate as parsed, before the trace's own rate is known."""

    label: str
    value: float
    per_s: bool  # True: requests/s; False: a multiple of the trace's rate


def parse_rates(text: str) -> list[RateSpec]:
    """`1x,2.5x,8/s` -> specs, in the order given; one ConfigError line on anything else."""
    specs: list[RateSpec] = []
    for part in text.split(","):
        match = _RATE.match(part)
        if not match:
            raise ConfigError(
                f"--rates: {part.strip()!r} is not a rate; write a multiple of the trace's rate "
                "such as 2x, or requests per second such as 5/s (comma-separated: 1x,2x,4x)"
            )
        value = float(match.group(1))
        if not (math.isfinite(value) and value > 0):
            raise ConfigError(f"--rates: {part.strip()!r}: expected a positive rate")
        label = f"{match.group(1)}{match.group(2)}"
        if any(s.label == label for s in specs):
            raise ConfigError(f"--rates: {label} is given twice")
        specs.append(RateSpec(label, value, match.group(2) == "/s"))
    return specs


def trace_rate_per_s(trace: Trace) -> float:
    """The trace's mean arrival rate in requests/s: (requests - 1) / span of arrival times."""
    arrivals = trace.table.column("arrival_s").to_numpy()
    span = float(arrivals.max() - arrivals.min()) if len(arrivals) else 0.0
    if len(arrivals) < 2 or span <= 0:
        raise ConfigError(
            f"trace {trace.name!r}: its requests all arrive at once, so it has no arrival rate "
            "to scale; give rates as multiples (2x) or use a trace with arrival times"
        )
    return (len(arrivals) - 1) / span


def resolve_rates(specs: list[RateSpec], base_per_s: float) -> list[Rate]:
    """Rate scale and requests/s of each spec on a trace of `base_per_s`, lowest load first."""
    rates = [
        Rate(s.label, s.value / base_per_s, s.value)
        if s.per_s
        else Rate(s.label, s.value, s.value * base_per_s)
        for s in specs
    ]
    rates.sort(key=lambda r: r.rate_scale)
    for a, b in itertools.pairwise(rates):
        if math.isclose(a.rate_scale, b.rate_scale, rel_tol=1e-9):
            raise ConfigError(f"--rates: {a.label} and {b.label} are the same rate on this trace")
    return rates
