"""Derive a site from a fabric: node -> leaf -> spine tree, SUs, rails, and a draft site file.

For sites that have no site file yet. The rules:

* Compute HCAs are CAs whose node description names a host (`HOST DEVICE`), minus SHARP
  aggregation nodes and whatever `--hca-filter` rules exclude (storage/management HCAs).
* Rails come from HCA names: the devices present on most hosts, in natural order
  (`mlx5_0 < mlx5_3 < mlx5_10`), are rails 0..R-1, as `NCCL_IB_HCA` lists them.
* Leaves are switches that carry compute HCAs; rail leaves whose node sets overlap by at least
  half are merged into one logical SU (NVIDIA topograph merges switches with identical child
  sets; the overlap rule keeps one miscabled node from splitting an SU). Each host belongs to
  the SU most of its HCAs reach.
* Spines connect leaves; cores connect spines. Link rate, radixes and oversubscription are read
  off the fabric; hardware details ibnetdiscover cannot see (GPUs, PCI ids, NUMA, memory) are
  placeholders marked TODO in the draft.

Pure: parsed fabric in, `Discovered` and TOML text out.
"""

from __future__ import annotations

import re
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from slurmpod.errors import ConfigError
from slurmpod.fabric.ibnetdiscover import Fabric, FabricNode, Port, host_device
from slurmpod.model.hostlist import compress


def natural_key(text: str) -> tuple[object, ...]:
    return tuple(int(p) if p.isdigit() else p for p in re.split(r"(\d+)", text))


@dataclass
class Discovered:
    sus: list[list[str]]  # hosts of each SU, in SU order, each SU in leaf-port order
    su_leaves: list[dict[int, list[str]]]  # per SU: rail -> leaf switch names
    rails: list[str]  # HCA device per rail (of the most common node type)
    storage_hcas: list[str]  # devices kept apart that sit on compute hosts
    spines: list[str]
    cores: list[str]
    link_gbps: int
    leaf_radix: int
    spine_radix: int
    ports_seen: tuple[int, int]  # port counts the leaves and spines report (`Switch N`)
    oversubscription: float
    spine_groups: str
    rail_optimised: bool
    sharp: bool
    kept_apart: int
    warnings: list[str] = field(default_factory=list)
    # Node types: their rail devices in rail order, and which type each SU has.
    type_rails: list[list[str]] = field(default_factory=list)
    su_type: list[int] = field(default_factory=list)
    switch_model: str = ""  # from the switches' device id, when known
    uplink_cabling: str = "spread"
    unnamed: int = 0  # CAs with unset descriptions, left out

    def summary(self) -> dict[str, object]:
        return {
            "nodes": sum(len(s) for s in self.sus), "sus": len(self.sus),
            "rails": len(self.rails), "rail_hcas": self.rails,
            "leaves": sum(len(v) for su in self.su_leaves for v in su.values()),
            "spines": len(self.spines), "cores": len(self.cores),
            "link_gbps": self.link_gbps, "spine_groups": self.spine_groups,
            "kept_apart": self.kept_apart, "warnings": self.warnings,
            "su_hosts": [[s[0], s[-1], len(s)] for s in self.sus],
        }


def _find(parent: dict[str, str], x: str) -> str:
    while parent[x] != x:
        parent[x] = parent[parent[x]]
        x = parent[x]
    return x


