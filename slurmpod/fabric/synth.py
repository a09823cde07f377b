"""Synthesize the `ibnetdiscover` output a site's fabric plan implies, with optional faults.

Used by the tests and the benchmark, and by admins who want to rehearse `slurmpod topo check`
before the cables are in (the command line is `slurmpod topo synth`, slurmpod/cli/fabric.py):

    slurmpod topo synth SITE -o fabric.txt \\
        [--swap dgx0001:mlx5_0,dgx0001:mlx5_3] [--missing dgx0002:mlx5_4] \\
        [--slow dgx0003:mlx5_5=4xHDR] [--move dgx0004=su2] [--unknown-node intruder01] [--storage]
        [--desc mlx5|hca|fqdn|unset|empty] [--unset dgx0005] [--rename dgx0006:mlx5_3=mlx5_12]
        [--uplinks plan|cage|shuffle] [--planes]

An endpoint is `NODE:HCA` (a node's verbs device) or `SWITCH:PORT` (a planned switch port).
Faults: `swap` exchanges the far ends of two cables (a crossed pair), `missing` removes a cable
(a down link looks exactly like that: ibnetdiscover prints connected ports only), `slow` sets a
link's rate, `move` re-cables every compute HCA of a node into another SU's rail leaves, and
`unknown-node` plugs a host that is not in the site file into a free leaf port, `unset` gives a
node's HCAs the driver's default description, `rename` changes one HCA's device name. `--storage`
adds the storage/management HCAs on their own leaves, as a converged fabric shows them; `--desc`
picks the description form of every host; `--uplinks` re-cables each leaf's uplinks into other
ports (same count to each spine); `--planes` writes one file per subnet (per-rail planes) as
FILE.0, FILE.1, ... On SHARP sites every switch shows its aggregation node, a CA on the port
above the radix (`Switch 65` on a 64-port QM9700), as Quantum switches do.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from slurmpod.errors import ConfigError
from slurmpod.fabric.ibnetdiscover import LANE_GBPS, speed_name

if TYPE_CHECKING:
    from slurmpod.model.site import Site
    from slurmpod.topology.fabric_plan import FabricPlan

FaultKind = Literal["swap", "missing", "slow", "move", "unknown-node", "unset", "rename"]
# How hosts describe their HCAs (see slurmpod.fabric.ibnetdiscover.host_device): rdma-ndd's
# "host mlx5_0", DGX OS's "host HCA-1", an FQDN, the driver default nobody changed, or none.
DescForm = Literal["mlx5", "hca", "fqdn", "unset", "empty"]
DESC_FORMS: tuple[str, ...] = ("mlx5", "hca", "fqdn", "unset", "empty")
UNSET_DESC = "MT4129 ConnectX7 Mellanox Technologies"  # what a ConnectX-7 reports by default
AN_DESC = "Mellanox Technologies Aggregation Node"
# Uplink port layouts: as planned; both ports of each cage to one spine; random ports.
UplinkLayout = Literal["plan", "cage", "shuffle"]

_SWITCH_GUID = 0xB8CEF60300000000
_CA_GUID = 0x0C42A10300000000


@dataclass(frozen=True)
class Fault:
    """One injected fault; `spec` is the CLI text (see the module docstring)."""

    kind: FaultKind
    spec: str


class _Model:
    """A mutable cable list: endpoint (name, port) -> far endpoint and rate.

    Switches are named as in the plan; a CA is named by its node description `HOST DEVICE`
    (port 1), the form ibnetdiscover prints.
    """

    def __init__(self, plan: FabricPlan, rate: str) -> None:
        self.desc: dict[str, str] = {}  # CA -> the node description it prints, when not its name
        self.rate = rate
        self.gbps = plan.link_gbps
        self.switches: dict[str, int] = {s.name: s.radix for s in plan.switches}
        self.tier = {s.name: s.tier for s in plan.switches}
        self.cas: list[str] = []
        self.far: dict[tuple[str, int], tuple[str, int]] = {}
        self.rates: dict[frozenset[tuple[str, int]], str] = {}
        for nl in plan.node_links:
            ca = f"{nl.node} {nl.hca}"
            self.cas.append(ca)
            self.connect((ca, 1), (nl.leaf, nl.port))
        for sl in plan.switch_links:
            self.connect((sl.lower, sl.lower_port), (sl.upper, sl.upper_port))

    def connect(self, a: tuple[str, int], b: tuple[str, int], rate: str | None = None) -> None:
        self.far[a] = b
        self.far[b] = a
        if rate is not None:
            self.rates[frozenset((a, b))] = rate

    def cut(self, a: tuple[str, int]) -> tuple[str, int]:
        b = self.far.pop(a)
        del self.far[b]
        self.rates.pop(frozenset((a, b)), None)
        return b

    def free_port(self, switch: str, last: int) -> int:
        for port in range(1, last + 1):
            if (switch, port) not in self.far:
                return port
        raise ConfigError(f"switch {switch} has no free port among 1..{last}",
                          hint="pick another target for the fault")


def synthesize(site: Site, plan: FabricPlan | None = None, faults: Sequence[Fault] = (),
               storage: bool = False, desc: DescForm = "mlx5",
               uplinks: UplinkLayout = "plan") -> str:
    """The ibnetdiscover text of `site`'s planned fabric with `faults` applied (pure)."""
    return synthesize_planes(site, plan, faults, storage, desc, uplinks, planes=False)[0]


