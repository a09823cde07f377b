"""The expected fabric: counts against the reference design, port rules, SHARP invariant, reach."""

from __future__ import annotations

import math
from collections import Counter, defaultdict

import pytest

from slurmpod.topology.fabric_plan import FabricPlan, iter_cables, plan_fabric
from tests.unit.topology.test_support import build, scale_site, site_dict, variant


def _ports_unique(plan: FabricPlan) -> None:
    used: set[tuple[str, int]] = set()
    for link in plan.node_links:
        key = (link.leaf, link.port)
        assert key not in used, key
        used.add(key)
    for link in plan.switch_links:
        for key in ((link.lower, link.lower_port), (link.upper, link.upper_port)):
            assert key not in used, key
            used.add(key)
    radix = {s.name: s.radix for s in plan.switches}
    assert all(1 <= port <= radix[name] for name, port in used)


def test_superpod_matches_nvidia_reference_counts():
    # DGX H100 SuperPOD, 4 SUs x 32 nodes, QM9700 (64 ports): 8 rail leaves per SU and
    # 2 spines per rail: 32 leaves, 16 spines (NVIDIA DGX SuperPOD RA, compute fabric table).
    site = build(site_dict("dgx-h100-superpod"))
    plan = plan_fabric(site)
    assert plan.tiers == 2
    assert len(plan.leaves) == 4 * 8
    assert len(plan.spines) == 16
    assert plan.downlinks_per_leaf == 32 and plan.uplinks_per_leaf == 32
    assert len(plan.node_links) == 128 * 8
    assert len(plan.leaf_uplinks) == 32 * 32
    _ports_unique(plan)


def test_node_hca_goes_to_its_su_rail_leaf_at_slot_port():
    site = build(site_dict("dgx-h100-superpod"))
    plan = plan_fabric(site)
    leaves = plan.by_name
    nodes = site.inventory.by_name
    rail_of = {h.device: h.rail for h in site.node_types["dgx-h100"].compute_hcas}
    for link in plan.node_links:
        node = nodes[link.node]
        leaf = leaves[link.leaf]
        assert link.port == node.su_slot + 1
        assert leaf.su == node.su
        assert leaf.rail == rail_of[link.hca] == link.rail


def test_every_leaf_sees_exactly_one_rail():
    # The SHARP invariant: one aggregation flow per rail needs every leaf on a single rail.
    for name in ("dgx-h100-superpod", "h200-roce", "gb200-nvl72", "sandbox"):
        plan = plan_fabric(build(site_dict(name)))
        rails = defaultdict(set)
        for link in plan.node_links:
            rails[link.leaf].add(link.rail)
        assert all(len(r) == 1 for r in rails.values()), name


@pytest.mark.parametrize("name", ["dgx-h100-superpod", "h200-roce", "gb200-nvl72", "sandbox"])
def test_two_tier_leaves_spread_evenly_over_their_group(name):
    plan = plan_fabric(build(site_dict(name)))
    group_spines = defaultdict(set)
    for s in plan.spines:
        group_spines[s.group].add(s.name)
    per_pair = Counter((lk.lower, lk.upper) for lk in plan.leaf_uplinks)
    for leaf in plan.leaves:
        spines = group_spines[leaf.group]
        counts = [per_pair[(leaf.name, s)] for s in spines]
        # Every leaf reaches every spine of its group, the same number of times.
        assert len(set(counts)) == 1 and counts[0] >= 1
        assert counts[0] * len(spines) == plan.uplinks_per_leaf
    _ports_unique(plan)


def test_spine_count_is_the_least_that_fits_the_ports():
    site = build(site_dict("h200-roce"))  # shared group: 32 leaves x 32 uplinks, radix 128
    plan = plan_fabric(site)
    need = math.ceil(32 * 32 / 128)
    assert len(plan.spines) == need == 8
    used = Counter(lk.upper for lk in plan.leaf_uplinks)
    assert set(used.values()) == {128}


def test_oversubscribed_leaf_uses_fewer_uplinks():
    data = variant("dgx-h100-superpod", fabric={"oversubscription": 2.0})
    plan = plan_fabric(build(data))
    assert plan.downlinks_per_leaf == 42  # floor(64 * 2 / 3)
    assert plan.uplinks_per_leaf == 16  # 32 nodes / 2
    assert plan.oversubscription == 2.0
    # Bisection: each of the 32 leaves pushes 16 x 400 Gb/s through the spines, halved.
    assert plan.bisection_gbps == 32 * 16 * 400 / 2


def _small_three_tier() -> FabricPlan:
    # 20 SUs of 4 nodes on 8-port switches: 20 rail leaves per rail > 8-port spines.
    data = variant(
        "sandbox",
        fabric={"leaf_radix": 8, "spine_radix": 8},
        su_groups=[{"node_type": "emu8", "sus": 20, "nodes_per_su": 4, "nodes_per_rack": 2}],
    )
    return plan_fabric(build(data))


