"""Terminal rendering of job and fleet reports (plain text, fixed-width tables). Pure."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from slurmpod.report.fleet import FleetReport, Group, JobRow
from slurmpod.report.model import LOSS_CAUSES, Dist, Efficiency, JobReport
from slurmpod.report.predicted import HIGH_VS_PREDICTED, LOW_VS_PREDICTED
from slurmpod.report.rules import (
    GPU_IDLE_PCT,
    LOW_CPU_EFFICIENCY,
    MEM_OVER_REQUESTED,
    TIME_OVER_REQUESTED,
)
from slurmpod.textfmt import table


def pct(x: float | None, digits: int = 1) -> str:
    return "-" if x is None or not math.isfinite(x) else f"{100 * x:.{digits}f} %"


def num(x: float | None, spec: str = ".4g") -> str:
    return "-" if x is None or not math.isfinite(x) else format(x, spec)


def dur(s: float | None) -> str:
    if s is None or not math.isfinite(s):
        return "-"
    s = round(s)
    h, rem = divmod(s, 3600)
    m, sec = divmod(rem, 60)
    return f"{h}:{m:02d}:{sec:02d}" if h else f"{m}:{sec:02d}"


def gpuh(x: float | None) -> str:
    return "-" if x is None else f"{x:.4g}"


def dist_text(d: Dist | None, fmt: Any) -> str:
    if d is None or d.median is None:
        return "-"
    if d.p10 is None or d.p90 is None:
        return fmt(d.median)
    return f"{fmt(d.median)} (p10 {fmt(d.p10)}, p90 {fmt(d.p90)})"


def job_text(r: JobReport) -> str:
    j, f, loss = r.job, r.figures, r.loss
    js = r.to_json()["job"]
    out = [f"Job {j.job_id} ({j.name})  {j.state}  exit {j.exit_code}"
           + (f" signal {j.signal}" if j.signal else ""),
           f"  {r.status_text}",
           f"  user {j.user or '-'}  account {j.account or '-'}  partition {j.partition or '-'}",
           f"  nodes {j.n_nodes} ({j.nodes or '-'})  GPUs {r.gpus}  restarts {js['restarts']}",
           f"  submit {js['submit'] or '-'}  start {js['start'] or '-'}  end {js['end'] or '-'}",
           f"  queued {dur(r.queue_s)}  ran {dur(j.elapsed_s)}"
           + (f" over {len(r.attempts)} attempts ({dur(loss.allocated_gpu_s / r.gpus)} total)"
              if len(r.attempts) > 1 and r.gpus and not r.resizes else "")]
    if r.resizes:
        # A resize (RESIZING: Slurm removed a node under --no-kill) is one run in phases.
        out.append("  phases " + ", ".join(
            f"{dur(a.elapsed_s)} on {a.gpus if a.gpus is not None else '?'} GPUs"
            + (" (resized)" if a.resized else "") for a in r.attempts))
    p = r.placement
    if p is not None:
        out += ["", "Placement",
                f"  SUs {len(p.sus)} (min {num(p.min_sus, 'd')}): {', '.join(p.sus) or '-'}",
                f"  racks {len(p.racks)} (min {num(p.min_racks, 'd')}): "
                f"{', '.join(p.racks) or '-'}",
                f"  NVLink domains {len(p.domains)} (min {num(p.min_domains, 'd')})"]
        if p.unknown:
            out.append(f"  not in the site file: {', '.join(p.unknown)}")
    if f.has_training or f.source == "live_comment":
        out += ["", f"Performance ({f.source.replace('_', ' ')}; peak {num(f.peak_tflops)} "
                    f"TFLOP/s per GPU, FLOPs {f.formula or '-'})",
                f"  MFU          {dist_text(f.mfu, pct)}",
                f"  TFLOP/s/GPU  {dist_text(f.tflops, lambda v: num(v, '.4g'))}",
                f"  tokens/s     {num(f.tokens_per_s, '.5g')}",
                f"  iteration    {dist_text(f.iter_ms, lambda v: num(v, '.4g') + ' ms')}",
                f"  iterations   {num(f.iters, 'd')} logged, last {num(f.last_iter, 'd')}"]
        if f.mfu_fp8 is not None:
            out.append(f"  MFU (FP8)    {pct(f.mfu_fp8)} of the FP8 dense peak "
                       f"{num(f.peak_fp8)} TFLOP/s (the MFU above is against BF16)")
        if r.implausible:
            out.append(f"  IMPLAUSIBLE  {', '.join(r.implausible)}: kept for audit, left out "
                       "of fleet figures")
        if r.params_b is not None:
            out.append(f"  model size   ~{r.params_b:.3g} B parameters (from FLOPs / tokens)")
        v = r.predicted
        if v is not None:
            out.append(f"  vs predicted {pct(v.ratio, 0)} of predicted MFU "
                       f"({pct(v.achieved_mfu)} against {pct(v.prediction.mfu)}); iteration "
                       f"{num(v.achieved_step_s, '.4g')} s against {num(v.predicted_step_s, '.4g')}"
                       f" s predicted for {v.layout} on {v.world} {v.gpu.upper()} GPUs"
                       + (f", counting {', '.join(v.switches)}" if v.switches else ""))
        if r.memory is not None:
            out.append(f"  memory       {r.memory.line()}")
    if loss.productive_gpu_s is not None:
        out += ["", "GPU time",
                f"  allocated {gpuh(loss.allocated_gpu_s / 3600)} GPU-h, productive "
                f"{gpuh(loss.productive_gpu_s / 3600)} GPU-h, goodput {pct(loss.goodput)}",
                "  lost: " + ", ".join(f"{c} {gpuh(loss.by_cause_gpu_s.get(c, 0) / 3600)}"
                                       for c in LOSS_CAUSES) + " GPU-h"]
    else:
        out += ["", f"GPU time: allocated {gpuh(loss.allocated_gpu_s / 3600)} GPU-h "
                    "(no productive-time figure)"]
    s = r.stability
    if s is not None:
        out += ["", f"Iteration-time stability: median {num(s.median_ms)} ms, cv {pct(s.cv)}, "
                    f"spread p10-p90 {pct(s.spread)}, {s.spikes} spike(s)"
                + (f", worst {s.max_ratio:.2f}x median" if s.max_ratio else "")]
    if r.efficiency is not None:
        out += ["", *efficiency_lines(r.efficiency, r)]
    if r.notes:
        out += ["", "Notes"]
        for n in r.notes:
            out.append(f"  [{n.level}] {n.text}")
            if n.fix:
                out.append(f"         fix: {n.fix}")
    return "\n".join(out) + "\n"


NOT_MEASURED = "not measured"


def size(n_bytes: float | None) -> str:
    """Bytes in binary units, 3 significant digits: 314 MiB, 3.91 GiB."""
    if n_bytes is None or not math.isfinite(n_bytes):
        return NOT_MEASURED
    for unit, scale in (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n_bytes >= scale:
            return f"{n_bytes / scale:.3g} {unit}"
    return f"{n_bytes:.0f} B"


def energy_in_units(j: float) -> tuple[float, str]:
    """Joules in the unit a person reads an electricity figure in: Wh, kWh or MWh."""
    kwh = j / 3.6e6
    if kwh >= 1000:
        return kwh / 1000, "MWh"
    if kwh >= 1:
        return kwh, "kWh"
    return j / 3600, "Wh"


def energy(j: float | None) -> str:
    if j is None or not math.isfinite(j):
        return NOT_MEASURED
    value, unit = energy_in_units(j)
    return f"{value:.3g} {unit}"


def efficiency_lines(e: Efficiency, r: JobReport) -> list[str]:
    """seff-style lines: CPU, memory, time, GPUs, energy; "not measured" where nothing was."""
    u = e.usage
    out = ["Efficiency (Slurm accounting of the latest attempt"
           + (f"; GPUs: {e.gpu_src}" if e.gpu_src else "") + ")"]
    if u is None:
        out.append("  CPU, memory, time: not measured (sacct's usage query gave nothing)")
    else:
        if u.cpu_efficiency is None:
            cpu = NOT_MEASURED + (" yet (Slurm stores a step's usage when it ends)"
                                  if r.job.state.is_active else "")
        else:
            cpu = (f"{pct(u.cpu_efficiency)} of {u.alloc_cpus} cores x {dur(u.elapsed_s)} "
                   f"(CPU time {dur(u.cpu_s)})")
        out.append(f"  CPU          {cpu}")
        if u.mem_peak_bytes is None:
            mem = NOT_MEASURED
        elif u.req_mem_bytes:
            mem = (f"{size(u.mem_peak_bytes)} peak of {size(u.req_mem_bytes)} requested "
                   f"({pct(u.mem_efficiency)})")
        else:
            mem = f"{size(u.mem_peak_bytes)} peak (no memory request)"
        out.append(f"  memory       {mem}")
        limit = "no limit" if u.limit_s is None else (
            f"{pct(u.time_fraction)} of the {dur(u.limit_s)} limit")
        out.append(f"  time         {dur(u.elapsed_s)}, {limit}")
    util = e.gpu_util_pct
    g = e.gpu or {}
    if util is None:
        out.append(f"  GPU util     {NOT_MEASURED}")
    else:
        extra = ""
        if g.get("util_min") is not None:
            extra += f", lowest GPU {g['util_min']:.1f} %"
        if g.get("idle_gpus"):
            extra += f", {g['idle_gpus']} idle"
        if g.get("sm") is not None:
            extra += f", SM active {g['sm']:.1f} %"
        if g.get("tensor") is not None:
            extra += f", tensor {g['tensor']:.1f} %"
        out.append(f"  GPU util     {util:.1f} % mean{extra}")
    gmem = e.gpu_mem_gib
    total = g.get("mem_total_gib")
    out.append("  GPU memory   " + (NOT_MEASURED if gmem is None else
                                    f"{gmem:.3g} GiB peak" + (f" of {total:.3g} GiB"
                                                              if total else "")))
    if g.get("power_w") is not None:
        out.append(f"  GPU power    {g['power_w']:.0f} W mean per GPU"
                   + (f", max {g['power_max_w']:.0f} W" if g.get("power_max_w") else "")
                   + (f", hottest {g['temp_max_c']:.0f} C" if g.get("temp_max_c") else ""))
    out.append(f"  energy       {energy(e.energy_j)}"
               + (f" ({e.energy_src})" if e.energy_src else "")
               + (f", {e.energy_per_token_j:.3g} J/token" if e.energy_per_token_j else ""))
    return out


def _group_rows(groups: Sequence[Group]) -> list[list[str]]:
    return [[g.key or "-", str(g.jobs), gpuh(g.gpu_hours), pct(g.mfu), pct(g.goodput),
             gpuh(g.lost_gpu_hours)] for g in groups]


def _top_rows(rows: Sequence[JobRow]) -> list[list[str]]:
    return [[r.job_id, r.user, r.name[:24], r.state, gpuh(r.gpu_hours), pct(r.mfu),
             pct(r.vs_predicted, 0), gpuh(r.lost_gpu_hours)] for r in rows]


def _vs_predicted_lines(fl: FleetReport) -> list[str]:
    """The jobs far below their recorded prediction, each with the job report's note."""
    if not fl.below_predicted:
        return []
    out = [f"Below their prediction (under {pct(LOW_VS_PREDICTED, 0)} of the predicted speed)",
           table(["job", "user", "name", "MFU", "vs pred"],
                 [[r.job_id, r.user, r.name[:24], pct(r.mfu), pct(r.vs_predicted, 0)]
                  for r in fl.below_predicted])]
    for r in fl.below_predicted:
        if r.predicted_note is not None:
            out += [f"  {r.job_id}: {r.predicted_note.text}",
                    f"    fix: {r.predicted_note.fix}"]
    return [*out, ""]