def discover_site(fabric: Fabric, hca_filters: Sequence[re.Pattern[str]] = ()) -> Discovered:
    nodes = fabric.nodes
    warnings: list[str] = []
    cas = _sort_cas(fabric, _attach_cas(fabric), hca_filters, warnings)
    types, host_type = _node_types(cas.compute, warnings)
    rails = list(types[0])
    rail_of_type = [{d: r for r, d in enumerate(t)} for t in types]
    compute = [c for c in cas.compute if c[0] in host_type]
    leaves = _read_leaves(compute, host_type, rail_of_type)
    root, group_hosts, groups = _group_leaves_into_sus(leaves)
    sus = _order_sus(leaves, group_hosts, groups, warnings)
    su_type = _su_types(sus, host_type, warnings)
    su_leaves = _su_rail_leaves(nodes, leaves, root, groups, sus, len(rails), warnings)
    tiers = _upper_tiers(nodes, leaves)
    sizes = _radixes(nodes, leaves, tiers, len(rails), cas.an_switches, warnings)
    leaf_ids = set(leaves.hosts)
    link = leaves.gbps.most_common(1)[0][0] if leaves.gbps else 400
    model = _model(nodes[next(iter(leaf_ids))]) if leaf_ids else ""
    cage = model and _cage_pairs(nodes, leaf_ids, sizes.down_ports)
    all_hosts = set(host_type)
    return Discovered(
        type_rails=[list(t) for t in types], su_type=su_type, switch_model=model,
        uplink_cabling="cage" if cage else "spread", unnamed=cas.unnamed,
        sus=sus, su_leaves=su_leaves, rails=rails,
        storage_hcas=sorted({d for h, d in cas.apart if h in all_hosts}, key=natural_key),
        spines=sorted((nodes[s].name or s for s in tiers.spine_ids), key=natural_key),
        cores=sorted((nodes[c].name or c for c in tiers.core_ids), key=natural_key),
        link_gbps=link, leaf_radix=sizes.leaf_radix, spine_radix=max(sizes.spine_radix, 4),
        ports_seen=(sizes.real_leaf, sizes.real_spine),
        oversubscription=sizes.over, spine_groups="per_rail" if sizes.per_rail else "shared",
        rail_optimised=leaves.rail_optimised, sharp=cas.sharp, kept_apart=len(cas.apart),
        warnings=warnings,
    )


@dataclass
class _CAs:
    """The fabric's CAs, sorted: compute HCAs with their leaf port, and the rest counted."""

    # (host, device, leaf, leaf-side port) of each compute HCA
    compute: list[tuple[str, str, FabricNode, Port]] = field(default_factory=list)
    apart: list[tuple[str, str]] = field(default_factory=list)  # (host, device) kept apart
    sharp: bool = False  # a SHARP aggregation node was seen
    an_switches: set[str] = field(default_factory=set)  # switches holding an aggregation node
    unnamed: int = 0  # CAs with the driver's default description


@dataclass
class _Leaves:
    """Leaf switches (by fabric id) and what they carry."""

    hosts: dict[str, set[str]]
    rails: dict[str, Counter[int]]  # leaf -> rail -> HCAs seen
    per_host: dict[str, Counter[str]]  # host -> leaf -> its HCAs there
    host_ports: dict[str, dict[int, int]]  # host -> rail -> leaf port
    gbps: Counter[int]  # link rates seen
    rail_optimised: bool


@dataclass
class _Tiers:
    """What sits above the leaves."""

    uplinks: Counter[str]  # leaf -> uplink count
    first_up: dict[str, int]  # leaf -> its first uplink port
    spine_ids: set[str]
    spine_leaf_rails: dict[str, set[int]]  # spine -> rails of the leaves below it
    core_ids: set[str]


@dataclass
class _Radixes:
    leaf_radix: int
    spine_radix: int
    real_leaf: int  # ports the leaves report
    real_spine: int
    over: float  # oversubscription
    down_ports: int  # leaf ports before the first uplink
    per_rail: bool  # spines grouped per rail


def _attach_cas(fabric: Fabric) -> dict[str, tuple[FabricNode, Port]]:
    """Where each CA is cabled, as the switch-side port.

    Read from the CA's own port line (one per HCA, not the 600k switch ports of a 100k-GPU
    fabric); the switches only for CAs printed without port lines.
    """
    nodes = fabric.nodes
    attach: dict[str, tuple[FabricNode, Port]] = {}
    orphans = False
    for ca in fabric.cas():
        for num, port in ca.ports.items():
            sw = nodes.get(port.remote_id)
            if sw is not None and sw.kind == "switch":
                back = sw.ports.get(port.remote_port)
                if back is None or back.remote_id != ca.node_id:
                    back = Port(port.remote_port, ca.node_id, num, port.tail, port.line)
                attach[ca.node_id] = (sw, back)
                break
        else:
            orphans = True
    if orphans:
        for sw in fabric.switches():
            for port in sw.ports.values():
                peer = nodes.get(port.remote_id)
                if peer is not None and peer.kind != "switch" and peer.node_id not in attach:
                    attach[peer.node_id] = (sw, port)
    return attach


