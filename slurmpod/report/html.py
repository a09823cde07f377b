"""Self-contained HTML reports: Jinja templates under `templates/report/` with the plots of
`slurmpod.report.plots` embedded as data URIs. No scripts, fonts or images are fetched, so the
file reads the same offline. Every value is HTML-escaped (autoescape on)."""

from __future__ import annotations

from typing import Any

from slurmpod import __version__
from slurmpod.report.fleet import FleetReport
from slurmpod.report.model import LOSS_CAUSES, SPIKE_FACTOR, JobReport
from slurmpod.report.text import dist_text, dur, gpuh, num, pct


def _env() -> Any:
    import jinja2

    from slurmpod.config import data_dir

    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(data_dir("templates") / "report")),
        undefined=jinja2.StrictUndefined, autoescape=True, trim_blocks=True,
        lstrip_blocks=True)
    env.filters.update(pct=pct, num=num, dur=dur, gpuh=gpuh)
    env.globals.update(slurmpod_version=__version__, causes=LOSS_CAUSES, dist_text=dist_text,
                       pct=pct, num=num)
    return env


def job_html(r: JobReport, *, generated: str) -> str:
    from slurmpod.report import plots

    plots_ = {
        "run": plots.mfu_over_run(r.series, r.figures.peak_tflops),
        "hist": plots.iteration_histogram(r.series, SPIKE_FACTOR),
        "timeline": plots.timeline(r),
        "placement": plots.placement_map(r),
    }
    return _env().get_template("job.html.j2").render(
        r=r, j=r.to_json(), plots=plots_, generated=generated)


def fleet_html(fl: FleetReport, *, generated: str) -> str:
    from slurmpod.report import plots

    plots_ = {"mfu": plots.fleet_mfu_distribution(fl), "lost": plots.fleet_lost_over_time(fl)}
    return _env().get_template("fleet.html.j2").render(
        fl=fl, plots=plots_, generated=generated)
