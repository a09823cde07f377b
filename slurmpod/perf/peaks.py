"""The memory estimate and the runtime reserve against published peak memory of real runs.

tests/data/perf/memory.toml lists Megatron runs whose peak allocated memory, or what PyTorch had
allocated when they ran out of memory, was published with their configuration. For each row:

- the estimate (`megatron.memory.peak_memory`) is what PyTorch allocates on the most loaded
  GPU, compared with a run's published peak (`error`);
- `plan` counts a layout as fitting when the estimate is at most the usable HBM (the GPU's HBM
  less `megatron.memory.runtime_reserve`): a run that ran must fit, one that ran out must not;
- what a run had allocated when it ran out measures the usable HBM itself: the reserve
  (`usable_gap_gib`) is the published headroom, not a guess, where that gap is small.

Pure over its inputs: the TOML is read by `load_peaks`; no I/O elsewhere.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from slurmpod.megatron.memory import GIB, peak_memory
from slurmpod.megatron.runspec import ModelConfig
from slurmpod.perf.calibrate import row_config, system_hardware, usable_bytes
from slurmpod.perf.hardware import Hardware

GB = 1e9
OUTCOMES = ("ran", "oom")


@dataclass(frozen=True)
class PeakPoint:
    """One published run: its config, and its peak (`ran`) or its allocation when it ran out of
    memory (`oom`), GiB."""

    id: str
    source: str
    gpus: int
    config: ModelConfig
    hardware: Hardware
    outcome: str
    measured_gib: float
    raw: Mapping[str, Any]


def _measured_gib(raw: Mapping[str, Any]) -> float:
    if raw["outcome"] == "ran":
        return float(raw["peak_allocated_gb"]) * GB / GIB
    return float(raw["allocated_at_oom_gib"])


def load_peaks(path: Path | str, published: Path | str) -> list[PeakPoint]:
    """The rows of `path`, their models, systems and defaults taken from `published`."""
    from slurmpod.config import read_toml  # lazy: start-up

    table = read_toml(Path(path))
    shared = read_toml(Path(published))
    out = []
    for raw in table["points"]:
        if raw["outcome"] not in OUTCOMES:
            raise ValueError(f"{raw['id']}: outcome must be one of {', '.join(OUTCOMES)}")
        c, _ = row_config(shared, raw)
        out.append(PeakPoint(raw["id"], raw["source"], int(raw["gpus"]), c,
                             system_hardware(shared, raw["system"]), raw["outcome"],
                             _measured_gib(raw), raw))
    return out


@dataclass(frozen=True)
class PeakResult:
    point: PeakPoint
    estimate_gib: float
    usable_gib: float

    @property
    def fits(self) -> bool:
        """What `plan` says of the run: its estimate within the usable HBM."""
        return self.estimate_gib <= self.usable_gib

    @property
    def error(self) -> float | None:
        """Estimate over the published peak, less one (runs that ran)."""
        if self.point.outcome != "ran":
            return None
        return self.estimate_gib / self.point.measured_gib - 1

    @property
    def usable_gap_gib(self) -> float | None:
        """Usable HBM less what the run had allocated when it ran out (runs that ran out): how
        far the reserve is from the headroom the run measured."""
        if self.point.outcome != "oom":
            return None
        return self.usable_gib - self.point.measured_gib


def evaluate_peaks(points: Sequence[PeakPoint]) -> list[PeakResult]:
    return [PeakResult(p, peak_memory(p.config, p.gpus).bytes_per_gpu / GIB,
                       usable_bytes(p.config, p.gpus, p.hardware) / GIB) for p in points]


def peak_stats(results: Sequence[PeakResult]) -> dict[str, float]:
    """Median and max |error| over the runs that ran; how many runs `plan` judges as they
    went (ran and fits, or ran out and does not)."""
    errs = [abs(r.error) for r in results if r.error is not None]
    agree = sum(1 for r in results if r.fits == (r.point.outcome == "ran"))
    return {"n": float(len(errs)), "median": statistics.median(errs) if errs else 0.0,
            "max": max(errs, default=0.0), "agree": float(agree), "rows": float(len(results))}


def markdown_peaks(results: Sequence[PeakResult]) -> str:
    """Every row with its source, layout, published figure, estimate and `plan`'s verdict."""
    lines = ["| id | source | GPUs | layout (TP/CP/PP/VPP/EP, MBS) | recompute | published | "
             "estimate GiB | usable GiB | plan | error |", "|---" * 10 + "|"]
    for r in results:
        p, c = r.point, r.point.config
        lay = f"{c.tp}/{c.cp}/{c.pp}/{c.vpp or '-'}/{c.ep}, {c.micro_batch_size}"
        rec = (", ".join(c.recompute_modules) if c.recompute_granularity == "selective"
               else c.recompute_granularity or "none")
        pub = (f"peak {p.raw['peak_allocated_gb']} GB ({p.measured_gib:.2f} GiB)"
               if p.outcome == "ran" else f"out of memory at {p.measured_gib} GiB allocated")
        err = f"{r.error:+.1%}" if r.error is not None else f"usable {r.usable_gap_gib:+.2f} GiB"
        lines.append(f"| {p.id} | {p.source} | {p.gpus} | {lay} | {rec} | {pub} | "
                     f"{r.estimate_gib:.2f} | {r.usable_gib:.2f} | "
                     f"{'fits' if r.fits else 'refused'} | {err} |")
    return "\n".join(lines) + "\n"


__all__ = ["OUTCOMES", "PeakPoint", "PeakResult", "evaluate_peaks", "load_peaks",
           "markdown_peaks", "peak_stats"]
