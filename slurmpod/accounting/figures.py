"""The figures the hooks store: live ones from a window of recent iterations, the final summary
and its time series from a whole (size-capped) log. Pure: bytes and dicts in, dicts out.

FLOPs per iteration come, in this order, from the job's Comment (`flops_per_iter`, rendered by
slurmpod from the run spec, with its `formula`), or from the log's `arguments` dump through
slurmpod's FLOPs model (`slurmpod.megatron.flops`, version `FLOPS_FORMULA_VERSION`). The GPU
count and the peak are never the job's: the epilog passes Slurm's allocation and the site's
GPU peak (docs/accounting.md, "What slurmpod trusts").

MFU = model FLOPs per iteration / (iteration time × GPUs × peak dense BF16 FLOP/s per GPU).
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from slurmpod.accounting import plausible
from slurmpod.model import comment as hooks

SERIES_MAX_POINTS = 512


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
               gpus: int | None = None, peak: float | None = None,
               trust_comment: bool = False) -> JobParams:
    """What turns the job's iteration times into TFLOP/s and MFU.

    `gpus` and `peak` are the trusted values: Slurm's allocation and the site file's GPU (the
    epilog). The job's Comment supplies FLOPs per iteration (with its formula); its `gpus` and
    `peak_tflops` are used only with `trust_comment` (the live monitor, which runs as the job's
    user and reports the job's own view), and then only where no trusted value is given.
    The log's arguments dump is checked like a run spec before slurmpod's FLOPs model reads it:
    an impossible model (negative layers, 10^12 layers) gives no FLOPs rather than a figure."""
    c = dict(comment or {})
    a = dict(args or {})
    gbs = a.get("global_batch_size")
    seq = a.get("seq_length")
    flops = _pos(c.get("flops_per_iter", c.get("flops")))
    formula = c.get("formula")
    src = "comment" if flops else "none"
    if flops is None and a and _dump_ok(a):
        try:
            # lazy: start-up
            # lazy: start-up
            from slurmpod.megatron.flops import FLOPS_FORMULA_VERSION, flops_per_iteration

            flops = _pos(flops_per_iteration(a))
            formula, src = FLOPS_FORMULA_VERSION, "args"
        except Exception:  # an incomplete dump: no FLOPs, but the times still count
            flops = None
    n_gpus: Any = gpus
    peak_tflops = _pos(peak)
    if trust_comment:
        n_gpus = n_gpus or c.get("gpus") or a.get("world_size")
        peak_tflops = peak_tflops or _pos(c.get("peak_tflops", c.get("peak")))
    return JobParams(
        flops_per_iter=flops,
        global_batch_size=int(gbs) if isinstance(gbs, int) and gbs > 0 else None,
        seq_length=int(seq) if isinstance(seq, int) and seq > 0 else None,
        gpus=(int(n_gpus) if isinstance(n_gpus, int | float) and not isinstance(n_gpus, bool)
              and math.isfinite(n_gpus) and n_gpus >= 1 else None),
        peak_tflops=peak_tflops, formula=str(formula) if formula else None,
        src=src if flops else "none")


def _dump_ok(args: Mapping[str, Any]) -> bool:
    from slurmpod.megatron.validate import check_dump_args  # lazy: start-up

    problem = check_dump_args(args)
    return problem is None


def is_fp8(args: Mapping[str, Any] | None) -> bool:
    """Megatron's `--fp8-format e4m3|hybrid` leaves `fp8` set in the arguments dump (None
    otherwise): the GEMMs ran in FP8, so MFU is also shown against the FP8 peak."""
    from slurmpod.megatron.runspec import fp8_format  # lazy: the hooks' start-up

    return fp8_format(args or {}) is not None


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


def _flops_fn(p: JobParams, args: Mapping[str, Any] | None) -> Callable[[int], float] | None:
    """global batch size -> FLOPs of one iteration, from the Comment's figure or the model."""
    if p.src == "comment" and p.flops_per_iter is not None:
        return lambda gbs: p.flops_at(gbs) or 0.0
    if p.src == "args" and args:
        from slurmpod.accounting.metrics import flops_fn_for  # lazy: start-up

        return flops_fn_for(args)[0]
    return None


