"""`slurmpod calibrate LOG...`: fit the performance model's efficiency factors to this site's
own finished jobs and store them beside the site file (`<site>.perf.toml`), where `slurmpod
plan` picks them up (docs/perf-model.md)."""

from __future__ import annotations

from pathlib import Path

import click

from slurmpod.errors import ConfigError, UsageError


@click.command("calibrate")
@click.argument("logs", nargs=-1, required=True, type=click.Path(exists=True, dir_okay=False,
                                                                path_type=Path))
@click.option("--site", "site_name", default=None,
              help="Site TOML or built-in site name (default: dgx-h100-superpod).")
@click.option("--output", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Where to store the factors (default: SITE.perf.toml beside the site file).")
@click.option("--warmup-iters", type=click.IntRange(0), default=10, show_default=True)
@click.option("--dry-run", is_flag=True, help="Print the fit; store nothing.")
def calibrate(logs: tuple[Path, ...], site_name: str | None, output: Path | None,
              warmup_iters: int, dry_run: bool) -> None:
    """Fit the performance model to finished Megatron jobs' logs (their arguments dump and
    steady iteration time) on this site."""
    from slurmpod.accounting.logparse import parse_log  # lazy: start-up
    from slurmpod.accounting.metrics import job_metrics  # lazy: start-up
    from slurmpod.config import data_dir, load_site, resolve_site_path  # lazy: start-up
    from slurmpod.megatron.runspec import ModelConfig  # lazy: start-up
    from slurmpod.megatron.validate import check_dump_args  # lazy: start-up
    from slurmpod.perf import calibrate as cal  # lazy: start-up

    # lazy: start-up
    # lazy: start-up
    from slurmpod.perf.model import DEFAULT_EFFICIENCY, FITTED, RunOptions, hardware_from_site

    site_path = Path(resolve_site_path(site_name, default="dgx-h100-superpod"))
    site = load_site(site_path)
    hw = hardware_from_site(site)
    jobs: list[cal.Achieved] = []
    for log in logs:
        with log.open("rb") as f:
            summary = parse_log(f)
        args = summary.args
        if args is None or not summary.iterations:
            click.echo(f"slurmpod: warning: {log}: no arguments dump or no iteration lines; "
                       "skipped", err=True)
            continue
        problem = check_dump_args(args)
        if problem is not None:
            raise ConfigError(f"arguments dump: {problem}", file=str(log))
        world = args.get("world_size")
        if not isinstance(world, int) or world < 1:
            click.echo(f"slurmpod: warning: {log}: no world_size in the dump; skipped", err=True)
            continue
        m = job_metrics(summary, None, hw.peak_bf16, world, seq_length=None,
                        flops_formula="none", warmup_iters=warmup_iters)
        if m.iter_time_ms is None:
            continue
        jobs.append(cal.Achieved(log.name, ModelConfig.from_args(args), world,
                                 RunOptions.from_args(args), m.iter_time_ms.median / 1000))
    if not jobs:
        raise UsageError("no log with an arguments dump, world_size and iteration lines",
                         hint="calibrate reads the stdout of finished Megatron jobs")
    base = FITTED.get(hw.generation, DEFAULT_EFFICIENCY)
    try:
        eff, ratios = cal.fit_site(jobs, hw, base)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    click.echo(f"{site.site.name} ({hw.gpu_model}, {hw.generation}): {len(ratios)} jobs; "
               f"gemm {base.gemm:g} -> {eff.gemm:g}, fp8 {base.fp8:g} -> {eff.fp8:g}")
    for job, ratio in ratios:
        click.echo(f"  {job}: predicted / achieved {ratio:.2f}")
    if dry_run:
        return
    dest = output or cal.store_path(site_path)
    if output is None and site_path.resolve().parent == data_dir("site_configs").resolve():
        raise UsageError(f"site {site.site.name} is built in; give --output or a site file "
                         "of your own")
    from slurmpod.fsutil import output_error  # lazy: start-up

    try:
        cal.save(dest, hw.generation, eff, len(ratios))
    except OSError as exc:
        raise output_error(dest, exc) from None
    click.echo(f"stored {dest}")
