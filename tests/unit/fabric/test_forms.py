"""Fabrics in the shapes real ones have: the DGX SuperPOD H100 reference architecture (shared
spines, QM9700 twin-port cages), per-rail planes saved as one dump per subnet, node descriptions
in every real form, irregular host names, mixed node types. Clean fabrics give no findings, each
fault one finding with its location and fix, and `discover` -> `check` is clean."""

from __future__ import annotations

import os
import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest

from slurmpod.config import builtin_site_path, validate
from slurmpod.errors import ConfigError
from slurmpod.fabric.check import FINDING_KINDS, LOCATION_KEYS, check_fabric
from slurmpod.fabric.discover import discover_site, draft_site_toml
from slurmpod.fabric.ibnetdiscover import host_device, merge, parse
from slurmpod.fabric.synth import Fault, synthesize, synthesize_planes
from slurmpod.model.hostlist import expand
from slurmpod.model.site import Site
from slurmpod.topology.fabric_plan import plan_fabric

DOCS = Path(__file__).resolve().parents[3] / "docs" / "fabric-check.md"


def make_site(name: str = "dgx-h100-superpod", *, fabric: dict | None = None,
              groups: list[dict] | None = None, **top: object) -> Site:
    data = tomllib.loads(builtin_site_path(name).read_text())
    data["fabric"].update(fabric or {})
    if groups is not None:
        data["su_groups"] = groups
        data["partitions"] = [p for p in data.get("partitions", []) if "sus" not in p]
    data.update(top)
    return validate(Site, data, name)


SHARED = make_site()
PER_RAIL = make_site(fabric={"spine_groups": "per_rail"})


def fabric_of(site: Site, *, planes: bool = False, **kw: object):
    texts = synthesize_planes(site, plan_fabric(site), planes=planes, **kw)
    return merge([parse(t, f"plane{i}.txt") for i, t in enumerate(texts)])


def drafted(fabric) -> Site:
    return validate(Site, tomllib.loads(draft_site_toml(discover_site(fabric), "drafted")),
                    "draft")


@pytest.mark.parametrize("sus", [1, 2, 3, 4])
def test_superpod_preset_has_the_reference_architectures_switch_counts(sus):
    # DGX SuperPOD H100 RA (RA-11333-001 V11), Table 4: leaves / spines for 1-4 SUs.
    site = make_site(groups=[{"node_type": "dgx-h100", "sus": sus, "nodes_per_su": 32,
                              "nodes_per_rack": 4}])
    plan = plan_fabric(site)
    assert (len(plan.leaves), len(plan.spines), len(plan.leaf_uplinks)) == \
        {1: (8, 4, 256), 2: (16, 8, 512), 3: (24, 16, 768), 4: (32, 16, 1024)}[sus]
    assert plan.spine_groups == "shared" and plan.cage_ports == 2


@pytest.mark.parametrize("site", [SHARED, PER_RAIL], ids=["shared", "per_rail"])
@pytest.mark.parametrize("desc", ["mlx5", "hca", "fqdn"])
@pytest.mark.parametrize("uplinks", ["plan", "cage", "shuffle"])
def test_every_form_is_clean_and_discovers_back_to_a_clean_draft(site, desc, uplinks):
    fab = fabric_of(site, planes=site is PER_RAIL, desc=desc, uplinks=uplinks)
    report = check_fabric(site, plan_fabric(site), fab)
    assert report.clean, report.findings[:3]
    draft = drafted(fab)
    assert [n.name for n in draft.inventory.nodes] == [n.name for n in site.inventory.nodes]
    assert draft.fabric.spine_groups == site.fabric.spine_groups
    assert (draft.fabric.leaf_radix, draft.fabric.switch_model) == (64, "QM9700")  # not 65
    again = check_fabric(draft, plan_fabric(draft), fab)
    assert again.clean, again.findings[:3]


