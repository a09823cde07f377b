"""`slurmpod render` and `slurmpod submit`: the sbatch script for a run spec, and its submission."""

from __future__ import annotations

import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from slurmpod.errors import UsageError

_CPU_BIND = click.Choice(["numactl", "slurm", "none"])


def _render_options(f: Callable[..., Any]) -> Callable[..., Any]:
    """Options shared by render and submit (applied bottom-up, so listed in reverse)."""
    opts = [
        click.option("--site", help="Site file or built-in site name "
                                    "(default: $SLURMPOD_SITE, else dgx-h100-superpod)."),
        click.option("--template-dir", "template_dirs", multiple=True,
                     type=click.Path(file_okay=False, path_type=Path),
                     help="Site template dir; its sbatch/*.j2 and nccl-env.toml override the "
                          "built-ins. Repeatable."),
        click.option("--template", default="sbatch/megatron.sbatch.j2", show_default=True,
                     help="Template name inside the template dirs."),
        click.option("--run-dir", help="Run directory (default: [job] work_dir, else "
                                       "slurmpod-runs/<name>)."),
        click.option("--nccl-debug", is_flag=True, help="NCCL_DEBUG=INFO with subsystems."),
        click.option("--nccl-algo", help="Force NCCL_ALGO (debugging only)."),
        click.option("--nccl-proto", help="Force NCCL_PROTO (debugging only)."),
        click.option("--nccl-version", help="NCCL in the job's image, e.g. 2.21.5 (gates "
                                            "variables; unknown = keep them)."),
        click.option("--env", "env_pairs", multiple=True, metavar="NAME=VALUE",
                     help="Extra job environment (after the site layer). Repeatable."),
        click.option("--topo-dir", default="/etc/slurmpod/nccl-topo", show_default=True,
                     help="Directory on the cluster holding <node-type>.xml from "
                          "`slurmpod topo generate`; '' to leave NCCL_TOPO_FILE unset."),
        click.option("--max-restarts", type=click.IntRange(0), default=3, show_default=True,
                     help="Requeues allowed after preemption, time limit or failure."),
        click.option("--signal-lead", "signal_lead_s", type=click.IntRange(10),
                     default=None,
                     help="Seconds before the time limit that the trainer is asked to save "
                          "[default: 60 + twice the predicted checkpoint save time]."),
        click.option("--save-on-cancel", is_flag=True,
                     help="Let a cancelled run finish a checkpoint (within Slurm's KillWait)."),
        click.option("--switch-wait", default="24:00:00", show_default=True,
                     help="--switches max wait (Slurm caps it at max_switch_wait)."),
        click.option("--chain", type=click.IntRange(1), default=1, show_default=True,
                     help="Submit N jobs chained with --dependency=singleton."),
        click.option("--spares", type=click.IntRange(0), default=0, show_default=True,
                     help="Hot-spare nodes allocated on top of the run's nodes."),
        click.option("--cpu-bind", type=_CPU_BIND, default="numactl", show_default=True,
                     help="Per-rank binding to the GPU's NUMA node."),
        # Resilience inside the job (docs/resilience-in-job.md): the rendered defaults, which
        # the job's environment (SLURMPOD_HANG_K, ...) can still override at submit time.
        click.option("--hang-k", type=click.FloatRange(1.0), default=10.0, show_default=True,
                     help="A hang is declared after no iteration for K x the median step "
                          "time (or --hang-floor, the longer)."),
        click.option("--hang-floor", "hang_floor_s", type=click.FloatRange(1.0), default=300.0,
                     show_default=True, metavar="SECONDS",
                     help="The shortest silence declared a hang."),
        click.option("--shed-fraction", type=click.FloatRange(0.0, 1.0), default=0.02,
                     show_default=True,
                     help="Bad nodes a run may exclude beyond its spares, as a share of the "
                          "partition's nodes."),
        click.option("--health-gate/--no-health-gate", default=True, show_default=True,
                     help="Check every node (GPUs, HCAs, checkpoint directory) before each "
                          "attempt and exclude the failing ones."),
        click.option("--health-allreduce", is_flag=True,
                     help="Add an all-reduce between pairs of the job's nodes to the health "
                          "gate (nccl-tests' all_reduce_perf on the nodes)."),
        click.option("--allreduce-min-busbw", type=click.FloatRange(0.0, min_open=True),
                     default=None, metavar="GB/S",
                     help="Bus bandwidth a pair must reach in --health-allreduce "
                          "[default: none; about half a healthy pair's]."),
        click.option("--no-monitor", is_flag=True, help="Do not start `slurmpod hook monitor`."),
    ]
    for opt in reversed(opts):
        f = opt(f)
    return f


