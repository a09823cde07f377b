"""Rule-based notes on a job report: what a person should look at after the job. Pure.

Thresholds are module constants (documented in docs/report.md). The typical MFU for a model
size comes from the caller (the fleet's GPU-hour-weighted median per size class), else from
the published range of large training runs: 30–50 % MFU (Megatron-LM on A100/H100, PaLM),
taken as 35 %.
"""

from __future__ import annotations

import math
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
# seff/jobstats verdicts (docs/report.md, "Notes"). Usage is sampled (JobAcctGatherFrequency,
# 30 s by default), so CPU and memory verdicts wait for jobs long enough to be sampled.
MIN_USAGE_S = 300
LOW_CPU_EFFICIENCY = 0.25  # busy cores / allocated cores
MEM_OVER_REQUESTED = 0.25  # peak / requested
MEM_NEAR_LIMIT = 0.90
MIN_MEM_NOTE_BYTES = 8 << 30  # requests below 8 GiB are not worth a note
TIME_OVER_REQUESTED = 0.25  # elapsed / time limit
MIN_TIME_NOTE_S = 3600  # limits under an hour are not worth a note
GPU_IDLE_PCT = 5.0  # telemetry.schema.IDLE_UTIL_PCT: jobstats' "0 % utilisation"
GPU_LOW_PCT = 50.0
HEADROOM = 1.25  # a suggested request: the peak used + 25 %


def size_class(params_b: float | None) -> str | None:
    if params_b is None:
        return None
    return next(name for bound, name in SIZE_CLASSES if params_b < bound)


def _pct(x: float) -> str:
    return f"{100 * x:.1f} %"


def _gib(n_bytes: float) -> str:
    return f"{n_bytes / (1 << 30):.3g} GiB"


def mem_request(peak_bytes: float, n_nodes: int) -> str:
    """`--mem` per node for a peak of the whole job, with HEADROOM, whole GiB."""
    per_node = peak_bytes * HEADROOM / max(n_nodes, 1)
    return f"--mem={max(1, math.ceil(per_node / (1 << 30)))}G"


def time_request(elapsed_s: float) -> str:
    """`--time` for a job that took `elapsed_s`: 1.5 × that, up to the next quarter hour."""
    quarter = max(1, math.ceil(elapsed_s * 1.5 / 900))
    h, m = divmod(quarter * 15, 60)
    return f"--time={h // 24}-{h % 24:02d}:{m:02d}:00" if h >= 24 else f"--time={h}:{m:02d}:00"


def _end_fix(state: JobState) -> str:
    if state is JobState.TIMEOUT:
        return ("raise --time, or save checkpoints before the limit and requeue "
                "(slurmpod submit sets --signal and the save timing)")
    if state is JobState.OUT_OF_MEMORY:
        return "raise --mem (or --mem-per-gpu); `sacct -j ID -o JobID,MaxRSS` shows each step"
    if state is JobState.NODE_FAIL:
        return "resubmit; `sinfo -R` shows why the node failed"
    return ""


def notes_for(r: JobReport, *, log_hints: LogHints | None = None,
              typical_mfu: Mapping[str, float] | None = None) -> list[Note]:
    """Every note on a job, in the order a reader goes through the report: how it ended, MFU,
    placement, the log's hints, lost GPU time, stability, the prediction, then seff/jobstats."""
    out = [*_end_notes(r), *_mfu_notes(r, typical_mfu), *_placement_notes(r)]
    if log_hints is not None:
        out += _log_notes(log_hints)
    out += _lost_time_notes(r)
    out += _stability_notes(r)
    v = r.predicted
    if v is not None and v.flagged:
        from slurmpod.report.predicted import cause_note  # lazy: start-up

        out.append(cause_note(v, r.stability, r.stragglers))
    elif r.stragglers is not None:
        from slurmpod.report.model import Note  # lazy: start-up
        from slurmpod.report.stragglers import FIX  # lazy: start-up

        out.append(Note("warn", "stragglers",
                        f"stragglers, by Megatron's per-rank timers: {r.stragglers.phrase()}",
                        FIX))
    if v is not None and v.above:
        from slurmpod.report.predicted import above_note  # lazy: start-up

        out.append(above_note(v))
    if r.memory is not None and r.memory.alloc_retries:
        from slurmpod.report.model import Note  # lazy: start-up

        out.append(Note(
            "warn", "memory-limit",
            f"PyTorch's allocator retried {r.memory.alloc_retries} cudaMalloc call(s) after "
            f"freeing its cache on rank {r.memory.rank}: the run is at its memory limit, and "
            "each retry synchronises the GPU",
            "free memory: PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True, selective "
            "recompute (--recompute-granularity selective), or more TP/PP (`slurmpod plan "
            "--search` ranks the layouts that fit)"))
    out += efficiency_notes(r)
    return out


