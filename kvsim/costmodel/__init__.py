"""The cost model: what a batch's iteration, a prefill or a KV transfer costs in seconds.

A run gets its model from ``make_cost_model``: measured tables from calibration when the profile
carries them for this model, TP degree and dtype, else the per-kernel roofline of the profile.

- ``factory``: the choice (``make_cost_model``, the ``CostModel`` type);
- ``roofline``: iteration time as a sum of per-kernel rooflines (``RooflineCostModel``);
- ``kernels``: what one kernel costs beyond a plain roofline (floors, soft ridge, collectives);
- ``measured``: iteration time from measured tables (``MeasuredCostModel``);
- ``tables``: the profile's ``[measured]`` section, parsed and checked (no pricing);
- ``interpolate``: measured curves and grids that relax to a roofline outside their range;
- ``family_rooflines``: the roofline each measured kernel family relaxes to;
- ``shapes``: the model's GEMM and elementwise shapes that calibration measures;
- ``pairs``: (query, key) pairs of a prefill chunk;
- ``chunked_prefill``: a whole prefill's time from the price of single iterations;
- ``transfers``: HBM to/from DRAM and NVMe copies (``TransferModel``).
"""

from kvsim.costmodel.factory import CostModel, make_cost_model
from kvsim.costmodel.measured import MeasuredCostModel
from kvsim.costmodel.roofline import RooflineCostModel
from kvsim.costmodel.transfers import TransferModel

__all__ = [
    "CostModel",
    "MeasuredCostModel",
    "RooflineCostModel",
    "TransferModel",
    "make_cost_model",
]
