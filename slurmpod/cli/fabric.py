"""`slurmpod topo check`, `topo discover` and `topo synth`: the fabric against the plan, a draft
site from the fabric, and the fabric a plan implies. Registered lazily by slurmpod.cli.topo
(attributes `check`, `discover`, `synth`).

Exit codes of `check`: 0 clean, 1 findings, 3 bad input (site file or ibnetdiscover file).
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import click

from slurmpod.cli.fabric_health import HealthOpts, add_health, finish, health_options, lldp_report
from slurmpod.cli.output import emit_json
from slurmpod.errors import ConfigError, UsageError
from slurmpod.fabric.ibnetdiscover import merge, parse, parse_file
from slurmpod.fabric.synth import (
    DESC_FORMS,
    DescForm,
    Fault,
    FaultKind,
    UplinkLayout,
    synthesize_planes,
)

if TYPE_CHECKING:
    from slurmpod.fabric.check import CheckReport
    from slurmpod.fabric.ibnetdiscover import Fabric
    from slurmpod.model.site import Site

_FILTER_HELP = ("Regex over a CA's node description 'HOST DEVICE'; matching HCAs are kept apart "
                "from the compute fabric (storage/management). Repeatable.")


@click.command()
@click.argument("site")
@click.option("--ibnetdiscover", "fabric_files", multiple=True,
              type=click.Path(path_type=Path, dir_okay=False, allow_dash=True),
              help="Saved output of `ibnetdiscover` (run on any host of the fabric); - reads "
              "standard input. Repeat it for each subnet (per-rail planes): the dumps are "
              "merged. Default: the site's fabric.ibnetdiscover files.")
@click.option("--hca-filter", "filters", multiple=True, metavar="REGEX", help=_FILTER_HELP)
@click.option("--nvlink", "nvlink_path", type=click.Path(path_type=Path), default=None,
              help="`nvidia-smi -q` captured per node (a directory of <host>.txt files, or one "
              "pdsh/clush 'host: line' file): check NVLink domains and cliques against the "
              "site's racks (GB200/GB300 NVL72). Alone, or with the IB check.")
@click.option("--limit", type=click.IntRange(min=0), default=50, show_default=True,
              help="Print at most this many findings (0: all); --json always has all.")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@health_options
@click.pass_context
def check(ctx: click.Context, site: str, fabric_files: tuple[Path, ...],
          filters: tuple[str, ...], nvlink_path: Path | None, limit: int,
          as_json: bool, **health: Any) -> None:
    """Check the real fabric (ibnetdiscover output) against SITE's cabling plan.

    One finding per problem, each with its fix: HCAs on the wrong rail leaf or another SU's
    leaf (crossed pairs become one "swap the cables" finding), missing or down links,
    degraded speed/width, unknown nodes/HCAs/switches. Storage and management HCAs are kept
    apart. Exit 0 when clean, 1 with findings, 3 on bad input.
    """
    from slurmpod.config import load_site, resolve_site_path  # lazy: start-up
    from slurmpod.fabric.check import check_fabric, compile_filters  # lazy: start-up
    from slurmpod.topology.fabric_plan import plan_fabric  # lazy: start-up

    rules = compile_filters(filters)
    path = resolve_site_path(site)
    site_obj = load_site(path)
    try:
        plan = plan_fabric(site_obj)
    except ValueError as exc:
        raise ConfigError(str(exc), file=str(path)) from None
    opts = HealthOpts.from_kwargs(health)
    if opts.lldp_paths:
        report = lldp_report(site_obj, plan, rules, opts, fabric_files)
        ctx.exit(finish(report, opts, site_obj, as_json, limit, _print_report))
    if nvlink_path is not None and not fabric_files and not site_obj.fabric.ibnetdiscover:
        ctx.exit(_nvlink_only(site_obj, nvlink_path, limit, as_json))
    if not fabric_files:
        fabric_files = tuple(path.parent / f for f in site_obj.fabric.ibnetdiscover)
        if not fabric_files:
            raise UsageError("no fabric to check: give --ibnetdiscover FILE (one per subnet), "
                             "or list the files in the site's fabric.ibnetdiscover")
    fabric = _read_fabrics(fabric_files)
    report = check_fabric(site_obj, plan, fabric, rules)
    add_health(site_obj, plan, fabric, report, opts)
    if nvlink_path is not None:  # merged, so --drain and --json cover the NVLink findings too
        from slurmpod.fabric.nvlink import merge_nvlink  # lazy: start-up

        merge_nvlink(site_obj, nvlink_path, report)
    ctx.exit(finish(report, opts, site_obj, as_json, limit, _print_report))


def _nvlink_only(site: Site, path: Path, limit: int, as_json: bool) -> int:
    """`topo check --nvlink` without an IB dump: the NVLink check alone, printed; the exit
    status (0 clean, 1 findings)."""
    from slurmpod.fabric.nvlink import check_nvlink, read_nvlink_input  # lazy: start-up

    report = check_nvlink(site, read_nvlink_input(path), str(path))
    if as_json:
        emit_json(report.to_dict())
        return 0 if report.clean else 1
    st = report.stats
    click.echo(f"NVLink check: site {report.site} against {path}")
    click.echo(f"  NVLink: nodes {st['nodes_seen']}/{st['nodes_planned']} seen, GPUs "
               f"{st['gpus_ready']}/{st['gpus_seen']} joined the fabric, domains "
               f"{st['domains_seen']}/{st['domains_planned']} seen")
    if report.clean:
        click.echo("clean: the NVLink domains match the site's racks")
        return 0
    _print_findings(report, limit)
    return 1


def _print_findings(report: CheckReport, limit: int) -> None:
    """The findings with their fixes, at most `limit` (0: all)."""
    counts = ", ".join(f"{k} {v}" for k, v in report.counts().items())
    click.echo(f"{len(report.findings)} findings ({counts}):")
    shown = report.findings if limit == 0 else report.findings[:limit]
    for f in shown:
        click.echo(f"{f.severity.upper():7} {f.kind}: {f.message}")
        click.echo(f"        fix: {f.fix}")
    if len(shown) < len(report.findings):
        click.echo(f"... and {len(report.findings) - len(shown)} more (--limit 0 or --json for "
                   "all)")


def _print_report(report: CheckReport, limit: int) -> None:
    st = report.stats
    click.echo(f"fabric check: site {report.site} against {report.source}")
    click.echo(f"  HCA links {st['hca_links_seen']}/{st['hca_links_planned']} seen, switches "
               f"{st['switches_seen']} in the fabric / {st['switches_planned']} planned, "
               f"{st['switch_links_planned']} switch links planned, {st['kept_apart']} kept apart")
    if st["leaves_mixing_rails"]:
        click.echo(f"  SHARP rail invariant broken on {st['leaves_mixing_rails']} leaves (a leaf "
                   "must connect the same HCA rail of every server)")
    if "nvlink_nodes_seen" in st:
        click.echo(f"  NVLink: nodes {st['nvlink_nodes_seen']}/{st['nvlink_nodes_planned']} "
                   f"seen, GPUs {st['nvlink_gpus_ready']}/{st['nvlink_gpus_seen']} joined the "
                   f"fabric, domains {st['nvlink_domains_seen']}/{st['nvlink_domains_planned']} "
                   "seen")
    for note in report.notes:
        click.echo(f"  note: {note}")
    if report.clean:
        click.echo("clean: the fabric matches the plan")
        return
    _print_findings(report, limit)


@click.command()
@click.option("--ibnetdiscover", "fabric_files", required=True, multiple=True,
              type=click.Path(path_type=Path, dir_okay=False, allow_dash=True),
              help="Saved output of `ibnetdiscover`; - reads standard input. Repeat it for "
              "each subnet: the dumps are merged.")
@click.option("--hca-filter", "filters", multiple=True, metavar="REGEX", help=_FILTER_HELP)
@click.option("-o", "--out", "out_dir", required=True, type=click.Path(path_type=Path),
              help="Directory for the draft site file and the generated artefacts.")
@click.option("--name", "site_name", default=None, help="Site name for the draft (default: "
              "the output directory's name).")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON summary.")
def discover(fabric_files: tuple[Path, ...], filters: tuple[str, ...], out_dir: Path,
             site_name: str | None, as_json: bool) -> None:
    """Derive the node -> leaf -> spine tree from ibnetdiscover output (rail leaves that see the
    same nodes merge into one SU) and write a draft site.toml plus the `topo generate`
    artefacts into OUT."""
    from slurmpod.fabric.check import compile_filters  # lazy: start-up
    from slurmpod.fabric.discover import discover_site, draft_site_toml  # lazy: start-up

    if out_dir.exists() and not out_dir.is_dir():
        raise UsageError(f"-o {out_dir}: exists and is not a directory")
    rules = compile_filters(filters)
    fabric = _read_fabrics(fabric_files)
    name = site_name or _site_name(out_dir)
    found = discover_site(fabric, rules)
    text = draft_site_toml(found, name, source=", ".join(map(str, fabric_files)))
    files, site_obj = _validated_artifacts(text, out_dir / "site.toml")
    from slurmpod.fsutil import write_tree_atomic  # lazy: start-up

    try:
        written = write_tree_atomic(out_dir, {"site.toml": text, **files})
    except OSError as exc:
        from slurmpod.fsutil import output_error  # lazy: start-up

        raise output_error(out_dir, exc) from None
    summary = found.summary()
    summary.update({"site": site_obj.site.name, "out_dir": str(out_dir),
                    "files": [str(p) for p in written]})
    if as_json:

        emit_json(summary)
        return
    click.echo(f"discovered {summary['nodes']} nodes in {summary['sus']} SUs, "
               f"{summary['rails']} rails, {summary['leaves']} leaves, {summary['spines']} spines,"
               f" {summary['cores']} cores; {summary['kept_apart']} HCAs kept apart")
    for w in found.warnings:
        click.echo(f"slurmpod: warning: {w}", err=True)
    for p in written:
        click.echo(f"wrote {p}")
    inputs = " ".join(f"--ibnetdiscover {f}" for f in fabric_files)
    click.echo(f"review {out_dir / 'site.toml'} (hardware fields are placeholders), then run "
               f"`slurmpod topo check {out_dir / 'site.toml'} {inputs}`")


def _read_fabrics(paths: tuple[Path, ...]) -> Fabric:
    """Every file read (a missing one is an error, never skipped), merged into one fabric."""

    if sum(str(p) == "-" for p in paths) > 1:
        raise UsageError("--ibnetdiscover -: standard input can be read once")
    seen: set[str] = set()
    unique = []
    for p in paths:
        key = str(p) if str(p) == "-" else str(p.resolve())
        if key not in seen:  # the same file twice adds nothing
            seen.add(key)
            unique.append(p)
    return merge([_read_fabric(p) for p in unique])


def _read_fabric(path: Path) -> Fabric:

    if str(path) == "-":
        try:
            return parse(sys.stdin.read(), "<stdin>")
        except UnicodeDecodeError:
            raise ConfigError("not text (binary data?); expected ibnetdiscover output",
                              file="<stdin>") from None
    return parse_file(path)


def _site_name(out_dir: Path) -> str:

    name = re.sub(r"[^A-Za-z0-9_.-]", "-", out_dir.resolve().name) or "discovered"
    return name if name[0].isalpha() else f"site-{name}"


def _validated_artifacts(text: str, where: Path) -> tuple[dict[str, str], Site]:
    """Validate the draft like `config.load_site` would, then generate the artefacts."""
    import tomllib  # lazy: start-up

    from slurmpod.config import validate  # lazy: start-up
    from slurmpod.model.site import Site  # lazy: start-up
    from slurmpod.topology.generate import generate  # lazy: start-up

    site_obj = validate(Site, tomllib.loads(text), str(where))
    try:
        _ = site_obj.inventory
        return generate(site_obj), site_obj
    except ValueError as exc:
        raise ConfigError(f"the draft site does not validate: {exc}", file=str(where),
                          hint="please report this with the ibnetdiscover file") from None


# `topo synth` faults (slurmpod/fabric/synth.py says what each does): option, metavar, help.
_FAULTS = (
    ("swap", "A,B", "Exchange the far ends of two cables (a crossed pair)."),
    ("missing", "EP", "Remove the cable at an endpoint (a down link)."),
    ("slow", "EP[=RATE]", "Set a link's rate (e.g. 4xHDR)."),
    ("move", "NODE=SU", "Re-cable a node's compute HCAs into another SU's rail leaves."),
    ("unknown-node", "HOST", "Plug a host that is not in the site into a free leaf port."),
    ("unset", "NODE", "Give a node's HCAs the driver's default description."),
    ("rename", "NODE:HCA=NAME", "Change one HCA's device name."),
)


def _fault_options(f: Any) -> Any:
    for kind, meta, text in reversed(_FAULTS):
        f = click.option(f"--{kind}", kind.replace("-", "_"), multiple=True, metavar=meta,
                         help=text + " Repeatable.")(f)
    return f


@click.command()
@click.argument("site")
@click.option("-o", "--output", required=True, help="File to write ('-' for stdout).")
@_fault_options
@click.option("--storage", is_flag=True, help="Add the storage/management HCAs.")
@click.option("--desc", type=click.Choice(DESC_FORMS), default="mlx5", show_default=True,
              help="Node description form of every host's HCAs.")
@click.option("--uplinks", type=click.Choice(("plan", "cage", "shuffle")), default="plan",
              show_default=True, help="Uplink ports: as planned, a cage per spine, or random.")
@click.option("--planes", is_flag=True, help="One file per subnet: OUTPUT.0, OUTPUT.1, ...")
def synth(site: str, output: str, storage: bool, desc: str, uplinks: str, planes: bool,
          **faults: tuple[str, ...]) -> None:
    """Write the ibnetdiscover output a site's fabric plan implies, with optional faults.

    An endpoint (EP) is NODE:HCA (a node's verbs device) or SWITCH:PORT (a planned switch
    port). For rehearsing `slurmpod topo check` before the cables are in."""

    from slurmpod.config import load_site, resolve_site_path  # lazy: start-up
    from slurmpod.fsutil import output_error, write_atomic  # lazy: start-up

    loaded = load_site(resolve_site_path(site))
    wanted = [Fault(cast(FaultKind, kind), spec) for kind, _, _ in _FAULTS
              for spec in faults[kind.replace("-", "_")]]
    texts = synthesize_planes(loaded, faults=wanted, storage=storage, desc=cast(DescForm, desc),
                              uplinks=cast(UplinkLayout, uplinks), planes=planes)
    if output == "-":
        sys.stdout.write("".join(texts))
        return
    targets = [Path(output)] if not planes else [Path(f"{output}.{i}") for i in range(len(texts))]
    for path, text in zip(targets, texts, strict=True):
        try:
            write_atomic(path, text)
        except OSError as exc:
            raise output_error(path, exc) from None
