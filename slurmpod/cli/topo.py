"""`slurmpod topo`: generate and show a site's topology artefacts; `check`/`discover`/`synth` are
lazy.

`check`, `discover` and `synth` live in slurmpod.cli.fabric (the fabric checker) and are imported
only when invoked, so `topo generate` never pays for them and works without them.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

import click

from slurmpod.cli.output import emit_json, table
from slurmpod.errors import ConfigError, SlurmpodError, UsageError
from slurmpod.topology.summary import summarize

_LAZY = {
    "check": "Check the real fabric (ibnetdiscover output) against the site's cabling plan.",
    "discover": "Draft a site file (and its artefacts) from ibnetdiscover output.",
    "synth": "Write the ibnetdiscover output a site's fabric plan implies, with faults.",
}


class _TopoGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *_LAZY})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        cmd = super().get_command(ctx, cmd_name)
        if cmd is not None or cmd_name not in _LAZY:
            return cmd
        try:
            module = importlib.import_module("slurmpod.cli.fabric")
        except ModuleNotFoundError as exc:
            if exc.name != "slurmpod.cli.fabric":
                raise
            return _unavailable(cmd_name)
        found = getattr(module, cmd_name, None)
        return found if isinstance(found, click.Command) else _unavailable(cmd_name)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows = [(name, _LAZY.get(name) or self.commands[name].get_short_help_str())
                for name in self.list_commands(ctx)]
        with formatter.section("Commands"):
            formatter.write_dl(rows)


def _unavailable(name: str) -> click.Command:
    @click.command(name=name, help=_LAZY[name],
                   context_settings={"ignore_unknown_options": True, "allow_extra_args": True})
    def _cmd() -> None:
        raise SlurmpodError(f"`slurmpod topo {name}` is not available in this build")

    return _cmd


@click.group(cls=_TopoGroup)
def topo() -> None:
    """Generate, show and check site topology artefacts."""


def _load(site: str) -> tuple[Path, Any]:
    from slurmpod.config import load_site, resolve_site_path  # lazy: start-up

    path = resolve_site_path(site)
    return path, load_site(path)


def _with_file(exc: ConfigError, path: Path) -> ConfigError:
    """A ConfigError raised without a file (from the generator) gets the site file's name."""
    if exc.file is not None:
        return exc
    raw = exc.message
    if exc.key and raw.startswith(f"{exc.key}: "):
        raw = raw[len(exc.key) + 2:]
    return ConfigError(raw, file=str(path), key=exc.key, hint=exc.hint)


@topo.command()
@click.argument("site")
@click.option("-o", "--out", "out_dir", required=True, type=click.Path(path_type=Path),
              help="Directory to write the artefacts into (created if missing).")
@click.option("--slurm-version", default=None, help="Target this Slurm (YY.MM) instead of the "
              "site's slurm.version, e.g. the installed 22.05.")
@click.option("--gres-file-prefix", default=None,
              help="Replace the GPU device path in gres.conf File= (e.g. /state/dev/nvidia).")
@click.option("--localhost-base-port", type=int, default=None,
              help="Single-host sandbox: NodeHostname=localhost and one slurmd port per node.")
@click.option("--imex-hosts", type=click.Path(path_type=Path, dir_okay=False), default=None,
              help="hosts(5) file (ADDRESS NAME...): imex/<domain>/nodes_config.cfg lists the "
              "nodes' addresses instead of their names.")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON summary.")
