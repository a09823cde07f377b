"""The runtime memory reserve measured on a site's own jobs (`slurmpod calibrate`).

`plan` counts a GPU's usable memory as its HBM less `megatron.memory.runtime_reserve`, built
from published figures of other processes. A site's finished Megatron jobs measured theirs:
Megatron's memory reports (`accounting.memreport`, kept in the epilog's record by
`MemoryPeaks.for_record`) give, on the rank that held the most, PyTorch's cache (max reserved -
max allocated) and, with `--log-device-memory-used`, what the process held outside PyTorch
(device memory used - reserved). `fit_reserve` takes the upper quartile of each over the jobs:
three jobs in four needed no more, and no single job, whose log text it controls, moves it.

Log figures are job-controlled, so each is checked against the site's HBM of the job's nodes
(from Slurm's node list and the site file): a report claiming more than the GPU holds is not a
measurement. Pure: the CLI (cli/calibrate.py) does the I/O.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from slurmpod.megatron.memory import MeasuredReserve
from slurmpod.model.memory import RecordedMemory

# The statistic over jobs: the upper quartile.
QUANTILE = 0.75

# Why a job gives no memory point (`slurmpod calibrate --json`'s `memory.skipped` keys).
MEMORY_SKIP_REASONS = {
    "no-memory-report": "no Megatron memory report (`memory (MB) | allocated: ...`) in the record",
    "bad-memory-report": "memory figures no GPU of the job's nodes can have",
    "other-gpu": "GPUs of another model than the one calibrated",
}


@dataclass(frozen=True)
class MemoryPoint:
    """One job's measured reserve parts on its binding rank, GiB."""

    job_id: str
    gpu_model: str
    hbm_gib: float
    max_allocated_gib: float
    cached_gib: float
    outside_torch_gib: float | None


def memory_point(job_id: str, memory: Any, gpu_model: str, hbm_gib: float,
                 want_gpu: str) -> MemoryPoint | str:
    """A job's record `memory` (MemoryPeaks.for_record) on GPUs of `hbm_gib` as a point, or
    why not (a key of MEMORY_SKIP_REASONS)."""
    if not isinstance(memory, Mapping):
        return "no-memory-report"
    if gpu_model != want_gpu:
        return "other-gpu"
    got = RecordedMemory.from_record(memory, hbm_gib)
    if got is None:
        return "bad-memory-report"
    outside = (None if got.device_used_gib is None
               else max(0.0, got.device_used_gib - got.max_reserved_gib))
    return MemoryPoint(job_id, gpu_model, hbm_gib, got.max_allocated_gib,
                       got.max_reserved_gib - got.max_allocated_gib, outside)


def _upper_quartile(values: Sequence[float]) -> float:
    return float(np.quantile(np.asarray(values, dtype=np.float64), QUANTILE))


def fit_reserve(points: Sequence[MemoryPoint]) -> MeasuredReserve:
    """The measured parts of the reserve over `points` (one GPU model; at least one point)."""
    if not points:
        raise ValueError("no memory point to fit the reserve on")
    outside = [p.outside_torch_gib for p in points if p.outside_torch_gib is not None]
    return MeasuredReserve(
        gpu_model=points[0].gpu_model, hbm_gib=points[0].hbm_gib,
        cached_gib=round(_upper_quartile([p.cached_gib for p in points]), 3),
        outside_torch_gib=round(_upper_quartile(outside), 3) if outside else None,
        jobs=len(points), jobs_outside=len(outside))


__all__ = ["MEMORY_SKIP_REASONS", "QUANTILE", "MemoryPoint", "fit_reserve", "memory_point"]