def test_description_forms_name_host_and_verbs_device():
    assert host_device("dgx0001 HCA-1") == ("dgx0001", "mlx5_0")
    assert host_device("dgx0001 HCA-12") == ("dgx0001", "mlx5_11")
    assert host_device("dgx01.cluster.local mlx5_3") == ("dgx01.cluster.local", "mlx5_3")
    for unset in ("MT4129 ConnectX7 Mellanox Technologies", "", "0x0c42a10300f1e2d4"):
        assert host_device(unset) == (None, None)


def test_one_node_with_unset_descriptions_is_one_finding_never_missing():
    site = SHARED
    report = check_fabric(site, plan_fabric(site), fabric_of(site, faults=[
        Fault("unset", "dgx0005")]))
    assert [f.kind for f in report.findings] == ["unset-description"]
    f = report.findings[0]
    # dgx0005 is su_slot 4: leaf port 5, cage 3 of every su1 rail leaf.
    assert (f.node, f.hca, f.rail, f.switch, f.port, f.cage) == (
        "dgx0005", "mlx5_0", 0, "leaf-su1-rail0", 5, 3)
    assert f.guid and len(f.guid) == 16 and f.guid in f.message
    assert "rdma-ndd" in f.fix and "dgx0005" in f.fix and "missing" not in f.message
    assert report.stats["hca_links_seen"] == 1024


@pytest.mark.parametrize("form", ["unset", "empty"])
def test_a_whole_fabric_without_descriptions(form):
    site = SHARED
    fab = fabric_of(site, desc=form)
    report = check_fabric(site, plan_fabric(site), fab)
    assert [f.kind for f in report.findings] == ["unset-description"]
    assert report.findings[0].subject == "all nodes"
    with pytest.raises(ConfigError, match="no compute HCAs"):
        discover_site(fab)


def test_unset_ca_outside_any_planned_port_is_named_by_guid_and_port():
    site = make_site("sandbox")
    text = synthesize(site, plan_fabric(site), [Fault("unknown-node", "x")])
    text = text.replace('"x mlx5_0"', '"MT4129 ConnectX7 Mellanox Technologies"')
    report = check_fabric(site, plan_fabric(site), parse(text))
    assert [f.kind for f in report.findings] == ["unset-description"]
    f = report.findings[0]
    assert f.node is None and f.guid and f.switch == "leaf-su1-rail0" and f.port == 5
    assert f"GUID {f.guid}" in f.message


def test_renamed_hca_gets_a_fix_for_the_name_not_the_cable():
    site = SHARED
    report = check_fabric(site, plan_fabric(site), fabric_of(site, faults=[
        Fault("rename", "dgx0006:mlx5_3=mlx5_12")]))
    assert [f.kind for f in report.findings] == ["renamed-hca"]
    f = report.findings[0]
    assert (f.node, f.hca, f.rail, f.switch, f.port) == ("dgx0006", "mlx5_3", 1,
                                                         "leaf-su1-rail1", 6)
    assert "mlx5_12" in f.message and "node_types.dgx-h100.hcas" in f.fix


# The RA's own node count: 127 DGX in 4 SUs, the first SU of 31 (UFM takes a port), so a node
# can be moved into it and an intruder find a free port.
RA127 = make_site(groups=[
    {"node_type": "dgx-h100", "sus": 1, "nodes_per_su": 31, "nodes_per_rack": 31},
    {"node_type": "dgx-h100", "sus": 3, "nodes_per_su": 32, "nodes_per_rack": 4}])

