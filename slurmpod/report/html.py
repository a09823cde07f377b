"""Self-contained HTML reports: Jinja templates under `templates/report/` with the plots of
`slurmpod.report.plots` inlined as SVG. No scripts, fonts or images are fetched, so the file
reads the same offline. Every value is HTML-escaped (autoescape on); the SVG strings are built
escaped by `plots`.

The job page reads top-down as a person asks: how did it do (the headline card: MFU, goodput,
tokens/s per GPU, energy per token, the verdict), what ran (model and layout), where (SUs,
racks), what happened (attempts and why each ended), then the plots and the detail. Numbers are
written for people: thousands separators, k/M/G for large values, units, never `6.473e+04`.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from slurmpod import __version__
from slurmpod.report.extras import JobExtras
from slurmpod.report.fleet import FleetReport, Group, JobRow
from slurmpod.report.model import LOSS_CAUSES, SPIKE_FACTOR, JobReport, finite
from slurmpod.report.text import dist_text, energy_in_units

DASH = "–"
# The published range of large training runs (Megatron-LM on A100/H100, PaLM: 30-50 % MFU,
# /work/shared/REFERENCE.md), drawn when the fleet's own band for the size class is not given.
REFERENCE_BAND = (0.30, 0.50, "typical large runs 30–50 %")
MAX_GROUP_ROWS = 50
CAUSE_TEXT = {"startup": "start-up", "checkpoint": "checkpoint stalls",
              "restarts": "restarts", "other": "other (evaluation, shutdown, hangs)"}
END_TEXT = {"completed": "completed", "timelimit": "hit the time limit",
            "preempted": "preempted", "node_fail": "node failure", "failure": "training failed",
            "requeued": "requeued", "cancelled": "cancelled", "running": "running",
            "unknown": "end not recorded"}
# sacct's job states -> the job script's end words (plots.END_COLOURS), for jobs without it.
STATE_END = (("COMPLETED", "completed"), ("TIMEOUT", "timelimit"), ("PREEMPTED", "preempted"),
             ("NODE_FAIL", "node_fail"), ("FAILED", "failure"), ("OUT_OF_MEMORY", "failure"),
             ("BOOT_FAIL", "node_fail"), ("REQUEUED", "requeued"), ("CANCELLED", "cancelled"),
             ("RUNNING", "running"))


# --- numbers for people ----------------------------------------------------------------------

_ok = finite  # one reading of JSON numbers for the report (report.model)


def _fixed(v: float, sig: int) -> str:
    """`sig` significant digits in positional notation (f-format never writes an exponent)."""
    decimals = max(0, sig - 1 - math.floor(math.log10(abs(v))))
    s = f"{v:,.{min(decimals, 9)}f}"
    return s.rstrip("0").rstrip(".") if "." in s else s


def human(x: Any, sig: int = 3) -> str:
    """64730 -> '64,730', 1234567 -> '1.23 M', 3.14159 -> '3.14', 0.000123 -> '0.000123'.
    Never scientific notation."""
    v = _ok(x)
    if v is None:
        return DASH
    a = abs(v)
    for div, suffix in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M")):
        if a >= div:
            q = v / div
            return (f"{round(q):,}" if abs(q) >= 1000 else _fixed(q, sig)) + f" {suffix}"
    if a >= 1000:
        return f"{round(v):,}"
    if a == 0:
        return "0"
    return _fixed(v, sig)


def integer(x: Any) -> str:
    v = _ok(x)
    return DASH if v is None else f"{round(v):,}"


def pct(x: Any, digits: int = 1) -> str:
    v = _ok(x)
    return DASH if v is None else f"{100 * v:.{digits}f} %"


def gpuh(hours: Any) -> str:
    v = _ok(hours)
    return DASH if v is None else f"{human(v)} GPU-h"


def duration(s: Any) -> str:
    """3725 -> '1 h 02 min', 75 -> '1 min 15 s', 200000 -> '2 d 7 h'."""
    v = _ok(s)
    if v is None:
        return DASH
    v = round(max(v, 0.0))
    d, rem = divmod(v, 86400)
    h, rem = divmod(rem, 3600)
    m, sec = divmod(rem, 60)
    if d:
        return f"{d} d {h} h"
    if h:
        return f"{h} h {m:02d} min"
    if m:
        return f"{m} min {sec:02d} s"
    return f"{sec} s"


def energy(joules: Any) -> str:
    v = _ok(joules)
    if v is None:
        return DASH
    value, unit = energy_in_units(v)
    return f"{human(value)} {unit}"


def per_token(joules: Any) -> str:
    v = _ok(joules)
    if v is None:
        return DASH
    return f"{human(v)} J" if v >= 0.1 else f"{human(v * 1000)} mJ"


def when(t: Any) -> str:
    """A datetime or epoch seconds -> '2026-11-03 14:02:05 UTC'."""
    if isinstance(t, datetime):
        dt = t if t.tzinfo else t.replace(tzinfo=UTC)
    else:
        v = _ok(t)
        if v is None or v <= 0:
            return DASH
        dt = datetime.fromtimestamp(v, UTC)
    return dt.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _env() -> Any:
    import jinja2  # lazy: start-up (jinja2 only when used)

    from slurmpod.config import data_dir  # lazy: start-up

    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(data_dir("templates") / "report")),
        undefined=jinja2.StrictUndefined, autoescape=True, trim_blocks=True,
        lstrip_blocks=True)
    env.filters.update(pct=pct, human=human, integer=integer, gpuh=gpuh, duration=duration,
                       energy=energy, per_token=per_token, when=when)
    env.globals.update(slurmpod_version=__version__, causes=LOSS_CAUSES, cause_text=CAUSE_TEXT,
                       dist_text=dist_text, pct=pct, human=human, svg=_svg_markup)
    return env


def _svg_markup(s: str | None) -> Any:
    """An SVG string from `plots` (escaped there) marked safe for the template."""
    from markupsafe import Markup  # lazy: start-up

    return Markup(s or "")


# --- the job page ----------------------------------------------------------------------------

@dataclass(frozen=True)
class Tile:
    label: str
    value: str
    sub: str = ""
    tone: str = ""  # "" | "good" | "bad" | "muted"


@dataclass(frozen=True)
class Verdict:
    tone: str  # "good" | "warn" | "bad" | "muted"
    title: str
    text: str
    fix: str = ""


@dataclass(frozen=True)
class AttemptRow:
    label: str
    submit: float | None
    start: float | None
    end: float | None
    end_kind: str  # a key of END_TEXT
    how: str
    nodes: str
    iteration: str


def end_kind_of_state(state: str) -> str:
    s = state.upper()
    return next((k for prefix, k in STATE_END if s.startswith(prefix)), "unknown")


def attempt_rows(r: JobReport, x: JobExtras) -> list[AttemptRow]:
    """One row per launch from the job script's record when there is one (it knows why each
    ended), else one per Slurm attempt from sacct (its state says how)."""
    sacct = list(r.attempts)
    rows: list[AttemptRow] = []
    if x.script_attempts:
        for a in x.script_attempts:
            kind = a.end if a.end in END_TEXT else ("running" if r.job.state.is_active
                                                     else "unknown")
            how = END_TEXT[kind]
            if a.rc is not None and kind in ("failure", "node_fail"):
                how += f" (exit code {a.rc})"
            k = a.restart if isinstance(a.restart, int) and 0 <= a.restart < len(sacct) else None
            rows.append(AttemptRow(
                str(a.attempt), sacct[k].submit_s if k is not None else None,
                a.start_s, a.end_s, kind, how, f"{len(a.nodes)} node(s)" if a.nodes else DASH,
                integer(a.iteration) if a.iteration is not None else DASH))
        return rows
    for n, a in enumerate(sacct):
        kind = end_kind_of_state(a.state)
        rows.append(AttemptRow(str(n + 1), a.submit_s, a.start_s, a.end_s, kind,
                               f"{END_TEXT[kind]} (Slurm: {a.state})", DASH, DASH))
    if not rows and r.job.start_time is not None:
        j = r.job
        end = j.end_time.timestamp() if j.end_time else None
        kind = end_kind_of_state(str(j.state))
        rows.append(AttemptRow("1", j.submit_time.timestamp() if j.submit_time else None,
                               j.start_time.timestamp(), end, kind,
                               f"{END_TEXT[kind]} (Slurm: {j.state})", DASH, DASH))
    return rows


def verdict_of(r: JobReport) -> Verdict:
    warns = [n for n in r.notes if n.level == "warn"]
    fix = str(getattr(warns[0], "fix", "") or "") if warns else ""
    if r.implausible:
        return Verdict("bad", "Figures cannot be right",
                       "these figures are impossible for a real run (" + ", ".join(r.implausible)
                       + "); they are kept for audit and left out of fleet figures")
    if r.status == "running":
        return Verdict("muted", "Running", "the job is still running: these figures are live and "
                       "partial; the final ones come when it ends")
    if warns:
        more = f" (and {len(warns) - 1} more below)" if len(warns) > 1 else ""
        return Verdict("bad" if len(warns) > 2 else "warn",
                       f"{len(warns)} thing{'s' if len(warns) > 1 else ''} to look at",
                       warns[0].text + more, fix)
    if r.status == "no-training-log":
        return Verdict("muted", "Nothing to flag",
                       "not a training job slurmpod can read (no Megatron iterations): the "
                       "figures are Slurm's and the GPUs'")
    return Verdict("good", "Healthy", "nothing to flag: MFU, goodput and stability are within "
                   "the usual ranges")


def headline(r: JobReport, x: JobExtras) -> list[Tile]:
    """The card's tiles: a training job's MFU, goodput, tokens/s per GPU and energy per token;
    any other GPU job's seff/jobstats figures (GPU and CPU use, memory, time)."""
    f, loss = r.figures, r.loss
    gpus = r.gpus
    eff = r.efficiency
    e = eff.energy_j if eff else None
    ept = eff.energy_per_token_j if eff else None
    hours = Tile("GPU-hours", human(loss.allocated_gpu_s / 3600),
                 f"{integer(gpus)} GPUs × {duration(loss.allocated_gpu_s / gpus)}" if gpus
                 else "no GPUs in the allocation")
    if not (f.has_training or f.source == "live_comment"):
        return [*usage_tiles(r), Tile("Energy", energy(e), ENERGY_SRC.get(
            eff.energy_src or "", "") if eff and e is not None else "not measured",
            "" if e is not None else "muted"), hours]
    mfu = f.mfu.median if f.mfu else None
    band = x.typical or REFERENCE_BAND
    tone = "" if mfu is None else ("good" if mfu >= band[0] else "bad")
    mfu_sub = (f"p10 {pct(f.mfu.p10)} · p90 {pct(f.mfu.p90)}"
               if f.mfu and f.mfu.p10 is not None and f.mfu.p90 is not None else "median")
    gp = loss.goodput
    tps = f.tokens_per_s
    per_gpu = tps / gpus if tps is not None and gpus else None
    v = r.predicted
    vs = [] if v is None else [Tile(
        "vs predicted", pct(v.ratio, 0),
        f"of predicted MFU ({pct(v.achieved_mfu)} of {pct(v.prediction.mfu)}); "
        f"{human(v.achieved_step_s)} s per iteration, {human(v.predicted_step_s)} s predicted "
        f"for {v.layout} on {integer(v.world)} {v.gpu.upper()}",
        "bad" if v.flagged else "good")]
    m = r.memory
    mem = [] if m is None else [Tile(
        "GPU memory", pct(m.held_gib / m.hbm_gib, 0),
        f"of {human(m.hbm_gib)} GiB held on rank {m.rank}; {human(m.max_allocated_gib)} GiB "
        "allocated" + ("" if m.estimate_gib is None
                       else f", slurmpod estimated {human(m.estimate_gib)} GiB"))]
    return [
        Tile("MFU", pct(mfu), mfu_sub if mfu is not None else "no FLOPs figure", tone),
        *vs,
        *mem,
        Tile("Goodput", pct(gp), "productive / allocated GPU time" if gp is not None
             else "no productive-time figure",
             "" if gp is None else "good" if gp >= 0.8 else "bad"),
        Tile("Tokens/s per GPU", human(per_gpu),
             f"{human(tps)} tokens/s on {integer(gpus)} GPUs" if tps is not None else "not logged"),
        Tile("Energy per token", per_token(ept),
             f"{energy(e)} in all" if e is not None else "not measured",
             "" if ept is not None else "muted"),
        hours,
    ]


