"""The expected physical fabric of a site: switches, and every cable, derived from the site file.

Pure (no I/O). `plan_fabric(site)` returns a `FabricPlan` that the artefact generators
(`cabling.csv`, `rails.csv`, `topo show`) and the fabric checker (ibnetdiscover synthesis and
comparison) share, so "what the site file says" has exactly one definition.

Rules (documented in docs/admin-guide.md, "Fabric plan"):

* Leaf ports: a leaf of radix R with oversubscription o has D = floor(R·o/(1+o)) downlink ports
  (1..D) and uplink ports D+1.. above them (`Site.leaf_downlinks`).
* Rail-optimised: one leaf per (SU, rail). The node at position s of its SU (`Node.su_slot`)
  plugs its rail-k HCA into the SU's rail-k leaf at port s+1. This is the SHARP invariant: a leaf
  only ever sees one HCA rail (NVIDIA DGX SuperPOD reference architecture; HPC-X SHARP docs).
* Not rail-optimised: one leaf per rack; the node in rack slot t plugs its h-th compute HCA into
  port t·H + h + 1 (H compute HCAs per node).
* Uplinks per leaf: U = min(R - D, ceil(max downlinks used on any leaf / o)) — as many as the
  oversubscription asks for the busiest leaf, never more than the free ports; every leaf
  cables the same U.
* Spine groups: "per_rail" puts the rail-k leaves of all SUs under the rail-k spines (one group
  per rail, SuperPOD style); "shared" puts all leaves under one group (always so when the fabric
  is not rail-optimised).
* Two tiers while a group has L ≤ spine_radix leaves. Spines per group: the smallest divisor S of
  U with S ≥ ceil(L·U / spine_radix), so every leaf has exactly U/S links to every spine and no
  spine runs out of ports (S = U always qualifies when L ≤ spine_radix). DGX H100 SuperPOD,
  4 SU × 32 nodes, radix 64, shared spines: U = 32, L = 32 -> S = 16 (1, 2, 3 SUs: 4, 8, 16),
  the spine counts of NVIDIA's reference architecture (DGX SuperPOD H100 RA, Table 4).
* Three tiers when L > spine_radix: leaves form spine blocks of B = spine_radix/2 leaves (a
  multiple of the rail count for shared groups), because a spine that also has a core above it
  keeps half its ports for uplinks (non-blocking). Each block gets S_b spines by the same divisor
  rule with spine_radix/2 downlinks per spine; every spine has as many uplinks as downlinks of a
  full block. Spine j of every block belongs to core plane j; a plane of P blocks has C cores,
  the smallest divisor of the spine uplink count with C ≥ ceil(P·uplinks / spine_radix). Needs
  P ≤ spine_radix; a bigger site is rejected by the site validator (four tiers are out of scope).
* Link spreading: link i (counting leaf by leaf, then uplink by uplink) of a group goes to
  spine i mod S at spine port i div S + 1, which fills every spine port densely and spreads each
  leaf evenly. Spine-to-core links use the same rule within a plane. With
  `uplink_cabling = "cage"` the unit is a cage (two ports of a twin-port OSFP cage go to one
  spine, into one spine cage) when the cages divide evenly over the spines.
* What the check holds a fabric to between switch tiers is the *count* of links each lower
  switch has to each upper switch, not the ports (fabric/switch_links.py): the subnet manager
  routes over any port, and sites cable cages in pairs or singly as their optics dictate.

A site with a single leaf in all has no spines (tiers = 1).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import TYPE_CHECKING, Literal, NamedTuple

if TYPE_CHECKING:
    from slurmpod.model.site import Site

_new = tuple.__new__

Tier = Literal["leaf", "spine", "core"]


@dataclass(frozen=True, slots=True)
class Switch:
    """One physical switch. Ports are numbered from 1, as on the switch's front panel."""

    name: str
    tier: Tier
    radix: int
    group: int  # spine group: the rail for per_rail groups, 0 for a shared group
    su: int | None = None  # leaf of a rail-optimised fabric: 0-based SU index
    rail: int | None = None  # leaf: its rail; spine/core in a per_rail group: the group's rail
    rack: int | None = None  # leaf of a non-rail-optimised fabric: 0-based rack index
    block: int | None = None  # leaf/spine in a three-tier fabric: 0-based spine block
    plane: int | None = None  # core (and three-tier spine): 0-based core plane


