"""The sandbox's site file with its emulated GPUs' peak measured on this machine's CPU.

The sandbox workload does its "GPU" work as numpy float32 matmuls, so the honest peak for MFU is
what this CPU's matmul reaches (`slurmpod.sandbox.workload.calibrate`). `sandbox up` writes the
site with that number as `<state>/site.toml`, and `sandbox env` points `$SLURMPOD_SITE` at it, so
plan, submit, the hooks and reports all use the same measured peak.

`up` may run while the machine is busy (other jobs, test suites), which only ever slows matmuls
down, so the peak is the second-best of 24 matmuls spread over about a second
(`calibrate.sample_peak`), not one quick burst: a peak measured low would let MFU pass 100 %.
The workload itself never runs faster than this peak (docs/workload.md, "Pacing").
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path
from typing import Any

from slurmpod import __version__


def with_measured_peak(site_data: dict[str, Any], peak_tflops: float) -> dict[str, Any] | None:
    """A copy of the site data with every `emulated` GPU's peak set; None if none is emulated."""
    data = copy.deepcopy(site_data)
    changed = False
    for node_type in data.get("node_types", {}).values():
        gpu = node_type.get("gpu", {})
        if gpu.get("emulated"):
            gpu["peak_tflops_bf16"] = float(f"{peak_tflops:.4g}")
            changed = True
    return data if changed else None


def render_measured_site(site_data: dict[str, Any], peak_tflops: float, source: Path
                         ) -> str | None:
    """TOML text of the measured site, with a header saying where the peak came from."""
    import tomli_w  # lazy: start-up (tomli_w only when used)

    data = with_measured_peak(site_data, peak_tflops)
    if data is None:
        return None
    head = (f"# Written by slurmpod {__version__} `sandbox up` from {source}.\n"
            f"# peak_tflops_bf16 of emulated GPUs = this CPU's measured float32 matmul rate "
            f"({peak_tflops * 1e3:.2f} GFLOP/s, robust to load: calibrate.sample_peak).\n")
    return head + tomli_w.dumps(data)


def measure_peak() -> float:
    """This CPU's float32 matmul peak, TFLOP/s, robust to load during the measurement."""
    from slurmpod.sandbox.workload.calibrate import sample_peak  # lazy: start-up

    return sample_peak().peak_tflops


def write_measured_site(source: Path, target: Path,
                        measure: Callable[[], float] = measure_peak) -> float | None:
    """Measure and write `target`; returns the peak, or None (and removes a stale `target`)
    when the site has no emulated GPU."""
    from slurmpod.config import read_toml  # lazy: start-up
    from slurmpod.fsutil import write_atomic  # lazy: start-up

    data = read_toml(source)
    if with_measured_peak(data, 1.0) is None:
        target.unlink(missing_ok=True)
        return None
    peak = measure()
    text = render_measured_site(data, peak, source)
    assert text is not None  # emulated GPUs were found above
    write_atomic(target, text)
    return peak