ENERGY_SRC = {"slurm": "the nodes, from Slurm's energy accounting",
              "megatron-log": "Megatron's energy log"}


def usage_tiles(r: JobReport) -> list[Tile]:
    """GPU utilisation, CPU efficiency, memory and time as seff/jobstats show them."""
    eff = r.efficiency
    u = eff.usage if eff else None
    util = eff.gpu_util_pct if eff else None
    idle = (eff.gpu or {}).get("idle_gpus") if eff else None
    out = [Tile("GPU utilisation", DASH if util is None else f"{human(util)} %",
                (f"{idle} idle GPU(s)" if idle else "mean over GPUs and time")
                if util is not None else "not measured",
                "muted" if util is None else "bad" if util < 50 or idle else "good")]
    cpu = u.cpu_efficiency if u else None
    out.append(Tile("CPU efficiency", pct(cpu), "CPU time / allocated CPU time" if cpu is not None
                    else "not measured", "muted" if cpu is None else ""))
    mem = u.mem_efficiency if u else None
    out.append(Tile("Memory", pct(mem), f"{_gib(u.mem_peak_bytes)} peak of "
                    f"{_gib(u.req_mem_bytes)} requested" if u and mem is not None
                    else "not measured", "muted" if mem is None else ""))
    tf = u.time_fraction if u else None
    out.append(Tile("Time used", pct(tf), f"{duration(u.elapsed_s)} of "
                    f"{duration(u.limit_s)}" if u and tf is not None else "no time limit known",
                    "muted" if tf is None else ""))
    return out


