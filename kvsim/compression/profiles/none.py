"""``none``: no compression. The engine runs its uncompressed path (salt 0, plain pages)."""

from __future__ import annotations

from kvsim.compression.base import Compression
from kvsim.compression.quality import QualityPoint

#: The uncompressed model is its own baseline.
POINT = QualityPoint(
    benchmark="any",
    model="any",
    retained=1.0,
    score=None,
    baseline=None,
    source="definition",
    note="uncompressed: the baseline itself",
)


class NoCompression(Compression):
    """Every token at the base KV dtype; what every other profile is measured against."""

    name = "none"
    summary = "no compression"
    source = "-"
    identity = True

    def fixed_quality_points(self) -> list[QualityPoint]:
        return [POINT]
