"""Roofline time of an op: ``max(FLOPs / (peak * eff_c), bytes / (bandwidth * eff_m)) + k * overhead``.

Units: FLOPs, bytes, FLOP/s, bytes/s, seconds. Efficiencies come from the hardware
profile's curves; a constant curve (the shipped default) costs one multiply, a measured
curve is interpolated at the op's size (FLOPs for compute, bytes for memory).
"""

from __future__ import annotations

import numpy as np

from hwprofiles.schema import EfficiencyCurve, HardwareProfile


class Roof:
    """A hardware profile's roofs as inverse rates, for fast vectorized pricing.

    ``compute(dtype, curve, flops)`` returns seconds per FLOP; ``memory(curve, nbytes)``
    seconds per byte; a constant curve returns a scalar without looking at the size.
    """

    def __init__(self, hw: HardwareProfile):
        self.hw = hw
        self.bw = hw.memory_bandwidth.value
        self.overhead = hw.kernel_overhead_s.value

    def _inv(self, rate: float, curve: EfficiencyCurve, size: np.ndarray | float
             ) -> np.ndarray | float:
        if curve.is_constant:
            return 1.0 / (rate * curve.points[0][1])
        return 1.0 / (rate * curve.at(size))

    def matmul(self, dtype: str, flops: np.ndarray | float) -> np.ndarray | float:
        """Seconds per FLOP of a dense GEMM computing in ``dtype``."""
        return self._inv(self.hw.peak(dtype), self.hw.efficiency.matmul[dtype], flops)

    def compute(self, dtype: str, curve: EfficiencyCurve, flops: np.ndarray | float
                ) -> np.ndarray | float:
        """Seconds per FLOP at ``dtype`` peak under ``curve``."""
        return self._inv(self.hw.peak(dtype), curve, flops)

    def memory(self, nbytes: np.ndarray | float, curve: EfficiencyCurve | None = None
               ) -> np.ndarray | float:
        """Seconds per byte streamed (default curve: ``efficiency.memory``)."""
        return self._inv(self.bw, curve or self.hw.efficiency.memory, nbytes)

    def time(self, flops: np.ndarray | float, nbytes: np.ndarray | float,
             inv_c: np.ndarray | float, inv_m: np.ndarray | float,
             kernels: np.ndarray | float) -> np.ndarray:
        """``max(flops * inv_c, nbytes * inv_m) + kernels * overhead``."""
        return np.maximum(flops * inv_c, nbytes * inv_m) + kernels * self.overhead