def synthesize_planes(site: Site, plan: FabricPlan | None = None, faults: Sequence[Fault] = (),
                      storage: bool = False, desc: DescForm = "mlx5",
                      uplinks: UplinkLayout = "plan", planes: bool = True) -> list[str]:
    """One ibnetdiscover text per subnet (connected part of the fabric: one per rail on a
    per_rail site), as an admin gets by running ibnetdiscover once in each; `planes=False`
    gives the whole fabric in one text."""
    if plan is None:
        from slurmpod.topology.fabric_plan import plan_fabric  # lazy: start-up

        plan = plan_fabric(site)
    model = _Model(plan, speed_name(plan.link_gbps))
    if uplinks != "plan":
        _relayout_uplinks(plan, model, uplinks)
    if storage:
        _add_storage(site, plan, model)
    for fault in faults:
        _apply(site, plan, model, fault)
    _describe(model, desc)
    if site.fabric.sharp:
        _add_aggregation_nodes(model)
    if not planes:
        return [_render(model, site.site.name)]
    return [_render(model, site.site.name, part) for part in _components(model)]


def _describe(model: _Model, form: str) -> None:
    if form == "mlx5":
        return
    for ca in model.cas:
        if ca in model.desc:
            continue
        host, _, dev = ca.partition(" ")
        if form == "hca":
            if not dev.startswith("mlx5_"):
                raise ConfigError(f"--desc hca: device {dev!r} is not mlx5_N")
            model.desc[ca] = f"{host} HCA-{int(dev[5:]) + 1}"
        elif form == "fqdn":
            model.desc[ca] = f"{host}.cluster.example.com {dev}"
        elif form == "unset":
            model.desc[ca] = UNSET_DESC
        elif form == "empty":
            model.desc[ca] = ""
        else:
            raise ConfigError(f"--desc {form!r}: use one of {', '.join(DESC_FORMS)}")


def _add_aggregation_nodes(model: _Model) -> None:
    """The SHARP aggregation node of each switch: a CA on the port above the radix."""
    for sw, radix in list(model.switches.items()):
        an = f"{sw} AN"
        model.cas.append(an)
        model.desc[an] = AN_DESC
        model.switches[sw] = radix + 1
        model.connect((an, 1), (sw, radix + 1))


def _relayout_uplinks(plan: FabricPlan, model: _Model, layout: str) -> None:
    """Keep how many links each lower switch has to each upper switch; change the ports."""

    rng = random.Random(7)
    by_lower: dict[str, list[tuple[int, str, int]]] = {}
    for sl in plan.switch_links:
        by_lower.setdefault(sl.lower, []).append((sl.lower_port, sl.upper, sl.upper_port))
    upper_ports: dict[str, list[int]] = {}
    for links in by_lower.values():
        for _lp, up, upp in links:
            upper_ports.setdefault(up, []).append(upp)
    for ports in upper_ports.values():
        ports.sort()
        if layout == "shuffle":
            rng.shuffle(ports)
    for lower, links in by_lower.items():
        for lp, _up, _upp in links:
            model.cut((lower, lp))
        lports = sorted(lp for lp, _u, _p in links)
        uppers = sorted(up for _lp, up, _p in links)  # cage layout: runs of one spine
        if layout == "shuffle":
            rng.shuffle(lports)
        for lp, up in zip(lports, uppers, strict=True):
            model.connect((lower, lp), (up, upper_ports[up].pop(0)))


def _components(model: _Model) -> list[set[str]]:
    parent: dict[str, str] = {}

    def find(x: str) -> str:
        parent.setdefault(x, x)
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for (a, _p), (b, _q) in model.far.items():
        ra, rb = find(a), find(b)
        if ra != rb:
            parent[rb] = ra
    parts: dict[str, set[str]] = {}
    for name in list(model.switches) + model.cas:
        if name in parent:
            parts.setdefault(find(name), set()).add(name)
    return sorted(parts.values(), key=lambda p: min(p))


