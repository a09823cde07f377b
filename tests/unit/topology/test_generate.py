"""Generated artefacts: golden files, Slurm syntax, coverage of every node, blocks, overrides."""

from __future__ import annotations

import itertools
import os
import re
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from slurmpod import __version__
from slurmpod.errors import ConfigError, UsageError
from slurmpod.model.hostlist import expand
from slurmpod.topology.generate import (
    GenerateOptions,
    generate,
    generation_warnings,
    topology_file_to_install,
    write_artifacts,
)
from tests.unit.topology.test_support import EXAMPLE_SITES, build, site_dict, variant

GOLDEN = Path(__file__).resolve().parents[2] / "golden" / "topology"
SANDBOX_OPTS = GenerateOptions(slurm_version="22.05", gres_file_prefix="/state/dev/nvidia",
                               localhost_base_port=17001)
# Golden cases: every example site as shipped, plus the sandbox as `slurmpod sandbox` runs it.
CASES = {name: (name, None) for name in EXAMPLE_SITES}
CASES["sandbox-localhost"] = ("sandbox", SANDBOX_OPTS)


def _normalise(text: str) -> str:
    # The header names slurmpod's version; golden files must survive a version bump.
    return text.replace(f"slurmpod {__version__} ", "slurmpod <version> ")


@pytest.mark.parametrize("case", sorted(CASES))
def test_golden(case):
    site_name, opts = CASES[case]
    files = {k: _normalise(v) for k, v in generate(build(site_dict(site_name)), opts).items()}
    root = GOLDEN / case
    if os.environ.get("SLURMPOD_UPDATE_GOLDEN") == "1":
        for old in root.rglob("*") if root.exists() else []:
            if old.is_file():
                old.unlink()
        for rel, text in files.items():
            (root / rel).parent.mkdir(parents=True, exist_ok=True)
            (root / rel).write_text(text)
    on_disk = {str(p.relative_to(root)): p.read_text() for p in root.rglob("*") if p.is_file()}
    assert sorted(on_disk) == sorted(files), "regenerate with SLURMPOD_UPDATE_GOLDEN=1"
    for rel, text in files.items():
        assert text == on_disk[rel], f"{case}/{rel} differs; SLURMPOD_UPDATE_GOLDEN=1 to accept"


# --- Slurm syntax ------------------------------------------------------------------------------
# Keys each record type may carry, from slurm.conf(5), gres.conf(5), topology.conf(5).
KNOWN = {
    "SwitchName": {"SwitchName", "Nodes", "Switches", "LinkSpeed"},
    "BlockName": {"BlockName", "Nodes"},
    "BlockSizes": {"BlockSizes"},
    "NodeName": {"NodeName", "Sockets", "CoresPerSocket", "ThreadsPerCore", "RealMemory", "Gres",
                 "Features", "Weight", "NodeHostname", "NodeAddr", "Port", "State", "CPUs",
                 "Boards"},
    "PartitionName": {"PartitionName", "Nodes", "Default", "MaxTime", "State", "OverSubscribe",
                      "PriorityTier", "GraceTime", "PreemptMode"},
    "gres": {"NodeName", "Name", "Type", "File", "Cores"},
}


def parse_conf(text: str, gres: bool = False) -> list[dict[str, str]]:
    """key=value records; every token must be key=value with a known key and a plain value."""
    records = []
    for raw in text.splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        rec: dict[str, str] = {}
        for token in line.split():
            key, sep, value = token.partition("=")
            assert sep and value and re.fullmatch(r"[A-Za-z]+", key), f"bad token {token!r}"
            assert key not in rec, f"duplicate {key} in {raw!r}"
            rec[key] = value
        kind = "gres" if gres else next(iter(rec))
        assert set(rec) <= KNOWN[kind], f"unknown keys {set(rec) - KNOWN[kind]} in {raw!r}"
        records.append(rec)
    return records


