"""Fit the kernel terms of kvsim.costmodel.kernels to measured kernel times.

Each fit minimises the mean squared log error (a 10 % miss on a 10 us kernel weighs as much as on
a 10 ms one) with Nelder-Mead over log-parameters, so every parameter stays positive. Callers
fit on one half of the measurements and report the error on the other (benchmarks/
validate_kernels.py); a constant tuned to one number proves nothing.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from kvsim.costmodel.kernels import blend
from kvsim.hardware.profile import AllReduceAlgorithm


def nelder_mead(
    f: Callable[[np.ndarray], float], x0: np.ndarray, step: float = 0.3, iterations: int = 600
) -> np.ndarray:
    """Minimise ``f`` from ``x0`` (Nelder & Mead, Computer Journal 1965; standard coefficients)."""
    n = len(x0)
    simplex = [np.asarray(x0, dtype=np.float64)]
    for i in range(n):
        x = simplex[0].copy()
        x[i] += step
        simplex.append(x)
    values = [f(x) for x in simplex]
    for _ in range(iterations):
        order = np.argsort(values)
        simplex = [simplex[i] for i in order]
        values = [values[i] for i in order]
        centroid = np.mean(simplex[:-1], axis=0)
        worst = simplex[-1]
        reflected = centroid + (centroid - worst)
        fr = f(reflected)
        if fr < values[0]:
            expanded = centroid + 2.0 * (centroid - worst)
            fe = f(expanded)
            simplex[-1], values[-1] = (expanded, fe) if fe < fr else (reflected, fr)
        elif fr < values[-2]:
            simplex[-1], values[-1] = reflected, fr
        else:
            contracted = centroid + 0.5 * (worst - centroid)
            fc = f(contracted)
            if fc < values[-1]:
                simplex[-1], values[-1] = contracted, fc
            else:  # shrink towards the best point
                best = simplex[0]
                simplex = [best + 0.5 * (x - best) for x in simplex]
                values = [f(x) for x in simplex]
    return simplex[int(np.argmin(values))]


def _msle(predicted: np.ndarray, measured: np.ndarray) -> float:
    return float(np.mean(np.log(predicted / measured) ** 2))


@dataclass(frozen=True)
class KernelPoints:
    """Measured kernels: the work each did (FLOPs, bytes, kernel count) and its seconds."""

    flops: np.ndarray
    nbytes: np.ndarray
    kernels: np.ndarray
    seconds: np.ndarray

    def take(self, mask: np.ndarray) -> KernelPoints:
        return KernelPoints(
            self.flops[mask], self.nbytes[mask], self.kernels[mask], self.seconds[mask]
        )


@dataclass(frozen=True)
class KernelFit:
    """Efficiencies and fixed cost of one kernel family; ``predict`` is kernels.KernelRates'."""

    compute: float  # achieved / peak FLOP/s
    memory: float  # achieved / peak bytes/s
    ridge: float  # p of the p-norm
    floor_s: float  # per kernel

    def predict(self, p: KernelPoints, peak_flops: float, peak_bytes: float) -> np.ndarray:
        c = p.flops / (peak_flops * self.compute)
        m = p.nbytes / (peak_bytes * self.memory)
        return p.kernels * self.floor_s + blend(c, m, self.ridge)


def fit_kernels(
    p: KernelPoints,
    peak_flops: float,
    peak_bytes: float,
    *,
    memory: float | None = None,
    ridge: float | None = None,
) -> KernelFit:
    """Compute and memory efficiency, ridge sharpness and floor that best fit ``p``; pass
    ``memory`` / ``ridge`` to hold them (attention reuses the GEMMs' memory efficiency)."""

    def unpack(x: np.ndarray) -> KernelFit:
        mem = memory if memory is not None else min(1.0, math.exp(x[1]))
        rid = ridge if ridge is not None else 1.0 + math.exp(x[2])
        return KernelFit(min(1.0, math.exp(x[0])), mem, rid, math.exp(x[3]))

    def loss(x: np.ndarray) -> float:
        return _msle(unpack(x).predict(p, peak_flops, peak_bytes), p.seconds)

    x = nelder_mead(loss, np.array([math.log(0.7), math.log(0.8), math.log(2.0), math.log(3e-6)]))
    x = nelder_mead(loss, x, step=0.1)
    return unpack(x)


def fit_memory_kernels(p: KernelPoints, peak_bytes: float) -> KernelFit:
    """Memory-bound kernels (elementwise): bandwidth efficiency and floor only."""

    def unpack(x: np.ndarray) -> KernelFit:
        return KernelFit(1.0, min(1.0, math.exp(x[0])), math.inf, math.exp(x[1]))

    def loss(x: np.ndarray) -> float:
        return _msle(unpack(x).predict(p, 1e30, peak_bytes), p.seconds)

    return unpack(nelder_mead(loss, np.array([math.log(0.7), math.log(3e-6)])))


@dataclass(frozen=True)
class AllReducePoints:
    gpus: np.ndarray
    nbytes: np.ndarray
    seconds: np.ndarray

    def take(self, mask: np.ndarray) -> AllReducePoints:
        return AllReducePoints(self.gpus[mask], self.nbytes[mask], self.seconds[mask])


def predict_allreduce(a: AllReduceAlgorithm, p: AllReducePoints) -> np.ndarray:
    moved = p.nbytes * 2.0 * (p.gpus - 1) / p.gpus
    return a.latency_s + a.latency_per_gpu_s * (p.gpus - 1) + moved / a.bus_bandwidth_bytes_per_s


def fit_allreduce(p: AllReducePoints, name: str = "ring") -> AllReduceAlgorithm:
    """Latency, latency per extra GPU and bus bandwidth of one algorithm over all group sizes."""

    def unpack(x: np.ndarray) -> AllReduceAlgorithm:
        return AllReduceAlgorithm(name, math.exp(x[0]), math.exp(x[1]), math.exp(x[2]))

    def loss(x: np.ndarray) -> float:
        return _msle(predict_allreduce(unpack(x), p), p.seconds)

    x0 = np.array([math.log(10e-6), math.log(3e-6), math.log(300e9)])
    x = nelder_mead(loss, x0, step=0.5)
    return unpack(nelder_mead(loss, x, step=0.1))


def error_summary(predicted: np.ndarray, measured: np.ndarray) -> dict[str, float]:
    """Signed relative errors: median |error|, the worst, and the median signed bias."""
    err = predicted / measured - 1.0
    return {
        "points": int(err.size),
        "median_abs": float(np.median(np.abs(err))),
        "p90_abs": float(np.quantile(np.abs(err), 0.9)),
        "worst_abs": float(np.max(np.abs(err))),
        "bias": float(np.median(err)),
    }
