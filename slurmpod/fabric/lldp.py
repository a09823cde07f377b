"""RoCE fabrics: rail-to-leaf cabling from the nodes' LLDP neighbours (`topo check --lldp`).

An Ethernet fabric has no `ibnetdiscover`; what a node knows is the switch and port at the far
end of each NIC, as lldpd hears it. `lldpcli -f json show neighbors` (lldpd 1.0.x) prints

    {"lldp": {"interface": {"eth0": {"chassis": {"sx-leaf-su1-rail0": {"id": {...}, ...}},
                                     "port": {"id": {"type": "ifname", "value": "swp1s0"},
                                              "descr": "swp1s0", "ttl": "120"}, ...}}}}

with one quirk that matters: the JSON writer turns a key that occurs once into an object and a
key that occurs several times into a list, so `interface` is an object for one neighbour and a
list of one-key objects for several (`{"lldp": {}}` for none); `chassis` is keyed by the
system name, or holds `id` directly when the switch sends none. `-f json0` (always lists) is
read too. Checked against lldpd 1.0.16 (Debian 12) on veth pairs: tests/data/lldp.

The neighbours become a `Fabric` (switches by chassis, one CA per rail NIC, named `HOST DEVICE`
through the site's HCA `netdev`) and go through `check.check_fabric` against the plan's node
links, so RoCE findings are the InfiniBand ones (swapped-cables, wrong-rail, wrong-su, ...).
What LLDP on the nodes cannot see is left out: leaf-to-spine cables, link rates, nodes that sent
no data (a note lists them).

Switch port names are read in three conventions; `P` is the plan's port number (1-based) and
`k` the plan's ports per cage (`fabric.ports_per_cage`, 2 for 800G cages split into 2x400G):

* Cumulus Linux  `swpN` (P = N, or (N-1)k+1 on a split cage), `swpNsM` (P = (N-1)k + M + 1)
* NVIDIA Onyx    `EthA/N`, `EthA/N/M` (M from 1: P = (N-1)k + M)
* SONiC aliases  `etpN`, `etpNa`..`etpNh` (a = first lane group: P = (N-1)k + 1)

SONiC's own `EthernetX` names count SerDes lanes and say nothing about the front panel without
the platform's port map; lldpd on SONiC sends the alias as the port description, which is read.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from slurmpod.errors import ConfigError
from slurmpod.fabric.ibnetdiscover import Fabric, FabricNode, Port
from slurmpod.model.hostlist import compress

if TYPE_CHECKING:
    from slurmpod.fabric.check import CheckReport, Finding
    from slurmpod.model.site import Site
    from slurmpod.topology.fabric_plan import FabricPlan


# Kinds only the LLDP check reports (the cabling kinds are check.FINDING_KINDS).
LLDP_FINDING_KINDS: dict[str, str] = {
    "lldp-unknown-port": "a NIC's LLDP neighbour names its switch port in no convention "
                         "slurmpod reads, so that cable was not checked",
}


@dataclass(frozen=True)
class Neighbour:
    """One LLDP neighbour of one node interface."""

    host: str
    ifname: str
    chassis: str  # the switch's system name, domain stripped ("" when it sends none)
    chassis_id: str  # chassis ID value (usually the switch's MAC)
    port_id: str
    port_id_type: str  # ifname | local | mac | ...
    port_descr: str
    source: str  # file (and host) it came from


@dataclass
class LldpData:
    """Neighbours of every node that sent data; `hosts` includes nodes that heard nobody."""

    hosts: set[str]
    neighbours: list[Neighbour]
    source: str


# --- reading ---------------------------------------------------------------------------------

_PDSH = re.compile(r"^([A-Za-z0-9][A-Za-z0-9_.-]*): ?(.*)$")


def short(name: str) -> str:
    """`h200-001.cluster.local` -> `h200-001` (slurmd and the plan use short names)."""
    return name.split(".", 1)[0] if name and not name[0].isdigit() else name


def read_lldp(paths: Sequence[Path]) -> LldpData:
    """Read `--lldp` inputs: a directory of `HOST.json` files, one node's `lldpcli -f json show
    neighbors` saved as `HOST.json`, pdsh/clush output (`host: ` before every line), or a JSON
    object mapping host names to such documents. ConfigError naming the file on bad input."""
    from slurmpod.config import read_input  # lazy: start-up

    hosts: set[str] = set()
    out: list[Neighbour] = []
    for path in paths:
        files = sorted(p for p in path.iterdir() if p.suffix == ".json") if path.is_dir() \
            else [path]
        if path.is_dir() and not files:
            raise ConfigError("no *.json files in this directory; save each node's `lldpcli -f "
                              "json show neighbors` as HOST.json", file=str(path))
        for f in files:
            raw = read_input(f, "save it with `lldpcli -f json show neighbors > HOST.json`")
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError:
                raise ConfigError("not text (binary data?); expected lldpcli JSON",
                                  file=str(f)) from None
            for host, doc, where in _documents(text, f):
                hosts.add(host)
                out.extend(parse_neighbours(doc, host, where))
    return LldpData(hosts, out, ", ".join(str(p) for p in paths))


