"""Loading cached KV from a lower tier while computing: the finish-time formulas.

vLLM's offloading connector loads a request's cached blocks and only then prefills the rest
(`none`, kvsim's default). Two published schemes overlap the two:

- `layerwise` (CachedAttention / AttentionStore, Gao et al., USENIX ATC'24: layer-wise
  pre-loading): layer l of the prefill runs as soon as layer l's KV has arrived, so the load of
  layer l+1 overlaps the compute of layer l. With L layers, a load of A seconds and a prefill of
  C seconds split evenly over them (a = A/L, c = C/L per layer), layer l's compute can start once
  its KV is in, (l+1) a, and once layer l-1 is done; the last layer ends at
        max over l of ((l+1) a + (L-l) c) = max(A/L + C, A + C/L),
  i.e. the longer of the two plus one layer of the shorter, against A + C without overlap.

- `bidirectional` (Cake, Jin et al., "Compute or Load KV Cache? Why Not Both?", ICML 2025,
  arXiv 2410.03065):
  the cached prefix is computed from its front while it is loaded from its back; the two meet
  where they cross, so the blocks in front of the meeting point are recomputed, not loaded.
  Computing the first s of n cached blocks takes C_front(s) (growing with s), loading the other
  n - s takes A_back(n - s) (shrinking with s); the prefix is ready at
        T(s) = max(C_front(s), A_back(n - s)),
  then the uncached rest of the prompt is computed. T is smallest where the two curves cross:
  the least s with C_front(s) >= A_back(n - s), or the one before it.

Both functions only combine times the caller supplies (from the cost model and the links), so
they hold for any cost model.
"""

from __future__ import annotations

from collections.abc import Callable

LOAD_OVERLAPS: tuple[str, ...] = ("none", "layerwise", "bidirectional")


def layerwise_s(load_s: float, compute_s: float, layers: int) -> float:
    """Finish time of a load of `load_s` pipelined layer by layer with a prefill of `compute_s`
    over `layers` layers: max(A/L + C, A + C/L) (see the module docstring)."""
    layers = max(layers, 1)
    return max(load_s / layers + compute_s, load_s + compute_s / layers)


def bidirectional_split(
    n: int, front_compute_s: Callable[[int], float], back_load_s: Callable[[int], float]
) -> tuple[int, float]:
    """(s, finish): how many of `n` cached blocks to compute from the front while the other
    n - s load from the back, and when both are done, max(C_front(s), A_back(n - s)) at its
    least. `front_compute_s(s)` must not decrease in s, `back_load_s(k)` not decrease in k;
    both are 0 at 0. Binary search: O(log n) calls of each."""
    lo, hi = 0, n  # the least s with C_front(s) >= A_back(n - s) is in [lo, hi]
    while lo < hi:
        mid = (lo + hi) // 2
        if front_compute_s(mid) >= back_load_s(n - mid):
            hi = mid
        else:
            lo = mid + 1
    best_s, best = lo, max(front_compute_s(lo), back_load_s(n - lo))
    if lo > 0:
        before = max(front_compute_s(lo - 1), back_load_s(n - lo + 1))
        if before <= best:
            best_s, best = lo - 1, before
    return best_s, best
