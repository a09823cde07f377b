"""`topo check --nvlink`: NVLink domains from captured `nvidia-smi -q` against the site's racks."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from slurmpod.errors import UsageError
from slurmpod.fabric.check import FINDING_KINDS
from slurmpod.fabric.nvlink import (
    NVLINK_FINDING_KINDS,
    check_nvlink,
    parse_nvidia_smi,
    read_nvlink_input,
)
from tests.unit.nvsmi_fixture import node_output, rack_uuid
from tests.unit.topology.test_support import build, site_dict

SITE = build(site_dict("gb200-nvl72"))


def capture(overrides: dict[str, dict] | None = None, *, cluster_of: dict[str, int] | None = None,
            skip: tuple[str, ...] = ()) -> dict[str, str]:
    """host -> nvidia-smi -q of a clean site, with per-host changes."""
    out = {}
    for n in SITE.inventory.nodes:
        if n.name in skip:
            continue
        rack = (cluster_of or {}).get(n.name, n.rack)
        out[n.name] = node_output(rack_uuid(rack), **(overrides or {}).get(n.name, {}))
    return out


def write_dir(tmp: Path, texts: dict[str, str]) -> Path:
    d = tmp / "nvsmi"
    d.mkdir()
    for host, text in texts.items():
        (d / f"{host}.txt").write_text(text)
    return d


def run_check(tmp: Path, texts: dict[str, str]):
    return check_nvlink(SITE, read_nvlink_input(write_dir(tmp, texts)), "nvsmi")


def test_parser_reads_every_gpu_fabric_section():
    node = parse_nvidia_smi(node_output(rack_uuid(3)), "gb04n01")
    assert [g.bus_id for g in node.gpus] == ["0008:01:00.0", "0009:01:00.0", "0018:01:00.0",
                                             "0019:01:00.0"]
    g = node.gpus[0]
    assert (g.state, g.status, g.clique, g.cluster_uuid, g.bandwidth) == \
        ("Completed", "Success", "32766", rack_uuid(3), "Full")


def test_clean_site_has_no_findings(tmp_path):
    report = run_check(tmp_path, capture())
    assert report.clean, report.findings[:3]
    assert report.stats["domains_seen"] == 32 and report.stats["gpus_ready"] == 2304


def test_pdsh_prefixed_single_file_reads_the_same(tmp_path):
    texts = capture()
    lines = [f"{h}: {line}" for h, t in texts.items() for line in t.splitlines()]
    f = tmp_path / "all.txt"
    f.write_text("\n".join(lines) + "\n")
    nodes = read_nvlink_input(f)
    assert len(nodes) == 576 and check_nvlink(SITE, nodes, str(f)).clean


def only(report, kind):
    assert [f.kind for f in report.findings] == [kind], [f.message for f in report.findings]
    return report.findings[0]


def test_gpu_not_registered_with_the_fabric(tmp_path):
    f = only(run_check(tmp_path, capture({"gb05n07": {"overrides": {
        2: {"state": "In Progress", "status": "N/A"}}}})), "nvlink-not-ready")
    assert f.node == "gb05n07" and "0018:01:00.0" in f.subject and "In Progress" in f.message
    assert "fabric manager" in f.fix


def test_degraded_bandwidth_is_a_warning(tmp_path):
    f = only(run_check(tmp_path, capture({"gb01n02": {"overrides": {
        0: {"bandwidth": "Degraded"}}}})), "nvlink-degraded")
    assert f.severity == "warning" and f.node == "gb01n02"


def test_tray_in_another_rack(tmp_path):
    # gb03n05 is named as rack 3's, but its GPUs are in rack 9's NVLink domain.
    f = only(run_check(tmp_path, capture(cluster_of={"gb03n05": 8})), "nvlink-wrong-domain")
    assert f.node == "gb03n05" and "nvl09" in f.message and "nvl03" in f.message


def test_tray_in_another_partition(tmp_path):
    f = only(run_check(tmp_path, capture({"gb10n18": {"overrides": {
        i: {"clique": 4} for i in range(4)}}})), "nvlink-partitioned")
    assert f.node == "gb10n18" and "clique 4" in f.message


def test_split_node(tmp_path):
    f = only(run_check(tmp_path, capture({"gb02n01": {"overrides": {3: {"clique": 9}}}})),
             "nvlink-split-node")
    assert f.node == "gb02n01"


def test_two_racks_in_one_domain(tmp_path):
    both = {n.name: 0 for n in SITE.inventory.nodes if n.rack in (0, 1)}
    f = only(run_check(tmp_path, capture(cluster_of=both)), "nvlink-merged-domains")
    assert f.subject == "nvl01+nvl02"


def test_missing_and_unknown_nodes(tmp_path):
    texts = capture(skip=("gb32n18",))
    texts["gb99n01"] = node_output(rack_uuid(0))
    kinds = sorted(f.kind for f in run_check(tmp_path, texts).findings)
    assert kinds == ["nvlink-node-missing", "nvlink-unknown-node"]


def test_missing_gpu(tmp_path):
    f = only(run_check(tmp_path, capture({"gb07n03": {"gpus": 3}})), "nvlink-gpu-count")
    assert "3 GPU(s)" in f.message


def test_kinds_are_documented_and_distinct():
    assert not set(NVLINK_FINDING_KINDS) & set(FINDING_KINDS)
    doc = (Path(__file__).resolve().parents[3] / "docs" / "fabric-check.md").read_text()
    for kind in NVLINK_FINDING_KINDS:
        assert f"`{kind}`" in doc, kind


@pytest.mark.parametrize(("content", "err"), [
    ("this is not nvidia-smi output\n", "expected 'host: line'"),
    ("gb01n01: Driver Version : 570\n", "no GPU sections"),
])
def test_bad_input_is_one_line(tmp_path, content, err):
    f = tmp_path / "x.txt"
    f.write_text(content)
    with pytest.raises(UsageError, match=err):
        read_nvlink_input(f)
    with pytest.raises(UsageError, match="No such file"):
        read_nvlink_input(tmp_path / "absent.txt")


def run(argv: list[str], capsys) -> tuple[int, str, str]:
    from slurmpod.cli.main import main

    try:
        main(argv)
        code = 0
    except SystemExit as exc:
        code = int(exc.code or 0)
    out = capsys.readouterr()
    return code, out.out, out.err


def test_cli_check_nvlink(tmp_path, capsys):
    d = write_dir(tmp_path, capture(cluster_of={"gb03n05": 8}))
    rc, out, _ = run(["topo", "check", "gb200-nvl72", "--nvlink", str(d), "--json"], capsys)
    assert rc == 1, out
    data = json.loads(out)
    assert [f["kind"] for f in data["findings"]] == ["nvlink-wrong-domain"]
    assert data["findings"][0]["location"]["node"] == "gb03n05"
    (tmp_path / "c").mkdir()
    clean = write_dir(tmp_path / "c", capture())
    rc, out, _ = run(["topo", "check", "gb200-nvl72", "--nvlink", str(clean)], capsys)
    assert rc == 0 and "clean" in out, out
    rc, _, err = run(["topo", "check", "dgx-h100-superpod", "--nvlink", str(clean)], capsys)
    assert rc == 2 and "no NVLink domain larger than a node" in err
    assert "Traceback" not in err