@pytest.mark.parametrize("case", sorted(CASES))
def test_conf_files_parse_and_cover_every_node(case):
    site_name, opts = CASES[case]
    site = build(site_dict(site_name))
    files = generate(site, opts)
    hosts = [n.name for n in site.inventory.nodes]

    nodes = parse_conf(files["nodes.conf"])
    node_lines = [r for r in nodes if "NodeName" in r and r.get("State") != "FUTURE"]
    listed = [h for r in node_lines for h in expand(r["NodeName"])]
    assert listed == hosts  # each node once, in inventory order
    for r in node_lines:
        nt = site.node_types[site.inventory.by_name[expand(r["NodeName"])[0]].node_type]
        assert r["Gres"] == f"gpu:{nt.gpu.model}:{nt.gpus}"
        assert int(r["Sockets"]) * int(r["CoresPerSocket"]) == nt.cores
    parts = [r for r in nodes if "PartitionName" in r]
    assert parts and all(set(expand(p["Nodes"])) <= set(hosts) for p in parts)

    tree = parse_conf(files["topology.conf"])
    leaves = [r for r in tree if "Nodes" in r]
    assert sorted(h for r in leaves for h in expand(r["Nodes"])) == sorted(hosts)
    defined = {r["SwitchName"] for r in tree}
    children = [c for r in tree if "Switches" in r for c in expand(r["Switches"])]
    assert set(children) <= defined and len(children) == len(set(children))
    roots = defined - set(children)
    assert len(roots) == 1  # one connected tree: jobs may span any leaves

    gres = parse_conf(files["gres.conf"], gres=True)
    per_node: dict[str, int] = {}
    for r in gres:
        files_n = len(expand(r["File"]))
        lo, _, hi = r["Cores"].partition("-")
        for h in expand(r["NodeName"]):
            nt = site.node_types[site.inventory.by_name[h].node_type]
            assert 0 <= int(lo) <= int(hi or lo) < nt.cores
            per_node[h] = per_node.get(h, 0) + files_n
    assert per_node == {h: site.node_types[site.inventory.by_name[h].node_type].gpus
                        for h in hosts}


def _blocks_and_sizes(text: str) -> tuple[list[dict[str, str]], list[int]]:
    recs = parse_conf(text)
    blocks = [r for r in recs if "BlockName" in r]
    sizes = [int(s) for s in next(r for r in recs if "BlockSizes" in r)["BlockSizes"].split(",")]
    return blocks, sizes


def _check_block_rules(site, blocks: list[dict[str, str]], sizes: list[int]) -> None:
    base = sizes[0]
    for prev, nxt in itertools.pairwise(sizes):
        ratio = nxt // prev
        assert nxt % prev == 0 and ratio >= 2 and ratio & (ratio - 1) == 0
    assert 2 ** (len(sizes) - 1) <= len(blocks) < 2 ** len(sizes)
    # Pairs, quads, ... of consecutive blocks (Slurm's aggregates) never straddle an SU.
    su_of = {n.name: n.su for n in site.inventory.nodes}
    for group in (2, 4, 8):
        for start in range(0, len(blocks), group):
            sus = {su_of[h] for b in blocks[start:start + group]
                   for h in expand(b.get("Nodes", "")) if h in su_of}
            assert len(sus) <= 1 or group * base > len(site.inventory.nodes_in_su(0))


def test_gb200_superpod_blocks_need_no_placeholder_on_any_slurm():
    site = build(site_dict("gb200-nvl72"))
    assert len(site.inventory.rack_names) == 32 and len(site.inventory.su_names) == 4
    for version in ("24.11", "25.05", "25.11"):
        files = generate(site, GenerateOptions(slurm_version=version))
        blocks, sizes = _blocks_and_sizes(files["topology-block.conf"])
        # 32 racks, one NVLink domain (18 trays) each; 8 per SU = a power of two.
        assert len(blocks) == 32 and all(len(expand(b["Nodes"])) == 18 for b in blocks)
        assert sizes == [18, 36, 72, 144, 288, 576]
        _check_block_rules(site, blocks, sizes)
        assert "State=FUTURE" not in files["nodes.conf"]


# 3 racks per SU: not a power of two, so SUs are padded to 4 blocks.
THREE_RACK_SU = {"su_groups": [{"node_type": "gb200-tray", "sus": 6, "nodes_per_su": 54,
                                "nodes_per_rack": 18}],
                 "fabric": {"leaf_radix": 144, "spine_radix": 144}}