def _options(site_label: str, kw: dict[str, Any]):  # -> RenderOptions
    from slurmpod.render.sbatch import RenderOptions  # lazy: start-up

    env: dict[str, str | None] = dict(_pairs(kw["env_pairs"], "--env"))
    return RenderOptions(
        site_label=site_label, template=kw["template"], template_dirs=tuple(kw["template_dirs"]),
        nccl_debug=kw["nccl_debug"], nccl_algo=kw["nccl_algo"], nccl_proto=kw["nccl_proto"],
        nccl_version=kw["nccl_version"], run_env=env, topo_dir=kw["topo_dir"],
        max_restarts=kw["max_restarts"], signal_lead_s=kw["signal_lead_s"],
        switch_wait=kw["switch_wait"], chain=kw["chain"], spares=kw["spares"],
        cpu_bind=kw["cpu_bind"], monitor=not kw["no_monitor"],
        save_on_cancel=kw["save_on_cancel"], python=sys.executable,
        hang_k=kw["hang_k"], hang_floor_s=kw["hang_floor_s"], shed_fraction=kw["shed_fraction"],
        health_gate=kw["health_gate"], health_allreduce=kw["health_allreduce"],
        allreduce_min_busbw=kw["allreduce_min_busbw"],
    )


@click.command()
@click.argument("run_file", type=click.Path(dir_okay=False, path_type=Path))
@_render_options
@click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=Path),
              help="Write the script here (atomically) instead of stdout.")
def render(run_file: Path, output: Path | None, **kw: Any) -> None:
    """Render the sbatch script for RUN_FILE (refuses an invalid or non-fitting plan: exit 3)."""
    prep = _prepare_local(run_file, kw)
    _warn(prep)
    if output is None:
        sys.stdout.write(prep.script)
        return
    from slurmpod.fsutil import output_error, write_atomic  # lazy: start-up

    try:
        write_atomic(output, prep.script, mode=0o755)
    except OSError as exc:
        raise output_error(output, exc) from None
    click.echo(f"wrote {output}", err=True)
    # Slurm opens the script's --output file before the script runs, so its directory must
    # exist by then: create it, so that a plain `sbatch` of the script works.
    logs = Path(prep.run_dir) / "logs"
    try:
        logs.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        click.echo(f"slurmpod: warning: cannot create {logs} ({exc.strerror}); create it on the "
                   "cluster before `sbatch`, or use `slurmpod submit`", err=True)


@click.command()
@click.argument("run_file", type=click.Path(dir_okay=False, path_type=Path))
@_render_options
@click.option("--host", help="Submit over SSH to this host (~/.ssh/config alias or name).")
@click.option("--remote-env", "remote_env", multiple=True, metavar="NAME=VALUE",
              help="Environment for the Slurm commands slurmpod runs (e.g. SLURM_CONF on a "
                   "cluster with a non-default config). Repeatable.")
@click.option("--backend", type=click.Choice(["cli", "pyslurm"]), default="cli",
              show_default=True)
@click.option("--dry-run", is_flag=True, help="Plan and render only; queue nothing.")
@click.option("--wait", is_flag=True, help="Wait until the job starts; print nodes and SUs.")
@click.option("--wait-timeout", type=float, default=600.0, show_default=True,
              help="Seconds --wait waits for the job to start.")
