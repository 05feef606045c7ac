"""Parse latencies such as "3us", "140ns", "0.1ms" or "2s" into seconds.

Lives here rather than in kvsim.units because only hardware profiles carry latencies so far.
"""

import math
import re

from kvsim.errors import ConfigError

_SECONDS_PER_UNIT = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0}
_PATTERN = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*(ns|us|µs|ms|s)\s*$")


def parse_duration(value: str | int | float, field: str = "duration") -> float:
    """Seconds from a number of seconds or a string with a unit (ns, us, µs, ms, s)."""
    if isinstance(value, bool):
        raise ConfigError(f"{field}: expected a duration such as '3us', got {value!r}")
    if isinstance(value, int | float):
        if isinstance(value, int) and abs(value) > 2**63:
            raise ConfigError(f"{field}: expected a finite duration, got {value!r}")
        seconds = float(value)
    else:
        match = _PATTERN.match(str(value))
        if not match:
            raise ConfigError(
                f"{field}: expected a duration such as '3us' or '0.1ms', got {value!r}"
            )
        seconds = float(match.group(1)) * _SECONDS_PER_UNIT[match.group(2)]
    if not math.isfinite(seconds):
        raise ConfigError(f"{field}: expected a finite duration, got {value!r}")
    if seconds < 0:
        raise ConfigError(f"{field}: a duration must not be negative, got {value!r}")
    return seconds
