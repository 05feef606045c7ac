"""Write the small TOML documents kvsim produces (resolved configs, profiles).

The standard library reads TOML but cannot write it; our documents are tables of scalars and
lists of scalars, which this covers exactly.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping


def _value(v: object) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if math.isnan(v) or math.isinf(v):
            return "nan" if math.isnan(v) else ("inf" if v > 0 else "-inf")
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v, ensure_ascii=False)
    if isinstance(v, list | tuple):
        return "[" + ", ".join(_value(x) for x in v) + "]"
    raise TypeError(f"cannot write {type(v).__name__} to TOML")


def dumps(doc: Mapping[str, object]) -> str:
    """TOML text for a mapping whose values are scalars, lists or nested mappings."""
    lines: list[str] = []

    def table(prefix: str, mapping: Mapping[str, object]) -> None:
        scalars = [
            (k, v) for k, v in mapping.items() if not isinstance(v, Mapping) and v is not None
        ]
        nested = [(k, v) for k, v in mapping.items() if isinstance(v, Mapping)]
        if prefix and scalars:
            lines.append(f"[{prefix}]")
        for k, v in scalars:
            lines.append(f"{_key(k)} = {_value(v)}")
        if scalars:
            lines.append("")
        for k, v in nested:
            table(f"{prefix}.{_key(k)}" if prefix else _key(k), v)

    table("", doc)
    return "\n".join(lines).rstrip() + "\n"


def _key(k: str) -> str:
    return k if k.replace("_", "").replace("-", "").isalnum() else json.dumps(k)
