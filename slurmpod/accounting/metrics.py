"""Efficiency metrics of one Megatron job from its parsed log: per logged iteration and per job.

Public API (used by `slurmpod mfu` and the accounting hooks):

- `job_metrics(summary, flops_fn, peak_tflops, n_gpus, *, seq_length, ...) -> JobMetrics`
  `flops_fn(global_batch_size) -> model FLOPs of one iteration` is injected; `flops_fn_for(args)`
  builds it from slurmpod's FLOPs model (`slurmpod.megatron.flops`) and returns the formula
  version to store with the figures.
- `JobMetrics.to_json(series=False)` (full record), `JobMetrics.headline()` (a few keys, for a
  job comment).
- `job_metrics(..., series=False)`: the same figures, bit for bit, without the per-record
  series (`JobMetrics.series` is None), read block by block from the packed records in memory
  independent of their number (`slurmpod mfu` without `--series`); `exactstats` gives numpy's
  percentiles, medians, means and sums without the whole arrays.

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
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from slurmpod.accounting import exactstats
from slurmpod.accounting.logparse import LogSummary
from slurmpod.accounting.logrecords import RankTimers, Segment
from slurmpod.accounting.timerblocks import for_record

SCHEMA = "slurmpod.mfu/1"
# The record columns job_metrics reads (either way): a parse for it alone keeps only these
# (logparse.parse_log(columns=...)).
COLUMNS_READ = ("iteration", "train_iters", "global_batch_size", "segment", "offset",
                "elapsed_ms", "time_s", "tflops_reported", "energy_j", "power_w")
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
    series: IterationSeries | None  # None: computed with series=False
    # Megatron's timer blocks, reduced to what the record keeps (timerblocks.for_record)
    rank_timers: RankTimers | None = None
    # Megatron's memory reports: the figures of the rank that held the most
    # (logrecords.MemoryPeaks.for_record)
    memory: dict[str, Any] | None = None

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
            if isinstance(val, RankTimers):
                val = val.to_json()
            elif isinstance(val, Stats):
                val = {k: _num(v) for k, v in asdict(val).items()}
            elif isinstance(val, tuple):
                val = [{k: _num(v) for k, v in asdict(x).items()} for x in val]
            out[key] = _num(val)
        if series:
            if self.series is None:
                raise ValueError("these metrics were computed without the per-record series")
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
    from slurmpod.megatron.flops import FLOPS_FORMULA_VERSION, flops_per_token  # lazy: start-up
    from slurmpod.megatron.runspec import ModelConfig  # lazy: start-up

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


def _launch_starts(segs: tuple[Segment, ...]) -> tuple[dict[int, int | None],
                                                        dict[int, int | None]]:
    """Where each launch started (the checkpoint it loaded; 0 for a fresh first launch) and
    its --log-interval, by segment index."""
    starts: dict[int, int | None] = {}
    interval: dict[int, int | None] = {}
    for s in segs:
        start = s.loaded_iteration
        if start is None and s.index == 0 and s.start_seen:
            start = 0
        starts[s.index] = start
        li = (s.args or {}).get("log_interval")
        interval[s.index] = li if isinstance(li, int) and li > 0 else None
    return starts, interval


@dataclass
class _Figures:
    """What the per-record pass (either way) gives the rest of job_metrics."""

    first_iteration: int | None
    last_iteration: int | None
    train_iters: int | None
    steady_fallback: bool
    stats: dict[str, Stats | None]  # iter_time_ms, tokens_per_s, ... (JobMetrics field names)
    reported_ratio: float | None
    flops_per_iteration: float | None
    productive_s: float
    lost_s: float
    lost_iters: int
    resume: dict[int, int]
    seg_lost: dict[int, tuple[int, float]]  # segment -> (lost iterations, lost seconds)
    first_time_s: float | None  # the first finite record time
    first_back_s: float | None  # that record's iteration time × iterations covered
    stalls: tuple[CheckpointStall, ...]
    series: IterationSeries | None


def job_metrics(summary: LogSummary, flops_fn: FlopsFn | None, peak_tflops: float, n_gpus: int,
                *, seq_length: int | None, default_global_batch_size: int | None = None,
                flops_formula: str = "injected", warmup_iters: int = DEFAULT_WARMUP_ITERS,
                job_start_s: float | None = None, job_end_s: float | None = None,
                allocated_gpu_s: float | None = None, series: bool = True) -> JobMetrics:
    """Metrics for one job. Times are log-clock seconds (logparse.epoch_to_log_clock).

    `series=False` leaves out the per-record series (`JobMetrics.series` is None) and reads the
    records block by block instead (`_lean`): memory independent of the number of records
    beyond the packed records themselves; every figure bit for bit the same."""
    if n_gpus < 1:
        raise ValueError("n_gpus must be >= 1")
    if not peak_tflops > 0 and peak_tflops == peak_tflops:  # NaN: no peak, no MFU
        raise ValueError("peak_tflops must be > 0")
    n = len(summary.iterations)
    segs = summary.segments
    starts, interval = _launch_starts(segs)
    per_record = _full if series else _lean
    f = per_record(summary, flops_fn, peak_tflops, n_gpus, seq_length,
                   default_global_batch_size, warmup_iters, starts, interval)

    # Time to first iteration.
    ttfi, ref = _time_to_first(summary, job_start_s, f.first_time_s)

    # Wall and goodput.
    start_ref = job_start_s
    if start_ref is None and segs and segs[0].launch_time_s is not None:
        start_ref = segs[0].launch_time_s
    if start_ref is None and summary.first_time_s is not None:
        # A log fragment: the first record's own interval began before its line was printed.
        start_ref = summary.first_time_s
        if f.first_time_s is not None and f.first_back_s is not None:
            start_ref = min(start_ref, float(f.first_time_s - f.first_back_s))
    end_ref = job_end_s if job_end_s is not None else summary.last_time_s
    wall = end_ref - start_ref if start_ref is not None and end_ref is not None else None
    if allocated_gpu_s is None and wall is not None and wall > 0:
        allocated_gpu_s = wall * n_gpus
    goodput = (f.productive_s * n_gpus / allocated_gpu_s
               if allocated_gpu_s and allocated_gpu_s > 0 else None)

    stalls = f.stalls
    seg_info = tuple(
        SegmentInfo(index=s.index, cause=s.cause, resumed_from=f.resume.get(s.index, starts.get(
            s.index)), first_iteration=s.first_iteration, last_iteration=s.last_iteration,
            n_records=s.n_records, lost_iters=f.seg_lost.get(s.index, (0, 0.0))[0],
            lost_s=f.seg_lost.get(s.index, (0, 0.0))[1])
        for s in segs)
    st = f.stats
    return JobMetrics(
        schema=SCHEMA, flops_formula=flops_formula, peak_tflops=float(peak_tflops),
        n_gpus=int(n_gpus), seq_length=seq_length, flops_per_iteration=f.flops_per_iteration,
        n_records=n, first_iteration=f.first_iteration, last_iteration=f.last_iteration,
        train_iters=f.train_iters, restarts=summary.restarts,
        warmup_iters=warmup_iters, steady_fallback=f.steady_fallback,
        iter_time_ms=st["iter_time_ms"], tokens_per_s=st["tokens_per_s"],
        tflops_per_gpu=st["tflops_per_gpu"], mfu=st["mfu"], tflops_reported=st["tflops_reported"],
        energy_j=st["energy_j"], power_w=st["power_w"],
        reported_ratio=f.reported_ratio, time_to_first_iteration_s=ttfi,
        time_to_first_iteration_ref=ref,
        checkpoint_stalls=stalls, checkpoint_stall_s=float(sum(c.duration_s for c in stalls)),
        productive_s=f.productive_s, lost_s=f.lost_s, lost_iters=f.lost_iters, wall_s=wall,
        allocated_gpu_s=allocated_gpu_s, goodput=goodput, segments=seg_info, series=f.series,
        rank_timers=for_record(summary.rank_timers, n_gpus),
        memory=summary.memory.for_record(n_gpus) if summary.memory else None)


def _full(summary: LogSummary, flops_fn: FlopsFn | None, peak_tflops: float, n_gpus: int,
          seq_length: int | None, default_global_batch_size: int | None, warmup_iters: int,
          starts: dict[int, int | None], interval: dict[int, int | None]) -> _Figures:
    """The per-record arrays, whole (the series); the reference `_lean` must match."""
    tab = summary.iterations
    it, seg = tab.iteration, tab.segment
    n = len(tab)
    segs = summary.segments
    cov = _covered(it, seg, starts, interval)
    lo = it - cov  # record covers iterations (lo, it]

    resume, lost = _full_lost_work(summary, starts, cov, lo)

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

    steady, fallback = _full_steady(summary, starts, lo, warmup_iters)

    series = IterationSeries(
        iteration=it, segment=seg, time_s=tab.time_s, iter_time_ms=tab.elapsed_ms,
        iters_covered=cov, lost_iters=lost, global_batch_size=tab.global_batch_size,
        tokens_per_s=tokens, tflops_per_gpu=tflops, mfu=mfu,
        tflops_reported=tab.tflops_reported, power_w=tab.power_w, steady=steady)

    st = steady
    both = st & np.isfinite(tflops) & np.isfinite(tab.tflops_reported)
    ratio = (float(np.median(tflops[both]) / np.median(tab.tflops_reported[both]))
             if both.any() and np.median(tab.tflops_reported[both]) > 0 else None)
    steady_gbs = gbs[st & np.isfinite(gbs)]
    fpi = (float(flops_fn(int(np.median(steady_gbs)))) if flops_fn is not None and steady_gbs.size
           else None)
    finite_t = np.flatnonzero(np.isfinite(tab.time_s))
    k = int(finite_t[0]) if finite_t.size else None
    return _Figures(
        first_iteration=int(it[0]) if n else None, last_iteration=int(it.max()) if n else None,
        train_iters=int(tab.train_iters[-1]) if n and tab.train_iters[-1] >= 0 else None,
        steady_fallback=fallback,
        stats={"iter_time_ms": Stats.of(tab.elapsed_ms[st]), "tokens_per_s": Stats.of(tokens[st]),
               "tflops_per_gpu": Stats.of(tflops[st]), "mfu": Stats.of(mfu[st]),
               "tflops_reported": Stats.of(tab.tflops_reported[st]),
               "energy_j": Stats.of(tab.energy_j[st]), "power_w": Stats.of(tab.power_w[st])},
        reported_ratio=ratio, flops_per_iteration=fpi,
        productive_s=float(np.sum(elapsed_s * (cov - lost))),
        lost_s=float(np.sum(elapsed_s * lost)), lost_iters=int(lost.sum()), resume=resume,
        seg_lost={s.index: (int(lost[seg == s.index].sum()),
                            float(np.sum((elapsed_s * lost)[seg == s.index]))) for s in segs},
        first_time_s=float(tab.time_s[k]) if k is not None else None,
        first_back_s=float(elapsed_s[k] * cov[k]) if k is not None else None,
        stalls=_stalls(summary), series=series)


def _full_lost_work(summary: LogSummary, starts: dict[int, int | None], cov: np.ndarray,
                    lo: np.ndarray) -> tuple[dict[int, int], np.ndarray]:
    """Each later launch's resume point, and per record the iterations it lost: those above
    the resume point of any later launch."""
    tab = summary.iterations
    it, seg = tab.iteration, tab.segment
    n = len(tab)
    resume: dict[int, int] = {}
    for s in summary.segments:
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
    return resume, np.clip(it - np.maximum(lo, later_min), 0, cov)


def _full_steady(summary: LogSummary, starts: dict[int, int | None], lo: np.ndarray,
                 warmup_iters: int) -> tuple[np.ndarray, bool]:
    """The warm-up exclusion: which records are steady; all of them (the fallback) if none."""
    seg = summary.iterations.segment
    n = len(summary.iterations)
    steady = np.ones(n, dtype=bool)
    for s in summary.segments:
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
    return steady, fallback


_INT64_MAX = np.iinfo(np.int64).max
_INT64_MIN = np.iinfo(np.int64).min
_STAT_COLUMNS = {"iter_time_ms": "elapsed_ms", "tflops_reported": "tflops_reported",
                 "energy_j": "energy_j", "power_w": "power_w"}


def _median_of_counts(counts: dict[int, int]) -> int:
    """int(np.median(values)) of integer values given as value -> count."""
    vals = sorted(counts)
    cum = np.cumsum([counts[v] for v in vals])
    m = int(cum[-1])

    def at(r: int) -> int:
        return vals[int(np.searchsorted(cum, r, side="right"))]

    mid = [at(m // 2)] if m % 2 else [at(m // 2 - 1), at(m // 2)]
    return int(np.median(np.array(mid, dtype=np.int64)))


def _lean(summary: LogSummary, flops_fn: FlopsFn | None, peak_tflops: float, n_gpus: int,
          seq_length: int | None, default_global_batch_size: int | None, warmup_iters: int,
          starts: dict[int, int | None], interval: dict[int, int | None]) -> _Figures:
    """`_full` without per-record arrays: the packed records are read block by block, a few
    times over (the structure of each launch; lost work and the warm-up rule; then the
    statistics, `exactstats`), each pass computing per block exactly what `_full` computes
    per element. Memory: the warm-up mask (1 bit per record) and a block's arrays."""
    tab = summary.iterations
    segs = summary.segments
    n = len(tab)
    shape = _lean_launch_shape(summary, interval)
    bounds = _lean_launch_bounds(summary, shape, starts, interval, warmup_iters)
    work = _lean_lost_and_steady(summary, shape.seg_n, bounds)
    fallback = bool(n) and work.n_steady == 0
    stats, ratio, fpi = _lean_statistics(summary, _BlockValues(
        work.steady_bits, fallback, default_global_batch_size, seq_length, flops_fn, n_gpus,
        peak_tflops))
    last_ti = tab.column("train_iters").last()
    return _Figures(
        first_iteration=shape.it_first, last_iteration=shape.it_max,
        train_iters=int(last_ti) if n and last_ti >= 0 else None, steady_fallback=fallback,
        stats=stats, reported_ratio=ratio, flops_per_iteration=fpi,
        productive_s=work.productive.result(), lost_s=work.lost_total.result(),
        lost_iters=work.lost_iters, resume=bounds.resume,
        seg_lost={s.index: (work.seg_lost_iters[s.index], work.seg_sum[s.index].result())
                  if s.index in shape.seg_n else (0, 0.0) for s in segs},
        first_time_s=work.first_time, first_back_s=work.first_back,
        stalls=_lean_stalls(summary), series=None)