class NodeLink(NamedTuple):
    """A node's HCA cabled to a leaf port. A NamedTuple because there are nodes × rails of them."""

    node: str
    hca: str  # verbs device, e.g. mlx5_0
    rail: int | None  # None only for extra HCAs of a non-rail-optimised fabric
    leaf: str
    port: int


class SwitchLink(NamedTuple):
    """A cable from a lower switch's uplink port to an upper switch's downlink port."""

    lower: str
    lower_port: int
    upper: str
    upper_port: int


@dataclass(frozen=True)
class FabricPlan:
    """Everything cabled in the site's compute fabric (storage/management HCAs are left out)."""

    site: str
    kind: str  # "infiniband" | "roce"
    link_gbps: int
    rail_optimised: bool
    spine_groups: str  # "per_rail" | "shared" (always "shared" when not rail-optimised)
    tiers: int  # 1 (single leaf), 2 (leaf/spine) or 3 (leaf/spine/core)
    downlinks_per_leaf: int  # D: ports 1..D face nodes
    uplinks_per_leaf: int  # U: ports D+1..D+U face spines
    spine_uplinks: int  # uplinks per spine (three tiers), else 0
    leaves: tuple[Switch, ...]
    spines: tuple[Switch, ...]
    cores: tuple[Switch, ...]
    node_links: tuple[NodeLink, ...]  # in node-index order, then rail order
    leaf_uplinks: tuple[SwitchLink, ...]
    spine_core_links: tuple[SwitchLink, ...]
    cage_ports: int = 1  # IB ports per switch cage (2 on twin-port OSFP switches)

    def cage(self, port: int) -> int | None:
        """The front-panel cage of a switch port (1-based); None on switches without cages."""
        return (port - 1) // self.cage_ports + 1 if self.cage_ports > 1 else None

    def port_label(self, switch: str, port: int) -> str:
        """`leaf-su1-rail0 port 33 (cage 17)`: how findings and cabling name a switch port."""
        c = self.cage(port)
        return f"{switch} port {port}" + (f" (cage {c})" if c is not None else "")

    @property
    def switches(self) -> tuple[Switch, ...]:
        return self.leaves + self.spines + self.cores

    @property
    def switch_links(self) -> tuple[SwitchLink, ...]:
        return self.leaf_uplinks + self.spine_core_links

    @cached_property
    def by_name(self) -> dict[str, Switch]:
        return {s.name: s for s in self.switches}

    @cached_property
    def node_port(self) -> dict[tuple[str, str], NodeLink]:
        """(node, hca device) -> its cable."""
        return {(link.node, link.hca): link for link in self.node_links}

    def leaf_ports_used(self) -> dict[str, int]:
        used: dict[str, int] = {}
        for link in self.node_links:
            used[link.leaf] = used.get(link.leaf, 0) + 1
        return used

    @property
    def node_gbps(self) -> int:
        """Injection bandwidth of all node links together, Gb/s."""
        return len(self.node_links) * self.link_gbps

    @property
    def oversubscription(self) -> float:
        """Node links per uplink on the busiest leaf (1.0 = non-blocking)."""
        if self.tiers == 1 or not self.uplinks_per_leaf:
            return 1.0
        busiest = max(self.leaf_ports_used().values(), default=0)
        return busiest / self.uplinks_per_leaf

    @property
    def bisection_gbps(self) -> float:
        """Bandwidth across a cut through the middle of the fabric, Gb/s.

        Half the node links can send across the cut at most; each leaf can push at most its
        uplinks through the spines. For a one-leaf fabric the switch itself is the bisection.
        Per-rail spine groups: cross-rail traffic never enters the spines (NCCL's PXN moves it
        over NVLink first), so the figure is per-rail traffic summed over the rails.
        """
        if self.tiers == 1:
            return self.node_gbps / 2
        used = self.leaf_ports_used()
        through = sum(min(n, self.uplinks_per_leaf) for n in used.values())
        return through * self.link_gbps / 2


