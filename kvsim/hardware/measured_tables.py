"""The ``[measured]`` section of a hardware profile: its tables, checked field by field.

``kvsim calibrate`` (or ``import-vidur``) writes median seconds per kernel family there. Parsing
lives apart from pricing (kvsim.costmodel.measured) because the profile validator checks these
tables too, with its own error reporting, and needs nothing of the pricing to do so.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, NoReturn

from kvsim.errors import ConfigError
from kvsim.hardware.attention_pairs import causal_pairs
from kvsim.textio import key_name
from kvsim.units import is_finite_number

FORMAT = 1
Fail = Callable[[str, str], NoReturn]


@dataclass(frozen=True)
class Curve:
    """Measured median seconds at increasing sizes, with their relative spread."""

    x: tuple[float, ...]
    seconds: tuple[float, ...]
    spread: tuple[float, ...] = ()


@dataclass(frozen=True)
class GemmTable:
    """One GEMM shape of the model: ``tokens x k`` times ``k x n``, ``calls`` per iteration."""

    k: int
    n: int
    calls: int
    per: str  # "token": M is the batch's tokens; "sequence": M is its sequences (LM head)
    curve: Curve


@dataclass(frozen=True)
class PrefillTable:
    """Prefill attention of one layer for (new tokens, cached context) points, by pair count."""

    tokens: tuple[int, ...]
    context: tuple[int, ...]
    seconds: tuple[float, ...]
    spread: tuple[float, ...] = ()

    @property
    def pairs(self) -> tuple[float, ...]:
        return tuple(causal_pairs(n, c) for n, c in zip(self.tokens, self.context, strict=True))


@dataclass(frozen=True)
class DecodeTable:
    """Decode attention of one layer over a grid: rows by batch size, columns by context."""

    batch: tuple[int, ...]
    context: tuple[int, ...]
    seconds: tuple[tuple[float, ...], ...]


@dataclass(frozen=True)
class MeasuredTables:
    """Everything ``[measured]`` holds, checked (see ``parse_measured``)."""

    device: str
    device_kind: str
    driver: str
    torch: str
    date: str
    model: str
    tp: int
    dtype: str
    kv_dtype: str
    overhead_s: float
    gemm: dict[str, GemmTable]
    elementwise: Curve
    prefill: PrefillTable
    prefill_cached: PrefillTable | None
    decode: DecodeTable
    copies: dict[str, Curve] = field(default_factory=dict)  # "h2d" / "d2h": seconds vs bytes
    storage: Curve | None = None
    storage_path: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    allreduce: Curve | None = None  # one all-reduce over the tp GPUs: seconds vs bytes


_META = ("device", "device_kind", "driver", "torch", "date", "model", "dtype", "kv_dtype")
_OPTIONAL_TOP = {
    "format",
    "quick",
    "repetitions",
    "warmup",
    "threads",
    "rounds",
    "scrub_bytes",
    "validation",
    "storage",
    "allreduce",
    *("source", "source_commit", "source_note", "licence"),  # imported tables (import-vidur)
    *("source_files", "filled_from_roofline"),
}
_PROVENANCE_TEXT = ("source", "source_commit", "source_note", "licence")
_PROVENANCE_LISTS = ("source_files", "filled_from_roofline")
_COPY_NAMES = ("h2d", "d2h")
_STORAGE_PATHS = ("gds", "bounce", "host")


class _Checker:
    """Field checks for ``[measured]``; errors go through ``fail(field, message)``."""

    def __init__(self, fail: Fail) -> None:
        self.fail = fail

    def table(self, data: Mapping[str, Any], key: str, field: str) -> Mapping[str, Any]:
        if key not in data:
            self.fail(field, "missing required table")
        value = data[key]
        if not isinstance(value, dict):
            self.fail(field, f"expected a table, got {value!r}")
        return value

    def text(self, data: Mapping[str, Any], key: str, field: str) -> str:
        value = data.get(key)
        if not isinstance(value, str) or not value.strip():
            self.fail(field, f"expected a non-empty string, got {value!r}")
        return value

    def positive_int(self, data: Mapping[str, Any], key: str, field: str) -> int:
        value = data.get(key)
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value < 2**31:
            self.fail(field, f"expected a positive integer below 2^31, got {value!r:.60}")
        return value

    def number(self, data: Mapping[str, Any], key: str, field: str) -> float:
        value = data.get(key)
        if isinstance(value, bool) or not isinstance(value, int | float) or not value >= 0:
            self.fail(field, f"expected a number >= 0, got {value!r:.60}")
        if not is_finite_number(value):
            self.fail(field, f"expected a finite number, got {value!r:.60}")
        return float(value)

    def sizes(
        self, data: Mapping[str, Any], key: str, field: str, *, integer: bool, zero: bool = False
    ) -> tuple[float, ...]:
        """A non-empty list of positive (or >= 0) numbers."""
        value = data.get(key)
        kind = "integers" if integer else "numbers"
        sign = "non-negative" if zero else "positive"
        ok = isinstance(value, list) and len(value) > 0
        for v in value if ok else []:
            good = not isinstance(v, bool) and isinstance(v, int if integer else int | float)
            if not good or not is_finite_number(v) or v < 0 or (v == 0 and not zero):
                ok = False
        if not ok:
            self.fail(field, f"expected a non-empty list of {sign} {kind}, got {value!r:.60}")
        return tuple(value)

    def increasing(self, values: tuple[float, ...], field: str, what: str) -> None:
        if any(b <= a for a, b in itertools.pairwise(values)):
            self.fail(field, f"expected strictly increasing {what}, got {list(values)!r}")

    def same_length(self, values: tuple, n: int, field: str, of: str) -> None:
        if len(values) != n:
            self.fail(field, f"expected {n} values (one per entry of {of}), got {len(values)}")

    def curve(self, data: Mapping[str, Any], field: str, xkey: str, integer: bool) -> Curve:
        x = self.sizes(data, xkey, f"{field}.{xkey}", integer=integer)
        self.increasing(x, f"{field}.{xkey}", f"{xkey}")
        seconds = self.sizes(data, "seconds", f"{field}.seconds", integer=False)
        self.same_length(seconds, len(x), f"{field}.seconds", f"{field}.{xkey}")
        spread: tuple[float, ...] = ()
        if "spread" in data:
            spread = self.sizes(data, "spread", f"{field}.spread", integer=False, zero=True)
            self.same_length(spread, len(x), f"{field}.spread", f"{field}.{xkey}")
        return Curve(tuple(float(v) for v in x), tuple(float(s) for s in seconds), spread)

    def prefill(self, data: Mapping[str, Any], field: str) -> PrefillTable:
        tokens = self.sizes(data, "tokens", f"{field}.tokens", integer=True)
        context = self.sizes(data, "context", f"{field}.context", integer=True, zero=True)
        self.same_length(context, len(tokens), f"{field}.context", f"{field}.tokens")
        seconds = self.sizes(data, "seconds", f"{field}.seconds", integer=False)
        self.same_length(seconds, len(tokens), f"{field}.seconds", f"{field}.tokens")
        spread = ()
        if "spread" in data:
            spread = self.sizes(data, "spread", f"{field}.spread", integer=False, zero=True)
            self.same_length(spread, len(tokens), f"{field}.spread", f"{field}.tokens")
        table = PrefillTable(tokens, context, tuple(map(float, seconds)), spread)  # type: ignore[arg-type]
        self.increasing(table.pairs, f"{field}.tokens", "(query, key) pair counts")
        return table

    def decode(self, data: Mapping[str, Any], field: str) -> DecodeTable:
        batch = self.sizes(data, "batch", f"{field}.batch", integer=True)
        self.increasing(batch, f"{field}.batch", "batch sizes")
        context = self.sizes(data, "context", f"{field}.context", integer=True)
        self.increasing(context, f"{field}.context", "context lengths")
        rows = data.get("seconds")
        if not isinstance(rows, list) or len(rows) != len(batch):
            self.fail(
                f"{field}.seconds",
                f"expected {len(batch)} rows (one per batch size) of {len(context)} seconds",
            )
        out = []
        for i, row in enumerate(rows):
            values = self.sizes({"row": row}, "row", f"{field}.seconds[{i}]", integer=False)
            self.same_length(values, len(context), f"{field}.seconds[{i}]", f"{field}.context")
            out.append(tuple(float(v) for v in values))
        return DecodeTable(batch, context, tuple(out))  # type: ignore[arg-type]

    def gemm(self, data: Mapping[str, Any]) -> dict[str, GemmTable]:
        """``[measured.gemm.<role>]``: one table per weight shape of the model."""
        gemm_raw = self.table(data, "gemm", "measured.gemm")
        if not gemm_raw:
            self.fail("measured.gemm", "expected at least one GEMM shape table")
        gemm = {}
        for name, raw in gemm_raw.items():
            f = f"measured.gemm.{key_name(name)}"
            if not isinstance(raw, dict):
                self.fail(f, f"expected a table, got {raw!r}")
            per = raw.get("per", "token")
            if per not in ("token", "sequence"):
                self.fail(f"{f}.per", f"expected 'token' or 'sequence', got {per!r}")
            gemm[name] = GemmTable(
                k=self.positive_int(raw, "k", f"{f}.k"),
                n=self.positive_int(raw, "n", f"{f}.n"),
                calls=self.positive_int(raw, "calls", f"{f}.calls"),
                per=per,
                curve=self.curve(raw, f, "tokens", integer=True),
            )
        return gemm

    def copies(self, data: Mapping[str, Any]) -> dict[str, Curve]:
        """``[measured.copy.h2d]`` / ``[measured.copy.d2h]``: host copies, seconds vs bytes."""
        copies = {}
        if "copy" in data:
            raw_copies = self.table(data, "copy", "measured.copy")
            for name, raw in raw_copies.items():
                f = f"measured.copy.{key_name(name)}"
                if name not in _COPY_NAMES:
                    self.fail(f, f"unknown copy direction; expected one of {list(_COPY_NAMES)}")
                if not isinstance(raw, dict):
                    self.fail(f, f"expected a table, got {raw!r}")
                copies[name] = self.curve(raw, f, "bytes", integer=True)
        return copies

    def storage(self, data: Mapping[str, Any]) -> tuple[Curve | None, str | None]:
        """``[measured.storage]``: storage reads into HBM and the path they took."""
        storage = storage_path = None
        if "storage" in data:
            raw = self.table(data, "storage", "measured.storage")
            storage_path = self.text(raw, "path", "measured.storage.path")
            if storage_path not in _STORAGE_PATHS:
                self.fail("measured.storage.path", f"expected one of {list(_STORAGE_PATHS)}")
            storage = self.curve(raw, "measured.storage", "bytes", integer=True)
        return storage, storage_path

    def allreduce(self, data: Mapping[str, Any], tp: int) -> Curve | None:
        """``[measured.allreduce]``: one all-reduce over the ``tp`` GPUs, seconds vs bytes."""
        allreduce = None
        if "allreduce" in data:
            raw = self.table(data, "allreduce", "measured.allreduce")
            if tp == 1:
                self.fail("measured.allreduce", "an all-reduce table needs measured.tp > 1")
            allreduce = self.curve(raw, "measured.allreduce", "bytes", integer=True)
        return allreduce

    def provenance(self, data: Mapping[str, Any]) -> None:
        """Where imported tables came from: texts and lists of non-empty strings."""
        for key in _PROVENANCE_TEXT:
            if key in data:
                self.text(data, key, f"measured.{key}")
        for key in _PROVENANCE_LISTS:
            value = data.get(key, [])
            if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
                self.fail(
                    f"measured.{key}", f"expected a list of non-empty strings, got {value!r:.60}"
                )


def parse_measured(data: Mapping[str, Any], fail: Fail) -> MeasuredTables:
    """Check a profile's ``[measured]`` table; ``fail(field, message)`` reports the first error.

    Fields are named in full (``measured.gemm.qkv.tokens``) so the message points at the line.
    """
    c = _Checker(fail)
    known = {*_META, *_OPTIONAL_TOP, "tp", "overhead_s", "gemm", "elementwise"}
    known |= {"prefill_attention", "prefill_attention_cached", "decode_attention", "copy"}
    for key in data:
        if key not in known:
            fail(f"measured.{key_name(key)}", f"unknown field; expected one of {sorted(known)}")
    fmt = data.get("format", FORMAT)
    if fmt != FORMAT:
        fail("measured.format", f"expected {FORMAT}, got {fmt!r}")
    meta = {k: c.text(data, k, f"measured.{k}") for k in _META}
    if meta["device_kind"] not in ("cuda", "cpu"):
        fail("measured.device_kind", f"expected 'cuda' or 'cpu', got {meta['device_kind']!r}")
    tp = c.positive_int(data, "tp", "measured.tp")
    overhead = c.number(data, "overhead_s", "measured.overhead_s")
    gemm = c.gemm(data)
    elementwise = c.curve(
        c.table(data, "elementwise", "measured.elementwise"),
        "measured.elementwise",
        "tokens",
        integer=True,
    )
    prefill = c.prefill(
        c.table(data, "prefill_attention", "measured.prefill_attention"),
        "measured.prefill_attention",
    )
    cached = None
    if "prefill_attention_cached" in data:
        cached = c.prefill(
            c.table(data, "prefill_attention_cached", "measured.prefill_attention_cached"),
            "measured.prefill_attention_cached",
        )
    decode = c.decode(
        c.table(data, "decode_attention", "measured.decode_attention"),
        "measured.decode_attention",
    )
    copies = c.copies(data)
    storage, storage_path = c.storage(data)
    allreduce = c.allreduce(data, tp)
    c.provenance(data)
    return MeasuredTables(
        **meta,
        tp=tp,
        overhead_s=overhead,
        gemm=gemm,
        elementwise=elementwise,
        prefill=prefill,
        prefill_cached=cached,
        decode=decode,
        copies=copies,
        storage=storage,
        storage_path=storage_path,
        extra={
            k: data[k]
            for k in ("quick", "repetitions", "validation", *_PROVENANCE_TEXT, *_PROVENANCE_LISTS)
            if k in data
        },
        allreduce=allreduce,
    )


def raise_config_error(field: str, message: str) -> NoReturn:
    """The ``fail`` of a caller that prices with the tables: the first error is a ConfigError."""
    raise ConfigError(f"{field}: {message}")
