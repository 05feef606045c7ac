"""What the serving engine adds to the GPU's kernels: its own kernel terms, its all-reduce, and
how its CPU work (launches, scheduling) adds to or hides behind the GPU's.

An iteration's GPU time is the sum of its kernels (kvsim.costmodel.roofline). Around it:

- **CUDA graphs.** An iteration of at most ``cuda_graph_max_tokens`` tokens replays a captured
  graph: its kernels start back to back. A larger one launches each kernel from the CPU, so it
  takes at least ``kernels x eager_launch_s`` however small its kernels are.
- **Scheduling.** The engine's CPU time per iteration (schedule, prepare inputs, sample) adds to
  the GPU time, or, with ``overlap_scheduling`` (vLLM V1's async scheduling, SGLang's overlap
  scheduler), runs while the GPU computes, so an iteration takes the longer of the two.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from kvsim.engines import EngineProfile
from kvsim.hardware.profile import HardwareProfile


def under_engine(profile: HardwareProfile, engine: EngineProfile | None) -> HardwareProfile:
    """``profile`` as its kernels run under ``engine``: the ``[engines.NAME]`` kernel terms the
    engine asks for replace [efficiency]'s, its CPU terms come from the engine profile unless
    the hardware profile gives its own (measured on that host, or in [engines.NAME]), and only
    its all-reduce implementations remain."""
    if engine is None:
        return profile
    kernels = profile.engines.get(engine.kernels) if engine.kernels else None
    terms = dict(kernels.efficiency) if kernels is not None else {}
    for key in ("iteration_overhead_s", "request_overhead_s"):
        if getattr(profile.efficiency, key) is None:
            terms.setdefault(key, getattr(engine, key))
    algorithms = profile.allreduce
    if kernels is not None and kernels.allreduce:
        algorithms = kernels.allreduce
    if engine.allreduce:
        algorithms = tuple(a for a in algorithms if a.name in engine.allreduce) or algorithms
    return dataclasses.replace(
        profile,
        efficiency=dataclasses.replace(profile.efficiency, **terms),
        allreduce=algorithms,
    )


def kernel_terms_note(profile: HardwareProfile, engine: EngineProfile | None) -> str:
    """Where the run's kernel terms come from, for the summary and ``kvsim profile show``."""
    own = [k for k in ("iteration_overhead_s", "request_overhead_s")
           if getattr(profile.efficiency, k) is not None]  # fmt: skip
    cpu = f"; {' and '.join(own)} from {profile.name} [efficiency]" if own and engine else ""
    if engine is None or not engine.kernels:
        return f"{profile.name} [efficiency]{cpu}"
    if engine.kernels in profile.engines:
        return f"{profile.name} [engines.{engine.kernels}]{cpu}"
    return (
        f"{profile.name} [efficiency] (assumption: no kernel terms measured under "
        f"{engine.kernels} for this GPU){cpu}"
    )


@dataclasses.dataclass(frozen=True, slots=True)
class IterationClock:
    """Turns an iteration's GPU seconds into its wall seconds under one engine's CPU terms."""

    overhead_s: float  # the engine's CPU time per iteration
    overlap: bool = False
    graph_max_tokens: int = 1 << 62  # no engine given: as if every iteration were graphed
    launch_floor_s: float = 0.0  # kernels per iteration x seconds per eager launch

    @classmethod
    def of(cls, engine: EngineProfile | None, overhead_s: float, kernels: int) -> IterationClock:
        if engine is None:
            return cls(overhead_s)
        return cls(
            overhead_s,
            engine.overlap_scheduling,
            engine.cuda_graph_max_tokens,
            kernels * engine.eager_launch_s,
        )

    def seconds(self, gpu_s: float, tokens: int) -> float:
        """One iteration of ``tokens`` tokens whose kernels take ``gpu_s`` on the GPU."""
        if tokens > self.graph_max_tokens and gpu_s < self.launch_floor_s:
            gpu_s = self.launch_floor_s
        if self.overlap:
            return max(gpu_s, self.overhead_s)
        return gpu_s + self.overhead_s

    def steps(self, gpu_s: np.ndarray, tokens: int) -> np.ndarray:
        """``seconds`` of each of a run of iterations of ``tokens`` tokens each."""
        if tokens > self.graph_max_tokens and self.launch_floor_s > 0:
            gpu_s = np.maximum(gpu_s, self.launch_floor_s)
        if self.overlap:
            return np.maximum(gpu_s, self.overhead_s)
        return gpu_s + self.overhead_s
