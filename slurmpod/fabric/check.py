"""Compare a parsed fabric with the site's fabric plan: one finding per problem, with its fix.

The invariant behind most findings is SHARP's: on a rail-optimised fabric every leaf connects
the same HCA rail of every server of its SU (HPC-X SHARP builds one aggregation tree per rail,
and a Quantum switch holds few streaming aggregation flows), so one HCA in the wrong leaf breaks
in-network reduction for every job that crosses it. Findings:

* `swapped-cables`  two cables sit in each other's planned ports (fix: swap them)
* `wrong-rail`      an HCA is on the leaf of another rail of its own SU
* `wrong-su`        an HCA is on a leaf of another SU
* `wrong-leaf`      an HCA is on an unplanned switch, a spine, or another rack's leaf
* `wrong-port`      right leaf, wrong port (the cabling plan no longer matches the labels)
* `wrong-uplink`    a leaf/spine uplink lands on another switch or port than planned
* `missing-link`, `node-missing`, `switch-missing`  expected cables that are not there
* `degraded-link`   width x speed below `fabric.link_gbps` (4xNDR = 400, 4xHDR = 200, ...)
* `unknown-node`, `unknown-hca`, `unknown-switch`, `unexpected-link`,
  `duplicate-hca` (two CAs with one `HOST DEVICE` description)
* `unset-description`  a CA with the driver's default (or no) node description: judged by the
  port it sits in, so its cable is still checked; the fix is the description
* `renamed-hca`     an HCA in a planned port names a device its node type does not list
* `storage-on-compute`  a storage/management HCA plugged into a compute leaf

Storage and management HCAs (by the site's HCA `role`, or a `--hca-filter` regex over the CA's
node description `HOST DEVICE`) and switches that carry only such HCAs are kept apart: listed,
never mixed into the compute checks. Pure: site, plan and parsed fabric in, `CheckReport` out.
"""

from __future__ import annotations

import gc
import re
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, NamedTuple, TypedDict

from slurmpod.errors import UsageError
from slurmpod.fabric.ibnetdiscover import Fabric, FabricNode, Port, host_device, speed_name
from slurmpod.fabric.switch_links import Pos, check_switch_links, is_slow

if TYPE_CHECKING:
    from slurmpod.model.site import Site
    from slurmpod.topology.fabric_plan import FabricPlan, NodeLink, Switch


# The stable list of finding kinds (docs/fabric-check.md, "Findings", lists the same): scripts
# may switch on `kind`; a kind is never renamed or reused for something else, only added. Every
# module that reports fabric findings (check, switch_links, and the RoCE/counters/NVLink checks)
# registers its kinds here; tests/unit/fabric/ (forms, counters, nvlink) hold the docs to this list.
FINDING_KINDS: dict[str, str] = {
    "swapped-cables": "two cables sit in each other's planned ports",
    "wrong-rail": "an HCA is on the leaf of another rail of its own SU",
    "wrong-su": "an HCA (or all of a node's HCAs) is on a leaf of another SU",
    "wrong-leaf": "an HCA is on a spine, an unplanned switch, or another rack's leaf",
    "wrong-port": "right switch, wrong port",
    "wrong-uplink": "a leaf has too few links to one spine of its group and too many to another",
    "missing-link": "a planned cable is not there (or its port is down)",
    "node-missing": "none of a node's compute HCAs is in the fabric",
    "switch-missing": "a planned switch is not in the fabric",
    "degraded-link": "width x speed below fabric.link_gbps",
    "unknown-node": "a host not in the site file is cabled into the compute fabric",
    "unknown-hca": "a known host has an HCA its node type does not list",
    "renamed-hca": "an HCA in a planned port names a device the node type does not list",
    "unknown-switch": "a switch in the compute fabric that the plan does not have",
    "unset-description": "a CA still has the driver's default node description",
    "unexpected-link": "a switch-to-switch cable the plan does not have",
    "duplicate-hca": "two CAs report the same HOST DEVICE",
    "storage-on-compute": "a storage/management HCA is plugged into a compute leaf",
}

# Keys of `Finding.location()`, always all present in --json (null where they do not apply).
LOCATION_KEYS = ("node", "hca", "guid", "rail", "switch", "port", "cage", "cable")


@dataclass(frozen=True, slots=True)
class Finding:
    """One problem and its fix. `subject` is the human-readable place; the location fields say
    the same for scripts: `node`/`hca` (host and verbs device), `guid` (the CA's or switch's node
    GUID, 16 hex digits), `rail`, `switch`/`port`/`cage` (the switch end: front-panel port and,
    on twin-port OSFP switches, its cage), `cable` (both ends, `A <-> B`)."""

    kind: str
    severity: str  # "error" | "warning"
    subject: str
    message: str
    fix: str
    node: str | None = None
    hca: str | None = None
    guid: str | None = None
    rail: int | None = None
    switch: str | None = None
    port: int | None = None
    cage: int | None = None
    cable: str | None = None

    def location(self) -> dict[str, str | int | None]:
        return {k: getattr(self, k) for k in LOCATION_KEYS}

    def to_dict(self) -> dict[str, object]:
        return {"kind": self.kind, "severity": self.severity, "subject": self.subject,
                "message": self.message, "fix": self.fix, "location": self.location()}


