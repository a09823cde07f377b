"""`slurmpod calibrate`: fit the performance model's efficiency factors to this site's own
finished jobs, measure the runtime memory reserve from their Megatron memory reports
(perf/reserve.py), and store both beside the site file (`<site>.perf.toml`), where `slurmpod
plan` picks them up (docs/perf-model.md).

    slurmpod calibrate LOG... [--site SITE] [--output FILE] [--dry-run] [--json]
    slurmpod calibrate --since 30d [--user U] [--account A] [--partition P] [--spool DIR] ...

Two sources, exactly one per run: Megatron logs named on the command line, or the finished
jobs of Slurm's accounting over a window, selected as `slurmpod report --since` selects them
(its sacct query, spool records and safe log reader are reused from `slurmpod.cli.report`).
For those, what decides the fit comes from Slurm and the epilog's record, the model and layout
from the log's arguments dump (`perf.calibrate.achieved_from_record` decides per job). This
module is the I/O edge.
"""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from slurmpod.errors import ConfigError, UsageError

if TYPE_CHECKING:
    from collections.abc import Mapping

    from slurmpod.megatron.memory import MeasuredReserve
    from slurmpod.model.site import Site
    from slurmpod.perf.calibrate import Achieved
    from slurmpod.perf.fitted import Efficiency
    from slurmpod.perf.hardware import Hardware
    from slurmpod.perf.reserve import MemoryPoint
    from slurmpod.report.model import LogHints
    from slurmpod.report.sacct import SacctJob


@click.command("calibrate")
@click.argument("logs", nargs=-1, type=click.Path(exists=True, dir_okay=False,
                                                  path_type=Path))
@click.option("--since", metavar="WINDOW",
              help="Fit on the finished jobs of Slurm's accounting over this window (7d, 12h, "
                   "2w or a date) instead of LOGS.")
@click.option("--user", help="With --since: only this user's jobs.")
@click.option("--account", help="With --since: only this account's jobs.")
@click.option("--partition", help="With --since: only this partition's jobs.")
@click.option("--spool", envvar="SLURMPOD_SPOOL",
              help="With --since: the hooks' spool directory (default $SLURMPOD_SPOOL, the "
                   "sandbox's spool when $SLURMPOD_SANDBOX is set, else /var/spool/slurmpod).")
@click.option("--site", "site_name", default=None,
              help="Site TOML or built-in site name (default: dgx-h100-superpod).")