@dataclass
class _LaunchShape:
    """Pass 1 of `_lean`: where each run of one segment starts, and how many records each has."""

    first_idx: list[int] = field(default_factory=list)  # index of each run's first record
    first_it: list[int] = field(default_factory=list)  # its iteration
    first_seg: list[int] = field(default_factory=list)  # its segment
    seg_n: dict[int, int] = field(default_factory=dict)  # segment -> records
    # segment (launch without --log-interval) -> iterations between records -> count
    rest: dict[int, dict[int, int]] = field(default_factory=dict)
    it_max: int | None = None
    it_first: int | None = None


@dataclass
class _LaunchBounds:
    """Per segment: its resume point, the lowest later resume, the warm-up threshold."""

    resume: dict[int, int]
    later_min: np.ndarray  # segment -> lowest resume point of any later launch
    thr: np.ndarray  # segment -> a record whose lo is below this is warm-up
    fidx: np.ndarray  # index of each run's first record
    fcov: np.ndarray  # iterations that record covers
    excl_arr: np.ndarray  # records excluded as a launch's first (sorted)


@dataclass
class _LeanWork:
    """Pass 2 of `_lean`: lost work, productive time, the warm-up mask, the first time."""

    productive: exactstats.PairwiseSum
    lost_total: exactstats.PairwiseSum
    seg_sum: dict[int, exactstats.PairwiseSum]  # segment -> lost seconds
    seg_lost_iters: dict[int, int]
    lost_iters: int = 0
    steady_bits: list[np.ndarray] = field(default_factory=list)  # packed, one per block
    n_steady: int = 0
    first_time: float | None = None
    first_back: float | None = None


