"""The processor-sharing link: closed forms for one and for k concurrent transfers."""

from __future__ import annotations

import pytest
import simpy
from hypothesis import given, settings
from hypothesis import strategies as st

from kvsim.kvcache.link import Link

GB = 1e9


def finish_times(link_args, starts_and_sizes, write=False):
    env = simpy.Environment()
    link = Link(env, "test", *link_args)
    ends: dict[int, float] = {}

    def go(i, start, nbytes):
        yield env.timeout(start)
        yield link.transfer(nbytes, write=write)
        ends[i] = env.now

    for i, (start, nbytes) in enumerate(starts_and_sizes):
        env.process(go(i, start, nbytes))
    env.run()
    return [ends[i] for i in range(len(starts_and_sizes))], link


def test_one_transfer_is_latency_plus_bytes_over_bandwidth():
    (end,), link = finish_times((25 * GB, 20 * GB, 3e-6), [(0.0, 2 * 2**20)])
    assert end == pytest.approx(3e-6 + 2 * 2**20 / (25 * GB), rel=1e-12)
    assert link.stats.bytes_read == 2 * 2**20 and link.stats.queueing_s == pytest.approx(0)


def test_write_uses_write_bandwidth():
    (end,), _ = finish_times((25 * GB, 10 * GB, 0.0), [(0.0, 10**9)], write=True)
    assert end == pytest.approx(0.1, rel=1e-12)


@pytest.mark.parametrize("k", [2, 3, 8])
def test_k_equal_transfers_each_take_k_times_as_long(k):
    solo = 10**8 / (50 * GB)
    ends, link = finish_times((50 * GB, 50 * GB, 0.0), [(0.0, 10**8)] * k)
    for end in ends:
        assert end == pytest.approx(k * solo, rel=1e-9)
    assert link.stats.busy_s == pytest.approx(k * solo, rel=1e-9)
    assert link.stats.queueing_s == pytest.approx(k * (k - 1) * solo, rel=1e-9)


def test_a_late_transfer_shares_only_while_overlapping():
    # A: 1 s alone; B joins at 0.5 s: both at half rate until A ends at 1.5 s, B alone after
    ends, _ = finish_times((1.0, 1.0, 0.0), [(0.0, 1.0), (0.5, 1.0)])
    assert ends == pytest.approx([1.5, 2.0])


@settings(max_examples=50, deadline=None)
@given(st.lists(st.tuples(st.floats(0, 2), st.integers(1, 10**6)), min_size=1, max_size=12))
def test_work_is_conserved(transfers):
    ends, link = finish_times((1e6, 1e6, 0.0), transfers)
    total_work = sum(n for _, n in transfers) / 1e6
    assert link.stats.busy_s == pytest.approx(total_work, rel=1e-9, abs=1e-9)
    for (start, nbytes), end in zip(transfers, ends, strict=True):
        assert end >= start + nbytes / 1e6 - 1e-9  # never faster than alone
    assert max(ends) >= min(s for s, _ in transfers) + total_work - 1e-9


def test_write_backs_yield_to_loads():
    env = simpy.Environment()
    link = Link(env, "test", 1.0, 1.0, 0.0)
    ends = {}

    def go(name, start, nbytes, write):
        yield env.timeout(start)
        yield link.transfer(nbytes, write=write)
        ends[name] = env.now

    env.process(go("write", 0.0, 2.0, True))
    env.process(go("load", 0.5, 1.0, False))
    env.run()
    # the write ran alone for 0.5 s, paused for the whole 1 s load, then finished its 1.5 s
    assert ends == pytest.approx({"load": 1.5, "write": 3.0})


@settings(max_examples=60, deadline=None)
@given(
    st.floats(1e3, 1e9),  # a simulated clock far from zero, where a float's step is coarse
    st.lists(st.tuples(st.floats(0, 1e-3), st.integers(1, 10**7)), min_size=1, max_size=8),
    st.booleans(),
)
def test_transfers_end_at_any_clock(clock_s, transfers, write):
    """Regression (issue 10): at t = 16,384 s a transfer with 1.4e-12 s of work left could not
    move the clock, and the link rescheduled it forever. Every transfer must end, at any time."""
    env = simpy.Environment(initial_time=clock_s)
    link = Link(env, "test", 7.3e9, 3.1e9, 1e-6)
    ends: list[float] = []

    def go(start, nbytes):
        yield env.timeout(start)
        yield link.transfer(nbytes, write=write)
        ends.append(env.now)

    for start, nbytes in transfers:
        env.process(go(start, nbytes))
    steps = 0
    while env.peek() != float("inf"):
        env.step()
        steps += 1
        assert steps < 100 * len(transfers) + 100, "the link keeps rescheduling"
    assert len(ends) == len(transfers)
    total = sum(n for _, n in transfers) / (3.1e9 if write else 7.3e9)
    assert link.stats.busy_s == pytest.approx(total, rel=1e-6, abs=1e-6)


def test_transfer_with_rounding_residue_completes_at_16384_s():
    env = simpy.Environment(initial_time=16_384.0)
    link = Link(env, "test", 1.0, 1.0, 0.0)
    # work that the clock cannot represent exactly at this time
    events = [link.transfer(1.4e-12), link.transfer(1.0 + 1.4e-12)]
    env.run(until=env.now + 10)
    assert all(ev.triggered for ev in events)