@dataclass
class CheckReport:
    site: str
    source: str
    findings: list[Finding] = field(default_factory=list)
    kept_apart: list[dict[str, str]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    stats: dict[str, int] = field(default_factory=dict)

    @property
    def clean(self) -> bool:
        return not self.findings

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = defaultdict(int)
        for f in self.findings:
            out[f.kind] += 1
        return dict(sorted(out.items()))

    def to_dict(self) -> dict[str, object]:
        return {
            "site": self.site, "source": self.source, "clean": self.clean,
            "stats": self.stats, "counts": self.counts(),
            "findings": [f.to_dict() for f in self.findings],
            "kept_apart": self.kept_apart, "notes": self.notes,
        }


def compile_filters(rules: Iterable[str]) -> list[re.Pattern[str]]:
    """`--hca-filter` rules: Python regexes searched in a CA's node description `HOST DEVICE`."""

    out = []
    for rule in rules:
        try:
            out.append(re.compile(rule))
        except re.error as exc:
            raise UsageError(f"--hca-filter {rule!r}: not a valid regular expression: {exc}",
                             hint=r"example: --hca-filter 'mlx5_(7|8)$'") from None
    return out


class _Ctx:
    """Working state of one check: name mapping between the plan and the fabric."""

    def __init__(self, site: Site, plan: FabricPlan, fabric: Fabric) -> None:
        self.site, self.plan, self.fabric = site, plan, fabric
        self.planned: dict[str, Switch] = plan.by_name
        self.to_plan: dict[str, str] = {}  # fabric node id -> plan switch name
        self.to_fabric: dict[str, FabricNode] = {}  # plan switch name -> fabric node
        self.findings: list[Finding] = []
        self.degree: dict[str, int] = {}  # fabric switch id -> ports facing other switches

    def switch_ports(self) -> list[tuple[FabricNode, Port, FabricNode]]:
        """Every (switch, port, peer switch), each link from both ends."""
        nodes = self.fabric.nodes
        out = []
        for sw in self.fabric.switches():
            for port in sw.ports.values():
                peer = nodes.get(port.remote_id)
                if peer is not None and peer.kind == "switch":
                    out.append((sw, port, peer))
        return out

    def add(self, kind: str, subject: str, message: str, fix: str, *,
            severity: str = "error", node: str | None = None, hca: str | None = None,
            guid: str | None = None, rail: int | None = None, switch: str | None = None,
            port: int | None = None, cage: int | None = None, cable: str | None = None) -> None:
        """The keywords after `severity` are the location fields of `Finding`."""
        self.findings.append(Finding(kind, severity, subject, message, fix, node=node, hca=hca,
                                     guid=guid, rail=rail, switch=switch, port=port, cage=cage,
                                     cable=cable))

    def name(self, node: FabricNode) -> str:
        return self.to_plan.get(node.node_id) or (node.name or node.node_id)

    def map(self, node: FabricNode, plan_name: str) -> None:
        self.to_plan[node.node_id] = plan_name
        self.to_fabric[plan_name] = node

    def role(self, name: str) -> str:
        sw = self.planned.get(name)
        if sw is None:
            return f"{name} (not in the plan)"
        if sw.tier != "leaf":
            return f"{name} (a {sw.tier})"
        inv = self.site.inventory
        if sw.su is not None:
            return f"{name} (the rail-{sw.rail} leaf of {inv.su_names[sw.su]})"
        return f"{name} (the leaf of {inv.rack_names[sw.rack or 0]})"


def check_fabric(site: Site, plan: FabricPlan, fabric: Fabric,
                 hca_filters: Sequence[re.Pattern[str]] = ()) -> CheckReport:
    """Every way `fabric` departs from `plan`, as findings with fixes."""
    gc_was_on = gc.isenabled()
    gc.disable()  # hundreds of thousands of tuples, no cycles (see ibnetdiscover.parse)
    try:
        return _check(site, plan, fabric, hca_filters)
    finally:
        if gc_was_on:
            gc.enable()


def _check(site: Site, plan: FabricPlan, fabric: Fabric,
           hca_filters: Sequence[re.Pattern[str]]) -> CheckReport:
    ctx = _Ctx(site, plan, fabric)
    report = CheckReport(site.site.name, fabric.source)
    attach = _attach_cas(ctx, fabric)
    cas = _classify_cas(ctx, report, site, fabric, attach, hca_filters)
    _match_switches(ctx, cas.compute, attach)
    _judge_by_port(ctx, cas.compute, attach, cas.unset, cas.odd_hca)
    apart_switches = _keep_apart_storage_switches(ctx, report, fabric, cas.compute, attach)
    _judge_unknown_hosts(ctx, report, cas.unknown_hosts, attach, apart_switches)
    _judge_storage_on_compute(ctx, plan, fabric, cas.apart_ids, attach)

    missing_switches = [s for s in plan.switches if s.name not in ctx.to_fabric]
    gone = {s.name for s in missing_switches}
    mixed = _check_node_links(ctx, cas.compute, attach, gone)
    check_switch_links(ctx, apart_switches, gone)
    _judge_missing_switches(ctx, missing_switches)
    _judge_unknown_switches(ctx, fabric, apart_switches)

    report.findings = ctx.findings
    report.stats = _stats(ctx, report, site, plan, fabric, len(cas.compute), len(mixed))
    _add_notes(ctx, report, fabric)
    return report


class _ClassifiedCAs(NamedTuple):
    """The fabric's CAs sorted by what the site says they are (step 2 of the check)."""

    compute: dict[tuple[str, str], FabricNode]  # (host, device) -> its CA, the first one seen
    apart_ids: set[str]  # CAs kept apart from compute (role or --hca-filter)
    unknown_hosts: dict[str, list[FabricNode]]  # host not in the site file -> its CAs
    unset: list[FabricNode]  # no usable description: judged by the port it sits in
    odd_hca: list[tuple[str, str | None, FabricNode]]  # a device its node type does not list


def _attach_cas(ctx: _Ctx, fabric: Fabric) -> dict[str, tuple[FabricNode, Port]]:
    """Where each CA is cabled, as the switch-side Port of its link; fills `ctx.degree`.

    Read from each CA's own port line (one per HCA, so 100k lines rather than the 500k switch
    ports of a 100k-GPU fabric), and from the switches only for CAs printed without them.
    """
    attach: dict[str, tuple[FabricNode, Port]] = {}
    nodes = fabric.nodes
    on_switch: dict[str, int] = defaultdict(int)
    orphans = False
    for ca in fabric.cas():
        for num in sorted(ca.ports):
            port = ca.ports[num]
            sw = nodes.get(port.remote_id)
            if sw is not None and sw.kind == "switch":
                back = sw.ports.get(port.remote_port)
                if back is None or back.remote_id != ca.node_id:  # one-sided (edited) file
                    back = Port(port.remote_port, ca.node_id, num, port.tail, port.line)
                attach[ca.node_id] = (sw, back)
                on_switch[sw.node_id] += 1
                break
        else:
            orphans = True
    if orphans:  # CAs printed without their port lines: read those links from the switches
        for sw in fabric.switches():
            for port in sw.ports.values():
                peer = nodes.get(port.remote_id)
                if peer is not None and peer.kind == "ca" and peer.node_id not in attach:
                    attach[peer.node_id] = (sw, port)
                    on_switch[sw.node_id] += 1
    for sw in fabric.switches():  # ports facing anything but CAs: a trigger for a closer look
        ctx.degree[sw.node_id] = len(sw.ports) - on_switch.get(sw.node_id, 0)
    return attach


def _classify_cas(ctx: _Ctx, report: CheckReport, site: Site, fabric: Fabric,
                  attach: dict[str, tuple[FabricNode, Port]],
                  hca_filters: Sequence[re.Pattern[str]]) -> _ClassifiedCAs:
    """Compute HCAs of site nodes, kept-apart ones, unknown ones; flags duplicate HCAs."""
    roles = {(t, h.device): h.role for t, nt in site.node_types.items() for h in nt.hcas}
    cas = _ClassifiedCAs({}, set(), defaultdict(list), [], [])
    by_name = site.inventory.by_name
    for ca in fabric.cas():
        desc = ca.desc
        if hca_filters and any(f.search(desc) for f in hca_filters):
            cas.apart_ids.add(ca.node_id)
            report.kept_apart.append(_apart(ctx, ca, attach, "matches --hca-filter"))
            continue
        host, dev = host_device(desc)
        if host is None:
            if ca.is_aggregation_node:
                continue  # the SHARP aggregation node inside a Quantum switch, not a host
            cas.unset.append(ca)  # judged by the port it sits in, once switches have names
            continue
        node = by_name.get(host)
        if node is None and "." in host:
            node = by_name.get(host.split(".", 1)[0])  # an FQDN: slurmd uses the short name
        if node is None:
            cas.unknown_hosts[host].append(ca)
            continue
        host = node.name
        role = roles.get((node.node_type, dev or ""))
        if role is None:
            cas.odd_hca.append((node.name, dev, ca))  # renamed or unlisted: judged by its port
            continue
        if role != "compute":
            cas.apart_ids.add(ca.node_id)
            report.kept_apart.append(_apart(ctx, ca, attach, f"site role {role}"))
            continue
        first = cas.compute.setdefault((host, dev or ""), ca)
        if first is not ca:
            ctx.add("duplicate-hca", f"{host} {dev}",
                    f"two CAs call themselves '{host} {dev}': {first.node_id} on "
                    f"{_where(ctx, first, attach)} and {ca.node_id} on {_where(ctx, ca, attach)}",
                    "fix the node description of the wrong one (a cloned image or a swapped "
                    "HCA); only the first is checked", node=host, hca=dev, guid=ca.guid,
                    **_at(ctx, ca, attach))
    return cas


def _keep_apart_storage_switches(ctx: _Ctx, report: CheckReport, fabric: Fabric,
                                 compute: dict[tuple[str, str], FabricNode],
                                 attach: dict[str, tuple[FabricNode, Port]]) -> set[str]:
    """Switches outside the plan that carry no compute HCA are another fabric (storage)."""
    nodes = fabric.nodes
    compute_ids = {ca.node_id for ca in compute.values()}
    carriers: dict[str, set[str]] = defaultdict(set)
    to_plan = ctx.to_plan
    for ca_id, (sw, _port) in attach.items():
        if sw.node_id not in to_plan:
            carriers[sw.node_id].add(ca_id)
    apart_switches: set[str] = set()
    for sw in fabric.switches():
        if sw.node_id in ctx.to_plan:
            continue
        carried = carriers.get(sw.node_id, set())
        if carried and not carried & compute_ids:
            apart_switches.add(sw.node_id)
    for sw_id in list(apart_switches):  # their uplink switches too, when only storage is below
        for port in nodes[sw_id].ports.values():
            peer = nodes.get(port.remote_id)
            if peer and peer.kind == "switch" and peer.node_id not in ctx.to_plan and not (
                carriers.get(peer.node_id, set()) & compute_ids
            ):
                apart_switches.add(peer.node_id)
    for sw_id in sorted(apart_switches):
        sw = nodes[sw_id]
        report.kept_apart.append({"what": "switch", "name": sw.name or sw_id, "id": sw_id,
                                  "reason": "carries no compute HCA of the site"})
    return apart_switches


def _judge_unknown_hosts(ctx: _Ctx, report: CheckReport,
                         unknown_hosts: dict[str, list[FabricNode]],
                         attach: dict[str, tuple[FabricNode, Port]],
                         apart_switches: set[str]) -> None:
    """Hosts not in the site file: a finding when they sit in the compute fabric."""
    for host, cas in sorted(unknown_hosts.items()):
        on_compute = [ca for ca in cas if ca.node_id in attach
                      and attach[ca.node_id][0].node_id not in apart_switches]
        if not on_compute:
            for ca in cas:
                report.kept_apart.append(_apart(ctx, ca, attach, "host not in the site file"))
            continue
        where = ", ".join(_where(ctx, ca, attach) for ca in on_compute[:3])
        more = f" and {len(on_compute) - 3} more" if len(on_compute) > 3 else ""
        ctx.add("unknown-node", host,
                f"host {host} ({_plural(len(on_compute), 'HCA')}) is not in the site file but is "
                f"cabled into the compute fabric at {where}{more}",
                "add it to the site file, unplug it, or exclude it with --hca-filter",
                node=host, guid=on_compute[0].guid, **_at(ctx, on_compute[0], attach))


def _judge_storage_on_compute(ctx: _Ctx, plan: FabricPlan, fabric: Fabric, apart_ids: set[str],
                              attach: dict[str, tuple[FabricNode, Port]]) -> None:
    """Storage HCAs that landed on compute leaves."""
    for ca_id in sorted(apart_ids):
        at = attach.get(ca_id)
        if at and at[0].node_id in ctx.to_plan:
            ca = fabric.nodes[ca_id]
            h, d = host_device(ca.desc)
            where = plan.port_label(ctx.name(at[0]), at[1].num)
            ctx.add("storage-on-compute", ca.desc or ca_id,
                    f"{ca.desc or ca_id} is kept apart from compute but is cabled into "
                    f"{ctx.role(ctx.name(at[0]))}: {where}",
                    f"move it to the storage fabric and free {where}", node=h, hca=d,
                    guid=ca.guid, **_at(ctx, ca, attach))


def _judge_missing_switches(ctx: _Ctx, missing_switches: list[Switch]) -> None:
    for lost in missing_switches:
        ctx.add("switch-missing", lost.name,
                f"{ctx.role(lost.name)} is not in the fabric: powered off, or every link of it is "
                "down", f"power on / reach {lost.name} and rerun ibnetdiscover; its cables were "
                "not checked", switch=lost.name, rail=lost.rail)


def _judge_unknown_switches(ctx: _Ctx, fabric: Fabric, apart_switches: set[str]) -> None:
    for sw in fabric.switches():
        if sw.node_id in ctx.to_plan or sw.node_id in apart_switches:
            continue
        ctx.add("unknown-switch", sw.name or sw.node_id,
                f"switch {sw.name or '(no name)'} ({sw.node_id}) is in the compute fabric but not "
                "in the plan", "remove it, or describe it in the site file (fabric radix, SUs)",
                switch=sw.name or sw.node_id, guid=sw.guid)


def _stats(ctx: _Ctx, report: CheckReport, site: Site, plan: FabricPlan, fabric: Fabric,
           hca_links_seen: int, leaves_mixing_rails: int) -> dict[str, int]:
    return {
        "nodes_planned": len(site.inventory.nodes),
        "hca_links_planned": len(plan.node_links),
        "hca_links_seen": hca_links_seen,
        "switches_planned": len(plan.switches),
        "switches_seen": sum(1 for _ in fabric.switches()),
        "switch_links_planned": len(plan.switch_links),
        "kept_apart": len(report.kept_apart),
        "findings": len(ctx.findings),
        # SHARP's invariant, counted: leaves that see an HCA of a rail other than their own.
        "leaves_mixing_rails": leaves_mixing_rails,
    }


def _add_notes(ctx: _Ctx, report: CheckReport, fabric: Fabric) -> None:
    """Nodes ignored, and switches matched to the plan by their cables rather than names."""
    nodes = fabric.nodes
    others = [n for n in nodes.values() if n.kind in ("router", "unknown")]
    if others:
        report.notes.append(
            f"{_plural(len(others), 'router/other node')} ignored (e.g. {others[0].type_word} "
            f"{others[0].desc or others[0].node_id})")
    renamed = [(sid, n) for sid, n in ctx.to_plan.items() if nodes[sid].name != n]
    if renamed:
        report.notes.append(
            f"{_plural(len(renamed), 'switch', 'es')} matched to the plan by cables, not by "
            "name "
            f"(e.g. {nodes[renamed[0][0]].name or renamed[0][0]} -> {renamed[0][1]}); name them "
            "as the plan does to make findings easier to read")


def _plural(n: int, word: str, suffix: str = "s") -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}{suffix}"