def _lean_launch_shape(summary: LogSummary, interval: dict[int, int | None]) -> _LaunchShape:
    """The first record of each run of one segment, records per segment, and (for a launch
    that does not say its --log-interval) the iterations between its records."""
    tab = summary.iterations
    shape = _LaunchShape()
    no_interval = {s.index for s in summary.segments if not interval.get(s.index)}
    prev_it = prev_seg = 0
    for a, (it, seg) in tab.blocks("iteration", "segment"):
        k = it.shape[0]
        first = np.empty(k, dtype=bool)
        first[0] = a == 0 or seg[0] != prev_seg
        first[1:] = seg[1:] != seg[:-1]
        fi = np.flatnonzero(first)
        shape.first_idx.extend((fi + a).tolist())
        shape.first_it.extend(it[fi].tolist())
        shape.first_seg.extend(seg[fi].tolist())
        for v, c in zip(*np.unique(seg, return_counts=True), strict=True):
            shape.seg_n[int(v)] = shape.seg_n.get(int(v), 0) + int(c)
        if no_interval:
            prev = np.empty_like(it)
            prev[0] = prev_it
            prev[1:] = it[:-1]
            nf = ~first
            d, seg_nf = (it - prev)[nf], seg[nf]
            for v in set(np.unique(seg_nf).tolist()) & no_interval:
                h = shape.rest.setdefault(v, {})
                for x, c in zip(*np.unique(d[seg_nf == v], return_counts=True), strict=True):
                    h[int(x)] = h.get(int(x), 0) + int(c)
        top = int(it.max())
        shape.it_max = top if shape.it_max is None else max(shape.it_max, top)
        if shape.it_first is None:
            shape.it_first = int(it[0])
        prev_it, prev_seg = int(it[-1]), int(seg[-1])
    return shape