def fleet_text(fl: FleetReport) -> str:
    t = fl.total
    filt = ", ".join(f"{k} {v}" for k, v in fl.filters.items() if v) or "all jobs"
    out = [f"Fleet report, since {fl.window} ({filt})",
           f"  finished jobs {t.jobs} ({fl.jobs_with_mfu} with MFU), "
           f"running or pending {fl.n_running}"
           + (f", implausible {len(fl.implausible)} (in no figure below)" if fl.implausible
              else ""),
           f"  GPU-hours {gpuh(t.gpu_hours)}, GPU-hour-weighted MFU {pct(t.mfu)} "
           f"(over {gpuh(t.mfu_gpu_hours)} GPU-h), goodput {pct(t.goodput)}",
           "  lost GPU-h: " + ", ".join(f"{c} {gpuh(t.lost.get(c, 0.0))}" for c in LOSS_CAUSES)]
    if fl.jobs_with_prediction:
        out.append(f"  vs predicted: median {pct(fl.vs_predicted_median, 0)} of predicted MFU "
                   f"over {fl.jobs_with_prediction} jobs with a prediction, "
                   f"{len(fl.below_predicted)} under {pct(LOW_VS_PREDICTED, 0)}")
        if (fl.vs_predicted_median or 0.0) > HIGH_VS_PREDICTED:
            out.append(f"    the median is over {pct(HIGH_VS_PREDICTED, 0)}, beyond the model's "
                       "error: fit the site's own factors with `slurmpod calibrate --since "
                       f"{fl.window}`")
    out.append("")
    heads = ["", "jobs", "GPU-h", "MFU", "goodput", "lost GPU-h"]
    out += ["Per user", table(["user", *heads[1:]], _group_rows(fl.by_user)), ""]
    out += ["Per account", table(["account", *heads[1:]], _group_rows(fl.by_account)), ""]
    if fl.top_lost:
        out += ["Top jobs by lost GPU-hours",
                table(["job", "user", "name", "state", "GPU-h", "MFU", "vs pred", "lost GPU-h"],
                      _top_rows(fl.top_lost)), ""]
    out += _vs_predicted_lines(fl)
    if fl.implausible:
        out += ["Implausible jobs (left out of every figure above)",
                table(["job", "user", "name", "state", "GPU-h", "reasons"],
                      [[r.job_id, r.user, r.name, r.state, gpuh(r.gpu_hours),
                        ", ".join(r.implausible)] for r in fl.implausible]), ""]
    out += _efficiency_lines(fl)
    hist = [(lo, n) for lo, n, _ in fl.mfu_hist if n]
    if hist:
        width = max(n for _, n in hist)
        out.append("MFU distribution (jobs)")
        for lo, n in hist:
            bar = "#" * max(1, round(30 * n / width))
            out.append(f"  {100 * lo:5.1f}% {bar} {n}")
    return "\n".join(out).rstrip() + "\n"