def generate(site: str, out_dir: Path, slurm_version: str | None, gres_file_prefix: str | None,
             localhost_base_port: int | None, imex_hosts: Path | None, as_json: bool) -> None:
    """Write topology.conf, block topology, gres.conf, nodes.conf, rails/cabling CSV and NCCL XML
    for SITE (a site file, or a built-in site name) into OUT, all or nothing."""
    # lazy: start-up
    # lazy: start-up
    from slurmpod.topology.generate import (
        GenerateOptions,
        generation_warnings,
        target_version,
        topology_file_to_install,
        topology_plugin,
    )
    from slurmpod.topology.generate import generate as gen  # lazy: start-up

    if out_dir.exists() and not out_dir.is_dir():
        raise UsageError(f"-o {out_dir}: exists and is not a directory")
    path, site_obj = _load(site)
    hosts = None
    if imex_hosts is not None:
        from slurmpod.topology.generate import read_hosts_file  # lazy: start-up

        try:
            hosts = read_hosts_file(str(imex_hosts), imex_hosts.read_text())
        except OSError as exc:
            raise UsageError(f"--imex-hosts {imex_hosts}: {exc.strerror or exc}") from None
    opts = GenerateOptions(slurm_version=slurm_version, gres_file_prefix=gres_file_prefix,
                           localhost_base_port=localhost_base_port, imex_hosts=hosts)
    try:
        files = gen(site_obj, opts)
        version = target_version(site_obj, opts)
        plugin = topology_plugin(site_obj, version)
        install = topology_file_to_install(site_obj, opts)
    except ConfigError as exc:
        raise _with_file(exc, path) from None
    from slurmpod.fsutil import write_tree_atomic  # lazy: start-up

    try:
        written = write_tree_atomic(out_dir, files)
    except OSError as exc:
        from slurmpod.fsutil import output_error  # lazy: start-up

        raise output_error(out_dir, exc) from None
    warnings = generation_warnings(site_obj, opts)
    report = {
        "site": site_obj.site.name,
        "site_file": str(path),
        "out_dir": str(out_dir),
        "slurm_version": f"{version[0]}.{version[1]:02d}",
        "topology_plugin": plugin,
        "install_as_topology_conf": install if install != "topology.yaml" else None,
        "install_topology_yaml": install == "topology.yaml",
        "files": [{"path": rel, "bytes": len(files[rel].encode()),
                   "lines": files[rel].count("\n")} for rel in files],
        "warnings": warnings,
    }
    if as_json:

        emit_json(report)
        return
    for p, rel in zip(written, files, strict=True):
        click.echo(f"wrote {p}  ({files[rel].count(chr(10))} lines)")
    target = "topology.yaml" if install == "topology.yaml" else "topology.conf"
    what = install if install == target else f"{install} as {target}"
    click.echo(f"Slurm {report['slurm_version']}: TopologyPlugin=topology/{plugin}; install "
               f"{what} next to slurm.conf, and `Include nodes.conf`.")
    for w in warnings:
        click.echo(f"slurmpod: warning: {w}", err=True)


@topo.command()
@click.argument("site")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def show(site: str, as_json: bool) -> None:
    """Summarise SITE: nodes, GPUs, racks, SUs, rails, switches, bandwidth, per-SU table."""
    from slurmpod.topology.fabric_plan import plan_fabric  # lazy: start-up
    from slurmpod.topology.generate import topology_plugin  # lazy: start-up

    path, site_obj = _load(site)
    try:
        plugin = topology_plugin(site_obj, site_obj.slurm.version_tuple)
        data = summarize(site_obj, plan_fabric(site_obj), plugin)
    except ConfigError as exc:
        raise _with_file(exc, path) from None
    except ValueError as exc:
        head, sep, rest = str(exc).partition(": ")
        raise ConfigError(rest if sep else str(exc), file=str(path),
                          key=head if sep else None) from None
    if as_json:

        emit_json(data)
        return

    f = data["fabric"]
    click.echo(f"site {data['site']}: {data['description']}".rstrip(": "))
    click.echo(f"  nodes {data['nodes']}, GPUs {data['gpus']} "
               f"({data['peak_pflops_bf16']} PFLOP/s dense BF16 peak), racks {data['racks']}, "
               f"SUs {data['sus']}"
               + (f", NVLink domains {data['nvlink_domains']}" if data["nvlink_domains"] else ""))
    rails = f"{f['rails']} rails" if f["rail_optimised"] else "not rail-optimised"
    click.echo(f"  fabric {f['kind']} {f['link_gbps']} Gb/s, {rails}, "
               f"SHARP {'yes' if f['sharp'] else 'no'}, {f['tiers']} tier(s), "
               f"spine groups {f['spine_groups']}")
    click.echo(f"  switches: {f['leaves']} leaves, {f['spines']} spines, {f['cores']} cores; "
               f"leaf ports {f['leaf_downlinks']} down / {f['leaf_uplinks']} up; "
               f"{f['cables']} cables")
    click.echo(f"  injection {f['injection_gbps'] / 1000:g} Tb/s, bisection "
               f"{f['bisection_gbps'] / 1000:g} Tb/s, oversubscription {f['oversubscription']:g}:1")
    click.echo(f"  Slurm {data['slurm_version']}: topology/{data['topology_plugin']}")
    cols = [k for k in ("su", "node_type", "nodes", "gpus", "racks", "leaves", "nvlink_domains",
                        "hosts") if data["per_su"] and k in data["per_su"][0]]
    click.echo(table(cols, [[row[c] for c in cols] for row in data["per_su"]]))