def test_placeholders_are_future_nodes_before_25_05():
    site = build(variant("gb200-nvl72", **THREE_RACK_SU))
    files = generate(site, GenerateOptions(slurm_version="24.11"))
    blocks, sizes = _blocks_and_sizes(files["topology-block.conf"])
    real = [b for b in blocks if not b["BlockName"].startswith("nvl72-ph")]
    assert len(real) == 18 and len(blocks) == 23 and sizes[0] == 18
    # Slurm 24.11 is fatal on a block without nodes or with fewer than the first block's.
    assert all(len(expand(b["Nodes"])) >= sizes[0] for b in blocks)
    _check_block_rules(site, blocks, sizes)
    future = [r for r in parse_conf(files["nodes.conf"]) if r.get("State") == "FUTURE"]
    ph_nodes = {h for b in blocks if b not in real for h in expand(b["Nodes"])}
    assert ph_nodes == set(expand(future[0]["NodeName"]))


@pytest.mark.parametrize("version", ["25.05", "25.11"])
def test_placeholders_are_empty_blocks_from_25_05(version):
    yaml = pytest.importorskip("yaml")
    site = build(variant("gb200-nvl72", **THREE_RACK_SU))
    files = generate(site, GenerateOptions(slurm_version=version))
    blocks, sizes = _blocks_and_sizes(files["topology-block.conf"])
    empty = [b for b in blocks if "Nodes" not in b]
    assert [b["BlockName"] for b in empty] == [f"nvl72-ph00{i}" for i in range(1, 6)]
    assert len(blocks) == 23 and sizes[0] == 18
    _check_block_rules(site, blocks, sizes)
    assert "State=FUTURE" not in files["nodes.conf"]
    assert "FUTURE" not in files["topology-block.conf"]
    doc = yaml.safe_load(files["topology.yaml"])
    ymap = {b["block"]: b.get("nodes") for b in doc[1]["block"]["blocks"]}
    assert [n for n, nodes in ymap.items() if nodes is None] == [b["BlockName"] for b in empty]


def test_topology_yaml_matches_the_conf_files():
    yaml = pytest.importorskip("yaml")
    site = build(site_dict("h200-roce"))
    files = generate(site)
    doc = yaml.safe_load(files["topology.yaml"])
    assert [t["topology"] for t in doc] == ["tree", "block"]
    assert doc[0]["cluster_default"] is True and doc[1]["cluster_default"] is False
    tree = parse_conf(files["topology.conf"])
    assert [s["switch"] for s in doc[0]["tree"]["switches"]] == [r["SwitchName"] for r in tree]
    blocks = [r for r in parse_conf(files["topology-block.conf"]) if "BlockName" in r]
    assert [b["nodes"] for b in doc[1]["block"]["blocks"]] == [b["Nodes"] for b in blocks]


def test_localhost_ports_follow_node_order():
    site = build(site_dict("sandbox"))
    files = generate(site, SANDBOX_OPTS)
    seen = []
    for r in parse_conf(files["nodes.conf"]):
        if "NodeName" not in r:
            continue
        assert r["NodeHostname"] == "localhost" and r["NodeAddr"] == "127.0.0.1"
        names = expand(r["NodeName"])
        m = re.fullmatch(r"\[(\d+)-(\d+)\]|(\d+)", r["Port"])
        assert m
        lo, hi = (int(m[1]), int(m[2])) if m[1] else (int(m[3]), int(m[3]))
        ports = list(range(lo, hi + 1))
        assert len(ports) == len(names)
        seen += list(zip(names, ports, strict=True))
    assert seen == [(n.name, 17001 + n.index) for n in site.inventory.nodes]
    assert "File=/state/dev/nvidia[0-3]" in files["gres.conf"]


def test_slurm_version_decides_block_and_yaml():
    site = build(site_dict("gb200-nvl72"))
    assert "topology-block.conf" in generate(site)
    old = generate(site, GenerateOptions(slurm_version="22.05"))
    assert "topology-block.conf" not in old and "topology.yaml" not in old
    assert "topology.yaml" in generate(site, GenerateOptions(slurm_version="25.05"))
    assert topology_file_to_install(site) == "topology-block.conf"
    assert topology_file_to_install(site, GenerateOptions(slurm_version="23.02")) == \
        "topology.conf"
    with pytest.raises(UsageError):
        generate(site, GenerateOptions(slurm_version="24"))


