"""A plugin's own `evict` runs through the guard (issue 45), and its faults are its own."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from kvsim.errors import PluginError
from kvsim.kvcache.block_pool import BlockPool
from kvsim.policies import GuardedPolicy, make_policy

PLUGIN = '''
from kvsim.policies.base import EvictionPolicy


class BatchFifo(EvictionPolicy):
    """FIFO that evicts a whole batch in one call and counts its calls."""

    name = "batch-fifo"
    batches: list = []

    def __init__(self):
        self.order = {}

    def add(self, key, info):
        self.order[key] = None

    def discard(self, key):
        self.order.pop(key, None)

    def victim(self):
        raise AssertionError("victim must not be called: this plugin evicts in batches")

    def evict(self, count):
        BatchFifo.batches.append(count)
        victims = list(self.order)[:count]
        for key in victims:
            del self.order[key]
        return victims

    def __len__(self):
        return len(self.order)


class BrokenEvict(BatchFifo):
    name = "broken-evict"

    def evict(self, count):
        raise ValueError("no batch today")


class PlainFifo(BatchFifo):
    """No `evict` of its own: the guard's base loop over `victim` serves it."""

    name = "plain-fifo"
    evict = EvictionPolicy.evict

    def victim(self):
        return next(iter(self.order))
'''


@pytest.fixture()
def plugin_module(tmp_path: Path) -> Iterator[str]:
    """A third-party policy module importable as ``module:Class``."""
    (tmp_path / "kvsim_test_batch_policy.py").write_text(PLUGIN)
    sys.path.insert(0, str(tmp_path))
    try:
        yield "kvsim_test_batch_policy"
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("kvsim_test_batch_policy", None)


def _fill(pool: BlockPool, blocks: int) -> None:
    """Cache `blocks` distinct blocks and release them, so every one is evictable."""
    hashes = list(range(1, blocks + 1))
    assert pool.allocate(blocks)
    pool.register(hashes, 0, blocks, 0.0)
    pool.release(hashes, list(range(blocks)), 0, 1.0)


def test_plugin_evict_is_called_through_the_guard(plugin_module: str) -> None:
    policy = make_policy(f"{plugin_module}:BatchFifo")
    assert isinstance(policy, GuardedPolicy)
    pool = BlockPool(8, policy)
    _fill(pool, 8)
    assert pool.allocate(3)  # no free block left: the pool asks the policy to evict 3
    assert sys.modules[plugin_module].BatchFifo.batches == [3]
    assert len(policy) == 5


def test_plugin_evict_fault_is_reported_as_its_own(plugin_module: str) -> None:
    policy = make_policy(f"{plugin_module}:BrokenEvict")
    with pytest.raises(PluginError, match=r"^policy '.*BrokenEvict': method 'evict' raised "
                                          r"ValueError: no batch today$"):  # fmt: skip
        policy.evict(2)


def test_plugin_without_evict_uses_guarded_victim(plugin_module: str) -> None:
    policy = make_policy(f"{plugin_module}:PlainFifo")
    pool = BlockPool(4, policy)
    _fill(pool, 4)
    assert pool.allocate(2)
    assert len(policy) == 2
