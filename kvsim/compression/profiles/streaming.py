"""``streaming``: StreamingLLM's attention sinks plus a rolling window of recent tokens.

Xiao et al., arXiv 2309.17453. Memory per head is ``min(n, sinks + window)`` over the whole
context, so it stays constant once the window is full. The sink tokens stay at their positions
(our model: only pages of sink tokens stay reusable by hash).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar

from kvsim.compression.base import Amount, Compression, Key


class StreamingLLM(Compression):
    name = "streaming"
    summary = "attention sinks plus a rolling window of recent tokens; constant memory"
    source = "StreamingLLM, Xiao et al., arXiv 2309.17453"
    keys: ClassVar[Mapping[str, Key]] = {
        "sinks": Key("int", 4, "Initial 'attention sink' tokens kept (StreamingLLM: 4)."),
        "window": Key(
            "int",
            2000,
            "Recent tokens kept (StreamingLLM's examples/run_streaming_llama.py: "
            "recent_size 2000).",
        ),
    }
    drops_tokens = True
    budget_note = (
        "; StreamingLLM's perplexity tables (arXiv 2309.17453, Tables 1-2) have no full-KV score"
    )

    def keep(self, tokens: int, layer: int | None) -> int:
        return self.param("sinks") + self.param("window")

    @property
    def exact_tokens(self) -> int:
        return self.param("sinks")

    def quality_budget(self) -> tuple[Amount, str]:
        sinks, window = self.param("sinks"), self.param("window")
        return sinks + window, f"sinks+window {sinks}+{window}"
