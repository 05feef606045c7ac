"""``quant``: KIVI-style grouped asymmetric quantisation of K and V; recent tokens unquantised.

Liu et al., arXiv 2402.02750: group size 32 and a full-precision residual of the 128 most recent
tokens, as in its experiments and repository examples. Every token is kept; each stores K and V
at ``k`` and ``v`` bits with an fp16 scale and zero-point per group (sizing prices the widths,
the quantising pass and the dequantising reads from ``layer_bits``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from kvsim.compression.base import Compression, Key


class Quant(Compression):
    name = "quant"
    summary = "grouped asymmetric quantisation of K and V, recent tokens unquantised"
    source = "KIVI, Liu et al., arXiv 2402.02750"
    keys: ClassVar[Mapping[str, Key]] = {
        "k": Key("bits", 4, "K bits per element (1-16; 16 stores K unquantised)."),
        "v": Key("bits", 4, "V bits per element (1-16)."),
        "group": Key(
            "int",
            32,
            "Elements per quantisation group; each group stores an fp16 scale and an fp16 "
            "zero-point (KIVI, arXiv 2402.02750: G = 32 in its main experiments).",
        ),
        "residual": Key(
            "count",
            128,
            "Most recent tokens kept unquantised at the base KV dtype (KIVI's residual R = 128).",
        ),
    }
    unpublished = (
        "KIVI (arXiv 2402.02750) publishes k = v = 2 or 4 bits with group 32 and residual 128 "
        "(Tables 3 and 4, and its repo's LongBench tables), and k = v = 2 with group 64 or 128, "
        "residual 128 (Table 5); KVQuant (arXiv 2401.18079) reports perplexity for a different, "
        "non-uniform quantiser, not applied"
    )

    def layer_bits(self, layer: int | None = None) -> tuple[int, int, int]:
        return self.param("k"), self.param("v"), self.param("group")

    def residual_tokens(self) -> int:
        return self.param("residual")

    def quality_keys(self) -> dict[str, Any]:
        k, v = self.param("k"), self.param("v")
        return {
            "bits": k if k == v else None,  # published points quantise K and V alike
            "group": self.param("group"),
            "residual": self.param("residual"),
        }
