"""The per-job efficiency report: Slurm's accounting record + the hooks' figures -> JobReport.

Pure: no Slurm, no files. Inputs are a `SacctJob` (sacct record and its attempts), the
AdminComment summary the epilog stored (in the record), the spool record (summary + time
series) when there is one, the site inventory and hints read from the job's log.

Where figures come from, best first:
1. the spool record (`<spool>/records/<job>.<restart>.json`): full statistics and the series;
2. the AdminComment v1 (`hooks.ADMIN_FIELDS`): medians, MFU p10/p90, goodput, start-up, stalls;
3. for a running job, the live Comment v1 (`mfu`, `tflops`, `iter`, `tokens_per_s`).

GPU time (per GPU, seconds; × GPUs for GPU-seconds), all attempts of a requeued job included:
allocated A = Σ attempts' elapsed; productive P = the log's productive time (Megatron's iteration
timer, minus iterations redone after a restart), or goodput × the last attempt's elapsed when
only the AdminComment is there. Lost = A − P, split into: the redone iterations (measured exactly
by the log, so taken first), start-up (job start to the start of the first logged iteration),
checkpoint stalls, then the rest. Redone work and the rest count as "restarts" when the job
restarted (relaunch start-ups, the failed attempt's tail), the rest as "other" otherwise
(evaluation, shutdown, hangs). Each part is capped by what is left of A − P, in that order, so
the causes add up to A − P exactly; Slurm's whole-second elapsed times can only squeeze the
estimated parts. Goodput = P / A.

A resized job (with `--no-kill`, slurmpod's `--spares`, Slurm removes a node that went down from
the job: the old allocation's record ends RESIZING and a new one opens under the same id) is
not a restart: a RESIZING record does not count as one, and when the records say the GPUs each
phase held (AllocTRES), the GPU time is Σ phases' elapsed × their GPUs. The GPUs a phase held
beyond those the job trained on (spares, a failed node until Slurm removed it) are lost as
"other", the causes above scale with the trained GPUs.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

from slurmpod.accounting import plausible
from slurmpod.model.comment import decode_field
from slurmpod.model.hostlist import expand
from slurmpod.model.site import Inventory
from slurmpod.report.placement import Placement
from slurmpod.report.sacct import Attempt, Usage, restarts_of
from slurmpod.telemetry.schema import read_gpu_summary

LOSS_CAUSES = ("startup", "checkpoint", "restarts", "other")
SPIKE_FACTOR = 1.5  # an iteration this many times the median is a spike (straggler, hiccup)


@dataclass(frozen=True)
class Dist:
    """median, p10, p90 of a steady-state figure (p10/p90 may be unknown)."""

    median: float | None
    p10: float | None = None
    p90: float | None = None

    def to_json(self) -> dict[str, float | None]:
        return {"median": self.median, "p10": self.p10, "p90": self.p90}


@dataclass(frozen=True)
class LogHints:
    """What the CLI found in the job's log file, when it could read it."""

    path: str
    nccl_topo_warning: bool = False  # slurmpod's sbatch: NCCL_TOPO_FILE not readable, unset
    nccl_topo_loaded: bool = False  # NCCL INFO: "NCCL_TOPO_FILE set by environment to ..."
    nccl_info: bool = False  # NCCL_DEBUG=INFO output present (so absence of the above means)
    # Why each attempt ended, from the job script's .slurmpod/attempts.jsonl beside the logs
    # (the job owns that file: shown as words from a fixed set, never used as numbers).
    attempt_ends: tuple[str, ...] = ()
    # Megatron's `--- arguments ---` dump from the log's head (the model and layout the job
    # ran): only fed to the performance model (report/predicted.py), after check_dump_args.
    args: Mapping[str, Any] | None = field(default=None, compare=False, hash=False)


