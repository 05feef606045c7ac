"""A rough estimate of a run's wall time and peak memory, made from its resolved config alone.

What cannot be bounded gets an estimate before a long run (issue 25): `kvsim run` prints a
warning when the estimate passes `WARN_WALL_S` or half the machine's memory, and refuses when the
memory estimate passes the memory the machine has available, unless `--yes`. Nothing here reads
the trace: a run's length is its `max_requests` (or the trace's default slice); the whole of a
named trace without a default slice (at most tens of thousands of requests) counts as unknown.

It is an order of magnitude, not a prediction. Every figure below was measured on a shared
2-core machine on particular traces; a trace of much longer prompts, another router or policy,
or a busier machine can be several times off either way. Its use is to tell an hour from a
minute and 100 GiB from 1 GiB before the run starts.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from kvsim.engine.tiers import replica_share
from kvsim.errors import ConfigError
from kvsim.hardware.tier_kinds import SHARED_TIER_NAMES
from kvsim.units import format_bytes

if TYPE_CHECKING:
    from collections.abc import Callable

    from kvsim.resolve import ResolvedRun

# -- time -------------------------------------------------------------------------------------
#: Wall seconds per request, HBM only: 1 M lmsys-shaped requests on 64 replicas took 386 s
#: (README "Performance" table; CHANGELOG "Issues 9 and 10").
WALL_S_PER_REQUEST = 386 / 1_000_000
#: With any tier below HBM the same run took 702 s (same sources): 1.8x.
LOWER_TIER_FACTOR = 702 / 386
#: Policies far slower than LRU (README "Reliability notes", "Slow policies"): bayes-reuse about
#: 8x LRU's wall time, head-granular ema-head about 9x.
SLOW_POLICIES = {"bayes-reuse": 8.0, "ema-head": 9.0}
#: The per-request figure holds up to this many replicas (README: the whole trace on 1 / 4 / 16
#: / 64 replicas took 36 / 39 / 47 / 51 s: replicas below it cost little).
MEASURED_REPLICAS = 64
#: Beyond that, each further replica adds this per request: llm-d on 1,024 replicas took 11.1 s
#: for 200 mooncake-conversation requests and 31.7 s for 800 (measured for issue 25 with
#: `kvsim run --trace mooncake-conversation --replicas 1024 --router llm-d`). Round-robin costs
#: less, so this is the upper end.
WALL_S_PER_REQUEST_REPLICA = (31.7 - 11.1) / 600 / 1024
#: Building a replica: 1 vs 8,192 round-robin replicas on 200 mooncake-conversation requests
#: took 4.2 vs 17.8 s (measured for issue 25, as above).
WALL_S_PER_REPLICA = (17.8 - 4.2) / 8191

# -- memory -----------------------------------------------------------------------------------
#: Python, kvsim and a default slice: 251-258 MiB peak RSS (README "Performance" table).
BASE_BYTES = 256 * 2**20
#: Per request, HBM only: 1 M lmsys-shaped requests on 64 replicas peaked at 2.9 GiB (README
#: "Performance" table): (2.9 GiB - the base) / 1 M.
BYTES_PER_REQUEST = (2.9 * 2**30 - BASE_BYTES) / 1_000_000
#: A block held in a lower tier costs about 300 bytes of Python (README "Reliability notes",
#: "How big runs grow": 64 replicas' DRAM holds up to 7.6 M blocks, peak RSS 2,121 MiB).
BYTES_PER_LOWER_BLOCK = 300
#: A replica's own objects: 1 vs 8,192 replicas peaked at 232 vs 446 MiB (measured for issue
#: 25, as above). HBM blocks cost nothing until used (2 M --num-gpu-blocks: no change).
BYTES_PER_REPLICA = (446 - 232) * 2**20 / 8191
#: Lower-tier blocks a request can write, at most its prompt's: mooncake-conversation's mean
#: prompt, 144.8 M input tokens over 12,031 requests (README "Performance" table), the longest
#: of the shipped traces' means.
PROMPT_TOKENS_PER_REQUEST = 144_800_000 / 12_031

# -- when to speak ----------------------------------------------------------------------------
#: Warn before a run estimated longer than this.
WARN_WALL_S = 600.0
#: Warn before a run estimated to need more than this share of the machine's memory.
WARN_MEMORY_SHARE = 0.5


@dataclass(frozen=True)
class Estimate:
    """A run's estimated wall time and peak memory, with what they were made from."""

    wall_s: float
    memory_bytes: float
    requests: int | None  # None: the whole named trace, length unknown here
    replicas: int
    lower_blocks: int  # lower-tier blocks the run can hold at most

    def text(self) -> str:
        """'about 40 min and 12.0 GiB (1,000,000 requests, 64 replicas, 7.6 M lower-tier
        blocks at most)'."""
        what = [f"{self.requests:,} requests" if self.requests else "trace length unknown"]
        what.append(f"{self.replicas:,} replica{'s' if self.replicas != 1 else ''}")
        if self.lower_blocks:
            what.append(f"{_count(self.lower_blocks)} lower-tier blocks at most")
        return (
            f"about {_duration(self.wall_s)} and {format_bytes(self.memory_bytes)} "
            f"({', '.join(what)}; a rough order of magnitude)"
        )