def _where(ctx: _Ctx, ca: FabricNode, attach: dict[str, tuple[FabricNode, Port]]) -> str:
    at = attach.get(ca.node_id)
    return f"{ctx.name(at[0])} port {at[1].num}" if at else "no switch port"


def _apart(ctx: _Ctx, ca: FabricNode, attach: dict[str, tuple[FabricNode, Port]],
           reason: str) -> dict[str, str]:
    return {"what": "hca", "name": ca.desc or ca.node_id, "id": ca.node_id,
            "at": _where(ctx, ca, attach), "reason": reason}


class _PortAt(TypedDict, total=False):
    """The switch-end location fields of `Finding` (keywords of `_Ctx.add`)."""

    switch: str
    port: int
    cage: int | None


def _at(ctx: _Ctx, ca: FabricNode, attach: dict[str, tuple[FabricNode, Port]]) -> _PortAt:
    """Location fields of the switch port a CA is cabled to (empty when it has none)."""
    at = attach.get(ca.node_id)
    if at is None:
        return {}
    port = at[1].num
    return {"switch": ctx.name(at[0]), "port": port, "cage": ctx.plan.cage(port)}


_NDD_FIX = ("rdma-core's rdma-ndd sets it at boot and on hostname changes "
            "(`systemctl enable --now rdma-ndd`); or write it by hand: "
            "`echo '{host} {dev}' > /sys/class/infiniband/{dev}/node_desc`")