# Each fault on the RA-shaped fabric (shared spines, cages, uplinks in shuffled ports): one
# finding, its location, its fix.
FAULTS = [
    (Fault("swap", "dgx0001:mlx5_0,dgx0001:mlx5_3"), "shuffle", "swapped-cables",
     {"node": "dgx0001", "hca": "mlx5_0", "switch": "leaf-su1-rail1", "port": 1, "cage": 1},
     "leaf-su1-rail0 port 1 (cage 1)"),
    (Fault("missing", "dgx0002:mlx5_4"), "shuffle", "missing-link",
     {"node": "dgx0002", "hca": "mlx5_4", "rail": 2, "switch": "leaf-su1-rail2", "port": 2,
      "cage": 1}, "reseat or replace the cable dgx0002 mlx5_4 <-> leaf-su1-rail2 port 2"),
    (Fault("slow", "dgx0040:mlx5_5=4xHDR"), "shuffle", "degraded-link",
     {"node": "dgx0040", "hca": "mlx5_5", "rail": 3, "switch": "leaf-su2-rail3", "port": 9,
      "cage": 5}, "reseat or replace the cable/transceiver dgx0040 mlx5_5"),
    (Fault("move", "dgx0040=su1"), "shuffle", "wrong-su",
     {"node": "dgx0040", "switch": "leaf-su1-rail0", "port": 32, "cage": 16},
     "move its 8 cables to the su2 rail leaves, port 9"),
    (Fault("unknown-node", "intruder01"), "shuffle", "unknown-node",
     {"node": "intruder01", "switch": "leaf-su1-rail0", "port": 32}, "add it to the site file"),
    (Fault("missing", "leaf-su3-rail4:47"), "shuffle", "missing-link",
     {"switch": "leaf-su3-rail4", "rail": 4, "port": 47, "cage": 24},
     "reseat or replace 1 cable leaf-su3-rail4 <-> spine-"),
    (Fault("swap", "leaf-su1-rail0:33,leaf-su1-rail1:35"), "plan", "swapped-cables",
     {"switch": "leaf-su1-rail0", "port": 33, "cage": 17, "rail": 0},
     "swap the cables in spine-"),
]


@pytest.mark.parametrize(("fault", "uplinks", "kind", "where", "fix"), FAULTS,
                         ids=[f"{f.kind}-{k}" for f, _u, k, _w, _x in FAULTS])
def test_each_fault_is_one_finding_at_its_place(fault, uplinks, kind, where, fix):
    site = RA127
    report = check_fabric(site, plan_fabric(site), fabric_of(site, faults=[fault],
                                                             uplinks=uplinks))
    assert [f.kind for f in report.findings] == [kind], report.findings
    f = report.findings[0]
    for key, value in where.items():
        assert getattr(f, key) == value, (key, f)
    assert fix in f.fix


def test_an_uplink_on_the_wrong_spine_is_one_move():
    site = SHARED
    text = synthesize(site, plan_fabric(site))
    # leaf-su1-rail0 port 33 goes to spine-1 port 1; re-land it on a free port of spine-2.
    fab = parse(text)
    leaf = next(n for n in fab.switches() if n.name == "leaf-su1-rail0")
    sp1 = next(n for n in fab.switches() if n.name == "spine-1")
    sp2 = next(n for n in fab.switches() if n.name == "spine-2")
    port = leaf.ports[33]
    assert port.remote_id == sp1.node_id
    del sp1.ports[port.remote_port]
    leaf.ports[33] = port._replace(remote_id=sp2.node_id, remote_port=64)
    sp2.ports[64] = port._replace(num=64, remote_id=leaf.node_id, remote_port=33)
    report = check_fabric(site, plan_fabric(site), fab)
    assert [f.kind for f in report.findings] == ["wrong-uplink"]
    f = report.findings[0]
    assert (f.switch, f.port, f.cage) == ("leaf-su1-rail0", 33, 17)
    assert "1 of 2 planned links to spine-1" in f.message and "spine-1" in f.fix


def test_per_rail_planes_merge_and_a_lost_plane_is_not_clean():
    site = PER_RAIL
    texts = synthesize_planes(site, plan_fabric(site))
    assert len(texts) == 8
    whole = merge([parse(t, f"rail{i}.txt") for i, t in enumerate(texts)])
    assert check_fabric(site, plan_fabric(site), whole).clean
    assert whole.sources == tuple(f"rail{i}.txt" for i in range(8))
    partial = merge([parse(t, f"rail{i}.txt") for i, t in enumerate(texts[:7])])
    assert not check_fabric(site, plan_fabric(site), partial).clean