def _gib(b: Any) -> str:
    v = _ok(b)
    return DASH if v is None else f"{human(v / 2**30)} GiB"


def resource_rows(r: JobReport) -> list[tuple[str, str]]:
    """The seff/jobstats table: every figure measured, "not measured" for the rest."""
    eff = r.efficiency
    if eff is None:
        return []
    u = eff.usage
    g = eff.gpu or {}
    nm = "not measured"
    rows = [
        ("GPU utilisation", f"{human(eff.gpu_util_pct)} % (from {eff.gpu_src})"
         if eff.gpu_util_pct is not None else nm),
    ]
    if g.get("idle_gpus") is not None:
        rows.append(("idle GPUs", integer(g.get("idle_gpus"))))
    for key, label in (("sm", "SM activity"), ("tensor", "tensor-core activity")):
        if g.get(key) is not None:
            rows.append((label, f"{human(g[key])} %"))
    rows.append(("GPU memory, peak", (f"{human(eff.gpu_mem_gib)} GiB"
                 + (f" of {human(g['mem_total_gib'])} GiB" if g.get("mem_total_gib") else ""))
                 if eff.gpu_mem_gib is not None else nm))
    if g.get("power_w") is not None:
        rows.append(("GPU power", f"{human(g['power_w'])} W mean per GPU"
                     + (f", {human(g['power_max_w'])} W highest" if g.get("power_max_w")
                        else "")))
    if g.get("temp_max_c") is not None:
        rows.append(("GPU temperature, highest", f"{human(g['temp_max_c'])} °C"))
    if g.get("sm_mhz") is not None:
        rows.append(("SM clock, mean", f"{integer(g['sm_mhz'])} MHz"))
    if g.get("xid") is not None:
        rows.append(("XID errors", integer(g["xid"]) + (f" (codes {g['xid_codes']})"
                                                       if g.get("xid_codes") else "")))
    rows.append(("energy", f"{energy(eff.energy_j)}" if eff.energy_j is not None else nm))
    if u is not None:
        rows += [
            ("CPU efficiency", f"{pct(u.cpu_efficiency)} of {integer(u.alloc_cpus)} CPUs"
             if u.cpu_efficiency is not None else nm),
            ("memory, peak", f"{_gib(u.mem_peak_bytes)} of {_gib(u.req_mem_bytes)} requested "
             f"({pct(u.mem_efficiency)})" if u.mem_efficiency is not None else nm),
            ("time", f"{duration(u.elapsed_s)} of a {duration(u.limit_s)} limit "
             f"({pct(u.time_fraction)})" if u.time_fraction is not None
             else f"{duration(u.elapsed_s)} (no time limit known)"),
        ]
    return rows