def _sort_cas(fabric: Fabric, attach: dict[str, tuple[FabricNode, Port]],
              hca_filters: Sequence[re.Pattern[str]], warnings: list[str]) -> _CAs:
    """Compute HCAs, kept-apart ones, SHARP aggregation nodes, unnamed CAs."""
    cas = _CAs()
    named = {ca.node_id: host_device(ca.desc) for ca in fabric.cas()}
    short = _short_names({h for h, _d in named.values() if h is not None and "." in h})
    for ca in fabric.cas():
        if ca.is_aggregation_node:
            cas.sharp = True
            at = attach.get(ca.node_id)
            if at is not None:
                cas.an_switches.add(at[0].node_id)
            continue
        host, dev = named[ca.node_id]
        if host is not None and short:
            host = short.get(host, host)
        if any(f.search(ca.desc) for f in hca_filters) or host is None:
            if host is not None and dev is not None:
                cas.apart.append((host, dev))
            elif host is None:
                cas.unnamed += 1
            continue
        at = attach.get(ca.node_id)
        if at is None or dev is None:
            warnings.append(f"{ca.desc}: no switch link; left out")
            continue
        cas.compute.append((host, dev, at[0], at[1]))
    if not cas.compute:
        raise ConfigError("no compute HCAs found (no CA describes itself as 'HOST DEVICE')",
                          file=fabric.source,
                          hint="set node descriptions on the hosts (rdma-core's rdma-ndd), or "
                          "loosen --hca-filter")
    if cas.unnamed:
        warnings.append(f"{cas.unnamed} CAs have the driver's default node description and name "
                        "no host; they are left out of the draft (set their descriptions with "
                        "rdma-ndd and rerun)")
    return cas


def _node_types(compute: list[tuple[str, str, FabricNode, Port]],
                warnings: list[str]) -> tuple[list[tuple[str, ...]], dict[str, int]]:
    """Node types by the devices their hosts show, and each host's type.

    A host missing a device (a link down) joins the type whose devices include its own.
    """
    devs_of: dict[str, set[str]] = defaultdict(set)
    for host, dev, _sw, _p in compute:
        devs_of[host].add(dev)
    tuples = Counter(tuple(sorted(d, key=natural_key)) for d in devs_of.values())
    majors = sorted(tuples, key=lambda t: (-tuples[t], -len(t), t))
    kept: list[tuple[str, ...]] = []
    for t in majors:
        if not any(set(t) < set(k) for k in kept):
            kept.append(t)
    width = Counter(len(t) for t in kept for _ in range(tuples[t])).most_common(1)[0][0]
    types = [t for t in kept if len(t) == width]
    for t in kept:
        if len(t) != width:
            warnings.append(f"hosts with HCAs {', '.join(t)} have {len(t)} compute HCAs, "
                            f"not {width}; they are left out (one rail count per site)")
    host_type: dict[str, int] = {}
    for host, devs in devs_of.items():
        for i, t in enumerate(types):
            if devs <= set(t):
                host_type[host] = i
                break
    return types, host_type


def _read_leaves(compute: list[tuple[str, str, FabricNode, Port]], host_type: dict[str, int],
                 rail_of_type: list[dict[str, int]]) -> _Leaves:
    """Leaves and what they carry; rail-optimised when most leaves see a host once."""
    leaves = _Leaves(defaultdict(set), defaultdict(Counter), defaultdict(Counter),
                     defaultdict(dict), Counter(), False)
    multi = 0
    for host, dev, sw, port in compute:
        r = rail_of_type[host_type[host]].get(dev)
        if r is None:
            continue
        leaves.host_ports[host][r] = port.num
        leaf = sw.node_id
        if host in leaves.hosts[leaf]:
            multi += 1
        leaves.hosts[leaf].add(host)
        leaves.rails[leaf][r] += 1
        leaves.per_host[host][leaf] += 1
        link_gbps = port.gbps
        if link_gbps:
            leaves.gbps[round(link_gbps)] += 1
    leaves.rail_optimised = multi * 2 < len(compute)
    return leaves