@click.option("--output", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Where to store the factors and the memory reserve (default: "
                   "SITE.perf.toml beside the site file).")
@click.option("--warmup-iters", type=click.IntRange(0), default=10, show_default=True,
              help="LOGS: iterations left out as warm-up (the epilog's records use its own).")
@click.option("--all-architectures", is_flag=True,
              help="Fit on jobs of every architecture, also those the built-in model is "
                   "known to miss on published runs (GPT-OSS 120B), which are left out by "
                   "default (skipped as known-miss).")
@click.option("--dry-run", is_flag=True, help="Print the fit; store nothing.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document.")
def calibrate(logs: tuple[Path, ...], since: str | None, user: str | None,
              account: str | None, partition: str | None, spool: str | None,
              site_name: str | None, output: Path | None, warmup_iters: int,
              all_architectures: bool, dry_run: bool, as_json: bool) -> None:
    """Fit the performance model to this site's finished Megatron jobs, and measure the memory
    reserve from their memory reports: their logs (LOGS), or the jobs of Slurm's accounting
    since a time (--since) with the epilog's records."""
    if bool(logs) == (since is not None):
        raise UsageError("give LOG files or --since WINDOW, not both (e.g. `slurmpod "
                         "calibrate job.out` or `slurmpod calibrate --since 30d`)")
    if logs and (user or account or partition or spool):
        raise UsageError("--user/--account/--partition/--spool select jobs of Slurm's "
                         "accounting: they go with --since, not with LOG files")
    from slurmpod.config import data_dir, load_site, resolve_site_path  # lazy: start-up
    from slurmpod.perf import calibrate as cal  # lazy: start-up
    from slurmpod.perf import store  # lazy: start-up
    from slurmpod.perf.fitted import DEFAULT_EFFICIENCY, FITTED  # lazy: start-up
    from slurmpod.perf.hardware import hardware_from_site  # lazy: start-up

    site_path = Path(resolve_site_path(site_name, default="dgx-h100-superpod"))
    site = load_site(site_path)
    if (not dry_run and output is None
            and site_path.resolve().parent == data_dir("site_configs").resolve()):
        raise UsageError(f"site {site.site.name} is built in; give --output or a site file "
                         "of your own")
    hw = hardware_from_site(site)
    hbm_gib = site.node_types[site.su_groups[0].node_type].gpu.hbm_gib
    skipped: Counter[str] = Counter()
    memory = _MemoryPoints(hw.gpu_model, hbm_gib)
    if since is not None:
        jobs = _from_accounting(since, user, account, partition, spool, site, hw.generation,
                                skipped, memory)
    else:
        jobs = _from_logs(logs, hw, warmup_iters, skipped, memory)
    if jobs and not all_architectures:
        from slurmpod.perf.track import load  # lazy: start-up

        jobs, missed = cal.without_known_misses(jobs, load())
        skipped["known-miss"] += missed
    if not jobs and not memory.points:
        _nothing_usable(since, skipped, memory.skipped)
    base = FITTED.get(hw.generation, DEFAULT_EFFICIENCY)
    eff: Efficiency | None = None
    ratios: list[tuple[str, float]] = []
    if jobs:
        try:
            eff, ratios = cal.fit_site(jobs, hw, base)
        except ValueError:
            if not memory.points:
                skipped["no-prediction"] += len(jobs)
                _nothing_usable(since, skipped, memory.skipped)
        skipped["no-prediction"] += len(jobs) - len(ratios)
    skipped = +skipped  # no zero counts
    reserve = memory.fit()
    stored: Path | None = None
    if not dry_run:
        from slurmpod.fsutil import output_error  # lazy: start-up

        stored = output or store.store_path(site_path)
        try:
            if eff is not None:
                store.save(stored, hw.generation, eff, len(ratios))
            if reserve is not None:
                store.save_reserve(stored, reserve)
        except OSError as exc:
            raise output_error(stored, exc) from None
    if skipped:
        click.echo(f"slurmpod: skipped {sum(skipped.values())} job(s): {_counts(skipped)}",
                   err=True)
    if as_json:
        from slurmpod.cli.output import emit_json  # lazy: start-up

        emit_json({"site": site.site.name, "gpu": hw.gpu_model, "generation": hw.generation,
                   "jobs": [{"job_id": job, "ratio": ratio} for job, ratio in ratios],
                   "skipped": dict(sorted(skipped.items())),
                   "before": _factors(base),
                   "after": None if eff is None else _factors(eff),
                   "memory": memory.to_json(reserve),
                   "stored": None if stored is None else str(stored)})
        return
    if eff is not None:
        host = ""
        if eff.moe_fp8_host_forward_s != base.moe_fp8_host_forward_s:
            host = (f", host's FP8 MoE forward {1e3 * base.moe_fp8_host_forward_s:.3g} -> "
                    f"{1e3 * eff.moe_fp8_host_forward_s:.3g} ms")
        click.echo(f"{site.site.name} ({hw.gpu_model}, {hw.generation}): {len(ratios)} jobs; "
                   f"gemm {base.gemm:g} -> {eff.gemm:g}, fp8 {base.fp8:g} -> {eff.fp8:g}{host}")
        for job, ratio in ratios:
            click.echo(f"  {job}: predicted / achieved {ratio:.2f}")
    if reserve is not None:
        click.echo(memory.summary_line(reserve))
    if stored is not None:
        click.echo(f"stored {stored}")


def _factors(eff: Efficiency) -> dict[str, float]:
    return {"gemm": eff.gemm, "fp8": eff.fp8,
            "moe_fp8_host_forward_s": eff.moe_fp8_host_forward_s}


class _MemoryPoints:
    """The jobs' memory reports as points of the reserve fit (perf.reserve), with skip counts."""

    def __init__(self, gpu_model: str, hbm_gib: float) -> None:
        self.gpu_model, self.hbm_gib = gpu_model, hbm_gib
        self.points: list[MemoryPoint] = []
        self.skipped: Counter[str] = Counter()

    def add(self, job_id: str, memory: Any, gpu_model: str, hbm_gib: float) -> None:
        from slurmpod.perf.reserve import memory_point  # lazy: start-up

        got = memory_point(job_id, memory, gpu_model, hbm_gib, self.gpu_model)
        if isinstance(got, str):
            self.skipped[got] += 1
        else:
            self.points.append(got)

    def fit(self) -> MeasuredReserve | None:
        from slurmpod.perf.reserve import fit_reserve  # lazy: start-up

        return fit_reserve(self.points) if self.points else None

    def published_cache_gib(self) -> float:
        from slurmpod.megatron import memory as mem  # lazy: start-up

        fixed = (mem.NOT_VISIBLE_FRACTION * self.hbm_gib + mem.CUDA_CONTEXT_GIB
                 + mem.CUBLAS_STREAMS * mem.CUBLAS_WORKSPACE_MIB[True] / 1024)
        return mem.FRAGMENTATION_FRACTION * (self.hbm_gib - fixed)

    def summary_line(self, r: MeasuredReserve) -> str:
        outside = ("" if r.outside_torch_gib is None else
                   f", outside PyTorch {r.outside_torch_gib:.2f} GiB over {r.jobs_outside} "
                   "job(s) (published: context and workspaces 1.13 GiB + NCCL by layout)")
        return (f"memory reserve on {r.gpu_model} ({r.hbm_gib:g} GiB), upper quartile of the "
                f"jobs: PyTorch cache {r.cached_gib:.2f} GiB over {r.jobs} job(s) (published "
                f"share {self.published_cache_gib():.2f} GiB){outside}")

    def to_json(self, r: MeasuredReserve | None) -> dict[str, Any]:
        return {"gpu": self.gpu_model, "hbm_gib": self.hbm_gib,
                "jobs": [{"job_id": p.job_id, "max_allocated_gib": p.max_allocated_gib,
                          "cached_gib": p.cached_gib, "outside_torch_gib": p.outside_torch_gib}
                         for p in self.points],
                "skipped": dict(sorted((+self.skipped).items())),
                "cached_gib": None if r is None else r.cached_gib,
                "outside_torch_gib": None if r is None else r.outside_torch_gib,
                "published_cache_gib": round(self.published_cache_gib(), 3)}


def _by_count(skipped: Counter[str]) -> list[tuple[str, int]]:
    return sorted(skipped.items(), key=lambda kv: (-kv[1], kv[0]))


def _counts(skipped: Counter[str]) -> str:
    return ", ".join(f"{reason} {n}" for reason, n in _by_count(skipped))


def _nothing_usable(since: str | None, skipped: Counter[str],
                    memory_skipped: Counter[str]) -> None:
    """A usage error naming why no job gave a step time or a memory report to fit on."""
    from slurmpod.perf.calibrate import SKIP_REASONS  # lazy: start-up
    from slurmpod.perf.reserve import MEMORY_SKIP_REASONS  # lazy: start-up

    skipped = +skipped
    memory_skipped = +memory_skipped
    if since is None and skipped["known-miss"]:
        raise UsageError(f"all {skipped['known-miss']} usable log(s) are of "
                         f"{SKIP_REASONS['known-miss']}: fitted on, they would move every other "
                         "model's prediction by the model's own gap",
                         hint="add --all-architectures to fit on them anyway")
    if since is None:
        raise UsageError("no log with an arguments dump, world_size and iteration lines",
                         hint="calibrate reads the stdout of finished Megatron jobs")
    if not skipped:
        raise UsageError(f"no job in Slurm's accounting since {since} (with these filters)",
                         hint="widen --since, or check `sacct --allusers --starttime ...`")
    why = "; ".join(f"{n} {SKIP_REASONS.get(reason, reason)} ({reason})"
                    for reason, n in _by_count(skipped))
    if memory_skipped:
        why += "; memory reports: " + "; ".join(
            f"{n} {MEMORY_SKIP_REASONS.get(reason, reason)} ({reason})"
            for reason, n in _by_count(memory_skipped))
    raise UsageError(f"no finished job since {since} to calibrate on",
                     hint=f"skipped: {why}")


def _from_logs(logs: tuple[Path, ...], hw: Hardware, warmup_iters: int,
               skipped: Counter[str], memory: _MemoryPoints) -> list[Achieved]:
    """Each log named on the command line: its arguments dump and steady median iteration."""
    from slurmpod.accounting.logparse import parse_log  # lazy: start-up
    from slurmpod.accounting.metrics import job_metrics  # lazy: start-up
    from slurmpod.megatron.runspec import ModelConfig  # lazy: start-up
    from slurmpod.megatron.validate import check_dump_args  # lazy: start-up
    from slurmpod.perf.calibrate import Achieved  # lazy: start-up
    from slurmpod.perf.options import RunOptions  # lazy: start-up

    jobs: list[Achieved] = []
    for log in logs:
        with log.open("rb") as f:
            summary = parse_log(f)
        if summary.memory is not None:  # the site's GPU: a log names no nodes
            memory.add(log.name, summary.memory.for_record(None), memory.gpu_model,
                       memory.hbm_gib)
        args = summary.args
        if args is None or not summary.iterations:
            # A few files the user named: each one is worth its own line.
            click.echo(f"slurmpod: warning: {log}: no arguments dump or no iteration lines; "
                       "skipped", err=True)
            skipped["no-dump" if args is None else "no-step-time"] += 1
            continue
        problem = check_dump_args(args)
        if problem is not None:
            raise ConfigError(f"arguments dump: {problem}", file=str(log))
        world = args.get("world_size")
        if not isinstance(world, int) or world < 1:
            click.echo(f"slurmpod: warning: {log}: no world_size in the dump; skipped", err=True)
            skipped["bad-dump"] += 1
            continue
        m = job_metrics(summary, None, hw.peak_bf16, world, seq_length=None,
                        flops_formula="none", warmup_iters=warmup_iters)
        if m.iter_time_ms is None:
            skipped["no-step-time"] += 1
            continue
        jobs.append(Achieved(log.name, ModelConfig.from_args(args), world,
                             RunOptions.from_args(args), m.iter_time_ms.median / 1000))
    return jobs


def _from_accounting(since: str, user: str | None, account: str | None,
                     partition: str | None, spool: str | None, site: Site, generation: str,
                     skipped: Counter[str], memory: _MemoryPoints) -> list[Achieved]:
    """The finished jobs `slurmpod report --since` would list, each through
    `achieved_from_record`: Slurm's fields, the latest spool record, the log's dump."""
    from slurmpod.accounting.trusted import site_gpu  # lazy: start-up

    # lazy: start-up
    from slurmpod.cli.report import (
        PROGRESS_MIN_JOBS,
        _load,
        _spool_dir,
        log_hints,
        read_spool_record,
        spool_index,
        window_selection,
    )
    from slurmpod.perf.calibrate import achieved_from_record  # lazy: start-up
    from slurmpod.report.sacct import select  # lazy: start-up

    sel = window_selection(since, user, account, partition)
    selected = select(_load(sel), user=user, account=account, partition=partition)
    index = spool_index(_spool_dir(spool))
    inventory = site.inventory
    types: dict[str, str | None] = {}  # node list -> site node type (a fleet repeats them)
    out: list[Achieved] = []

    def one(job: SacctJob) -> None:
        r = job.record
        if r.nodes not in types:
            sg = site_gpu(r.nodes, site, inventory) if r.nodes else None
            types[r.nodes] = sg.node_type if sg is not None else None
        path = index.get(r.job_id)
        # Only finished jobs with a record are read (a running job's file would be an earlier
        # attempt's); the log is read last, only when every other check passed.
        rec = read_spool_record(path) if path is not None and r.state.is_terminal else None
        if types[r.nodes] is not None and isinstance(rec, dict):
            _memory_of(r.job_id, rec, site, types[r.nodes], memory)
        got = achieved_from_record(r, rec, lambda: _dump(log_hints(rec)),
                                   node_type=types[r.nodes], site=site, generation=generation)
        if isinstance(got, str):
            skipped[got] += 1
        else:
            out.append(got)

    if len(selected) >= PROGRESS_MIN_JOBS:
        with click.progressbar(selected, label="reading jobs", file=sys.stderr) as bar:
            for job in bar:
                one(job)
    else:
        for job in selected:
            one(job)
    return out


def _memory_of(job_id: str, rec: Mapping[str, Any], site: Site, node_type: str | None,
               memory: _MemoryPoints) -> None:
    """The record's memory report as a point of the reserve fit, on the GPU of the job's nodes
    (Slurm's node list in the site file), unless the epilog flagged the record implausible."""
    summary = rec.get("summary")
    if not isinstance(summary, dict) or summary.get("implausible") or node_type is None:
        return
    metrics = summary.get("metrics")
    gpu = site.node_types[node_type].gpu
    memory.add(job_id, metrics.get("memory") if isinstance(metrics, dict) else None,
               gpu.model, gpu.hbm_gib)


def _dump(hints: LogHints | None) -> Mapping[str, Any] | None:
    return None if hints is None else hints.args