def job_context(r: JobReport, x: JobExtras) -> dict[str, Any]:
    from slurmpod.report import plots  # lazy: start-up

    band = x.typical or REFERENCE_BAND
    rows = attempt_rows(r, x)
    subs = [a for a in (row.submit for row in rows) if a]
    t0 = min(subs or [row.start for row in rows if row.start] or [0.0])
    tel = x.telemetry
    heat_util = heat_power = None
    if tel and tel.rows and tel.t:
        heat_util = plots.heatmap("plot-gpu-util", "GPU utilisation (%, mean over each node's "
                                  "GPUs)", tel.rows, tel.t, tel.util, vmax=100.0, unit="%")
        pmax = max((v for row in tel.power for v in row if v is not None), default=0.0)
        heat_power = plots.heatmap("plot-gpu-power", "GPU power (W, mean per GPU of each node)",
                                   tel.rows, tel.t, tel.power, vmax=pmax, unit="W",
                                   colour=plots.POWER_RGB)
    plot = {
        "mfu": plots.mfu_over_run(r.series, r.figures.peak_tflops, band=band),
        "step": plots.step_time(r.series, SPIKE_FACTOR),
        "hist": plots.iteration_histogram(r.series, SPIKE_FACTOR),
        "attempts": plots.attempts_timeline(
            [{"label": f"attempt {a.label}", "submit": a.submit, "start": a.start, "end": a.end,
              "end_kind": a.end_kind, "end_text": END_TEXT[a.end_kind]} for a in rows],
            t0) if rows else None,
        "placement": plots.placement_map(r),
        "gpu_util": heat_util, "gpu_power": heat_power,
    }
    lost = [(CAUSE_TEXT[c], r.loss.by_cause_gpu_s.get(c, 0.0) / 3600) for c in LOSS_CAUSES]
    return {"r": r, "x": x, "tiles": headline(r, x), "verdict": verdict_of(r),
            "resources": resource_rows(r),
            "attempts": rows, "plots": plot, "band": band, "lost": lost,
            "restarts": r.restarts}


