"""`slurmpod sandbox up|status|env|down`: a real Slurm on this machine, for trying and testing."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import click

from slurmpod.cli.output import emit_json
from slurmpod.render.env import shquote

if TYPE_CHECKING:
    from slurmpod.sandbox.cluster import Sandbox

_F = TypeVar("_F", bound=Callable[..., Any])

STATE_HELP = "State directory of the sandbox [default: $SLURMPOD_SANDBOX or ./.sandbox]."


def _state_option(f: _F) -> _F:
    return click.option("--state", "state_dir", type=click.Path(file_okay=False, path_type=Path),
                        default=None, help=STATE_HELP)(f)


def _sandbox(state_dir: Path | None, site: str | None = None, **kw: Any) -> Sandbox:
    from slurmpod.sandbox.cluster import Sandbox, default_state_dir  # lazy: start-up

    return Sandbox(state_dir or default_state_dir(), site, **kw)


@click.group()
def sandbox() -> None:
    """Run a real Slurm (munge, MariaDB, slurmdbd, slurmctld, one slurmd per node) on this
    machine, on 127.0.0.1, with everything under one state directory."""


@sandbox.command()
@click.argument("site", required=False)
@_state_option
@click.option("--base-port", type=click.IntRange(1, 65535), default=None,
              help="First TCP port (slurmd of node 1; then one per node, slurmctld, slurmdbd, "
                   "MariaDB). Default: a free block picked at random.")
@click.option("--no-accounting", is_flag=True,
              help="Skip MariaDB and slurmdbd (faster; no sacct).")
@click.option("--timeout", "timeout_s", type=float, default=90.0, show_default=True,
              help="Seconds to wait for all nodes to become idle.")
def up(site: str | None, state_dir: Path | None, base_port: int | None, no_accounting: bool,
       timeout_s: float) -> None:
    """Start the sandbox for SITE (a site file or built-in name; default: sandbox)."""
    sb = _sandbox(state_dir, site, base_port=base_port, accounting=not no_accounting,
                  progress=lambda msg: click.echo(msg, err=True), idle_timeout_s=timeout_s)
    res = sb.up()
    state = shquote(str(sb.state_dir))
    if res.already_running:
        click.echo(f"sandbox already running in {sb.state_dir} ({res.nodes} nodes)")
    else:
        click.echo(f"sandbox up: {res.nodes} nodes idle in {res.elapsed_s:.1f} s "
                   f"(state: {sb.state_dir})")
    click.echo(f'use it:   eval "$(slurmpod sandbox env --state {state})"; sinfo')
    click.echo(f"stop it:  slurmpod sandbox down --state {state}")


@sandbox.command()
@_state_option
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document.")
def status(state_dir: Path | None, as_json: bool) -> None:
    """Show whether the sandbox runs, its daemons, ports and node states."""
    st = _sandbox(state_dir).status()
    if as_json:

        emit_json(st.to_dict())
        return
    click.echo(f"sandbox {st.state_dir}: {st.state}")
    if st.state == "absent":
        return
    alive = sum(p.alive for p in st.processes)
    click.echo(f"  daemons: {alive} of {len(st.processes)} running")
    for p in st.processes:
        if not p.alive:
            click.echo(f"    {p.name} (pid {p.pid}) not running")
    if st.ports:
        click.echo(f"  ports: slurmctld {st.ports.get('slurmctld')}, slurmdbd "
                   f"{st.ports.get('slurmdbd')}, mariadb {st.ports.get('mariadb')}, slurmd from "
                   f"{st.ports.get('slurmd_base')}")
    if st.nodes:
        click.echo("  nodes: " + ", ".join(f"{n} {s}" for s, n in sorted(st.nodes.items())))
    click.echo(f"  SLURM_CONF={st.slurm_conf}")


@sandbox.command()
@_state_option
def env(state_dir: Path | None) -> None:
    """Print `export` lines for the sandbox: eval "$(slurmpod sandbox env)"."""
    from slurmpod.sandbox.cluster import SandboxError  # lazy: start-up

    sb = _sandbox(state_dir)
    if not sb.slurm_conf.exists():
        where = shquote(str(sb.state_dir))
        raise SandboxError(f"no sandbox in {sb.state_dir}",
                           hint=f"start one: slurmpod sandbox up --state {where}")
    for key, value in sb.env().items():
        click.echo(f"export {key}={shquote(value)}")


@sandbox.command()
@_state_option
def down(state_dir: Path | None) -> None:
    """Stop the daemons this sandbox started (only those); keep its files for a warm start."""
    sb = _sandbox(state_dir)
    stopped = sb.down()
    click.echo(f"sandbox {sb.state_dir}: stopped {len(stopped)} daemon(s)" if stopped
               else f"sandbox {sb.state_dir}: nothing running")