@dataclass(frozen=True)
class Figures:
    source: str  # "spool" | "admin_comment" | "live_comment" | "none"
    iters: int | None = None
    last_iter: int | None = None
    mfu: Dist | None = None
    tflops: Dist | None = None
    tokens_per_s: float | None = None
    iter_ms: Dist | None = None
    peak_tflops: float | None = None
    formula: str | None = None
    gpus: int | None = None
    log_restarts: int = 0
    hook_goodput: float | None = None
    ttfi_s: float | None = None
    checkpoint_s: float | None = None
    productive_s: float | None = None  # per GPU
    redone_s: float | None = None  # iterations run again after a restart (per GPU)
    checkpoints: tuple[tuple[int, float], ...] = ()  # (iteration, seconds)
    err: str | None = None
    # Time the first logged record itself trained: the epilog's time to first iteration ends
    # when that line is printed, so it includes this productive time, not start-up.
    first_record_s: float | None = None
    mfu_fp8: float | None = None  # FP8 runs: median MFU against the FP8 dense peak
    peak_fp8: float | None = None
    flagged: tuple[str, ...] = ()  # reasons the epilog found the figures implausible

    @property
    def has_training(self) -> bool:
        return bool(self.iters) or self.mfu is not None or self.tflops is not None


@dataclass(frozen=True)
class Loss:
    allocated_gpu_s: float
    productive_gpu_s: float | None
    by_cause_gpu_s: dict[str, float] = field(default_factory=dict)

    @property
    def goodput(self) -> float | None:
        if self.productive_gpu_s is None or self.allocated_gpu_s <= 0:
            return None
        return self.productive_gpu_s / self.allocated_gpu_s

    @property
    def lost_gpu_s(self) -> float | None:
        return sum(self.by_cause_gpu_s.values()) if self.by_cause_gpu_s else None

    def to_json(self) -> dict[str, Any]:
        return {
            "allocated_gpu_hours": _h(self.allocated_gpu_s),
            "productive_gpu_hours": _h(self.productive_gpu_s),
            "goodput": self.goodput,
            "lost_gpu_hours": _h(self.lost_gpu_s),
            "lost_gpu_hours_by_cause": {k: _h(v) for k, v in self.by_cause_gpu_s.items()},
        }