def _endpoint(model: _Model, spec: str) -> tuple[str, int]:
    name, sep, port = spec.strip().rpartition(":")
    if not sep or not name:
        raise ConfigError(f"bad endpoint {spec!r}; use NODE:HCA or SWITCH:PORT")
    if name in model.switches:
        if not port.isdigit():
            raise ConfigError(f"bad endpoint {spec!r}: {name} is a switch; use {name}:PORT")
        return name, int(port)
    ca = f"{name} {port}"
    if ca not in model.far and ca not in model.cas:
        raise ConfigError(f"no cable at {spec!r}: not a planned NODE:HCA or SWITCH:PORT")
    return ca, 1


def _apply(site: Site, plan: FabricPlan, model: _Model, fault: Fault) -> None:
    spec = fault.spec
    if fault.kind == "swap":
        parts = spec.split(",")
        if len(parts) != 2:
            raise ConfigError(f"--swap {spec!r}: give two endpoints, A,B")
        a, b = (_endpoint(model, p) for p in parts)
        fa, fb = model.far.get(a), model.far.get(b)
        if fa is None or fb is None:
            raise ConfigError(f"--swap {spec!r}: both endpoints need a cable")
        model.cut(a)
        model.cut(b)
        model.connect(a, fb)
        model.connect(b, fa)
    elif fault.kind == "missing":
        ep = _endpoint(model, spec)
        if ep not in model.far:
            raise ConfigError(f"--missing {spec!r}: no cable there")
        model.cut(ep)
    elif fault.kind == "slow":
        where, _, rate = spec.partition("=")
        ep = _endpoint(model, where)
        if ep not in model.far:
            raise ConfigError(f"--slow {spec!r}: no cable there")
        rate = rate or speed_name(plan.link_gbps / 2)
        if rate[:1].isdigit() and "x" in rate and rate.split("x", 1)[1].upper() not in LANE_GBPS:
            raise ConfigError(f"--slow {spec!r}: unknown rate; use e.g. 4xHDR or 2xNDR")
        model.rates[frozenset((ep, model.far[ep]))] = rate
    elif fault.kind == "move":
        _move(site, plan, model, spec)
    elif fault.kind == "unset":
        cas = [c for c in model.cas if c.split(" ", 1)[0] == spec.strip()]
        if not cas:
            raise ConfigError(f"--unset {spec!r}: no node {spec!r} in the fabric")
        for c in cas:
            model.desc[c] = UNSET_DESC
    elif fault.kind == "rename":
        where, _, new = spec.partition("=")
        ep = _endpoint(model, where)
        if not new.strip() or ep[0] in model.switches:
            raise ConfigError(f"--rename {spec!r}: use NODE:HCA=NEWNAME")
        model.desc[ep[0]] = f"{ep[0].split(' ', 1)[0]} {new.strip()}"
    elif fault.kind == "unknown-node":
        leaf = plan.leaves[0].name
        port = model.free_port(leaf, plan.downlinks_per_leaf)
        ca = f"{spec.strip()} mlx5_0"
        model.cas.append(ca)
        model.connect((ca, 1), (leaf, port))
    else:  # pragma: no cover - Literal exhausts the kinds
        raise ConfigError(f"unknown fault kind {fault.kind!r}")


def _move(site: Site, plan: FabricPlan, model: _Model, spec: str) -> None:
    node_name, _, target = spec.partition("=")
    inv = site.inventory
    node = inv.by_name.get(node_name.strip())
    if node is None:
        raise ConfigError(f"--move {spec!r}: no node {node_name!r} in the site")
    target = target.strip()
    su = (int(target) - 1) if target.isdigit() else (
        inv.su_names.index(target) if target in inv.su_names else -1)
    if not 0 <= su < len(inv.su_names) or su == node.su:
        raise ConfigError(f"--move {spec!r}: give another SU of the site, by name or 1-based index")
    leaf_of = {(s.su, s.rail): s.name for s in plan.leaves}
    for nl in plan.node_links:
        if nl.node != node.name:
            continue
        leaf = leaf_of.get((su, nl.rail))
        if leaf is None:
            raise ConfigError(f"--move {spec!r}: the site is not rail-optimised")
        ca = (f"{nl.node} {nl.hca}", 1)
        if ca in model.far:
            model.cut(ca)
        try:
            port = model.free_port(leaf, plan.downlinks_per_leaf)
        except ConfigError:
            raise ConfigError(f"--move {spec!r}: {leaf} has no free downlink port (the SU is "
                              "full)", hint="move it to a smaller SU, or cross cables with a "
                              "node there using --swap") from None
        model.connect(ca, (leaf, port))