def _judge_by_port(ctx: _Ctx, compute: dict[tuple[str, str], FabricNode],
                   attach: dict[str, tuple[FabricNode, Port]], unset: list[FabricNode],
                   odd_hca: list[tuple[str, str | None, FabricNode]]) -> None:
    """CAs whose description does not say which planned HCA they are (unset, or a device name
    the node type lacks): the port they sit in does. One in a planned port of a node whose HCA
    is otherwise absent stands in for it (its cable is checked, nothing is 'missing'), with a
    finding that names what to fix: the description, not the cabling."""
    if not unset and not odd_hca:
        return
    plan = ctx.plan
    by_port = {(nl.leaf, nl.port): nl for nl in plan.node_links}

    def planned_at(ca: FabricNode) -> NodeLink | None:
        at = attach.get(ca.node_id)
        return by_port.get((ctx.name(at[0]), at[1].num)) if at else None

    per_node: dict[str, list[tuple[NodeLink, FabricNode]]] = defaultdict(list)
    for ca in unset:
        nl = planned_at(ca)
        if nl is not None and (nl.node, nl.hca) not in compute:
            compute[(nl.node, nl.hca)] = ca
            per_node[nl.node].append((nl, ca))
            continue
        what = f"'{ca.desc}'" if ca.desc else "no node description"
        where = _where(ctx, ca, attach)
        ctx.add("unset-description", f"CA {ca.guid}",
                f"the CA with GUID {ca.guid} on {where} has {what} (never set), so it names no "
                "host", "set its node description to 'HOST DEVICE' on the host it belongs to: "
                + _NDD_FIX.format(host="HOST", dev="DEVICE") + "; or exclude it with --hca-filter",
                severity="warning", guid=ca.guid, **_at(ctx, ca, attach))
    if len(per_node) > 10 and len(per_node) == len(ctx.site.inventory.nodes):
        n = sum(len(v) for v in per_node.values())
        nl0, ca0 = min(per_node.values(), key=lambda v: v[0][0].node)[0]
        ctx.add("unset-description", "all nodes",
                f"all {n} HCAs of all {len(per_node)} nodes have the driver's default node "
                f"description ({ca0.desc or 'an empty description'}); they sit in their planned "
                "ports and their cables were checked by port",
                "set the node descriptions on every node: " + _NDD_FIX.format(
                    host="$(hostname -s)", dev="DEVICE"), severity="warning")
        return _odd_hcas(ctx, compute, attach, odd_hca, planned_at)
    for node, items in sorted(per_node.items()):
        items.sort(key=lambda t: (t[0].rail or 0, t[0].hca))
        nl0, ca0 = items[0]
        desc = ca0.desc or "an empty description"
        listed = ", ".join(f"{nl.hca} = GUID {ca.guid} on {plan.port_label(nl.leaf, nl.port)}"
                           for nl, ca in items[:8])
        n = len(items)
        ctx.add("unset-description", node if n > 1 else f"{node} {nl0.hca}",
                f"{_plural(n, 'HCA')} in {node}'s planned ports "
                f"{'have' if n > 1 else 'has'} the driver's default node description ({desc}), "
                f"not '{node} DEVICE': {listed}{' ...' if n > 8 else ''}; "
                "their cables were checked by port",
                f"set the node descriptions on {node}: " + _NDD_FIX.format(host=node,
                                                                         dev=nl0.hca),
                severity="warning", node=node, hca=nl0.hca, guid=ca0.guid, rail=nl0.rail,
                **_at(ctx, ca0, attach))
    _odd_hcas(ctx, compute, attach, odd_hca, planned_at)