def _documents(text: str, path: Path) -> Iterator[tuple[str, Any, str]]:
    lines = [ln for ln in text.splitlines() if ln.strip()]
    if not lines:
        raise ConfigError("empty file; expected `lldpcli -f json show neighbors` output",
                          file=str(path))
    first = _PDSH.match(lines[0])
    if first and not lines[0].lstrip().startswith(("{", "[", '"')):
        per: dict[str, list[str]] = {}
        for n, line in enumerate(lines, 1):
            m = _PDSH.match(line)
            if m is None:
                raise ConfigError(f"line {n} has no 'host: ' prefix; expected pdsh/clush output "
                                  "of `lldpcli -f json show neighbors`", file=str(path))
            per.setdefault(m.group(1), []).append(m.group(2))
        for host, body in per.items():
            yield short(host), _load("\n".join(body), f"{path} ({host})"), f"{path} ({host})"
        return
    doc = _load(text, str(path))
    if isinstance(doc, dict) and "lldp" not in doc and doc and all(
            isinstance(v, dict) and "lldp" in v for v in doc.values()):
        for host, sub in doc.items():
            yield short(host), sub, f"{path} ({host})"
        return
    yield short(path.stem), doc, str(path)


def _load(text: str, where: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"not valid JSON ({exc.msg} at line {exc.lineno}); expected "
                          "`lldpcli -f json show neighbors` output", file=where) from None


def _items(value: Any) -> list[tuple[str, Any]]:
    """lldpd's JSON: a key seen once is an object, seen several times a list of one-key
    objects. Either way: (key, value) pairs."""
    if isinstance(value, dict):
        return list(value.items())
    if isinstance(value, list):
        return [kv for v in value if isinstance(v, dict) for kv in v.items()]
    return []


def _first(value: Any) -> Any:
    """json0 wraps every value in a list; plain json does not."""
    while isinstance(value, list):
        if not value:
            return None
        value = value[0]
    return value


def _text(value: Any, key: str = "value") -> str:
    v = _first(value)
    if isinstance(v, dict):
        v = _first(v.get(key))
    return "" if v is None else str(v)


def parse_neighbours(doc: Any, host: str, where: str = "<lldp>") -> list[Neighbour]:
    """The neighbours in one node's `lldpcli -f json|json0 show neighbors` document."""
    lldp = doc.get("lldp") if isinstance(doc, dict) else None
    if lldp is None:
        raise ConfigError("no 'lldp' key; expected `lldpcli -f json show neighbors` output",
                          file=where)
    out: list[Neighbour] = []
    lldp = _first(lldp) if isinstance(lldp, list) else lldp
    if not isinstance(lldp, dict):
        return out
    raw = lldp.get("interface")
    if isinstance(raw, list) and raw and isinstance(raw[0], dict) and "name" in raw[0]:
        ifaces = [(str(i.get("name")), i) for i in raw]  # json0: [{"name": "eth0", ...}]
    else:
        ifaces = _items(raw)
    for ifname, body in ifaces:
        if not isinstance(body, dict):
            continue
        name, cid = _chassis(body.get("chassis"))
        port = _first(body.get("port")) or {}
        pid = _first(port.get("id")) if isinstance(port, dict) else None
        pid_type = str(pid.get("type", "")) if isinstance(pid, dict) else ""
        pid_value = _text(pid) if isinstance(pid, dict) else ""
        descr = _text(port.get("descr")) if isinstance(port, dict) else ""
        out.append(Neighbour(host, ifname, short(name), cid, pid_value, pid_type, descr, where))
    return out