def _group_leaves_into_sus(
        leaves: _Leaves) -> tuple[dict[str, str], dict[str, list[str]], list[str]]:
    """Merge leaves into SUs (rail-optimised) — or one SU per leaf (rack leaves).

    Returns each leaf's SU root, the hosts of each root (each host where most of its HCAs
    are), and the roots in the order of their first host.
    """
    leaf_hosts = leaves.hosts
    parent = {leaf: leaf for leaf in leaf_hosts}
    if leaves.rail_optimised:
        by_host: dict[str, list[str]] = defaultdict(list)
        for leaf, hs in leaf_hosts.items():
            for h in hs:
                by_host[h].append(leaf)
        for host_leaves in by_host.values():
            first = host_leaves[0]
            for other in host_leaves[1:]:
                a, b = _find(parent, first), _find(parent, other)
                if a != b and _overlap(leaf_hosts[first], leaf_hosts[other]) >= 0.5:
                    parent[b] = a
    group_hosts: dict[str, list[str]] = defaultdict(list)
    root = {leaf: _find(parent, leaf) for leaf in parent}
    for host, host_leaves_n in leaves.per_host.items():
        votes: Counter[str] = Counter()
        for leaf, n in host_leaves_n.items():
            votes[root[leaf]] += n
        best = next(iter(votes)) if len(votes) == 1 else \
            min(votes.items(), key=lambda kv: (-kv[1], natural_key(kv[0])))[0]
        group_hosts[best].append(host)
    groups = sorted(group_hosts, key=lambda g: natural_key(min(group_hosts[g], key=natural_key)))
    return root, group_hosts, groups


def _order_sus(leaves: _Leaves, group_hosts: dict[str, list[str]], groups: list[str],
               warnings: list[str]) -> list[list[str]]:
    """Each SU in leaf-port order: the plan puts the s-th node of an SU in port s+1."""
    host_ports = leaves.host_ports

    def port_order(h: str) -> tuple[int, tuple[object, ...]]:
        ports = host_ports[h]
        return (ports[min(ports)] if ports else 0, natural_key(h))

    sus = [sorted(group_hosts[g], key=port_order) for g in groups]
    for su in sus:
        seen_ports = [port_order(h)[0] for h in su]
        if leaves.rail_optimised and seen_ports != list(range(1, len(su) + 1)):
            warnings.append(f"the SU of {su[0]} uses leaf ports {_ranges(seen_ports)}, not "
                            f"1-{len(su)}; `topo check` of the draft reports wrong ports")
            break
    return sus


def _su_types(sus: list[list[str]], host_type: dict[str, int], warnings: list[str]) -> list[int]:
    """Each SU's node type: that of most of its hosts."""
    su_type: list[int] = []
    for su in sus:
        votes_t = Counter(host_type[h] for h in su)
        su_type.append(votes_t.most_common(1)[0][0])
        if len(votes_t) > 1:
            warnings.append(f"the SU of {su[0]} mixes node types; the draft gives it one type")
    return su_type


def _su_rail_leaves(nodes: dict[str, FabricNode], leaves: _Leaves, root: dict[str, str],
                    groups: list[str], sus: list[list[str]], n_rails: int,
                    warnings: list[str]) -> list[dict[int, list[str]]]:
    """Per SU: rail -> the names of its leaf switches."""
    su_leaves: list[dict[int, list[str]]] = []
    members: dict[str, list[str]] = defaultdict(list)
    for leaf in leaves.hosts:
        members[root[leaf]].append(leaf)
    for g in groups:
        by_rail: dict[int, list[str]] = defaultdict(list)
        for leaf in members[g]:
            r = leaves.rails[leaf].most_common(1)[0][0] if leaves.rail_optimised else 0
            by_rail[r].append(nodes[leaf].name or leaf)
        su_leaves.append(dict(sorted(by_rail.items())))
        if leaves.rail_optimised and len(by_rail) != n_rails:
            warnings.append(f"SU of {sus[len(su_leaves) - 1][0]}: {len(by_rail)} rail leaves for "
                            f"{n_rails} rails; run `topo check` on the draft")
    return su_leaves


