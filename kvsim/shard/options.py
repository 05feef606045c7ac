"""The sharding options `kvsim run` and `kvsim plan` share."""

from __future__ import annotations

import click

from kvsim.shard.windows import WARMUP_S

warmup_option = click.option(
    "--warmup",
    "warmup_s",
    type=float,
    default=WARMUP_S,
    show_default=True,
    help="With --shards: seconds of timed simulation before each window, not counted.",
)
