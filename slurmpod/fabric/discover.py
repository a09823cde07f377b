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

from slurmpod.errors import ConfigError
from slurmpod.fabric.ibnetdiscover import Fabric, FabricNode, Port


def natural_key(text: str) -> tuple[object, ...]:
    return tuple(int(p) if p.isdigit() else p for p in re.split(r"(\d+)", text))


@dataclass
class Discovered:
    sus: list[list[str]]  # hosts of each SU, in SU order, hosts in natural order
    su_leaves: list[dict[int, list[str]]]  # per SU: rail -> leaf switch names
    rails: list[str]  # HCA device per rail
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
    attach: dict[str, tuple[FabricNode, Port]] = {}
    for sw in fabric.switches():
        for port in sw.ports.values():
            peer = nodes.get(port.remote_id)
            if peer is not None and peer.kind != "switch":
                attach[peer.node_id] = (sw, port)
    for ca in fabric.cas():  # CAs whose switch section is not in the file
        if ca.node_id not in attach:
            for port in ca.ports.values():
                peer = nodes.get(port.remote_id)
                if peer is not None and peer.kind == "switch":
                    attach[ca.node_id] = (peer, port)
                    break

    compute: list[tuple[str, str, FabricNode, Port]] = []  # host, device, leaf, port
    apart: list[tuple[str, str]] = []
    sharp = False
    warnings: list[str] = []
    for ca in fabric.cas():
        if ca.is_aggregation_node:
            sharp = True
            continue
        host, dev = ca.host, ca.device
        if any(f.search(ca.desc) for f in hca_filters) or host is None:
            if host is not None and dev is not None:
                apart.append((host, dev))
            continue
        at = attach.get(ca.node_id)
        if at is None or dev is None:
            warnings.append(f"{ca.desc}: no switch link; left out")
            continue
        compute.append((host, dev, at[0], at[1]))
    if not compute:
        raise ConfigError("no compute HCAs found (no CA describes itself as 'HOST DEVICE')",
                          file=fabric.source,
                          hint="set node descriptions on the hosts, or loosen --hca-filter")

    hosts_of_dev: dict[str, set[str]] = defaultdict(set)
    all_hosts: set[str] = set()
    for host, dev, _sw, _p in compute:
        hosts_of_dev[dev].add(host)
        all_hosts.add(host)
    rails = sorted((d for d, hs in hosts_of_dev.items() if 2 * len(hs) >= len(all_hosts)),
                   key=natural_key)
    rail_of = {d: r for r, d in enumerate(rails)}
    odd = sorted(set(hosts_of_dev) - set(rail_of), key=natural_key)
    if odd:
        warnings.append(f"HCAs {', '.join(odd)} are on few hosts; left out of the rails (filter "
                        "them with --hca-filter if they are storage)")

    # Leaves and what they carry.
    leaf_hosts: dict[str, set[str]] = defaultdict(set)
    leaf_rails: dict[str, Counter[int]] = defaultdict(Counter)
    per_host_leaf: dict[str, Counter[str]] = defaultdict(Counter)
    gbps: Counter[int] = Counter()
    multi = 0
    for host, dev, sw, port in compute:
        r = rail_of.get(dev)
        if r is None:
            continue
        leaf = sw.node_id
        if host in leaf_hosts[leaf]:
            multi += 1
        leaf_hosts[leaf].add(host)
        leaf_rails[leaf][r] += 1
        per_host_leaf[host][leaf] += 1
        g = port.gbps
        if g:
            gbps[round(g)] += 1
    rail_optimised = multi * 2 < len(compute)

    # Merge leaves into SUs (rail-optimised) — or one SU per leaf (rack leaves).
    parent = {leaf: leaf for leaf in leaf_hosts}
    if rail_optimised:
        by_host: dict[str, list[str]] = defaultdict(list)
        for leaf, hs in leaf_hosts.items():
            for h in hs:
                by_host[h].append(leaf)
        for leaves in by_host.values():
            first = leaves[0]
            for other in leaves[1:]:
                a, b = _find(parent, first), _find(parent, other)
                if a != b and _overlap(leaf_hosts[first], leaf_hosts[other]) >= 0.5:
                    parent[b] = a
    group_hosts: dict[str, list[str]] = defaultdict(list)
    for host, leaves in per_host_leaf.items():
        votes: Counter[str] = Counter()
        for leaf, n in leaves.items():
            votes[_find(parent, leaf)] += n
        best = min(votes.items(), key=lambda kv: (-kv[1], natural_key(kv[0])))[0]
        group_hosts[best].append(host)
    groups = sorted(group_hosts, key=lambda g: natural_key(min(group_hosts[g], key=natural_key)))
    sus = [sorted(group_hosts[g], key=natural_key) for g in groups]
    su_leaves: list[dict[int, list[str]]] = []
    for g in groups:
        by_rail: dict[int, list[str]] = defaultdict(list)
        for leaf in leaf_hosts:
            if _find(parent, leaf) == g:
                r = leaf_rails[leaf].most_common(1)[0][0] if rail_optimised else 0
                by_rail[r].append(nodes[leaf].name or leaf)
        su_leaves.append(dict(sorted(by_rail.items())))
        if rail_optimised and len(by_rail) != len(rails):
            warnings.append(f"SU of {sus[len(su_leaves) - 1][0]}: {len(by_rail)} rail leaves for "
                            f"{len(rails)} rails; run `topo check` on the draft")

    # Upper tiers.
    leaf_ids = set(leaf_hosts)
    uplinks: Counter[str] = Counter()
    first_up: dict[str, int] = {}
    spine_ids: set[str] = set()
    spine_leaf_rails: dict[str, set[int]] = defaultdict(set)
    for leaf in leaf_ids:
        for port in nodes[leaf].ports.values():
            peer = nodes.get(port.remote_id)
            if peer is not None and peer.kind == "switch" and peer.node_id not in leaf_ids:
                uplinks[leaf] += 1
                first_up[leaf] = min(first_up.get(leaf, port.num), port.num)
                spine_ids.add(peer.node_id)
                if leaf_rails[leaf]:
                    spine_leaf_rails[peer.node_id].add(leaf_rails[leaf].most_common(1)[0][0])
    core_ids: set[str] = set()
    for sp in spine_ids:
        for port in nodes[sp].ports.values():
            peer = nodes.get(port.remote_id)
            if (peer is not None and peer.kind == "switch" and peer.node_id not in leaf_ids
                    and peer.node_id not in spine_ids):
                core_ids.add(peer.node_id)

    busiest = max((len(h) * (1 if rail_optimised else max(1, len(rails)))
                   for h in leaf_hosts.values()), default=1)
    up = max(uplinks.values(), default=0)
    over = max(1.0, busiest / up) if up else 1.0
    down_ports = min(first_up.values(), default=busiest + 1) - 1
    real_leaf = max((nodes[leaf].nports for leaf in leaf_ids), default=0)
    leaf_radix = _leaf_radix(real_leaf, down_ports, up, over)
    if leaf_radix is None:
        leaf_radix = max(real_leaf, busiest + up, 4)
        warnings.append(f"leaf ports: uplinks start at port {down_ports + 1}, which no leaf_radix "
                        "reproduces with the plan's rule; `topo check` will report wrong ports")
    if up and -(-busiest // over) != up:
        warnings.append(f"leaves have {up} uplinks for {busiest} nodes, which the plan's rule "
                        "(oversubscription >= 1) cannot reproduce")
    per_rail = rail_optimised and bool(spine_ids) and all(
        len(v) == 1 for v in spine_leaf_rails.values())
    groups_n = len({next(iter(v)) for v in spine_leaf_rails.values() if v}) if per_rail else 1
    real_spine = max((nodes[x].nports for x in spine_ids | core_ids), default=leaf_radix)
    spine_radix = real_spine
    if spine_ids and not core_ids and up:
        found = _spine_radix(real_spine, -(-len(leaf_ids) // groups_n), up,
                             -(-len(spine_ids) // groups_n))
        if found is None:
            warnings.append("no spine_radix gives the observed spines per group with the plan's "
                            "rule; review fabric.spine_radix")
        spine_radix = found or real_spine
    link = gbps.most_common(1)[0][0] if gbps else 400
    return Discovered(
        sus=sus, su_leaves=su_leaves, rails=rails,
        storage_hcas=sorted({d for h, d in apart if h in all_hosts}, key=natural_key),
        spines=sorted((nodes[s].name or s for s in spine_ids), key=natural_key),
        cores=sorted((nodes[c].name or c for c in core_ids), key=natural_key),
        link_gbps=link, leaf_radix=leaf_radix, spine_radix=max(spine_radix, 4),
        ports_seen=(real_leaf, real_spine),
        oversubscription=over, spine_groups="per_rail" if per_rail else "shared",
        rail_optimised=rail_optimised, sharp=sharp, kept_apart=len(apart), warnings=warnings,
    )


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
    from slurmpod.topology.fabric_plan import smallest_divisor_at_least

    for radix in (real, *range(max(4, leaves), 4 * (leaves * up) + 8)):
        need = -(-leaves * up // radix)
        if radix >= leaves and need <= up and smallest_divisor_at_least(up, need) == spines:
            return radix
    return None


def _overlap(a: set[str], b: set[str]) -> float:
    return len(a & b) / max(1, min(len(a), len(b)))


_NUM = re.compile(r"^(.*?)(\d+)([^\d]*)$")
_GPU_BY_GBPS = {  # a guess from the link rate; the draft marks it TODO
    400: ("h100", "H100 SXM5 80GB", 989, 80), 200: ("a100", "A100 SXM4 80GB", 312, 80),
    800: ("b200", "B200", 2250, 180),
}


def _naming(sus: list[list[str]], warnings: list[str]) -> tuple[str, int]:
    """A `naming.hostname` pattern with {n} and the first number, from the host names."""
    ordered = [h for su in sus for h in su]
    parts = [_NUM.match(h) for h in ordered]
    if all(parts):
        pre = {m.group(1) for m in parts if m}
        post = {m.group(3) for m in parts if m}
        digits = [m.group(2) for m in parts if m]
        if len(pre) == 1 and len(post) == 1:
            widths = {len(d) for d in digits}
            nums = [int(d) for d in digits]
            width = widths.pop() if len(widths) == 1 and digits[0].startswith("0") else 0
            fmt = f"{{n:0{width}d}}" if width else "{n}"
            pattern = f"{_braces(pre.pop())}{fmt}{_braces(post.pop())}"
            if nums != list(range(nums[0], nums[0] + len(nums))):
                warnings.append("host numbers are not consecutive in SU order; the draft numbers "
                                "them consecutively from the first: review naming and su_groups")
            return pattern, nums[0]
    warnings.append("host names do not share one PREFIX<number>SUFFIX pattern; the draft uses "
                    "the first host's pattern: review naming")
    m = _NUM.match(ordered[0])
    return (f"{m.group(1)}{{n}}" if m else "node{n:04d}"), int(m.group(2)) if m else 1


def _radix_note(radix: int, seen: int) -> str:
    if radix == seen or not seen:
        return ""
    return (f"  # the switches report {seen} ports; {radix} reproduces their cabling with the "
            "plan's port layout")


def _braces(text: str) -> str:
    return text.replace("{", "{{").replace("}", "}}")


def draft_site_toml(d: Discovered, name: str, source: str = "ibnetdiscover") -> str:
    """A site file `config.load_site` accepts; hardware fields it cannot see are TODO."""
    pattern, first = _naming(d.sus, d.warnings)
    model, gpu_name, peak, hbm = _GPU_BY_GBPS.get(d.link_gbps, ("gpu", "unknown GPU", 989, 80))
    n_rails = max(1, len(d.rails))
    gpus = 8
    lines = [
        f"# Draft site discovered by `slurmpod topo discover` from {source}.",
        "# The fabric (SUs, rails, switches, link rate) comes from the fabric; everything marked",
        "# TODO is a placeholder ibnetdiscover cannot see: fill it in before generating for real.",
        "",
        "[site]",
        f'name = "{name}"',
        f'description = "discovered: {sum(len(s) for s in d.sus)} nodes in {len(d.sus)} SUs"',
        "",
        "[slurm]",
        f'cluster_name = "{name}"',
        'topology = "tree"',
        "",
        "[node_types.discovered]",
        f"gpus = {gpus}  # TODO: GPUs per node",
        f'gpu = {{ model = "{model}", name = "{gpu_name}", peak_tflops_bf16 = {peak}, '
        f"hbm_gib = {hbm} }}  # TODO: guessed from the {d.link_gbps} Gb/s links",
        "sockets = 2  # TODO",
        "cores_per_socket = 56  # TODO",
        "threads_per_core = 2  # TODO",
        "memory_mib = 2000000  # TODO: RealMemory",
        "# TODO: real PCI bus ids and NUMA nodes (nvidia-smi topo -m; lspci -D | grep -i mellanox)",
        "gpu_pci = [",
    ]
    lines += [f'  {{ bus_id = "0000:{0x10 + i:02x}:00.0", numa = {i * 2 // gpus} }},'
              for i in range(gpus)]
    lines += ["]", "hcas = ["]
    for r, dev in enumerate(d.rails):
        lines.append(f'  {{ device = "{dev}", rail = {r}, bus_id = "0000:{0x80 + r:02x}:00.0", '
                     f"numa = {r * 2 // n_rails} }},")
    for i, dev in enumerate(d.storage_hcas):
        lines.append(f'  {{ device = "{dev}", role = "storage", bus_id = "0000:{0xc0 + i:02x}:00.0"'
                     f", numa = 1 }},")
    lines += ["]", ""]
    lines += [
        "[fabric]",
        'kind = "infiniband"',
        f"rails = {n_rails}",
        f"link_gbps = {d.link_gbps}",
        f"sharp = {'true' if d.sharp else 'false'}",
        f"rail_optimised = {'true' if d.rail_optimised else 'false'}",
        f"leaf_radix = {d.leaf_radix}" + _radix_note(d.leaf_radix, d.ports_seen[0]),
        f"spine_radix = {d.spine_radix}" + _radix_note(d.spine_radix, d.ports_seen[1]),
        f"oversubscription = {d.oversubscription!r}",
        f'spine_groups = "{d.spine_groups}"',
        "",
    ]
    # Consecutive SUs of one size form one group.
    runs: list[list[int]] = []
    for su in d.sus:
        if runs and runs[-1][1] == len(su):
            runs[-1][0] += 1
        else:
            runs.append([1, len(su)])
    for count, size in runs:
        lines += ["[[su_groups]]", 'node_type = "discovered"', f"sus = {count}",
                  f"nodes_per_su = {size}",
                  f"nodes_per_rack = {size}  # TODO: racks are invisible to ibnetdiscover", ""]
    lines += ["[naming]", f'hostname = "{pattern}"', f"first_node = {first}", ""]
    return "\n".join(lines)