def _odd_hcas(ctx: _Ctx, compute: dict[tuple[str, str], FabricNode],
              attach: dict[str, tuple[FabricNode, Port]],
              odd_hca: list[tuple[str, str | None, FabricNode]],
              planned_at: Callable[[FabricNode], NodeLink | None]) -> None:
    plan = ctx.plan
    roles = {(t, h.device) for t, nt in ctx.site.node_types.items() for h in nt.hcas}
    for host, dev, ca in odd_hca:
        nl = planned_at(ca)
        node_type = ctx.site.inventory.by_name[host].node_type
        if nl is not None and nl.node == host and (host, nl.hca) not in compute \
                and (node_type, nl.hca) in roles:
            compute[(host, nl.hca)] = ca
            ctx.add("renamed-hca", f"{host} {nl.hca}",
                    f"the HCA in {host}'s planned port for {nl.hca} "
                    f"({plan.port_label(nl.leaf, nl.port)}) describes itself as "
                    f"'{ca.desc}': the device is named {dev or '(nothing)'} on the host",
                    f"if {host} renamed the device (PCI order, udev rule), restore the name "
                    f"{nl.hca} or set its node description to '{host} {nl.hca}'; if every node "
                    f"of type {node_type} calls it {dev}, rename it in "
                    f"node_types.{node_type}.hcas", severity="warning", node=host, hca=nl.hca,
                    guid=ca.guid, rail=nl.rail, **_at(ctx, ca, attach))
            continue
        ctx.add("unknown-hca", f"{host} {dev}",
                f"{host} has an HCA {dev!r} that node type {node_type} does not list "
                f"(on {_where(ctx, ca, attach)})",
                f"add it to node_types.{node_type}.hcas, or exclude it with --hca-filter",
                node=host, hca=dev, guid=ca.guid, **_at(ctx, ca, attach))


