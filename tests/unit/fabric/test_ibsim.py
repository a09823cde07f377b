"""The real `ibnetdiscover` (infiniband-diags) against an `ibsim` fabric (ibsim-utils): what the
tool itself prints, not slurmpod's synthesizer, goes through check and discover.

ibsim builds the fabric from a net file (`Switch N "id"` / `Hca N "id"` records and their
`[port] "peer"[port]` lines; the id becomes the node description) and ibnetdiscover runs against
it with libumad2sim preloaded. ibsim links train at 4xSDR (10 Gb/s), so the site says so.
"""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import time
import tomllib
from pathlib import Path

import pytest

from slurmpod.config import builtin_site_path, validate
from slurmpod.fabric.check import check_fabric
from slurmpod.fabric.discover import discover_site, draft_site_toml
from slurmpod.fabric.ibnetdiscover import parse
from slurmpod.fabric.synth import Fault, synthesize
from slurmpod.model.site import Site
from slurmpod.topology.fabric_plan import plan_fabric

IBSIM = shutil.which("ibsim")
IBNETDISCOVER = shutil.which("ibnetdiscover") or (
    "/usr/sbin/ibnetdiscover" if os.path.exists("/usr/sbin/ibnetdiscover") else None)
UMAD2SIM = next(iter(glob.glob("/usr/lib/*/umad2sim/libumad2sim.so")), None)
HAVE = bool(IBSIM and IBNETDISCOVER and UMAD2SIM)
pytestmark = pytest.mark.skipif(
    not HAVE and os.environ.get("CI") != "true",
    reason="ibsim-utils / infiniband-diags are not installed")


def small_site() -> Site:
    data = tomllib.loads(builtin_site_path("sandbox").read_text())
    # One subnet: the rails share the spines (per-rail planes would be eight subnets).
    data["fabric"].update(link_gbps=10, sharp=False, spine_groups="shared")
    return validate(Site, data, "ibsim site")


def net_file(text: str) -> str:
    """ibsim's net file for a fabric, from its ibnetdiscover text: node ids are descriptions."""
    fab = parse(text)
    out = []
    for node in fab.nodes.values():
        word = "Switch" if node.kind == "switch" else "Hca"
        out.append(f'{word}\t{node.nports} "{node.desc}"')
        for num, port in sorted(node.ports.items()):
            out.append(f'[{num}]\t"{fab.nodes[port.remote_id].desc}"[{port.remote_port}]')
        out.append("")
    return "\n".join(out)


def real_ibnetdiscover(tmp_path: Path, text: str) -> str:
    net = tmp_path / "net"
    net.write_text(net_file(text))
    env = {**os.environ, "IBSIM_SOCKNAME": f"slurmpod-test-{os.getpid()}-{tmp_path.name}"}
    sim = subprocess.Popen([IBSIM, "-s", "-n", str(net)], env=env, stdin=subprocess.DEVNULL,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while True:
            proc = subprocess.run([IBNETDISCOVER], env={**env, "LD_PRELOAD": UMAD2SIM},
                                  capture_output=True, text=True, timeout=60)
            if proc.returncode == 0 and "Switch" in proc.stdout:
                return proc.stdout
            if time.monotonic() > deadline or sim.poll() is not None:
                raise AssertionError(f"ibnetdiscover under ibsim failed: {proc.stderr[-500:]}")
            time.sleep(0.3)
    finally:
        sim.terminate()
        sim.wait(timeout=10)


def mixed_descriptions(text: str) -> str:
    """Hosts describe their HCAs in every real form: rdma-ndd's, DGX OS's HCA-N, an FQDN, and
    one HCA whose description was never set."""
    text = text.replace('"gpu002 mlx5_', '"gpu002 HCA-X')
    for i in range(8):
        text = text.replace(f'"gpu002 HCA-X{i}"', f'"gpu002 HCA-{i + 1}"')
    text = text.replace('"gpu003 ', '"gpu003.cluster.example.com ')
    return text.replace('"gpu004 mlx5_2"', '"MT4129 ConnectX7 Mellanox Technologies"')


@pytest.fixture(scope="module")
def site_plan():
    site = small_site()
    return site, plan_fabric(site)


def test_real_ibnetdiscover_output_checks_and_discovers(site_plan, tmp_path):
    site, plan = site_plan
    out = real_ibnetdiscover(tmp_path, mixed_descriptions(synthesize(site, plan)))
    fab = parse(out, "ibsim")
    assert sum(1 for _ in fab.cas()) == 128 and sum(1 for _ in fab.switches()) == len(plan.switches)
    report = check_fabric(site, plan, fab)
    assert [f.kind for f in report.findings] == ["unset-description"], report.findings
    f = report.findings[0]
    assert (f.node, f.hca, f.switch, f.port) == ("gpu004", "mlx5_2", "leaf-su1-rail2", 4)
    draft = validate(Site, tomllib.loads(draft_site_toml(discover_site(fab), "d")), "draft")
    assert [n.name for n in draft.inventory.nodes] == [n.name for n in site.inventory.nodes]
    again = check_fabric(draft, plan_fabric(draft), fab)
    assert [f.kind for f in again.findings] == ["unset-description"], again.findings


def test_real_ibnetdiscover_shows_a_crossed_pair(site_plan, tmp_path):
    site, plan = site_plan
    text = synthesize(site, plan, [Fault("swap", "gpu001:mlx5_0,gpu001:mlx5_1")])
    report = check_fabric(site, plan, parse(real_ibnetdiscover(tmp_path, text), "ibsim"))
    assert [f.kind for f in report.findings] == ["swapped-cables"]
    assert "swap the cables in leaf-su1-rail" in report.findings[0].fix