def _lean_launch_bounds(summary: LogSummary, shape: _LaunchShape, starts: dict[int, int | None],
                        interval: dict[int, int | None], warmup_iters: int) -> _LaunchBounds:
    """Iterations covered by each first record (`_covered`), the launch of each segment."""
    segs = summary.segments
    seg_n = shape.seg_n
    first_cov: list[int] = []
    lo_first: dict[int, int] = {}  # lo of a segment's first record
    first_of: dict[int, int] = {}  # index of that record
    for k, itk, sv in zip(shape.first_idx, shape.first_it, shape.first_seg, strict=True):
        start = starts.get(sv)
        if start is not None and itk > start:
            c = itk - start
        elif interval.get(sv):
            c = int(interval[sv] or 1)
        else:
            c = _median_of_counts(shape.rest[sv]) if shape.rest.get(sv) else 1
        c = max(c, 1)
        first_cov.append(c)
        if sv not in first_of:
            first_of[sv] = k
            lo_first[sv] = itk - c
    resume: dict[int, int] = {}
    for s in segs:
        if s.index == 0 or s.first_iteration is None:
            continue
        r = starts.get(s.index)
        if r is None:
            r = lo_first[s.index] if s.index in lo_first else s.first_iteration - 1
        resume[s.index] = r
    n_tab = max([*seg_n, *(s.index for s in segs), -1]) + 2
    later_min = np.full(n_tab, _INT64_MAX, dtype=np.int64)
    for s_idx, r in resume.items():
        later_min[:max(0, min(s_idx, n_tab))] = np.minimum(later_min[:max(0, min(s_idx, n_tab))],
                                                           r)
    thr = np.full(n_tab, _INT64_MIN, dtype=np.int64)  # lo below this: warm-up
    excl: list[int] = []
    for s in segs:
        if s.index not in seg_n:
            continue
        base = starts.get(s.index)
        if base is None:
            base = lo_first[s.index] if s.start_seen else 0
        thr[s.index] = base + warmup_iters
        if s.start_seen:
            excl.append(first_of[s.index])
    return _LaunchBounds(resume, later_min, thr, np.asarray(shape.first_idx, dtype=np.int64),
                         np.asarray(first_cov, dtype=np.int64),
                         np.asarray(sorted(excl), dtype=np.int64))