def test_explicit_block_on_old_slurm_is_a_config_error():
    site = build(variant("gb200-nvl72", slurm={"topology": "block"}))
    with pytest.raises(ConfigError, match=r"slurm\.topology"):
        generate(site, GenerateOptions(slurm_version="23.02"))


def _imex_lines(text: str) -> list[str]:
    return [ln for ln in text.splitlines() if "nvidia_imex" in ln or "imex_channel" in ln]


def test_imex_switch_plugin_on_nvl72_sites_only():
    gb200 = build(site_dict("gb200-nvl72"))  # Slurm 24.11
    nodes = generate(gb200)["nodes.conf"]
    assert "#   SwitchType=switch/nvidia_imex" in nodes
    assert "#   SwitchParameters=imex_channel_count=2047" in nodes
    assert "every srun step (the batch step has none before 25.11)" in nodes
    assert "node features nvl01, nvl02" in nodes
    # Comments only: nodes.conf stays NodeName/PartitionName lines (the sandbox includes it).
    assert all(ln.startswith("#") for ln in _imex_lines(nodes))
    newer = generate(gb200, GenerateOptions(slurm_version="25.11"))["nodes.conf"]
    assert "every step of the job (25.11+)" in newer
    # Before 24.05 there is no switch/nvidia_imex; 8-GPU nodes never need IMEX.
    assert not _imex_lines(generate(gb200, GenerateOptions(slurm_version="23.11"))["nodes.conf"])
    assert not _imex_lines(generate(build(site_dict("dgx-h100-superpod")))["nodes.conf"])
    off = build(variant("gb200-nvl72", slurm={"imex": False}))
    assert not _imex_lines(generate(off)["nodes.conf"])


def test_imex_asked_for_on_old_slurm_is_a_config_error():
    site = build(variant("gb200-nvl72", slurm={"imex": True}))
    with pytest.raises(ConfigError, match=r"slurm\.imex"):
        generate(site, GenerateOptions(slurm_version="23.11"))
    forced = build(variant("dgx-h100-superpod", slurm={"imex": True}))
    assert _imex_lines(generate(forced)["nodes.conf"])


def test_node_weights_are_written_and_warned():
    site = build(variant("sandbox", slurm={"node_weights": {"emu8": 10}}))
    files = generate(site)
    assert all(r.get("Weight") == "10" for r in parse_conf(files["nodes.conf"])
               if "NodeName" in r)
    warns = generation_warnings(site)
    assert len(warns) == 1 and "overrides topology-aware placement" in warns[0]
    assert "# WARNING: slurm.node_weights" in files["nodes.conf"]


def test_nccl_xml_pairs_each_gpu_with_its_rail_nic():
    site = build(site_dict("dgx-h100-superpod"))
    nt = site.node_types["dgx-h100"]
    text = generate(site)["nccl-topo/dgx-h100.xml"]
    root = ET.fromstring(text)
    assert root.tag == "system" and root.get("version") == "1"
    gpu_numa = {d.bus_id: d.numa for d in nt.gpu_pci}
    # Rail k's HCA pairs with the k-th GPU in PCI bus order.
    gpus_sorted = sorted(gpu_numa)
    rail_hca = {h.rail: h.bus_id for h in nt.compute_hcas}
    expected = {gpus_sorted[k]: rail_hca[k] for k in range(8)}
    found = {}
    for cpu in root.findall("cpu"):
        numa = int(cpu.get("numaid"))
        mask = int(cpu.get("affinity").replace(",", ""), 16)
        # 56 cores per NUMA node x 2 threads.
        assert bin(mask).count("1") == 112
        for sw in cpu.findall("pci"):
            assert sw.get("class") == "0x060400"
            kids = sw.findall("pci")
            gpus = [k.get("busid") for k in kids if k.get("class") == "0x030200"]
            nics = [k.get("busid") for k in kids if k.get("class") == "0x020700"]
            assert len(gpus) == 1 and len(nics) == 1
            assert gpu_numa[gpus[0]] == numa
            found[gpus[0]] = nics[0]
    assert found == expected


def test_sandbox_affinity_masks_by_hand():
    # 2 sockets x 16 cores, 1 thread: NUMA 0 = CPUs 0-15, NUMA 1 = CPUs 16-31.
    root = ET.fromstring(generate(build(site_dict("sandbox")))["nccl-topo/emu8.xml"])
    assert [c.get("affinity") for c in root.findall("cpu")] == ["0000ffff", "ffff0000"]


