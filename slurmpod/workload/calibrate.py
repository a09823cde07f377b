"""Measure this machine's dense float32 matmul throughput (TFLOP/s) with numpy.

The sandbox has no GPUs; its site's "GPU" peak is this measured number, so MFU figures from the
sandbox workload compare real numpy matrix work against what this CPU can actually do.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Calibration:
    peak_tflops: float  # best observed, float32
    median_tflops: float
    size: int
    repeats: int
    seconds: float


def matmul_tflops(size: int = 1024, repeats: int = 7, warmup: int = 2,
                  dtype: type = np.float32, seed: int = 0) -> Calibration:
    """Time `repeats` square matmuls of `size` (2·n³ FLOPs each); best and median TFLOP/s.

    The best of several runs is the peak (least disturbed by other processes); the median
    is reported next to it so a noisy machine shows.
    """
    if size < 16 or repeats < 1:
        raise ValueError("size must be >= 16 and repeats >= 1")
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((size, size), dtype=np.float32).astype(dtype, copy=False)
    b = rng.standard_normal((size, size), dtype=np.float32).astype(dtype, copy=False)
    out = np.empty((size, size), dtype=dtype)
    for _ in range(warmup):
        np.matmul(a, b, out=out)
    times = []
    t_all = time.perf_counter()
    for _ in range(repeats):
        t0 = time.perf_counter()
        np.matmul(a, b, out=out)
        times.append(time.perf_counter() - t0)
    total = time.perf_counter() - t_all
    flops = 2.0 * size**3
    rates = sorted(flops / t / 1e12 for t in times if t > 0)
    return Calibration(peak_tflops=rates[-1], median_tflops=rates[len(rates) // 2], size=size,
                       repeats=repeats, seconds=total)


def peak_tflops(size: int = 1024, repeats: int = 7) -> float:
    """The sandbox "GPU" peak: this CPU's best measured float32 matmul TFLOP/s."""
    return matmul_tflops(size, repeats).peak_tflops


def main() -> None:  # python -m slurmpod.workload.calibrate
    for n in (256, 512, 1024, 2048):
        c = matmul_tflops(n)
        print(f"n={n:5d}  peak {c.peak_tflops * 1e3:8.1f} GFLOP/s  "
              f"median {c.median_tflops * 1e3:8.1f} GFLOP/s  ({c.seconds:.2f} s)")


if __name__ == "__main__":
    main()