def _lean_lost_and_steady(summary: LogSummary, seg_n: dict[int, int],
                          bounds: _LaunchBounds) -> _LeanWork:
    """Lost work, productive time, the warm-up rule, the first timestamp."""
    tab = summary.iterations
    n = len(tab)
    fidx, fcov, excl_arr = bounds.fidx, bounds.fcov, bounds.excl_arr
    later_min, thr = bounds.later_min, bounds.thr
    w = _LeanWork(exactstats.PairwiseSum(n), exactstats.PairwiseSum(n),
                  {v: exactstats.PairwiseSum(c) for v, c in seg_n.items()},
                  dict.fromkeys(seg_n, 0))
    prev_it = 0
    for a, (it, seg, el, t) in tab.blocks("iteration", "segment", "elapsed_ms", "time_s"):
        k = it.shape[0]
        cov = np.empty(k, dtype=np.int64)
        cov[0] = it[0] - prev_it
        cov[1:] = it[1:] - it[:-1]
        j0, j1 = np.searchsorted(fidx, (a, a + k)).tolist()
        cov[fidx[j0:j1] - a] = fcov[j0:j1]
        np.maximum(cov, 1, out=cov)
        lo = it - cov
        lost = np.clip(it - np.maximum(lo, later_min[seg]), 0, cov)
        steady = lo >= thr[seg]
        e0, e1 = np.searchsorted(excl_arr, (a, a + k)).tolist()
        steady[excl_arr[e0:e1] - a] = False
        w.steady_bits.append(np.packbits(steady))
        w.n_steady += int(np.count_nonzero(steady))
        elapsed_s = el / 1000.0
        w.productive.add(elapsed_s * (cov - lost))
        lost_s = elapsed_s * lost
        w.lost_total.add(lost_s)
        w.lost_iters += int(lost.sum())
        if seg[0] == seg[-1] and (seg == seg[0]).all():
            v = int(seg[0])
            w.seg_sum[v].add(lost_s)
            w.seg_lost_iters[v] += int(lost.sum())
        else:
            for v in np.unique(seg).tolist():
                m = seg == v
                w.seg_sum[v].add(lost_s[m])
                w.seg_lost_iters[v] += int(lost[m].sum())
        if w.first_time is None:
            fin = np.flatnonzero(np.isfinite(t))
            if fin.size:
                kf = int(fin[0])
                w.first_time, w.first_back = float(t[kf]), float(elapsed_s[kf] * cov[kf])
        prev_it = int(it[-1])
    return w