def _chassis(value: Any) -> tuple[str, str]:
    c = _first(value)
    if not isinstance(c, dict):
        return "", ""
    if "id" in c:  # json0 (`name` is a key), or a chassis that sent no system name
        return _text(c.get("name")), _text(c.get("id"))
    for name, body in c.items():
        return str(name), _text(body.get("id")) if isinstance(body, dict) else ""
    return "", ""


# --- port names ------------------------------------------------------------------------------

_SWP = re.compile(r"swp(\d+)(?:s(\d+))?", re.I)
_ONYX = re.compile(r"Eth\d+/(\d+)(?:/(\d+))?", re.I)
_ETP = re.compile(r"etp(\d+)([a-h])?", re.I)


def port_number(name: str, cage_ports: int = 1) -> int | None:
    """The plan's 1-based port number of a switch port name; None when the name is in no
    convention this reads (module docstring)."""
    k = max(cage_ports, 1)
    if m := _SWP.fullmatch(name):
        cage, sub = int(m.group(1)), m.group(2)
        return (cage - 1) * k + (int(sub) if sub is not None else 0) + 1
    if m := _ONYX.fullmatch(name):
        cage, sub = int(m.group(1)), m.group(2)
        return (cage - 1) * k + (int(sub) if sub is not None else 1)
    if m := _ETP.fullmatch(name):
        cage, lane = int(m.group(1)), m.group(2)
        return (cage - 1) * k + (ord(lane.lower()) - ord("a") if lane else 0) + 1
    return None


def neighbour_port(nb: Neighbour, cage_ports: int = 1) -> int | None:
    """Port ID first when it names the port (subtype ifname/local), else the description."""
    candidates = [nb.port_id, nb.port_descr] if nb.port_id_type in ("ifname", "local") \
        else [nb.port_descr, nb.port_id]
    for c in candidates:
        if c and (p := port_number(c.strip(), cage_ports)) is not None:
            return p
    return None


def split_ports(plan: FabricPlan, data: LldpData) -> int:
    """Ports per cage: the plan's, or, when the site file leaves it at 1 but the switches name
    split ports (`swp3s1`), the most sub-ports seen (at least 2)."""
    k = plan.cage_ports
    if k > 1:
        return k
    subs = [int(m.group(2)) for nb in data.neighbours
            for name in (nb.port_id, nb.port_descr) if (m := _SWP.fullmatch(name.strip()))
            and m.group(2) is not None]
    return max(2, max(subs) + 1) if subs else 1


# --- checking --------------------------------------------------------------------------------

def netdev_map(site: Site) -> dict[str, dict[str, str]]:
    """node type -> {netdev: verbs device} of the site's HCAs."""
    return {t: {h.netdev: h.device for h in nt.hcas if h.netdev}
            for t, nt in site.node_types.items()}


def to_fabric(site: Site, plan: FabricPlan, data: LldpData,
              unread: list[Neighbour]) -> Fabric:
    """LLDP neighbours as a Fabric the IB check reads: a switch per chassis, a CA per NIC.
    Neighbours whose port name cannot be read are appended to `unread` (and left out)."""
    inv = site.inventory
    netdevs = netdev_map(site)
    planned = plan.by_name
    k = split_ports(plan, data)
    nodes: dict[str, FabricNode] = {}
    for nb in data.neighbours:
        sw_key = nb.chassis or nb.chassis_id
        if not sw_key:
            continue
        node = inv.by_name.get(nb.host)
        dev = netdevs.get(node.node_type, {}).get(nb.ifname) if node is not None else None
        if dev is None and sw_key not in planned:
            continue  # a management/other NIC on a switch outside the compute fabric
        num = neighbour_port(nb, k)
        if num is None:
            unread.append(nb)
            continue
        sw_id = f"S-{sw_key}"
        sw = nodes.get(sw_id)
        if sw is None:
            sw = nodes[sw_id] = FabricNode(sw_id, "switch", "Switch", 0, sw_key, None, 0)
        ca_id = f"H-{nb.host}/{nb.ifname}"
        desc = f"{nb.host} {dev or nb.ifname}"
        ca = nodes.get(ca_id)
        if ca is None:
            ca = nodes[ca_id] = FabricNode(ca_id, "ca", "Ca", 1, desc, None, 0)
        elif ca.ports:
            continue  # a second neighbour on one NIC (a hub, stale data): the first is checked
        # No rate in LLDP: tail None, so the check never calls such a link degraded.
        ca.ports[1] = Port(1, sw_id, num, None, 0)
        sw.ports.setdefault(num, Port(num, ca_id, 1, None, 0))
    return Fabric(nodes, data.source)


