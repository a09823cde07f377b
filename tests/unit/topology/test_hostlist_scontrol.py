"""Hostlists in generated files equal what the real `scontrol show hostlist/hostnames` prints.

Runs the installed Slurm's scontrol (Debian's 22.05 in CI) against a minimal slurm.conf; the
hostlist commands work offline, without a slurmctld.
"""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from slurmpod.model.hostlist import compress, expand

SCONTROL = shutil.which("scontrol")
pytestmark = pytest.mark.skipif(SCONTROL is None, reason="Slurm's scontrol is not installed")


@pytest.fixture(scope="module")
def slurm_env(tmp_path_factory):
    conf = tmp_path_factory.mktemp("slurm") / "slurm.conf"
    conf.write_text(
        "ClusterName=x\nSlurmctldHost=localhost\nNodeName=n1\nPartitionName=p Nodes=n1\n")
    return {**os.environ, "SLURM_CONF": str(conf)}


def scontrol(env: dict[str, str], *args: str) -> str:
    proc = subprocess.run([SCONTROL, "show", *args], env=env, capture_output=True, text=True,
                          timeout=30, check=True)
    return proc.stdout.strip()


names = st.builds(
    lambda prefix, num, width: f"{prefix}{num:0{width}d}",
    st.sampled_from(["dgx", "gpu", "n", "gb01n", "h200-"]),
    st.integers(0, 1200),
    st.integers(1, 4),
)
# Runs of consecutive hosts, as generated files have them, plus arbitrary singles.
runs = st.builds(
    lambda prefix, start, length, width: [f"{prefix}{i:0{width}d}"
                                          for i in range(start, start + length)],
    st.sampled_from(["dgx", "gpu", "nvl72-ph001n"]),
    st.integers(0, 990),
    st.integers(1, 12),
    st.integers(3, 4),
)
host_lists = st.lists(st.one_of(names.map(lambda n: [n]), runs), min_size=1, max_size=8).map(
    lambda chunks: [h for c in chunks for h in c])


@settings(max_examples=30, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(hosts=host_lists)
def test_compress_and_expand_match_scontrol(slurm_env, hosts):
    ours = compress(hosts)
    assert ours == scontrol(slurm_env, "hostlist", ",".join(hosts))
    assert scontrol(slurm_env, "hostnames", ours).split("\n") == hosts
    assert expand(ours) == hosts


def test_generated_site_hostlists_match_scontrol(slurm_env):
    from slurmpod.topology.generate import generate
    from tests.unit.topology.test_support import build, site_dict

    text = generate(build(site_dict("gb200-nvl72")))["topology-block.conf"]
    for line in text.splitlines():
        if line.startswith("BlockName="):
            nodes = line.split("Nodes=", 1)[1]
            hosts = scontrol(slurm_env, "hostnames", nodes).split("\n")
            assert hosts == expand(nodes)
            assert scontrol(slurm_env, "hostlist", ",".join(hosts)) == nodes