@dataclass
class _BlockValues:
    """Each block's values of the live statistics, as `_full` has them (steady records)."""

    steady_bits: list[np.ndarray]
    fallback: bool
    default_global_batch_size: int | None
    seq_length: int | None
    flops_fn: FlopsFn | None
    n_gpus: int
    peak_tflops: float
    flops_of: dict[float, float] = field(default_factory=dict)  # batch size -> flops_fn of it

    def values(self, b: int, cols: tuple[np.ndarray, ...],
               live: list[str]) -> dict[str, np.ndarray]:
        """Block b's values of each live statistic, as `_full` has them."""
        default_global_batch_size, seq_length = self.default_global_batch_size, self.seq_length
        flops_fn, flops_of = self.flops_fn, self.flops_of
        el, gb, rep, en, pw = cols
        k = el.shape[0]
        st = (np.ones(k, dtype=bool) if self.fallback
              else np.unpackbits(self.steady_bits[b], count=k).view(bool))
        out: dict[str, np.ndarray] = {}
        for name, col in (("iter_time_ms", el), ("tflops_reported", rep), ("energy_j", en),
                          ("power_w", pw)):
            if name in live:
                v = col[st]
                out[name] = v[np.isfinite(v)]
        if not {"tokens_per_s", "tflops_per_gpu", "mfu", "gbs", "both_tflops"} & set(live):
            return out
        elapsed_s = el / 1000.0
        gbs = gb.astype(np.float64)
        if default_global_batch_size:
            gbs = np.where(gbs > 0, gbs, float(default_global_batch_size))
        gbs[gbs <= 0] = np.nan
        if "gbs" in live:
            v = gbs[st]
            out["gbs"] = v[np.isfinite(v)]
        if "tokens_per_s" in live and seq_length:
            v = (gbs * seq_length / elapsed_s)[st]
            out["tokens_per_s"] = v[np.isfinite(v)]
        if flops_fn is None or not {"tflops_per_gpu", "mfu", "both_tflops"} & set(live):
            return out
        flops = np.full(k, np.nan)
        known = np.isfinite(gbs)
        sizes, inverse = np.unique(gbs[known], return_inverse=True)
        for size in sizes.tolist():
            if size not in flops_of:
                flops_of[size] = float(np.array([flops_fn(int(size))], dtype=np.float64)[0])
        flops[known] = np.array([flops_of[s] for s in sizes.tolist()],
                                dtype=np.float64)[inverse]
        tflops = flops / (elapsed_s * self.n_gpus) / 1e12
        if "tflops_per_gpu" in live:
            v = tflops[st]
            out["tflops_per_gpu"] = v[np.isfinite(v)]
        if "mfu" in live:
            v = (tflops / self.peak_tflops)[st]
            out["mfu"] = v[np.isfinite(v)]
        if "both_tflops" in live or "both_reported" in live:
            both = st & np.isfinite(tflops) & np.isfinite(rep)
            out["both_tflops"] = tflops[both]
            out["both_reported"] = rep[both]
        return out


