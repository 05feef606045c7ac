"""``infinigen``: KV offloaded to CPU DRAM; each layer fetches only the tokens a partial QK
speculates will matter.

Lee et al., arXiv 2406.19707. The GPU keeps every token's *partial key* (``partial`` of the key
dims at the base width) for speculation, so it keeps ``n`` tokens' summaries; its full KV,
``n × kv_bytes_per_token``, is in CPU DRAM. Each decode step reads (fetches over the host link)
``⌈budget · n⌉`` tokens of every layer at full width. For MLA the partial slice is taken of the
latent (our reconstruction: InfiniGen was built for multi-head attention).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from fractions import Fraction
from typing import TYPE_CHECKING, ClassVar

from kvsim.compression.base import Compression, Key, WorkAdder, check_tokens

if TYPE_CHECKING:
    from kvsim.compression.sizing import LayerBytes


class InfiniGen(Compression):
    name = "infinigen"
    summary = "KV offloaded to CPU DRAM; each layer fetches only the tokens a partial QK speculates"
    source = "InfiniGen, Lee et al., arXiv 2406.19707"
    keys: ClassVar[Mapping[str, Key]] = {
        "budget": Key(
            "ratio",
            Fraction(1, 5),
            "Fraction of the context each layer fetches per decode step: the budget 0.2 "
            "of InfiniGen's artifact example (accuracy/README.md); InfiniGen itself "
            "fetches what an attention-score threshold selects, at most this budget.",
        ),
        "partial": Key(
            "ratio",
            Fraction(1, 5),
            "Fraction of the key dims kept as the GPU-resident partial keys for "
            "speculation (partial_weight_ratio 0.2 in the same artifact example).",
        ),
    }
    drops_tokens = True  # reads a budget of the context per step
    offloaded = True  # ... from its full KV in CPU DRAM
    unpublished = (
        "InfiniGen (arXiv 2406.19707): only the abstract ('substantially better model "
        "accuracy') and the artifact repo snu-comparch/InfiniGen (accuracy/README.md: scripts "
        "for Figs 11-13 and Table 2, no numbers) were found; no copy of its accuracy results"
    )

    def read_tokens(
        self, context_tokens: int, layer: int | None = None, generated_tokens: int = 0
    ) -> int:
        n, _ = check_tokens(context_tokens, generated_tokens)
        return min(n, math.ceil(self.param("budget") * n))

    def gpu_token_bytes(self, lb: LayerBytes) -> float:
        """The GPU-resident partial key per token: ``partial`` of the key dims, base width."""
        g = lb.group
        dims = g.kv_lora_rank + g.qk_rope_head_dim if g.kind == "mla" else g.head_dim_k
        total_dims = dims if g.kind == "mla" else g.head_dim_k + g.head_dim_v
        per_element = lb.base_bytes / (lb.heads * total_dims)
        return lb.heads * math.ceil(self.param("partial") * dims) * per_element

    def add_layer_work(
        self, add: WorkAdder, layer: int, lb: LayerBytes, q_heads: int, key_dims: int
    ) -> None:
        # the partial query against every partial key, then top-k over the scores
        partial = math.ceil(self.param("partial") * key_dims)
        add("speculate_flops_per_context_token", q_heads * 2.0 * partial)
        add("select_items_per_context_token", q_heads)
