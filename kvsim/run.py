"""The Python API behind `kvsim run`: resolve a config, simulate, write the results.

Everything the CLI does, a notebook can call:

    from kvsim.run import RunConfig, run
    outcome = run(RunConfig(trace="sharegpt", policy="lru"))
    outcome.summary["ttft_p50_s"]
"""

from __future__ import annotations

import dataclasses
import json
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow.parquet as pq

from kvsim import tomlwrite
from kvsim.engine.config import EngineConfig
from kvsim.engine.simulation import ProgressFn, RunResult, simulate
from kvsim.errors import ConfigError
from kvsim.hardware import load_profile
from kvsim.metrics import Slo, summarize
from kvsim.models import load_model
from kvsim.traces import load_trace


@dataclass(frozen=True)
class RunConfig:
    """A whole run: workload, model, hardware and engine settings. Defaults run anywhere."""

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
            "model": {"name": self.model},
            "hardware": {"profile": self.hardware},
            "engine": self.engine.as_dict(),
            "slo": {"ttft_s": self.slo_ttft_s, "tpot_s": self.slo_tpot_s},
        }

    @classmethod
    def from_toml(cls, path: str | Path) -> RunConfig:
        """Read a config written by a previous run (or by hand, with the same tables)."""
        try:
            doc = tomllib.loads(Path(path).read_text())
        except (OSError, tomllib.TOMLDecodeError) as exc:
            raise ConfigError(f"{path}: {exc}") from None
        known = {"trace", "model", "hardware", "engine", "slo"}
        for key in doc:
            if key not in known:
                raise ConfigError(f"{path}: unknown table [{key}]; expected {sorted(known)}")
        trace = doc.get("trace", {})
        engine_fields = {f.name for f in dataclasses.fields(EngineConfig)}
        engine = doc.get("engine", {})
        for key in engine:
            if key not in engine_fields:
                raise ConfigError(f"{path}: engine.{key}: unknown setting")
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
                model=doc.get("model", {}).get("name", cls.model),
                hardware=doc.get("hardware", {}).get("profile", cls.hardware),
                engine=EngineConfig(**engine),
                slo_ttft_s=doc.get("slo", {}).get("ttft_s"),
                slo_tpot_s=doc.get("slo", {}).get("tpot_s"),
            )
        except TypeError as exc:
            raise ConfigError(f"{path}: {exc}") from None


@dataclass
class RunOutcome:
    config: RunConfig
    result: RunResult
    summary: dict[str, object]


def run(config: RunConfig, progress: ProgressFn | None = None) -> RunOutcome:
    """Load everything the config names, simulate, and summarise. Raises KvsimError on bad input."""
    slo = Slo(config.slo_ttft_s, config.slo_tpot_s)
    model = load_model(config.model)
    profile = load_profile(config.hardware)
    trace = load_trace(
        config.trace,
        max_requests=config.max_requests,
        rate=config.rate,
        rate_scale=config.rate_scale,
        seed=config.engine.seed,
        arrival=config.arrival,
        cv=config.cv,
        format=config.trace_format,
        tokenizer=config.tokenizer,
        skip_bad_rows=config.skip_bad_rows,
    )
    result = simulate(trace, model, profile, config.engine, progress=progress)
    summary = {
        "trace": config.trace,
        "skipped_rows": trace.skipped_rows,
        "model": model.name,
        "hardware": profile.name,
        "policy": config.engine.policy,
        **summarize(result, slo),
    }
    return RunOutcome(config, result, summary)


def write_outputs(outcome: RunOutcome, out_dir: str | Path) -> Path:
    """requests.parquet, timeline.parquet, summary.json and config.toml; the summary is written
    last, so a directory without it is an interrupted run, never one that looks complete."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    pq.write_table(outcome.result.requests, out / "requests.parquet")
    if outcome.result.timeline is not None:
        pq.write_table(outcome.result.timeline, out / "timeline.parquet")
    (out / "config.toml").write_text(tomlwrite.dumps(outcome.config.as_dict()))
    tmp = out / "summary.json.tmp"
    tmp.write_text(json.dumps(outcome.summary, indent=2) + "\n")
    tmp.replace(out / "summary.json")
    return out
