"""`topo check` options beyond the cabling: `--lldp` (RoCE), `--counters`/`--threshold`
(port error counters), `--sharp` (aggregation nodes) and `--drain`/`--apply`. Kept apart from
cli/fabric.py, which applies `health_options` and calls the three functions below."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from slurmpod.cli.output import emit_json
from slurmpod.errors import UsageError
from slurmpod.fabric.drain import apply, drains

if TYPE_CHECKING:
    import re

    from slurmpod.fabric.check import CheckReport
    from slurmpod.fabric.ibnetdiscover import Fabric
    from slurmpod.model.site import Site
    from slurmpod.topology.fabric_plan import FabricPlan

_PATH = click.Path(path_type=Path)


def health_options(f: Callable[..., Any]) -> Callable[..., Any]:
    opts = [
        click.option("--lldp", "lldp_paths", multiple=True, type=_PATH, metavar="PATH",
                     help="RoCE: `lldpcli -f json show neighbors` from the nodes (a directory "
                     "of HOST.json files, one HOST.json, pdsh/clush 'host: ' output, or a JSON "
                     "object host -> output); checks each rail NIC's leaf and port instead of "
                     "--ibnetdiscover. Repeatable."),
        click.option("--counters", "counter_files", multiple=True, type=_PATH, metavar="FILE",
                     help="`ibqueryerrors [-r]` or `perfquery LID PORT` output: report cables "
                     "whose error counters exceed their thresholds. Repeatable."),
        click.option("--threshold", "threshold_items", multiple=True, metavar="COUNTER=N",
                     help="Override one threshold, e.g. SymbolErrorCounter=100. Repeatable."),
        click.option("--threshold-file", "threshold_files", multiple=True, type=_PATH,
                     metavar="FILE", help="Thresholds in infiniband-diags' error_thresholds "
                     "format (COUNTER=N lines)."),
        click.option("--sharp", "sharp", is_flag=True,
                     help="Check that every switch shows its SHARP aggregation node (sites "
                     "with fabric.sharp = true)."),
        click.option("--drain", "drain", is_flag=True,
                     help="Print `scontrol update NodeName=... State=DRAIN Reason=...` for the "
                     "nodes a finding makes unfit for jobs."),
        click.option("--apply", "apply_drain", is_flag=True,
                     help="With --drain: run those scontrol commands."),
    ]
    for opt in reversed(opts):
        f = opt(f)
    return f


@dataclass(frozen=True)
class HealthOpts:
    lldp_paths: tuple[Path, ...] = ()
    counter_files: tuple[Path, ...] = ()
    threshold_items: tuple[str, ...] = ()
    threshold_files: tuple[Path, ...] = ()
    sharp: bool = False
    drain: bool = False
    apply_drain: bool = False

    @classmethod
    def from_kwargs(cls, kw: dict[str, Any]) -> HealthOpts:
        opts = cls(**kw)
        if opts.apply_drain and not opts.drain:
            raise UsageError("--apply runs the --drain commands: give --drain as well")
        if opts.lldp_paths and (opts.counter_files or opts.sharp):
            raise UsageError("--counters and --sharp read an InfiniBand fabric; --lldp checks a "
                             "RoCE one: run them separately")
        return opts


def lldp_report(site: Site, plan: FabricPlan, rules: list[re.Pattern[str]], opts: HealthOpts,
                fabric_files: tuple[Path, ...]) -> CheckReport:
    """`topo check --lldp`: the RoCE check in place of the ibnetdiscover one."""
    from slurmpod.fabric.lldp import check_lldp, read_lldp  # lazy: start-up

    if fabric_files:
        raise UsageError("--lldp checks a RoCE fabric from the nodes' LLDP data and "
                         "--ibnetdiscover an InfiniBand one: give one of them")
    report = check_lldp(site, plan, read_lldp(opts.lldp_paths), rules)
    if site.fabric.kind != "roce":
        report.notes.append(f"the site's fabric.kind is {site.fabric.kind!r}: LLDP describes "
                            "its Ethernet NICs")
    return report


def add_health(site: Site, plan: FabricPlan, fabric: Fabric, report: CheckReport,
               opts: HealthOpts) -> None:
    """Counter and SHARP findings added to the cabling report."""
    if opts.counter_files:
        # lazy: start-up
        # lazy: start-up
        from slurmpod.fabric.counters import check_counters, read_counters, thresholds

        limits = thresholds(opts.threshold_items, opts.threshold_files)
        records, source = read_counters(opts.counter_files)
        found, notes = check_counters(records, fabric, limits, plan)
        report.findings.extend(found)
        report.notes.extend(notes)
        report.stats["counter_ports"] = len(records)
        report.source = f"{report.source} + {source}"
    elif opts.threshold_items or opts.threshold_files:
        raise UsageError("--threshold applies to --counters: give the counters file too")
    if opts.sharp:
        if not site.fabric.sharp:
            raise UsageError("--sharp: the site sets fabric.sharp = false; nothing to check")
        from slurmpod.fabric.counters import apart_switch_ids, check_sharp  # lazy: start-up

        report.findings.extend(check_sharp(fabric, apart_switch_ids(report.kept_apart)))
    report.stats["findings"] = len(report.findings)


def finish(report: CheckReport, opts: HealthOpts, site: Site, as_json: bool, limit: int,
           print_report: Callable[[CheckReport, int], None]) -> int:
    """Print the report (and the drain commands), run them with --apply; the exit status:
    0 clean, 1 findings, 4 when an scontrol failed."""

    plan = drains(report.findings, site.inventory.by_name) if opts.drain else []
    results = []
    if opts.apply_drain and plan:
        from slurmpod.transport.local import LocalRunner  # lazy: start-up

        results = apply(plan, LocalRunner())
    if as_json:

        doc = report.to_dict()
        if opts.drain:
            errs = {d.node: e for d, e in results}
            doc["drain"] = [{"node": d.node, "reason": d.reason, "command": d.command,
                             **({"applied": errs[d.node] is None, "error": errs[d.node]}
                                if d.node in errs else {})} for d in plan]
        emit_json(doc)
    else:
        print_report(report, limit)
        if opts.drain and not plan:
            click.echo("drain: no node to drain")
        elif opts.drain and not opts.apply_drain:
            click.echo(f"drain {len(plan)} node(s): review, then run these (or rerun with "
                       "--apply):")
            for d in plan:
                click.echo(d.command)
        for d, err in results:
            if err is None:
                click.echo(f"drained {d.node}")
            else:
                click.echo(f"slurmpod: error: {d.command}: {err}", err=True)
    if any(err is not None for _d, err in results):
        return 4
    return 0 if report.clean else 1
