"""Calibration: microbenchmarks on the target device, written into a profile's measured tables.

Importing this package does not import PyTorch; ``run_calibration`` does, when it runs.
"""

from kvsim.calibrate.cli import NEEDS_TORCH, calibrate, run_calibration

__all__ = ["NEEDS_TORCH", "calibrate", "run_calibration"]
