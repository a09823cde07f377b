"""The figures the hooks store: live ones from a window of recent iterations, the final summary
and its time series from a whole (size-capped) log. Pure: bytes and dicts in, dicts out.

FLOPs per iteration come, in this order, from the job's Comment (`flops_per_iter`, rendered by
slurmpod from the run spec, with its `formula`), or from the log's `arguments` dump through
slurmpod's FLOPs model (`slurmpod.megatron.flops`, version `FLOPS_FORMULA_VERSION`). The peak is
the Comment's `peak_tflops`, else the one passed in (the site's GPU), else none (no MFU).

MFU = model FLOPs per iteration / (iteration time × GPUs × peak dense BF16 FLOP/s per GPU).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from slurmpod.accounting import hooks

SERIES_MAX_POINTS = 512
WARMUP_RECORDS = 2  # logged iterations per launch excluded as warm-up (compile, allocator, NCCL)


@dataclass(frozen=True)
class JobParams:
    """What turns iteration times into TFLOP/s and MFU."""

    flops_per_iter: float | None  # at `global_batch_size`
    global_batch_size: int | None
    seq_length: int | None
    gpus: int | None
    peak_tflops: float | None
    formula: str | None
    src: str  # "comment" | "args" | "none"

    def flops_at(self, gbs: int | None) -> float | None:
        """FLOPs of one iteration at the logged batch size (batch-size ramp-up scales it)."""
        if self.flops_per_iter is None:
            return None
        if gbs and gbs > 0 and self.global_batch_size:
            return self.flops_per_iter * gbs / self.global_batch_size
        return self.flops_per_iter


def _pos(x: Any) -> float | None:
    try:
        f = float(x)
    except (TypeError, ValueError):
        return None
    return f if math.isfinite(f) and f > 0 else None


def job_params(comment: Mapping[str, Any] | None, args: Mapping[str, Any] | None, *,
               gpus_hint: int | None = None, peak_hint: float | None = None) -> JobParams:
    """Combine the Comment (slurmpod-rendered), the log's arguments and hints (env, site)."""
    c = dict(comment or {})
    a = dict(args or {})
    gbs = a.get("global_batch_size")
    seq = a.get("seq_length")
    flops = _pos(c.get("flops_per_iter", c.get("flops")))
    formula = c.get("formula")
    src = "comment" if flops else "none"
    if flops is None and a:
        try:
            from slurmpod.megatron.flops import FLOPS_FORMULA_VERSION, flops_per_iteration

            flops = _pos(flops_per_iteration(a))
            formula, src = FLOPS_FORMULA_VERSION, "args"
        except Exception:  # an incomplete dump: no FLOPs, but the times still count
            flops = None
    gpus = c.get("gpus") or a.get("world_size") or gpus_hint
    peak = _pos(c.get("peak_tflops", c.get("peak"))) or _pos(peak_hint)
    return JobParams(
        flops_per_iter=flops,
        global_batch_size=int(gbs) if isinstance(gbs, int) and gbs > 0 else None,
        seq_length=int(seq) if isinstance(seq, int) and seq > 0 else None,
        gpus=int(gpus) if isinstance(gpus, int | float) and gpus and gpus > 0 else None,
        peak_tflops=peak, formula=str(formula) if formula else None,
        src=src if flops else "none")


def per_iteration(elapsed_ms: np.ndarray, gbs: np.ndarray, p: JobParams) -> dict[str, np.ndarray]:
    """TFLOP/s per GPU, MFU and tokens/s for arrays of iteration times (ms) and batch sizes."""
    iter_s = elapsed_ms / 1000.0
    n = len(iter_s)
    out: dict[str, np.ndarray] = {}
    batch = np.where(gbs > 0, gbs, p.global_batch_size or -1).astype(np.float64)
    if p.flops_per_iter and p.gpus:
        scale = (batch / p.global_batch_size) if p.global_batch_size else np.ones(n)
        scale = np.where(batch > 0, scale, 1.0)
        out["tflops"] = p.flops_per_iter * scale / iter_s / p.gpus / 1e12
        if p.peak_tflops:
            out["mfu"] = out["tflops"] / p.peak_tflops
    if p.seq_length:
        tok = np.where(batch > 0, batch * p.seq_length / iter_s, np.nan)
        if np.isfinite(tok).any():
            out["tokens_per_s"] = tok
    return out


