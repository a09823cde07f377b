"""`slurmpod topo`: bad site files give one line and exit 3 with nothing written; show/generate."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from slurmpod.cli.main import main
from tests.unit.topology.test_support import site_dict, to_toml, variant

SANDBOX = site_dict("sandbox")
EMU = SANDBOX["node_types"]["emu8"]


def run(argv: list[str], capsys) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as info:
        main(argv)
    out, err = capsys.readouterr()
    return int(info.value.code or 0), out, err


def _emu(**changes):
    return {"emu8": {**EMU, **changes}}


# (case id, site data or raw text, key path the message must name)
BAD = [
    ("malformed-toml", "[site\nname = 'x'", "malformed TOML"),
    ("unknown-key", variant("sandbox", fabric={"rialz": 8}), "fabric.rialz: unknown key"),
    ("wrong-type", variant("sandbox", fabric={"rails": "eight"}), "fabric.rails:"),
    ("missing-key", {**SANDBOX, "site": {"description": "no name"}}, "site.name: required"),
    ("hcas-not-rails", variant("sandbox", fabric={"rails": 4}), "node_types.emu8.hcas:"),
    ("su-not-whole-racks", variant("sandbox", su_groups=[
        {"node_type": "emu8", "sus": 4, "nodes_per_su": 5, "nodes_per_rack": 2}]),
     "su_groups[0]: nodes_per_su = 5 is not a whole number of racks"),
    ("duplicate-hostnames", variant("sandbox", naming={"hostname": "gpu{slot}"}),
     "naming.hostname: 'gpu{slot}' gives 'gpu1' twice"),
    ("overflowing-hostnames", variant("sandbox", naming={"hostname": "gpu{n:1d}"}),
     "naming.hostname: node number 10 overflows"),
    ("nvlink-domain-not-dividing-rack", variant("gb200-nvl72", su_groups=[
        {"node_type": "gb200-tray", "sus": 2, "nodes_per_su": 36, "nodes_per_rack": 12}]),
     "su_groups[0].nodes_per_rack: the NVLink domain of 72 GPUs does not divide"),
    ("unknown-node-type", variant("sandbox", su_groups=[
        {"node_type": "h100", "sus": 1, "nodes_per_su": 4, "nodes_per_rack": 2}]),
     "su_groups[0].node_type: unknown node type 'h100'"),
    ("su-exceeds-leaf", variant("sandbox", su_groups=[
        {"node_type": "emu8", "sus": 1, "nodes_per_su": 12, "nodes_per_rack": 2}]),
     "su_groups[0].nodes_per_su: 12 exceeds the 8 downlink ports"),
    ("too-big-for-three-tiers", variant("sandbox", fabric={"spine_radix": 4}, su_groups=[
        {"node_type": "emu8", "sus": 9, "nodes_per_su": 4, "nodes_per_rack": 2}]),
     "fabric.spine_radix: 9 leaves per spine group need more than three tiers"),
    ("partition-su-out-of-range", variant("sandbox", partitions=[
        {"name": "p", "sus": [7]}]), "partitions[0].sus: [7] outside 1..4"),
    ("numa-beyond-sockets", variant("sandbox", node_types=_emu(
        gpu_pci=[{**g, "numa": 3} if i == 0 else g for i, g in enumerate(EMU["gpu_pci"])])),
     "node_types.emu8.numa_nodes: a GPU or HCA names NUMA node 3"),
    ("rack-names-clash", variant("sandbox", naming={"rack": "rack{su}"}),
     "naming.rack: 'rack{su}' gives 'rack1' twice"),
    ("duplicate-bus-id", variant("sandbox", node_types=_emu(
        gpu_pci=[EMU["gpu_pci"][0]] * 8)), "node_types.emu8.gpu_pci/hcas: PCI bus ids must"),
    ("bad-partition-option", variant("sandbox", partitions=[
        {"name": "p", "extra": {"Nodes": "x y"}}]), "partitions[0].extra"),
    ("switch-name-clash", variant(
        "sandbox", naming={"su": "spineblock{su}"}, fabric={"leaf_radix": 8, "spine_radix": 8},
        su_groups=[{"node_type": "emu8", "sus": 20, "nodes_per_su": 4, "nodes_per_rack": 2}]),
     "fabric.switch_prefix: switch name 'spineblock1' clashes"),
]


@pytest.mark.parametrize(("case", "data", "expect"), BAD, ids=[b[0] for b in BAD])
def test_bad_site_exit_3_one_line_nothing_written(case, data, expect, tmp_path, capsys):
    site = tmp_path / f"{case}.toml"
    site.write_text(data if isinstance(data, str) else to_toml(data))
    out_dir = tmp_path / "out"
    rc, out, err = run(["topo", "generate", str(site), "-o", str(out_dir)], capsys)
    assert rc == 3, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    assert lines[0].startswith(f"slurmpod: error: {site}: "), lines[0]
    assert expect in lines[0], lines[0]
    assert not out_dir.exists() and out == ""


def test_missing_file_is_a_config_error(tmp_path, capsys):
    rc, _, err = run(["topo", "show", str(tmp_path / "nope.toml")], capsys)
    assert rc == 3 and "file not found" in err


def test_block_on_old_slurm_names_file_and_key(tmp_path, capsys):
    site = tmp_path / "gb.toml"
    site.write_text(to_toml(variant("gb200-nvl72", slurm={"topology": "block"})))
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    (out_dir / "keep.txt").write_text("mine")
    rc, _, err = run(["topo", "generate", str(site), "-o", str(out_dir),
                      "--slurm-version", "23.02"], capsys)
    assert rc == 3
    assert err.splitlines()[0].startswith(f"slurmpod: error: {site}: slurm.topology: ")
    assert [p.name for p in out_dir.iterdir()] == ["keep.txt"]


def test_bad_version_is_a_usage_error(tmp_path, capsys):
    rc, _, err = run(["topo", "generate", "sandbox", "-o", str(tmp_path / "o"),
                      "--slurm-version", "latest"], capsys)
    assert rc == 2 and "--slurm-version" in err and not (tmp_path / "o").exists()


def test_bad_gres_prefix_is_a_usage_error(tmp_path, capsys):
    rc, _, err = run(["topo", "generate", "sandbox", "-o", str(tmp_path / "o"),
                      "--gres-file-prefix", "dev/nvidia"], capsys)
    assert rc == 2 and "absolute path" in err and not (tmp_path / "o").exists()


def test_generate_json_lists_files_and_warnings(tmp_path, capsys):
    site = tmp_path / "w.toml"
    site.write_text(to_toml(variant("sandbox", slurm={"node_weights": {"emu8": 5}})))
    rc, out, _ = run(["topo", "generate", str(site), "-o", str(tmp_path / "o"), "--json"],
                     capsys)
    assert rc == 0
    doc = json.loads(out)
    assert doc["topology_plugin"] == "tree" and doc["install_as_topology_conf"] == "topology.conf"
    assert {f["path"] for f in doc["files"]} == {
        p.relative_to(tmp_path / "o").as_posix() for p in (tmp_path / "o").rglob("*")
        if p.is_file()}
    assert len(doc["warnings"]) == 1 and "Weight=5" in doc["warnings"][0]


def test_show_json_numbers_by_hand(capsys):
    rc, out, _ = run(["topo", "show", "dgx-h100-superpod", "--json"], capsys)
    assert rc == 0
    doc = json.loads(out)
    assert (doc["nodes"], doc["gpus"], doc["racks"], doc["sus"]) == (128, 1024, 32, 4)
    fab = doc["fabric"]
    assert (fab["leaves"], fab["spines"], fab["rails"]) == (32, 16, 8)
    # 1024 HCAs x 400 Gb/s injection; non-blocking, so half of it crosses the bisection.
    assert fab["injection_gbps"] == 1024 * 400
    assert fab["bisection_gbps"] == 1024 * 400 / 2
    assert fab["oversubscription"] == 1.0
    assert doc["per_su"][0]["hosts"] == "dgx[0001-0032]"
    assert doc["peak_pflops_bf16"] == pytest.approx(1024 * 989 / 1000)


def test_show_text_has_per_su_table(capsys):
    rc, out, _ = run(["topo", "show", "gb200-nvl72"], capsys)
    assert rc == 0
    assert "NVLink domains 32" in out and "topology/block" in out
    assert out.count("gb200-tray") == 4


def test_check_says_unavailable_without_fabric_module(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "slurmpod.cli.fabric", None)
    rc, _, err = run(["topo", "check", "sandbox"], capsys)
    assert rc == 1 and "not available" in err


def test_console_script_end_to_end(tmp_path):
    exe = Path(sys.executable).with_name("slurmpod")
    if not exe.exists():
        pytest.skip("console script not installed next to this interpreter")
    bad = tmp_path / "bad.toml"
    bad.write_text("[site]\nname = 'x'\nbogus = 1\n")
    proc = subprocess.run([str(exe), "topo", "generate", str(bad), "-o", str(tmp_path / "o")],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 3 and "Traceback" not in proc.stderr
    assert proc.stderr.count("\n") == 1 and not (tmp_path / "o").exists()
    ok = subprocess.run([str(exe), "topo", "generate", "sandbox", "-o", str(tmp_path / "o")],
                        capture_output=True, text=True, timeout=60)
    assert ok.returncode == 0 and (tmp_path / "o" / "topology.conf").exists()
