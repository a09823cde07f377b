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
from itertools import pairwise, product
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


def _groups_along(shape: tuple[int, ...], axis: int) -> list[list[int]]:
    """The groups of `range(prod(shape))` laid out row-major in `shape` whose members differ
    only in `axis` (ascending), groups in row-major order of the other axes; the same as numpy's
    `arange(n).reshape(shape)` with `axis` moved last, reshaped to (-1, shape[axis])."""
    strides = [math.prod(shape[i + 1:]) for i in range(len(shape))]
    step, size = strides[axis], shape[axis]
    others = [range(0, n * st, st) for i, (n, st) in enumerate(zip(shape, strides, strict=True))
              if i != axis]
    return [list(range(base, base + size * step, step))
            for base in (sum(c) for c in product(*others))]


def _group_table(world: int, tp: int, cp: int, dp: int, pp: int, ep: int, etp: int,
                 edp: int) -> dict[str, list[list[int]]]:
    """Each kind -> groups of global ranks (dense ranks laid out (pp, dp, cp, tp), expert ranks
    (pp, edp, ep, etp), fastest last)."""
    dense, expert = (pp, dp, cp, tp), (pp, edp, ep, etp)
    return {
        "tp": _groups_along(dense, 3), "cp": _groups_along(dense, 2),
        "dp": _groups_along(dense, 1), "pp": _groups_along(dense, 0),
        "ep": _groups_along(expert, 2), "etp": _groups_along(expert, 3),
        "edp": _groups_along(expert, 1),
    }


def _distinct(values: Sequence[int]) -> int:
    """Distinct values of a non-decreasing sequence (group members are ascending ranks, and
    node, domain, rack and SU indices grow with the rank)."""
    return 1 + sum(1 for a, b in pairwise(values) if a != b)


def _rail_aligned(groups: list[list[int]], gpus_per_node: int, n_nodes: list[int]) -> bool:
    """True when every node of a group holds members on the same local ranks (so on the same
    rails): node-crossing traffic then stays rail-to-rail, through the rail leaf (and spine),
    never across rails. Group members are sorted, so each node's members are contiguous."""
    crossing = [(g, n) for g, n in zip(groups, n_nodes, strict=True) if n > 1]
    if not crossing:
        return True
    per = crossing[0][1]
    if any(n != per for _, n in crossing) or len(crossing[0][0]) % per:
        return False
    k = len(crossing[0][0]) // per
    for g, _ in crossing:
        chunks = [g[i * k:(i + 1) * k] for i in range(per)]
        if any(len({r // gpus_per_node for r in c}) != 1 for c in chunks):
            return False  # uneven members per node
        local = [r % gpus_per_node for r in chunks[0]]
        if any([r % gpus_per_node for r in c] != local for c in chunks[1:]):
            return False
    return True


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


def place(*, tp: int, cp: int, pp: int, ep: int, etp: int, nodes: int, gpus_per_node: int,
          node_map: NodeMap, block_nodes: int, moe: bool = True) -> Placement:
    """Group placement for a layout that divides the world (the caller validates that).
    Expert groups (ep, etp, edp) only when `moe`."""
    world = nodes * gpus_per_node
    dp = world // (tp * cp * pp)
    edp = world // (etp * ep * pp)
    kinds = _group_table(world, tp, cp, dp, pp, ep, etp, edp)
    if not moe:
        kinds = {k: v for k, v in kinds.items() if k in ("tp", "cp", "dp", "pp")}
    out: dict[str, GroupPlacement] = {}
    dom, su = node_map.domain, node_map.su
    for kind, groups in kinds.items():
        nodes_of = [[r // gpus_per_node for r in g] for g in groups]
        n_nodes = [_distinct(ns) for ns in nodes_of]
        if max(n_nodes) == 1:
            n_dom = n_su = n_nodes
        else:
            n_dom = (n_nodes if node_map.nodes_per_domain == 1
                     else [_distinct([dom[n] for n in ns]) for ns in nodes_of])
            n_su = [_distinct([su[n] for n in ns]) for ns in nodes_of]
        out[kind] = GroupPlacement(
            size=len(groups[0]), count=len(groups), max_nodes=max(n_nodes),
            cross_node=sum(1 for n in n_nodes if n > 1),
            cross_domain=sum(1 for n in n_dom if n > 1),
            cross_su=sum(1 for n in n_su if n > 1),
            rail_aligned=_rail_aligned(groups, gpus_per_node, n_nodes))
    return Placement(
        order=RANK_ORDER, gpus_per_node=gpus_per_node, nodes=nodes,
        sus_spanned=len(set(node_map.su)), racks_spanned=len(set(node_map.rack)),
        domains_spanned=len(set(node_map.domain)),
        min_sus=math.ceil(nodes / node_map.nodes_per_su),
        min_blocks=math.ceil(nodes / block_nodes), groups=out)
