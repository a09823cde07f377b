"""RoCE cabling from LLDP (`topo check --lldp`): lldpd 1.0.16's real JSON in every form (one
neighbour = object, several = list, none, json0), a clean site is clean, each fault is one
finding with its location and fix, port names in each switch OS's convention, bad input."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from slurmpod.config import builtin_site_path, load_site
from slurmpod.errors import ConfigError
from slurmpod.fabric import lldp
from slurmpod.topology.fabric_plan import plan_fabric
from tests.helpers import DATA_DIR

DATA = DATA_DIR / "lldp"


@pytest.fixture(scope="module")
def roce():
    site = load_site(builtin_site_path("h200-roce"))
    return site, plan_fabric(site)


def write_docs(tmp_path: Path, docs: dict[str, object], name: str = "lldp") -> Path:
    d = tmp_path / name
    d.mkdir()
    for host, doc in docs.items():
        (d / f"{host}.json").write_text(json.dumps(doc, indent=2))
    return d


def check(roce, paths):
    site, plan = roce
    return lldp.check_lldp(site, plan, lldp.read_lldp([Path(p) for p in paths]))


def test_real_capture_of_a_clean_pair_is_clean(roce):
    report = check(roce, [DATA / "h200-001.json", DATA / "h200-002.json"])
    assert report.findings == []
    assert report.stats["hca_links_seen"] == 16 and report.stats["nodes_with_lldp"] == 2
    assert any("126 of 128 nodes sent no LLDP data" in n for n in report.notes)


def test_real_capture_of_crossed_rails_is_one_swap(roce):
    report = check(roce, [DATA / "h200-001.json", DATA / "swap" / "h200-002.json"])
    assert [f.kind for f in report.findings] == ["swapped-cables"]
    f = report.findings[0]
    assert "h200-002 mlx5_0 (rail 0) and h200-002 mlx5_1 (rail 1)" in f.message
    # Both NICs sit at port 2 = cage 1's second 400G port (swp1s1) of their leaves.
    assert re.fullmatch(r"swap the cables in sx-leaf-su1-rail([01]) port 2 \(cage 1\) and "
                        r"sx-leaf-su1-rail(?!\1)[01] port 2 \(cage 1\)", f.fix), f.fix
    assert f.node == "h200-002"
    assert report.stats["leaves_mixing_rails"] == 2


def test_every_json_form_gives_the_same_neighbours():
    many = lldp.read_lldp([DATA / "h200-001.json"]).neighbours
    json0 = lldp.read_lldp([DATA / "forms" / "json0"]).neighbours
    one = lldp.read_lldp([DATA / "forms" / "one"]).neighbours
    none = lldp.read_lldp([DATA / "forms" / "none"])

    def key(n):
        return (n.host, n.ifname, n.chassis, n.chassis_id, n.port_id, n.port_id_type,
                n.port_descr)

    assert len(many) == 8 and [key(n) for n in json0] == [key(n) for n in many]
    assert [key(n) for n in one] == [key(n) for n in many if n.ifname == "eth3"]
    assert one[0].chassis == "sx-leaf-su1-rail3" and one[0].port_id == "swp1s0"
    assert none.neighbours == [] and none.hosts == {"h200-003"}


def test_synthesized_output_has_lldpd_shape(roce):
    site, plan = roce
    real = json.loads((DATA / "h200-001.json").read_text())
    ours = lldp.synthesize(site, plan)["h200-001"]

    def shape(doc):
        iface = doc["lldp"]["interface"][0]
        (_ifname, body), = iface.items()
        (_name, chassis), = body["chassis"].items()
        return (sorted(body), sorted(chassis["id"]), sorted(body["port"]),
                sorted(body["port"]["id"]))

    assert shape(ours)[2:] == shape(real)[2:]
    assert {"via", "chassis", "port"} <= set(shape(ours)[0])


def test_whole_site_clean_and_one_finding_per_fault(roce, tmp_path):
    site, plan = roce
    clean = write_docs(tmp_path, lldp.synthesize(site, plan), "clean")
    report = check(roce, [clean])
    assert report.findings == [] and report.stats["hca_links_seen"] == 1024
    assert not any("sent no LLDP data" in n for n in report.notes)

    faults = {
        "missing-link": dict(missing=["h200-005:eth3"]),
        "wrong-rail": dict(moves={"h200-006:eth2": ("sx-leaf-su1-rail5", 40)}),
        "wrong-su": dict(moves={"h200-007:eth1": ("sx-leaf-su3-rail1", 40)}),
        "wrong-port": dict(moves={"h200-008:eth0": ("sx-leaf-su1-rail0", 50)}),
    }
    for n, (kind, kw) in enumerate(faults.items()):
        d = write_docs(tmp_path, lldp.synthesize(site, plan, **kw), f"fault{n}")
        got = check(roce, [d]).findings
        assert [f.kind for f in got] == [kind], (kind, got)
    f = got[0]  # wrong-port: h200-008 eth0, planned sx-leaf-su1-rail0 port 8
    assert f.node == "h200-008" and f.hca == "mlx5_0"
    assert "sx-leaf-su1-rail0 port 8" in f.fix and "port 50" in f.fix


def test_missing_neighbour_is_worded_for_lldp(roce, tmp_path):
    site, plan = roce
    docs = lldp.synthesize(site, plan, missing=["h200-005:eth3"])
    got = check(roce, [write_docs(tmp_path, docs)]).findings
    assert len(got) == 1
    f = got[0]
    assert f.kind == "missing-link" and (f.node, f.hca, f.switch, f.port) == (
        "h200-005", "mlx5_3", "sx-leaf-su1-rail3", 5)
    assert "eth3" in f.message and "no LLDP neighbour" in f.message
    assert "ip link show eth3" in f.fix


def test_node_that_hears_nobody_is_one_finding(roce, tmp_path):
    site, plan = roce
    docs = lldp.synthesize(site, plan, missing=[f"h200-010:eth{k}" for k in range(8)])
    assert docs["h200-010"] == {"lldp": {}}
    got = check(roce, [write_docs(tmp_path, docs)]).findings
    assert [(f.kind, f.node) for f in got] == [("node-missing", "h200-010")]
    assert "hears no neighbour" in got[0].message


def test_unreadable_port_name_is_one_warning(roce, tmp_path):
    site, plan = roce
    docs = lldp.synthesize(site, plan, names={("sx-leaf-su1-rail4", 3): "mgmt0"})
    got = check(roce, [write_docs(tmp_path, docs)]).findings
    assert [(f.kind, f.severity, f.node, f.hca) for f in got] == [
        ("lldp-unknown-port", "warning", "h200-003", "mlx5_4")]


def test_fqdn_chassis_and_pdsh_and_mapping_inputs(roce, tmp_path):
    site, plan = roce
    docs = lldp.synthesize(site, plan)
    text = json.dumps(docs["h200-001"], indent=2).replace(
        '"sx-leaf-su1-rail0"', '"sx-leaf-su1-rail0.fabric.example"')
    pdsh = tmp_path / "pdsh.txt"
    pdsh.write_text("".join(f"h200-001.cluster.local: {line}\n" for line in text.splitlines()))
    report = check(roce, [pdsh])
    assert report.findings == [] and report.stats["hca_links_seen"] == 8
    mapping = tmp_path / "all.json"
    mapping.write_text(json.dumps({h: docs[h] for h in ("h200-001", "h200-002")}))
    report = check(roce, [mapping])
    assert report.findings == [] and report.stats["hca_links_seen"] == 16


@pytest.mark.parametrize(("name", "k", "port"), [
    ("swp7", 1, 7), ("swp1s0", 2, 1), ("swp1s1", 2, 2), ("swp33s0", 2, 65), ("swp2s3", 4, 8),
    ("Eth1/5", 1, 5), ("Eth1/3/2", 2, 6), ("etp4", 1, 4), ("etp4b", 2, 8), ("etp1a", 2, 1),
    ("Ethernet8", 2, None), ("mgmt0", 1, None), ("swp", 1, None),
])
def test_port_name_conventions(name, k, port):
    assert lldp.port_number(name, k) == port
    if port is not None and name.startswith("swp") and k > 1:
        assert lldp.port_name(port, k) == name


def test_split_names_without_ports_per_cage_are_read_and_noted():
    import tomllib

    from slurmpod.config import validate
    from slurmpod.model.site import Site

    raw = tomllib.loads(builtin_site_path("h200-roce").read_text())
    raw["fabric"].pop("ports_per_cage")
    site = validate(Site, raw, "h200-roce.toml")
    plan = plan_fabric(site)
    assert plan.cage_ports == 1
    data = lldp.read_lldp([DATA / "h200-001.json", DATA / "h200-002.json"])
    assert lldp.split_ports(plan, data) == 2
    report = lldp.check_lldp(site, plan, data)
    assert report.findings == []
    assert any("ports_per_cage" in n for n in report.notes)


@pytest.mark.parametrize(("text", "needle"), [
    ("{not json", "not valid JSON"),
    ('{"foo": 1}', "no 'lldp' key"),
    ("", "empty file"),
    ("h200-001: {\nbroken line without prefix\n", "no 'host: ' prefix"),
])
def test_bad_input_is_one_line(tmp_path, text, needle):
    p = tmp_path / "h200-001.json"
    p.write_text(text)
    with pytest.raises(ConfigError) as info:
        lldp.read_lldp([p])
    assert needle in str(info.value) and str(p) in str(info.value)


def test_missing_file_and_empty_directory(tmp_path):
    with pytest.raises(ConfigError, match="file not found"):
        lldp.read_lldp([tmp_path / "nope.json"])
    with pytest.raises(ConfigError, match=r"no \*\.json files"):
        lldp.read_lldp([tmp_path])


def test_site_without_netdevs_is_a_config_error():
    import tomllib

    from slurmpod.config import validate
    from slurmpod.model.site import Site

    raw = tomllib.loads(builtin_site_path("h200-roce").read_text())
    for nt in raw["node_types"].values():
        for h in nt["hcas"]:
            h.pop("netdev", None)
    site = validate(Site, raw, "h200-roce.toml")
    with pytest.raises(ConfigError, match="netdev"):
        lldp.check_lldp(site, plan_fabric(site), lldp.read_lldp([DATA / "h200-001.json"]))


# --- through `slurmpod topo check --lldp` ---------------------------------------------------


def cli(argv, capsys):
    from slurmpod.cli.main import main

    with pytest.raises(SystemExit) as info:
        main(argv)
    out, err = capsys.readouterr()
    return int(info.value.code or 0), out, err


def test_cli_lldp_clean_swap_drain_and_json(capsys, tmp_path):
    rc, out, _ = cli(["topo", "check", "h200-roce", "--lldp", str(DATA / "h200-001.json"),
                      "--lldp", str(DATA / "h200-002.json")], capsys)
    assert rc == 0 and "clean: the fabric matches the plan" in out
    rc, out, _ = cli(["topo", "check", "h200-roce", "--lldp", str(DATA / "h200-001.json"),
                      "--lldp", str(DATA / "swap" / "h200-002.json"), "--drain"], capsys)
    assert rc == 1 and "1 findings (swapped-cables 1)" in out
    assert ('scontrol update NodeName=h200-002 State=DRAIN Reason="slurmpod fabric: '
            'swapped-cables h200-002 mlx5_0 / h200-002 mlx5_1"') in out
    rc, out, _ = cli(["topo", "check", "h200-roce", "--lldp", str(DATA / "swap"), "--json",
                      "--drain"], capsys)
    doc = json.loads(out)
    assert rc == 1 and doc["counts"] == {"swapped-cables": 1}
    assert doc["findings"][0]["location"]["node"] == "h200-002"
    assert [d["node"] for d in doc["drain"]] == ["h200-002"]


@pytest.mark.parametrize(("extra", "code", "needle"), [
    (["--ibnetdiscover", "x.txt"], 2, "give one of them"),
    (["--counters", "x.txt"], 2, "run them separately"),
    (["--apply"], 2, "give --drain as well"),
])
def test_cli_lldp_usage_errors(capsys, extra, code, needle):
    rc, _out, err = cli(["topo", "check", "h200-roce", "--lldp", str(DATA / "swap"), *extra],
                        capsys)
    assert rc == code and needle in err and "Traceback" not in err


def test_cli_lldp_bad_file_is_one_line(capsys, tmp_path):
    bad = tmp_path / "h200-001.json"
    bad.write_text("{")
    rc, _out, err = cli(["topo", "check", "h200-roce", "--lldp", str(bad)], capsys)
    assert rc == 3 and err.count("\n") <= 2 and "not valid JSON" in err