def test_no_nccl_file_where_disabled_and_every_file_has_a_header():
    site = build(site_dict("gb200-nvl72"))
    files = generate(site)
    assert not any(k.startswith("nccl-topo/") for k in files)
    for name in EXAMPLE_SITES:
        for rel, text in generate(build(site_dict(name))).items():
            if rel.startswith("imex/"):
                continue  # addresses only: the IMEX guide documents no comment syntax
            first = text.splitlines()[0]
            assert f"slurmpod {__version__}" in first and f"site {name}" in first, (name, rel)


def test_write_artifacts_is_all_or_nothing(tmp_path):
    site = build(site_dict("sandbox"))
    out = tmp_path / "out"
    written = write_artifacts(site, out, SANDBOX_OPTS)
    assert sorted(p.relative_to(out).as_posix() for p in written) == sorted(
        generate(site, SANDBOX_OPTS))
    before = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    with pytest.raises(UsageError):
        write_artifacts(site, out, GenerateOptions(localhost_base_port=65530))
    assert {p: p.read_bytes() for p in out.rglob("*") if p.is_file()} == before
    assert not list(tmp_path.glob(".out.stage.*"))


# --- IMEX ------------------------------------------------------------------------------------

def test_imex_nodes_config_per_nvlink_domain_lists_its_nodes_in_order():
    site = build(site_dict("gb200-nvl72"))
    files = generate(site)
    imex = {k: v for k, v in files.items() if k.startswith("imex/")}
    assert len(imex) == 32
    for domain, name in enumerate(site.inventory.domain_names):
        want = [n.name for n in site.inventory.nodes if n.domain == domain]
        assert imex[f"imex/{name}/nodes_config.cfg"].splitlines() == want
    assert "--imex-hosts" in " ".join(generation_warnings(site))
    # 8-GPU nodes (NVLink ends at the node) and IMEX switched off: no IMEX files.
    assert not any(k.startswith("imex/") for k in generate(build(site_dict("dgx-h100-superpod"))))
    off = build(variant("gb200-nvl72", slurm={"imex": False}))
    assert not any(k.startswith("imex/") for k in generate(off))


def test_imex_hosts_file_gives_addresses():
    from slurmpod.topology.generate import read_hosts_file

    site = build(site_dict("gb200-nvl72"))
    lines = ["# compute trays", "127.0.0.1 localhost"]
    for node in site.inventory.nodes:
        lines.append(f"10.{node.rack // 8}.{node.rack % 8}.{node.slot + 10}  "
                     f"{node.name}.cluster.local {node.name}-bmc")
    hosts = read_hosts_file("hosts", "\n".join(lines))
    assert hosts["gb01n01"] == "10.0.0.10"  # short name of the FQDN
    files = generate(site, GenerateOptions(imex_hosts=hosts))
    assert files["imex/nvl02/nodes_config.cfg"].splitlines()[:2] == ["10.0.1.10", "10.0.1.11"]
    assert files["imex/nvl32/nodes_config.cfg"].splitlines()[-1] == "10.3.7.27"
    warned = generation_warnings(site, GenerateOptions(imex_hosts=hosts))
    assert not any("imex" in w for w in warned)


@pytest.mark.parametrize(("text", "err"), [
    ("gb01n01 10.0.0.1", "'gb01n01' is not an IP address"),
    ("10.0.0.1", "names no host"),
])
def test_bad_hosts_file_is_one_line(text, err):
    from slurmpod.topology.generate import read_hosts_file

    with pytest.raises(UsageError, match=err):
        read_hosts_file("hosts", "# ok\n" + text)


def test_su_packing_weights_are_constant_within_an_su_and_ordered_along_sus():
    from slurmpod.topology.slurm_files import su_packing_weights

    site = build(site_dict("gb200-nvl72"))
    weights = su_packing_weights(site)
    assert set(weights) == {n.name for n in site.inventory.nodes}
    for n in site.inventory.nodes:
        assert weights[n.name] == n.su + 1
    assert weights["gb08n18"] == 1 and weights["gb09n01"] == 2