def test_irregular_host_names_are_written_exactly_as_seen():
    names = ([f"a05-p1-dgx-01-c{i:02d}" for i in range(1, 9)]
             + ["a05-p1-dgx-02-c01", "a05-p1-dgx-02-c03", "gpu-spare", "a06-p2-dgx-01-c10"]
             + [f"a06-p2-dgx-01-c{i}" for i in (7, 8, 9, 11)])
    from slurmpod.model.hostlist import compress

    site = make_site("sandbox", groups=[{"node_type": "emu8", "sus": 4, "nodes_per_su": 4,
                                         "nodes_per_rack": 4, "hosts": compress(names)}])
    assert [n.name for n in site.inventory.nodes] == names
    fab = fabric_of(site, desc="fqdn")
    text = draft_site_toml(discover_site(fab), "x")
    hosts = [h for g in tomllib.loads(text)["su_groups"] for h in expand(g["hosts"])]
    assert hosts == names  # every name seen, none invented, in leaf-port order
    draft = validate(Site, tomllib.loads(text), "draft")
    assert check_fabric(draft, plan_fabric(draft), fab).clean


SCONTROL = shutil.which("scontrol")


@pytest.mark.skipif(SCONTROL is None, reason="Slurm's scontrol is not installed")
def test_discovered_hostlists_expand_in_slurm_to_exactly_the_names_seen(tmp_path):
    # scontrol's hostlist commands work without a controller (tests/unit/
    # test_topology_hostlist_scontrol.py); the expression must expand to the very names seen.
    names = ([f"a05-p1-dgx-01-c{i:02d}" for i in range(1, 12)] + ["a05-p1-dgx-01-c9", "x7"]
             + [f"dgx{i}" for i in (8, 9, 10, 11)] + ["dgx012"])
    from slurmpod.model.hostlist import compress

    site = make_site("sandbox", groups=[{"node_type": "emu8", "sus": 2, "nodes_per_su": 9,
                                         "nodes_per_rack": 9, "hosts": compress(names)}],
                     fabric={"leaf_radix": 24})
    text = draft_site_toml(discover_site(fabric_of(site)), "x")
    conf = tmp_path / "slurm.conf"
    conf.write_text("ClusterName=x\nSlurmctldHost=localhost\nNodeName=n1\n"
                    "PartitionName=p Nodes=n1\n")
    env = {**os.environ, "SLURM_CONF": str(conf)}
    got: list[str] = []
    for group in tomllib.loads(text)["su_groups"]:
        out = subprocess.run([SCONTROL, "show", "hostnames", group["hosts"]], env=env,
                             capture_output=True, text=True, timeout=30, check=True).stdout
        got += out.split()
    assert got == names


def test_mixed_node_types_keep_their_own_rails():
    site_data = tomllib.loads(builtin_site_path("sandbox").read_text())
    other = dict(site_data["node_types"]["emu8"])
    other["hcas"] = [dict(h, device=f"mlx5_{[0, 3, 4, 5, 6, 9, 10, 11][h['rail']]}")
                     for h in other["hcas"]]
    site_data["node_types"]["dgxlike"] = other
    site_data["su_groups"] = [{"node_type": "emu8", "sus": 2, "nodes_per_su": 4,
                               "nodes_per_rack": 4},
                              {"node_type": "dgxlike", "sus": 2, "nodes_per_su": 4,
                               "nodes_per_rack": 4}]
    site_data["partitions"] = []
    site = validate(Site, site_data, "mixed")
    fab = fabric_of(site)
    assert check_fabric(site, plan_fabric(site), fab).clean
    found = discover_site(fab)
    assert len(found.type_rails) == 2 and all(len(t) == 8 for t in found.type_rails)
    draft = drafted(fab)
    assert draft.fabric.rails == 8 and len(draft.node_types) == 2
    assert check_fabric(draft, plan_fabric(draft), fab).clean


def test_json_locations_and_the_documented_kind_list():
    site = SHARED
    report = check_fabric(site, plan_fabric(site), fabric_of(site, faults=[
        Fault("missing", "dgx0002:mlx5_4")]))
    d = report.findings[0].to_dict()
    assert list(d["location"]) == list(LOCATION_KEYS)
    doc = DOCS.read_text()
    for kind in FINDING_KINDS:
        assert f"| `{kind}`" in doc, kind