def _match_switches(ctx: _Ctx, compute: dict[tuple[str, str], FabricNode],
                    attach: dict[str, tuple[FabricNode, Port]]) -> None:
    planned = ctx.planned
    unmatched: list[FabricNode] = []
    for sw in ctx.fabric.switches():
        if sw.name in planned and sw.name not in ctx.to_fabric:
            ctx.map(sw, sw.name)
        else:
            unmatched.append(sw)
    if not unmatched:
        return
    # Leaves: the planned leaf most of its compute HCAs belong on.
    votes: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    node_port = ctx.plan.node_port
    for key, ca in compute.items():
        at = attach.get(ca.node_id)
        if at is not None and at[0].node_id not in ctx.to_plan:
            votes[at[0].node_id][node_port[key].leaf] += 1
    _elect(ctx, votes)
    # Spines, then cores: the planned upper switch their ports lead to from named switches.
    # A link in the planned port is a strong vote; any link from a lower switch a weak vote
    # for each upper switch of its group (ports above the leaves are not binding).
    upper_of = {(sl.lower, sl.lower_port): sl.upper for sl in ctx.plan.switch_links}
    uppers: dict[str, set[str]] = defaultdict(set)
    for sl in ctx.plan.switch_links:
        uppers[sl.lower].add(sl.upper)
    for _tier in range(2):
        votes = defaultdict(lambda: defaultdict(int))
        for sw, port, peer in ctx.switch_ports():
            if sw.node_id in ctx.to_plan or peer.node_id not in ctx.to_plan:
                continue
            lower = ctx.to_plan[peer.node_id]
            up = upper_of.get((lower, port.remote_port))
            tally = votes[sw.node_id]
            if up is not None:
                tally[up] += 1000
            for cand in uppers.get(lower, ()):
                tally[cand] += 1
        _elect(ctx, votes)