def _end_notes(r: JobReport) -> list[Note]:
    """A job that ended badly (with the fix for its state), or one without a training log."""
    from slurmpod.report.model import Note  # lazy: start-up

    out: list[Note] = []
    j = r.job
    if j.state in (JobState.FAILED, JobState.TIMEOUT, JobState.NODE_FAIL,
                   JobState.OUT_OF_MEMORY, JobState.BOOT_FAIL, JobState.CANCELLED):
        sig = f", signal {j.signal}" if j.signal else ""
        out.append(Note("warn", "ended-badly", f"job ended {j.state} (exit code {j.exit_code}"
                                               f"{sig})", _end_fix(j.state)))
    if r.status == "no-training-log":
        out.append(Note("info", "no-training-log", r.status_text))
    return out


def _mfu_notes(r: JobReport, typical_mfu: Mapping[str, float] | None) -> list[Note]:
    """MFU over 100 % (a wrong peak or FLOPs), or far below the typical for the size class."""
    from slurmpod.report.model import Note  # lazy: start-up

    f = r.figures
    if not (f.mfu and f.mfu.median is not None):
        return []
    out: list[Note] = []
    if f.mfu.median > 1.0:
        out.append(Note("warn", "mfu-over-peak",
                        f"MFU {_pct(f.mfu.median)} is above 100 %: the peak "
                        f"({f.peak_tflops} TFLOP/s) or the FLOPs per iteration is wrong",
                        "check the site's gpu.peak_tflops_bf16 and the run's FLOPs "
                        "(`slurmpod mfu LOG`)"))
    cls = size_class(r.params_b)
    typical = (typical_mfu or {}).get(cls or "", DEFAULT_TYPICAL_MFU)
    if f.mfu.median < LOW_MFU_FRACTION * typical:
        what = f"{cls} models" if cls and typical_mfu and cls in typical_mfu else (
            "large training runs (30-50 %)")
        out.append(Note("warn", "low-mfu",
                        f"MFU {_pct(f.mfu.median)} is far below the typical "
                        f"{_pct(typical)} for {what}",
                        "look for a faster parallel layout with `slurmpod plan RUN.toml "
                        "--search`; check the notes on placement and start-up"))
    return out


def _placement_notes(r: JobReport) -> list[Note]:
    """Nodes spread over more SUs or racks than the job needs; nodes the site does not list."""
    from slurmpod.report.model import Note  # lazy: start-up

    p = r.placement
    if p is None:
        return []
    out: list[Note] = []
    for level in p.wider_than_needed:
        have, need = ((len(p.sus), p.min_sus) if level == "SUs"
                      else (len(p.racks), p.min_racks))
        spanned = ", ".join(p.sus if level == "SUs" else p.racks)
        out.append(Note("warn", f"placement-wide-{level.lower()}",
                        f"the job spans {have} {level} ({spanned}) "
                        f"but {r.job.n_nodes} nodes fit in {need}: more traffic crosses the "
                        f"{'spine' if level == 'SUs' else 'rack boundary'}",
                        "submit with the site's topology (slurmpod submit sets --switches "
                        "/ --segment) or ask for a block of nodes"))
    if p.unknown:
        out.append(Note("info", "unknown-nodes",
                        f"{len(p.unknown)} node(s) not in the site file "
                        f"({', '.join(p.unknown[:5])}): placement is partial"))
    return out