def _add_storage(site: Site, plan: FabricPlan, model: _Model) -> None:
    """Storage/management HCAs on their own leaves under one storage spine."""
    down = site.leaf_downlinks
    leaf_idx = port = 0
    spine = "storage-spine-1"
    for node in site.inventory.nodes:
        for hca in site.node_types[node.node_type].hcas:
            if hca.role == "compute":
                continue
            if spine not in model.switches:
                model.switches[spine] = site.fabric.spine_radix
                model.tier[spine] = "spine"
            if port == 0 or port == down:
                leaf_idx += 1
                port = 0
                leaf = f"storage-leaf-{leaf_idx}"
                model.switches[leaf] = site.fabric.leaf_radix
                model.tier[leaf] = "leaf"
                model.connect((leaf, down + 1), (spine, leaf_idx))
            port += 1
            ca = f"{node.name} {hca.device}"
            model.cas.append(ca)
            model.connect((ca, 1), (f"storage-leaf-{leaf_idx}", port))


def _switch_model(gbps: float) -> str:
    return {400: "MQM9700", 200: "MQM8700", 100: "MSB7800", 800: "Q3400"}.get(int(gbps), "SW")


def _render(model: _Model, site_name: str, only: set[str] | None = None) -> str:
    sw_names = list(model.switches)
    sw_id = {n: f"S-{_SWITCH_GUID + i:016x}" for i, n in enumerate(sw_names)}
    ca_guid = {c: _CA_GUID + 2 * i for i, c in enumerate(model.cas)}
    lid = {n: i + 1 for i, n in enumerate(sw_names)}
    for i, c in enumerate(model.cas):
        lid[c] = len(sw_names) + i + 1
    hw = _switch_model(model.gbps)
    # The ASIC's PCI device id: Quantum-2 (MT54002) in QM9700s, Quantum (MT53000) in QM8700s.
    devid = {"MQM9700": "0xd2f2", "MQM8700": "0xcf08"}.get(hw, "0xb924")
    sw_desc = {n: f"MF0;{n}:{hw}/U1" for n in sw_names}
    names = model.desc
    by_node: dict[str, list[tuple[int, str, int]]] = {}
    for (name, port), (rname, rport) in model.far.items():
        by_node.setdefault(name, []).append((port, rname, rport))
    rates = model.rates
    default = model.rate

    def ident(n: str) -> str:
        return sw_id[n] if n in sw_id else f"H-{ca_guid[n]:016x}"

    def desc(n: str) -> str:
        return sw_desc.get(n) or names.get(n, n)

    cas = model.cas
    if only is not None:
        sw_names = [n for n in sw_names if n in only]
        cas = [c for c in cas if c in only]

    out = [
        "#",
        f"# Topology file: synthesized by slurmpod from the fabric plan of site {site_name}",
        "#",
        f"# Initiated from node {ca_guid[cas[0]]:016x} port {ca_guid[cas[0]] + 1:016x}"
        if cas else "# Initiated from node 0000000000000000 port 0000000000000000",
    ]
    for n in sw_names:
        if n not in by_node:
            continue  # a switch without a single link is invisible to ibnetdiscover
        guid = sw_id[n][2:]
        out += ["", "vendid=0x2c9", f"devid={devid}", f"sysimgguid=0x{guid}",
                f"switchguid=0x{guid}({guid.lstrip('0')})",
                f'Switch\t{model.switches[n]} "{sw_id[n]}"\t\t# "{sw_desc[n]}" enhanced port 0 '
                f"lid {lid[n]} lmc 0"]
        for port, rname, rport in sorted(by_node.get(n, ())):
            rate = rates.get(frozenset(((n, port), (rname, rport))), default) if rates else default
            if rname in sw_id:
                out.append(f'[{port}]\t"{sw_id[rname]}"[{rport}]\t\t# "{sw_desc[rname]}" '
                           f"lid {lid[rname]} {rate}")
            else:
                g = ca_guid[rname]
                out.append(f'[{port}]\t"H-{g:016x}"[{rport}]({g + 1:x}) \t\t# "{desc(rname)}" '
                           f"lid {lid[rname]} {rate}")
    for c in cas:
        if c not in by_node:
            continue  # so is an HCA whose cable is out
        g = ca_guid[c]
        out += ["", "vendid=0x2c9", "devid=0x1021", f"sysimgguid=0x{g:x}", f"caguid=0x{g:x}",
                f'Ca\t1 "H-{g:016x}"\t\t# "{desc(c)}"']
        for port, rname, rport in sorted(by_node.get(c, ())):
            rate = rates.get(frozenset(((c, port), (rname, rport))), default) if rates else default
            out.append(f'[{port}]({g + 1:x}) \t"{ident(rname)}"[{rport}]\t\t# lid {lid[c]} lmc 0 '
                       f'"{desc(rname)}" lid {lid[rname]} {rate}')
    out.append("")
    return "\n".join(out)