def _lean_statistics(summary: LogSummary, bv: _BlockValues
                     ) -> tuple[dict[str, Stats | None], float | None, float | None]:
    """Passes 3...: the statistics of the steady records (`Stats.of` of each `_full` array),
    the reported ratio and the FLOPs of the median steady batch."""
    tab = summary.iterations
    flops_fn = bv.flops_fn
    stat_cols = {name: tab.column(col) for name, col in _STAT_COLUMNS.items()}

    def printed(name: str) -> bool:  # a column of NaN has no statistics to read
        c = stat_cols[name].constant()
        return c is None or bool(np.isfinite(c))

    jobs: dict[str, exactstats.Exact] = {name: exactstats.Exact() for name in _STAT_COLUMNS
                                         if printed(name)}
    if bv.seq_length:
        jobs["tokens_per_s"] = exactstats.Exact()
    if flops_fn is not None:
        jobs["tflops_per_gpu"] = exactstats.Exact()
        jobs["mfu"] = exactstats.Exact()
        jobs["gbs"] = exactstats.Exact(total=False)  # the median steady batch size
        if printed("tflops_reported"):  # slurmpod ÷ Megatron, over records with both
            jobs["both_tflops"] = exactstats.Exact(total=False)
            jobs["both_reported"] = exactstats.Exact(total=False)
    alias = _feed_exact_statistics(summary, bv, jobs)

    def job(name: str) -> exactstats.Exact | None:
        return jobs.get(alias.get(name, name))

    def stats(name: str) -> Stats | None:
        j = job(name)
        if j is None or j.m == 0:
            return None
        p10, p50, p90 = exactstats.percentiles(j.m, j.at)
        total = j.total if j.total is not None else 0.0
        return Stats(j.m, p50, p10, p90, float(total / j.m))

    ratio = fpi = None
    bt, br = job("both_tflops"), job("both_reported")
    if bt is not None and br is not None and bt.m:
        med_rep = exactstats.median(br.m, br.at)
        if med_rep > 0:
            ratio = float(exactstats.median(bt.m, bt.at) / med_rep)
    if flops_fn is not None and jobs["gbs"].m:
        g = jobs["gbs"]
        fpi = float(flops_fn(int(exactstats.median(g.m, g.at))))
    return ({name: stats(name) for name in ("iter_time_ms", "tokens_per_s", "tflops_per_gpu",
                                            "mfu", "tflops_reported", "energy_j", "power_w")},
            ratio, fpi)


