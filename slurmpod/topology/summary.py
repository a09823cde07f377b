"""The numbers `slurmpod topo show` prints: size, fabric shape, bandwidth, and one row per SU.

Pure: a dict built from the site and its fabric plan (the same plan cabling.csv comes from).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from slurmpod.model.hostlist import compress

if TYPE_CHECKING:
    from slurmpod.model.site import Site
    from slurmpod.topology.fabric_plan import FabricPlan


def summarize(site: Site, plan: FabricPlan, plugin: str) -> dict[str, Any]:
    inv = site.inventory
    gpus = sum(site.node_types[n.node_type].gpus for n in inv.nodes)
    peak = sum(site.node_types[n.node_type].gpus * site.node_types[n.node_type].gpu.peak_tflops_bf16
               for n in inv.nodes)
    nvl = site.rack_scale_nvlink
    leaves_by_su: dict[int, int] = {}
    for sw in plan.leaves:
        if sw.su is not None:
            leaves_by_su[sw.su] = leaves_by_su.get(sw.su, 0) + 1
    per_su: list[dict[str, Any]] = []
    members: dict[int, list[str]] = {}
    racks: dict[int, set[int]] = {}
    domains: dict[int, set[int]] = {}
    for node in inv.nodes:
        members.setdefault(node.su, []).append(node.name)
        racks.setdefault(node.su, set()).add(node.rack)
        domains.setdefault(node.su, set()).add(node.domain)
    for su, name in enumerate(inv.su_names):
        nt = site.node_types[inv.su_node_type[su]]
        n = len(members.get(su, []))
        row: dict[str, Any] = {
            "su": name, "node_type": inv.su_node_type[su], "nodes": n, "gpus": n * nt.gpus,
            "racks": len(racks.get(su, ())), "hosts": compress(members.get(su, [])),
        }
        if site.fabric.rail_optimised:
            row["leaves"] = leaves_by_su.get(su, 0)
        if nvl:
            row["nvlink_domains"] = len(domains.get(su, ()))
        per_su.append(row)
    return {
        "site": site.site.name,
        "description": site.site.description,
        "slurm_version": site.slurm.version,
        "topology_plugin": plugin,
        "nodes": len(inv.nodes),
        "gpus": gpus,
        "peak_pflops_bf16": round(peak / 1000, 3),
        "racks": len(inv.rack_names),
        "sus": len(inv.su_names),
        "nvlink_domains": len(inv.domain_names) if nvl else None,
        "fabric": {
            "kind": site.fabric.kind,
            "rails": site.fabric.rails if site.fabric.rail_optimised else None,
            "rail_optimised": site.fabric.rail_optimised,
            "link_gbps": site.fabric.link_gbps,
            "sharp": site.fabric.sharp,
            "spine_groups": plan.spine_groups,
            "tiers": plan.tiers,
            "leaves": len(plan.leaves),
            "spines": len(plan.spines),
            "cores": len(plan.cores),
            "leaf_downlinks": plan.downlinks_per_leaf,
            "leaf_uplinks": plan.uplinks_per_leaf,
            "cables": len(plan.node_links) + len(plan.leaf_uplinks) + len(plan.spine_core_links),
            "oversubscription": round(plan.oversubscription, 3),
            "injection_gbps": plan.node_gbps,
            "bisection_gbps": plan.bisection_gbps,
        },
        "per_su": per_su,
    }
