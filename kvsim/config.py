"""A whole run's configuration: the workload, model, hardware and engine settings as typed.

A `RunConfig` is what a user wrote (on the command line or in a config.toml) and what a run
records beside its results; `kvsim.resolve` turns it into checked, typed values.
"""

from __future__ import annotations

import dataclasses
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvsim.engine.config import EngineConfig
from kvsim.errors import ConfigError
from kvsim.textio import read_utf8


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
