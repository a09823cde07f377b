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
from dataclasses import dataclass
from typing import Any

import numpy as np

RANK_ORDER = "tp-cp-ep-dp-pp"


@dataclass(frozen=True)
class NodeMap:
    """Per job node: its NVLink domain, rack and SU index (0-based, site-wide)."""

    domain: np.ndarray
    rack: np.ndarray
    su: np.ndarray
    nodes_per_su: int
    nodes_per_domain: int


def node_map_from_arrays(domain: np.ndarray, rack: np.ndarray, su: np.ndarray, nodes: int,
                         nodes_per_su: int, nodes_per_rack: int,
                         nodes_per_domain: int) -> NodeMap:
    """The first `nodes` nodes of the site; beyond the inventory the last SU's shape repeats
    (so an oversize request still gets numbers, next to its error)."""
    have = min(nodes, len(domain))
    d, r, s = domain[:have], rack[:have], su[:have]
    if nodes > have:
        extra = np.arange(nodes - have)
        base_su = int(su[-1]) + 1 if len(su) else 0
        base_rack = int(rack[-1]) + 1 if len(rack) else 0
        base_dom = int(domain[-1]) + 1 if len(domain) else 0
        s = np.concatenate([s, base_su + extra // nodes_per_su])
        r = np.concatenate([r, base_rack + extra // nodes_per_rack])
        d = np.concatenate([d, base_dom + extra // nodes_per_domain])
    return NodeMap(d, r, s, nodes_per_su, nodes_per_domain)


def _group_table(world: int, tp: int, cp: int, dp: int, pp: int, ep: int, etp: int,
                 edp: int) -> dict[str, np.ndarray]:
    """Each kind -> array (groups x members) of global ranks."""
    dense = np.arange(world).reshape(pp, dp, cp, tp)
    expert = np.arange(world).reshape(pp, edp, ep, etp)
    return {
        "tp": dense.reshape(-1, tp),
        "cp": dense.transpose(0, 1, 3, 2).reshape(-1, cp),
        "dp": dense.transpose(0, 2, 3, 1).reshape(-1, dp),
        "pp": dense.transpose(1, 2, 3, 0).reshape(-1, pp),
        "ep": expert.transpose(0, 1, 3, 2).reshape(-1, ep),
        "etp": expert.reshape(-1, etp),
        "edp": expert.transpose(0, 2, 3, 1).reshape(-1, edp),
    }


def _distinct_per_row(values: np.ndarray) -> np.ndarray:
    """Distinct values per row of a row-wise non-decreasing array (no sort needed: group
    members are ascending ranks, and node, domain, rack and SU indices grow with the rank)."""
    if values.shape[1] == 1:
        return np.ones(values.shape[0], dtype=np.int64)
    return 1 + np.count_nonzero(values[:, 1:] != values[:, :-1], axis=1)


def _rail_aligned(ranks: np.ndarray, gpus_per_node: int, n_nodes: np.ndarray) -> bool:
    """True when every node of a group holds members on the same local ranks (so on the same
    rails): node-crossing traffic then stays rail-to-rail, through the rail leaf (and spine),
    never across rails. `ranks` rows are sorted, so each node's members are contiguous."""
    crossing = n_nodes > 1
    if not crossing.any():
        return True
    rows = ranks[crossing]
    per = n_nodes[crossing]
    if per.min() != per.max() or rows.shape[1] % per[0]:
        return False
    k = rows.shape[1] // int(per[0])
    cube = rows.reshape(rows.shape[0], int(per[0]), k)
    node = cube // gpus_per_node
    if not np.all(node == node[:, :, :1]):
        return False  # uneven members per node
    local = cube % gpus_per_node
    return bool(np.all(local == local[:, :1, :]))


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
            "domain": int(nm.domain[node]), "rack": int(nm.rack[node]), "su": int(nm.su[node])}


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
    for kind, ranks in kinds.items():
        node = ranks // gpus_per_node
        n_nodes = _distinct_per_row(node)
        crossing = n_nodes > 1
        if not crossing.any():
            n_dom = n_su = n_nodes
        else:
            n_dom = (n_nodes if node_map.nodes_per_domain == 1
                     else _distinct_per_row(node_map.domain[node]))
            n_su = _distinct_per_row(node_map.su[node])
        aligned = _rail_aligned(ranks, gpus_per_node, n_nodes)
        out[kind] = GroupPlacement(
            size=ranks.shape[1], count=ranks.shape[0], max_nodes=int(n_nodes.max()),
            cross_node=int(np.count_nonzero(crossing)),
            cross_domain=int(np.count_nonzero(n_dom > 1)),
            cross_su=int(np.count_nonzero(n_su > 1)), rail_aligned=aligned)
    return Placement(
        order=RANK_ORDER, gpus_per_node=gpus_per_node, nodes=nodes,
        sus_spanned=len(np.unique(node_map.su)), racks_spanned=len(np.unique(node_map.rack)),
        domains_spanned=len(np.unique(node_map.domain)),
        min_sus=math.ceil(nodes / node_map.nodes_per_su),
        min_blocks=math.ceil(nodes / block_nodes), groups=out)
