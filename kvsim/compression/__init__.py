"""KV compression profiles (token dropping, quantisation, offloading) and their exact byte cost.

Models layer: imports ``kvsim.models`` and ``kvsim.errors`` only. See docs/compression.md.
"""

from kvsim.compression.auto import choose, quality_rank
from kvsim.compression.profiles import (
    DEFAULT_AUTO_CANDIDATES,
    PROFILES,
    Compression,
    LayerConfig,
    Profile,
    parse_compression,
)
from kvsim.compression.quality import QualityPoint, quality, quality_reason
from kvsim.compression.sizing import (
    CompressionWork,
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
    "LayerConfig",
    "Profile",
    "QualityPoint",
    "bytes_per_kept_token",
    "choose",
    "compressed_kv_bytes",
    "compression_work",
    "host_kv_bytes",
    "kv_layer_count",
    "layer_bytes",
    "parse_compression",
    "quality",
    "quality_rank",
    "quality_reason",
    "solve",
    "synthetic_sensitivity",
]
