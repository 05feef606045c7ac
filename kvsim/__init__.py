"""kvsim: a discrete-event simulator of KV-cache management in LLM serving."""

__version__ = "0.1.0"