def leaf_name(prefix: str, su_name: str, rail: int) -> str:
    return f"{prefix}leaf-{su_name}-rail{rail}"


def rack_leaf_name(prefix: str, rack_name: str) -> str:
    return f"{prefix}leaf-{rack_name}"


def smallest_divisor_at_least(n: int, lo: int) -> int:
    """The smallest divisor of n that is >= lo (n itself at worst); lo <= n is the caller's job."""
    lo = max(lo, 1)
    for d in range(lo, n + 1):
        if n % d == 0:
            return d
    return n


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def spine_block_leaves(spine_radix: int, rails_per_block_unit: int) -> int:
    """Leaves per spine block in a three-tier fabric (half the spine ports face down)."""
    half = spine_radix // 2
    return half - half % rails_per_block_unit


def plan_fabric(site: Site) -> FabricPlan:
    """Derive the expected switches and cables of `site`'s compute fabric."""
    fab = site.fabric
    d_ports = site.leaf_downlinks
    lower = _rail_leaf_tier(site) if fab.rail_optimised else _rack_leaf_tier(site)
    if len(lower.leaves) <= 1:
        return FabricPlan(site.site.name, fab.kind, fab.link_gbps, fab.rail_optimised,
                          lower.spine_groups, 1, d_ports, 0, 0, tuple(lower.leaves), (), (),
                          tuple(lower.node_links), (), (), fab.cage_ports)
    u = _uplinks_per_leaf(site, lower.node_links)
    three = max(len(v) for v in lower.groups.values()) > fab.spine_radix
    upper = _UpperTiers()
    for g, group_leaves in sorted(lower.groups.items()):
        if three:
            _cable_three_tier_group(site, upper, g, group_leaves, u, lower)
        else:
            _cable_two_tier_group(site, upper, g, group_leaves, u, lower.spine_groups)
    leaves = lower.leaves
    if upper.leaf_block:
        leaves = [replace(sw, block=upper.leaf_block[sw.name]) for sw in leaves]
    return FabricPlan(
        site=site.site.name, kind=fab.kind, link_gbps=fab.link_gbps,
        rail_optimised=fab.rail_optimised, spine_groups=lower.spine_groups,
        tiers=3 if three else 2, downlinks_per_leaf=d_ports, uplinks_per_leaf=u,
        spine_uplinks=upper.s_up, leaves=tuple(leaves), spines=tuple(upper.spines),
        cores=tuple(upper.cores), node_links=tuple(lower.node_links),
        leaf_uplinks=tuple(upper.leaf_up), spine_core_links=tuple(upper.core_links),
        cage_ports=fab.cage_ports,
    )


class _LeafTier(NamedTuple):
    """The leaves, the node cables into them, and how they group under the spines."""

    leaves: list[Switch]
    node_links: list[NodeLink]
    groups: dict[int, list[str]]  # spine group -> leaf names in group order
    spine_groups: str
    unit: int  # leaves of one spine block come in multiples of this (the rails sharing it)


@dataclass
class _UpperTiers:
    """Spines, cores and their cables, filled one spine group at a time."""

    spines: list[Switch] = field(default_factory=list)
    cores: list[Switch] = field(default_factory=list)
    leaf_up: list[SwitchLink] = field(default_factory=list)
    core_links: list[SwitchLink] = field(default_factory=list)
    leaf_block: dict[str, int] = field(default_factory=dict)  # leaf -> its spine block
    s_up: int = 0  # uplinks per spine (three tiers)


