"""Kernel time vs size from measured points: interpolated inside, relaxing to a roofline outside.

- Between measured points, log(time) is interpolated linearly in log(size), the same as
  interpolating log(achieved rate): exact at every measured point and monotone wherever the
  measurements are.
- Outside the measured range the ratio measured/roofline of the nearest edge relaxes to 1 over
  one decade of size, so extrapolation tends to the roofline (the kernel terms of
  RooflineCostModel, kvsim.costmodel.kernels) instead of exploding, and beyond a
  decade it *is* the roofline, except that a larger size never costs less than the largest
  measured one (nor a smaller one more than the smallest).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from kvsim.hardware.measured_tables import Curve

RELAX_DECADES = 1.0  # beyond the measured range, the measured/roofline ratio fades over this
Roofline = Callable[[np.ndarray], np.ndarray]


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


def rate_curve(table: Curve, roofline: Roofline) -> RateCurve:
    """The RateCurve of a measured table, relaxing to ``roofline`` outside it."""
    return RateCurve(np.array(table.x), np.array(table.seconds), roofline)
