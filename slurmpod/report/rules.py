"""Rule-based notes on a job report: what a person should look at after the job. Pure.

Thresholds are module constants (documented in docs/report.md). The typical MFU for a model
size comes from the caller (the fleet's GPU-hour-weighted median per size class), else from
the published range of large training runs: 30–50 % MFU (Megatron-LM on A100/H100, PaLM),
taken as 35 %.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from slurmpod.model.jobs import JobState

if TYPE_CHECKING:
    from slurmpod.report.model import JobReport, LogHints, Note

DEFAULT_TYPICAL_MFU = 0.35
LOW_MFU_FRACTION = 0.6  # MFU below 60 % of the typical for the size class is "far below"
STARTUP_FRACTION = 0.10  # start-up over 10 % of the job's run time
CHECKPOINT_FRACTION = 0.05
LOW_GOODPUT = 0.80
UNSTABLE_CV = 0.10  # iteration times varying by more than 10 % (std / mean)
SIZE_CLASSES = ((1.0, "<1B"), (10.0, "1-10B"), (100.0, "10-100B"), (float("inf"), ">=100B"))


def size_class(params_b: float | None) -> str | None:
    if params_b is None:
        return None
    return next(name for bound, name in SIZE_CLASSES if params_b < bound)


def _pct(x: float) -> str:
    return f"{100 * x:.1f} %"


def notes_for(r: JobReport, *, log_hints: LogHints | None = None,
              typical_mfu: Mapping[str, float] | None = None) -> list[Note]:
    from slurmpod.report.model import SPIKE_FACTOR, Note

    out: list[Note] = []
    j, f, loss = r.job, r.figures, r.loss
    if j.state in (JobState.FAILED, JobState.TIMEOUT, JobState.NODE_FAIL,
                   JobState.OUT_OF_MEMORY, JobState.BOOT_FAIL, JobState.CANCELLED):
        sig = f", signal {j.signal}" if j.signal else ""
        out.append(Note("warn", "ended-badly", f"job ended {j.state} (exit code {j.exit_code}"
                                               f"{sig})"))
    if r.status == "no-training-log":
        out.append(Note("info", "no-training-log", r.status_text))
    if f.mfu and f.mfu.median is not None:
        if f.mfu.median > 1.0:
            out.append(Note("warn", "mfu-over-peak",
                            f"MFU {_pct(f.mfu.median)} is above 100 %: the peak "
                            f"({f.peak_tflops} TFLOP/s) or the FLOPs per iteration is wrong"))
        cls = size_class(r.params_b)
        typical = (typical_mfu or {}).get(cls or "", DEFAULT_TYPICAL_MFU)
        if f.mfu.median < LOW_MFU_FRACTION * typical:
            what = f"{cls} models" if cls and typical_mfu and cls in typical_mfu else (
                "large training runs (30-50 %)")
            out.append(Note("warn", "low-mfu",
                            f"MFU {_pct(f.mfu.median)} is far below the typical "
                            f"{_pct(typical)} for {what}"))
    p = r.placement
    if p is not None:
        for level in p.wider_than_needed:
            have, need = ((len(p.sus), p.min_sus) if level == "SUs"
                          else (len(p.racks), p.min_racks))
            out.append(Note("warn", f"placement-wide-{level.lower()}",
                            f"the job spans {have} {level} ({', '.join(p.sus if level == 'SUs' else p.racks)}) "  # noqa: E501
                            f"but {j.n_nodes} nodes fit in {need}: more traffic crosses the "
                            f"{'spine' if level == 'SUs' else 'rack boundary'}"))
        if p.unknown:
            out.append(Note("info", "unknown-nodes",
                            f"{len(p.unknown)} node(s) not in the site file "
                            f"({', '.join(p.unknown[:5])}): placement is partial"))
    if log_hints is not None:
        if log_hints.nccl_topo_warning:
            out.append(Note("warn", "nccl-topo-missing",
                            "NCCL_TOPO_FILE was set but not readable on the nodes, so NCCL "
                            "detected the topology itself (a missing topology file has cost "
                            "~20 % throughput on some sites)"))
        elif log_hints.nccl_info and not log_hints.nccl_topo_loaded:
            out.append(Note("info", "nccl-topo-unset",
                            "NCCL ran without a topology file (no NCCL_TOPO_FILE in its INFO "
                            "output)"))
        if len(log_hints.attempt_ends) > 1:
            ends = log_hints.attempt_ends
            out.append(Note("info", "attempt-ends",
                            f"{len(ends)} attempts ended: {', '.join(ends)} (why each ended: "
                            "`slurmpod runs`, docs/submit.md)"))
    alloc = loss.allocated_gpu_s
    causes = loss.by_cause_gpu_s
    if alloc > 0 and causes:
        if causes.get("startup", 0) / alloc > STARTUP_FRACTION:
            out.append(Note("warn", "slow-startup",
                            f"start-up took {_pct(causes['startup'] / alloc)} of the job's GPU "
                            f"time ({f.ttfi_s:.0f} s to the first iteration)"))
        if causes.get("checkpoint", 0) / alloc > CHECKPOINT_FRACTION:
            out.append(Note("warn", "checkpoint-stalls",
                            f"checkpoint saves stalled training for "
                            f"{_pct(causes['checkpoint'] / alloc)} of the GPU time; consider "
                            "asynchronous or less frequent saves"))
        if causes.get("restarts", 0) > 0:
            out.append(Note("warn", "restarts",
                            f"{max(j.restarts, len(r.attempts) - 1, f.log_restarts)} restart(s) "
                            f"cost {causes['restarts'] / 3600:.3g} GPU-hours"))
    good = loss.goodput
    if good is not None and good < LOW_GOODPUT and r.status == "complete":
        out.append(Note("info", "low-goodput",
                        f"goodput {_pct(good)}: {_pct(1 - good)} of the allocated GPU time "
                        "trained nothing"))
    s = r.stability
    if s is not None:
        if s.spikes:
            out.append(Note("info", "iteration-spikes",
                            f"{s.spikes} iteration record(s) took over {SPIKE_FACTOR:g}x the "
                            f"median "
                            f"(worst {s.max_ratio:.2f}x): stragglers or hiccups"))
        if s.cv is not None and s.cv > UNSTABLE_CV:
            out.append(Note("warn", "unstable-iterations",
                            f"iteration time varies by {_pct(s.cv)} (std/mean) in steady state"))
    return out
