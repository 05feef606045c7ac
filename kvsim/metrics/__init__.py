"""What a run measured: columnar recorders filled during the run (per request, timeline, tiers,
links), turned into Arrow tables and a summary only at the end."""

from kvsim.metrics.summary import Slo, summarize

__all__ = ["Slo", "summarize"]