def _feed_exact_statistics(summary: LogSummary, bv: _BlockValues,
                           jobs: dict[str, exactstats.Exact]) -> dict[str, str]:
    """Read the blocks until every statistic has its order statistics; returns the aliases
    (a ratio column that is the same records as a statistic's column reads that one)."""
    tab = summary.iterations
    cols = ("elapsed_ms", "global_batch_size", "tflops_reported", "energy_j", "power_w")
    alias: dict[str, str] = {}
    first_pass = True
    while any(j.active for j in jobs.values()):
        live = [name for name, j in jobs.items() if j.active]
        for b, (_, block) in enumerate(tab.blocks(*cols)):
            got = bv.values(b, block, live)
            for name in live:
                jobs[name].feed(got[name])
        if first_pass:
            first_pass = False
            for name, ex in jobs.items():
                ex.want(exactstats.median_ranks(ex.m) if name in ("gbs", "both_tflops",
                                                                   "both_reported")
                        else exactstats.percentile_ranks(ex.m))
            both = jobs.get("both_tflops")
            if (both is not None and jobs["tflops_per_gpu"].m == both.m
                    == jobs["tflops_reported"].m):
                # The same records: their order statistics are those of the two columns.
                for name, other in (("both_tflops", "tflops_per_gpu"),
                                    ("both_reported", "tflops_reported")):
                    jobs[other].want(exactstats.median_ranks(both.m))
                    alias[name] = other
                    del jobs[name]
                live = [name for name in live if name not in alias]
        for name in live:
            jobs[name].end_pass()
    return alias


def _time_to_first(summary: LogSummary, job_start_s: float | None, first: float | None,
                   ) -> tuple[float | None, str | None]:
    """`first`: the first finite record time."""
    if first is None:
        return None, None
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


def _lean_stalls(summary: LogSummary) -> tuple[CheckpointStall, ...]:
    """`_stalls`, reading the records block by block: for each untimed save, the last record
    of its segment before it and the first after it (by byte offset)."""
    gaps = [j for j, c in enumerate(summary.checkpoints)
            if c.timer_s is None and (c.start_time_s is None or c.end_time_s is None)]
    found: dict[int, list[Any]] = {j: [None, None] for j in gaps}  # j -> [before, after]
    if gaps:
        by_seg: dict[int, list[int]] = {}
        for j in gaps:
            by_seg.setdefault(summary.checkpoints[j].segment, []).append(j)
        tab = summary.iterations
        for _, (off, seg, it, t, el) in tab.blocks("offset", "segment", "iteration", "time_s",
                                                   "elapsed_ms"):
            for v in set(np.unique(seg).tolist()) & set(by_seg):
                rows = np.flatnonzero(seg == v)
                o = off[rows]
                ordered = bool(np.all(o[1:] > o[:-1]))
                for j in by_seg[v]:
                    co = summary.checkpoints[j].offset
                    if ordered:
                        p = int(np.searchsorted(o, co, side="left"))
                        before = rows[p - 1] if p else None
                        q = int(np.searchsorted(o, co, side="right"))
                        after = rows[q] if q < rows.shape[0] else None
                    else:
                        lt, gt = np.flatnonzero(o < co), np.flatnonzero(o > co)
                        before = rows[lt[-1]] if lt.size else None
                        after = rows[gt[0]] if gt.size else None
                    if before is not None:  # a later block's record comes later
                        found[j][0] = (it[before], t[before])
                    if after is not None and found[j][1] is None:
                        found[j][1] = (it[after], t[after], el[after])
    out: list[CheckpointStall] = []
    for j, c in enumerate(summary.checkpoints):
        if c.timer_s is not None:
            out.append(CheckpointStall(c.iteration, c.segment, c.timer_s, "timer"))
        elif c.start_time_s is not None and c.end_time_s is not None:
            out.append(CheckpointStall(c.iteration, c.segment, c.end_time_s - c.start_time_s,
                                       "timestamps"))
        elif found[j][0] is not None and found[j][1] is not None:
            (it_a, t_a), (it_b, t_b, el_b) = found[j]
            iters = max(1, int(it_b - it_a))
            gap = t_b - t_a - el_b / 1000.0 * iters
            if math.isfinite(gap) and gap > 0:
                out.append(CheckpointStall(c.iteration, c.segment, float(gap), "gap"))
    return tuple(out)


__all__ = ["COLUMNS_READ", "DEFAULT_WARMUP_ITERS", "SCHEMA", "CheckpointStall", "FlopsFn",
           "IterationSeries", "JobMetrics", "SegmentInfo", "Stats", "flops_fn_for", "job_metrics"]