@dataclass(frozen=True)
class Stability:
    n: int
    median_ms: float | None
    cv: float | None  # std / mean of steady iteration times
    spread: float | None  # (p90 - p10) / median
    spikes: int
    max_ratio: float | None  # slowest steady iteration / median
    spike_iters: tuple[int, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {"n": self.n, "median_ms": self.median_ms, "cv": self.cv, "spread": self.spread,
                "spikes": self.spikes, "spike_factor": SPIKE_FACTOR,
                "max_ratio": self.max_ratio, "spike_iterations": list(self.spike_iters[:50])}


@dataclass(frozen=True)
class Note:
    level: str  # "warn" | "info"
    code: str
    text: str
    fix: str = ""  # what to change (a Slurm option, a setting), when there is one

    def to_json(self) -> dict[str, str]:
        return {"level": self.level, "code": self.code, "text": self.text, "fix": self.fix}


GIB = float(1 << 30)


@dataclass(frozen=True)
class Efficiency:
    """seff/jobstats figures of one job: Slurm's usage (CPU, memory, time), the GPUs'
    telemetry and energy. None anywhere means "not measured", never zero.

    GPU figures: the telemetry summary the epilog stored (`slurmpod.telemetry.schema`, checked
    by `read_gpu_summary`), else Slurm's gres/gpuutil and gres/gpumem from the usage query.
    Energy, best first: the GPUs' own (telemetry), the nodes' (Slurm's ConsumedEnergyRaw, when
    an acct_gather_energy plugin is configured), Megatron's `--log-energy` figures × the
    iterations logged. Energy per token needs a Megatron job's tokens."""

    usage: Usage | None
    gpu: Mapping[str, Any] | None = None  # the checked telemetry summary
    energy_j: float | None = None
    energy_src: str | None = None  # "gpu:<how>" | "slurm" | "megatron-log"
    energy_per_token_j: float | None = None

    @property
    def gpu_src(self) -> str | None:
        if self.gpu is not None:
            return str(self.gpu.get("src") or "telemetry")
        u = self.usage
        if u is not None and (u.gpu_util_pct is not None or u.gpu_mem_bytes is not None):
            return "sacct"
        return None

    @property
    def gpu_util_pct(self) -> float | None:
        if self.gpu is not None:
            return _f(self.gpu.get("util"))
        return self.usage.gpu_util_pct if self.usage else None

    @property
    def gpu_mem_gib(self) -> float | None:
        if self.gpu is not None:
            return _f(self.gpu.get("mem_gib"))
        u = self.usage
        return u.gpu_mem_bytes / GIB if u and u.gpu_mem_bytes is not None else None

    def to_json(self) -> dict[str, Any]:
        g = dict(self.gpu) if self.gpu is not None else {}
        return {
            "slurm": self.usage.to_json() if self.usage else None,
            "gpu": {"source": self.gpu_src, "util_pct": self.gpu_util_pct,
                    "mem_gib": self.gpu_mem_gib, "mem_total_gib": _f(g.get("mem_total_gib")),
                    "idle_gpus": g.get("idle_gpus"), "sm_pct": _f(g.get("sm")),
                    "tensor_pct": _f(g.get("tensor")), "power_w": _f(g.get("power_w")),
                    "power_max_w": _f(g.get("power_max_w")),
                    "temp_max_c": _f(g.get("temp_max_c")), "xid": g.get("xid"),
                    "xid_codes": g.get("xid_codes"), "trust": g.get("trust")},
            "energy_j": self.energy_j, "energy_source": self.energy_src,
            "energy_per_token_j": self.energy_per_token_j,
        }


@dataclass(frozen=True)
class JobReport:
    job: Any  # JobRecord
    attempts: tuple[Any, ...]
    status: str  # "complete" | "running" | "no-training-log"
    status_text: str
    figures: Figures
    loss: Loss
    stability: Stability | None
    placement: Placement | None
    params_b: float | None  # model size estimated from FLOPs and tokens (6·N per token)
    series: dict[str, list[Any]] = field(default_factory=dict)
    notes: tuple[Note, ...] = ()
    # Why these figures cannot be right (plausible.reasons); such a job is shown, labelled,
    # and left out of every fleet aggregate.
    implausible: tuple[str, ...] = ()
    # seff/jobstats figures; a job report only (a fleet report does not query step usage).
    efficiency: Efficiency | None = None
    # Achieved vs predicted (report/predicted.py): a finished job whose log has the arguments
    # dump, on nodes of one GPU type of the site file; None otherwise.
    predicted: Any = None  # VsPredicted
    # Ranks whose own compute ran well above their pipeline stage's median, from Megatron's
    # per-rank timers in the log (report/stragglers.py); None without them or without any.
    stragglers: Any = None  # StragglerFinding
    # Megatron's memory report of the rank that held the most, beside slurmpod's estimate
    # (report/memory.py); None without one.
    memory: Any = None  # JobMemory

    @property
    def queue_s(self) -> float | None:
        """Queue time of the first attempt (later attempts' waits are requeue delays)."""
        j = self.job
        if self.attempts and self.attempts[0].submit_s and self.attempts[0].start_s:
            return float(max(0, self.attempts[0].start_s - self.attempts[0].submit_s))
        if j.submit_time is None or j.start_time is None:
            return None
        return max(0.0, j.start_time.timestamp() - j.submit_time.timestamp())

    @property
    def gpus(self) -> int:
        return self.job.n_gpus or self.figures.gpus or 0

    @property
    def restarts(self) -> int:
        """Restarts: Slurm's count or the records'; a resize (RESIZING) is not one."""
        return max(self.job.restarts, restarts_of(self.attempts))

    @property
    def resizes(self) -> int:
        return sum(1 for a in self.attempts[:-1] if a.resized)

    def to_json(self, series: bool = False) -> dict[str, Any]:
        j = self.job
        f = self.figures
        out: dict[str, Any] = {
            "schema": "slurmpod.report.job/1",
            "status": self.status, "status_text": self.status_text,
            "job": {
                "job_id": j.job_id, "name": j.name, "user": j.user, "account": j.account,
                "partition": j.partition, "state": str(j.state), "exit_code": j.exit_code,
                "signal": j.signal, "nodes": j.nodes, "n_nodes": j.n_nodes, "n_gpus": self.gpus,
                "submit": _iso(j.submit_time), "start": _iso(j.start_time),
                "end": _iso(j.end_time), "elapsed_s": j.elapsed_s, "queue_s": self.queue_s,
                "restarts": self.restarts, "resizes": self.resizes,
                "attempts": [{"submit": a.submit_s, "start": a.start_s, "end": a.end_s,
                              "elapsed_s": a.elapsed_s, "state": a.state, "gpus": a.gpus,
                              "resize": a.resized}
                             for a in self.attempts],
            },
            "placement": self.placement.to_json() if self.placement else None,
            "figures": {
                "source": f.source, "iterations": f.iters, "last_iteration": f.last_iter,
                "mfu": f.mfu.to_json() if f.mfu else None,
                "tflops_per_gpu": f.tflops.to_json() if f.tflops else None,
                "tokens_per_s": f.tokens_per_s,
                "iteration_ms": f.iter_ms.to_json() if f.iter_ms else None,
                "peak_tflops": f.peak_tflops, "flops_formula": f.formula,
                "log_restarts": f.log_restarts, "time_to_first_iteration_s": f.ttfi_s,
                "checkpoint_stall_s": f.checkpoint_s, "redone_s": f.redone_s,
                "params_billion": self.params_b, "error": f.err,
                "mfu_fp8": f.mfu_fp8, "peak_fp8_tflops": f.peak_fp8,
                "implausible": list(self.implausible),
            },
            "gpu_time": self.loss.to_json(),
            "stability": self.stability.to_json() if self.stability else None,
            "notes": [n.to_json() for n in self.notes],
            "predicted": self.predicted.to_json() if self.predicted is not None else None,
            "stragglers": self.stragglers.to_json() if self.stragglers is not None else None,
            "memory": self.memory.to_json() if self.memory is not None else None,
        }
        if self.efficiency is not None:
            out["efficiency"] = self.efficiency.to_json()
        if series:
            out["series"] = self.series
        return out


def _iso(t: datetime | None) -> str | None:
    return t.isoformat() if t else None


def _h(gpu_s: float | None) -> float | None:
    return None if gpu_s is None else gpu_s / 3600.0


def finite(x: Any) -> float | None:
    """A finite float from a JSON value, else None (missing, bool, text, NaN, inf)."""
    if type(x) is float:  # the usual case, first: a fleet report reads ~20 per job
        return x if x - x == 0.0 else None  # NaN and ±inf give NaN
    if x is None or isinstance(x, bool):
        return None
    try:
        v = float(x)
    except (TypeError, ValueError):
        return None
    return v if math.isfinite(v) else None


_f = finite


def _i(x: Any) -> int | None:
    v = _f(x)
    return None if v is None else int(v)


def _dist(stats: Any) -> Dist | None:
    if type(stats) is not dict and not isinstance(stats, Mapping):
        return None
    median = _f(stats.get("median"))
    if median is None:
        return None
    return Dist(median, _f(stats.get("p10")), _f(stats.get("p90")))


def figures_from_spool(record: Mapping[str, Any]) -> Figures:
    """Figures of an epilog spool record (v1: `summary` with `metrics`, `series`)."""
    s = record.get("summary") or {}
    m = s.get("metrics") or {}
    peak = _f(s.get("peak"))
    mfu = _dist(m.get("mfu")) if peak and s.get("mfu") is not None else None
    if mfu is None and _f(s.get("mfu")) is not None:
        mfu = Dist(_f(s.get("mfu")), _f(s.get("mfu_p10")), _f(s.get("mfu_p90")))
    tflops = _dist(m.get("tflops_per_gpu")) if s.get("tflops") is not None else None
    if tflops is None and _f(s.get("tflops")) is not None:
        tflops = Dist(_f(s.get("tflops")))
    tokens = _dist(m.get("tokens_per_s"))
    stalls = tuple((int(c.get("iteration", 0)), float(c.get("duration_s", 0.0)))
                   for c in m.get("checkpoint_stalls") or [] if isinstance(c, Mapping))
    ser = record.get("series") or {}
    its, ms = ser.get("iter") or [], ser.get("iter_ms") or []
    first_s = None
    if its and ms and _f(ms[0]) is not None:
        # The first line covers one log interval: the step to the next line (series keep
        # their first point when downsampled).
        covered = its[1] - its[0] if len(its) > 1 and its[1] > its[0] else 1
        first_s = float(ms[0]) / 1000.0 * covered
    return Figures(
        source="spool", iters=_i(s.get("iters")), last_iter=_i(s.get("last_iter")), mfu=mfu,
        tflops=tflops,
        tokens_per_s=tokens.median if tokens else _f(s.get("tokens_per_s")),
        iter_ms=_dist(m.get("iter_time_ms")) or (Dist(_f(s.get("iter_ms")))
                                                 if _f(s.get("iter_ms")) else None),
        peak_tflops=peak, formula=s.get("fv"), gpus=_i(s.get("gpus")),
        log_restarts=_i(s.get("restarts")) or 0, hook_goodput=_f(s.get("goodput")),
        ttfi_s=_f(s.get("ttfi_s")), checkpoint_s=_f(m.get("checkpoint_stall_s",
                                                          s.get("ckpt_s"))),
        productive_s=_f(m.get("productive_s")), redone_s=_f(m.get("lost_s")),
        checkpoints=stalls, err=s.get("err"), first_record_s=first_s,
        mfu_fp8=_f(s.get("mfu_fp8")), peak_fp8=_f(s.get("peak_fp8")),
        flagged=plausible.split(s.get("implausible")))


def figures_from_admin(doc: Mapping[str, Any]) -> Figures:
    """Figures of an AdminComment v1 (already decoded)."""
    peak = _f(doc.get("peak"))
    mfu = (Dist(_f(doc.get("mfu")), _f(doc.get("mfu_p10")), _f(doc.get("mfu_p90")))
           if _f(doc.get("mfu")) is not None else None)
    tflops = Dist(_f(doc.get("tflops"))) if _f(doc.get("tflops")) is not None else None
    if tflops is not None and mfu is not None and peak:
        tflops = Dist(tflops.median, *(None if v is None else v * peak
                                       for v in (mfu.p10, mfu.p90)))
    return Figures(
        source="admin_comment", iters=_i(doc.get("iters")), last_iter=_i(doc.get("last_iter")),
        mfu=mfu, tflops=tflops, tokens_per_s=_f(doc.get("tokens_per_s")),
        iter_ms=Dist(_f(doc.get("iter_ms"))) if _f(doc.get("iter_ms")) else None,
        peak_tflops=peak, formula=doc.get("fv"), gpus=_i(doc.get("gpus")),
        log_restarts=_i(doc.get("restarts")) or 0, hook_goodput=_f(doc.get("goodput")),
        ttfi_s=_f(doc.get("ttfi_s")), checkpoint_s=_f(doc.get("ckpt_s")), err=doc.get("err"),
        mfu_fp8=_f(doc.get("mfu_fp8")), peak_fp8=_f(doc.get("peak_fp8")),
        flagged=plausible.split(doc.get("implausible")))


def figures_from_live(doc: Mapping[str, Any], site_peak: float | None = None) -> Figures:
    """Figures of a running job's Comment v1 (the monitor's window medians).

    The Comment is the job's own: its TFLOP/s is what the job measured (range-checked like any
    job-supplied figure), but its GPU count is never used and, when the site file knows the
    job's nodes, MFU is recomputed against the site's peak rather than the Comment's."""
    mfu = _f(doc.get("mfu"))
    tflops = _f(doc.get("tflops"))
    peak = _f(doc.get("peak"))
    if site_peak and tflops is not None:
        mfu, peak = tflops / site_peak, site_peak
    return Figures(source="live_comment", last_iter=_i(doc.get("iter")),
                   mfu=Dist(mfu) if mfu is not None else None,
                   tflops=Dist(tflops) if tflops is not None else None,
                   tokens_per_s=_f(doc.get("tokens_per_s")), peak_tflops=peak,
                   formula=doc.get("formula"))


def choose_figures(job: Any, spool_record: Mapping[str, Any] | None,
                   site_peak: float | None = None) -> Figures:
    if spool_record is not None:
        fig = figures_from_spool(spool_record)
        if fig.has_training or fig.err:
            return fig
    text = job.admin_comment
    # sacctmgr stores quotes as backticks (hooks.py): decode that form directly rather than
    # letting decode_field fail on it first (a fleet report decodes thousands).
    admin = decode_field(text.replace("`", '"') if text.startswith("{`") else text)
    if admin and admin.get("v") == 1:
        return figures_from_admin(admin)
    if job.state.is_active:
        live = decode_field(job.comment)
        if live and ("mfu" in live or "tflops" in live):
            return figures_from_live(live, site_peak)
    return Figures(source="none")


def implausible_reasons(fig: Figures, restarted: bool = False) -> tuple[str, ...]:
    """The epilog's flags plus what the report itself can see, without repeats.

    A requeued job's hook figures of time (time to first iteration, goodput) are measured on a
    log that holds earlier attempts too: the report does not show them as they are (it leaves a
    negative start-up out and recomputes goodput over every attempt, module docstring), so they
    are not judged for such a job; its rates still are."""
    mine = plausible.reasons({
        "mfu": fig.mfu.median if fig.mfu else None,
        "mfu_p10": fig.mfu.p10 if fig.mfu else None,
        "mfu_p90": fig.mfu.p90 if fig.mfu else None,
        "tflops": fig.tflops.median if fig.tflops else None,
        "tokens_per_s": fig.tokens_per_s,
        "iter_ms": fig.iter_ms.median if fig.iter_ms else None,
        "ckpt_s": fig.checkpoint_s,
        "ttfi_s": None if restarted else fig.ttfi_s,
        "goodput": None if restarted else fig.hook_goodput})
    flagged = fig.flagged
    if restarted:
        flagged = tuple(r for r in flagged if not r.startswith(("ttfi-s-", "goodput-")))
    return tuple(dict.fromkeys((*flagged, *mine)))


def _site_peak(nodelist: str, inventory: Inventory | None) -> float | None:
    """The site's dense BF16 peak of a job's nodes (one GPU type), else None."""
    if inventory is None or not nodelist:
        return None

    try:
        return inventory.peak_of(expand(nodelist))
    except ValueError:
        return None


def split_loss(gpus: int, attempts_elapsed: Sequence[int], fig: Figures,
               phases: Sequence[Attempt] = ()) -> Loss:
    """GPU time and where it went (the module docstring has the rules). `phases`: the job's
    sacct records, for resizes and the GPUs each held (used when every record says its GPUs);
    `attempts_elapsed`: their elapsed times, or the job's alone."""
    if phases and all(a.gpus is not None for a in phases):
        # A resize is not a restart, and the trainer ran through it: its wall time is the job's.
        most = max(a.gpus or 0 for a in phases)
        trained = fig.gpus if fig.gpus and fig.gpus <= most else gpus
        held = [max(a.gpus or 0, trained) for a in phases]
        loss = _split(trained, [a.elapsed_s for a in phases], fig,
                      restarts_of(phases) > 0 or fig.log_restarts > 0)
        spare = float(sum(a.elapsed_s * (g - trained) for a, g in zip(phases, held, strict=True)))
        if loss.productive_gpu_s is None or not spare:
            return replace(loss, allocated_gpu_s=loss.allocated_gpu_s + spare)
        causes = dict(loss.by_cause_gpu_s)
        causes["other"] = causes.get("other", 0.0) + spare  # held, not trained on
        return Loss(loss.allocated_gpu_s + spare, loss.productive_gpu_s, causes)
    return _split(gpus, attempts_elapsed, fig, len(attempts_elapsed) > 1 or fig.log_restarts > 0)


def _split(gpus: int, attempts_elapsed: Sequence[int], fig: Figures, restarted: bool) -> Loss:
    alloc_s = float(sum(attempts_elapsed))
    allocated = alloc_s * gpus
    prod_s = fig.productive_s
    if prod_s is None and fig.hook_goodput is not None and attempts_elapsed:
        # The epilog's goodput is productive / (last attempt's elapsed × GPUs).
        prod_s = fig.hook_goodput * attempts_elapsed[-1]
    if prod_s is None or gpus <= 0:
        return Loss(allocated, None)
    prod_s = min(max(prod_s, 0.0), alloc_s)
    rest = alloc_s - prod_s
    redone = min(max(fig.redone_s or 0.0, 0.0), rest)
    rest -= redone
    startup = min(max((fig.ttfi_s or 0.0) - (fig.first_record_s or 0.0), 0.0), rest)
    rest -= startup
    ckpt = min(max(fig.checkpoint_s or 0.0, 0.0), rest)
    rest -= ckpt
    causes = {"startup": startup, "checkpoint": ckpt,
              "restarts": redone + rest if restarted else redone,
              "other": 0.0 if restarted else rest}
    return Loss(allocated, prod_s * gpus, {k: v * gpus for k, v in causes.items()})


def stability_of(series: Mapping[str, Sequence[Any]], fig: Figures) -> Stability | None:
    """Iteration-time stability over the steady-state records (stragglers show as spikes)."""
    ms = series.get("iter_ms") or []
    steady = series.get("steady") or [True] * len(ms)
    iters = series.get("iter") or [0] * len(ms)
    vals = [(int(i), float(v)) for i, v, s in zip(iters, ms, steady, strict=False)
            if s and v is not None and math.isfinite(v)]
    if len(vals) >= 2:
        xs = sorted(v for _, v in vals)
        med = _median(xs)
        mean = sum(xs) / len(xs)
        var = sum((x - mean) ** 2 for x in xs) / len(xs)
        spikes = tuple(i for i, v in vals if v > SPIKE_FACTOR * med)
        p10, p90 = _pct(xs, 10), _pct(xs, 90)
        return Stability(len(xs), med, math.sqrt(var) / mean if mean > 0 else None,
                         (p90 - p10) / med if med > 0 else None, len(spikes),
                         xs[-1] / med if med > 0 else None, spikes)
    d = fig.iter_ms
    if d and d.median and d.p10 is not None and d.p90 is not None:
        return Stability(0, d.median, None, (d.p90 - d.p10) / d.median, 0, None)
    return None


def _median(xs: Sequence[float]) -> float:
    return _pct(xs, 50)


def _pct(xs: Sequence[float], q: float) -> float:
    """Linear-interpolation percentile of sorted values (numpy's default method)."""
    pos = (len(xs) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def params_estimate(fig: Figures, gpus: int) -> float | None:
    """Parameters (billions) from model FLOPs ≈ 6·N per token: TFLOP/s·GPUs / (6·tokens/s).
    Attention adds FLOPs beyond 6·N, so this slightly overstates N; it only picks a size class."""
    if not fig.tflops or not fig.tflops.median or not fig.tokens_per_s or gpus <= 0:
        return None
    return fig.tflops.median * 1e12 * gpus / (6.0 * fig.tokens_per_s) / 1e9


def efficiency_of(report: JobReport, usage: Usage | None,
                  spool_record: Mapping[str, Any] | None) -> Efficiency:
    """The job's efficiency figures (the Efficiency docstring says where each comes from)."""

    gpu = read_gpu_summary(spool_record) if spool_record is not None else None
    f = report.figures
    # Tokens the job trained: tokens/s (steady state, whole job) × its productive time.
    tokens = (f.tokens_per_s * f.productive_s
              if f.tokens_per_s and f.productive_s and f.productive_s > 0 else None)
    energy = src = per_token = None
    if gpu is not None and _f(gpu.get("energy_j")):
        energy, src = float(gpu["energy_j"]), f"gpu:{gpu.get('energy_src') or 'telemetry'}"
    elif usage is not None and usage.energy_j:
        energy, src = usage.energy_j, "slurm"
    if energy is not None and tokens:
        per_token = energy / tokens
    log_j = _log_energy_j(spool_record)
    if log_j is not None and report.gpus and f.tokens_per_s and f.iter_ms and f.iter_ms.median:
        # Megatron's --log-energy: J per iteration per GPU (steady-state median).
        tokens_per_iter = f.tokens_per_s * f.iter_ms.median / 1000.0
        if per_token is None and tokens_per_iter > 0:
            per_token = log_j * report.gpus / tokens_per_iter
        if energy is None and tokens and tokens_per_iter > 0:
            # over the iterations trained: productive time / iteration time
            energy, src = log_j * report.gpus * tokens / tokens_per_iter, "megatron-log"
    return Efficiency(usage=usage, gpu=gpu, energy_j=energy, energy_src=src,
                      energy_per_token_j=per_token)


def _log_energy_j(record: Mapping[str, Any] | None) -> float | None:
    m = ((record or {}).get("summary") or {}).get("metrics") or {}
    d = _dist(m.get("energy_j")) if isinstance(m, Mapping) else None
    return d.median if d and d.median and d.median > 0 else None
