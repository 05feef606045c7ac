"""KV compression profiles (token dropping, quantisation, offloading) and their exact byte cost.

Each profile is one module of ``kvsim.compression.profiles``: a ``Compression`` subclass that
says what it keeps, reads, stores and costs (``kvsim.compression.base``), registered by name.
Models layer: imports ``kvsim.models`` and ``kvsim.errors`` only. See docs/compression.md.
"""

from kvsim.compression.auto import choose, quality_rank
from kvsim.compression.base import Compression, Key, LayerConfig
from kvsim.compression.profiles import (
    DEFAULT_AUTO_CANDIDATES,
    PROFILES,
    parse_compression,
    profile_class,
    profile_names,
    register,
)
from kvsim.compression.quality import QualityPoint, quality, quality_reason
from kvsim.compression.sizing import (
    CompressionWork,
    LayerBytes,
    bytes_per_kept_token,
    compressed_kv_bytes,
    compression_work,
    host_kv_bytes,
    kv_layer_count,
    layer_bytes,
)
from kvsim.compression.solver import solve, synthetic_sensitivity

__all__ = [
    "DEFAULT_AUTO_CANDIDATES",
    "PROFILES",
    "Compression",
    "CompressionWork",
    "Key",
    "LayerBytes",
    "LayerConfig",
    "QualityPoint",
    "bytes_per_kept_token",
    "choose",
    "compressed_kv_bytes",
    "compression_work",
    "host_kv_bytes",
    "kv_layer_count",
    "layer_bytes",
    "parse_compression",
    "profile_class",
    "profile_names",
    "quality",
    "quality_rank",
    "quality_reason",
    "register",
    "solve",
    "synthetic_sensitivity",
]
