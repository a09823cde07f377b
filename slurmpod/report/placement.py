"""Where a job ran on the site: the SUs, racks and NVLink domains its nodes span, against the
fewest that could hold the same number of nodes. Pure: a hostlist and an Inventory in, a
Placement out.

"Fewest" fills the largest units of the job's node type first (the same greedy rule as
`slurmpod.render.sbatch.min_sus_fallback`): a 40-node job on 32-node SUs needs 2 SUs, and a
job that spans 3 of them was placed wider than it had to be (more traffic over the spine).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from slurmpod.model.hostlist import expand
from slurmpod.model.site import Inventory


@dataclass(frozen=True)
class PlacedNode:
    name: str
    su: str
    rack: str
    domain: str
    su_slot: int  # 0-based position in its SU (for the placement map)
    slot: int  # 0-based position in its rack


@dataclass(frozen=True)
class Placement:
    nodes: tuple[PlacedNode, ...]
    unknown: tuple[str, ...]  # job nodes the site file does not list
    node_type: str | None
    sus: tuple[str, ...]
    racks: tuple[str, ...]
    domains: tuple[str, ...]
    min_sus: int | None
    min_racks: int | None
    min_domains: int | None
    # The whole site, for the map: SU name -> its racks in order, rack -> node count.
    site_sus: tuple[tuple[str, tuple[str, ...]], ...] = ()
    rack_sizes: tuple[tuple[str, int], ...] = ()

    @property
    def n_nodes(self) -> int:
        return len(self.nodes) + len(self.unknown)

    @property
    def wider_than_needed(self) -> list[str]:
        """Which levels span more units than needed ("SUs", "racks"), for known placements."""
        if self.unknown or not self.nodes:
            return []
        out = []
        if self.min_sus is not None and len(self.sus) > self.min_sus:
            out.append("SUs")
        if self.min_racks is not None and len(self.racks) > self.min_racks:
            out.append("racks")
        return out

    def to_json(self) -> dict[str, Any]:
        return {
            "node_type": self.node_type,
            "sus": list(self.sus), "n_sus": len(self.sus), "min_sus": self.min_sus,
            "racks": list(self.racks), "n_racks": len(self.racks), "min_racks": self.min_racks,
            "domains": list(self.domains), "n_domains": len(self.domains),
            "min_domains": self.min_domains,
            "unknown_nodes": list(self.unknown),
            "wider_than_needed": self.wider_than_needed,
            "nodes": [{"name": n.name, "su": n.su, "rack": n.rack, "domain": n.domain}
                      for n in self.nodes],
        }


def fewest(sizes: Iterable[int], n: int) -> int | None:
    """Fewest units (largest first) whose sizes add up to at least `n`; None if all cannot."""
    if n <= 0:
        return 0
    total = 0
    for i, size in enumerate(sorted(sizes, reverse=True), 1):
        total += size
        if total >= n:
            return i
    return None


def placement_of(nodelist: str | Iterable[str], inv: Inventory) -> Placement:
    """The placement of a job's nodes (a Slurm hostlist expression or names) on the site."""
    names = expand(nodelist) if isinstance(nodelist, str) else list(nodelist)
    by_name = inv.by_name
    placed: list[PlacedNode] = []
    unknown: list[str] = []
    types: Counter[str] = Counter()
    for name in dict.fromkeys(names):
        node = by_name.get(name)
        if node is None:
            unknown.append(name)
            continue
        types[node.node_type] += 1
        dom = inv.domain_names[node.domain] if node.domain < len(inv.domain_names) else name
        placed.append(PlacedNode(name, inv.su_names[node.su], inv.rack_names[node.rack], dom,
                                 node.su_slot, node.slot))
    node_type = types.most_common(1)[0][0] if types else None
    n = len(placed) + len(unknown)
    min_sus = min_racks = min_domains = None
    site_sus: list[tuple[str, tuple[str, ...]]] = []
    rack_sizes: list[tuple[str, int]] = []
    if node_type is not None:
        same = [nd for nd in inv.nodes if nd.node_type == node_type]
        su_count = Counter(nd.su for nd in same)
        rack_count = Counter(nd.rack for nd in same)
        dom_count = Counter(nd.domain for nd in same)
        min_sus = fewest(su_count.values(), n)
        min_racks = fewest(rack_count.values(), n)
        min_domains = fewest(dom_count.values(), n)
        su_racks: dict[int, list[int]] = {}
        for nd in inv.nodes:
            racks = su_racks.setdefault(nd.su, [])
            if nd.rack not in racks:
                racks.append(nd.rack)
        site_sus = [(inv.su_names[s], tuple(inv.rack_names[r] for r in racks))
                    for s, racks in sorted(su_racks.items())]
        all_racks = Counter(nd.rack for nd in inv.nodes)
        rack_sizes = [(inv.rack_names[r], c) for r, c in sorted(all_racks.items())]
    return Placement(
        nodes=tuple(placed), unknown=tuple(unknown), node_type=node_type,
        sus=tuple(dict.fromkeys(p.su for p in placed)),
        racks=tuple(dict.fromkeys(p.rack for p in placed)),
        domains=tuple(dict.fromkeys(p.domain for p in placed)),
        min_sus=min_sus, min_racks=min_racks, min_domains=min_domains,
        site_sus=tuple(site_sus), rack_sizes=tuple(rack_sizes))
