"""Where Megatron's parallel groups land: ranks -> GPUs -> nodes -> NVLink domains, racks, SUs.

Rank order is megatron-core's default `tp-cp-ep-dp-pp` (parallel_state.initialize_model_parallel,
core 0.14): TP varies fastest, PP slowest. Dense groups come from the (TP, CP, DP, PP) generator
and expert groups from the folded (ETP, EP, expert-DP, PP) generator over the same ranks. Slurm
starts 8 tasks per node in node order, so global rank r runs on job node r // gpus_per_node with
local rank (and rail) r % gpus_per_node. The job is assumed to start at an SU boundary on a
contiguous block of nodes (what `--switches=1` / block topology gives).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

RANK_ORDER = "tp-cp-ep-dp-pp"
# Plain Python, no numpy: a plan places one layout (at most a few hundred thousand ranks, one
# pass each), and numpy's ~60 ms import would be most of `slurmpod plan`'s start-up.


@dataclass(frozen=True)
class NodeMap:
    """Per job node: its NVLink domain, rack and SU index (0-based, site-wide)."""

    domain: tuple[int, ...]
    rack: tuple[int, ...]
    su: tuple[int, ...]
    nodes_per_su: int
    nodes_per_domain: int


def node_map_from_arrays(domain: Sequence[int], rack: Sequence[int], su: Sequence[int],
                         nodes: int, nodes_per_su: int, nodes_per_rack: int,
                         nodes_per_domain: int) -> NodeMap:
    """The first `nodes` nodes of the site; beyond the inventory the last SU's shape repeats
    (so an oversize request still gets numbers, next to its error)."""
    have = min(nodes, len(domain))
    d, r, s = ([int(x) for x in a[:have]] for a in (domain, rack, su))
    if nodes > have:
        base_su = int(su[-1]) + 1 if len(su) else 0
        base_rack = int(rack[-1]) + 1 if len(rack) else 0
        base_dom = int(domain[-1]) + 1 if len(domain) else 0
        for extra in range(nodes - have):
            s.append(base_su + extra // nodes_per_su)
            r.append(base_rack + extra // nodes_per_rack)
            d.append(base_dom + extra // nodes_per_domain)
    return NodeMap(tuple(d), tuple(r), tuple(s), nodes_per_su, nodes_per_domain)


def _along(shape: tuple[int, ...], axis: int) -> tuple[list[int], int, int]:
    """The groups of `range(prod(shape))` laid out row-major in `shape` whose members differ
    only in `axis`: (each group's first rank, the stride between members, the group size).
    Group b is `range(b, b + size * stride, stride)`; bases come in row-major order of the other
    axes (numpy's `arange(n).reshape(shape)` with `axis` moved last, reshaped to (-1, size))."""
    strides = [math.prod(shape[i + 1:]) for i in range(len(shape))]
    bases = [0]
    for i, (n, st) in enumerate(zip(shape, strides, strict=True)):
        if i != axis:
            bases = [b + k * st for b in bases for k in range(n)]
    return bases, strides[axis], shape[axis]


def _kind_axes(tp: int, cp: int, dp: int, pp: int, ep: int, etp: int, edp: int
               ) -> dict[str, tuple[tuple[int, ...], int]]:
    """Each kind -> (rank grid, its axis): dense ranks laid out (pp, dp, cp, tp), expert ranks
    (pp, edp, ep, etp), fastest last."""
    dense, expert = (pp, dp, cp, tp), (pp, edp, ep, etp)
    return {"tp": (dense, 3), "cp": (dense, 2), "dp": (dense, 1), "pp": (dense, 0),
            "ep": (expert, 2), "etp": (expert, 3), "edp": (expert, 1)}


def _nodes_spanned(first: int, step: int, size: int, gpus_per_node: int) -> int:
    """Nodes holding the ranks first + i * step (i < size): each its own node once the stride
    is a node or more; else the nodes between the first and last member, none skipped."""
    if step >= gpus_per_node:
        return size
    return (first + (size - 1) * step) // gpus_per_node - first // gpus_per_node + 1


def _rail_aligned(firsts: Sequence[int], step: int, size: int, gpus_per_node: int) -> bool:
    """True when every node of every group (ranks first + i * step) holds members on the same
    local ranks, so on the same rails: node-crossing traffic then stays rail-to-rail, through
    the rail leaf (and spine), never across rails. A group's members on its j-th node are those
    on its first node moved by j * k * step ranks (k members per node), so the rule holds when
    the first node's share sits on one node and that move is whole nodes."""
    spans = [(f, _nodes_spanned(f, step, size, gpus_per_node)) for f in firsts]
    crossing = [(f, n) for f, n in spans if n > 1]
    if not crossing:
        return True
    per = crossing[0][1]
    if any(n != per for _, n in crossing) or size % per:
        return False  # uneven members per node
    k = size // per
    return (k * step) % gpus_per_node == 0 and all(
        (f + (k - 1) * step) // gpus_per_node == f // gpus_per_node for f, _ in crossing)


@dataclass(frozen=True)
class GroupPlacement:
    size: int
    count: int
    max_nodes: int  # most nodes any one group spans
    cross_node: int  # groups spanning more than one node
    cross_domain: int
    cross_su: int
    rail_aligned: bool  # cross-node traffic stays on matching rails

    def to_json(self) -> dict[str, Any]:
        return {"size": self.size, "count": self.count, "max_nodes": self.max_nodes,
                "groups_crossing_node": self.cross_node,
                "groups_crossing_nvlink_domain": self.cross_domain,
                "groups_crossing_su": self.cross_su, "rail_aligned": self.rail_aligned}


@dataclass(frozen=True)
class Placement:
    order: str
    gpus_per_node: int
    nodes: int
    sus_spanned: int
    racks_spanned: int
    domains_spanned: int
    min_sus: int
    min_blocks: int
    groups: dict[str, GroupPlacement]

    def to_json(self) -> dict[str, Any]:
        return {"rank_order": self.order, "gpus_per_node": self.gpus_per_node,
                "nodes": self.nodes, "sus_spanned": self.sus_spanned,
                "racks_spanned": self.racks_spanned, "nvlink_domains_spanned":
                self.domains_spanned, "min_sus": self.min_sus, "min_blocks": self.min_blocks,
                "groups": {k: g.to_json() for k, g in self.groups.items()}}


def rank_location(rank: int, gpus_per_node: int, nm: NodeMap) -> dict[str, int]:
    node = rank // gpus_per_node
    return {"rank": rank, "node": node, "local_rank": rank % gpus_per_node,
            "domain": nm.domain[node], "rack": nm.rack[node], "su": nm.su[node]}


def _kind_placement(shape: tuple[int, ...], axis: int, gpus_per_node: int,
                    node_map: NodeMap) -> GroupPlacement:
    """How the groups along `axis` of the rank grid `shape` land, without listing their ranks:
    O(groups), not O(ranks), so a 1,024-node MoE plan places its seven kinds in milliseconds.

    Group b holds ranks b + i * stride, on node rank // gpus_per_node. Moving b by whole nodes
    moves every member by the same number of nodes and keeps its local rank, so a group's node
    count and rail alignment depend only on b % gpus_per_node, one residue per shape.
    Node, domain and SU indices grow with the rank, so a group crosses a boundary exactly when
    its first and last members lie on different sides of it."""
    bases, step, size = _along(shape, axis)
    if size == 1:
        return GroupPlacement(size=1, count=len(bases), max_nodes=1, cross_node=0,
                              cross_domain=0, cross_su=0, rail_aligned=True)
    residues = sorted({b % gpus_per_node for b in bases})
    span = (size - 1) * step
    dom, su = node_map.domain, node_map.su
    cross_node = cross_domain = cross_su = 0
    for b in bases:
        first, last = b // gpus_per_node, (b + span) // gpus_per_node
        if first != last:
            cross_node += 1
            cross_domain += dom[first] != dom[last]
            cross_su += su[first] != su[last]
    return GroupPlacement(
        size=size, count=len(bases),
        max_nodes=max(_nodes_spanned(r, step, size, gpus_per_node) for r in residues),
        cross_node=cross_node, cross_domain=cross_domain, cross_su=cross_su,
        rail_aligned=_rail_aligned(residues, step, size, gpus_per_node))


def place(*, tp: int, cp: int, pp: int, ep: int, etp: int, nodes: int, gpus_per_node: int,
          node_map: NodeMap, block_nodes: int, moe: bool = True) -> Placement:
    """Group placement for a layout that divides the world (the caller validates that).
    Expert groups (ep, etp, edp) only when `moe`."""
    world = nodes * gpus_per_node
    dp = world // (tp * cp * pp)
    edp = world // (etp * ep * pp)
    kinds = _kind_axes(tp, cp, dp, pp, ep, etp, edp)
    out = {kind: _kind_placement(shape, axis, gpus_per_node, node_map)
           for kind, (shape, axis) in kinds.items()
           if moe or kind in ("tp", "cp", "dp", "pp")}
    return Placement(
        order=RANK_ORDER, gpus_per_node=gpus_per_node, nodes=nodes,
        sus_spanned=len(set(node_map.su)), racks_spanned=len(set(node_map.rack)),
        domains_spanned=len(set(node_map.domain)),
        min_sus=math.ceil(nodes / node_map.nodes_per_su),
        min_blocks=math.ceil(nodes / block_nodes), groups=out)
