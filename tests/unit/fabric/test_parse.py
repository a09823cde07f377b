"""ibnetdiscover parser: hand-written samples in the documented format, real-world variation,
clear errors on garbage, and a round trip through the synthesizer."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slurmpod.config import builtin_site_path, load_site
from slurmpod.errors import ConfigError
from slurmpod.fabric.ibnetdiscover import host_device, link_gbps, parse, parse_file, speed_name
from slurmpod.fabric.synth import synthesize
from slurmpod.topology.fabric_plan import plan_fabric
from tests.helpers import DATA_DIR

DATA = DATA_DIR / "ibnetdiscover"


def test_basic_sample_nodes_ports_and_ids():
    fab = parse_file(DATA / "basic.txt")
    kinds = sorted(n.kind for n in fab.nodes.values())
    assert kinds == ["ca"] * 4 + ["switch"] * 3
    leaf = fab.nodes["S-b8cef60300a00000"]
    assert leaf.nports == 64 and leaf.lid == 2 and leaf.name == "su1-leaf-r0"
    assert leaf.ids["devid"] == "0xd2f2" and leaf.guid == "b8cef60300a00000"
    assert sorted(leaf.ports) == [1, 2, 3]
    p1 = leaf.ports[1]
    assert (p1.remote_id, p1.remote_port, p1.remote_desc, p1.remote_lid) == (
        "H-0c42a10300f10100", 1, "dgx0001 mlx5_0", 11)
    assert (p1.width, p1.speed, p1.gbps) == ("4x", "NDR", 400.0)
    assert leaf.ports[3].remote_id == "S-b8cef60300b00000" and leaf.ports[3].remote_port == 1
    ca = fab.nodes["H-0c42a10300f10210"]
    assert (ca.host, ca.device, ca.guid) == ("dgx0002", "mlx5_1", "0c42a10300f10210")
    # The CA side of the same link: `# lid 14 lmc 0 "switch" lid 3 2xNDR`.
    back = ca.ports[1]
    assert (back.remote_id, back.remote_port, back.remote_desc, back.remote_lid) == (
        "S-b8cef60300a00001", 2, "MF0;su1-leaf-r1:MQM9700/U1", 3)
    assert back.rate == "2xNDR" and back.gbps == 200.0


def test_every_link_is_seen_from_both_ends_in_the_sample():
    fab = parse_file(DATA / "basic.txt")
    for node in fab.nodes.values():
        for port in node.ports.values():
            peer = fab.nodes[port.remote_id].ports[port.remote_port]
            assert (peer.remote_id, peer.remote_port) == (node.node_id, port.num)


def test_variations_are_tolerated():
    fab = parse_file(DATA / "variations.txt")
    leaf = fab.nodes["S-b8cef60300a00000"]
    assert sorted(leaf.ports) == [1, 2, 3, 4, 5, 6, 65]  # `[ext N]` labels, wrapped port 4
    assert leaf.ports[4].remote_desc == "dgx0004 mlx5_0" and leaf.ports[4].line == 16
    assert leaf.ports[2].remote_desc == "" and leaf.ports[2].rate == "4xHDR"
    no_desc = fab.nodes["H-0c42a10300f10200"]
    assert no_desc.desc == "" and no_desc.host is None
    assert no_desc.ports[1].gbps is None and no_desc.ports[1].rate == "??"
    default_desc = fab.nodes["H-0c42a10300f10300"]
    assert default_desc.host is None  # "MT4129 ConnectX7 Mellanox Technologies"
    wrapped = fab.nodes["H-0c42a10300f10400"]  # description split over two lines
    assert (wrapped.host, wrapped.device) == ("dgx0004", "mlx5_0")
    assert fab.nodes["R-0002c90300000005"].kind == "router"
    future = fab.nodes["X-0002c90300000006"]
    assert (future.kind, future.type_word, future.desc) == ("unknown", "???", "future device")
    assert fab.nodes["H-b8cef60300a00008"].is_aggregation_node


@pytest.mark.parametrize(("text", "line", "says"), [
    ('Switch 4 "S-1" # "x"\n[1] "H-2" # "h d" lid 1 4xNDR\n', 2, "cannot parse port line"),
    ('[1] "S-1"[2] # "x"\n', 1, "port line before any Switch/Ca line"),
    ('Switch 4 "S-1" # "x"\nthis is not ibnetdiscover\n', 2, "is this ibnetdiscover output?"),
    ('Switch 4 "S-1" # "x"\n\nCa 1 "S-1" # "y"\n', 3, "listed as Switch at line 1"),
    ('Ca 1 "H-1" # "dgx0001\n\n', 1, "unterminated line"),
])
def test_garbage_names_file_and_line(text, line, says):
    with pytest.raises(ConfigError) as info:
        parse(text, "fab.txt")
    assert f"fab.txt:{line}:" in info.value.message and says in info.value.message


def test_garbage_sample_and_unreadable_files(tmp_path):
    with pytest.raises(ConfigError, match=r"garbage\.txt:10: cannot parse port line"):
        parse_file(DATA / "garbage.txt")
    with pytest.raises(ConfigError, match="file not found"):
        parse_file(tmp_path / "nope.txt")
    binary = tmp_path / "bin.txt"
    binary.write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(ConfigError, match="not text"):
        parse_file(binary)
    empty = tmp_path / "empty.txt"
    empty.write_text("#\n# Topology file\n#\n")
    with pytest.raises(ConfigError, match="no Switch or Ca lines"):
        parse_file(empty)


def test_stderr_noise_and_crlf_are_skipped():
    text = ('ibwarn: [123] mad_rpc: _do_madrpc failed; dport (DR path slid 0; dlid 0; 0,1,3)\r\n'
            'Switch\t36 "S-0002c903007b7f30"\t\t# "MF0;switch-1:SX6036/U1" enhanced port 0 lid 3 '
            'lmc 0\r\n'
            '[1]\t"H-0002c9030009ad9e"[1](2c9030009ad9f) \t\t# "dgx0001 mlx5_0" lid 12 4xFDR\r\n')
    fab = parse(text)
    port = fab.nodes["S-0002c903007b7f30"].ports[1]
    assert port.remote_desc == "dgx0001 mlx5_0" and port.gbps == 56.0
    assert fab.nodes["S-0002c903007b7f30"].name == "switch-1"


@pytest.mark.parametrize(("width", "speed", "gbps"), [
    ("4x", "NDR", 400), ("4x", "HDR", 200), ("2x", "HDR", 100), ("2x", "NDR", 200),
    ("4x", "EDR", 100), ("4x", "FDR", 56), ("4x", "FDR10", 40), ("4x", "QDR", 40),
    ("1x", "NDR", 100), ("4x", "XDR", 800), ("4x", "SDR", 10), ("4x", "???", None),
    (None, "NDR", None), ("4x", None, None),
])
def test_link_rates(width, speed, gbps):
    # IBTA lane rates: SDR 2.5, QDR 10, FDR 14 (nominal), EDR 25, HDR 50, NDR 100, XDR 200 Gb/s.
    assert link_gbps(width, speed) == gbps


def test_speed_names_round_trip():
    for gbps in (100, 200, 400, 800):
        name = speed_name(gbps)
        assert link_gbps(name[:2], name[2:]) == gbps


@pytest.mark.parametrize(("desc", "want"), [
    ("dgx0001 mlx5_3", ("dgx0001", "mlx5_3")),
    ("dgx0001", ("dgx0001", None)),
    ("", (None, None)),
    ("MT4129 ConnectX7   Mellanox Technologies", (None, None)),
    ("Mellanox Technologies Aggregation Node", (None, None)),
    ("MTX-gpu01 mlx5_0", ("MTX-gpu01", "mlx5_0")),  # starts with MT but names a host
])
def test_host_device(desc, want):
    assert host_device(desc) == want


@settings(max_examples=25, deadline=None)
@given(wrap_at=st.integers(min_value=0, max_value=400))
def test_a_wrapped_description_reads_the_same(wrap_at):
    base = (DATA / "basic.txt").read_text()
    lines = base.splitlines()
    ca_lines = [i for i, ln in enumerate(lines) if ln.startswith("Ca\t")]
    i = ca_lines[wrap_at % len(ca_lines)]
    # Wrap inside the quoted description, the way a terminal or an editor breaks long lines.
    cut = lines[i].index(" mlx5_")
    lines[i:i + 1] = [lines[i][:cut], lines[i][cut:]]
    assert _shape(parse("\n".join(lines))) == _shape(parse(base))


def _shape(fab):
    return {nid: (n.kind, n.desc, {k: (p.remote_id, p.remote_port, p.rate)
                                   for k, p in n.ports.items()})
            for nid, n in fab.nodes.items()}


def test_synthesized_fabric_parses_back_to_the_plan():
    site = load_site(builtin_site_path("sandbox"))
    plan = plan_fabric(site)
    fab = parse(synthesize(site, plan))
    by_name = {n.name: n for n in fab.switches()}
    assert set(by_name) == {s.name for s in plan.switches}
    cas = {n.desc: n for n in fab.cas()}
    for nl in plan.node_links:
        port = by_name[nl.leaf].ports[nl.port]
        assert fab.nodes[port.remote_id] is cas[f"{nl.node} {nl.hca}"]
        assert port.gbps == plan.link_gbps
    for sl in plan.switch_links:
        port = by_name[sl.lower].ports[sl.lower_port]
        assert fab.nodes[port.remote_id] is by_name[sl.upper]
        assert port.remote_port == sl.upper_port
