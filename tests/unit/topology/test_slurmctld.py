"""The installed slurmctld reads the generated nodes.conf, topology.conf and gres.conf cleanly.

For every example site, targeted at the installed Slurm (22.05 in CI): slurmctld is started in
the foreground on a private port and state directory, without munged (auth/slurm with a
private key where Slurm 25.11's auth/munge insists on munged), and killed as soon as it reaches
"Running as primary controller". Its debug log must show exactly the switches of topology.conf
(or of topology.yaml, which Slurm >= 25.05 reads instead) and no error beyond the known
harmless ones; `slurmd -G` must report the GPUs of gres.conf. The sandbox capability runs the
full cluster with jobs.
"""

from __future__ import annotations

import getpass
import re
import secrets
import shutil
import socket
import subprocess
import time
from pathlib import Path

import pytest

from slurmpod.model.hostlist import expand
from slurmpod.topology.generate import GenerateOptions, write_artifacts
from tests.unit.topology.test_support import EXAMPLE_SITES, build, site_dict

SLURMCTLD = shutil.which("slurmctld")
SLURMD = shutil.which("slurmd")
pytestmark = pytest.mark.skipif(SLURMCTLD is None or SLURMD is None,
                                reason="Slurm daemons are not installed")
# Errors slurmctld logs on a bare machine that say nothing about our files.
HARMLESS = re.compile(r"MailProg|[Mm]unge|PMIx|pmix|MPI|state file|backup state|Jobs may be "
                      r"lost|Reservations may be lost")


def _installed_version() -> str:
    out = subprocess.run([SLURMCTLD, "-V"], capture_output=True, text=True, timeout=30).stdout
    m = re.search(r"(\d{2})\.(\d{2})", out)
    assert m, out
    return f"{m[1]}.{m[2]}"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _slurm_conf(d: Path, plugin: str, auth: list[str] | None = None) -> Path:
    conf = d / "slurm.conf"
    conf.write_text("\n".join([
        *(auth or []),
        "ClusterName=check", "SlurmctldHost=localhost", f"SlurmctldPort={_free_port()}",
        f"SlurmUser={getpass.getuser()}", f"StateSaveLocation={d}/state",
        f"SlurmdSpoolDir={d}/spool/%n", f"SlurmctldPidFile={d}/ctld.pid",
        f"SlurmdPidFile={d}/slurmd-%n.pid", "ProctrackType=proctrack/linuxproc",
        "TaskPlugin=task/none", "SelectType=select/cons_tres", "GresTypes=gpu",
        "MailProg=/bin/true", "MpiDefault=none", f"TopologyPlugin=topology/{plugin}",
        f"Include {d}/nodes.conf", "",
    ]))
    (d / "state").mkdir(exist_ok=True)
    if tuple(map(int, _installed_version().split("."))) >= (24, 5):
        # slurmd reads cgroup.conf from 24.05 on and, without one, fails where /sys/fs/cgroup is
        # not mounted (a chroot, some containers); the sandbox disables it the same way.
        (d / "cgroup.conf").write_text("CgroupPlugin=disabled\n")
    return conf


def _without_munge(d: Path, plugin: str) -> tuple[Path, list[str]]:
    """Start slurmctld without munged: fine up to 24.11 with auth/munge; Slurm 25.11's
    auth/munge creates a credential at start-up and stops without munged, so fall back to
    auth/slurm (Slurm >= 23.11), which needs only a key beside slurm.conf."""
    conf = _slurm_conf(d, plugin)
    log = _run_slurmctld(conf)
    if not any("failed to initialize auth plugin" in line for line in log):
        return conf, log
    key = d / "slurm.key"
    key.write_bytes(secrets.token_bytes(1024))
    key.chmod(0o600)
    conf = _slurm_conf(d, plugin, ["AuthType=auth/slurm", "CredType=cred/slurm"])
    return conf, _run_slurmctld(conf)


def _run_slurmctld(conf: Path) -> list[str]:
    proc = subprocess.Popen([SLURMCTLD, "-D", "-c", "-vvvv", "-f", str(conf)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines: list[str] = []
    deadline = time.monotonic() + 60
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line.rstrip("\n"))
            if "Running as primary controller" in line or "fatal" in line:
                break
            if time.monotonic() > deadline:
                break
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return lines


@pytest.mark.parametrize("name", EXAMPLE_SITES)
def test_slurmctld_accepts_generated_files(name, tmp_path):
    version = _installed_version()
    site = build(site_dict(name))
    dev = tmp_path / "dev"
    dev.mkdir()
    opts = GenerateOptions(slurm_version=version, gres_file_prefix=f"{dev}/nvidia",
                           localhost_base_port=30001)
    write_artifacts(site, tmp_path, opts)
    text = (tmp_path / "topology.conf").read_text()
    conf, log = _without_munge(tmp_path, "tree")
    assert any("Running as primary controller" in line for line in log), "\n".join(log[-20:])
    bad = [line for line in log if ("error:" in line or "fatal" in line)
           and not HARMLESS.search(line)]
    assert not bad, bad
    # slurmctld's own view of the tree: the same switches, and every leaf with its nodes.
    seen = {m[1]: m[2] for line in log
            if (m := re.search(r"_log_switches: Switch level:\d+ name:(\S+) nodes:(\S+)", line))}
    expected = {}
    for line in text.splitlines():
        if line.startswith("SwitchName="):
            fields = dict(tok.split("=", 1) for tok in line.split())
            expected[fields["SwitchName"]] = fields.get("Nodes")
    assert set(seen) == set(expected)
    for switch, nodes in expected.items():
        if nodes:
            assert expand(seen[switch]) == expand(nodes)

    # slurmd parses gres.conf for one node and reports its GPUs with the generated Cores=.
    node = site.inventory.nodes[-1]
    nt = site.node_types[node.node_type]
    for i in range(nt.gpus):
        (dev / f"nvidia{i}").touch()
    out = subprocess.run([SLURMD, "-G", "-N", node.name, "-f", str(conf)], capture_output=True,
                         text=True, timeout=60)
    counts = [int(m) for m in re.findall(r"Name=gpu Type=\S+ Count=(\d+)", out.stdout + out.stderr)]
    assert sum(counts) == nt.gpus, out.stdout + out.stderr