def estimate(resolved: ResolvedRun) -> Estimate:
    """The estimate for `resolved` (arithmetic on its config; nothing is read or built)."""
    engine = resolved.engine
    requests = resolved.config.max_requests
    n = requests or 0
    replicas = engine.replica_count
    lower = _lower_blocks(resolved, n)
    factor = LOWER_TIER_FACTOR if any(
        t.enabled and t.name != "hbm" for t in engine.profile.tiers
    ) else 1.0  # fmt: skip
    factor *= max((SLOW_POLICIES.get(p, 1.0) for p in engine.tiers.policies.values()), default=1)
    wall = n * WALL_S_PER_REQUEST * factor + replicas * WALL_S_PER_REPLICA
    wall += n * max(0, replicas - MEASURED_REPLICAS) * WALL_S_PER_REQUEST_REPLICA
    memory = BASE_BYTES + n * BYTES_PER_REQUEST + replicas * BYTES_PER_REPLICA
    memory += lower * BYTES_PER_LOWER_BLOCK
    return Estimate(wall, memory, requests, replicas, lower)


def _lower_blocks(resolved: ResolvedRun, requests: int) -> int:
    """Blocks the enabled lower tiers can hold (as the engine sizes them), at most the blocks
    `requests` prompts of the longest shipped mean could write."""
    engine = resolved.engine
    profile, tp, replicas = engine.profile, engine.config.tp, engine.replica_count
    capacity = 0
    for tier in profile.tiers:
        if tier.name == "hbm" or not tier.enabled:
            continue
        share = replica_share(profile, tier, tp)
        if tier.name in SHARED_TIER_NAMES:
            capacity += int(tier.capacity_bytes * min(replicas * share, 1.0) // engine.block_bytes)
        else:
            capacity += replicas * int(tier.capacity_bytes * share // engine.block_bytes)
    per_request = math.ceil(PROMPT_TOKENS_PER_REQUEST / engine.config.block_size)
    return min(capacity, requests * per_request)


def machine_memory() -> tuple[int | None, int | None]:
    """(total, available) bytes of this machine's memory; None where it cannot be read."""
    try:
        fields = {}
        for line in Path("/proc/meminfo").read_text().splitlines():
            key, _, value = line.partition(":")
            parts = value.split()
            if parts and parts[0].isdigit():
                fields[key] = int(parts[0]) * 1024
        if "MemTotal" in fields:
            return fields["MemTotal"], fields.get("MemAvailable")
    except OSError:
        pass
    try:
        page = os.sysconf("SC_PAGE_SIZE")
        return os.sysconf("SC_PHYS_PAGES") * page, os.sysconf("SC_AVPHYS_PAGES") * page
    except (AttributeError, ValueError, OSError):
        return None, None


def check_estimate(
    resolved: ResolvedRun,
    yes: bool,
    warn: Callable[[str], None],
    memory: tuple[int | None, int | None] | None = None,
) -> Estimate:
    """Estimate `resolved`; `warn` one line when it is long or large, and raise ConfigError when
    its memory passes what the machine has available, unless `yes`. `memory` is (total,
    available) bytes (default: this machine's)."""
    est = estimate(resolved)
    total, available = memory if memory is not None else machine_memory()
    if available is not None and est.memory_bytes > available and not yes:
        raise ConfigError(
            f"this run is estimated at {est.text()}: more memory than the "
            f"{format_bytes(available)} this machine has available; shorten it "
            "(--max-requests, --replicas, smaller lower tiers) or give --yes to run it anyway"
        )
    big = total is not None and est.memory_bytes > WARN_MEMORY_SHARE * total
    if est.wall_s > WARN_WALL_S or big or (available is not None and est.memory_bytes > available):
        warn(f"this run is estimated at {est.text()}")
    return est


def _duration(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 90 * 60:
        return f"{seconds / 60:.0f} min"
    if seconds < 48 * 3600:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:,.0f} days"


def _count(n: int) -> str:
    return f"{n / 1e6:.1f} M" if n >= 1_000_000 else f"{n:,}"
