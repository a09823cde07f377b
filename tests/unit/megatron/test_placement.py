"""Placement of Megatron's parallel groups on nodes, NVLink domains and SUs, checked against a
brute-force re-derivation of megatron-core's rank order (tp-cp-ep-dp-pp)."""

from collections import defaultdict
from itertools import product

import numpy as np
import pytest

from slurmpod.config import load_site, resolve_site_path
from slurmpod.megatron.placement import _along, _kind_axes, node_map_from_arrays, place


def brute_groups(world, tp, cp, dp, pp, ep, etp, edp):
    """Rank coordinates by div/mod, groups = ranks sharing all other coordinates."""
    out = {k: defaultdict(list) for k in ("tp", "cp", "dp", "pp", "ep", "etp", "edp")}
    for r in range(world):
        t, c_, d, p = r % tp, (r // tp) % cp, (r // (tp * cp)) % dp, r // (tp * cp * dp)
        out["tp"][(c_, d, p)].append(r)
        out["cp"][(t, d, p)].append(r)
        out["dp"][(t, c_, p)].append(r)
        out["pp"][(t, c_, d)].append(r)
        et, e, ed, ep_p = r % etp, (r // etp) % ep, (r // (etp * ep)) % edp, r // (etp * ep * edp)
        out["etp"][(e, ed, ep_p)].append(r)
        out["ep"][(et, ed, ep_p)].append(r)
        out["edp"][(et, e, ep_p)].append(r)
    return {k: sorted(tuple(v) for v in g.values()) for k, g in out.items()}


@pytest.mark.parametrize(("tp", "cp", "pp", "ep", "etp", "world"), [
    (2, 1, 2, 4, 1, 16), (4, 2, 2, 8, 2, 64), (8, 1, 4, 2, 8, 64), (1, 1, 1, 8, 1, 8),
    (2, 2, 3, 2, 2, 48),
])
def test_groups_match_bruteforce(tp, cp, pp, ep, etp, world):
    dp = world // (tp * cp * pp)
    edp = world // (etp * ep * pp)
    got = {}  # each kind's groups spelled out from the bases and stride `place` counts with
    for kind, (shape, axis) in _kind_axes(tp, cp, dp, pp, ep, etp, edp).items():
        bases, step, size = _along(shape, axis)
        got[kind] = [list(range(b, b + size * step, step)) for b in bases]
    want = brute_groups(world, tp, cp, dp, pp, ep, etp, edp)
    for kind, rows in got.items():
        assert sorted(tuple(int(x) for x in r) for r in rows) == want[kind], kind


@pytest.fixture(scope="module")
def dgx():
    return load_site(resolve_site_path("dgx-h100-superpod"))


def _node_map(site, nodes):
    inv = site.inventory.nodes
    arr = lambda f: np.array([getattr(n, f) for n in inv])  # noqa: E731
    return node_map_from_arrays(arr("domain"), arr("rack"), arr("su"), nodes, 32, 4, 1)


def brute_crossings(site, nodes, groups, gpn=8, node_map=None):
    inv = site.inventory.nodes if site else None
    dom = (lambda n: inv[n].domain) if inv else (lambda n: node_map.domain[n])
    su = (lambda n: inv[n].su) if inv else (lambda n: node_map.su[n])
    res = {}
    for kind, rows in groups.items():
        cn = cd = cs = most = 0
        aligned = True
        for row in rows:
            ns = {r // gpn for r in row}
            most = max(most, len(ns))
            cn += len(ns) > 1
            cd += len({dom(n) for n in ns}) > 1
            cs += len({su(n) for n in ns}) > 1
            if len(ns) > 1:
                per_node = defaultdict(set)
                for r in row:
                    per_node[r // gpn].add(r % gpn)
                aligned &= len({frozenset(v) for v in per_node.values()}) == 1
        res[kind] = (len(rows), most, cn, cd, cs, aligned)
    return res


@pytest.mark.parametrize(("tp", "cp", "pp", "ep", "etp", "nodes"), [
    (4, 2, 4, 1, 4, 16), (8, 1, 8, 1, 8, 64), (2, 1, 8, 64, 1, 128), (1, 1, 4, 8, 1, 8),
    (2, 1, 1, 1, 2, 2), (8, 1, 2, 4, 1, 40), (1, 1, 1, 16, 1, 2), (2, 1, 1, 3, 1, 3),
    (3, 1, 1, 1, 3, 3), (1, 1, 3, 2, 1, 6), (4, 4, 2, 32, 1, 64),
])
def test_crossings_match_bruteforce(dgx, tp, cp, pp, ep, etp, nodes):
    world = nodes * 8
    p = place(tp=tp, cp=cp, pp=pp, ep=ep, etp=etp, nodes=nodes, gpus_per_node=8,
              node_map=_node_map(dgx, nodes), block_nodes=32)
    groups = brute_groups(world, tp, cp, world // (tp * cp * pp), pp, ep, etp,
                          world // (etp * ep * pp))
    want = brute_crossings(dgx, nodes, groups)
    for kind, g in p.groups.items():
        assert (g.count, g.max_nodes, g.cross_node, g.cross_domain, g.cross_su,
                g.rail_aligned) == want[kind], kind
    assert p.min_sus == -(-nodes // 32)
    assert p.sus_spanned == p.min_sus  # contiguous from an SU boundary


def test_hand_derived_llama70b_on_16_nodes(dgx):
    # TP=4 CP=2 PP=4: TP and CP stay in the node (4 x 2 = 8 GPUs); DP=4 has stride 8 (one node)
    # so every DP group spans 4 nodes on one local rank; PP stride 32 -> 4 nodes apart.
    p = place(tp=4, cp=2, pp=4, ep=1, etp=4, nodes=16, gpus_per_node=8,
              node_map=_node_map(dgx, 16), block_nodes=32)
    g = p.groups
    assert (g["tp"].cross_node, g["cp"].cross_node) == (0, 0)
    assert (g["dp"].count, g["dp"].max_nodes, g["dp"].cross_node) == (32, 4, 32)
    assert g["dp"].rail_aligned and g["pp"].rail_aligned
    assert g["pp"].cross_su == 0 and p.sus_spanned == 1 and p.racks_spanned == 4


def test_not_rail_aligned_when_local_ranks_differ(dgx):
    # TP=3 is invalid for Megatron on 8-GPU nodes but shows the rule: DP groups then hold
    # different local ranks on different nodes.
    p = place(tp=3, cp=1, pp=1, ep=1, etp=3, nodes=3, gpus_per_node=8,
              node_map=_node_map(dgx, 3), block_nodes=32)
    assert not p.groups["dp"].rail_aligned


def test_crossing_sus_beyond_32_nodes(dgx):
    p = place(tp=8, cp=1, pp=4, ep=1, etp=8, nodes=64, gpus_per_node=8,
              node_map=_node_map(dgx, 64), block_nodes=32)
    assert p.min_sus == 2 and p.sus_spanned == 2
    # PP stride = TP x DP = 8 x 16 = 128 ranks = 16 nodes: stages 0,1 in SU 0, stages 2,3 in SU 1
    assert p.groups["pp"].cross_su == p.groups["pp"].count
    assert p.groups["dp"].cross_su == 0


def test_oversize_request_extrapolates(dgx):
    nm = _node_map(dgx, 200)
    assert len(nm.su) == 200 and nm.su[-1] == 6  # 128 real nodes (4 SUs) + 72 more of 32


@pytest.mark.parametrize("tp", [1, 2, 4, 8])
def test_tp_groups_never_cross_nodes_when_dividing(dgx, tp):
    for nodes, pp in product([1, 4], [1, 2]):
        if (nodes * 8) % (tp * pp):
            continue
        p = place(tp=tp, cp=1, pp=pp, ep=1, etp=tp, nodes=nodes, gpus_per_node=8,
                  node_map=_node_map(dgx, nodes), block_nodes=32)
        assert p.groups["tp"].cross_node == 0


def test_rank_location(dgx):
    from slurmpod.megatron.placement import rank_location

    nm = _node_map(dgx, 64)
    # rank 8*33 + 5: job node 33 (second SU, its rack 8 of 4-node racks), local rank / rail 5
    assert rank_location(8 * 33 + 5, 8, nm) == {"rank": 269, "node": 33, "local_rank": 5,
                                                "domain": 33, "rack": 8, "su": 1}


def assert_matches_bruteforce(tp, cp, pp, ep, etp, nodes, gpn, nm, block_nodes):
    """`place` on a synthetic node map agrees with listing every group's ranks."""
    world = nodes * gpn
    p = place(tp=tp, cp=cp, pp=pp, ep=ep, etp=etp, nodes=nodes, gpus_per_node=gpn,
              node_map=nm, block_nodes=block_nodes)
    groups = brute_groups(world, tp, cp, world // (tp * cp * pp), pp, ep, etp,
                          world // (etp * ep * pp))
    want = brute_crossings(None, nodes, groups, gpn=gpn, node_map=nm)
    for kind, g in p.groups.items():
        assert (g.count, g.max_nodes, g.cross_node, g.cross_domain, g.cross_su,
                g.rail_aligned) == want[kind], (tp, cp, pp, ep, etp, kind)


@pytest.mark.parametrize(("tp", "cp", "pp", "ep", "etp"), [
    (1, 1, 2, 32, 1), (2, 1, 8, 8, 1), (4, 2, 2, 16, 1), (1, 2, 3, 4, 2), (2, 1, 1, 72, 1),
])
def test_crossings_on_rack_scale_domains(tp, cp, pp, ep, etp):
    # GB200 NVL72: 4 GPUs per node, 18 nodes per NVLink domain, 2 domains per SU here; 144
    # nodes make the group counts large and the domain boundaries fall inside groups.
    nodes, gpn = 144, 4
    d = [n // 18 for n in range(nodes)]
    nm = node_map_from_arrays(d, d, [n // 36 for n in range(nodes)], nodes, 36, 18, 18)
    world = nodes * gpn
    if world % (tp * cp * pp) or world % (etp * ep * pp):
        pytest.skip("layout does not divide")
    assert_matches_bruteforce(tp, cp, pp, ep, etp, nodes, gpn, nm, 18)


@pytest.mark.parametrize(("gpn", "nodes"), [(8, 6), (4, 12), (8, 8)])
def test_every_layout_of_a_small_world_matches_bruteforce(gpn, nodes):
    # Every (TP, CP, PP, EP, ETP) that divides the world, including TP sizes that do not divide
    # the node (TP 3, 6): the counting shortcuts must agree with listing each group's ranks.
    world = gpn * nodes
    divs = [d for d in range(1, world + 1) if world % d == 0]
    nm = node_map_from_arrays([n // 2 for n in range(nodes)], [n // 2 for n in range(nodes)],
                              [n // 3 for n in range(nodes)], nodes, 3, 2, 2)
    checked = 0
    for tp, cp, pp, ep, etp in product(divs, divs, divs, divs, divs):
        if world % (tp * cp * pp) or world % (etp * ep * pp):
            continue
        assert_matches_bruteforce(tp, cp, pp, ep, etp, nodes, gpn, nm, 3)
        checked += 1
    assert checked > 100
