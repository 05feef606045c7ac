"""Miss-ratio curves by cache-only replay (no engine): compare policies in seconds."""

from kvsim.mrc.replay import SEMANTICS, BlockSequence, ReplayResult, next_use, replay

__all__ = ["SEMANTICS", "BlockSequence", "ReplayResult", "next_use", "replay"]