def test_three_tier_plan_is_consistent_and_connected():
    plan = _small_three_tier()
    assert plan.tiers == 3 and plan.cores
    _ports_unique(plan)
    # Non-blocking spines: as many uplinks as downlinks on a full block's spine.
    down = Counter(lk.upper for lk in plan.leaf_uplinks)
    up = Counter(lk.lower for lk in plan.spine_core_links)
    assert max(down.values()) == plan.spine_uplinks
    assert set(up.values()) == {plan.spine_uplinks}
    # Every leaf of a rail reaches every other leaf of that rail.
    adj = defaultdict(set)
    for lk in plan.switch_links:
        adj[lk.lower].add(lk.upper)
        adj[lk.upper].add(lk.lower)
    by_rail = defaultdict(list)
    for leaf in plan.leaves:
        by_rail[leaf.rail].append(leaf.name)
    for leaves in by_rail.values():
        seen, todo = {leaves[0]}, [leaves[0]]
        while todo:
            for nxt in adj[todo.pop()] - seen:
                seen.add(nxt)
                todo.append(nxt)
        assert set(leaves) <= seen


def test_100k_gpu_site_needs_three_tiers_and_stays_within_radix():
    plan = plan_fabric(scale_site(12_500))
    assert plan.tiers == 3
    assert len(plan.node_links) == 12_500 * 8
    assert len({lk.leaf for lk in plan.node_links}) == len(plan.leaves) == 391 * 8
    _ports_unique(plan)


def test_rack_leaves_when_not_rail_optimised():
    data = variant("sandbox", fabric={"rail_optimised": False, "leaf_radix": 64})
    site = build(data)
    plan = plan_fabric(site)
    assert [s.name for s in plan.leaves] == [f"leaf-rack{i}" for i in range(1, 9)]
    assert plan.spine_groups == "shared"
    node = site.inventory.nodes[1]  # slot 1 in rack 1
    ports = sorted(lk.port for lk in plan.node_links if lk.node == node.name)
    assert ports == list(range(9, 17))  # slot 1 x 8 HCAs + 1 ..
    _ports_unique(plan)


def test_single_leaf_site_has_no_spines():
    data = variant(
        "sandbox", fabric={"rails": 1},
        node_types={"emu8": {**site_dict("sandbox")["node_types"]["emu8"],
                             "hcas": [site_dict("sandbox")["node_types"]["emu8"]["hcas"][0]]}},
        su_groups=[{"node_type": "emu8", "sus": 1, "nodes_per_su": 4, "nodes_per_rack": 2}],
    )
    plan = plan_fabric(build(data))
    assert plan.tiers == 1 and not plan.spines and not plan.leaf_uplinks


def test_cable_rows_cover_every_link_once():
    plan = plan_fabric(build(site_dict("sandbox")))
    rows = list(iter_cables(plan))
    assert len(rows) == len(plan.node_links) + len(plan.switch_links)
    assert Counter(r[0] for r in rows) == {"node-leaf": 128, "leaf-spine": 128}


@pytest.mark.parametrize("fabric", [
    {"leaf_radix": 8, "spine_radix": 32, "spine_groups": "shared"},  # 48 leaves > 32
    {"leaf_radix": 8, "spine_radix": 4, "rail_optimised": False},  # 12 rack leaves > 4
])
def test_other_three_tier_shapes_are_consistent(fabric):
    from slurmpod.topology.layout import tree_switches

    data = variant("sandbox", fabric=fabric, su_groups=[
        {"node_type": "emu8", "sus": 6, "nodes_per_su": 4, "nodes_per_rack": 2}])
    if not fabric.get("rail_optimised", True):
        data["fabric"]["leaf_radix"] = 64  # a rack of 2 nodes x 8 HCAs needs 16 ports
        data["fabric"]["spine_radix"] = 8
        data["su_groups"][0]["nodes_per_rack"] = 1
    site = build(data)
    plan = plan_fabric(site)
    assert plan.tiers == 3
    _ports_unique(plan)
    # A spine block never splits an SU's (or rack's) leaves: the logical tree stays a tree.
    tree = tree_switches(site, plan)
    leaves = [t for t in tree if t.nodes]
    assert sorted(h for t in leaves for h in t.nodes) == sorted(site.inventory.by_name)
    assert tree[-1].name == "core" and all(t.switches for t in tree[len(leaves):])
    blocks_of_su = defaultdict(set)
    for leaf in plan.leaves:
        blocks_of_su[leaf.su if leaf.su is not None else leaf.rack].add(leaf.block)
    assert all(len(b) == 1 for b in blocks_of_su.values())
