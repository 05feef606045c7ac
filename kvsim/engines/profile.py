"""One serving engine's profile, read and checked from its TOML file."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

from kvsim.errors import ConfigError
from kvsim.textio import key_name, parse_toml, read_utf8

#: The engine a run uses when none is named: current vLLM (V1).
DEFAULT_ENGINE = "vllm"

#: What a profile may set: (field, kind). Kinds: text, bool, seconds, count, choice.
_SCHEMA: dict[str, str] = {
    "name": "text",
    "version": "text",
    "current": "bool",
    "description": "text",
    "kernels": "name",
    "cuda_graph_max_tokens": "count0",
    "eager_launch_s": "seconds",
    "iteration_overhead_s": "seconds",
    "overlap_scheduling": "bool",
    "request_overhead_s": "seconds",
    "allreduce": "names",
}
#: The scheduler defaults an engine ships (EngineConfig fields left unset take these).
_DEFAULTS: dict[str, str] = {
    "max_num_seqs": "count",
    "max_num_batched_tokens": "count",
    "chunked_prefill": "bool",
    "kv_reservation": "reservation",
    "num_scheduler_steps": "count",
    "mixed_batches": "bool",
}
_RESERVATIONS = ("prompt", "full")
_NAME = re.compile(r"^[a-z0-9][a-z0-9_.-]*$")
_SOURCE_PREFIX = re.compile(r"^(source:|assumption:|measured:)")
#: A per-iteration or per-request CPU cost above this is a unit slip (ms typed as s).
MAX_OVERHEAD_S = 1.0


@dataclass(frozen=True)
class EngineProfile:
    """A serving engine at one version, as the cost model and scheduler see it.

    - ``kernels``: the hardware profile's ``[engines.NAME]`` kernel terms measured under this
      engine (empty: the profile's ``[efficiency]``, fitted to older, eager kernels).
    - ``cuda_graph_max_tokens``: iterations of at most this many tokens replay a captured CUDA
      graph, so no kernel waits for the CPU to launch it; larger ones (and every one, at 0) run
      eagerly and take at least ``eager_launch_s`` per kernel.
    - ``iteration_overhead_s``: CPU time per iteration (schedule, prepare inputs, sample);
      with ``overlap_scheduling`` it runs while the GPU computes the previous iteration, so an
      iteration takes the longer of the two, else their sum.
    - ``request_overhead_s``: the front end's time per request (API server, tokenisation).
    - ``allreduce``: the hardware profile's all-reduce algorithms this engine uses (empty: any).
    - ``defaults``: max_num_seqs, max_num_batched_tokens, chunked_prefill, kv_reservation,
      num_scheduler_steps and mixed_batches as the engine ships them.
    """

    name: str
    version: str
    description: str
    kernels: str
    cuda_graph_max_tokens: int
    eager_launch_s: float
    iteration_overhead_s: float
    overlap_scheduling: bool
    request_overhead_s: float
    allreduce: tuple[str, ...]
    defaults: dict[str, Any]
    sources: dict[str, str] = field(default_factory=dict)
    current: bool = False
    source_path: Path | None = None

    @property
    def full_name(self) -> str:
        return f"{self.name}@{self.version}"

    def graphed(self, tokens: int) -> bool:
        """Whether an iteration of ``tokens`` tokens replays a CUDA graph."""
        return tokens <= self.cuda_graph_max_tokens


def parse_engine_profile(path: Path) -> EngineProfile:
    """The profile in ``path``, or one ConfigError line naming the file and the field."""
    where = str(path)

    def fail(field_name: str, message: str) -> NoReturn:
        raise ConfigError(f"{where}: {field_name}: {message}")

    data = parse_toml(read_utf8(path, where, ConfigError), where, ConfigError)
    allowed = {*_SCHEMA, "defaults", "sources"}
    for key in data:
        if key not in allowed:
            fail(key_name(key), f"unknown field; expected one of {sorted(allowed)}")
    values = {k: _value(data, k, kind, k, fail) for k, kind in _SCHEMA.items() if k != "current"}
    raw_defaults = data.get("defaults")
    if not isinstance(raw_defaults, dict):
        fail("defaults", "expected a [defaults] table")
    for key in raw_defaults:
        if key not in _DEFAULTS:
            expected = f"unknown setting; expected one of {sorted(_DEFAULTS)}"
            fail(f"defaults.{key_name(key)}", expected)
    defaults = {
        k: _value(raw_defaults, k, kind, f"defaults.{k}", fail) for k, kind in _DEFAULTS.items()
    }
    sources = data.get("sources")
    if not isinstance(sources, dict):
        fail("sources", "expected a [sources] table: where each number comes from")
    numeric = [k for k, kind in _SCHEMA.items() if kind in ("seconds", "count0")]
    numeric += [f"defaults.{k}" for k in _DEFAULTS]
    for key in numeric:
        text = sources.get(key)
        if not isinstance(text, str) or not _SOURCE_PREFIX.match(text):
            expected = "expected text starting with 'source:', 'measured:' or 'assumption:'"
            fail(f"sources.{key}", expected)
    current = data.get("current", False)
    if not isinstance(current, bool):
        fail("current", f"expected true or false, got {current!r:.40}")
    return EngineProfile(
        **values,
        defaults=defaults,
        sources={str(k): str(v) for k, v in sources.items()},
        current=current,
        source_path=path,
    )


def _value(data: dict[str, Any], key: str, kind: str, where: str, fail: Any) -> Any:
    if key not in data:
        fail(where, "missing required field")
    got = data[key]
    shown = f"{got!r:.40}"
    if kind == "text":
        if not isinstance(got, str) or not got.strip():
            fail(where, f"expected a non-empty string, got {shown}")
        return got
    if kind == "name":
        if not isinstance(got, str) or (got and not _NAME.match(got)):
            fail(where, f"expected a table name such as 'vllm' (or '' for none), got {shown}")
        return got
    if kind == "names":
        if not isinstance(got, list) or not all(isinstance(n, str) and _NAME.match(n) for n in got):
            fail(where, f"expected a list of names such as ['custom', 'nccl'], got {shown}")
        return tuple(got)
    if kind == "bool":
        if type(got) is not bool:
            fail(where, f"expected true or false, got {shown}")
        return got
    if kind == "seconds":
        if type(got) not in (int, float) or not 0 <= got <= MAX_OVERHEAD_S:
            fail(where, f"expected seconds in [0, {MAX_OVERHEAD_S:g}], got {shown}")
        return float(got)
    if kind in ("count", "count0"):
        low = 0 if kind == "count0" else 1
        if type(got) is not int or not low <= got < 2**31:
            fail(where, f"expected an integer >= {low}, got {shown}")
        return got
    if got not in _RESERVATIONS:  # reservation
        fail(where, f"expected one of {', '.join(_RESERVATIONS)}, got {shown}")
    return got
