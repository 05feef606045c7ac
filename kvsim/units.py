"""Parse human sizes ("80GiB", "1.5TB") and rates ("3.35TB/s") into plain numbers.

Every parser refuses NaN, infinity and negative values with a one-line ConfigError, so a bad
number in a profile or on the command line never reaches the simulator.
"""

import math
import re

from kvsim.errors import ConfigError

_UNITS = {
    "": 1,
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "pb": 10**15,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
    "pib": 2**50,
}
_PATTERN = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([A-Za-z]*)\s*$")


def is_finite_number(value: object) -> bool:
    """A real number (not a bool) that float64 holds: no NaN, no infinity, and no integer too
    long to convert (``math.isfinite(10**400)`` raises OverflowError instead of answering)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    if isinstance(value, int):
        return abs(value) < 1e300
    return math.isfinite(value)


def parse_size(
    value: str | int | float, field: str = "size", *, unit_required: bool = False
) -> int:
    """Bytes from an int or a string with a decimal (GB) or binary (GiB) unit.

    With ``unit_required`` a string must name its unit ("1000GB", or "1000B" for bytes): a bare
    "1000" is refused, because a user who types it almost always means more than 1000 bytes.
    """
    if isinstance(value, bool):
        raise ConfigError(f"{field}: expected a size such as '80GiB', got {value!r}")
    if isinstance(value, int | float):
        if isinstance(value, int) and abs(value) > 2**63:
            raise ConfigError(f"{field}: expected a finite size, got {value!r}")
        number, unit = float(value), ""
    else:
        match = _PATTERN.match(str(value))
        if not match or match.group(2).lower() not in _UNITS:
            raise ConfigError(f"{field}: expected a size such as '80GiB' or '1.5TB', got {value!r}")
        number, unit = float(match.group(1)), match.group(2).lower()
        if unit_required and not unit:
            raise ConfigError(
                f"{field}: {value!r} has no unit; write one, e.g. '{match.group(1)}GB' or "
                f"'{match.group(1)}GiB' ('{match.group(1)}B' for bytes)"
            )
    if not math.isfinite(number * _UNITS[unit]):
        raise ConfigError(f"{field}: expected a finite size, got {value!r}")
    if number < 0:
        raise ConfigError(f"{field}: size must not be negative, got {value!r}")
    return round(number * _UNITS[unit])


def parse_rate(value: str | int | float, field: str = "bandwidth") -> float:
    """Bytes per second from a number or a string such as '3.35TB/s' or '25GiB/s'."""
    if isinstance(value, float):
        if not math.isfinite(value) or value < 0:
            raise ConfigError(f"{field}: expected a finite, non-negative rate, got {value!r}")
        return value
    text = value if isinstance(value, int) else str(value).strip().removesuffix("/s")
    return float(parse_size(text, field))


def format_bytes(n: float) -> str:
    """Binary units for people: 327680 -> '320.0 KiB'."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if abs(n) < 1024 or unit == "PiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} PiB"
