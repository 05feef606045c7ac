"""The SimPy serving engine: a replica's scheduler and executor, and the run wiring."""

from kvsim.engine.config import EngineConfig
from kvsim.engine.simulation import RunResult, simulate

__all__ = ["EngineConfig", "RunResult", "simulate"]
