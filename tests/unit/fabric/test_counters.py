"""Fabric health (`topo check --counters/--sharp/--drain`): real ibqueryerrors/perfquery output
of infiniband-diags 44.0 against an ibsim fabric (tests/data/counters/README.md), our own
rendering of a whole site, thresholds, SHARP aggregation nodes and the drain commands."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest

from slurmpod.config import builtin_site_path, load_site
from slurmpod.errors import ConfigError, UsageError
from slurmpod.fabric import counters as c
from slurmpod.fabric.check import Finding, check_fabric
from slurmpod.fabric.drain import Drain, drains, safe_reason
from slurmpod.fabric.ibnetdiscover import parse, parse_file
from slurmpod.fabric.synth import synthesize
from slurmpod.topology.fabric_plan import plan_fabric
from tests.helpers import DATA_DIR

DATA = DATA_DIR / "counters"


@pytest.fixture(scope="module")
def fabric():
    return parse_file(DATA / "ibnetdiscover.txt")


def run(fabric, *names, limits=None):
    records, _ = c.read_counters([DATA / n for n in names])
    return c.check_counters(records, fabric, limits or c.thresholds())


@pytest.mark.parametrize("name", ["ibqueryerrors.txt", "ibqueryerrors-r.txt",
                                  "ibqueryerrors-data.txt"])
def test_real_ibqueryerrors_one_finding_per_bad_cable(fabric, name):
    findings, notes = run(fabric, name)
    # LinkErrorRecoveryCounter 3 on gpu001 mlx5_1 is under its threshold (10); port 0's relay
    # errors and the `port ALL` sums name no cable.
    assert [(f.kind, f.cable) for f in findings] == [
        ("link-errors", "gpu002 mlx5_0 <-> leaf-su1-rail0 port 2"),
        ("link-errors", "leaf-su1-rail1 port 5 <-> spine-1 port 3"),
    ]
    hca, up = findings
    assert (hca.node, hca.hca, hca.switch, hca.port) == ("gpu002", "mlx5_0", "leaf-su1-rail0", 2)
    assert "SymbolErrorCounter 1234 (> 10)" in hca.message
    assert "LinkDownedCounter" not in hca.message  # 7 <= 10
    assert "reseat" in hca.fix and "perfquery -R" in hca.fix
    # The spine counted the errors: the location is its port, the cable names both ends.
    assert (up.node, up.switch, up.port) == (None, "spine-1", 3)
    assert "spine-1 port 3 sees PortRcvErrors 55 (> 10)" in up.message
    assert notes == []


def test_thresholds_override_and_file_format(fabric, tmp_path):
    f = tmp_path / "error_thresholds"
    f.write_text("# infiniband-diags format\nLinkErrorRecoveryCounter=0\n\n"
                 "SymbolErrorCounter=5000\n")
    limits = c.thresholds(["PortRcvErrors=100"], [f])
    findings, _ = run(fabric, "ibqueryerrors.txt", limits=limits)
    assert [f.cable for f in findings] == ["gpu001 mlx5_1 <-> leaf-su1-rail1 port 1"]
    assert findings[0].kind == "link-errors" and findings[0].node == "gpu001"
    for bad in (["Bogus=1"], ["SymbolErrorCounter"], ["SymbolErrorCounter=-1"]):
        with pytest.raises(UsageError, match="expected COUNTER=N"):
            c.thresholds(bad)


def test_real_perfquery_by_lid(fabric):
    findings, _ = run(fabric, "perfquery-leaf0.txt")
    assert [f.cable for f in findings] == ["gpu002 mlx5_0 <-> leaf-su1-rail0 port 2"]
    findings, _ = run(fabric, "perfquery-hca.txt", limits={**c.thresholds(),
                                                           "LinkErrorRecoveryCounter": 0})
    assert [(f.node, f.hca) for f in findings] == [("gpu001", "mlx5_1")]


def test_both_ends_of_one_cable_are_one_finding(fabric):
    findings, _ = run(fabric, "perfquery-leaf0.txt", "perfquery-hca-errors.txt")
    assert len(findings) == 1
    msg = findings[0].message
    assert "leaf-su1-rail0 port 2 sees SymbolErrorCounter 1234" in msg
    assert "gpu002 mlx5_0 sees SymbolErrorCounter 40" in msg


def test_clean_outputs_have_no_findings(fabric):
    assert run(fabric, "ibqueryerrors-clean.txt") == ([], [])
    assert run(fabric, "perfquery-clean-hca.txt") == ([], [])


def test_port_sums_are_skipped_with_a_note(fabric):
    findings, notes = run(fabric, "perfquery-all.txt")
    assert findings == [] and "port 255" in notes[0]


def test_bad_counter_files(tmp_path):
    with pytest.raises(ConfigError, match="perfquery -x"):
        c.read_counters([DATA / "perfquery-x.txt"])
    bad = tmp_path / "bad.txt"
    bad.write_text('Errors for "gpu001 mlx5_0"\n   GUID 0x1 port 1: [SymbolErrorCounter == 3]\n'
                   "something else\n")
    with pytest.raises(ConfigError, match=r"bad\.txt:3: cannot parse"):
        c.read_counters([bad])
    empty = tmp_path / "empty.txt"
    empty.write_text("hello\n")
    with pytest.raises(ConfigError, match="cannot parse"):
        c.read_counters([empty])
    with pytest.raises(ConfigError, match="file not found"):
        c.read_counters([tmp_path / "nope"])


def test_rendered_site_counters(tmp_path):
    site = load_site(builtin_site_path("sandbox"))
    plan = plan_fabric(site)
    fab = parse(synthesize(site, plan))
    ids = {n.desc: n.node_id for n in fab.cas()}
    sw = {n.name: n.node_id for n in fab.switches()}
    up = next(p.num for p in fab.nodes[sw["leaf-su2-rail1"]].ports.values()
              if fab.nodes[p.remote_id].kind == "switch")
    clean = c.parse_counters(c.render_ibqueryerrors(fab, {}), "clean")
    assert c.check_counters(clean, fab, c.thresholds(), plan) == ([], [])
    text = c.render_ibqueryerrors(fab, {
        (ids["gpu003 mlx5_4"], 1): {"SymbolErrorCounter": 500},
        (sw["leaf-su1-rail4"], 3): {"SymbolErrorCounter": 20, "LinkDownedCounter": 12},
        (sw["leaf-su2-rail1"], up): {"PortXmitDiscards": 1000},
        (sw["leaf-su2-rail1"], 1): {"PortXmitDiscards": 50},  # under the threshold
    })
    findings, _ = c.check_counters(c.parse_counters(text, "site"), fab, c.thresholds(), plan)
    assert [(f.kind, f.severity, f.node, f.hca, f.rail, f.switch, f.port) for f in findings] == [
        ("link-errors", "error", "gpu003", "mlx5_4", 4, "leaf-su1-rail4", 3),
        ("port-discards", "warning", None, None, None, "leaf-su2-rail1", up),
    ]
    assert findings[1].cable.startswith(f"leaf-su2-rail1 port {up} <-> spine")
    assert "went down and retrained" in findings[0].message
    assert "not a cable fault" in findings[1].fix


def test_sharp_aggregation_nodes():
    assert c.check_sharp(parse_file(DATA / "ibnetdiscover-sharp.txt")) == []
    got = c.check_sharp(parse_file(DATA / "ibnetdiscover-no-an-spine.txt"))
    assert [(f.kind, f.switch) for f in got] == [("sharp-an-missing", "spine-1")]
    assert "enable SHARP on spine-1" in got[0].fix
    site = load_site(builtin_site_path("sandbox"))
    fab = parse(synthesize(site, plan_fabric(site)))  # no aggregation node anywhere
    got = c.check_sharp(fab)
    assert [(f.kind, f.subject) for f in got] == [("sharp-an-missing", "all switches")]
    assert "fabric.sharp = false" in got[0].fix


def test_aggregation_nodes_are_not_hosts():
    site = load_site(builtin_site_path("sandbox"))
    plan = plan_fabric(site)
    report = check_fabric(site, plan, parse_file(DATA / "ibnetdiscover-sharp.txt"))
    assert not any("Aggregation" in (f.subject + f.message) for f in report.findings
                   if f.kind in ("unnamed-ca", "unknown-node", "unset-description"))


# --- drain --------------------------------------------------------------------------------


def finding(kind, node=None, hca=None, severity="error", subject=None, switch=None, port=None):
    return Finding(kind, severity, subject or f"{node} {hca}", "m", "f", node=node, hca=hca,
                   switch=switch, port=port)


def test_drain_commands_for_affected_nodes():
    fs = [finding("link-errors", "gpu002", "mlx5_0", switch="leaf-su1-rail0", port=2),
          finding("wrong-rail", "gpu002", "mlx5_3"),
          finding("swapped-cables", "gpu005", "mlx5_0",
                  subject="gpu005 mlx5_0 / gpu009 mlx5_0"),
          finding("wrong-port", "gpu010", "mlx5_1", severity="warning"),
          finding("node-missing", "gpu011"),
          finding("link-errors", None, None, subject="leaf port 5 <-> spine port 3"),
          finding("missing-link", "intruder01", "mlx5_0")]
    got = drains(fs, [f"gpu{i:03d}" for i in range(1, 17)])
    assert [d.node for d in got] == ["gpu002", "gpu005", "gpu009"]
    assert got[0].reason == ("slurmpod fabric: link-errors mlx5_0 at leaf-su1-rail0:2; "
                             "wrong-rail mlx5_3")
    assert got[0].command == ('scontrol update NodeName=gpu002 State=DRAIN Reason="slurmpod '
                              'fabric: link-errors mlx5_0 at leaf-su1-rail0:2; wrong-rail '
                              'mlx5_3"')
    assert got[0].argv[:4] == ["scontrol", "update", "NodeName=gpu002", "State=DRAIN"]
    assert drains([], ["gpu001"]) == []


def test_drain_reason_cannot_escape_its_quotes():
    evil = 'x"; rm -rf / #`id` $(id) \\ \n!'
    reason = safe_reason(evil)
    d = Drain("gpu001", reason)
    words = shlex.split(d.command)
    assert words == ["scontrol", "update", "NodeName=gpu001", "State=DRAIN", f"Reason={reason}"]
    assert not set('"`$\\!\n') & set(reason)
    assert len(safe_reason("a" * 500)) == 200


def test_drain_apply_runs_argv_without_a_shell():
    calls = []

    class Runner:
        where = "test"

        def run(self, argv, **kw):
            from slurmpod.transport.base import CommandResult

            calls.append(list(argv))
            rc = 1 if "gpu009" in argv[2] else 0
            return CommandResult(tuple(argv), rc, "", "node not found" if rc else "", 0.0)

    from slurmpod.fabric.drain import apply

    out = apply([Drain("gpu001", "r"), Drain("gpu009", "r")], Runner())
    assert calls[0] == ["scontrol", "update", "NodeName=gpu001", "State=DRAIN", "Reason=r"]
    assert [(d.node, err) for d, err in out] == [("gpu001", None), ("gpu009", "node not found")]


# --- through `slurmpod topo check --counters/--sharp/--drain` -------------------------------


def cli(argv, capsys):
    from slurmpod.cli.main import main

    with pytest.raises(SystemExit) as info:
        main(argv)
    out, err = capsys.readouterr()
    return int(info.value.code or 0), out, err


@pytest.fixture()
def sandbox_fabric(tmp_path):
    site = load_site(builtin_site_path("sandbox"))
    text = synthesize(site, plan_fabric(site))
    path = tmp_path / "fabric.txt"
    path.write_text(text)
    fab = parse(text)
    ids = {n.desc: n.node_id for n in fab.cas()}
    errs = tmp_path / "errors.txt"
    errs.write_text(c.render_ibqueryerrors(fab, {(ids["gpu003 mlx5_4"], 1): {
        "SymbolErrorCounter": 500}}))
    return path, errs


def test_cli_counters_drain_and_json(capsys, sandbox_fabric):
    fabric_file, errs = sandbox_fabric
    base = ["topo", "check", "sandbox", "--ibnetdiscover", str(fabric_file)]
    rc, out, _ = cli([*base, "--counters", str(errs), "--drain"], capsys)
    assert rc == 1 and "1 findings (link-errors 1)" in out
    assert ('scontrol update NodeName=gpu003 State=DRAIN Reason="slurmpod fabric: link-errors '
            'mlx5_4 at leaf-su1-rail4:3"') in out
    rc, out, _ = cli([*base, "--counters", str(errs), "--threshold",
                      "SymbolErrorCounter=1000", "--drain"], capsys)
    assert rc == 0 and "drain: no node to drain" in out
    rc, out, _ = cli([*base, "--counters", str(errs), "--json"], capsys)
    doc = json.loads(out)
    assert doc["counts"] == {"link-errors": 1} and "drain" not in doc
    loc = doc["findings"][0]["location"]
    assert (loc["node"], loc["hca"], loc["switch"], loc["port"]) == (
        "gpu003", "mlx5_4", "leaf-su1-rail4", 3)


def test_cli_sharp_and_usage_errors(capsys, sandbox_fabric):
    fabric_file, _ = sandbox_fabric
    base = ["topo", "check", "sandbox", "--ibnetdiscover", str(fabric_file)]
    rc, _out, err = cli([*base, "--sharp"], capsys)
    assert rc == 2 and "fabric.sharp = false" in err
    rc, _out, err = cli([*base, "--threshold", "SymbolErrorCounter=1"], capsys)
    assert rc == 2 and "--counters" in err
    rc, _out, err = cli([*base, "--counters", str(DATA / "perfquery-x.txt")], capsys)
    assert rc == 3 and "perfquery -x" in err and "Traceback" not in err


def test_cli_apply_runs_scontrol(capsys, sandbox_fabric, tmp_path, monkeypatch):
    fabric_file, errs = sandbox_fabric
    log = tmp_path / "calls"
    fake = tmp_path / "bin" / "scontrol"
    fake.parent.mkdir()
    fake.write_text(f'#!/bin/sh\nprintf "%s|" "$@" >> {log}\necho >> {log}\n')
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake.parent}:{__import__('os').environ['PATH']}")
    rc, out, _ = cli(["topo", "check", "sandbox", "--ibnetdiscover", str(fabric_file),
                      "--counters", str(errs), "--drain", "--apply"], capsys)
    assert rc == 1 and "drained gpu003" in out
    assert log.read_text() == ("update|NodeName=gpu003|State=DRAIN|Reason=slurmpod fabric: "
                               "link-errors mlx5_4 at leaf-su1-rail4:3|\n")


def test_kinds_are_documented_and_distinct():
    from slurmpod.fabric.check import FINDING_KINDS
    from slurmpod.fabric.lldp import LLDP_FINDING_KINDS

    ours = {**c.COUNTERS_FINDING_KINDS, **LLDP_FINDING_KINDS}
    assert not set(ours) & set(FINDING_KINDS)
    doc = (Path(__file__).resolve().parents[3] / "docs" / "fabric-check.md").read_text()
    for kind in ours:
        assert f"| `{kind}`" in doc, kind