def node_plan(plan: FabricPlan, hosts: Iterable[str]) -> FabricPlan:
    """The plan's node cables of `hosts` and the leaves they reach; no uplinks (LLDP on the
    nodes sees only the first hop)."""
    keep = set(hosts)
    links = tuple(nl for nl in plan.node_links if nl.node in keep)
    leaves = {nl.leaf for nl in links}
    return replace(plan, leaves=tuple(s for s in plan.leaves if s.name in leaves), spines=(),
                   cores=(), node_links=links, leaf_uplinks=(), spine_core_links=())


def check_lldp(site: Site, plan: FabricPlan, data: LldpData,
               hca_filters: Sequence[re.Pattern[str]] = ()) -> CheckReport:
    """Check each node's rail NICs against the plan, as `check_fabric` does for IB."""
    from slurmpod.fabric.check import check_fabric  # lazy: start-up

    missing_netdev = sorted(t for t, nt in site.node_types.items()
                            if any(h.role == "compute" and not h.netdev for h in nt.hcas))
    if missing_netdev:
        raise ConfigError(f"node_types.{missing_netdev[0]}.hcas: every compute HCA needs "
                          "`netdev` (its Ethernet interface, e.g. eth0 or enp26s0np0) for "
                          "--lldp", hint="the netdev is the interface lldpd reports")
    inv = site.inventory
    known = {h for h in data.hosts if h in inv.by_name}
    unread: list[Neighbour] = []
    sub = node_plan(plan, known)
    fabric = to_fabric(site, plan, data, unread)
    report = check_fabric(site, sub, fabric, hca_filters)
    skip = {(nb.host, _device(site, nb)) for nb in unread}
    findings = [_lldp_wording(f, site, data) for f in report.findings
                if (f.node, f.hca) not in skip]
    from slurmpod.fabric.check import Finding  # lazy: start-up

    for nb in sorted(unread, key=lambda n: (n.host, n.ifname)):
        dev = _device(site, nb)
        findings.append(Finding(
            "lldp-unknown-port", "warning", f"{nb.host} {nb.ifname}",
            f"{nb.host} {nb.ifname} ({dev}) hears {nb.chassis or nb.chassis_id} port "
            f"{nb.port_id!r} (description {nb.port_descr!r}), a port name in no convention "
            "slurmpod reads, so its cable was not checked",
            "name switch ports swpN[sM] (Cumulus), EthA/N[/M] (Onyx) or send the etpN alias "
            "(SONiC) as the LLDP port ID or description", node=nb.host, hca=dev,
            switch=nb.chassis or nb.chassis_id))
    report.findings = findings
    report.stats["findings"] = len(findings)
    report.stats["nodes_with_lldp"] = len(known)
    absent = sorted(set(inv.by_name) - known)
    if absent:

        report.notes.append(f"{len(absent)} of {len(inv.by_name)} nodes sent no LLDP data and "
                            f"were not checked: {compress(absent)}")
    strangers = sorted(data.hosts - set(inv.by_name))
    if strangers and not any(f.kind == "unknown-node" for f in findings):
        report.notes.append(f"LLDP data of hosts not in the site file ignored (no compute "
                            f"switch heard): {', '.join(strangers[:5])}")
    if plan.cage_ports <= 1 and (k := split_ports(plan, data)) > 1:
        report.notes.append(f"switch ports are split (swpNsM) but fabric.ports_per_cage is not "
                            f"set: read as {k} ports per cage; set it in the site file")
    report.notes.append("LLDP: node-to-leaf cables only (leaf-to-spine cables and link rates "
                        "are not visible from the nodes)")
    return report


def _device(site: Site, nb: Neighbour) -> str:
    node = site.inventory.by_name.get(nb.host)
    if node is None:
        return nb.ifname
    return netdev_map(site).get(node.node_type, {}).get(nb.ifname, nb.ifname)