def _elect(ctx: _Ctx, votes: dict[str, dict[str, int]]) -> None:
    ranked = sorted(((n, name, sw) for sw, tally in votes.items() for name, n in tally.items()),
                    key=lambda t: (-t[0], t[1], t[2]))
    for _n, name, sw_id in ranked:
        if sw_id in ctx.to_plan or name in ctx.to_fabric:
            continue
        ctx.map(ctx.fabric.nodes[sw_id], name)


def _check_node_links(ctx: _Ctx, compute: dict[tuple[str, str], FabricNode],
                      attach: dict[str, tuple[FabricNode, Port]], gone: set[str]) -> set[str]:
    """HCA cables against the plan; returns the leaves that see a foreign rail."""
    plan = ctx.plan
    want = plan.link_gbps
    missing: dict[str, list[NodeLink]] = defaultdict(list)
    per_node: dict[str, int] = defaultdict(int)
    misplaced: dict[tuple[str, str], tuple[Pos, Pos, int | None]] = {}
    slow: list[tuple[str, str, Pos, Port]] = []
    healthy = " " + speed_name(want)  # a healthy link's comment ends with its rate
    to_plan = ctx.to_plan
    for nl in plan.node_links:
        node, hca, leaf, lport = nl.node, nl.hca, nl.leaf, nl.port
        per_node[node] += 1
        ca = compute.get((node, hca))
        at = attach.get(ca.node_id) if ca is not None else None
        if at is None:
            if leaf not in gone:
                missing[node].append(nl)
            continue
        sw, port = at
        got = to_plan.get(sw.node_id) or (sw.name or sw.node_id)
        tail = port.tail
        if not (tail and tail.endswith(healthy)) and is_slow(port.gbps, want):
            slow.append((node, hca, (got, port.num), port))
        if got != leaf or port.num != lport:
            misplaced[(node, hca)] = ((got, port.num), (leaf, lport), nl.rail)

    for node, links in missing.items():
        if len(links) == per_node[node] and len(links) > 1:
            ctx.add("node-missing", node,
                    f"none of the {len(links)} compute HCAs of {node} is in the fabric",
                    f"check that {node} is powered on and its HCAs are up (`ibstat`), then rerun",
                    node=node)
            continue
        for nl in links:
            on_rail = "" if nl.rail is None else f" (rail {nl.rail})"
            end = plan.port_label(nl.leaf, nl.port)
            ctx.add("missing-link", f"{nl.node} {nl.hca}",
                    f"{nl.node} {nl.hca}{on_rail} has no link to {end}",
                    f"reseat or replace the cable {nl.node} {nl.hca} <-> {end} (port down on "
                    "either end)", node=nl.node, hca=nl.hca, rail=nl.rail, switch=nl.leaf,
                    port=nl.port, cage=plan.cage(nl.port), cable=f"{nl.node} {nl.hca} <-> {end}")

    mixed = {actual[0] for actual, _e, rail in misplaced.values()
             if rail is not None and (got_sw := ctx.planned.get(actual[0])) is not None
             and got_sw.tier == "leaf" and got_sw.rail is not None and got_sw.rail != rail}
    occupant = {actual: key for key, (actual, _e, _r) in misplaced.items()}
    done: set[tuple[str, str]] = set()
    _whole_node_moves(ctx, misplaced, per_node, done)
    for key, (actual, expected, rail) in sorted(misplaced.items()):
        if key in done:
            continue
        other = occupant.get(expected)
        if other is not None and other != key and misplaced[other][1] == actual:
            done.update((key, other))
            o_rail = misplaced[other][2]
            a, b = sorted([(key, actual, rail), (other, expected, o_rail)])
            pa, pb = plan.port_label(*a[1]), plan.port_label(*b[1])
            ctx.add("swapped-cables", f"{a[0][0]} {a[0][1]} / {b[0][0]} {b[0][1]}",
                    f"{_hca(a[0], a[2])} and {_hca(b[0], b[2])} are in each other's ports: "
                    f"{pa} and {pb}", f"swap the cables in {pa} and {pb}",
                    node=a[0][0], hca=a[0][1], guid=compute[a[0]].guid, rail=a[2],
                    switch=a[1][0], port=a[1][1], cage=plan.cage(a[1][1]),
                    cable=f"{a[0][0]} {a[0][1]} <-> {pa}")
            continue
        _misplaced_hca(ctx, key, actual, expected, rail, compute[key].guid)

    if slow and len(slow) == len(plan.node_links) - sum(len(v) for v in missing.values()) > 10:
        rates = sorted({p.rate for *_x, p in slow})
        ctx.add("degraded-link", "all HCA links",
                f"all {len(slow)} HCA links run at {', '.join(rates)}, below fabric.link_gbps = "
                f"{want} ({speed_name(want)})",
                "if the fabric really runs at that rate, set fabric.link_gbps; otherwise check "
                "the subnet manager's speed settings")
        return mixed
    for node, hca, actual, port in slow:
        end = plan.port_label(*actual)
        ctx.add("degraded-link", f"{node} {hca}",
                f"{node} {hca} on {end} runs at {port.rate} "
                f"({port.gbps:g} Gb/s), planned {speed_name(want)} ({want} Gb/s)",
                f"reseat or replace the cable/transceiver {node} {hca} <-> {end}",
                node=node, hca=hca, guid=compute[(node, hca)].guid,
                rail=plan.node_port[(node, hca)].rail, switch=actual[0], port=actual[1],
                cage=plan.cage(actual[1]), cable=f"{node} {hca} <-> {end}")
    return mixed


