"""Serving-engine profiles: what belongs to the engine (vLLM, SGLang, TensorRT-LLM, by version)
rather than to the GPU: CUDA-graph decode, scheduling overhead and overlap, the front end's cost
per request, the all-reduce implementation, and the engine's default limits.

One TOML file per engine version in ``kvsim/engines/profiles/``, each number with its source;
``--engine NAME[@VERSION]`` picks one (a bare NAME is that engine's current version).
"""

from kvsim.engines.profile import DEFAULT_ENGINE, EngineProfile, parse_engine_profile
from kvsim.engines.registry import engine_names, load_engine

__all__ = [
    "DEFAULT_ENGINE",
    "EngineProfile",
    "engine_names",
    "load_engine",
    "parse_engine_profile",
]