def _log_notes(log_hints: LogHints) -> list[Note]:
    """NCCL's topology file (unreadable, or none) and how each attempt ended."""
    from slurmpod.report.model import Note  # lazy: start-up

    out: list[Note] = []
    if log_hints.nccl_topo_warning:
        out.append(Note("warn", "nccl-topo-missing",
                        "NCCL_TOPO_FILE was set but not readable on the nodes, so NCCL "
                        "detected the topology itself (a missing topology file has cost "
                        "~20 % throughput on some sites)",
                        "make the file readable on every node, or unset NCCL_TOPO_FILE"))
    elif log_hints.nccl_info and not log_hints.nccl_topo_loaded:
        out.append(Note("info", "nccl-topo-unset",
                        "NCCL ran without a topology file (no NCCL_TOPO_FILE in its INFO "
                        "output)"))
    if len(log_hints.attempt_ends) > 1:
        ends = log_hints.attempt_ends
        out.append(Note("info", "attempt-ends",
                        f"{len(ends)} attempts ended: {', '.join(ends)} (why each ended: "
                        "`slurmpod runs`, docs/submit.md)"))
    return out


def _lost_time_notes(r: JobReport) -> list[Note]:
    """GPU time lost to start-up, checkpoint stalls and restarts; low goodput overall."""
    from slurmpod.report.model import Note  # lazy: start-up

    out: list[Note] = []
    f, loss = r.figures, r.loss
    alloc = loss.allocated_gpu_s
    causes = loss.by_cause_gpu_s
    if alloc > 0 and causes:
        if causes.get("startup", 0) / alloc > STARTUP_FRACTION:
            out.append(Note("warn", "slow-startup",
                            f"start-up took {_pct(causes['startup'] / alloc)} of the job's GPU "
                            f"time ({f.ttfi_s:.0f} s to the first iteration)",
                            "stage the container and data on local disk, load checkpoints "
                            "in parallel (Megatron's dist-ckpt)"))
        if causes.get("checkpoint", 0) / alloc > CHECKPOINT_FRACTION:
            out.append(Note("warn", "checkpoint-stalls",
                            f"checkpoint saves stalled training for "
                            f"{_pct(causes['checkpoint'] / alloc)} of the GPU time",
                            "asynchronous saves (--async-save) or the interval `slurmpod plan` "
                            "suggests (--save-interval)"))
        if causes.get("restarts", 0) > 0:
            out.append(Note("warn", "restarts",
                            f"{max(r.restarts, f.log_restarts)} restart(s) "
                            f"cost {causes['restarts'] / 3600:.3g} GPU-hours",
                            "save more often (`slurmpod plan` suggests an interval for the "
                            "job's size)"))
    good = loss.goodput
    if good is not None and good < LOW_GOODPUT and r.status == "complete":
        out.append(Note("info", "low-goodput",
                        f"goodput {_pct(good)}: {_pct(1 - good)} of the allocated GPU time "
                        "trained nothing"))
    return out


def _stability_notes(r: JobReport) -> list[Note]:
    """Iteration records far over the median, and iteration times that vary in steady state."""
    from slurmpod.report.model import SPIKE_FACTOR, Note  # lazy: start-up

    s = r.stability
    if s is None:
        return []
    out: list[Note] = []
    if s.spikes:
        out.append(Note("info", "iteration-spikes",
                        f"{s.spikes} iteration record(s) took over {SPIKE_FACTOR:g}x the "
                        f"median "
                        f"(worst {s.max_ratio:.2f}x): stragglers or hiccups"))
    if s.cv is not None and s.cv > UNSTABLE_CV:
        out.append(Note("warn", "unstable-iterations",
                        f"iteration time varies by {_pct(s.cv)} (std/mean) in steady state",
                        "look for a slow node (clocks, throttling: "
                        "`nvidia-smi -q -d PERFORMANCE`) "
                        "or I/O contention"))
    return out


