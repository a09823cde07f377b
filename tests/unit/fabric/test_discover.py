"""`discover_site` + `draft_site_toml`: generate -> synthesize fabric -> discover reproduces the
site's topology (same SUs, same leaf node sets), and the draft is a site `load_site` accepts."""

from __future__ import annotations

import re

import pytest

from slurmpod.config import builtin_site_path, load_site
from slurmpod.errors import ConfigError
from slurmpod.fabric.check import check_fabric, compile_filters
from slurmpod.fabric.discover import discover_site, draft_site_toml, natural_key
from slurmpod.fabric.ibnetdiscover import parse, parse_file
from slurmpod.fabric.synth import Fault, synthesize
from slurmpod.topology.fabric_plan import plan_fabric
from tests.helpers import DATA_DIR

DATA = DATA_DIR / "ibnetdiscover"


def leaf_sets(site, plan):
    """{(su hosts, rail): leaf node set} — what Slurm's tree and SHARP see, names aside."""
    inv = site.inventory
    out = {}
    for leaf in plan.leaves:
        hosts = frozenset(nl.node for nl in plan.node_links if nl.leaf == leaf.name)
        su_hosts = frozenset(n.name for n in inv.nodes_in_su(leaf.su))
        out[(su_hosts, leaf.rail)] = hosts
    return out


def round_trip(tmp_path, name, storage=False, filters=()):
    site = load_site(builtin_site_path(name))
    plan = plan_fabric(site)
    text = synthesize(site, plan, storage=storage)
    found = discover_site(parse(text), compile_filters(filters))
    draft = tmp_path / "site.toml"
    draft.write_text(draft_site_toml(found, "drafted"))
    return site, plan, load_site(draft), text, found


@pytest.mark.parametrize(("name", "storage", "filters"), [
    ("sandbox", False, ()),
    ("dgx-h100-superpod", True, (r"mlx5_[78]$",)),
])
def test_round_trip_reproduces_sus_and_leaf_node_sets(tmp_path, name, storage, filters):
    site, plan, drafted, text, found = round_trip(tmp_path, name, storage, filters)
    inv, dinv = site.inventory, drafted.inventory
    assert [n.name for n in dinv.nodes] == [n.name for n in inv.nodes]
    assert [[n.name for n in dinv.nodes_in_su(s)] for s in range(len(dinv.su_names))] == \
        [[n.name for n in inv.nodes_in_su(s)] for s in range(len(inv.su_names))]
    dplan = plan_fabric(drafted)
    assert leaf_sets(drafted, dplan) == leaf_sets(site, plan)
    # Same rail HCAs in the same order, same link rate, spine grouping and uplink count.
    rails = [h.device for h in site.node_types[site.su_groups[0].node_type].compute_hcas]
    assert found.rails == rails
    assert (drafted.fabric.link_gbps, drafted.fabric.spine_groups) == (
        site.fabric.link_gbps, site.fabric.spine_groups)
    assert dplan.uplinks_per_leaf == plan.uplinks_per_leaf
    assert len(dplan.spines) == len(plan.spines)
    # The drafted site's plan describes this very fabric: checking it finds nothing.
    report = check_fabric(drafted, dplan, parse(text), compile_filters(filters))
    assert report.clean, report.findings[:3]


def test_storage_hcas_become_storage_role(tmp_path):
    _site, _plan, drafted, _text, found = round_trip(
        tmp_path, "dgx-h100-superpod", storage=True, filters=(r"mlx5_[78]$",))
    assert found.storage_hcas == ["mlx5_7", "mlx5_8"]
    roles = {h.device: h.role for h in drafted.node_types["discovered"].hcas}
    assert roles["mlx5_7"] == roles["mlx5_8"] == "storage"
    assert found.kept_apart == 256


