"""`slurmpod simulate`: goodput of a long run under node failures (slurmpod.resilience.simulate).

numpy loads only when the command runs.
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

import click

from slurmpod.cli.output import emit_json
from slurmpod.errors import UsageError
from slurmpod.render.launch import predicted_save_s
from slurmpod.resilience.interval import young_interval

_SUFFIX = {"": 1.0, "K": 1e3, "M": 1e6, "B": 1e9, "G": 1e9, "T": 1e12}


def parse_count(text: str) -> float:
    """`405B`, `70e9`, `7.5M` -> a number of parameters."""
    m = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]*)?(?:[eE][0-9]+)?)\s*([KMBGT]?)\s*", text.upper())
    if not m or not float(m.group(1)) > 0:
        raise UsageError(f"--params {text!r}: give a parameter count such as 405B or 70e9")
    return float(m.group(1)) * _SUFFIX[m.group(2)]


def _dur(s: float) -> str:
    if s >= 2 * 3600:
        return f"{s / 3600:,.3g} h"
    if s >= 120:
        return f"{s / 60:.3g} min"
    return f"{s:.3g} s"


@click.command("simulate")
@click.option("--gpus", type=click.IntRange(1, 10_000_000), default=None,
              help="GPUs of the run (whole nodes of --gpus-per-node).")
@click.option("--nodes", type=click.IntRange(1, 10_000_000), default=None,
              help="Nodes of the run (instead of --gpus).")
@click.option("--gpus-per-node", type=click.IntRange(1, 1024), default=None,
              help="[default: the site's node type]")
@click.option("--days", type=click.FloatRange(0.01, 10_000), default=90.0, show_default=True)
@click.option("--site", "site_name", default=None,
              help="Site file or built-in name: node MTBF ([reliability]), GPUs per node and "
                   "checkpoint write rate ([storage]) (default: $SLURMPOD_SITE, else "
                   "dgx-h100-superpod).")
@click.option("--node-mtbf-hours", type=click.FloatRange(0.001, 1e7), default=None,
              help="Mean hours between interruptions per node [default: --history, else the "
                   "site's].")
@click.option("--history", "history_paths", multiple=True,
              type=click.Path(exists=True, path_type=Path),
              help="attempts.jsonl, a run directory or a directory of runs: the observed node "
                   "MTBF. Repeatable.")
@click.option("--law", type=click.Choice(["exponential", "weibull"]), default="exponential",
              show_default=True, help="Each node's time-between-failures law.")
@click.option("--shape", type=click.FloatRange(0.05, 20), default=0.7, show_default=True,
              help="Weibull shape k (<1: infant mortality; >1: wear-out); --law weibull only.")
@click.option("--start", type=click.Choice(["fleet", "new"]), default="fleet",
              show_default=True,
              help="fleet: nodes of an established fleet; new: every node at age 0.")
@click.option("--save", "save_s", type=click.FloatRange(0, 1e6), default=None,
              help="Seconds one checkpoint save holds training up.")
@click.option("--params", default=None,
              help="Parameter count (405B, 70e9): the save time predicted as `render` does "
                   "(14 B per parameter over the site's checkpoint_write_gb_per_s).")
@click.option("--restart", "restart_s", type=click.FloatRange(0, 1e6), default=600.0,
              show_default=True, help="Seconds from a failure to training again.")
@click.option("--restart-law", type=click.Choice(["fixed", "exponential"]), default="fixed",
              show_default=True)
@click.option("--hang-fraction", type=click.FloatRange(0, 1), default=0.0, show_default=True,
              help="Fraction of failures that hang instead of failing.")
@click.option("--hang-detect", "hang_detect_s", type=click.FloatRange(0, 1e6), default=0.0,
              show_default=True, help="Seconds until a hang is detected.")
@click.option("--interval", "interval_s", type=click.FloatRange(0.001, 1e9), default=None,
              help="Seconds of training between saves [default: Daly's optimum].")
@click.option("--save-interval", type=click.IntRange(1), default=None,
              help="The policy in iterations (needs --step).")
@click.option("--step", "step_s", type=click.FloatRange(1e-6, 1e6), default=None,
              help="Seconds per iteration: the best interval is also shown in iterations.")
@click.option("--samples", type=click.IntRange(1, 100_000), default=200, show_default=True)
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document.")
def simulate(gpus: int | None, nodes: int | None, gpus_per_node: int | None, days: float,
             site_name: str | None, node_mtbf_hours: float | None,
             history_paths: tuple[Path, ...], law: str, shape: float, start: str,
             save_s: float | None, params: str | None, restart_s: float, restart_law: str,
             hang_fraction: float, hang_detect_s: float, interval_s: float | None,
             save_interval: int | None, step_s: float | None, samples: int, seed: int,
             as_json: bool) -> None:
    """Expected goodput of a run of N GPUs over D days, its distribution and the best interval."""
    from slurmpod.config import load_site, resolve_site_path  # lazy: start-up

    if (gpus is None) == (nodes is None):
        raise UsageError("give exactly one of --gpus and --nodes")
    if (save_s is None) == (params is None):
        raise UsageError("give exactly one of --save (seconds) and --params (count)")
    if save_interval is not None:
        if step_s is None or interval_s is not None:
            raise UsageError("--save-interval needs --step and excludes --interval")
        interval_s = save_interval * step_s
    site = load_site(resolve_site_path(site_name))
    gpn = gpus_per_node or site.node_types[site.su_groups[0].node_type].gpus
    if nodes is None:
        assert gpus is not None
        nodes = math.ceil(gpus / gpn)
    mtbf_source = "given"
    history = None
    if node_mtbf_hours is None:
        if history_paths:
            from slurmpod.resilience.history import read_history  # lazy: start-up

            history = read_history(history_paths)
            node_mtbf_hours = history.node_mtbf_hours(site.reliability.node_mtbf_hours)
            mtbf_source = "history"
        else:
            node_mtbf_hours, mtbf_source = site.reliability.node_mtbf_hours, "site"
    elif history_paths:
        raise UsageError("--history and --node-mtbf-hours exclude each other")
    if save_s is None:

        save_s = predicted_save_s(parse_count(params or ""),
                                  site.storage.checkpoint_write_gb_per_s)

    from slurmpod.resilience.simulate import Scenario  # lazy: start-up
    from slurmpod.resilience.simulate import simulate as run_sim  # lazy: start-up

    try:
        scn = Scenario(nodes=nodes, days=days, node_mtbf_hours=node_mtbf_hours, save_s=save_s,
                       restart_s=restart_s, law=law,  # type: ignore[arg-type]
                       shape=shape if law == "weibull" else 1.0,
                       start=start, restart_law=restart_law,  # type: ignore[arg-type]
                       hang_fraction=hang_fraction, hang_detect_s=hang_detect_s)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    try:
        res = run_sim(scn, samples=samples, seed=seed, interval_s=interval_s)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    data: dict[str, Any] = res.to_json()
    data["scenario"].update({"gpus": nodes * gpn, "gpus_per_node": gpn,
                             "mtbf_source": mtbf_source})
    data["young_interval_s"] = young_interval(max(save_s, 1e-9), scn.job_mtbf_s)
    if history is not None:
        data["history"] = history.to_json(site.reliability.node_mtbf_hours)
    if step_s is not None:
        data["step_s"] = step_s
        data["best_save_interval"] = max(1, round(res.best_interval_s / step_s))
    if as_json:

        emit_json(data)
        return
    click.echo(_render(data))


def _render(d: dict[str, Any]) -> str:
    s = d["scenario"]
    law = "exponential" if s["law"] == "exponential" else f"Weibull k={s['shape']:g}"
    g = d["goodput"]
    lost = d["lost_fraction"]
    out = [
        f"simulate: {s['gpus']:,} GPUs ({s['nodes']:,} nodes) for {s['days']:g} days; node "
        f"MTBF {s['node_mtbf_hours']:,.0f} h [{s['mtbf_source']}], {law} ({s['start']}) -> job "
        f"MTBF {_dur(s['job_mtbf_hours'] * 3600)}, {d['failures_per_run']:,.1f} interruptions "
        f"per run (mean of {d['samples']} runs, seed {d['seed']})",
        f"  save {_dur(s['save_s'])}, restart {_dur(s['restart_s'])} ({s['restart_law']})"
        + (f", {s['hang_fraction']:.0%} hangs detected after {_dur(s['hang_detect_s'])}"
           if s["hang_fraction"] else ""),
        f"  policy     a save every {_dur(d['interval_s'])} of training: goodput mean "
        f"{g['mean']:.2%} (p5 {g['p5']:.2%}, median {g['p50']:.2%}, p95 {g['p95']:.2%})",
        f"  lost       restart {lost['restart']:.2%}, checkpoint saves {lost['checkpoint']:.2%}, "
        f"recomputed work {lost['recomputed']:.2%} of wall time",
        f"  best       every {_dur(d['best_interval_s'])}: {d['best_goodput']:.2%}"
        + (f" (save_interval {d['best_save_interval']} at {d['step_s']:g} s/iteration)"
           if "best_save_interval" in d else ""),
        f"  closed     Daly every {_dur(d['daly_interval_s'])}: {d['daly_goodput']:.2%} "
        f"(exponential model); Young every {_dur(d['young_interval_s'])}",
    ]
    return "\n".join(out)
