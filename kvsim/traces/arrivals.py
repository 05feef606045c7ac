"""Arrival models: when sessions start. Turn order and think times inside a session never change.

- `replay`: the source's own times (real timestamps, or a generator's native process), divided by
  `rate_scale`.
- `poisson`: exponential gaps at `rate` sessions/s.
- `gamma`: Gamma gaps with mean 1/`rate` and coefficient of variation `cv` (cv > 1 is burstier
  than Poisson; cv = 1 is Poisson).
- `servegen[:GROUP/CHUNK]`: the ServeGen per-client window model (Alibaba Bailian, arXiv
  2505.09999). Each 600 s window of a real client has a rate and a fitted inter-arrival family
  (Gamma or Weibull with a shape); idle windows have none. Within a window, gaps come from that
  family with its shape, scaled so the mean gap is 1/rate of the window. With `rate`, every window's
  rate is scaled so the mean over active windows equals it. Default client:
  `language-m-large/chunk-104` (the largest by volume). The windows repeat if more sessions are
  needed than the 14 days hold.

A process is stateful (`draw(n)` continues where it stopped), so streaming loaders can draw
session starts batch by batch and still get the same times as one big draw.
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa

from kvsim.errors import KvsimError, TraceError
from kvsim.textio import exists, one_line, read_utf8

__all__ = [
    "ARRIVAL_MODELS",
    "ArrivalProcess",
    "GammaProcess",
    "PoissonProcess",
    "ServeGenProcess",
    "ServeGenWindow",
    "make_process",
    "read_servegen_windows",
    "retime_table",
]

ARRIVAL_MODELS = ("replay", "poisson", "gamma", "servegen")
SERVEGEN_DEFAULT = "language-m-large/chunk-104"
SERVEGEN_WINDOW_S = 600.0


class ArrivalProcess:
    """Session start times, drawn in order; `draw(n)` continues the same realisation."""

    def draw(self, n: int) -> np.ndarray:
        raise NotImplementedError


class _RenewalProcess(ArrivalProcess):
    def __init__(self, seed: int) -> None:
        self._rng = np.random.default_rng(np.random.SeedSequence([seed, 0x617272]))
        self._t = 0.0
        self._first = True

    def _gaps(self, n: int) -> np.ndarray:
        raise NotImplementedError

    def draw(self, n: int) -> np.ndarray:
        gaps = self._gaps(n)
        if self._first and n:
            gaps[0] = 0.0  # the first session starts the trace
            self._first = False
        # The running sum continues from the last time, so draws in pieces add in the same order
        # as one whole draw and give the same times bit for bit (`t + cumsum` would round
        # differently); the first draw starts from 0.0, and 0.0 + x is x.
        times = np.cumsum(np.concatenate(([self._t], gaps)))[1:]
        if n:
            self._t = float(times[-1])
        return times


class PoissonProcess(_RenewalProcess):
    def __init__(self, rate: float, seed: int) -> None:
        super().__init__(seed)
        self.rate = rate

    def _gaps(self, n: int) -> np.ndarray:
        return self._rng.exponential(1.0 / self.rate, n)


class GammaProcess(_RenewalProcess):
    """Gamma gaps: shape 1/cv², scale cv²/rate (mean 1/rate, CV cv)."""

    def __init__(self, rate: float, cv: float, seed: int) -> None:
        super().__init__(seed)
        self.rate, self.cv = rate, cv

    def _gaps(self, n: int) -> np.ndarray:
        shape = 1.0 / self.cv**2
        return self._rng.gamma(shape, 1.0 / (shape * self.rate), n)


@dataclass(frozen=True)
class ServeGenWindow:
    start_s: float
    rate: float  # requests/s; 0 when idle
    cv: float
    family: str  # "Gamma", "Weibull" or "" (idle)
    shape: float
    scale: float


def read_servegen_windows(path: Path, shown: str | None = None) -> list[ServeGenWindow]:
    """Read a ServeGen `chunk-N-trace.csv` (no header; one row per 600 s window)."""
    shown = shown or str(path)
    content = read_utf8(Path(path), shown, TraceError)  # a few thousand rows: read at once
    windows = []
    reader = csv.reader(content.splitlines())
    try:
        rows = list(reader)
    except csv.Error as exc:  # e.g. a field over the csv module's 128 KiB limit
        raise TraceError(f"{shown}:{reader.line_num}: not valid CSV: {one_line(exc)}") from None
    for line_no, row in enumerate(rows, start=1):
        if not row:
            continue
        if len(row) != 6:
            raise TraceError(f"{shown}:{line_no}: expected 6 fields, got {len(row)}")
        start, rate, cv, family, shape, scale = row
        names = ("window_start_s", "rate", "cv", "shape", "scale")
        values = []
        for field, text in zip(names, (start, rate, cv, shape, scale), strict=True):
            try:
                value = float(text) if text else 0.0
            except ValueError:
                raise TraceError(
                    f"{shown}:{line_no}: field {field!r}: expected a number, got {text!r}"
                ) from None
            if not (math.isfinite(value) and value >= 0):
                raise TraceError(
                    f"{shown}:{line_no}: field {field!r}: expected finite >= 0, got {text!r}"
                )
            values.append(value)
        if family not in ("Gamma", "Weibull", ""):
            raise TraceError(
                f"{shown}:{line_no}: field 'family': expected Gamma, Weibull or empty, "
                f"got {family!r}"
            )
        if family and (values[1] <= 0 or values[3] <= 0):
            family = ""  # a fitted family without a rate or shape carries no arrivals
        windows.append(ServeGenWindow(values[0], values[1], values[2], family, values[3],
                                      values[4]))  # fmt: skip
    if not any(w.family for w in windows):
        raise TraceError(f"{shown}: no active window (every window is idle)")
    return windows


class ServeGenProcess(ArrivalProcess):
    """Arrivals from ServeGen windows (see module docstring)."""

    def __init__(self, windows: list[ServeGenWindow], seed: int, rate: float | None = None):
        self._rng = np.random.default_rng(np.random.SeedSequence([seed, 0x736776]))
        active = [w for w in windows if w.family]
        mean_rate = float(np.mean([w.rate for w in active]))
        self._factor = 1.0 if rate is None else rate / mean_rate
        self._windows = windows
        self._origin = active[0].start_s
        self._span = windows[-1].start_s + SERVEGEN_WINDOW_S - self._origin
        self._index = windows.index(active[0])
        self._lap = 0
        self._buffer = np.zeros(0)
        self._t0: float | None = None

    def _window_times(self, w: ServeGenWindow) -> np.ndarray:
        rate = w.rate * self._factor
        expected = rate * SERVEGEN_WINDOW_S
        n = int(expected * 1.5 + 10 * math.sqrt(expected) + 20)
        if w.family == "Gamma":
            gaps = self._rng.gamma(w.shape, 1.0 / (w.shape * rate), n)
        else:
            gaps = self._rng.weibull(w.shape, n) / (rate * math.gamma(1.0 + 1.0 / w.shape))
        offsets = np.cumsum(gaps)
        offsets = offsets[offsets < SERVEGEN_WINDOW_S]
        return w.start_s - self._origin + self._lap * self._span + offsets

    def draw(self, n: int) -> np.ndarray:
        parts, have = [self._buffer], self._buffer.size
        while have < n:
            w = self._windows[self._index]
            if w.family:
                times = self._window_times(w)
                parts.append(times)
                have += times.size
            self._index += 1
            if self._index == len(self._windows):
                self._index, self._lap = 0, self._lap + 1
        times = np.concatenate(parts)
        if self._t0 is None and times.size:
            self._t0 = float(times[0])  # the first session starts the trace
        self._buffer = times[n:]
        return times[:n] - (self._t0 or 0.0)


def _servegen_path(root: Path, spec: str) -> Path:
    group, _, chunk = spec.partition("/")
    if not chunk:
        raise KvsimError(f"option 'arrival': expected servegen:GROUP/CHUNK, got servegen:{spec}")
    return root / "servegen" / group / f"{chunk}-trace.csv"


def make_process(
    arrival: str, *, rate: float, cv: float | None, seed: int, root: Path
) -> ArrivalProcess:
    """The process for `arrival` (not `replay`); `rate` in sessions/s."""
    model, _, spec = arrival.partition(":")
    if model == "poisson":
        return PoissonProcess(rate, seed)
    if model == "gamma":
        return GammaProcess(rate, 2.0 if cv is None else cv, seed)
    if model == "servegen":
        path = _servegen_path(root, spec or SERVEGEN_DEFAULT)
        if not (exists(path) and path.is_file()):
            raise KvsimError(f"option 'arrival': no ServeGen client file {path}")
        return ServeGenProcess(read_servegen_windows(path), seed, rate)
    raise KvsimError(
        f"option 'arrival': unknown model {arrival!r}; valid: {', '.join(ARRIVAL_MODELS)}"
    )


def check_arrival(arrival: str | None, cv: float | None) -> None:
    """Reject an unknown model or a `cv` that does not apply, before any work is done."""
    model = None if arrival is None else arrival.partition(":")[0]
    if model is not None and model not in ARRIVAL_MODELS:
        raise KvsimError(
            f"option 'arrival': unknown model {arrival!r}; valid: {', '.join(ARRIVAL_MODELS)}"
        )
    if cv is not None:
        if model != "gamma":
            raise KvsimError("option 'cv' applies only to arrival 'gamma'")
        if not (cv > 0 and math.isfinite(cv)):
            raise KvsimError(f"option 'cv' must be a positive number, got {cv!r}")


def retime_table(table: pa.Table, process: ArrivalProcess) -> pa.Table:
    """New session starts from `process`, in the order sessions started; each session shifts as one.

    Think times and gaps between turns of a session are kept, so turn order is kept too.
    """
    if table.num_rows == 0:
        return table
    arrival = table.column("arrival_s").to_numpy()
    session = table.column("session_id").to_numpy()
    uniq, first_row, inverse = np.unique(session, return_index=True, return_inverse=True)
    start = arrival[first_row]
    order = np.lexsort((uniq, start))
    new_start = np.empty(uniq.size)
    new_start[order] = process.draw(uniq.size)
    shifted = arrival + (new_start - start)[inverse]
    table = table.set_column(
        table.schema.get_field_index("arrival_s"),
        table.schema.field("arrival_s"),
        pa.array(shifted, pa.float64()),
    )
    rid = table.column("request_id").to_numpy()
    perm = np.lexsort((rid, shifted))
    return table.take(pa.array(perm))
