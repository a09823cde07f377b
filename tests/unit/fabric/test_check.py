"""`check_fabric`: a clean synthesized fabric has no findings; every injected fault kind gives the
finding (and fix) that names it; storage HCAs are kept apart; the hand-written sample."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slurmpod.config import builtin_site_path, load_site
from slurmpod.fabric.check import LOCATION_KEYS, check_fabric, compile_filters
from slurmpod.fabric.ibnetdiscover import parse, parse_file
from slurmpod.fabric.synth import Fault, synthesize
from slurmpod.topology.fabric_plan import plan_fabric
from tests.helpers import DATA_DIR

DATA = DATA_DIR / "ibnetdiscover"


@pytest.fixture(scope="module")
def sandbox():
    site = load_site(builtin_site_path("sandbox"))
    return site, plan_fabric(site)


@pytest.fixture(scope="module")
def superpod():
    site = load_site(builtin_site_path("dgx-h100-superpod"))
    return site, plan_fabric(site)


def run(site_plan, faults=(), storage=False, filters=()):
    site, plan = site_plan
    text = synthesize(site, plan, [Fault(k, s) for k, s in faults], storage=storage)
    return check_fabric(site, plan, parse(text), compile_filters(filters))


def kinds(report):
    return sorted(f.kind for f in report.findings)


def test_clean_fabric_has_no_findings(sandbox, superpod):
    for sp in (sandbox, superpod):
        report = run(sp)
        assert report.clean, report.findings
        assert report.stats["hca_links_seen"] == len(sp[1].node_links)
        assert report.notes == []  # names match: nothing was matched by cables


def test_crossed_pair_of_one_node_is_one_swap(sandbox):
    report = run(sandbox, [("swap", "gpu001:mlx5_0,gpu001:mlx5_1")])
    assert kinds(report) == ["swapped-cables"]
    f = report.findings[0]
    assert "gpu001 mlx5_0 (rail 0)" in f.message and "gpu001 mlx5_1 (rail 1)" in f.message
    # Node gpu001 is su_slot 0: its HCAs plug into port 1 of the su1 rail-0 and rail-1 leaves.
    assert re.search(r"swap the cables in leaf-su1-rail[01] port 1 and leaf-su1-rail[01] port 1",
                     f.fix)
    assert report.stats["leaves_mixing_rails"] == 2  # both rail leaves now see a foreign rail
    same_rail = run(sandbox, [("swap", "gpu001:mlx5_0,gpu005:mlx5_0")])
    assert same_rail.stats["leaves_mixing_rails"] == 0  # wrong SU, but every leaf keeps its rail


def test_a_chain_of_three_is_three_moves_with_wrong_rail(sandbox):
    # Rotate three HCAs of one node: no pair is crossed, so each gets its own move.
    site, plan = sandbox
    text = synthesize(site, plan, [Fault("swap", "gpu002:mlx5_0,gpu002:mlx5_1"),
                                   Fault("swap", "gpu002:mlx5_1,gpu002:mlx5_2")])
    report = check_fabric(site, plan, parse(text))
    assert kinds(report) == ["wrong-rail"] * 3
    fixes = sorted(f.fix for f in report.findings)
    # gpu002 is su_slot 1 -> port 2 on each rail leaf of su1.
    assert fixes[0].endswith("to leaf-su1-rail0 port 2")
    assert all("SHARP" in f.message for f in report.findings)


def test_swap_between_nodes_of_two_sus(sandbox):
    report = run(sandbox, [("swap", "gpu001:mlx5_3,gpu005:mlx5_3")])
    assert kinds(report) == ["swapped-cables"]
    assert "leaf-su1-rail3 port 1" in report.findings[0].fix
    assert "leaf-su2-rail3 port 1" in report.findings[0].fix


def test_one_hca_on_another_sus_leaf(sandbox):
    site, plan = sandbox
    # Move gpu003 mlx5_6 by hand onto a free port of su2's rail-6 leaf (port 5).
    text = synthesize(site, plan, [Fault("missing", "gpu003:mlx5_6")])
    extra = _cable(text, "gpu003 mlx5_6", "leaf-su2-rail6", 5)
    report = check_fabric(site, plan, parse(extra))
    assert kinds(report) == ["wrong-su"]
    f = report.findings[0]
    assert "leaf-su2-rail6 (the rail-6 leaf of su2) port 5" in f.message
    assert f.fix.endswith("to leaf-su1-rail6 port 3")


def test_whole_node_on_another_su_is_one_finding(sandbox):
    report = run(sandbox, [("move", "gpu004=su3")])
    assert kinds(report) == ["wrong-su"]
    f = report.findings[0]
    assert f.subject == "gpu004" and "all 8 compute HCAs" in f.message and "su3" in f.message


def test_missing_links_and_missing_node(sandbox):
    report = run(sandbox, [("missing", "gpu002:mlx5_3")])
    assert kinds(report) == ["missing-link"]
    assert "leaf-su1-rail3 port 2" in report.findings[0].message
    all_gone = [("missing", f"gpu006:mlx5_{r}") for r in range(8)]
    report = run(sandbox, all_gone)
    assert kinds(report) == ["node-missing"] and report.findings[0].subject == "gpu006"


def test_degraded_links_name_rate_and_plan(sandbox):
    report = run(sandbox, [("slow", "gpu003:mlx5_4=4xHDR"), ("slow", "gpu007:mlx5_1=1xNDR"),
                           ("slow", "leaf-su2-rail0:9=2xNDR")])
    assert kinds(report) == ["degraded-link"] * 3
    msgs = " | ".join(f.message for f in report.findings)
    assert "4xHDR (200 Gb/s)" in msgs and "1xNDR (100 Gb/s)" in msgs and "2xNDR (200 Gb/s)" in msgs
    assert "planned 4xNDR (400 Gb/s)" in msgs


def test_a_faster_link_is_not_degraded(sandbox):
    assert run(sandbox, [("slow", "gpu003:mlx5_4=4xXDR")]).clean


def test_every_link_slow_collapses_into_one_finding(sandbox):
    site, plan = sandbox
    text = synthesize(site, plan).replace("4xNDR", "4xHDR")
    report = check_fabric(site, plan, parse(text))
    assert kinds(report) == ["degraded-link", "degraded-link"]
    assert {f.subject for f in report.findings} == {"all HCA links", "all switch links"}


def test_uplink_faults(sandbox):
    report = run(sandbox, [("missing", "leaf-su1-rail0:9")])
    assert kinds(report) == ["missing-link"]
    f = report.findings[0]
    assert "leaf-su1-rail0 has 3 of the 4 planned links to spine-rail0-1" in f.message
    assert (f.switch, f.port, f.rail) == ("leaf-su1-rail0", 9, 0)
    report = run(sandbox, [("swap", "leaf-su1-rail0:9,leaf-su1-rail1:9")])
    assert kinds(report) == ["swapped-cables"]
    report = run(sandbox, [("missing", f"leaf-su3-rail2:{p}") for p in range(9, 13)])
    assert kinds(report) == ["missing-link"]
    assert "none of the 4 uplinks" in report.findings[0].message


def test_uplink_in_another_port_of_the_same_spine_is_fine(sandbox):
    # Leaf<->spine links count per spine, whatever ports carry them (cages cabled in pairs,
    # a spare port used): moving an uplink to another free port of the same two switches is
    # not a finding.
    site, plan = sandbox
    text = synthesize(site, plan, [Fault("missing", "leaf-su1-rail0:9")])
    sl = next(s for s in plan.leaf_uplinks if (s.lower, s.lower_port) == ("leaf-su1-rail0", 9))
    moved = _switch_cable(text, "leaf-su1-rail0", 13, sl.upper, 40)
    report = check_fabric(site, plan, parse(moved))
    assert report.clean, report.findings


def test_uplink_to_another_rails_spine(sandbox):
    site, plan = sandbox
    text = synthesize(site, plan, [Fault("missing", "leaf-su1-rail0:9")])
    moved = _switch_cable(text, "leaf-su1-rail0", 9, "spine-rail1-1", 15)
    report = check_fabric(site, plan, parse(moved))
    assert kinds(report) == ["wrong-uplink"]
    assert "crosses rail groups" in report.findings[0].message


def test_unknown_node_and_unknown_switch(sandbox):
    report = run(sandbox, [("unknown-node", "intruder01")])
    assert kinds(report) == ["unknown-node"] and report.findings[0].subject == "intruder01"
    site, plan = sandbox
    text = synthesize(site, plan)
    extra = _switch_cable(text, "leaf-su4-rail7", 13, "rogue-switch", 1)
    report = check_fabric(site, plan, parse(extra))
    assert "unknown-switch" in kinds(report)


def test_storage_hcas_are_kept_apart(superpod):
    report = run(superpod, storage=True)
    assert report.clean
    apart = [k for k in report.kept_apart if k["what"] == "hca"]
    assert len(apart) == 128 * 2 and {a["reason"] for a in apart} == {"site role storage"}
    assert any(k["what"] == "switch" for k in report.kept_apart)


def test_hca_filter_keeps_unknown_storage_servers_apart(superpod):
    site, plan = superpod
    text = synthesize(site, plan, storage=True)
    # A storage server that is not in the site file, on a storage leaf.
    text = _cable(text, "lustre-oss01 mlx5_0", "storage-leaf-1", 30)
    plain = check_fabric(site, plan, parse(text))
    assert plain.clean  # it sits on a switch with no compute HCA: apart by topology
    filtered = check_fabric(site, plan, parse(text), compile_filters([r"^lustre-"]))
    assert filtered.clean
    assert any(k["name"] == "lustre-oss01 mlx5_0" and k["reason"] == "matches --hca-filter"
               for k in filtered.kept_apart)


def test_storage_hca_on_a_compute_leaf_is_a_finding():
    site = load_site(DATA / "tiny-site.toml")  # mlx5_2 has role = "storage" there
    text = _cable((DATA / "basic.txt").read_text(), "dgx0001 mlx5_2", "su1-leaf-r0", 4)
    report = check_fabric(site, plan_fabric(site), parse(text))
    assert kinds(report) == ["degraded-link", "storage-on-compute"]  # + the sample's slow link
    f = next(f for f in report.findings if f.kind == "storage-on-compute")
    assert "leaf-su1-rail0 port 4" in f.fix


def test_switches_matched_by_cables_when_names_differ(sandbox):
    site, plan = sandbox
    text = synthesize(site, plan, [Fault("swap", "gpu001:mlx5_0,gpu001:mlx5_1")])
    text = re.sub(r"MF0;leaf-(su\d)-rail(\d):", r"MF0;\1-ib-leaf-r\2:", text)
    report = check_fabric(site, plan, parse(text))
    assert kinds(report) == ["swapped-cables"]
    assert any("matched to the plan by cables" in n for n in report.notes)


def test_hand_written_sample_against_its_site():
    site = load_site(DATA / "tiny-site.toml")
    report = check_fabric(site, plan_fabric(site), parse_file(DATA / "basic.txt"))
    assert kinds(report) == ["degraded-link"]
    assert "dgx0002 mlx5_1" in report.findings[0].message and "2xNDR" in report.findings[0].message
    assert report.stats["hca_links_seen"] == 4


def test_variations_sample_against_the_tiny_site():
    site = load_site(DATA / "tiny-site.toml")
    report = check_fabric(site, plan_fabric(site), parse_file(DATA / "variations.txt"))
    # dgx0002 mlx5_0 has no description but sits in dgx0002's planned port: it is taken as that
    # HCA (its slow link is found), with a finding about the description, never "missing".
    assert kinds(report) == ["degraded-link", "switch-missing", "switch-missing", "unknown-node",
                             "unset-description", "unset-description"]
    unset = [f for f in report.findings if f.kind == "unset-description"]
    assert {(f.node, f.hca, f.switch, f.port) for f in unset} == {
        ("dgx0002", "mlx5_0", "leaf-su1-rail0", 2), (None, None, "leaf-su1-rail0", 3)}
    assert all(f.guid and "rdma-ndd" in f.fix for f in unset)
    assert any("router" in n for n in report.notes)


def test_report_json_shape(sandbox):
    d = run(sandbox, [("missing", "gpu002:mlx5_3")]).to_dict()
    assert d["clean"] is False and d["counts"] == {"missing-link": 1}
    assert set(d["findings"][0]) == {"kind", "severity", "subject", "message", "fix",
                                     "location"}
    assert list(d["findings"][0]["location"]) == list(LOCATION_KEYS)


def _cable(text: str, ca_desc: str, switch: str, port: int) -> str:
    """Append a CA cabled to `switch` port `port` (both ends), as ibnetdiscover would print."""
    sw_id = re.search(rf'Switch\t\d+ "(S-[0-9a-f]+)"\t\t# "MF0;{re.escape(switch)}:', text)
    assert sw_id, switch
    guid = f"{0xabc000 + port:016x}"
    lines = text.splitlines()
    at = lines.index(next(ln for ln in lines if f'"{sw_id.group(1)}"\t\t# "MF0;{switch}:' in ln))
    lines.insert(at + 1, f'[{port}]\t"H-{guid}"[1]({guid}) \t\t# "{ca_desc}" lid 999 4xNDR')
    lines += ["", f'Ca\t1 "H-{guid}"\t\t# "{ca_desc}"',
              f'[1]({guid}) \t"{sw_id.group(1)}"[{port}]\t\t# lid 999 lmc 0 "x" lid 1 4xNDR']
    return "\n".join(lines) + "\n"


def _switch_cable(text: str, a: str, a_port: int, b: str, b_port: int) -> str:
    """Add a switch-to-switch cable a:a_port <-> b:b_port (b may be a new switch)."""
    ids = dict(re.findall(r'Switch\t\d+ "(S-[0-9a-f]+)"\t\t# "MF0;([^:]+):', text))
    by_name = {v: k for k, v in ids.items()}
    lines = text.splitlines()
    if b not in by_name:
        by_name[b] = "S-00000000000beef0"
        lines += ["", f'Switch\t64 "{by_name[b]}"\t\t# "MF0;{b}:X/U1" enhanced port 0 lid 998']
    for me, port, other, oport in ((a, a_port, b, b_port), (b, b_port, a, a_port)):
        head = next(i for i, ln in enumerate(lines) if f'"{by_name[me]}"\t\t# "MF0;{me}:' in ln)
        lines.insert(head + 1, f'[{port}]\t"{by_name[other]}"[{oport}]\t\t# "MF0;{other}:X/U1" '
                                f"lid 1 4xNDR")
    return "\n".join(lines) + "\n"


_SANDBOX = load_site(builtin_site_path("sandbox"))
_SANDBOX_PLAN = plan_fabric(_SANDBOX)


@settings(max_examples=30, deadline=None)
@given(pair=st.lists(st.sampled_from(_SANDBOX_PLAN.node_links), min_size=2, max_size=2,
                     unique=True))
def test_any_crossed_pair_of_hca_cables_is_one_swap_finding(pair):
    a, b = pair
    text = synthesize(_SANDBOX, _SANDBOX_PLAN,
                      [Fault("swap", f"{a.node}:{a.hca},{b.node}:{b.hca}")])
    report = check_fabric(_SANDBOX, _SANDBOX_PLAN, parse(text))
    assert [f.kind for f in report.findings] == ["swapped-cables"]
    fix = report.findings[0].fix
    assert f"{a.leaf} port {a.port}" in fix and f"{b.leaf} port {b.port}" in fix


def test_two_cas_with_one_description(sandbox):
    site, plan = sandbox
    text = synthesize(site, plan)
    # gpu002's rail-0 HCA reports gpu001's description (a cloned image).
    text = text.replace('"gpu002 mlx5_0"', '"gpu001 mlx5_0"')
    report = check_fabric(site, plan, parse(text))
    assert "duplicate-hca" in kinds(report)
    assert "missing-link" in kinds(report)  # gpu002 mlx5_0 is now nowhere to be found
