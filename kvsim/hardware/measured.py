"""Cost model from calibration: measured kernel and transfer times, interpolated as rates.

``kvsim calibrate`` writes tables of median seconds per kernel family into a profile's
``[measured]`` section. This module reads them and predicts times for shapes it never saw:

- Between measured points, log(time) is interpolated linearly in log(size), the same as
  interpolating log(achieved rate): exact at every measured point and monotone wherever the
  measurements are.
- Outside the measured range the ratio measured/roofline of the nearest edge relaxes to 1 over
  one decade of size, so extrapolation tends to the roofline (the kernel terms of
  RooflineCostModel, kvsim.hardware.kernels) instead of exploding, and beyond a
  decade it *is* the roofline, except that a larger size never costs less than the largest
  measured one (nor a smaller one more than the smallest).

An iteration is the sum of its parts, as in Vidur: per-layer GEMMs at the batch's token count,
the LM head per sequence, per-layer elementwise work, prefill attention per chunk, decode
attention at (batch, mean context), tensor-parallel all-reduces (a measured curve of seconds
vs bytes when the profile has one, else the roofline of kvsim.hardware.kernels), and a fixed
overhead. Tables belong to one model, TP degree and dtype; ``make_cost_model`` falls back to the
roofline when they do not match and says why.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, NoReturn

import numpy as np

from kvsim.errors import ConfigError
from kvsim.hardware.costmodel import (
    ChunkedPrefill,
    RooflineCostModel,
    _windowed_pairs,
    model_elementwise_bytes_per_token,
)
from kvsim.hardware.kernels import ELEMENTWISE_KERNELS_PER_LAYER, KernelRates, allreduce_s
from kvsim.hardware.profile import HardwareProfile
from kvsim.models import ModelSpec, attention_costs, kv_heads_per_rank
from kvsim.models.dtypes import weight_dtype_bytes
from kvsim.textio import key_name
from kvsim.units import is_finite_number

FORMAT = 1
RELAX_DECADES = 1.0  # beyond the measured range, the measured/roofline ratio fades over this
Fail = Callable[[str, str], NoReturn]
Roofline = Callable[[np.ndarray], np.ndarray]


# -- interpolation -----------------------------------------------------------------------------
def _relax(distance_decades: np.ndarray) -> np.ndarray:
    """Weight of the measured edge ratio at a distance outside the range (1 at the edge)."""
    return np.clip(1.0 - distance_decades / RELAX_DECADES, 0.0, 1.0)


class RateCurve:
    """Time of one kernel vs its size, from measured points, relaxing to a roofline outside."""

    def __init__(self, x: np.ndarray, seconds: np.ndarray, roofline: Roofline) -> None:
        self.x = np.asarray(x, dtype=np.float64)
        self.seconds = np.asarray(seconds, dtype=np.float64)
        self.roofline = roofline
        self._lx = np.log(self.x)
        self._lt = np.log(self.seconds)
        edges = self.x[[0, -1]]
        self._log_edge_ratio = np.log(self.seconds[[0, -1]] / roofline(edges))

    def __call__(self, x: float | np.ndarray) -> np.ndarray:
        """Predicted seconds at sizes ``x`` (any shape; sizes must be positive)."""
        xs = np.asarray(x, dtype=np.float64)
        lx = np.log(np.maximum(xs, 1e-300))
        inside = np.exp(np.interp(lx, self._lx, self._lt))
        below = lx < self._lx[0]
        above = lx > self._lx[-1]
        if not (below.any() or above.any()):
            return inside
        dist = np.where(below, self._lx[0] - lx, np.where(above, lx - self._lx[-1], 0.0))
        edge = np.where(below, self._log_edge_ratio[0], self._log_edge_ratio[-1])
        roof = self.roofline(xs)
        outside = roof * np.exp(edge * _relax(dist / math.log(10)))
        # never cheaper than the largest measured size, nor dearer than the smallest: where
        # the roofline is far below the measurements (a CPU's) the fade alone can bend down
        outside = np.where(above, np.maximum(outside, self.seconds[-1]), outside)
        outside = np.where(below, np.minimum(outside, self.seconds[0]), outside)
        return np.where(below | above, outside, inside)


class RateGrid:
    """Time vs two sizes (decode attention: batch x context): bilinear in logs, relaxing outside.

    Inside the grid log(time) is bilinear in (log batch, log context). Outside, the point is
    clamped onto the grid, the measured/roofline ratio there fades over a decade of the larger
    of the two distances, and the roofline takes over.
    """

    def __init__(
        self,
        rows: np.ndarray,
        cols: np.ndarray,
        seconds: np.ndarray,
        roofline: Callable[[np.ndarray, np.ndarray], np.ndarray],
    ) -> None:
        self.rows = np.asarray(rows, dtype=np.float64)
        self.cols = np.asarray(cols, dtype=np.float64)
        self.seconds = np.asarray(seconds, dtype=np.float64)
        self.roofline = roofline
        self._lr, self._lc = np.log(self.rows), np.log(self.cols)
        self._lt = np.log(self.seconds)

    def _inside(self, lr: np.ndarray, lc: np.ndarray) -> np.ndarray:
        def locate(axis: np.ndarray, v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
            if axis.size == 1:
                return np.zeros(v.shape, dtype=int), np.zeros(v.shape)
            i = np.clip(np.searchsorted(axis, v, side="right") - 1, 0, axis.size - 2)
            frac = (v - axis[i]) / (axis[i + 1] - axis[i])
            return i, np.clip(frac, 0.0, 1.0)

        i, fr = locate(self._lr, lr)
        j, fc = locate(self._lc, lc)
        i1 = np.minimum(i + 1, self._lr.size - 1)
        j1 = np.minimum(j + 1, self._lc.size - 1)
        t = self._lt
        top = t[i, j] * (1 - fc) + t[i, j1] * fc
        bottom = t[i1, j] * (1 - fc) + t[i1, j1] * fc
        return np.exp(top * (1 - fr) + bottom * fr)

    def __call__(self, rows: float | np.ndarray, cols: float | np.ndarray) -> np.ndarray:
        r, c = np.broadcast_arrays(
            np.asarray(rows, dtype=np.float64), np.asarray(cols, dtype=np.float64)
        )
        lr, lc = np.log(r), np.log(c)
        clr = np.clip(lr, self._lr[0], self._lr[-1])
        clc = np.clip(lc, self._lc[0], self._lc[-1])
        inside = self._inside(clr, clc)
        dist = np.maximum(np.abs(lr - clr), np.abs(lc - clc)) / math.log(10)
        if not np.any(dist > 0):
            return inside
        edge_ratio = np.log(inside / self.roofline(np.exp(clr), np.exp(clc)))
        outside = self.roofline(r, c) * np.exp(edge_ratio * _relax(dist))
        # monotone across the edge, as in RateCurve: bigger work never costs less than the
        # nearest measured point, smaller work never more
        outside = np.where((lr >= clr) & (lc >= clc), np.maximum(outside, inside), outside)
        outside = np.where((lr <= clr) & (lc <= clc), np.minimum(outside, inside), outside)
        return np.where(dist > 0, outside, inside)


# -- tables as stored in a profile ------------------------------------------------------------
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
        return tuple(_pairs(n, c) for n, c in zip(self.tokens, self.context, strict=True))


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


def _pairs(new: float, context: float) -> float:
    """(query, key) pairs of a causal chunk of ``new`` tokens after ``context``."""
    return new * context + new * (new + 1) / 2


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
#: Formats whose kernels run at the same speed (same bytes, same tensor-core peak on every GPU
#: kvsim ships): tables measured in one price the other.
_SAME_SPEED = ({"fp16", "bf16"},)
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
    gemm_raw = c.table(data, "gemm", "measured.gemm")
    if not gemm_raw:
        fail("measured.gemm", "expected at least one GEMM shape table")
    gemm = {}
    for name, raw in gemm_raw.items():
        f = f"measured.gemm.{key_name(name)}"
        if not isinstance(raw, dict):
            fail(f, f"expected a table, got {raw!r}")
        per = raw.get("per", "token")
        if per not in ("token", "sequence"):
            fail(f"{f}.per", f"expected 'token' or 'sequence', got {per!r}")
        gemm[name] = GemmTable(
            k=c.positive_int(raw, "k", f"{f}.k"),
            n=c.positive_int(raw, "n", f"{f}.n"),
            calls=c.positive_int(raw, "calls", f"{f}.calls"),
            per=per,
            curve=c.curve(raw, f, "tokens", integer=True),
        )
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
    copies = {}
    if "copy" in data:
        raw_copies = c.table(data, "copy", "measured.copy")
        for name, raw in raw_copies.items():
            f = f"measured.copy.{key_name(name)}"
            if name not in _COPY_NAMES:
                fail(f, f"unknown copy direction; expected one of {list(_COPY_NAMES)}")
            if not isinstance(raw, dict):
                fail(f, f"expected a table, got {raw!r}")
            copies[name] = c.curve(raw, f, "bytes", integer=True)
    storage = storage_path = None
    if "storage" in data:
        raw = c.table(data, "storage", "measured.storage")
        storage_path = c.text(raw, "path", "measured.storage.path")
        if storage_path not in _STORAGE_PATHS:
            fail("measured.storage.path", f"expected one of {list(_STORAGE_PATHS)}")
        storage = c.curve(raw, "measured.storage", "bytes", integer=True)
    allreduce = None
    if "allreduce" in data:
        raw = c.table(data, "allreduce", "measured.allreduce")
        if tp == 1:
            fail("measured.allreduce", "an all-reduce table needs measured.tp > 1")
        allreduce = c.curve(raw, "measured.allreduce", "bytes", integer=True)
    for key in _PROVENANCE_TEXT:
        if key in data:
            c.text(data, key, f"measured.{key}")
    for key in _PROVENANCE_LISTS:
        value = data.get(key, [])
        if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
            fail(f"measured.{key}", f"expected a list of non-empty strings, got {value!r:.60}")
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


def _raise(field: str, message: str) -> NoReturn:
    raise ConfigError(f"{field}: {message}")


# -- the model's shapes --------------------------------------------------------------------------
@dataclass(frozen=True)
class GemmShape:
    """A weight matrix the forward pass multiplies by: ``k`` in, ``n`` out, ``calls`` times."""

    k: int
    n: int
    calls: int
    per: str = "token"
    bias: bool = False


def supported(model: ModelSpec) -> str | None:
    """Why the measured model cannot describe ``model`` (None when it can)."""
    kinds = {g.kind for g in model.layer_groups}
    if kinds - {"full", "sliding", "mla"}:
        return f"{model.name}: layer kinds {sorted(kinds - {'full', 'sliding', 'mla'})}"
    if any(m.is_moe for m in model.mlp_groups):
        return f"{model.name}: mixture-of-experts MLP"
    if len({(g.kind, g.num_heads, g.num_kv_heads, g.head_dim_k) for g in model.layer_groups}) > 1:
        return f"{model.name}: more than one attention shape"
    return None


def gemm_shapes(model: ModelSpec, tp: int = 1) -> dict[str, GemmShape]:
    """The GEMMs of one forward pass per rank, by role; same-sized roles are merged."""
    hidden = model.hidden_size
    shapes: dict[str, GemmShape] = {}

    def add(name: str, k: int, n: int, calls: int, per: str = "token", bias: bool = False):
        old = shapes.get(name)
        if old is not None and (old.k, old.n) == (k, n):
            shapes[name] = GemmShape(k, n, old.calls + calls, per, bias)
            return
        if old is not None:
            name = f"{name}_{k}x{n}"
        shapes[name] = GemmShape(k, n, calls, per, bias)

    for g in model.layer_groups:
        heads = max(1, g.num_heads // tp)
        if g.kind in ("full", "sliding"):
            kvh = kv_heads_per_rank(g.num_kv_heads, tp)
            add(
                "qkv",
                hidden,
                heads * g.head_dim_k + kvh * (g.head_dim_k + g.head_dim_v),
                g.layers,
                bias=g.attention_bias,
            )
            add("o", heads * g.head_dim_v, hidden, g.layers)
        elif g.kind == "mla":
            qk = g.qk_nope_head_dim + g.qk_rope_head_dim
            if g.q_lora_rank:
                add("q_a", hidden, g.q_lora_rank, g.layers)
                add("q_b", g.q_lora_rank, heads * qk, g.layers)
            else:
                add("q", hidden, heads * qk, g.layers)
            add("kv_a", hidden, g.kv_lora_rank + g.qk_rope_head_dim, g.layers)
            add("kv_b", g.kv_lora_rank, heads * (g.qk_nope_head_dim + g.v_head_dim), g.layers)
            add("o", heads * g.v_head_dim, hidden, g.layers)
    for m in model.mlp_groups:
        inter = max(1, m.intermediate_size // tp)
        add("gate_up", hidden, 2 * inter, m.layers)
        add("down", inter, hidden, m.layers)
    add("lm_head", hidden, max(1, model.vocab_size // tp), 1, per="sequence")
    return shapes


def elementwise_bytes_per_token(model: ModelSpec, tp: int, dtype: str) -> float:
    """Bytes one token moves per layer outside GEMMs and attention (norms, RoPE, SiLU, adds).

    Two RMSNorms (read + write hidden), two residual adds (read two, write one), RoPE on the
    query and key heads (read + write), the gated activation (read two, write one), and the
    KV-cache write. Calibration scales a proxy's elementwise times by its ratio (the dtype
    cancels); the roofline that extrapolation relaxes to prices what RooflineCostModel does
    (``elementwise_roofline``).
    """
    hidden = model.hidden_size
    g = model.layer_groups[0]
    heads = max(1, g.num_heads // tp)
    kvh = kv_heads_per_rank(g.num_kv_heads, tp) if g.kind != "mla" else 1
    qk = heads * max(g.head_dim_k, g.qk_nope_head_dim + g.qk_rope_head_dim)
    inter = max(1, model.mlp_groups[0].intermediate_size // tp) if model.mlp_groups else 0
    elements = 4 * hidden + 6 * hidden + 2 * (qk + kvh * g.head_dim_k) + 3 * inter
    elements += kvh * (g.head_dim_k + g.head_dim_v)
    return elements * weight_dtype_bytes(dtype)


# -- rooflines per family ------------------------------------------------------------------------
# Outside the measured range each family relaxes to the same kernel terms as RooflineCostModel
# (kvsim.hardware.kernels: fixed cost per kernel, soft ridge, attention's and elementwise
# efficiencies), so the two models agree where nothing was measured.
def gemm_roofline(shape: GemmShape | GemmTable, rates: KernelRates, wbytes: float) -> Roofline:
    """Seconds of one ``m x k @ k x n`` kernel at ``m`` rows: its fixed cost plus the soft
    roofline of its FLOPs and its weight and activation traffic."""
    k, n = shape.k, shape.n

    def seconds(m: np.ndarray) -> np.ndarray:
        flops = 2.0 * m * k * n
        nbytes = (k * n + m * (k + n)) * wbytes
        return np.asarray(rates.gemm_s(flops, nbytes))

    return seconds


def elementwise_roofline(model: ModelSpec, tp: int, rates: KernelRates) -> Roofline:
    """Seconds of one layer's elementwise kernels at ``t`` tokens, as RooflineCostModel prices
    them (its bytes per token, bf16 activations, ``ELEMENTWISE_KERNELS_PER_LAYER`` kernels)."""
    per_layer = model_elementwise_bytes_per_token(model, tp, 2.0) / max(model.num_layers, 1)

    def seconds(t: np.ndarray) -> np.ndarray:
        return np.asarray(rates.elementwise_s(t * per_layer, ELEMENTWISE_KERNELS_PER_LAYER))

    return seconds


class _Attention:
    """Per-layer attention work of the model's attention shape: FLOPs and KV bytes."""

    def __init__(self, model: ModelSpec, tp: int, kv_dtype: str) -> None:
        costs = attention_costs(model, kv_dtype, tp)
        self.groups = [
            (
                c.layers,
                c.window or 0,
                c.prefill_flops_per_token_pair / c.layers,
                c.flops_per_token_pair / c.layers,
                c.kv_bytes_per_token / max(c.layers, 1),
            )
            for c in costs
        ]
        _, _, self.prefill_fpp, self.decode_fpp, self.kv_bpt = self.groups[0]
        g = model.layer_groups[0]
        heads = max(1, g.num_heads // tp)
        width = g.kv_lora_rank + g.qk_rope_head_dim if g.kind == "mla" else g.head_dim_k
        self.q_bytes_per_token = 2.0 * heads * width * 2  # query in, output out (bf16)

    def prefill_roofline(self, rates: KernelRates) -> Roofline:
        """Seconds of one layer vs pairs, for a prompt with no prefix (context = 0)."""

        def seconds(pairs: np.ndarray) -> np.ndarray:
            new = (np.sqrt(8 * pairs + 1) - 1) / 2  # invert pairs = new (new + 1) / 2
            flops = pairs * self.prefill_fpp
            nbytes = new * (self.kv_bpt + self.q_bytes_per_token)
            return np.asarray(rates.attention_s(flops, nbytes))

        return seconds

    def decode_roofline(self, rates: KernelRates) -> Callable[[np.ndarray, np.ndarray], np.ndarray]:
        """Seconds of one layer for ``batch`` sequences each attending ``context + 1`` keys."""

        def seconds(batch: np.ndarray, context: np.ndarray) -> np.ndarray:
            keys = batch * (context + 1)
            flops = keys * self.decode_fpp
            nbytes = keys * self.kv_bpt + batch * self.q_bytes_per_token
            return np.asarray(rates.attention_s(flops, nbytes))

        return seconds


# -- the cost model ------------------------------------------------------------------------------
def _curve(curve: Curve, roofline: Roofline) -> RateCurve:
    return RateCurve(np.array(curve.x), np.array(curve.seconds), roofline)


def _prefill_curve(table: PrefillTable, roofline: Roofline) -> RateCurve:
    return RateCurve(np.array(table.pairs), np.array(table.seconds), roofline)


class MeasuredCostModel(ChunkedPrefill):
    """Iteration times from a calibrated profile; same calls as ``RooflineCostModel``."""

    kind = "measured"

    def __init__(
        self,
        model: ModelSpec,
        profile: HardwareProfile,
        *,
        tp: int = 1,
        kv_dtype: str = "bf16",
        weight_dtype: str = "bf16",
        tables: MeasuredTables | None = None,
    ) -> None:
        tables = tables or parse_measured(profile.measured, _raise)
        reason = mismatch(tables, model, tp, kv_dtype, weight_dtype)
        if reason:
            raise ConfigError(f"measured tables do not apply: {reason}")
        self.tables = tables
        source = tables.extra.get("source")
        if source:  # imported tables (kvsim calibrate import-vidur) say whose measurements
            self.reason = f"measured by {source} on {tables.device}"
        else:
            self.reason = f"measured on {tables.device} ({tables.date})"
        self.roofline = RooflineCostModel(
            model, profile, tp=tp, kv_dtype=kv_dtype, weight_dtype=weight_dtype
        )
        rates = self.roofline.rates  # the roofline's kernel terms, at its compute dtype
        wbytes = weight_dtype_bytes(weight_dtype)
        self.layers = model.num_layers
        self.gemm = [
            (g.calls, g.per == "sequence", _curve(g.curve, gemm_roofline(g, rates, wbytes)))
            for g in tables.gemm.values()
        ]
        self.elementwise = _curve(tables.elementwise, elementwise_roofline(model, tp, rates))
        att = _Attention(model, tp, kv_dtype)
        self.att = att
        self.prefill = _prefill_curve(tables.prefill, att.prefill_roofline(rates))
        cached = tables.prefill_cached or tables.prefill
        self.prefill_cached = _prefill_curve(cached, att.prefill_roofline(rates))
        d = tables.decode
        self.decode = RateGrid(
            np.array(d.batch), np.array(d.context), np.array(d.seconds), att.decode_roofline(rates)
        )
        self.overhead_s = tables.overhead_s
        self.request_overhead_s = self.roofline.request_overhead_s
        self.tp = tp
        # two all-reduces per layer (after attention, after the MLP) of tokens x hidden x 2 bytes
        self.allreduce_calls = 2 * model.num_layers
        self.allreduce_bytes_per_token = model.hidden_size * 2.0
        algorithms = profile.allreduce_algorithms
        self.allreduce_roofline: Roofline = lambda b: np.asarray(allreduce_s(algorithms, b, tp))
        self.allreduce = (
            _curve(tables.allreduce, self.allreduce_roofline)
            if tables.allreduce is not None and tp > 1
            else None
        )
        self.windowed = self.roofline.windowed

    # -- parts ----------------------------------------------------------------------------------
    def allreduce_time_s(self, tokens: float | np.ndarray) -> np.ndarray:
        """The iteration's tensor-parallel all-reduces: the measured curve where the profile has
        one (relaxing to the roofline outside it), else latency + bytes / bandwidth."""
        tokens = np.asarray(tokens, dtype=np.float64)
        if self.tp <= 1:
            return np.zeros_like(tokens)
        nbytes = np.maximum(tokens * self.allreduce_bytes_per_token, 1.0)
        curve = self.allreduce
        per_call = curve(nbytes) if curve is not None else self.allreduce_roofline(nbytes)
        return self.allreduce_calls * per_call

    def linear_time_s(self, tokens: float | np.ndarray, sequences: float | np.ndarray):
        """GEMMs, elementwise work and all-reduces of a batch of ``tokens`` in ``sequences``."""
        total = self.layers * self.elementwise(tokens)
        for calls, per_sequence, curve in self.gemm:
            total = total + calls * curve(sequences if per_sequence else tokens)
        return total + self.allreduce_time_s(tokens)

    def prefill_attention_s(self, new: int, context: int) -> float:
        """One chunk's attention over every attention layer."""
        curve = self.prefill_cached if context > 0 else self.prefill
        total = 0.0
        for layers, window, fpp, _, _ in self.att.groups:
            if window and context + new > window:
                pairs = _windowed_pairs(context, new, window)
            else:
                pairs = _pairs(new, context)
            scale = fpp / self.att.prefill_fpp if self.att.prefill_fpp else 1.0
            total += layers * scale * float(curve(pairs))
        return total

    def decode_attention_s(self, contexts: np.ndarray) -> np.ndarray:
        """Decode attention of ``contexts`` (steps, sequences) over every attention layer."""
        batch = contexts.shape[1]
        total = np.zeros(contexts.shape[0])
        for layers, window, _, fpp, _ in self.att.groups:
            keys = np.minimum(contexts, window) if window else contexts
            mean = np.maximum(keys.mean(axis=1), 1.0)
            scale = fpp / self.att.decode_fpp if self.att.decode_fpp else 1.0
            total += layers * scale * self.decode(float(batch), mean)
        return total

    # -- the RooflineCostModel interface ------------------------------------------------------
    def iteration_time_s(
        self,
        prefill: list[tuple[int, int]],
        decode_contexts: list[int] | np.ndarray,
        decode_total: float | None = None,
    ) -> float:
        """Seconds for one iteration; arguments as in ``RooflineCostModel.iteration_time_s``."""
        n_decode = len(decode_contexts)
        tokens = sum(n for n, _ in prefill) + n_decode
        if tokens == 0:
            return self.overhead_s
        total = float(self.linear_time_s(tokens, len(prefill) + n_decode))
        for new, context in prefill:
            total += self.prefill_attention_s(new, context)
        if n_decode and decode_total is not None:
            total += float(self._mean_decode_s(n_decode, np.array([decode_total / n_decode]))[0])
        elif n_decode:
            contexts = np.asarray(decode_contexts, dtype=np.float64)[None, :]
            total += float(self.decode_attention_s(contexts)[0])
        return total + self.overhead_s

    def _mean_decode_s(self, n: int, mean: np.ndarray) -> np.ndarray:
        """Decode attention of `n` sequences of each `mean` context, over every attention
        layer, for a model without windows."""
        attn = np.zeros(len(mean))
        for layers, _, _, fpp, _ in self.att.groups:
            scale = fpp / self.att.decode_fpp if self.att.decode_fpp else 1.0
            attn += layers * scale * self.decode(float(n), np.maximum(mean, 1.0))
        return attn

    def decode_run_ends_s(
        self,
        contexts: np.ndarray,
        steps: int,
        growth: float | None = None,
        total: float | None = None,
    ) -> np.ndarray:
        """Cumulative ends of ``steps`` decode iterations of an unchanged batch (``growth``:
        tokens the summed context gains per step, from ``total``, as in
        ``RooflineCostModel``)."""
        n = len(contexts)
        fixed = float(self.linear_time_s(n, n)) + self.overhead_s
        offsets = np.arange(steps, dtype=np.float64)
        if growth is not None:
            start = float(np.mean(contexts)) if total is None else total / max(n, 1)
            attn = self._mean_decode_s(n, start + growth / max(n, 1) * offsets)
        elif self.windowed:
            work = contexts[None, :].astype(np.float64) + offsets[:, None]
            attn = self.decode_attention_s(work)
        else:
            attn = self._mean_decode_s(n, float(np.mean(contexts)) + offsets)
        return np.cumsum(fixed + attn)

    def block_recompute_s(self, block_size: int) -> tuple[float, float]:
        """(base, per position) seconds to recompute one block inside a prefill, linearised
        from the measured prefill-attention table between context 0 and 64 blocks deep."""
        near = self.prefill_attention_s(block_size, 0)
        far = self.prefill_attention_s(block_size, 64 * block_size)
        base = float(self.linear_time_s(block_size, 1)) + near
        return base, max(far - near, 0.0) / 64


def mismatch(
    tables: MeasuredTables, model: ModelSpec, tp: int, kv_dtype: str, weight_dtype: str
) -> str | None:
    """Why ``tables`` cannot price ``model`` at this TP degree and dtypes (None if they can)."""
    if tables.model != model.name:
        return f"measured for model {tables.model!r}, not {model.name!r}"
    if tables.tp != tp:
        return f"measured at tp={tables.tp}, not tp={tp}"
    if not same_speed(tables.dtype, weight_dtype):
        return f"measured in {tables.dtype}, not weight dtype {weight_dtype}"
    if not same_speed(tables.kv_dtype, kv_dtype):
        return f"measured with kv dtype {tables.kv_dtype}, not {kv_dtype}"
    return supported(model)


def same_speed(measured: str, wanted: str) -> bool:
    """Whether kernels measured in dtype ``measured`` price dtype ``wanted`` (fp16 and bf16
    move the same bytes at the same tensor-core peak, so Vidur's fp16 tables price bf16 KV)."""
    return measured == wanted or any({measured, wanted} <= group for group in _SAME_SPEED)


CostModel = MeasuredCostModel | RooflineCostModel
"""What the engine needs: `iteration_time_s`, `decode_run_ends_s`, `prefill_time_s`,
`block_recompute_s`, and `kind` / `reason` for the summary."""


def make_cost_model(
    model: ModelSpec,
    profile: HardwareProfile,
    *,
    tp: int = 1,
    kv_dtype: str = "bf16",
    weight_dtype: str = "bf16",
) -> MeasuredCostModel | RooflineCostModel:
    """The measured model when the profile has tables for this model, TP and dtype; else the
    roofline. Either has ``.kind`` ("measured" / "roofline") and ``.reason`` for the summary."""
    if profile.measured:
        tables = parse_measured(profile.measured, _raise)
        reason = mismatch(tables, model, tp, kv_dtype, weight_dtype)
        if reason is None:
            return MeasuredCostModel(
                model, profile, tp=tp, kv_dtype=kv_dtype, weight_dtype=weight_dtype, tables=tables
            )
    else:
        reason = "the profile has no measured tables"
    cost = RooflineCostModel(model, profile, tp=tp, kv_dtype=kv_dtype, weight_dtype=weight_dtype)
    cost.reason = reason
    return cost


# -- transfers -----------------------------------------------------------------------------------
class TransferModel:
    """Seconds to move bytes between HBM and host DRAM or NVMe: measured curves where the profile
    has them, else latency + bytes / bandwidth of the tier (the roofline of a transfer)."""

    def __init__(self, profile: HardwareProfile) -> None:
        self.profile = profile
        self.curves: dict[str, RateCurve] = {}
        tables = parse_measured(profile.measured, _raise) if profile.measured else None
        names = {t.name for t in profile.tiers}
        if tables is not None:
            if "dram" in names:
                dram = profile.tier("dram")
                for direction, bw in (
                    ("h2d", dram.read_bandwidth_bytes_per_s),
                    ("d2h", dram.write_bandwidth_bytes_per_s),
                ):
                    if direction in tables.copies:
                        self.curves[direction] = _curve(
                            tables.copies[direction], _linear(dram.latency_s, bw)
                        )
            if tables.storage is not None and "nvme" in names:
                nvme = profile.tier("nvme")
                roof = _linear(nvme.latency_s, nvme.read_bandwidth_bytes_per_s)
                self.curves["nvme_read"] = _curve(tables.storage, roof)
        self.kind = "measured" if self.curves else "roofline"

    def time_s(self, tier: str, nbytes: float, write: bool = False) -> float:
        """One transfer of ``nbytes`` from ``tier`` into HBM (or out to it when ``write``)."""
        key = {"dram": "d2h" if write else "h2d", "nvme": None if write else "nvme_read"}.get(tier)
        if key in self.curves:
            return float(self.curves[key](max(nbytes, 1.0)))
        t = self.profile.tier(tier)
        bw = t.write_bandwidth_bytes_per_s if write else t.read_bandwidth_bytes_per_s
        return t.latency_s + nbytes / bw


def _linear(latency_s: float, bytes_per_s: float) -> Roofline:
    return lambda b: latency_s + b / bytes_per_s