class LiveWindow:
    """The last `size` iterations seen by the monitor (bounded memory, whatever the job length)."""

    def __init__(self, size: int = 64) -> None:
        self.rows: deque[tuple[int, float, int, float]] = deque(maxlen=size)
        self.args: Mapping[str, Any] | None = None

    def add(self, iterations: Iterable[tuple[int, float, int, float]]) -> None:
        """(iteration, elapsed_ms, global_batch_size or -1, Megatron's TFLOP/s or NaN)."""
        self.rows.extend(iterations)

    def figures(self, p: JobParams) -> dict[str, Any]:
        """Comment v1 live keys: median over the window (robust to one slow checkpoint step)."""
        if not self.rows:
            return {"peak": p.peak_tflops} if p.peak_tflops else {}
        arr = np.array(self.rows, dtype=np.float64)
        per = per_iteration(arr[:, 1], arr[:, 2], p)
        out: dict[str, Any] = {"iter": int(arr[-1, 0])}
        for key in ("mfu", "tflops", "tokens_per_s"):
            if key in per and np.isfinite(per[key]).any():
                out[key] = float(np.nanmedian(per[key]))
        if "tflops" not in out and np.isfinite(arr[:, 3]).any():
            out["tflops"] = float(np.nanmedian(arr[:, 3]))  # Megatron's own figure, no model
        if p.peak_tflops:
            out["peak"] = p.peak_tflops
        return out


def _downsample(idx: np.ndarray, max_points: int) -> np.ndarray:
    if len(idx) <= max_points:
        return idx
    return idx[np.linspace(0, len(idx) - 1, max_points).round().astype(int)]


def _rounded(values: np.ndarray, decimals: int) -> list[float | None]:
    return [None if not math.isfinite(v) else round(float(v), decimals) for v in values]


def summarise_log(data: bytes, job: Mapping[str, Any], *,
                  peak_tflops: float | None = None) -> tuple[dict[str, Any], dict[str, Any]]:
    """Final summary (AdminComment v1 keys) and time series from a job's log bytes."""
    from slurmpod.accounting.logparse import LogParser

    parser = LogParser()
    parser.feed(data)
    s = parser.close()
    comment = hooks.parse_initial_comment(job.get("comment"))
    raw_comment = hooks.decode_field(job.get("comment")) or {}
    if "formula" in raw_comment:
        comment["formula"] = raw_comment["formula"]
    gpus_hint = _gpus_from_env(job)
    p = job_params(comment, s.args, gpus_hint=gpus_hint, peak_hint=peak_tflops)
    it = s.iterations
    summary: dict[str, Any] = {"iters": len(it), "restarts": s.restarts, "src": p.src,
                               "gpus": p.gpus, "peak": p.peak_tflops, "fv": p.formula}
    series: dict[str, Any] = {}
    if len(it) == 0:
        summary["err"] = "no-iterations"
        return summary, series
    summary["last_iter"] = int(it.iteration[-1])
    per = per_iteration(it.elapsed_ms, it.global_batch_size, p)
    # Steady state: drop the first WARMUP_RECORDS logged iterations of every launch whose start
    # is in the log (a log that begins mid-run has no warm-up to drop).
    steady = np.ones(len(it), dtype=bool)
    for seg in s.segments:
        if seg.start_seen or seg.first_iteration == 1 or seg.loaded_iteration is not None:
            where = np.flatnonzero(it.segment == seg.index)
            steady[where[:WARMUP_RECORDS]] = False
    if not steady.any():
        steady = np.ones(len(it), dtype=bool)
    summary["iter_ms"] = float(np.median(it.elapsed_ms[steady]))
    for key in ("tflops", "tokens_per_s"):
        if key in per:
            vals = per[key][steady]
            vals = vals[np.isfinite(vals)]
            if len(vals):
                summary[key] = float(np.median(vals))
    if "mfu" in per:
        vals = per["mfu"][steady]
        vals = vals[np.isfinite(vals)]
        if len(vals):
            summary["mfu"] = float(np.median(vals))
            summary["mfu_p10"] = float(np.percentile(vals, 10))
            summary["mfu_p90"] = float(np.percentile(vals, 90))
    mlm = it.tflops_reported[steady]
    if np.isfinite(mlm).any():
        summary["tflops_mlm"] = float(np.nanmedian(mlm))
    idx = _downsample(np.arange(len(it)), SERIES_MAX_POINTS)
    series = {"iter": [int(x) for x in it.iteration[idx]],
              "t": _rounded(it.time_s[idx], 3),
              "iter_ms": _rounded(it.elapsed_ms[idx], 2)}
    for key, dec in (("tflops", 2), ("mfu", 5), ("tokens_per_s", 1)):
        if key in per:
            series[key] = _rounded(per[key][idx], dec)
    if np.isfinite(it.tflops_reported).any():
        series["tflops_mlm"] = _rounded(it.tflops_reported[idx], 2)
    return summary, series


def _gpus_from_env(job: Mapping[str, Any]) -> int | None:
    """GPUs of the job when the Comment does not say: `SLURM_JOB_GPUS` lists one node's GPU
    indices in 22.05 (`0,1,...,7`), times the node count; whole-node jobs only."""
    gpus = str(job.get("gpus") or "")
    n_nodes = job.get("n_nodes")
    if gpus and isinstance(n_nodes, int) and n_nodes > 0:
        per_node = len([g for g in gpus.split(",") if g.strip()])
        return per_node * n_nodes if per_node else None
    return None