_VERDICT_TEXT = (
    ("gpu_idle", f"idle GPUs (under {GPU_IDLE_PCT:g} % utilisation)"),
    ("cpu_low", f"low CPU efficiency (under {LOW_CPU_EFFICIENCY:.0%})"),
    ("mem_over_requested",
     f"memory over-requested (peak under {MEM_OVER_REQUESTED:.0%} of the request)"),
    ("time_over_requested", f"time over-requested (under {TIME_OVER_REQUESTED:.0%} of the limit)"))


def _efficiency_lines(fl: FleetReport) -> list[str]:
    """`--efficiency`: verdict counts (the job report's notes, counted) and medians per group."""
    e = fl.efficiency
    if e is None:
        return []
    out = [f"Efficiency (Slurm's usage, {e.measured} of {fl.total.jobs} finished jobs measured)"]
    out += [f"  {e.verdicts.get(k, 0)} job(s): {text}" for k, text in _VERDICT_TEXT]
    out.append("")
    for attr, groups in e.by.items():
        if groups:
            out += [f"Efficiency per {attr} (medians)",
                    table([attr, "jobs", "CPU eff", "mem used/req", "time used/limit"],
                          [[g.key, str(g.jobs), pct(g.cpu_eff), pct(g.mem_frac),
                            pct(g.time_frac)] for g in groups[:MAX_EFF_ROWS]]), ""]
    return out


MAX_EFF_ROWS = 50