@click.option("--force", is_flag=True, help="Submit even if this exact script is queued.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document.")
def submit(run_file: Path, host: str | None, remote_env: tuple[str, ...], backend: str,
           dry_run: bool, wait: bool, wait_timeout: float, force: bool, as_json: bool,
           **kw: Any) -> None:
    """Plan, render, store and submit RUN_FILE; print the job id."""
    from slurmpod import submit as sub  # lazy: start-up
    from slurmpod.config import resolve_site_path  # lazy: start-up

    if host is None:
        prep = _prepare_local(run_file, kw)  # a ConfigError before any Slurm command
    else:
        # Over SSH the run directory depends on the remote home: prepare once connected.
        run, site, label = sub.read_run_and_site(run_file, kw["site"])
        opts = _options(label, kw)
    if backend == "pyslurm" and host:
        raise UsageError("--backend pyslurm talks to the local Slurm; drop --host or use cli")
    runner = _runner(host)
    if remote_env:
        runner = sub.EnvRunner(runner, _pairs(remote_env, "--remote-env"))
    try:
        if host is not None:
            run_dir = sub.resolve_run_dir(run, kw["run_dir"], _remote_home(runner))
            prep = sub.prepare(run, site, opts, run_dir, str(run_file),
                               resolve_site_path(kw["site"]))
        _warn(prep)
        if dry_run:
            if host is None:  # "would store" only where it could
                from slurmpod.fsutil import check_writable_dir  # lazy: start-up

                check_writable_dir(Path(prep.run_dir))
            res = sub.SubmitResult([], prep.run_dir, prep.script_path, prep.token, runner.where,
                                   dry_run=True, min_sus=prep.min_sus)
            if as_json:
                from slurmpod.cli.output import emit_json  # lazy: start-up

                emit_json({**res.to_json(), "script_text": prep.script})
            else:
                sys.stdout.write(prep.script)
                click.echo(f"dry run: would store {prep.script_path} and submit on "
                           f"{runner.where}", err=True)
            return
        from slurmpod.backends import make_backend  # lazy: start-up

        be = make_backend(backend, runner)
        res = sub.submit(prep, runner, be, chain=kw["chain"], force=force)
        if wait:
            site = prep.site if isinstance(prep, sub.Prepared) else _load_site(kw["site"])
            res = sub.wait_for_start(be, site, res, timeout_s=wait_timeout)
    finally:
        runner.close()
    if as_json:
        from slurmpod.cli.output import emit_json  # lazy: start-up

        emit_json(res.to_json())
        return
    click.echo(" ".join(res.job_ids))
    note = "already queued as" if res.reused else "submitted"
    click.echo(f"{note} job {', '.join(res.job_ids)} on {res.where}; script {res.script_path}",
               err=True)
    if wait:
        spans = f"{len(res.sus)} SU(s) {','.join(res.sus)}" if res.sus else "no nodes"
        click.echo(f"job {res.job_ids[0]} {res.state} on {res.nodes or '-'}: {spans} "
                   f"(minimum {res.min_sus})")


def _prepare_local(run_file: Path, kw: dict[str, Any]):  # -> Prepared | Rendered
    """Prepare RUN_FILE for this machine (run directory below the cwd), reusing the stored
    script when these exact inputs were prepared before (see slurmpod.submit)."""
    from slurmpod import submit as sub  # lazy: start-up
    from slurmpod.config import resolve_site_path  # lazy: start-up

    base = str(Path.cwd())
    key = sub.prepared_key(run_file, resolve_site_path(kw["site"]), kw["template_dirs"], kw, base)
    hit = sub.cache_load(key) if key else None
    if hit is not None:  # stored only after a successful prepare of these very inputs
        return hit
    run, site, label = sub.read_run_and_site(run_file, kw["site"])
    opts = _options(label, kw)
    prep = sub.prepare(run, site, opts, sub.resolve_run_dir(run, kw["run_dir"], base),
                       str(run_file), resolve_site_path(kw["site"]))
    if key:
        sub.cache_store(key, prep)
    return prep


def _warn(prep: Any) -> None:
    for line in prep.warnings:
        click.echo(f"slurmpod: warning: {line}", err=True)


def _load_site(site: str | None):  # -> Site
    from slurmpod.config import load_site, resolve_site_path  # lazy: start-up

    return load_site(resolve_site_path(site))


def _pairs(pairs: tuple[str, ...], option: str) -> dict[str, str]:
    out = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep:
            raise UsageError(f"{option} {pair!r}: expected NAME=VALUE")
        if option == "--remote-env" and not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
            raise UsageError(f"{option} {name!r} is not a valid environment variable name")
        out[name] = value
    return out


def _runner(host: str | None):  # -> CommandRunner
    if host is None:
        from slurmpod.transport.local import LocalRunner  # lazy: start-up

        return LocalRunner()
    from slurmpod.transport.ssh import SshRunner  # lazy: start-up

    return SshRunner(host)


def _remote_home(runner: Any) -> str:
    res = runner.run(["pwd"], timeout_s=30)
    home = res.stdout.strip()
    if not home.startswith("/"):
        raise UsageError(f"cannot find the home directory on {runner.where}; pass an absolute "
                         "--run-dir")
    return home