def _lldp_wording(f: Finding, site: Site, data: LldpData) -> Finding:
    """The IB check words missing cables in ibnetdiscover's terms; say it in LLDP's."""
    if f.kind == "missing-link" and f.node and f.hca:
        netdev = _netdev(site, f.node, f.hca)
        return replace(f, message=f"{f.node} {netdev} ({f.hca}) hears no LLDP neighbour; "
                       f"planned: {f.switch} port {f.port}" if f.switch else f.message,
                       fix=f"check `ip link show {netdev}` on {f.node} (link down?), the cable "
                       f"to {f.switch} port {f.port}, and that LLDP is enabled on that switch "
                       "port")
    if f.kind == "node-missing" and f.node:
        return replace(f, message=f"{f.node} sent LLDP data but hears no neighbour on any of its "
                       "rail NICs",
                       fix=f"check the rail NICs' links on {f.node} (`ip link`) and that lldpd "
                       "receives on them (`lldpcli show interfaces`)")
    if f.kind == "switch-missing":
        return replace(f, fix=f"no node heard {f.subject}: check that it is up and sends LLDP "
                       "(`lldpcli show neighbors` on one of its nodes)")
    return f


def _netdev(site: Site, node: str, hca: str) -> str:
    n = site.inventory.by_name.get(node)
    if n is None:
        return hca
    for h in site.node_types[n.node_type].hcas:
        if h.device == hca and h.netdev:
            return h.netdev
    return hca


# --- rehearsal -------------------------------------------------------------------------------

def port_name(port: int, cage_ports: int = 1) -> str:
    """Cumulus Linux name of a plan port: `swp5` unsplit, `swp3s0` on split cages."""
    if cage_ports <= 1:
        return f"swp{port}"
    return f"swp{(port - 1) // cage_ports + 1}s{(port - 1) % cage_ports}"


def synthesize(site: Site, plan: FabricPlan, swaps: Sequence[tuple[str, str]] = (),
               missing: Iterable[str] = (), moves: dict[str, tuple[str, int]] | None = None,
               names: dict[tuple[str, int], str] | None = None) -> dict[str, dict[str, Any]]:
    """What `lldpcli -f json show neighbors` prints on every node of a correctly cabled site,
    in lldpd 1.0.x's shape (object for one neighbour, list for several). Faults: `swaps`
    crosses two NICs (`NODE:NETDEV`), `missing` drops one neighbour (`NODE:NETDEV`), `moves`
    re-cables one (`NODE:NETDEV` -> (switch, port)), `names` overrides a port's name
    ((switch, port) -> name). Host -> document."""
    k = plan.cage_ports
    inv = site.inventory
    at: dict[tuple[str, str], tuple[str, int]] = {}
    for nl in plan.node_links:
        netdev = _netdev(site, nl.node, nl.hca)
        at[(nl.node, netdev)] = (nl.leaf, nl.port)
    for a, b in swaps:
        ka, kb = tuple(a.split(":", 1)), tuple(b.split(":", 1))
        at[ka], at[kb] = at[kb], at[ka]  # type: ignore[index]
    for m in missing:
        at.pop(tuple(m.split(":", 1)), None)  # type: ignore[arg-type]
    for m, to in (moves or {}).items():
        at[tuple(m.split(":", 1))] = to  # type: ignore[index]
    per: dict[str, list[dict[str, Any]]] = {n.name: [] for n in inv.nodes}
    macs: dict[str, str] = {}
    for (node, netdev), (leaf, port) in sorted(at.items()):
        i = len(macs)
        mac = macs.setdefault(leaf, f"1c:34:da:{i >> 16 & 255:02x}:{i >> 8 & 255:02x}:"
                                    f"{i & 255:02x}")
        name = (names or {}).get((leaf, port)) or port_name(port, k)
        per[node].append({netdev: {
            "via": "LLDP", "rid": str(list(macs).index(leaf) + 1), "age": "0 day, 01:00:00",
            "chassis": {leaf: {"id": {"type": "mac", "value": mac},
                               "descr": "Cumulus Linux 5.9.1 running on Nvidia SN5600",
                               "capability": [{"type": "Bridge", "enabled": True},
                                              {"type": "Router", "enabled": True}]}},
            "port": {"id": {"type": "ifname", "value": name}, "descr": name, "ttl": "120"}}})
    out: dict[str, dict[str, Any]] = {}
    for node, ifaces in per.items():
        if not ifaces:
            out[node] = {"lldp": {}}
        elif len(ifaces) == 1:
            out[node] = {"lldp": {"interface": ifaces[0]}}
        else:
            out[node] = {"lldp": {"interface": ifaces}}
    return out