def _upper_tiers(nodes: dict[str, FabricNode], leaves: _Leaves) -> _Tiers:
    """Spines (switches the leaves uplink to) and cores (switches above the spines)."""
    leaf_ids = set(leaves.hosts)
    tiers = _Tiers(Counter(), {}, set(), defaultdict(set), set())
    for leaf in leaf_ids:
        for port in nodes[leaf].ports.values():
            peer = nodes.get(port.remote_id)
            if peer is not None and peer.kind == "switch" and peer.node_id not in leaf_ids:
                tiers.uplinks[leaf] += 1
                tiers.first_up[leaf] = min(tiers.first_up.get(leaf, port.num), port.num)
                tiers.spine_ids.add(peer.node_id)
                if leaves.rails[leaf]:
                    tiers.spine_leaf_rails[peer.node_id].add(
                        leaves.rails[leaf].most_common(1)[0][0])
    for sp in tiers.spine_ids:
        for port in nodes[sp].ports.values():
            peer = nodes.get(port.remote_id)
            if (peer is not None and peer.kind == "switch" and peer.node_id not in leaf_ids
                    and peer.node_id not in tiers.spine_ids):
                tiers.core_ids.add(peer.node_id)
    return tiers


def _radixes(nodes: dict[str, FabricNode], leaves: _Leaves, tiers: _Tiers, n_rails: int,
             an_switches: set[str], warnings: list[str]) -> _Radixes:
    """Radixes, oversubscription and spine grouping that the plan's rules reproduce."""
    leaf_ids = set(leaves.hosts)
    rail_optimised = leaves.rail_optimised
    spine_ids, core_ids = tiers.spine_ids, tiers.core_ids
    busiest = max((len(h) * (1 if rail_optimised else max(1, n_rails))
                   for h in leaves.hosts.values()), default=1)
    up = max(tiers.uplinks.values(), default=0)
    over = max(1.0, busiest / up) if up else 1.0
    down_ports = min(tiers.first_up.values(), default=busiest + 1) - 1
    # A Quantum switch counts its SHARP aggregation node's port (65 on a 64-port QM9700).
    real_leaf = max((_radix(nodes[leaf], an_switches) for leaf in leaf_ids), default=0)
    leaf_radix = _leaf_radix(real_leaf, down_ports, up, over)
    if leaf_radix is None:
        leaf_radix = max(real_leaf, busiest + up, 4)
        warnings.append(f"leaf ports: uplinks start at port {down_ports + 1}, which no leaf_radix "
                        "reproduces with the plan's rule; `topo check` will report wrong ports")
    if up and -(-busiest // over) != up:
        warnings.append(f"leaves have {up} uplinks for {busiest} nodes, which the plan's rule "
                        "(oversubscription >= 1) cannot reproduce")
    per_rail = rail_optimised and bool(spine_ids) and all(
        len(v) == 1 for v in tiers.spine_leaf_rails.values())
    groups_n = len({next(iter(v)) for v in tiers.spine_leaf_rails.values() if v}) \
        if per_rail else 1
    real_spine = max((_radix(nodes[x], an_switches) for x in spine_ids | core_ids),
                     default=leaf_radix)
    spine_radix = real_spine
    if spine_ids and not core_ids and up:
        found = _spine_radix(real_spine, -(-len(leaf_ids) // groups_n), up,
                             -(-len(spine_ids) // groups_n))
        if found is None:
            warnings.append("no spine_radix gives the observed spines per group with the plan's "
                            "rule; review fabric.spine_radix")
        spine_radix = found or real_spine
    return _Radixes(leaf_radix, spine_radix, real_leaf, real_spine, over, down_ports, per_rail)


def _leaf_radix(real: int, down_ports: int, up: int, over: float) -> int | None:
    """A radix whose plan layout (downlinks 1..D, D = floor(R·o/(1+o))) puts the first uplink
    where the fabric has it; the real port count first."""
    lo = max(4, down_ports + up)
    for radix in (real, *range(lo, 4 * lo + 8)):
        if radix >= lo and int(radix * over / (1 + over)) == down_ports:
            return radix
    return None


def _spine_radix(real: int, leaves: int, up: int, spines: int) -> int | None:
    """A spine radix for which the plan's rule (the smallest divisor S of U with
    S >= ceil(L·U / radix)) gives the observed spines per group; the real port count first."""
    from slurmpod.topology.fabric_plan import smallest_divisor_at_least  # lazy: start-up

    for radix in (real, *range(max(4, leaves), 4 * (leaves * up) + 8)):
        need = -(-leaves * up // radix)
        if radix >= leaves and need <= up and smallest_divisor_at_least(up, need) == spines:
            return radix
    return None


# Switch ASIC device ids (the `devid=` line) of NVIDIA Quantum switches, and the model a site
# file names: Quantum-2 (MT54002) is the QM9700/QM9790 with twin-port OSFP cages.
_SWITCH_DEVID = {"0xd2f2": "QM9700", "0xcf08": "QM8700"}


def _model(sw: FabricNode) -> str:
    return _SWITCH_DEVID.get(sw.ids.get("devid", "").lower(), "")


def _radix(sw: FabricNode, an_switches: set[str]) -> int:
    return sw.nports - 1 if sw.node_id in an_switches else sw.nports


def _cage_pairs(nodes: dict[str, FabricNode], leaf_ids: set[str], down: int) -> bool:
    """True when every leaf's uplink cages (port pairs 2c-1, 2c) each go to one switch."""
    seen = False
    for leaf in leaf_ids:
        ports = nodes[leaf].ports
        for num, port in ports.items():
            peer = nodes.get(port.remote_id)
            if num <= down or num % 2 == 0 or peer is None or peer.kind != "switch":
                continue
            twin = ports.get(num + 1)
            if twin is None or twin.remote_id != port.remote_id:
                return False
            seen = True
    return seen


def _short_names(fqdns: set[str]) -> dict[str, str]:
    """FQDN -> short host name (slurmd registers under its short name), when that is unique."""
    if not fqdns:
        return {}
    by_short: dict[str, set[str]] = defaultdict(set)
    for f in fqdns:
        by_short[f.split(".", 1)[0]].add(f)
    return {f: sh for sh, fs in by_short.items() if len(fs) == 1 for f in fs}


def _ranges(nums: list[int]) -> str:

    return compress(f"p{n}" for n in nums).removeprefix("p").strip("[]")


def _overlap(a: set[str], b: set[str]) -> float:
    return len(a & b) / max(1, min(len(a), len(b)))


_GPU_BY_GBPS = {  # a guess from the link rate; the draft marks it TODO
    400: ("h100", "H100 SXM5 80GB", 989, 80), 200: ("a100", "A100 SXM4 80GB", 312, 80),
    800: ("b200", "B200", 2250, 180),
}


def _radix_note(key: str, radix: int, seen: int) -> list[str]:
    if radix == seen or not seen:
        return []
    return [f"# fabric.{key} = {radix}: the switches report {seen} ports; {radix} reproduces "
            "their cabling with the plan's port layout"]


def draft_site_toml(d: Discovered, name: str, source: str = "ibnetdiscover") -> str:
    """A site file `config.load_site` accepts; hardware fields it cannot see are TODO.

    Host names are the ones the fabric showed, written as a Slurm hostlist per SU group
    (`su_groups.hosts`, each SU in leaf-port order): never a name derived from a pattern.
    Written with tomli-w, which writes no comments: what is a placeholder, and why, is said in
    the header."""
    import tomli_w  # lazy: start-up (tomli_w only when used)

    model, gpu_name, peak, hbm = _GPU_BY_GBPS.get(d.link_gbps, ("gpu", "unknown GPU", 989, 80))
    n_rails = max(1, len(d.rails))
    gpus = 8
    head = [
        f"# Draft site discovered by `slurmpod topo discover` from {source}.",
        "# The fabric (SUs, rails, switches, link rate, host names) comes from the fabric;",
        "# everything below marked TODO is a placeholder ibnetdiscover cannot see: fill it in",
        "# before generating for real.",
        "# TODO node_types.*: gpus (GPUs per node), sockets, cores_per_socket, threads_per_core,",
        "#   memory_mib (RealMemory);",
        f"#   gpu: guessed from the {d.link_gbps} Gb/s links;",
        "#   gpu_pci and hcas: real PCI bus ids and NUMA nodes (nvidia-smi topo -m;",
        "#   lspci -D | grep -i mellanox).",
        "# TODO su_groups.nodes_per_rack: racks are invisible to ibnetdiscover.",
        *_radix_note("leaf_radix", d.leaf_radix, d.ports_seen[0]),
        *_radix_note("spine_radix", d.spine_radix, d.ports_seen[1]),
    ]
    if d.switch_model:
        head.append("# fabric.switch_model: from the switches' device id.")
    type_rails = d.type_rails or [d.rails]
    type_names = ["discovered"] + [f"discovered-{i + 1}" for i in range(1, len(type_rails))]
    node_types: dict[str, Any] = {}
    for t_name, rails in zip(type_names, type_rails, strict=True):
        hcas: list[dict[str, Any]] = [
            {"device": dev, "rail": r, "bus_id": f"0000:{0x80 + r:02x}:00.0",
             "numa": r * 2 // n_rails} for r, dev in enumerate(rails)]
        hcas += [{"device": dev, "role": "storage", "bus_id": f"0000:{0xc0 + i:02x}:00.0",
                  "numa": 1} for i, dev in enumerate(x for x in d.storage_hcas if x not in rails)]
        node_types[t_name] = {
            "gpus": gpus, "sockets": 2, "cores_per_socket": 56, "threads_per_core": 2,
            "memory_mib": 2000000,
            "gpu": {"model": model, "name": gpu_name, "peak_tflops_bf16": peak, "hbm_gib": hbm},
            "gpu_pci": [{"bus_id": f"0000:{0x10 + i:02x}:00.0", "numa": i * 2 // gpus}
                        for i in range(gpus)],
            "hcas": hcas,
        }
    fabric: dict[str, Any] = {
        "kind": "infiniband", "rails": n_rails, "link_gbps": d.link_gbps, "sharp": d.sharp,
        "rail_optimised": d.rail_optimised, "leaf_radix": d.leaf_radix,
        "spine_radix": d.spine_radix, "oversubscription": d.oversubscription,
        "spine_groups": d.spine_groups,
    }
    if d.switch_model:
        fabric["switch_model"] = d.switch_model
    if d.uplink_cabling != "spread":
        fabric["uplink_cabling"] = d.uplink_cabling
    body = {
        "site": {"name": name,
                 "description": f"discovered: {sum(len(s) for s in d.sus)} nodes in "
                                f"{len(d.sus)} SUs"},
        "slurm": {"cluster_name": name, "topology": "tree"},
        "node_types": node_types,
        "fabric": fabric,
    }
    parts = ["\n".join(head) + "\n\n" + tomli_w.dumps(body)]
    # Consecutive SUs of one size and node type form one group; hosts as seen, SU by SU.
    # `[[su_groups]]` tables as the example sites write them (tomli-w would inline them).
    su_type = d.su_type or [0] * len(d.sus)
    runs: list[list[int]] = []  # [first SU, count, size, type]
    for i, su in enumerate(d.sus):
        if runs and runs[-1][2] == len(su) and runs[-1][3] == su_type[i]:
            runs[-1][1] += 1
        else:
            runs.append([i, 1, len(su), su_type[i]])
    for first, count, size, t in runs:
        hosts = [h for su in d.sus[first:first + count] for h in su]
        parts.append("[[su_groups]]\n" + tomli_w.dumps({
            "node_type": type_names[t], "sus": count, "nodes_per_su": size,
            "nodes_per_rack": size, "hosts": compress(hosts)}))
    return "\n".join(parts)