def summarise_log(data: bytes | Iterable[bytes], job: Mapping[str, Any], *,
                  peak_tflops: float | None = None, peak_fp8: float | None = None,
                  truncated: bool = False) -> tuple[dict[str, Any], dict[str, Any]]:
    """Final summary (AdminComment v1 keys) and time series from a job's log bytes, with the
    definitions of `slurmpod.accounting.metrics.job_metrics` (the same as `slurmpod mfu`).

    Trusted inputs only decide the scale: `job["alloc_gpus"]` (Slurm's allocation, with
    `job["gsrc"]` saying how it was found) and `peak_tflops`/`peak_fp8` (the site's GPU). The
    log and the Comment supply what the job measured (iteration times, batch, FLOPs per
    iteration); every result is checked by `plausible.reasons` and flagged, never trusted.

    `truncated`: the middle of the log was not read (size cap), so the productive time is not
    known and goodput is left out."""
    from slurmpod.accounting.logparse import LogParser, epoch_to_log_clock  # lazy: start-up
    from slurmpod.accounting.metrics import job_metrics  # lazy: start-up

    parser = LogParser()
    for chunk in [data] if isinstance(data, bytes | bytearray) else data:
        parser.feed(chunk)
    s = parser.close()
    comment = hooks.parse_initial_comment(job.get("comment"))
    raw_comment = hooks.decode_field(job.get("comment")) or {}
    if "formula" in raw_comment:
        comment["formula"] = raw_comment["formula"]
    p = job_params(comment, s.args, gpus=job.get("alloc_gpus"), peak=peak_tflops)
    summary: dict[str, Any] = {"iters": len(s.iterations), "restarts": s.restarts,
                               "src": p.src, "gpus": p.gpus, "gsrc": job.get("gsrc"),
                               "peak": p.peak_tflops, "fv": p.formula}
    if len(s.iterations) == 0:
        summary["err"] = "no-iterations"
        return summary, {}
    # Slurm's epoch times -> the log's clock (the node's local wall clock read as UTC); the
    # controller's offset stands in for the batch host's (same site, same time zone).
    offset = _utc_offset_s()
    start, end = job.get("start_time"), job.get("end_time")
    start_s = epoch_to_log_clock(start, offset) if start else None
    end_s = epoch_to_log_clock(end, offset) if end else None
    alloc = (end - start) * p.gpus if start and end and end > start and p.gpus else None
    gbs_default = p.global_batch_size
    m = job_metrics(s, _flops_fn(p, s.args), p.peak_tflops or 1.0, p.gpus or 1,
                    seq_length=p.seq_length, default_global_batch_size=gbs_default,
                    flops_formula=p.formula or "none", job_start_s=start_s, job_end_s=end_s,
                    allocated_gpu_s=alloc)
    have_rate = p.gpus is not None and p.src != "none"
    summary.update({
        "iters": m.n_records, "last_iter": m.last_iteration, "restarts": m.restarts,
        "iter_ms": m.iter_time_ms.median if m.iter_time_ms else None,
        "tokens_per_s": m.tokens_per_s.median if m.tokens_per_s else None,
        "tflops_mlm": m.tflops_reported.median if m.tflops_reported else None,
        # A requeued job's log (--open-mode=append) holds earlier attempts too, while Slurm's
        # start and end are this attempt's: goodput over all attempts is the report's job
        # (it sums every attempt from `sacct -D`), not this epilog's.
        "goodput": (m.goodput if alloc and not truncated and not job.get("restart")
                    else None),
        # Likewise the time to first iteration: this attempt's start, but the first line of
        # the appended log belongs to the first attempt (it would come out negative).
        "ttfi_s": m.time_to_first_iteration_s if not job.get("restart") else None,
        "ckpt_s": m.checkpoint_stall_s if m.checkpoint_stalls else None,
    })
    if have_rate and m.tflops_per_gpu:
        summary["tflops"] = m.tflops_per_gpu.median
        if p.peak_tflops and m.mfu:
            summary.update(mfu=m.mfu.median, mfu_p10=m.mfu.p10, mfu_p90=m.mfu.p90)
            fp8_peak = _pos(peak_fp8)
            if fp8_peak and is_fp8(s.args):
                summary.update(mfu_fp8=m.mfu.median * p.peak_tflops / fp8_peak,
                               peak_fp8=fp8_peak)
    summary["implausible"] = plausible.joined(plausible.reasons(summary))
    ser = m.series
    assert ser is not None  # job_metrics keeps the series unless told series=False
    idx = _downsample(np.arange(len(ser)), SERIES_MAX_POINTS)
    series: dict[str, Any] = {
        "iter": [int(x) for x in ser.iteration[idx]],
        "segment": [int(x) for x in ser.segment[idx]],
        "t": _rounded(ser.time_s[idx], 3),
        "iter_ms": _rounded(ser.iter_time_ms[idx], 2),
        "steady": [bool(x) for x in ser.steady[idx]],
    }
    if have_rate:
        series["tflops"] = _rounded(ser.tflops_per_gpu[idx], 2)
        if p.peak_tflops:
            series["mfu"] = _rounded(ser.mfu[idx], 5)
    if np.isfinite(ser.tokens_per_s).any():
        series["tokens_per_s"] = _rounded(ser.tokens_per_s[idx], 1)
    if np.isfinite(ser.tflops_reported).any():
        series["tflops_mlm"] = _rounded(ser.tflops_reported[idx], 2)
    summary["metrics"] = {k: v for k, v in m.to_json().items() if k not in ("segments",)}
    return summary, series


def _utc_offset_s() -> float:

    lt = time.localtime()
    return float(lt.tm_gmtoff or 0)
