"""The Python API behind `kvsim run`: resolve a config, simulate, write the results.

Everything the CLI does, a notebook can call:

    from kvsim.run import RunConfig, run, write_outputs
    outcome = run(RunConfig(trace="sharegpt", policy="lru"))
    outcome.summary["ttft_p50_s"]
    write_outputs(outcome, "runs/lru")

Results folders. `write_outputs` writes into a temporary sibling (``<name>.partial-*``) and renames
it into place only when every file is written, with the ``COMPLETE`` marker last; a folder
without ``COMPLETE`` is never a finished run (`is_complete`). A non-empty target is refused
unless ``overwrite`` is given (and even then only when it holds nothing but kvsim's own result
files). The final rename succeeds only onto a missing or empty folder, so of two runs that
finish into the same folder at once the second fails instead of replacing the first; its
results are kept beside, under ``<name>-2``. A failed write leaves the old folder untouched.

JSON. NaN and infinities (a percentile of no requests, a cost per token of no tokens) are
written as ``null``: `summary_json` is the one writer for summary.json and ``--json``.

Diagnostics in the summary: ``trace_warnings`` (the trace loader's plausibility warnings) and
``run_warnings``:

- requests refused because each needs more KV blocks than a replica has (when nothing
  completes at all this is the reason, and `kvsim run` exits 2: see `nothing_completed`);
- overload: a replica was busy at least ``OVERLOAD_BUSY`` of the time and its TTFT p50 exceeds
  ``OVERLOAD_TTFT_FACTOR`` × its median prefill time (first token − first scheduled), i.e.
  requests mostly waited in the queue: the offered load is more than the replicas can serve.
  A lightly loaded replica has a TTFT p50 within a few prefill times even when decode keeps it
  busy all the time, so the ratio, not the busy fraction alone, is the signal;
- a setting for a tier the run does not enable (`--tier nvme=1TB`, `--policy nvme=arc` without
  nvme in `--tiers`), which does nothing.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import json
import math
import os
import secrets
import shutil
import tomllib
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from kvsim import __version__, tomlwrite
from kvsim.compression import parse_compression
from kvsim.engine.config import EngineConfig
from kvsim.engine.settings import resolve_settings
from kvsim.engine.simulation import ProgressFn, RunResult, simulate
from kvsim.engine.tiers import SHARED_TIERS, replica_share, resolve_profile
from kvsim.errors import ConfigError
from kvsim.hardware import load_profile
from kvsim.metrics import Slo, summarize
from kvsim.models import load_model
from kvsim.models.dtypes import weight_dtype_bytes
from kvsim.policies import make_policy
from kvsim.textio import read_utf8
from kvsim.traces import Trace, load_trace
from kvsim.traces.registry import run_requests
from kvsim.units import format_bytes

#: The file written last into a results folder: without it the folder is not a finished run.
COMPLETE_MARKER = "COMPLETE"
#: Every file `write_outputs` writes; ``overwrite`` replaces only folders holding nothing else.
RESULT_FILES = frozenset(
    {"requests.parquet", "timeline.parquet", "config.toml", "summary.json", COMPLETE_MARKER}
)
#: Overload rule (see the module docstring).
OVERLOAD_BUSY = 0.95
OVERLOAD_TTFT_FACTOR = 10.0


@dataclass(frozen=True)
class RunConfig:
    """A whole run: workload, model, hardware and engine settings. Defaults run anywhere.

    ``weight_dtype`` is the weights' dtype; None means the model's native one (the catalog's
    ``weight_dtype``: fp8 for DeepSeek-V3, bf16 for the others). `run` resolves it and sets
    ``engine.weight_dtype``; an ``engine.weight_dtype`` other than bf16 (EngineConfig's default)
    counts as a choice too, so code that set it there keeps its result.
    """

    trace: str = "sharegpt"
    max_requests: int | None = None
    rate: float | None = None
    rate_scale: float = 1.0
    arrival: str | None = None
    cv: float | None = None
    trace_format: str | None = None
    tokenizer: str | None = None
    skip_bad_rows: bool = False
    model: str = "llama-3.1-8b"
    weight_dtype: str | None = None
    hardware: str = "h100-sxm"
    engine: EngineConfig = field(default_factory=EngineConfig)
    slo_ttft_s: float | None = None
    slo_tpot_s: float | None = None

    def as_dict(self) -> dict[str, object]:
        return {
            "trace": {
                "name": self.trace,
                "max_requests": self.max_requests,
                "rate": self.rate,
                "rate_scale": self.rate_scale,
                "arrival": self.arrival,
                "cv": self.cv,
                "format": self.trace_format,
                "tokenizer": self.tokenizer,
                "skip_bad_rows": self.skip_bad_rows,
            },
            "model": {"name": self.model, "weight_dtype": self.weight_dtype},
            "hardware": {"profile": self.hardware},
            "engine": self.engine.as_dict(),
            "slo": {"ttft_s": self.slo_ttft_s, "tpot_s": self.slo_tpot_s},
        }

    @classmethod
    def from_toml(cls, path: str | Path) -> RunConfig:
        """Read a config written by a previous run (or by hand, with the same tables).

        Every table, key and value is checked here (a table is a table, a count an integer
        below 2^63, a rate a finite number, a name a string), so a wrong one is one ConfigError
        line naming the file and the key, never an AttributeError or TypeError later in the run.
        """
        text = read_utf8(Path(path), str(path), ConfigError)
        try:
            doc = tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"{path}: {' '.join(str(exc).split())}") from None
        except RecursionError:
            raise ConfigError(f"{path}: invalid TOML: nested too deeply to parse") from None
        except ValueError as exc:  # an integer of more than 4300 digits
            raise ConfigError(f"{path}: invalid TOML: {' '.join(str(exc).split())}") from None
        kinds = {"int": int, "float": float, "str": str, "bool": bool}
        schema: dict[str, dict[str, type]] = {
            "trace": {"name": str, "max_requests": int, "rate": float, "rate_scale": float,
                      "arrival": str, "cv": float, "format": str, "tokenizer": str,
                      "skip_bad_rows": bool},
            "model": {"name": str, "weight_dtype": str},
            "hardware": {"profile": str},
            "engine": {f.name: kinds[str(f.type).split("|")[0].strip()]
                       for f in dataclasses.fields(EngineConfig)},
            "slo": {"ttft_s": float, "tpot_s": float},
        }  # fmt: skip

        def key_name(key: str) -> str:  # a key with a newline must not break the line
            return key if key.isprintable() else repr(key)

        def value(kind: type, got: object, where: str) -> object:
            def bad(expected: str) -> ConfigError:
                return ConfigError(f"{path}: {where}: expected {expected}, got {got!r:.60}")

            if kind is bool and type(got) is not bool:
                raise bad("true or false")
            if kind is int and (type(got) is not int or not -(2**63) <= got < 2**63):
                raise bad("an integer below 2^63")
            if kind is float:
                if type(got) not in (int, float) or not -1e300 < got < 1e300:  # NaN fails too
                    raise bad("a finite number")
                return float(got)
            if kind is str and (not isinstance(got, str) or "\x00" in got):
                raise bad("a string (without NUL characters)")
            return got

        tables: dict[str, dict[str, Any]] = {}
        for name, got in doc.items():
            if name not in schema:
                raise ConfigError(
                    f"{path}: unknown table [{key_name(name)}]; expected {sorted(schema)}"
                )
            if not isinstance(got, dict):
                raise ConfigError(f"{path}: {name}: expected a [{name}] table, got {got!r:.60}")
            tables[name] = {}
            for key, item in got.items():
                if key not in schema[name]:
                    what = "unknown setting" if name == "engine" else "unknown key"
                    valid = ", ".join(schema[name])
                    raise ConfigError(f"{path}: {name}.{key_name(key)}: {what}; valid: {valid}")
                tables[name][key] = value(schema[name][key], item, f"{name}.{key}")
        trace, model, engine = (tables.get(k, {}) for k in ("trace", "model", "engine"))
        weight_dtype = model.get("weight_dtype", engine.get("weight_dtype"))
        if "weight_dtype" in engine and weight_dtype != engine["weight_dtype"]:
            raise ConfigError(
                f"{path}: model.weight_dtype {weight_dtype!r} disagrees with "
                f"engine.weight_dtype {engine['weight_dtype']!r}; give one"
            )
        try:
            return cls(
                trace=trace.get("name", cls.trace),
                max_requests=trace.get("max_requests"),
                rate=trace.get("rate"),
                rate_scale=trace.get("rate_scale", 1.0),
                arrival=trace.get("arrival"),
                cv=trace.get("cv"),
                trace_format=trace.get("format"),
                tokenizer=trace.get("tokenizer"),
                skip_bad_rows=trace.get("skip_bad_rows", False),
                model=model.get("name", cls.model),
                weight_dtype=weight_dtype,
                hardware=tables.get("hardware", {}).get("profile", cls.hardware),
                engine=EngineConfig(**engine),
                slo_ttft_s=tables.get("slo", {}).get("ttft_s"),
                slo_tpot_s=tables.get("slo", {}).get("tpot_s"),
            )
        except TypeError as exc:
            raise ConfigError(f"{path}: {exc}") from None


@dataclass
class RunOutcome:
    config: RunConfig  # as resolved: the weight dtype the run used is filled in
    result: RunResult
    summary: dict[str, object]


def check_config(config: RunConfig) -> None:
    """Refuse values the engine would take without complaint but cannot mean what was asked."""
    engine = config.engine
    seed = engine.seed
    if not isinstance(seed, int) or isinstance(seed, bool) or seed < 0:
        raise ConfigError(f"seed: expected a non-negative integer, got {seed!r}")
    if not engine.policy.strip():
        raise ConfigError(
            "policy: expected a policy name (e.g. lru) or one per tier (hbm=lru,dram=arc), got ''"
        )
    if config.weight_dtype is not None:
        weight_dtype_bytes(config.weight_dtype)  # unknown names fail here, listing the valid
    parse_compression(engine.compression)  # an unknown profile or key fails before any work
    settings = resolve_settings(engine)
    used = sorted(set(settings.policies.values()))
    for name, params in settings.policy_params.items():
        if name not in used:
            raise ConfigError(
                f"policy parameter {name}.{next(iter(params))}: policy {name!r} is not used in "
                f"this run (policies: {', '.join(used)})"
            )
        make_policy(name, params)  # types, names and finiteness of every value, before any work


def resolve_weight_dtype(config: RunConfig, native: str) -> str:
    """The weight dtype a run uses: the config's, else a non-default engine one, else `native`."""
    if config.weight_dtype is not None:
        return config.weight_dtype
    default = EngineConfig.__dataclass_fields__["weight_dtype"].default
    return config.engine.weight_dtype if config.engine.weight_dtype != default else native


def default_length(config: RunConfig) -> RunConfig:
    """`config` with ``max_requests`` set to its trace's default run length when it names none
    (a built-in trace too long to replay in seconds runs its first N requests; see
    `kvsim.traces.registry.TraceInfo.run_requests`)."""
    if config.max_requests is not None:
        return config
    return dataclasses.replace(config, max_requests=run_requests(config.trace))


def trace_options(config: RunConfig) -> dict[str, Any]:
    """`load_trace`'s keyword arguments for a config: two configs with equal options (and the
    same ``config.trace``) replay the same trace, so a sweep worker can load it once."""
    return {
        "max_requests": default_length(config).max_requests,
        "rate": config.rate,
        "rate_scale": config.rate_scale,
        "seed": config.engine.seed,
        "arrival": config.arrival,
        "cv": config.cv,
        "format": config.trace_format,
        "tokenizer": config.tokenizer,
        "skip_bad_rows": config.skip_bad_rows,
    }


def run(
    config: RunConfig, progress: ProgressFn | None = None, *, trace: Trace | None = None
) -> RunOutcome:
    """Load everything the config names, simulate, and summarise. Raises KvsimError on bad input.

    `trace`, when given, must be ``load_trace(config.trace, **trace_options(config))``, loaded
    earlier (kvsim.sweep reuses one per worker); otherwise it is loaded here.
    """
    check_config(config)
    config = default_length(config)
    slo = Slo(config.slo_ttft_s, config.slo_tpot_s)
    model = load_model(config.model)
    weight_dtype = resolve_weight_dtype(config, model.weight_dtype)
    # the resolved config records the compression's canonical label (defaults filled in)
    compression = parse_compression(config.engine.compression)
    config = dataclasses.replace(
        config,
        weight_dtype=weight_dtype,
        engine=dataclasses.replace(
            config.engine, weight_dtype=weight_dtype, compression=compression.label
        ),
    )
    profile = load_profile(config.hardware)
    if trace is None:
        trace = load_trace(config.trace, **trace_options(config))
    result = simulate(trace, model, profile, config.engine, progress=progress)
    summary: dict[str, Any] = {
        "trace": config.trace,
        "skipped_rows": trace.skipped_rows,
        "trace_warnings": list(trace.warnings),
        "model": model.name,
        "weight_dtype": weight_dtype,
        "hardware": profile.name,
        "policy": config.engine.policy,
        **summarize(result, slo),
        **compression_figures(result, compression),
    }
    summary["tiers_per_replica"] = tiers_per_replica(summary, profile, config.engine)
    summary["run_warnings"] = run_warnings(summary, result, config.engine)
    return RunOutcome(config, result, summary)


def compression_figures(result: RunResult, comp: Any) -> dict[str, Any]:
    """The run's KV compression, its memory and its quality proxy, for the summary.

    ``kv_bytes_per_request_mean`` / ``_peak``: the most KV one request held at once (on one
    rank), averaged over and maximal among completed requests; ``peak_hbm_kv_bytes``: the most
    running requests held at once on one replica. ``quality``: the published accuracy retained
    for the profile (benchmark, model, retained, source), or ``{"retained": None, "note": ...}``
    saying that no published number exists; under auto, each candidate's and how many
    requests chose it."""
    t = result.requests
    done = t.column("status").to_numpy(zero_copy_only=False) == "completed"
    peaks = result.kv_peak_bytes[done] if result.kv_peak_bytes is not None else np.zeros(0)
    out: dict[str, Any] = {
        "compression": comp.label,
        "kv_bytes_per_request_mean": float(peaks.mean()) if peaks.size else 0.0,
        "kv_bytes_per_request_peak": int(peaks.max()) if peaks.size else 0,
        "peak_hbm_kv_bytes": int(result.peak_hbm_kv_bytes),
        "quality": quality_figures(comp),
    }
    if comp.name == "auto" and result.request_compression is not None:
        labels = result.request_compression.to_numpy(zero_copy_only=False)
        out["compression_chosen"] = {
            c.label: int((labels == c.label).sum()) for c in comp.candidates
        }
        out["quality_by_candidate"] = {c.label: quality_figures(c) for c in comp.candidates}
    return out


def quality_figures(comp: Any) -> dict[str, Any]:
    """One profile's published quality point as a flat dict, or the reason there is none."""
    from kvsim.compression import quality, quality_reason

    if comp.name == "none":
        return {"retained": 1.0, "note": "uncompressed"}
    if comp.name == "auto":
        return {"retained": None, "note": "per request: see quality_by_candidate"}
    point = quality(comp)
    if point is None:
        return {"retained": None, "note": quality_reason(comp)}
    return {
        "benchmark": point.benchmark,
        "model": point.model,
        "retained": point.retained,
        "source": point.source,
        "note": point.note,
    }


def format_quality(summary: dict[str, Any]) -> str:
    """'retained 0.98 on LongBench (llama-3-8b; arXiv …)' or the reason there is no number."""
    q = summary.get("quality") or {}
    chosen = summary.get("compression_chosen")
    if chosen:  # auto: how many requests ran each candidate, and each one's quality
        by = summary.get("quality_by_candidate") or {}
        return "; ".join(
            f"{label} x{count} (" + format_quality({"quality": by.get(label, {})}) + ")"
            for label, count in chosen.items()
            if count
        )
    if q.get("retained") is None or "benchmark" not in q:
        return str(q.get("note") or "no published number")
    return (
        f"retained {q['retained']:.3f} on {q['benchmark']} ({q.get('model', '?')}; "
        f"{q.get('source', '?')})"
    )


# -- diagnostics -----------------------------------------------------------------------------------
def tiers_per_replica(
    summary: dict[str, Any], profile: Any, engine: EngineConfig
) -> dict[str, dict[str, float]]:
    """Each lower tier's capacity as one replica sees it, and the tier it is a share of.

    `--tier dram=1TiB` is per node: a replica of tp GPUs gets tp / gpus_per_node of it (and of a
    shared pool, a further 1 / shared_by_nodes). ``capacity_bytes`` is what the run used:
    the tier's blocks (summed over replicas in the summary) per replica × bytes per tier block
    (every rank's share of a block: kv_block_bytes_per_rank × tp).
    """
    resolved = resolve_profile(profile, resolve_settings(engine))
    replicas = engine.replica_count
    block_bytes = summary["kv_block_bytes_per_rank"] * engine.tp
    out: dict[str, dict[str, float]] = {}
    for name, stats in summary["tiers"].items():
        spec = resolved.tier(name)
        out[name] = {
            "capacity_bytes": int(stats["capacity_blocks"] * block_bytes // replicas),
            "tier_capacity_bytes": int(spec.capacity_bytes),
            "share": replica_share(resolved, spec, engine.tp),
            "shared_by_nodes": int(max(spec.shared_by_nodes, 1)) if name in SHARED_TIERS else 1,
        }
    return out


def format_tiers_per_replica(tiers: dict[str, dict[str, float]]) -> str:
    """'dram 64.0 GiB (1/8 of 512.0 GiB per node), rdma …' for the terminal summary."""
    parts = []
    for name, t in tiers.items():
        share = Fraction(t["share"]).limit_denominator(4096)
        of = "all" if share == 1 else f"{share.numerator}/{share.denominator}"
        whole = format_bytes(t["tier_capacity_bytes"])
        if t["shared_by_nodes"] > 1:
            where = f"of a {whole} pool shared by {t['shared_by_nodes']} nodes"
        else:
            where = f"of {whole} per node"
        parts.append(f"{name} {format_bytes(t['capacity_bytes'])} ({of} {where})")
    return ", ".join(parts)


def nothing_completed(summary: dict[str, Any]) -> bool:
    """True when a run had requests and completed none (`kvsim run` then exits 2)."""
    return summary["requests"] > 0 and summary["completed"] == 0


def run_warnings(summary: dict[str, Any], result: RunResult, engine: EngineConfig) -> list[str]:
    """Why requests did not complete, and whether the replicas were overloaded."""
    warnings = []
    refused = _refusal(summary, result, engine)
    if refused:
        warnings.append(refused)
    overload = _overload(summary, result, engine)
    if overload:
        warnings.append(overload)
    return warnings + result.warnings  # settings for tiers the run does not use


def _refusal(summary: dict[str, Any], result: RunResult, engine: EngineConfig) -> str | None:
    t = result.requests
    status = t.column("status").to_numpy(zero_copy_only=False)
    rejected = status == "rejected"
    unfinished = int((status == "unfinished").sum())
    n, completed = int(t.num_rows), int(summary["completed"])
    if not rejected.any() and completed == n:
        return None
    head = f"{completed} of {n} requests completed"
    parts = []
    if rejected.any():
        needs = (
            t.column("input_tokens").to_numpy()[rejected]
            + t.column("output_tokens").to_numpy()[rejected]
        )
        blocks, bs = int(summary["kv_blocks"]), engine.block_size
        smallest = int(needs.min())
        every = f"all {n}" if rejected.all() else str(int(rejected.sum()))
        parts.append(
            f"{every} were refused because each needs more KV blocks than a replica has "
            f"(a replica holds {blocks:,} block{'s' if blocks != 1 else ''} of {bs} tokens = "
            f"{blocks * bs:,} tokens; the smallest refused request needs {smallest:,} tokens "
            f"of prompt and reply = {-(-smallest // bs):,} blocks)"
        )
    if unfinished:
        parts.append(f"{unfinished} had not finished when the simulation ended")
    hint = ""
    if rejected.any():
        hint = (
            "; give each replica more KV: a larger or no --num-gpu-blocks, a larger --tp, "
            "a smaller --kv-dtype or --weight-dtype, or a GPU with more HBM"
            if engine.num_gpu_blocks is not None
            else "; give each replica more KV: a larger --tp, a smaller --kv-dtype or "
            "--weight-dtype, or a GPU with more HBM"
        )
    return f"{head}: " + "; ".join(parts) + hint


def _overload(summary: dict[str, Any], result: RunResult, engine: EngineConfig) -> str | None:
    t = result.requests
    status = t.column("status").to_numpy(zero_copy_only=False)
    done = status == "completed"
    if not done.any():
        return None
    ttft = t.column("ttft_s").to_numpy()
    prefill = t.column("first_token_s").to_numpy() - t.column("scheduled_s").to_numpy()
    hint = (
        "; serve it with more replicas (--replicas N with a --router) or offer less load "
        "(--rate-scale below 1)"
    )
    per_replica = summary.get("per_replica")
    if per_replica and "pd" not in summary and "replica" in t.column_names:
        replica = t.column("replica").to_numpy()
        hot = []
        for r in per_replica:
            mine = done & (replica == r["replica"])
            figures = _overloaded(r["busy_fraction"], ttft[mine], prefill[mine])
            if figures:
                hot.append((r["replica"], figures))
        if not hot:
            return None
        if len(hot) == len(per_replica):
            busy, p50, pre = hot[0][1]
            return (
                f"the offered load exceeds what the {len(hot)} replicas can serve: each was busy "
                f"at least {OVERLOAD_BUSY:.0%} of the time and its TTFT p50 is more than "
                f"{OVERLOAD_TTFT_FACTOR:.0f}× its median prefill (replica {hot[0][0]}: "
                f"{_secs(p50)} against {_secs(pre)}), so requests waited in queues" + hint
            )
        names = ", ".join(str(i) for i, _ in hot)
        return (
            f"replica(s) {names} of {len(per_replica)} were overloaded (busy at least "
            f"{OVERLOAD_BUSY:.0%} of the time, TTFT p50 over {OVERLOAD_TTFT_FACTOR:.0f}× the "
            "median prefill) while others had room: the router sends them more than they can "
            "serve; try another --router, or more --replicas"
        )
    figures = _overloaded(summary["busy_fraction"], ttft[done], prefill[done])
    if not figures:
        return None
    busy, p50, pre = figures
    count = engine.replica_count
    who = "1 replica" if count == 1 else f"the {count} replicas"
    return (
        f"the offered load exceeds what {who} can serve: busy {busy:.0%} of the time, and TTFT "
        f"p50 ({_secs(p50)}) is {p50 / pre:,.0f}× the median prefill ({_secs(pre)}), so requests "
        "spent most of their time waiting in the queue" + hint
    )


def _overloaded(
    busy: float, ttft: np.ndarray, prefill: np.ndarray
) -> tuple[float, float, float] | None:
    """(busy, TTFT p50, median prefill) when they meet the overload rule, else None."""
    if busy < OVERLOAD_BUSY or not len(ttft):
        return None
    p50, pre = float(np.median(ttft)), float(np.median(prefill))
    if not (math.isfinite(p50) and math.isfinite(pre)) or pre <= 0:
        return None
    return (busy, p50, pre) if p50 > OVERLOAD_TTFT_FACTOR * pre else None


def _secs(s: float) -> str:
    return f"{s * 1000:,.0f} ms" if s < 1 else f"{s:,.1f} s"


# -- JSON ------------------------------------------------------------------------------------------
def json_safe(value: Any) -> Any:
    """`value` with every NaN or infinite float (at any depth) replaced by None."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_safe(v) for v in value]
    return value


def summary_json(summary: dict[str, Any], indent: int | None = None) -> str:
    """The summary as strict JSON: NaN and infinities become null, never bare NaN."""
    return json.dumps(json_safe(summary), indent=indent, allow_nan=False)


# -- results folders -------------------------------------------------------------------------------
def is_complete(folder: str | Path) -> bool:
    """True only for a results folder whose every file was written (it holds ``COMPLETE``)."""
    return (Path(folder) / COMPLETE_MARKER).is_file()


class ResultsFolder:
    """Where one run's results go: checked and reserved before the run, filled after it.

    Creating one checks the target (not a file; empty, or ``overwrite`` and holding only kvsim
    results) and creates the temporary sibling it writes into, so an unwritable place fails
    before any simulation. `write` fills it and renames it into place; `discard` removes it.
    """

    def __init__(self, out: str | Path, overwrite: bool = False) -> None:
        self.out = Path(out)
        self.overwrite = overwrite
        self._check_target()
        parent = self.out.parent
        self._made: list[Path] = []  # parent folders this created, removed again by discard
        missing = parent
        while not missing.exists() and missing != missing.parent:
            self._made.append(missing)
            missing = missing.parent
        try:
            parent.mkdir(parents=True, exist_ok=True)
            self.tmp = _fresh_dir(parent, f"{self.out.name}.partial-")
        except OSError as exc:
            self._remove_made()
            raise ConfigError(
                f"{self.out}: cannot create the results folder there: {exc.strerror or exc}"
            ) from None

    def _check_target(self) -> None:
        out = self.out
        if out.exists() and not out.is_dir():
            raise ConfigError(f"{out}: is a file, not a folder; give a folder for the results")
        if not out.is_dir():
            return
        try:
            entries = sorted(e.name for e in out.iterdir())
        except OSError as exc:
            raise ConfigError(f"{out}: cannot read the folder: {exc.strerror or exc}") from None
        if not entries:
            return
        if not self.overwrite:
            raise ConfigError(
                f"{out}: folder is not empty; pass --overwrite to replace the results in it, "
                "or choose another --out"
            )
        # `kvsim report` writes its page into the run's report/ folder: kvsim's too
        foreign = [name for name in entries if name not in RESULT_FILES and name != "report"]
        if foreign:
            raise ConfigError(
                f"{out}: holds {foreign[0]!r}, which is not a kvsim result file; refusing to "
                "replace the folder even with --overwrite"
            )

    def write(self, outcome: RunOutcome) -> Path:
        """Write every result into the temporary folder, ``COMPLETE`` last, then rename it into
        place. Raises ConfigError (the temporary folder removed) when a write fails."""
        tables = {"requests.parquet": outcome.result.requests_with_compression()}
        if outcome.result.timeline is not None:
            tables["timeline.parquet"] = outcome.result.timeline
        return self.write_files(outcome.config, outcome.summary, tables)

    def write_files(
        self, config: RunConfig, summary: dict[str, Any], tables: dict[str, pa.Table]
    ) -> Path:
        """`write` with the Parquet tables chosen by the caller (a sweep may keep none of them):
        each of `tables` (named from RESULT_FILES), config.toml, summary.json, ``COMPLETE``."""
        tmp = self.tmp
        try:
            for name, table in tables.items():
                pq.write_table(table, tmp / name)
            (tmp / "config.toml").write_text(tomlwrite.dumps(config.as_dict()))
            (tmp / "summary.json").write_text(summary_json(summary, indent=2) + "\n")
            (tmp / COMPLETE_MARKER).write_text(
                f"kvsim {__version__}: every result file in this folder was written\n"
            )
        except OSError as exc:
            self.discard()
            raise ConfigError(f"{self.out}: cannot write results: {exc.strerror or exc}") from None
        self._install()
        return self.out

    def _install(self) -> None:
        try:
            os.rename(self.tmp, self.out)  # onto a missing or empty folder only
            return
        except OSError as exc:
            if exc.errno not in (errno.ENOTEMPTY, errno.EEXIST) or not self.overwrite:
                aside = self._aside()
                why = (
                    "another run wrote its results there while this one ran"
                    if exc.errno in (errno.ENOTEMPTY, errno.EEXIST)
                    else f"cannot move the results into place: {exc.strerror or exc}"
                )
                raise ConfigError(f"{self.out}: {why}; this run's results are in {aside}") from None
        self._check_target()  # still only kvsim results, or refuse
        old = _fresh_dir(self.out.parent, f"{self.out.name}.old-")
        try:
            os.rename(self.out, old)  # the previous results, aside until the new ones are in
        except OSError as exc:
            old.rmdir()
            aside = self._aside()
            raise ConfigError(
                f"{self.out}: cannot replace the folder ({exc.strerror or exc}); this run's "
                f"results are in {aside}"
            ) from None
        try:
            os.rename(self.tmp, self.out)
        except OSError as exc:
            with contextlib.suppress(OSError):
                os.rename(old, self.out)  # put the previous results back
            aside = self._aside()
            raise ConfigError(
                f"{self.out}: cannot replace the folder ({exc.strerror or exc}); this run's "
                f"results are in {aside}"
            ) from None
        shutil.rmtree(old, ignore_errors=True)

    def _aside(self) -> Path:
        """Move the finished temporary folder to the first free ``<out>-N`` and return it."""
        n = 2
        while True:
            aside = self.out.with_name(f"{self.out.name}-{n}")
            if not aside.exists():
                try:
                    os.rename(self.tmp, aside)
                    return aside
                except OSError:
                    pass
            n += 1
            if n > 1000:
                return self.tmp

    def discard(self) -> None:
        """Remove the temporary folder (and any parent folders this created)."""
        shutil.rmtree(self.tmp, ignore_errors=True)
        self._remove_made()

    def _remove_made(self) -> None:
        for folder in self._made:
            try:
                folder.rmdir()
            except OSError:
                break


def _fresh_dir(parent: Path, prefix: str) -> Path:
    """A new empty folder ``<parent>/<prefix><pid>-<random>``, with the user's umask (unlike
    tempfile.mkdtemp's 0700, which the results folder would keep after the rename)."""
    while True:
        path = parent / f"{prefix}{os.getpid()}-{secrets.token_hex(4)}"
        try:
            path.mkdir()
            return path
        except FileExistsError:
            continue


def write_outputs(outcome: RunOutcome, out_dir: str | Path, overwrite: bool = False) -> Path:
    """requests.parquet, timeline.parquet, config.toml, summary.json and the ``COMPLETE`` marker,
    written into a temporary sibling and renamed to `out_dir` when all are written (see the
    module docstring). Refuses a non-empty `out_dir` unless `overwrite`."""
    return ResultsFolder(out_dir, overwrite).write(outcome)