def _rail_leaf_tier(site: Site) -> _LeafTier:
    """One leaf per rail of each SU; node s of an SU in port s+1 of each rail's leaf."""
    fab = site.fabric
    inv = site.inventory
    prefix = fab.switch_prefix
    leaves: list[Switch] = []
    groups: dict[int, list[str]] = {}
    rails = fab.rails
    per_rail = fab.spine_groups == "per_rail"
    names = [[leaf_name(prefix, su_name, r) for r in range(rails)] for su_name in inv.su_names]
    for su, row in enumerate(names):
        for r, name in enumerate(row):
            g = r if per_rail else 0
            leaves.append(Switch(name, "leaf", fab.leaf_radix, g, su=su, rail=r))
            groups.setdefault(g, []).append(name)
    # (`h.rail is not None` holds for every compute HCA: the site model checks it)
    hcas_by_type = {t: [(h.device, h.rail) for h in nt.compute_hcas if h.rail is not None]
                    for t, nt in site.node_types.items()}
    # tuple.__new__ skips NamedTuple's Python-level __new__: 2x faster at 100k links.
    node_links = [
        _new(NodeLink, (node.name, dev, rail, names[node.su][rail], node.su_slot + 1))
        for node in inv.nodes for dev, rail in hcas_by_type[node.node_type]
    ]
    return _LeafTier(leaves, node_links, groups, fab.spine_groups, 1 if per_rail else rails)


def _rack_leaf_tier(site: Site) -> _LeafTier:
    """One leaf per rack, every HCA of its nodes in it, node by node."""
    fab = site.fabric
    inv = site.inventory
    rack_leaves = [rack_leaf_name(fab.switch_prefix, r) for r in inv.rack_names]
    leaves = [Switch(name, "leaf", fab.leaf_radix, 0, rack=rack)
              for rack, name in enumerate(rack_leaves)]
    node_links: list[NodeLink] = []
    for node in inv.nodes:
        hcas = site.node_types[node.node_type].compute_hcas
        base = node.slot * len(hcas)
        for h, hca in enumerate(hcas):
            node_links.append(
                NodeLink(node.name, hca.device, hca.rail, rack_leaves[node.rack], base + h + 1)
            )
    return _LeafTier(leaves, node_links, {0: list(rack_leaves)}, "shared", 1)


def _uplinks_per_leaf(site: Site, node_links: list[NodeLink]) -> int:
    """Uplinks the busiest leaf needs at the declared oversubscription."""
    fab = site.fabric
    used: dict[str, int] = {}
    for link in node_links:
        used[link.leaf] = used.get(link.leaf, 0) + 1
    busiest = max(used.values(), default=0)
    # (1e-9: 32/1.0 is 32)
    return max(1, min(fab.leaf_radix - site.leaf_downlinks,
                      math.ceil(busiest / fab.oversubscription - 1e-9)))


def _cable_two_tier_group(site: Site, upper: _UpperTiers, g: int, group_leaves: list[str],
                          u: int, spine_groups: str) -> None:
    """Spines of one group, each leaf's `u` uplinks spread over them."""
    fab = site.fabric
    tag = f"rail{g}-" if spine_groups == "per_rail" else ""
    rail = g if spine_groups == "per_rail" else None
    n_sp = smallest_divisor_at_least(u, _ceil_div(len(group_leaves) * u, fab.spine_radix))
    sp_names = [f"{fab.switch_prefix}spine-{tag}{j + 1}" for j in range(n_sp)]
    upper.spines.extend(Switch(n, "spine", fab.spine_radix, g, rail=rail) for n in sp_names)
    bundle = fab.cage_ports if fab.uplink_cabling == "cage" else 1
    _spread(group_leaves, site.leaf_downlinks + 1, u, sp_names, upper.leaf_up, bundle)