def job_html(r: JobReport, *, generated: str, extras: JobExtras | None = None) -> str:
    ctx = job_context(r, extras or JobExtras())
    return _env().get_template("job.html.j2").render(generated=generated, **ctx)


# --- the fleet page --------------------------------------------------------------------------

def _row_energy(row: JobRow) -> float | None:
    """A fleet row's measured energy (J), when the row carries one (GPU telemetry)."""
    return _ok(getattr(row, "energy_j", None))


@dataclass
class Charge:
    key: str
    jobs: int = 0
    gpu_hours: float = 0.0
    productive: float = 0.0
    lost: float = 0.0
    energy_j: float = 0.0
    energy_jobs: int = 0


def groups_by(rows: Iterable[JobRow], attr: str) -> list[Group]:
    """Per-`attr` sums of the plausible rows, most GPU-hours first (fleet.Group's rules)."""
    out: dict[str, Group] = {}
    for row in rows:
        if row.implausible:
            continue
        key = getattr(row, attr)
        g = out.get(key)
        if g is None:
            g = out[key] = Group(key)
        g.add(row)
    return sorted(out.values(), key=lambda g: (-g.gpu_hours, g.key))


def chargeback(rows: Iterable[JobRow], attr: str = "account") -> list[Charge]:
    out: dict[str, Charge] = {}
    for row in rows:
        if row.implausible:
            continue
        c = out.get(key := getattr(row, attr))
        if c is None:
            c = out[key] = Charge(key)
        c.jobs += 1
        c.gpu_hours += row.gpu_hours
        c.productive += row.productive_gpu_hours or 0.0
        c.lost += row.lost_gpu_hours or 0.0
        e = _row_energy(row)
        if e is not None:
            c.energy_j += e
            c.energy_jobs += 1
    return sorted(out.values(), key=lambda c: (-c.gpu_hours, c.key))


def wasted_ranking(groups: Sequence[Group], n: int = 20) -> list[Group]:
    return sorted((g for g in groups if g.lost_gpu_hours > 0),
                  key=lambda g: (-g.lost_gpu_hours, g.key))[:n]


def fleet_context(fl: FleetReport) -> dict[str, Any]:
    from slurmpod.report import plots  # lazy: start-up

    by_partition = groups_by(fl.rows, "partition")
    charges = chargeback(fl.rows)
    total_e = sum(c.energy_j for c in charges)
    measured = sum(c.energy_jobs for c in charges)
    t = fl.total
    tiles = [
        Tile("GPU-hours", human(t.gpu_hours), f"{integer(t.jobs)} finished jobs"),
        Tile("MFU", pct(t.mfu), f"GPU-hour-weighted, over {gpuh(t.mfu_gpu_hours)}"),
        Tile("Goodput", pct(t.goodput), "productive / allocated GPU time",
             "" if t.goodput is None else "good" if t.goodput >= 0.8 else "bad"),
        Tile("Lost GPU-hours", human(t.lost_gpu_hours),
             pct(t.lost_gpu_hours / t.gpu_hours) + " of all" if t.gpu_hours else DASH,
             "bad" if t.gpu_hours and t.lost_gpu_hours / t.gpu_hours > 0.2 else ""),
        Tile("Energy", energy(total_e) if measured else DASH,
             f"measured on {integer(measured)} jobs" if measured else "not measured",
             "" if measured else "muted"),
    ]
    return {
        "fl": fl, "tiles": tiles, "max_rows": MAX_GROUP_ROWS,
        "tables": [("Per user", "user", fl.by_user), ("Per account", "account", fl.by_account),
                   ("Per partition", "partition", by_partition)],
        "wasted_users": wasted_ranking(fl.by_user), "charges": charges,
        "energy_measured": measured > 0, "charge_total": t.gpu_hours,
        "plots": {"mfu": plots.fleet_mfu_distribution(fl),
                  "lost": plots.fleet_lost_over_time(fl)},
        "filters": ", ".join(f"{k} {v}" for k, v in fl.filters.items() if v) or "all jobs",
    }


def fleet_html(fl: FleetReport, *, generated: str) -> str:
    return _env().get_template("fleet.html.j2").render(generated=generated,
                                                       **fleet_context(fl))