def test_a_miscabled_node_does_not_split_its_su(tmp_path):
    site = load_site(builtin_site_path("sandbox"))
    plan = plan_fabric(site)
    text = synthesize(site, plan, [Fault("swap", "gpu001:mlx5_0,gpu005:mlx5_0"),
                                   Fault("swap", "gpu002:mlx5_1,gpu002:mlx5_2")])
    found = discover_site(parse(text))
    assert found.sus == [[f"gpu{i:03d}" for i in range(s * 4 + 1, s * 4 + 5)] for s in range(4)]
    assert all(sorted(su) == list(range(8)) for su in found.su_leaves)


def test_partial_su_becomes_its_own_group(tmp_path):
    site = load_site(builtin_site_path("sandbox"))
    plan = plan_fabric(site)
    gone = [Fault("missing", f"gpu016:mlx5_{r}") for r in range(8)]
    found = discover_site(parse(synthesize(site, plan, gone)))
    assert [len(s) for s in found.sus] == [4, 4, 4, 3]
    text = draft_site_toml(found, "partial")
    assert text.count("[[su_groups]]") == 2 and "sus = 3" in text
    draft = tmp_path / "site.toml"
    draft.write_text(text)
    assert len(load_site(draft).inventory.nodes) == 15


def test_hand_written_sample(tmp_path):
    found = discover_site(parse_file(DATA / "basic.txt"))
    assert found.sus == [["dgx0001", "dgx0002"]]
    assert found.rails == ["mlx5_0", "mlx5_1"]
    assert found.su_leaves == [{0: ["su1-leaf-r0"], 1: ["su1-leaf-r1"]}]
    assert found.spines == ["spine-1"] and found.spine_groups == "shared"
    assert found.link_gbps == 400  # most links are 4xNDR; one 2xNDR is a fault, not the rate
    draft = tmp_path / "site.toml"
    draft.write_text(draft_site_toml(found, "tiny"))
    site = load_site(draft)
    assert [n.name for n in site.inventory.nodes] == ["dgx0001", "dgx0002"]
    report = check_fabric(site, plan_fabric(site), parse_file(DATA / "basic.txt"))
    assert [f.kind for f in report.findings] == ["degraded-link"]


def test_no_compute_hcas_is_a_clear_error():
    text = 'Switch\t36 "S-01"\t\t# "MF0;sw:X/U1" enhanced port 0 lid 1 lmc 0\n'
    with pytest.raises(ConfigError, match="no compute HCAs"):
        discover_site(parse(text, "empty.txt"))


def test_draft_lists_the_hosts_it_saw(tmp_path):
    site = load_site(builtin_site_path("sandbox"))
    found = discover_site(parse(synthesize(site)))
    text = draft_site_toml(found, "x")
    assert re.search(r'^hosts = "gpu\[001-016\]"$', text, re.M)
    assert "hostname =" not in text  # no pattern: a pattern can name hosts that do not exist


def test_natural_key_orders_devices_like_nccl_ib_hca():
    devs = ["mlx5_10", "mlx5_3", "mlx5_0", "mlx5_11", "mlx5_9"]
    assert sorted(devs, key=natural_key) == ["mlx5_0", "mlx5_3", "mlx5_9", "mlx5_10", "mlx5_11"]


def test_rack_leaves_of_a_fabric_that_is_not_rail_optimised(tmp_path):
    import tomllib

    from slurmpod.config import validate
    from slurmpod.model.site import Site

    data = tomllib.loads(builtin_site_path("sandbox").read_text())
    data["fabric"].update(rail_optimised=False, leaf_radix=40)
    site = validate(Site, data, "non-rail")
    plan = plan_fabric(site)
    text = synthesize(site, plan, [Fault("swap", "gpu001:mlx5_0,gpu003:mlx5_0")])
    report = check_fabric(site, plan, parse(text))
    assert [f.kind for f in report.findings] == ["swapped-cables"]
    found = discover_site(parse(synthesize(site, plan)))
    assert not found.rail_optimised
    assert found.sus == [[f"gpu{i:03d}", f"gpu{i + 1:03d}"] for i in range(1, 17, 2)]  # racks
    draft = tmp_path / "site.toml"
    draft.write_text(draft_site_toml(found, "nonrail"))
    drafted = load_site(draft)
    assert check_fabric(drafted, plan_fabric(drafted), parse(synthesize(site, plan))).clean
