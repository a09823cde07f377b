"""Prometheus text exposition (format 0.0.4) of job and fleet figures, for node_exporter's
textfile collector. Pure: reports in, text out (the CLI writes it atomically).

Names follow Prometheus conventions (`promtool check metrics`): `slurmpod_` prefix, base units
(seconds, not hours: GPU time is `..._gpu_seconds`), ratios end in `_ratio`, every family has
HELP and TYPE lines, all gauges (a textfile is a snapshot, not a counter). Label values escape
backslash, double quote and newline as the format requires.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from slurmpod.report.fleet import FleetReport, Group
from slurmpod.report.model import LOSS_CAUSES, JobReport
from slurmpod.report.predicted import LOW_VS_PREDICTED

_NAME = re.compile(r"^[a-zA-Z_:][a-zA-Z0-9_:]*$")
_LABEL = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")


def escape_label(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _fmt(v: float) -> str:
    if math.isnan(v):
        return "NaN"
    if math.isinf(v):
        return "+Inf" if v > 0 else "-Inf"
    return repr(float(v)) if not float(v).is_integer() else str(int(v))


@dataclass
class Family:
    name: str
    help: str
    samples: list[tuple[dict[str, str], float]] = field(default_factory=list)

    def add(self, labels: Mapping[str, str], value: float | None) -> None:
        if value is not None and math.isfinite(value):
            self.samples.append((dict(labels), float(value)))


class Exposition:
    def __init__(self) -> None:
        self.families: dict[str, Family] = {}

    def family(self, name: str, help_text: str) -> Family:
        if not _NAME.match(name):
            raise ValueError(f"invalid metric name {name!r}")
        fam = self.families.get(name)
        if fam is None:
            fam = self.families[name] = Family(name, help_text)
        return fam

    def render(self) -> str:
        lines: list[str] = []
        for fam in self.families.values():
            if not fam.samples:
                continue
            help_text = fam.help.replace("\\", "\\\\").replace("\n", "\\n")
            lines.append(f"# HELP {fam.name} {help_text}")
            lines.append(f"# TYPE {fam.name} gauge")
            for labels, value in fam.samples:
                for k in labels:
                    if not _LABEL.match(k) or k.startswith("__"):
                        raise ValueError(f"invalid label name {k!r}")
                lab = ",".join(f'{k}="{escape_label(v)}"' for k, v in labels.items())
                lines.append(f"{fam.name}{{{lab}}} {_fmt(value)}" if lab
                             else f"{fam.name} {_fmt(value)}")
        return "\n".join(lines) + "\n" if lines else ""


def _job_metrics(x: Exposition, reports: Iterable[JobReport]) -> None:
    # A `quantile` label is reserved for summaries (promtool rejects it on a gauge): `stat`.
    mfu = x.family("slurmpod_job_mfu_ratio", "Steady-state MFU of the job (model FLOPs / "
                   "peak dense BF16): stat=median|p10|p90.")
    tfl = x.family("slurmpod_job_model_tflops_per_gpu", "Median steady-state model TFLOP/s "
                   "per GPU of the job.")
    tok = x.family("slurmpod_job_tokens_per_second", "Median steady-state tokens per second.")
    good = x.family("slurmpod_job_goodput_ratio", "Productive GPU time / allocated GPU time.")
    gpus = x.family("slurmpod_job_gpus", "GPUs allocated to the job.")
    alloc = x.family("slurmpod_job_allocated_gpu_seconds", "GPU-seconds allocated to the job, "
                     "all attempts.")
    lost = x.family("slurmpod_job_lost_gpu_seconds", "GPU-seconds that trained nothing, by "
                    "cause.")
    restarts = x.family("slurmpod_job_restarts", "Times the job was requeued or relaunched.")
    # GPU telemetry and energy (JobReport.efficiency: a job report reads them, a fleet does not).
    gutil = x.family("slurmpod_job_gpu_utilization_ratio", "Mean GPU utilisation of the job "
                     "over its GPUs and run (telemetry, else Slurm's gres/gpuutil).")
    gidle = x.family("slurmpod_job_idle_gpus", "GPUs of the job whose mean utilisation stayed "
                     "under 5 %.")
    gsm = x.family("slurmpod_job_gpu_sm_active_ratio", "Mean SM activity of the job's GPUs "
                   "(DCGM).")
    gten = x.family("slurmpod_job_gpu_tensor_active_ratio", "Mean tensor-pipe activity of the "
                    "job's GPUs (DCGM).")
    gmem = x.family("slurmpod_job_gpu_memory_used_bytes", "Most GPU memory used on any of the "
                    "job's GPUs.")
    gpow = x.family("slurmpod_job_gpu_power_watts", "Mean power per GPU of the job.")
    gtemp = x.family("slurmpod_job_gpu_temperature_max_celsius", "Highest GPU temperature of "
                     "the job.")
    gxid = x.family("slurmpod_job_gpu_xid_errors", "XID errors seen on the job's GPUs.")
    energy = x.family("slurmpod_job_energy_joules", "Energy of the job (its GPUs', else its "
                      "nodes' from Slurm, else Megatron's log).")
    ept = x.family("slurmpod_job_energy_per_token_joules", "Energy per trained token.")
    for r in reports:
        j = r.job
        base = {"job_id": j.job_id, "name": j.name, "user": j.user, "account": j.account,
                "partition": j.partition, "state": str(j.state)}
        f = r.figures
        if f.mfu:
            for stat, v in (("median", f.mfu.median), ("p10", f.mfu.p10), ("p90", f.mfu.p90)):
                mfu.add({**base, "stat": stat}, v)
        if f.tflops:
            tfl.add(base, f.tflops.median)
        tok.add(base, f.tokens_per_s)
        good.add(base, r.loss.goodput)
        gpus.add(base, float(r.gpus))
        alloc.add(base, r.loss.allocated_gpu_s)
        for cause in LOSS_CAUSES:
            if cause in r.loss.by_cause_gpu_s:
                lost.add({**base, "cause": cause}, r.loss.by_cause_gpu_s[cause])
        restarts.add(base, float(r.restarts))
        eff = getattr(r, "efficiency", None)
        if eff is None:
            continue
        g = eff.gpu or {}
        util = eff.gpu_util_pct
        gutil.add(base, None if util is None else util / 100.0)
        gidle.add(base, _num(g.get("idle_gpus")))
        for fam, key in ((gsm, "sm"), (gten, "tensor")):
            v = _num(g.get(key))
            fam.add(base, None if v is None else v / 100.0)
        mem = eff.gpu_mem_gib
        gmem.add(base, None if mem is None else mem * 2**30)
        gpow.add(base, _num(g.get("power_w")))
        gtemp.add(base, _num(g.get("temp_max_c")))
        gxid.add(base, _num(g.get("xid")))
        energy.add(base, eff.energy_j)
        ept.add(base, eff.energy_per_token_j)


def _num(v: object) -> float | None:
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else None


def _group_metrics(x: Exposition, level: str, groups: Iterable[Group], window: str) -> None:
    prefix = f"slurmpod_{level}"
    jobs = x.family(f"{prefix}_jobs", f"Finished jobs in the window, per {level}.")
    alloc = x.family(f"{prefix}_allocated_gpu_seconds", f"GPU-seconds allocated, per {level}.")
    mfu = x.family(f"{prefix}_mfu_ratio", f"GPU-hour-weighted MFU, per {level}.")
    good = x.family(f"{prefix}_goodput_ratio", f"Productive / allocated GPU time, per {level}.")
    lost = x.family(f"{prefix}_lost_gpu_seconds", f"GPU-seconds lost by cause, per {level}.")
    for g in groups:
        base = {"window": window} if level == "fleet" else {"window": window, level: g.key}
        jobs.add(base, float(g.jobs))
        alloc.add(base, g.gpu_hours * 3600)
        mfu.add(base, g.mfu)
        good.add(base, g.goodput)
        for cause in LOSS_CAUSES:
            lost.add({**base, "cause": cause}, g.lost.get(cause, 0.0) * 3600)


def _by_partition(fleet: FleetReport) -> list[Group]:
    """Per-partition sums over the plausible rows (the fleet's rules, as per user)."""
    out: dict[str, Group] = {}
    for row in fleet.rows:
        if not row.implausible:
            g = out.get(row.partition)
            if g is None:
                g = out[row.partition] = Group(row.partition)
            g.add(row)
    return [out[k] for k in sorted(out)]


def job_exposition(reports: Iterable[JobReport]) -> str:
    x = Exposition()
    _job_metrics(x, reports)
    return x.render()


def _prediction_metrics(x: Exposition, fleet: FleetReport) -> None:
    """Achieved vs predicted over the plausible jobs whose Comment recorded a prediction."""
    base = {"window": fleet.window}
    x.family("slurmpod_fleet_predicted_jobs",
             "Finished jobs with a prediction recorded at submit.").add(
        base, float(fleet.jobs_with_prediction))
    x.family("slurmpod_fleet_vs_predicted_median_ratio",
             "Median of achieved / predicted speed over those jobs.").add(
        base, fleet.vs_predicted_median)
    x.family("slurmpod_fleet_below_predicted_jobs",
             f"Jobs below {LOW_VS_PREDICTED:.0%} of their prediction.").add(
        base, float(len(fleet.below_predicted)))


def fleet_exposition(fleet: FleetReport, *, per_job: bool = False,
                     reports: Iterable[JobReport] = ()) -> str:
    x = Exposition()
    _group_metrics(x, "fleet", [fleet.total], fleet.window)
    run = x.family("slurmpod_fleet_running_jobs", "Jobs still running (not in the sums).")
    run.add({"window": fleet.window}, float(fleet.n_running))
    _prediction_metrics(x, fleet)
    _group_metrics(x, "user", fleet.by_user, fleet.window)
    _group_metrics(x, "account", fleet.by_account, fleet.window)
    _group_metrics(x, "partition", _by_partition(fleet), fleet.window)
    if per_job:
        _job_metrics(x, reports)
    return x.render()
