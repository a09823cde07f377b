"""`slurmpod runs`, `slurmpod logs RUN` and `slurmpod cancel RUN`: see and steer your runs.

    slurmpod runs [--since 7d] [--all-users] [--host H] [--json]
    slurmpod logs RUN [-f] [--attempt N] [--rank R] [--host H]
    slurmpod cancel RUN [--save] [--host H] [--json]

RUN is a job id or a run name (your most recent job of that name). Slurm is asked through the
CLI backend and the run's files are read through the same runner, here or over SSH
(docs/runs.md). This module parses options and prints; slurmpod.runs does the work.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from typing import Any

import click

from slurmpod.cli.output import emit_json, table

_HOST = click.option("--host", help="Over SSH to this host (~/.ssh/config alias or name).")
_REMOTE_ENV = click.option(
    "--remote-env", "remote_env", multiple=True, metavar="NAME=VALUE",
    help="Environment for the Slurm commands (e.g. SLURM_CONF). Repeatable.")
_SINCE_RESOLVE = click.option(
    "--since", "since", default="30d", show_default=True,
    help="How far back a run name is looked up.")


def _connect(host: str | None, remote_env: tuple[str, ...]) -> Any:
    """(runner, backend): where commands run (as `slurmpod submit --host`) and the CLI
    backend over it."""
    from slurmpod import submit as sub  # lazy: start-up
    from slurmpod.backends.cli import CliBackend  # lazy: start-up
    from slurmpod.cli.submit import _pairs, _runner  # lazy: start-up

    runner = _runner(host)
    if remote_env:
        runner = sub.EnvRunner(runner, _pairs(remote_env, "--remote-env"))
    return runner, CliBackend(runner)


@click.command("runs")
@click.option("--since", default="7d", show_default=True,
              help="Runs active now or that ran within this window: 7d, 12h, 2w, 30m.")
@click.option("--all-users", is_flag=True, help="Every user's runs (as sacct --allusers "
                                                "shows them to you).")
@_HOST
@_REMOTE_ENV
@click.option("--json", "as_json", is_flag=True, help="Print a JSON list, one object per run.")
def runs(since: str, all_users: bool, host: str | None, remote_env: tuple[str, ...],
         as_json: bool) -> None:
    """Your slurmpod runs: state, attempt, why the last attempt ended, progress, MFU, ETA."""
    from slurmpod.runs.ops import list_runs, parse_window  # lazy: start-up
    from slurmpod.runs.view import HEADERS  # lazy: start-up

    window = parse_window(since)
    runner, backend = _connect(host, remote_env)
    try:
        views = list_runs(backend, runner, window_s=window, all_users=all_users)
    finally:
        runner.close()
    if as_json:

        emit_json([v.to_json() for v in views])
        return
    if not views:
        click.echo(f"no slurmpod runs in the last {since} on {runner.where}", err=True)
        return

    click.echo(table(HEADERS, [v.row() for v in views]))
    faults = [line for v in views for line in v.fault_lines()]
    if faults:
        click.echo("\nfaults (hangs, failed steps, nodes shed with their evidence):")
        for line in faults:
            click.echo(f"  {line}")


@click.command("logs")
@click.argument("run")
@click.option("-f", "--follow", is_flag=True, help="Keep printing as the log grows, until the "
                                                   "job has ended.")
@click.option("--attempt", type=click.IntRange(1), help="Only attempt N's lines.")
@click.option("--rank", type=click.IntRange(0), help="Only rank R's lines (`R: ` prefixes of "
                                                     "srun --label).")
@_SINCE_RESOLVE
@_HOST
@_REMOTE_ENV
def logs(run: str, follow: bool, attempt: int | None, rank: int | None, since: str,
         host: str | None, remote_env: tuple[str, ...]) -> None:
    """Print RUN's main log (a job id or a run name), or one attempt of it."""
    from slurmpod.runs import ops  # lazy: start-up
    from slurmpod.runs.view import log_path  # lazy: start-up

    window = ops.parse_window(since)
    runner, backend = _connect(host, remote_env)
    out = sys.stdout.buffer
    try:
        job = ops.resolve(backend, run, window_s=window)
        ops.need_work_dir(job)
        path = log_path(job)
        start, end = 0, None
        if attempt is not None:
            att = ops.pick_attempt(ops.load_attempts(runner, job.work_dir), job, attempt)
            start, end = att.log_offset or 0, att.log_end
        if follow:
            chunks = ops.Follow(runner, path, _checker(backend, runner, job, attempt)
                                ).stream(start, end)
        else:
            chunks = ops.read_range(runner, path, start, end)
        _write(out, chunks, None if rank is None else ops.RankFilter(rank))
    finally:
        runner.close()


def _checker(backend: Any, runner: Any, job: Any, attempt: int | None
             ) -> Callable[[], tuple[bool, int | None]]:
    from slurmpod.runs import ops  # lazy: start-up

    def check() -> tuple[bool, int | None]:
        st = backend.status([job.job_id]).get(job.job_id)
        ended = st is None or st.state.is_terminal
        end = None
        if attempt is not None:  # a later attempt may have started: stop at its offset
            att = ops.load_attempts(runner, job.work_dir).find(job.job_id, attempt)
            end = att.log_end if att is not None else None
        return ended, end

    return check


def _write(out: Any, chunks: Iterator[bytes], rank_filter: Any) -> None:
    try:
        for chunk in chunks:
            data = rank_filter.feed(chunk) if rank_filter is not None else chunk
            if data:
                out.write(data)
                out.flush()
        if rank_filter is not None:
            out.write(rank_filter.flush())
        out.flush()
    except BrokenPipeError:  # `slurmpod logs RUN | head`: the reader left, that is fine
        return


@click.command("cancel")
@click.argument("run")
@click.option("--save", is_flag=True, help="Let the trainer save a checkpoint first: SIGTERM "
                                           "to the steps, then the job cancels itself.")
@_SINCE_RESOLVE
@_HOST
@_REMOTE_ENV
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document.")
def cancel(run: str, save: bool, since: str, host: str | None, remote_env: tuple[str, ...],
           as_json: bool) -> None:
    """Cancel RUN (a job id or a run name); --save checkpoints before it stops."""
    from slurmpod.runs import ops  # lazy: start-up

    window = ops.parse_window(since)
    runner, backend = _connect(host, remote_env)
    try:
        job = ops.resolve(backend, run, window_s=window)
        res = ops.cancel_run(backend, runner, job, save=save)
    finally:
        runner.close()
    if as_json:

        emit_json(res.to_json())
        return
    if save and not res.save:
        click.echo(f"job {res.job_id} is {res.state_before}: no trainer is running, so there "
                   "is nothing to save", err=True)
    click.echo(res.message())

