"""Capacity planning: the cheapest fleet that meets p99 SLOs at each offered load.

    from kvsim.plan import PlanSettings, parse_rates, resolve_rates, run_plan, serial_runner
    settings = PlanSettings(RunConfig(trace="mooncake-conversation", max_requests=500), 8.0, 0.1)
    result = run_plan(settings, resolve_rates(parse_rates("1x,2x"), 3.0), serial_runner)
    result.frontier[0].winner.deployment

The search is in `kvsim.plan.planner`, the replica search in `kvsim.plan.search`, the runner
interface (serial, or kvsim.sweep's pool and Ray executors) in `kvsim.plan.runner`.
"""

from kvsim.plan.deployment import Deployment, Shape
from kvsim.plan.planner import (
    DEFAULT_ROUTERS,
    Evaluation,
    PlanResult,
    PlanSettings,
    RatePlan,
    check_runs,
    check_settings,
    miss_reason,
)
from kvsim.plan.planner import plan as run_plan
from kvsim.plan.rates import Rate, parse_rates, resolve_rates, trace_rate_per_s
from kvsim.plan.report import format_frontier, pareto_front, plan_json, write_plots
from kvsim.plan.runner import CachedRunner, Runner, SweepRunner, serial_runner
from kvsim.plan.search import ReplicaSearch

__all__ = [
    "DEFAULT_ROUTERS",
    "CachedRunner",
    "Deployment",
    "Evaluation",
    "PlanResult",
    "PlanSettings",
    "Rate",
    "RatePlan",
    "ReplicaSearch",
    "Runner",
    "Shape",
    "SweepRunner",
    "check_runs",
    "check_settings",
    "format_frontier",
    "miss_reason",
    "pareto_front",
    "parse_rates",
    "plan_json",
    "resolve_rates",
    "run_plan",
    "serial_runner",
    "trace_rate_per_s",
    "write_plots",
]