def efficiency_notes(r: JobReport) -> list[Note]:
    """seff/jobstats verdicts on CPU, memory, time and GPUs, each with the fix."""
    from slurmpod.report.model import Note  # lazy: start-up

    e = r.efficiency
    if e is None:
        return []
    out: list[Note] = []
    u = e.usage
    done = r.job.state.is_terminal
    if u is not None and done:
        eff = u.cpu_efficiency
        if (eff is not None and u.elapsed_s >= MIN_USAGE_S and eff < LOW_CPU_EFFICIENCY
                and (u.req_cpus or u.alloc_cpus) > 1):
            busy = (u.cpu_s or 0.0) / u.elapsed_s
            per = f"--cpus-per-gpu={max(1, math.ceil(busy * HEADROOM / u.gpus))}" if u.gpus \
                else f"--cpus-per-task={max(1, math.ceil(busy * HEADROOM))}"
            out.append(Note("info", "cpu-low",
                            f"CPU efficiency {_pct(eff)}: {busy:.3g} of {u.alloc_cpus} "
                            "allocated cores busy on average",
                            f"request fewer CPUs ({per}), or give the data loaders more "
                            "workers if the GPUs wait for data"))
        meff = u.mem_efficiency
        if meff is not None and u.mem_peak_bytes is not None and u.req_mem_bytes:
            if meff > MEM_NEAR_LIMIT:
                out.append(Note("warn", "mem-near-limit",
                                f"memory peaked at {_gib(u.mem_peak_bytes)} of "
                                f"{_gib(u.req_mem_bytes)} requested ({_pct(meff)})",
                                f"raise the request ({mem_request(u.mem_peak_bytes, u.n_nodes)})"
                                " before the next run is killed for memory"))
            elif (meff < MEM_OVER_REQUESTED and u.elapsed_s >= MIN_USAGE_S
                  and u.req_mem_bytes >= MIN_MEM_NOTE_BYTES):
                out.append(Note("info", "mem-over-requested",
                                f"memory peaked at {_gib(u.mem_peak_bytes)} of "
                                f"{_gib(u.req_mem_bytes)} requested ({_pct(meff)})",
                                f"request {mem_request(u.mem_peak_bytes, u.n_nodes)} per node "
                                "(the peak + 25 %): smaller requests leave room for other "
                                "jobs and start sooner"))
        frac = u.time_fraction
        if (frac is not None and u.limit_s is not None and u.limit_s >= MIN_TIME_NOTE_S
                and frac < TIME_OVER_REQUESTED and r.job.state is JobState.COMPLETED):
            out.append(Note("info", "time-over-requested",
                            f"the job used {_pct(frac)} of its time limit "
                            f"({u.elapsed_s} s of {u.limit_s // 60} min)",
                            f"request {time_request(u.elapsed_s)}: backfill starts jobs "
                            "with shorter limits sooner"))
    util = e.gpu_util_pct
    g = e.gpu or {}
    idle = g.get("idle_gpus")
    n = g.get("n") or r.gpus
    if isinstance(idle, int) and idle > 0 and util is not None and util >= GPU_IDLE_PCT:
        out.append(Note("warn", "gpus-idle",
                        f"{idle} of {n} GPUs stayed idle (under {GPU_IDLE_PCT:g} % "
                        "utilisation) while the others worked",
                        "start one rank per GPU (srun --ntasks-per-node=GPUs, torchrun "
                        "--nproc-per-node=GPUs) or request fewer GPUs (--gpus-per-node)"))
    if util is not None and util < GPU_IDLE_PCT:
        out.append(Note("warn", "gpu-idle",
                        f"the GPUs were idle: {util:.1f} % mean utilisation ({e.gpu_src})",
                        "check that the job runs on the GPU at all (CUDA visible, the "
                        "framework built with CUDA); if it needs none, submit without --gpus"))
    elif util is not None and util < GPU_LOW_PCT:
        out.append(Note("info", "gpu-low-util",
                        f"GPU utilisation averaged {util:.1f} % ({e.gpu_src})",
                        "the GPUs wait: more data-loader workers, a larger micro-batch, "
                        "or fewer GPUs"))
    xid = g.get("xid")
    if isinstance(xid, int) and xid > 0:
        codes = f" (XID {g['xid_codes']})" if g.get("xid_codes") else ""
        out.append(Note("warn", "gpu-xid",
                        f"{xid} GPU XID error(s){codes} on the job's GPUs",
                        "report the node to the admins (XID 48/63/64/79/94/95 mean a failing "
                        "GPU); exclude it with --exclude until it is checked"))
    return out
