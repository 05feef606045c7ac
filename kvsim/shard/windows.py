"""Where a sharded run cuts its trace: N consecutive windows of about equal request counts.

Windows hold about as many requests each (not equal spans of time), so shards take about as
long to simulate: a day of traffic is heavy in its busy hours. The first window opens at minus
infinity and the last closes at infinity, so every request falls in exactly one. Boundaries are
arrival times of the trace (nominal ones for closed-loop turns), strictly increasing.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from kvsim.engine.window import Window
from kvsim.errors import ConfigError

#: the most shards a run may ask for (a window per core of a large Ray cluster, and then some)
MAX_SHARDS = 4096
#: timed seconds before (and after) each window unless --warmup says otherwise
WARMUP_S = 60.0


def check_sharding(shards: object, warmup_s: object) -> None:
    """`--shards` is a positive integer, `--warmup` a finite number of seconds >= 0."""
    if not isinstance(shards, int) or isinstance(shards, bool) or not 1 <= shards <= MAX_SHARDS:
        raise ConfigError(f"--shards: expected an integer from 1 to {MAX_SHARDS}, got {shards!r}")
    if (
        not isinstance(warmup_s, int | float)
        or isinstance(warmup_s, bool)
        or not math.isfinite(warmup_s)
        or warmup_s < 0
    ):
        raise ConfigError(f"--warmup: expected seconds >= 0, got {warmup_s!r}")


def windows(arrival_s: np.ndarray, shards: int, warmup_s: float, trace: str) -> list[Window]:
    """`shards` windows over these arrival times (ConfigError when the trace is too short)."""
    if shards == 1:
        return [Window(-math.inf, math.inf, warmup_s)]
    times = np.sort(np.asarray(arrival_s, dtype=np.float64))
    distinct = np.unique(times).size
    if shards > distinct:
        raise ConfigError(
            f"--shards {shards}: the trace {trace} has {times.size:,} requests at "
            f"{distinct:,} distinct arrival times; give at most {distinct:,} shards"
        )
    cuts = [float(times[(k * times.size) // shards]) for k in range(1, shards)]
    for k in range(1, len(cuts)):  # many requests at one instant: move the cut past them
        if cuts[k] <= cuts[k - 1]:
            later = times[times > cuts[k - 1]]
            if not later.size:
                raise ConfigError(
                    f"--shards {shards}: the trace {trace} has too few distinct arrival times "
                    f"for {shards} windows; give fewer shards"
                )
            cuts[k] = float(later[0])
    edges: Sequence[float] = [-math.inf, *cuts, math.inf]
    return [Window(edges[k], edges[k + 1], warmup_s) for k in range(shards)]