def _whole_node_moves(ctx: _Ctx, misplaced: dict[tuple[str, str], tuple[Pos, Pos, int | None]],
                      per_node: dict[str, int], done: set[tuple[str, str]]) -> None:
    """A node whose every compute HCA sits on the same-rail leaves of one other SU: one finding."""
    by_node: dict[str, list[tuple[str, str]]] = defaultdict(list)
    for key in misplaced:
        by_node[key[0]].append(key)
    inv = ctx.site.inventory
    for node, keys in sorted(by_node.items()):
        if len(keys) != per_node[node] or len(keys) < 2:
            continue
        got = [ctx.planned.get(misplaced[k][0][0]) for k in keys]
        exp = [ctx.planned[misplaced[k][1][0]] for k in keys]
        pairs = zip(got, exp, strict=True)
        if any(g is None or g.su is None or g.rail != e.rail for g, e in pairs):
            continue
        sus = {g.su for g in got if g is not None and g.su is not None}
        if len(sus) != 1 or exp[0].su in sus:
            continue
        other = inv.su_names[sus.pop()]
        home = inv.su_names[exp[0].su or 0]
        ports = sorted({misplaced[k][0][1] for k in keys})
        want = sorted({misplaced[k][1][1] for k in keys})
        ctx.add("wrong-su", node,
                f"all {len(keys)} compute HCAs of {node} (a {home} node) are on the rail leaves of "
                f"{other} (port {','.join(map(str, ports))}), so Slurm's {home} switch and the "
                "fabric disagree",
                f"move its {len(keys)} cables to the {home} rail leaves, port "
                f"{','.join(map(str, want))} (same rail, same port on each leaf)",
                node=node, switch=misplaced[keys[0]][0][0], port=ports[0],
                cage=ctx.plan.cage(ports[0]))
        done.update(keys)


def _hca(key: tuple[str, str], rail: int | None) -> str:
    return f"{key[0]} {key[1]}" + ("" if rail is None else f" (rail {rail})")


def _misplaced_hca(ctx: _Ctx, key: tuple[str, str], actual: Pos, expected: Pos,
                   rail: int | None, guid: str | None = None) -> None:
    plan = ctx.plan
    got = plan.by_name.get(actual[0])
    exp = plan.by_name[expected[0]]
    a, e = plan.port_label(*actual), plan.port_label(*expected)
    fix = f"move the cable of {key[0]} {key[1]} from {a} to {e}"
    at = f"is in {ctx.role(actual[0])} port {actual[1]}; planned: {e}"
    if actual[0] == expected[0]:
        kind, sev, why = "wrong-port", "warning", ""
    elif got is None or got.tier != "leaf":
        kind, sev, why = "wrong-leaf", "error", ""
    elif got.su is not None and exp.su is not None and got.su == exp.su:
        kind, sev = "wrong-rail", "error"
        why = (f" — the rail-{got.rail} leaf now sees a rail-{rail} HCA, which breaks SHARP's "
               "one-rail-per-leaf tree")
    elif got.su is not None and exp.su is not None:
        kind, sev, why = "wrong-su", "error", ""
    else:
        kind, sev, why = "wrong-leaf", "error", ""
    ctx.add(kind, _hca(key, None), f"{_hca(key, rail)} {at}{why}", fix, severity=sev,
            node=key[0], hca=key[1], guid=guid, rail=rail, switch=actual[0], port=actual[1],
            cage=plan.cage(actual[1]), cable=f"{key[0]} {key[1]} <-> {a}")