def _cable_three_tier_group(site: Site, upper: _UpperTiers, g: int, group_leaves: list[str],
                            u: int, lower: _LeafTier) -> None:
    """Spine blocks of one group, and core planes above them (one per spine of a block)."""
    fab = site.fabric
    prefix, r_spine = fab.switch_prefix, fab.spine_radix
    tag = f"rail{g}-" if lower.spine_groups == "per_rail" else ""
    rail = g if lower.spine_groups == "per_rail" else None
    bundle = fab.cage_ports if fab.uplink_cabling == "cage" else 1
    block = spine_block_leaves(r_spine, lower.unit)
    if block < 1:
        raise ValueError(
            f"fabric.spine_radix: {r_spine} is too small for a three-tier fabric with "
            f"{lower.unit} rails per block; use larger spines or spine_groups = 'per_rail'"
        )
    n_sb = smallest_divisor_at_least(u, _ceil_div(block * u, r_spine // 2))
    s_up = upper.s_up = block * u // n_sb
    blocks = [group_leaves[i:i + block] for i in range(0, len(group_leaves), block)]
    n_core = smallest_divisor_at_least(s_up, _ceil_div(len(blocks) * s_up, r_spine))
    planes: list[list[str]] = [[] for _ in range(n_sb)]
    for b, blk in enumerate(blocks):
        for name in blk:
            upper.leaf_block[name] = b
        sp_names = [f"{prefix}spine-{tag}b{b + 1}-{j + 1}" for j in range(n_sb)]
        upper.spines.extend(Switch(n, "spine", r_spine, g, rail=rail, block=b, plane=j)
                            for j, n in enumerate(sp_names))
        _spread(blk, site.leaf_downlinks + 1, u, sp_names, upper.leaf_up, bundle)
        for j, n in enumerate(sp_names):
            planes[j].append(n)
    for j, plane in enumerate(planes):
        c_names = [f"{prefix}core-{tag}{j * n_core + c + 1}" for c in range(n_core)]
        upper.cores.extend(Switch(n, "core", r_spine, g, rail=rail, plane=j) for n in c_names)
        # A spine's downlink ports are 1..block·U/S_b; its uplinks sit above them.
        _spread(plane, s_up + 1, s_up, c_names, upper.core_links)


def _spread(lower: list[str], first_port: int, per_lower: int, upper: list[str],
            out: list[SwitchLink], bundle: int = 1) -> None:
    """Cable `per_lower` uplinks of each lower switch round-robin over `upper` (see module doc),
    `bundle` consecutive ports at a time (both ports of a twin-port cage to one upper switch)."""
    n_up = len(upper)
    if bundle > 1 and (per_lower % (bundle * n_up) or (first_port - 1) % bundle):
        bundle = 1  # cages cannot split evenly over the spines: single links
    pairs = ((name, k) for name in lower for k in range(per_lower))
    out.extend(
        _new(SwitchLink, (name, first_port + k, upper[(i // bundle) % n_up],
                          (i // bundle) // n_up * bundle + i % bundle + 1))
        for i, (name, k) in enumerate(pairs)
    )


def iter_cables(plan: FabricPlan) -> Iterator[tuple[str, str, str, str, str, str]]:
    """Rows (tier, from, from_port, to, to_port, rail) of every cable, node links first."""
    for nl in plan.node_links:
        yield ("node-leaf", nl.node, nl.hca, nl.leaf, str(nl.port),
               "" if nl.rail is None else str(nl.rail))
    rail_of = {s.name: s.rail for s in plan.switches}
    for sl in plan.switch_links:
        r = rail_of[sl.lower]
        tier = "leaf-spine" if sl.lower in plan.by_name and plan.by_name[sl.lower].tier == "leaf" \
            else "spine-core"
        yield (tier, sl.lower, str(sl.lower_port), sl.upper, str(sl.upper_port),
               "" if r is None else str(r))
