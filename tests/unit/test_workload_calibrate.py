"""calibrate: the sandbox "GPU" peak is a measured float32 matmul rate of this CPU."""

from __future__ import annotations

import time

import numpy as np
import pytest

from slurmpod.workload.calibrate import matmul_tflops, peak_tflops


def test_calibration_is_consistent_with_an_independent_timing() -> None:
    cal = matmul_tflops(size=256, repeats=5)
    assert cal.size == 256 and cal.repeats == 5
    assert 0 < cal.median_tflops <= cal.peak_tflops
    # Independent bound: the best rate cannot beat 2·n³ over the fastest of our own timings by
    # more than the machine's noise; one matmul measured here must take at least
    # 2·n³ / peak seconds minus timer resolution. Compare orders of magnitude only.
    a = np.ones((256, 256), dtype=np.float32)
    t0 = time.perf_counter()
    a @ a
    own = 2 * 256**3 / max(time.perf_counter() - t0, 1e-9) / 1e12
    assert cal.peak_tflops < 1000 * own and own < 1000 * cal.peak_tflops
    assert cal.seconds > 0


def test_peak_function() -> None:
    assert peak_tflops(size=64, repeats=2) > 0


@pytest.mark.parametrize(("size", "repeats"), [(8, 3), (64, 0)])
def test_bad_arguments(size: int, repeats: int) -> None:
    with pytest.raises(ValueError):
        matmul_tflops(size, repeats)
