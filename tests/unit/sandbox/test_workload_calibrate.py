"""calibrate: the sandbox "GPU" peak is a measured float32 matmul rate of this CPU."""

from __future__ import annotations

import time

import numpy as np
import pytest

from slurmpod.sandbox.workload.calibrate import (
    Calibration,
    matmul_tflops,
    peak_tflops,
    robust_peak,
    sample_peak,
)


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


# -- the sandbox peak: robust to load during the measurement -------------------------------------

def loaded_samples(quiet: float, n: int, quiet_share: float, seed: int) -> list[float]:
    """Rates of `n` timed matmuls on a busy machine: a few undisturbed ones within ±0.5 % of
    the quiet rate (timer and cache jitter), the rest slowed down by other processes by 5-80 %
    (load never speeds a fixed amount of work up)."""
    rng = np.random.default_rng(seed)
    quiet_n = max(2, round(n * quiet_share))
    out = list(quiet * (1 + rng.uniform(-0.005, 0.005, quiet_n)))
    out += list(quiet * (1 - rng.uniform(0.05, 0.8, n - quiet_n)))
    rng.shuffle(out)
    return out


@pytest.mark.parametrize("seed", range(20))
@pytest.mark.parametrize("quiet_share", [0.1, 0.3, 0.9])
def test_robust_peak_of_loaded_samples_is_the_quiet_rate(seed: int, quiet_share: float) -> None:
    quiet = 0.26
    samples = loaded_samples(quiet, 24, quiet_share, seed)
    assert robust_peak(samples) == pytest.approx(quiet, rel=0.006)


def test_the_median_would_follow_the_load() -> None:
    # Why not the median (or the mean): with most samples disturbed it is a disturbed one.
    samples = loaded_samples(0.26, 24, 0.1, seed=1)
    assert float(np.median(samples)) < 0.26 * 0.9
    assert robust_peak(samples) > 0.26 * 0.99


def test_one_freak_fast_sample_does_not_set_the_peak() -> None:
    samples = [0.25, 0.26, 0.2, 0.26, 0.1, 9.0]
    assert robust_peak(samples) == 0.26
    assert robust_peak([0.2, 0.3]) == 0.3 and robust_peak([0.2]) == 0.2  # too few to drop one
    assert robust_peak([0.2, float("nan"), float("inf"), -1.0, 0.0]) == 0.2
    with pytest.raises(ValueError):
        robust_peak([0.0, float("nan")])


def test_sample_peak_spreads_rounds_and_keeps_every_sample() -> None:
    calls: list[tuple[int, int]] = []
    pauses: list[float] = []
    rounds = iter([[0.1, 0.12], [0.26, 0.259], [0.2, 0.05]])  # the quiet moment is round 2

    def timing(size: int, repeats: int) -> Calibration:
        calls.append((size, repeats))
        rates = next(rounds)
        return Calibration(max(rates), min(rates), size, repeats, 0.01, tuple(rates))

    est = sample_peak(size=128, rounds=3, repeats=2, pause_s=0.25, sleep=pauses.append,
                      timing=timing)
    assert calls == [(128, 2)] * 3 and pauses == [0.25, 0.25]  # no pause before the first
    assert est.samples == (0.1, 0.12, 0.26, 0.259, 0.2, 0.05)
    assert est.peak_tflops == 0.259 and est.median_tflops == 0.2 and est.size == 128


def test_sample_peak_measures_for_real() -> None:
    est = sample_peak(size=64, rounds=2, repeats=2, pause_s=0.0)
    assert len(est.samples) == 4 and all(r > 0 for r in est.samples)
    assert est.peak_tflops <= max(est.samples)
