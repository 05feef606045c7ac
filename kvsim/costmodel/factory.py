"""Where a run's cost model is chosen: measured tables when they apply, else the roofline.

The engine asks only for `make_cost_model` and the `CostModel` type; which model answered, and
why, travels with it (``kind``, ``reason``) into the run summary.
"""

from __future__ import annotations

from kvsim.costmodel.measured import MeasuredCostModel, mismatch
from kvsim.costmodel.roofline import RooflineCostModel
from kvsim.engines import DEFAULT_ENGINE, EngineProfile, load_engine
from kvsim.hardware.measured_tables import parse_measured, raise_config_error
from kvsim.hardware.profile import HardwareProfile
from kvsim.models import ModelSpec

CostModel = MeasuredCostModel | RooflineCostModel
"""What the engine needs: `iteration_time_s`, `decode_run_ends_s`, `prefill_time_s`,
`block_recompute_s`, and `kind` / `reason` for the summary."""


def make_cost_model(
    model: ModelSpec,
    profile: HardwareProfile,
    *,
    tp: int = 1,
    kv_dtype: str = "bf16",
    weight_dtype: str = "bf16",
    engine: EngineProfile | str | None = DEFAULT_ENGINE,
) -> CostModel:
    """The measured model when the profile has tables for this model, TP and dtype; else the
    roofline. Either has ``.kind`` ("measured" / "roofline") and ``.reason`` for the summary.
    ``engine``: the serving engine whose kernel terms, all-reduce and CPU terms apply, by
    profile or name (default: the engine a run uses when none is named); None: the hardware
    profile's own terms, as code that prices kernels without an engine wants."""
    if isinstance(engine, str):
        engine = load_engine(engine)
    if profile.measured:
        tables = parse_measured(profile.measured, raise_config_error)
        reason = mismatch(tables, model, tp, kv_dtype, weight_dtype)
        if reason is None:
            return MeasuredCostModel(
                model,
                profile,
                tp=tp,
                kv_dtype=kv_dtype,
                weight_dtype=weight_dtype,
                tables=tables,
                engine=engine,
            )
    else:
        reason = "the profile has no measured tables"
    cost = RooflineCostModel(
        model, profile, tp=tp, kv_dtype=kv_dtype, weight_dtype=weight_dtype, engine=engine
    )
    cost.reason = reason
    return cost
