"""The Python API behind `kvsim run`: resolve a config, simulate, write the results.

Everything the CLI does, a notebook can call:

    from kvsim.run import RunConfig, run, write_outputs
    outcome = run(RunConfig(trace="sharegpt", policy="lru"))
    outcome.summary["ttft_p50_s"]
    write_outputs(outcome, "runs/lru")

Results folders. `write_outputs` writes into a temporary sibling (``<name>.partial-*``, through
`kvsim.atomic`, which removes those left by killed runs on the next write there) and renames
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

- requests refused because prompt + output exceeds the model's context (``max_context_tokens``,
  as vLLM refuses a prompt beyond ``max_model_len``), with their count, or because each needs
  more KV blocks than a replica has (when nothing completes at all this is the reason, and
  `kvsim run` exits 2: see `nothing_completed`);
- overload: a replica was busy at least ``OVERLOAD_BUSY`` of the time and its TTFT p50 exceeds
  ``OVERLOAD_TTFT_FACTOR`` × its median prefill time (first token − first scheduled), i.e.
  requests mostly waited in the queue: the offered load is more than the replicas can serve.
  A lightly loaded replica has a TTFT p50 within a few prefill times even when decode keeps it
  busy all the time, so the ratio, not the busy fraction alone, is the signal;
- a setting for a tier the run does not enable (`--tier nvme=1TB`, `--policy nvme=arc` without
  nvme in `--tiers`), which does nothing.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from kvsim import __version__, tomlwrite
from kvsim.atomic import AtomicFolder, WriteError, remove_stale
from kvsim.config import RunConfig
from kvsim.engine.config import EngineConfig
from kvsim.engine.resolve import ResolvedEngine
from kvsim.engine.simulation import ProgressFn, RunResult, run_engine
from kvsim.engine.tiers import replica_share
from kvsim.hardware.tier_kinds import SHARED_TIER_NAMES
from kvsim.metrics import summarize
from kvsim.resolve import ResolvedRun, resolve
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


@dataclass
class RunOutcome:
    config: RunConfig  # as resolved: the weight dtype the run used is filled in
    result: RunResult
    summary: dict[str, object]


def trace_options(config: RunConfig) -> dict[str, Any]:
    """`load_trace`'s keyword arguments for a config: two configs with equal options (and the
    same ``config.trace``) replay the same trace, so a sweep worker can load it once. A config
    that names no run length gets its trace's default (`TraceInfo.run_requests`)."""
    max_requests = config.max_requests
    return {
        "max_requests": run_requests(config.trace) if max_requests is None else max_requests,
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
    """Resolve the config, load its trace, simulate, and summarise (KvsimError on bad input).

    `trace`, when given, must be ``load_trace(config.trace, **trace_options(config))``, loaded
    earlier (kvsim.sweep reuses one per worker); otherwise it is loaded here. A time-sharded
    run (an approximation, in parallel) is `kvsim.shard.run_split`.
    """
    return run_resolved(resolve(config), progress, trace=trace)


def run_resolved(
    resolved: ResolvedRun, progress: ProgressFn | None = None, *, trace: Trace | None = None
) -> RunOutcome:
    """`run` for a config `kvsim.resolve.resolve` has already checked."""
    config, engine = resolved.config, resolved.engine
    if trace is None:
        trace = load_trace(config.trace, **trace_options(config))
    return outcome_of(resolved, trace, run_engine(trace, engine, progress=progress))


class TraceFacts(Protocol):
    """What a summary says of the trace: a loaded `Trace`, or what a sharded run read of a
    trace file in slices (kvsim.shard.source)."""

    skipped_rows: int
    warnings: tuple[str, ...]


def outcome_of(
    resolved: ResolvedRun,
    trace: TraceFacts,
    result: RunResult,
    figures: dict[str, Any] | None = None,
) -> RunOutcome:
    """A finished run's summary (`figures`: a sharded run's own, kvsim.shard)."""
    config, model, engine = resolved.config, resolved.model, resolved.engine
    summary: dict[str, Any] = {
        "trace": config.trace,
        "skipped_rows": trace.skipped_rows,
        "trace_warnings": list(trace.warnings),
        "model": model.name,
        "weight_dtype": config.weight_dtype,
        "hardware": resolved.profile.name,
        "policy": config.engine.policy,
        **summarize(result, resolved.slo),
        **compression_figures(result, engine.compression),
    }
    summary["tiers_per_replica"] = tiers_per_replica(summary, engine)
    summary["run_warnings"] = run_warnings(
        summary, result, config.engine, max_context=model.max_context_tokens
    )
    summary.update(figures or {})
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
    if comp.per_request_choice and result.request_compression is not None:
        labels = result.request_compression.to_numpy(zero_copy_only=False)
        out["compression_chosen"] = {
            c.label: int((labels == c.label).sum()) for c in comp.candidates
        }
        out["quality_by_candidate"] = {c.label: quality_figures(c) for c in comp.candidates}
    return out


def quality_figures(comp: Any) -> dict[str, Any]:
    """One profile's published quality point as a flat dict, or the reason there is none."""
    from kvsim.compression import quality, quality_reason

    if comp.identity:
        return {"retained": 1.0, "note": "uncompressed"}
    if comp.per_request_choice:
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
    summary: dict[str, Any], engine: ResolvedEngine
) -> dict[str, dict[str, float]]:
    """Each lower tier's capacity as one replica sees it, and the tier it is a share of.

    `--tier dram=1TiB` is per node: a replica of tp GPUs gets tp / gpus_per_node of it (and of a
    shared pool, a further 1 / shared_by_nodes). ``capacity_bytes`` is what the run used:
    the tier's blocks (summed over replicas in the summary) per replica × bytes per tier block
    (every rank's share of a block: kv_block_bytes_per_rank × tp).
    """
    resolved, replicas, tp = engine.profile, engine.replica_count, engine.config.tp
    block_bytes = summary["kv_block_bytes_per_rank"] * tp
    out: dict[str, dict[str, float]] = {}
    for name, stats in summary["tiers"].items():
        spec = resolved.tier(name)
        out[name] = {
            "capacity_bytes": int(stats["capacity_blocks"] * block_bytes // replicas),
            "tier_capacity_bytes": int(spec.capacity_bytes),
            "share": replica_share(resolved, spec, tp),
            "shared_by_nodes": (
                int(max(spec.shared_by_nodes, 1)) if name in SHARED_TIER_NAMES else 1
            ),
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


def run_warnings(
    summary: dict[str, Any],
    result: RunResult,
    engine: EngineConfig,
    max_context: int | None = None,
) -> list[str]:
    """Why requests did not complete, and whether the replicas were overloaded.

    `max_context` is the model's ``max_context_tokens``: refused requests longer than it are
    counted apart from those refused for want of KV blocks."""
    warnings = []
    refused = _refusal(summary, result, engine, max_context)
    if refused:
        warnings.append(refused)
    overload = _overload(summary, result, engine)
    if overload:
        warnings.append(overload)
    return warnings + result.warnings  # settings for tiers the run does not use


def _refusal(
    summary: dict[str, Any], result: RunResult, engine: EngineConfig, max_context: int | None
) -> str | None:
    t = result.requests
    status = t.column("status").to_numpy(zero_copy_only=False)
    rejected = status == "rejected"
    unfinished = int((status == "unfinished").sum())
    n, completed = int(t.num_rows), int(summary["completed"])
    if not rejected.any() and completed == n:
        return None
    head = f"{completed} of {n} requests completed"
    parts = []
    needs = (
        t.column("input_tokens").to_numpy()[rejected]
        + t.column("output_tokens").to_numpy()[rejected]
    )
    if max_context is not None and (needs > max_context).any():
        long = needs > max_context
        count = int(long.sum())
        every = f"all {n}" if count == n else str(count)
        parts.append(
            f"{every} {'was' if count == 1 else 'were'} refused because prompt + output exceeds "
            f"the model's context of "
            f"{max_context:,} tokens (vLLM refuses a prompt beyond max_model_len; the longest "
            f"refused request has {int(needs[long].max()):,} tokens)"
        )
        needs = needs[~long]
    if needs.size:
        blocks, bs = int(summary["kv_blocks"]), engine.block_size
        smallest = int(needs.min())
        every = f"all {n}" if needs.size == n else str(needs.size)
        parts.append(
            f"{every} were refused because each needs more KV blocks than a replica has "
            f"(a replica holds {blocks:,} block{'s' if blocks != 1 else ''} of {bs} tokens = "
            f"{blocks * bs:,} tokens; the smallest refused request needs {smallest:,} tokens "
            f"of prompt and reply = {-(-smallest // bs):,} blocks)"
        )
    if unfinished:
        parts.append(f"{unfinished} had not finished when the simulation ended")
    hint = ""
    if needs.size:
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
    count = len(result.replicas)
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


class ResultsFolder(AtomicFolder):
    """Where one run's results go: checked and reserved before the run, filled after it.

    Creating one checks the target (not a file; empty, or ``overwrite`` and holding only kvsim
    results) and creates the temporary sibling it writes into, so an unwritable place fails
    before any simulation; stale temporaries of killed runs to the same folder are removed
    (`kvsim.atomic`). `write` fills it and renames it into place; `discard` removes it.
    """

    what = "the results folder"

    def check_target(self) -> None:
        out = self.out
        if out.exists() and not out.is_dir():
            raise WriteError(f"{out}: is a file, not a folder; give a folder for the results")
        if self.overwrite and out.is_dir():
            remove_stale(out, "report")  # a report killed while being written
        entries = self.entries()
        if not entries:
            return
        if not self.overwrite:
            raise WriteError(
                f"{out}: folder is not empty; pass --overwrite to replace the results in it, "
                "or choose another --out"
            )
        # `kvsim report` writes its page into the run's report/ folder: kvsim's too
        foreign = [name for name in entries if name not in RESULT_FILES and name != "report"]
        if foreign:
            raise WriteError(
                f"{out}: holds {foreign[0]!r}, which is not a kvsim result file; refusing to "
                "replace the folder even with --overwrite"
            )

    def write(self, outcome: RunOutcome) -> Path:
        """Write every result into the temporary folder, ``COMPLETE`` last, then rename it into
        place. Raises WriteError (a ConfigError; the temporary folder removed) when a write
        fails."""
        tables = {"requests.parquet": outcome.result.requests_with_compression()}
        if outcome.result.timeline is not None:
            tables["timeline.parquet"] = outcome.result.timeline
        return self.write_files(outcome.config, outcome.summary, tables)

    def write_files(
        self, config: RunConfig, summary: dict[str, Any], tables: dict[str, pa.Table]
    ) -> Path:
        """`write` with the Parquet tables chosen by the caller (a sweep may keep none of them):
        each of `tables` (named from RESULT_FILES), config.toml, summary.json, ``COMPLETE``."""

        def fill(tmp: Path) -> None:
            for name, table in tables.items():
                pq.write_table(table, tmp / name)
            (tmp / "config.toml").write_text(tomlwrite.dumps(config.as_dict()))
            (tmp / "summary.json").write_text(summary_json(summary, indent=2) + "\n")
            (tmp / COMPLETE_MARKER).write_text(
                f"kvsim {__version__}: every result file in this folder was written\n"
            )

        return self.fill(fill, "cannot write results")


def write_outputs(outcome: RunOutcome, out_dir: str | Path, overwrite: bool = False) -> Path:
    """requests.parquet, timeline.parquet, config.toml, summary.json and the ``COMPLETE`` marker,
    written into a temporary sibling and renamed to `out_dir` when all are written (see the
    module docstring). Refuses a non-empty `out_dir` unless `overwrite`."""
    return ResultsFolder(out_dir, overwrite).write(outcome)
