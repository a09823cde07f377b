"""Site model: inventory numbering, derived properties and the validation the CLI relies on."""

from __future__ import annotations

import pytest
from msgspec import ValidationError

from slurmpod.config import load_site
from slurmpod.errors import ConfigError
from tests.unit.topology.test_support import EXAMPLE_SITES, build, site_dict, variant, write


@pytest.mark.parametrize("name", EXAMPLE_SITES)
def test_example_sites_load(name):
    site = load_site(f"site_configs/{name}.toml")
    assert site.site.name == name
    assert len(site.inventory.nodes) == sum(g.sus * g.nodes_per_su for g in site.su_groups)


def test_sandbox_contract_names():
    # The sandbox capability depends on these names.
    inv = build(site_dict("sandbox")).inventory
    assert [n.name for n in inv.nodes] == [f"gpu{i:03d}" for i in range(1, 17)]
    assert inv.su_names == ("su1", "su2", "su3", "su4")
    assert [n.su for n in inv.nodes] == [i // 4 for i in range(16)]


def test_inventory_positions():
    inv = build(site_dict("dgx-h100-superpod")).inventory
    node = inv.by_name["dgx0038"]  # 38th node: SU 2, 6th in the SU, rack 10 (4 per rack)
    assert (node.index, node.su, node.su_slot, node.rack, node.slot) == (37, 1, 5, 9, 1)
    assert inv.rack_names[node.rack] == "r10"


def test_nvl72_domains_are_racks_and_per_rack_names():
    site = build(site_dict("gb200-nvl72"))
    inv = site.inventory
    assert inv.nodes[0].name == "gb01n01" and inv.nodes[18].name == "gb02n01"
    assert all(n.domain == n.rack for n in inv.nodes)
    assert inv.domain_names[:2] == ("nvl01", "nvl02")
    assert site.topology_plugin == "block"


def test_topology_plugin_auto_rules():
    assert build(variant("dgx-h100-superpod", slurm={"topology": "auto"})).topology_plugin \
        == "tree"
    old = variant("gb200-nvl72", slurm={"version": "23.02"})
    assert build(old).topology_plugin == "tree"  # block needs 23.11


@pytest.mark.parametrize(("name", "rack_scale"), [
    ("gb200-nvl72", True), ("dgx-h100-superpod", False), ("h200-roce", False),
    ("sandbox", False)])
def test_the_rack_scale_rule(name, rack_scale):
    """The one home of "NVLink reaches past the node" (blocks, IMEX, segments follow it)."""
    site = build(site_dict(name))
    assert site.rack_scale_nvlink is rack_scale
    assert site.topology_plugin_for((23, 2)) == "tree"
    assert site.topology_plugin_for((23, 11)) == ("block" if rack_scale else "tree")
    data = site_dict("sandbox")
    data["node_types"]["emu8"]["nvlink_domain_gpus"] = 32
    data["su_groups"][0]["nodes_per_rack"] = 4
    assert build(data).rack_scale_nvlink  # a domain of four 8-GPU nodes is rack-scale too


def test_numa_cores_split_evenly():
    nt = build(site_dict("h200-roce")).node_types["hgx-h200"]
    assert (nt.numa_cores(0), nt.numa_cores(1)) == (range(0, 56), range(56, 112))


def test_leaf_downlinks_follow_oversubscription():
    assert build(site_dict("dgx-h100-superpod")).leaf_downlinks == 32
    assert build(variant("dgx-h100-superpod",
                         fabric={"oversubscription": 3.0})).leaf_downlinks == 48


def test_first_node_offsets_numbering():
    site = build(variant("sandbox", naming={"first_node": 0, "hostname": "gpu{n:03d}"}))
    assert site.inventory.nodes[0].name == "gpu000"


@pytest.mark.parametrize(("base", "section", "value", "needle"), [
    ("gb200-nvl72", "naming", {"domain": "nvl"}, "naming.domain: 'nvl' gives 'nvl' twice"),
    ("gb200-nvl72", "naming", {"domain": "rack{domain:02d}"},
     "naming.domain: 'rack01' is also a host, SU or rack name"),
    ("sandbox", "naming", {"su": "r{su}", "rack": "r{rack}"},
     "naming.rack: 'r1' is also a host, SU or rack name"),
    ("sandbox", "naming", {"hostname": "gpu{n:03d}{bogus}"}, "naming.hostname: unknown field"),
    ("sandbox", "slurm", {"node_weights": {"nope": 3}}, "slurm.node_weights: unknown node type"),
    ("h200-roce", "fabric", {"sharp": True},
     "fabric.sharp: SHARP needs an InfiniBand fabric but kind = 'roce'; set sharp = false"),
    ("gb200-nvl72", "slurm", {"imex": "yes"}, "slurm.imex"),
])
def test_invalid_sites(base, section, value, needle, tmp_path):
    path = write(tmp_path, variant(base, **{section: value}))
    with pytest.raises(ConfigError) as info:
        load_site(path)
    assert needle in info.value.message and str(path) in info.value.message


def test_storage_hca_must_not_have_a_rail():
    data = site_dict("sandbox")
    nt = data["node_types"]["emu8"]
    nt["hcas"].append({"device": "mlx5_9", "role": "storage", "rail": 3,
                       "bus_id": "0000:aa:00.0", "numa": 1})
    with pytest.raises(ValidationError, match="storage HCA has no rail"):
        build(data)
