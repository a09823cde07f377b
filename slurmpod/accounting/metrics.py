"""Efficiency metrics of one Megatron job from its parsed log: per logged iteration and per job.

Public API (used by `slurmpod mfu` and the accounting hooks):

- `job_metrics(summary, flops_fn, peak_tflops, n_gpus, *, seq_length, ...) -> JobMetrics`
  `flops_fn(global_batch_size) -> model FLOPs of one iteration` is injected; `flops_fn_for(args)`
  builds it from slurmpod's FLOPs model (`slurmpod.megatron.flops`) and returns the formula
  version to store with the figures.
- `JobMetrics.to_json(series=False)` (full record), `JobMetrics.headline()` (a few keys, for a
  job comment).

Definitions (docs/accounting.md has the derivations):
- tokens/s = global_batch_size × seq_length / iteration time.
- model TFLOP/s per GPU = flops_fn(global_batch_size) / (iteration time × n_gpus) / 1e12;
  MFU = that / peak_tflops (dense BF16 peak of the GPU, from the site; stored as `peak_tflops`).
- Each logged line averages the iterations since the previous line (`--log-interval`); it
  covers `iteration − previous iteration` iterations (first line of a launch: since the
  checkpoint it loaded, else since 0 on a first launch, else one log interval).
- Warm-up rule: in every launch (segment), records covering the first `warmup_iters` (default
  10) iterations after the launch's start iteration are excluded from the steady-state
  statistics, and so is the launch's first record whenever the launch itself is in the log
  (it times the first steps: NCCL communicators, allocator growth, compilation). If that leaves
  nothing, all records are used and `steady_fallback` says so.
- Steady-state statistics: median, p10, p90 (linear interpolation) over steady records, one
  value per logged record.
- Lost work: a record's iterations above the iteration a *later* launch resumed from were redone
  (the job restarted before checkpointing them); their time is `lost_s`.
- productive_s = Σ iteration time × iterations covered, minus lost work. Checkpoint saves,
  evaluation, start-up and restarts are outside Megatron's iteration timer, so they are not
  productive.
- goodput = productive_s × n_gpus ÷ allocated GPU-seconds (given by the caller from Slurm, else
  the log's own span × n_gpus).
- time to first iteration = first iteration line − job start (the caller's, else Megatron's
  process start derived from `time to initialize megatron`, else the first timestamp in the log).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from slurmpod.accounting.logparse import LogSummary

SCHEMA = "slurmpod.mfu/1"
FlopsFn = Callable[[int], float]
DEFAULT_WARMUP_ITERS = 10


@dataclass(frozen=True)
class Stats:
    n: int
    median: float
    p10: float
    p90: float
    mean: float

    @classmethod
    def of(cls, values: np.ndarray) -> Stats | None:
        v = values[np.isfinite(values)]
        if v.size == 0:
            return None
        p10, p50, p90 = np.percentile(v, [10, 50, 90])
        return cls(int(v.size), float(p50), float(p10), float(p90), float(v.mean()))


@dataclass(frozen=True)
class IterationSeries:
    """Per logged record (parallel arrays)."""

    iteration: np.ndarray
    segment: np.ndarray
    time_s: np.ndarray
    iter_time_ms: np.ndarray
    iters_covered: np.ndarray
    lost_iters: np.ndarray
    global_batch_size: np.ndarray
    tokens_per_s: np.ndarray
    tflops_per_gpu: np.ndarray
    mfu: np.ndarray
    tflops_reported: np.ndarray
    power_w: np.ndarray
    steady: np.ndarray

    def __len__(self) -> int:
        return int(self.iteration.shape[0])

    def to_json(self) -> dict[str, list[Any]]:
        return {k: [_num(x) for x in getattr(self, k).tolist()] for k in self.__dataclass_fields__}


@dataclass(frozen=True)
class CheckpointStall:
    iteration: int
    segment: int
    duration_s: float
    source: str  # "timer" (save-checkpoint timer) | "timestamps" (save lines) | "gap"


@dataclass(frozen=True)
class SegmentInfo:
    index: int
    cause: str
    resumed_from: int | None
    first_iteration: int | None
    last_iteration: int | None
    n_records: int
    lost_iters: int
    lost_s: float


@dataclass(frozen=True)
class JobMetrics:
    schema: str
    flops_formula: str
    peak_tflops: float  # per GPU, the peak every MFU figure here is relative to
    n_gpus: int
    seq_length: int | None
    flops_per_iteration: float | None  # at the median steady global batch size
    n_records: int
    first_iteration: int | None
    last_iteration: int | None
    train_iters: int | None
    restarts: int
    warmup_iters: int
    steady_fallback: bool
    iter_time_ms: Stats | None
    tokens_per_s: Stats | None
    tflops_per_gpu: Stats | None
    mfu: Stats | None
    tflops_reported: Stats | None  # Megatron's own figure (its release's formula)
    energy_j: Stats | None  # J per iteration per GPU as logged (Megatron --log-energy)
    power_w: Stats | None  # W per GPU as logged
    reported_ratio: float | None  # slurmpod TFLOP/s ÷ Megatron's, medians over the same records
    time_to_first_iteration_s: float | None
    time_to_first_iteration_ref: str | None  # "job_start" | "megatron_launch" | "first_log_line"
    checkpoint_stalls: tuple[CheckpointStall, ...]
    checkpoint_stall_s: float
    productive_s: float
    lost_s: float
    lost_iters: int
    wall_s: float | None
    allocated_gpu_s: float | None
    goodput: float | None
    segments: tuple[SegmentInfo, ...]
    series: IterationSeries

    def headline(self) -> dict[str, Any]:
        """A few numbers for a job comment (compact, versioned)."""
        return {
            "v": SCHEMA, "mfu": _round(self.mfu.median if self.mfu else None, 4),
            "tflops": _round(self.tflops_per_gpu.median if self.tflops_per_gpu else None, 1),
            "iter": self.last_iteration,
            "tokens_per_s": _round(self.tokens_per_s.median if self.tokens_per_s else None, 0),
            "peak": self.peak_tflops, "formula": self.flops_formula,
            "goodput": _round(self.goodput, 3),
        }

    def to_json(self, series: bool = False) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key in self.__dataclass_fields__:
            if key == "series":
                continue
            val = getattr(self, key)
            if isinstance(val, Stats):
                val = {k: _num(v) for k, v in asdict(val).items()}
            elif isinstance(val, tuple):
                val = [{k: _num(v) for k, v in asdict(x).items()} for x in val]
            out[key] = _num(val)
        if series:
            out["series"] = self.series.to_json()
        return out


def _num(x: Any) -> Any:
    """JSON has no NaN/inf: they become null."""
    if isinstance(x, float) and not math.isfinite(x):
        return None
    return x


def _round(x: float | None, nd: int) -> float | None:
    return None if x is None or not math.isfinite(x) else round(x, nd)


def flops_fn_for(args: Mapping[str, Any] | Any) -> tuple[FlopsFn, str]:
    """slurmpod's FLOPs model for a Megatron configuration (an arguments dict, MegatronArgs or
    ModelConfig): returns (global batch size -> FLOPs per iteration, formula version)."""
    from slurmpod.megatron.flops import FLOPS_FORMULA_VERSION, flops_per_token
    from slurmpod.megatron.runspec import ModelConfig

    cfg = ModelConfig.from_args(args)
    per_sequence = flops_per_token(cfg) * cfg.seq_length  # FLOPs are linear in batch size

    def flops(global_batch_size: int) -> float:
        return per_sequence * global_batch_size

    return flops, FLOPS_FORMULA_VERSION


def _covered(it: np.ndarray, seg: np.ndarray, starts: dict[int, int | None],
             interval: dict[int, int | None]) -> np.ndarray:
    """Iterations each record covers (see the module docstring)."""
    cov = np.ones(it.shape[0], dtype=np.int64)
    if it.size == 0:
        return cov
    prev = np.empty_like(it)
    prev[1:] = it[:-1]
    first = np.ones(it.shape[0], dtype=bool)
    first[1:] = seg[1:] != seg[:-1]
    cov[~first] = it[~first] - prev[~first]
    for k in np.flatnonzero(first):
        s = int(seg[k])
        start = starts.get(s)
        if start is not None and it[k] > start:
            cov[k] = it[k] - start
        elif interval.get(s):
            cov[k] = int(interval[s] or 1)
        else:
            rest = cov[(seg == s) & ~first]
            cov[k] = int(np.median(rest)) if rest.size else 1
    return np.maximum(cov, 1)


def job_metrics(summary: LogSummary, flops_fn: FlopsFn | None, peak_tflops: float, n_gpus: int,
                *, seq_length: int | None, default_global_batch_size: int | None = None,
                flops_formula: str = "injected", warmup_iters: int = DEFAULT_WARMUP_ITERS,
                job_start_s: float | None = None, job_end_s: float | None = None,
                allocated_gpu_s: float | None = None) -> JobMetrics:
    """Metrics for one job. Times are log-clock seconds (logparse.epoch_to_log_clock)."""
    if n_gpus < 1:
        raise ValueError("n_gpus must be >= 1")
    if not peak_tflops > 0 and peak_tflops == peak_tflops:  # NaN: no peak, no MFU
        raise ValueError("peak_tflops must be > 0")
    tab = summary.iterations
    it, seg = tab.iteration, tab.segment
    n = len(tab)
    segs = summary.segments

    # Where each launch started: the checkpoint it loaded; 0 for a fresh first launch.
    starts: dict[int, int | None] = {}
    interval: dict[int, int | None] = {}
    for s in segs:
        start = s.loaded_iteration
        if start is None and s.index == 0 and s.start_seen:
            start = 0
        starts[s.index] = start
        li = (s.args or {}).get("log_interval")
        interval[s.index] = li if isinstance(li, int) and li > 0 else None
    cov = _covered(it, seg, starts, interval)
    lo = it - cov  # record covers iterations (lo, it]

    # Lost work: iterations above the resume point of any later launch.
    resume: dict[int, int] = {}
    for s in segs:
        if s.index == 0 or s.first_iteration is None:
            continue
        mask = seg == s.index
        r = starts.get(s.index)
        if r is None:
            r = int(lo[mask][0]) if mask.any() else s.first_iteration - 1
        resume[s.index] = r
    later_min = np.full(n, np.iinfo(np.int64).max, dtype=np.int64)
    for s_idx, r in resume.items():
        earlier = seg < s_idx
        later_min[earlier] = np.minimum(later_min[earlier], r)
    lost = np.clip(it - np.maximum(lo, later_min), 0, cov)

    elapsed_s = tab.elapsed_ms / 1000.0
    gbs = tab.global_batch_size.astype(np.float64)
    if default_global_batch_size:
        gbs = np.where(gbs > 0, gbs, float(default_global_batch_size))
    gbs[gbs <= 0] = np.nan
    tokens = gbs * seq_length / elapsed_s if seq_length else np.full(n, np.nan)
    flops = np.full(n, np.nan)
    if flops_fn is not None and n:
        known = np.isfinite(gbs)
        sizes, inverse = np.unique(gbs[known], return_inverse=True)  # a handful of batch sizes
        flops[known] = np.array([flops_fn(int(b)) for b in sizes], dtype=np.float64)[inverse]
    tflops = flops / (elapsed_s * n_gpus) / 1e12
    mfu = tflops / peak_tflops

    # Warm-up exclusion.
    steady = np.ones(n, dtype=bool)
    for s in segs:
        mask = seg == s.index
        if not mask.any():
            continue
        base = starts.get(s.index)
        if base is None:
            base = int(lo[mask][0]) if s.start_seen else 0
        steady &= ~(mask & (lo < base + warmup_iters))
        if s.start_seen:
            steady[np.flatnonzero(mask)[0]] = False
    fallback = bool(n) and not steady.any()
    if fallback:
        steady[:] = True

    series = IterationSeries(
        iteration=it, segment=seg, time_s=tab.time_s, iter_time_ms=tab.elapsed_ms,
        iters_covered=cov, lost_iters=lost, global_batch_size=tab.global_batch_size,
        tokens_per_s=tokens, tflops_per_gpu=tflops, mfu=mfu,
        tflops_reported=tab.tflops_reported, power_w=tab.power_w, steady=steady)

    st = steady
    t_stats, r_stats = Stats.of(tflops[st]), Stats.of(tab.tflops_reported[st])
    both = st & np.isfinite(tflops) & np.isfinite(tab.tflops_reported)
    ratio = (float(np.median(tflops[both]) / np.median(tab.tflops_reported[both]))
             if both.any() and np.median(tab.tflops_reported[both]) > 0 else None)
    steady_gbs = gbs[st & np.isfinite(gbs)]
    fpi = (float(flops_fn(int(np.median(steady_gbs)))) if flops_fn is not None and steady_gbs.size
           else None)

    productive_s = float(np.sum(elapsed_s * (cov - lost)))
    lost_s = float(np.sum(elapsed_s * lost))

    # Time to first iteration.
    ttfi, ref = _time_to_first(summary, job_start_s)

    # Wall and goodput.
    start_ref = job_start_s
    if start_ref is None and segs and segs[0].launch_time_s is not None:
        start_ref = segs[0].launch_time_s
    if start_ref is None and summary.first_time_s is not None:
        # A log fragment: the first record's own interval began before its line was printed.
        first_t = tab.time_s[np.isfinite(tab.time_s)]
        start_ref = summary.first_time_s
        if first_t.size:
            k = int(np.flatnonzero(np.isfinite(tab.time_s))[0])
            start_ref = min(start_ref, float(first_t[0] - elapsed_s[k] * cov[k]))
    end_ref = job_end_s if job_end_s is not None else summary.last_time_s
    wall = end_ref - start_ref if start_ref is not None and end_ref is not None else None
    if allocated_gpu_s is None and wall is not None and wall > 0:
        allocated_gpu_s = wall * n_gpus
    goodput = (productive_s * n_gpus / allocated_gpu_s
               if allocated_gpu_s and allocated_gpu_s > 0 else None)

    stalls = _stalls(summary)
    seg_info = tuple(
        SegmentInfo(index=s.index, cause=s.cause, resumed_from=resume.get(s.index, starts.get(
            s.index)), first_iteration=s.first_iteration, last_iteration=s.last_iteration,
            n_records=s.n_records, lost_iters=int(lost[seg == s.index].sum()),
            lost_s=float(np.sum((elapsed_s * lost)[seg == s.index])))
        for s in segs)
    return JobMetrics(
        schema=SCHEMA, flops_formula=flops_formula, peak_tflops=float(peak_tflops),
        n_gpus=int(n_gpus), seq_length=seq_length, flops_per_iteration=fpi, n_records=n,
        first_iteration=int(it[0]) if n else None, last_iteration=int(it.max()) if n else None,
        train_iters=int(tab.train_iters[-1]) if n and tab.train_iters[-1] >= 0 else None,
        restarts=summary.restarts,
        warmup_iters=warmup_iters, steady_fallback=fallback,
        iter_time_ms=Stats.of(tab.elapsed_ms[st]), tokens_per_s=Stats.of(tokens[st]),
        tflops_per_gpu=t_stats, mfu=Stats.of(mfu[st]), tflops_reported=r_stats,
        energy_j=Stats.of(tab.energy_j[st]), power_w=Stats.of(tab.power_w[st]),
        reported_ratio=ratio, time_to_first_iteration_s=ttfi, time_to_first_iteration_ref=ref,
        checkpoint_stalls=stalls, checkpoint_stall_s=float(sum(c.duration_s for c in stalls)),
        productive_s=productive_s, lost_s=lost_s, lost_iters=int(lost.sum()), wall_s=wall,
        allocated_gpu_s=allocated_gpu_s, goodput=goodput, segments=seg_info, series=series)


def _time_to_first(summary: LogSummary, job_start_s: float | None) -> tuple[float | None,
                                                                            str | None]:
    times = summary.iterations.time_s
    finite = np.flatnonzero(np.isfinite(times))
    if finite.size == 0:
        return None, None
    first = float(times[finite[0]])
    if job_start_s is not None:
        return first - job_start_s, "job_start"
    seg0 = summary.segments[0] if summary.segments else None
    if seg0 is not None and seg0.launch_time_s is not None:
        return first - seg0.launch_time_s, "megatron_launch"
    if summary.first_time_s is not None and summary.first_time_s < first:
        return first - summary.first_time_s, "first_log_line"
    return None, None


def _stalls(summary: LogSummary) -> tuple[CheckpointStall, ...]:
    """How long each checkpoint save held training up."""
    tab = summary.iterations
    out: list[CheckpointStall] = []
    for c in summary.checkpoints:
        if c.timer_s is not None:
            out.append(CheckpointStall(c.iteration, c.segment, c.timer_s, "timer"))
        elif c.start_time_s is not None and c.end_time_s is not None:
            out.append(CheckpointStall(c.iteration, c.segment, c.end_time_s - c.start_time_s,
                                       "timestamps"))
        else:
            # Untimed save lines (before 2026): the gap in the iteration lines' clock around it.
            before = np.flatnonzero((tab.offset < c.offset) & (tab.segment == c.segment))
            after = np.flatnonzero((tab.offset > c.offset) & (tab.segment == c.segment))
            if before.size and after.size:
                a, b = before[-1], after[0]
                iters = max(1, int(tab.iteration[b] - tab.iteration[a]))
                gap = tab.time_s[b] - tab.time_s[a] - tab.elapsed_ms[b] / 1000.0 * iters
                if math.isfinite(gap) and gap > 0:
                    out.append(CheckpointStall(c.iteration, c.segment, float(gap), "gap"))
    return tuple(out)


__all__ = ["DEFAULT_WARMUP_ITERS", "SCHEMA", "CheckpointStall", "FlopsFn", "IterationSeries",
           "JobMetrics", "SegmentInfo", "Stats", "flops_fn_for", "job_metrics"]
