"""A job's report assembled: its figures, losses, stability and placement (report/model.py),
efficiency, then the notes judged on it (report/rules.py). Apart from model.py so that the
rules can read a built report without model.py importing them back."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from slurmpod.model.hostlist import expand
from slurmpod.model.site import Inventory, Site
from slurmpod.report.model import (
    Efficiency,
    JobReport,
    LogHints,
    _site_peak,
    choose_figures,
    efficiency_of,
    implausible_reasons,
    params_estimate,
    split_loss,
    stability_of,
)
from slurmpod.report.placement import placement_of
from slurmpod.report.rules import notes_for
from slurmpod.report.sacct import SacctJob, Usage, restarts_of
from slurmpod.telemetry.schema import read_gpu_util_energy


def build_job_report(sj: SacctJob, *, spool_record: Mapping[str, Any] | None = None,
                     inventory: Inventory | None = None, log_hints: LogHints | None = None,
                     typical_mfu: Mapping[str, float] | None = None,
                     with_series: bool = True, with_notes: bool = True,
                     usage: Usage | None = None, site: Site | None = None,
                     site_path: Path | None = None) -> JobReport:
    """`site` (with `log_hints.args`, Megatron's arguments dump) gives a finished job its
    achieved vs predicted iteration (report/predicted.py); `site_path` finds the site's own
    calibration (`slurmpod calibrate`). `inventory` defaults to the site's."""
    job = sj.record
    if inventory is None and site is not None:
        inventory = site.inventory
    site_peak = _site_peak(job.nodes, inventory) if job.state.is_active else None
    fig = choose_figures(job, spool_record, site_peak)
    gpus = job.n_gpus or fig.gpus or 0
    attempts = sj.attempts or ()
    elapsed = [a.elapsed_s for a in attempts] or [job.elapsed_s]
    loss = split_loss(gpus, elapsed, fig, attempts)
    series: dict[str, list[Any]] = {}
    if spool_record is not None and with_series:
        series = {k: list(v) for k, v in (spool_record.get("series") or {}).items()
                  if isinstance(v, list)}
    # Stability feeds the notes and the job page; a fleet row (neither) does not read it.
    stab = (stability_of(series, fig)
            if (with_notes or with_series) and fig.has_training
            and (series or (fig.iter_ms and fig.iter_ms.p10 is not None))
            else None)
    placement = placement_of(job.nodes, inventory) if inventory is not None and job.nodes else None
    if job.state.is_active:
        status = "running"
        text = (f"job is {job.state}: partial report"
                + (", live figures from the job's Comment" if fig.source == "live_comment"
                   else ", no figures yet") + "; final figures come when it ends")
    elif fig.has_training:
        status, text = "complete", f"figures from the {fig.source.replace('_', ' ')}"
    else:
        status = "no-training-log"
        why = f" ({fig.err})" if fig.err else ""
        text = ("no training log figures for this job" + why
                + ": identity and placement only")
    report = JobReport(job=job, attempts=tuple(attempts), status=status, status_text=text,
                       figures=fig, loss=loss, stability=stab, placement=placement,
                       params_b=params_estimate(fig, gpus), series=series,
                       implausible=implausible_reasons(
                           fig, restarts_of(attempts) > 0 or fig.log_restarts > 0),
                       efficiency=None if with_notes else _row_gpu(spool_record))
    if not with_notes:
        return report
    report = replace(report, efficiency=efficiency_of(report, usage, spool_record))
    if (job.state.is_terminal and log_hints is not None and log_hints.args and fig.iter_ms
            and not report.implausible):
        from slurmpod.report.predicted import vs_predicted  # lazy: start-up

        med = fig.iter_ms.median
        report = replace(report, predicted=vs_predicted(
            log_hints.args, None if med is None else med / 1000.0, site=site,
            nodelist=job.nodes, gpus=gpus, site_path=site_path),
            stragglers=_stragglers(spool_record, log_hints.args, job.nodes, gpus))
    if job.state.is_terminal and spool_record is not None and not report.implausible:
        from slurmpod.report.memory import job_memory  # lazy: start-up

        report = replace(report, memory=job_memory(
            spool_record, log_hints.args if log_hints is not None else None, site=site,
            nodelist=job.nodes, gpus=gpus))
    eff = report.efficiency
    if status == "no-training-log" and eff is not None and (eff.usage or eff.gpu):
        # Not a Megatron job (or no log): the seff/jobstats part is the report.
        report = replace(report, status_text=text.replace(
            "identity and placement only", "efficiency from Slurm and the GPUs, no MFU"))
    notes = notes_for(report, log_hints=log_hints, typical_mfu=typical_mfu)
    return replace(report, notes=tuple(notes))


def _stragglers(record: Mapping[str, Any] | None, args: Mapping[str, Any], nodelist: str,
                gpus: int) -> Any:
    """The stragglers Megatron's per-rank timers name (report/stragglers.py): ranks placed by
    srun's default block distribution, one rank per GPU, in the order of Slurm's node list."""
    from slurmpod.accounting.logrecords import RankTimers  # lazy: start-up
    from slurmpod.report.stragglers import find_stragglers  # lazy: start-up

    metrics = ((record or {}).get("summary") or {}).get("metrics") or {}
    timers = RankTimers.from_json(metrics.get("rank_timers"))
    if timers is None:
        return None
    world = args.get("world_size")  # the run's (a dump of more GPUs than Slurm gave is not)
    if not isinstance(world, int) or isinstance(world, bool) or not 0 < world <= gpus:
        world = gpus
    nodes = expand(nodelist) if nodelist else []
    per_node = gpus // len(nodes) if nodes and gpus % len(nodes) == 0 else 0
    return find_stragglers(timers, args, world=world, nodes=nodes if per_node else (),
                           tasks_per_node=per_node or 8)


def _row_gpu(record: Mapping[str, Any] | None) -> Efficiency | None:
    """A fleet row's GPU utilisation and energy from the record's summary.gpu (fast path)."""
    if record is None:
        return None
    util, energy = read_gpu_util_energy(record)
    if util is None and energy is None:
        return None
    return Efficiency(usage=None, gpu=None if util is None else {"util": util},
                      energy_j=energy, energy_src=None if energy is None else "gpu")
