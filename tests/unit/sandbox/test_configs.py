"""The sandbox's configuration: generated site files used unmodified, daemon settings per version,
the epilog hook script quoted safely. No Slurm needed."""

from __future__ import annotations

import os
import subprocess
import tomllib
from pathlib import Path

import pytest

import slurmpod
from slurmpod.config import builtin_site_path, load_site, validate
from slurmpod.errors import ConfigError
from slurmpod.model.site import Site
from slurmpod.sandbox.cluster import check_state_path
from slurmpod.sandbox.configs import SandboxSettings, generated_artefacts, render_files
from slurmpod.sandbox.layout import Layout, Ports
from slurmpod.sandbox.prereqs import parse_slurm_version
from slurmpod.topology.generate import GenerateOptions, generate

SITE_PATH = builtin_site_path("sandbox")


def _settings(root: Path, version: tuple[int, int, int] = (22, 5, 8), accounting: bool = True,
              python: str = "/usr/bin/python3", n_nodes: int = 16,
              slurm_bin: str = "/usr/bin") -> SandboxSettings:
    return SandboxSettings(Layout(root), Ports.from_base(20000, n_nodes), "alice", version,
                           SITE_PATH, accounting, python, slurm_bin)


def _conf(text: str) -> dict[str, str]:
    out = {}
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        if "=" in line and not line.startswith("Include"):
            key, _, value = line.partition("=")
            out[key] = value
    return out


def _block_site() -> Site:
    data = tomllib.loads(SITE_PATH.read_text())
    data["slurm"]["topology"] = "block"
    return validate(Site, data, "block-variant.toml")


def test_ports_block_layout() -> None:
    p = Ports.from_base(21000, 16)
    assert (p.slurmctld, p.slurmdbd, p.mariadb) == (21016, 21017, 21018)
    assert list(p.block) == list(range(21000, 21019))
    named = dict((port, what) for what, port in p.named())
    assert len(named) == 19 and named[21000] == "slurmd #1" and named[21016] == "slurmctld"


def test_slurm_conf_includes_generated_files_unmodified(tmp_path: Path) -> None:
    site = load_site(SITE_PATH)
    s = _settings(tmp_path)
    artefacts = generated_artefacts(site, s)
    files = render_files(site, s, artefacts)
    # The generator's own output, byte for byte, for the same options.
    expected = generate(site, GenerateOptions(slurm_version="22.05",
                                              gres_file_prefix=f"{tmp_path}/dev/nvidia",
                                              localhost_base_port=20000))
    for name in ("nodes.conf", "gres.conf", "topology.conf"):
        assert files[f"etc/{name}"] == expected[name]
    slurm_conf = files["etc/slurm.conf"]
    assert f"Include {tmp_path}/etc/nodes.conf" in slurm_conf.splitlines()
    conf = _conf(slurm_conf)
    assert conf["TopologyPlugin"] == "topology/tree"
    assert conf["SlurmctldPort"] == "20016" and conf["AccountingStoragePort"] == "20017"
    assert conf["AccountingStorageTRES"] == "gres/gpu"
    assert conf["AccountingStoreFlags"] == "job_comment,job_extra"
    assert conf["JobAcctGatherFrequency"] == "task=1"
    assert conf["AccountingStoragePass"] == conf["AuthInfo"].removeprefix("socket=")
    assert conf["SlurmUser"] == "alice"
    assert conf["EpilogSlurmctld"] == f"{tmp_path}/hooks/epilog-slurmctld"
    assert conf["ProctrackType"] == "proctrack/linuxproc" and conf["TaskPlugin"] == "task/none"
    # The node ports the generator wrote are the ones the sandbox reserved.
    assert "Port=[20000-20001]" in files["etc/nodes.conf"]
    assert f"File={tmp_path}/dev/nvidia[0-3]" in files["etc/gres.conf"]
    dbd = _conf(files["etc/slurmdbd.conf"])
    assert dbd["DbdPort"] == "20017" and dbd["StoragePort"] == "20018"
    # MariaDB creates slurmdbd's database itself, so slurmdbd's first connect finds it.
    assert files["etc/mariadb-init.sql"] == (
        f"CREATE DATABASE IF NOT EXISTS `{dbd['StorageLoc']}`;\n")
    assert "CgroupPlugin=autodetect" in files["etc/cgroup.conf"]
    # Every value in the Slurm files is a plain token: nothing left for Jinja to fill.
    assert not any("{{" in text or "}}" in text for text in files.values())


def test_no_accounting_drops_gres_tres(tmp_path: Path) -> None:
    site = load_site(SITE_PATH)
    s = _settings(tmp_path, accounting=False)
    conf = _conf(render_files(site, s, generated_artefacts(site, s))["etc/slurm.conf"])
    # gres/gpu in AccountingStorageTRES without slurmdbd is fatal to slurmctld (22.05).
    assert "AccountingStorageTRES" not in conf
    assert conf["AccountingStorageType"] == "accounting_storage/none"


def test_block_topology_on_newer_slurm(tmp_path: Path) -> None:
    site = _block_site()
    s = _settings(tmp_path, version=(24, 11, 5))
    artefacts = generated_artefacts(site, s)
    files = render_files(site, s, artefacts)
    assert _conf(files["etc/slurm.conf"])["TopologyPlugin"] == "topology/block"
    assert files["etc/topology.conf"] == artefacts["topology-block.conf"]
    assert "BlockName=" in files["etc/topology.conf"]
    assert "CgroupPlugin=disabled" in files["etc/cgroup.conf"]
    # 25.05 reads topology.yaml: the generator's file goes in under that name.
    s25 = _settings(tmp_path, version=(25, 5, 0))
    files25 = render_files(site, s25, generated_artefacts(site, s25))
    assert "etc/topology.yaml" in files25 and "etc/topology.conf" not in files25


def test_block_site_on_old_slurm_is_a_config_error(tmp_path: Path) -> None:
    site = _block_site()
    s = _settings(tmp_path, version=(22, 5, 8))
    with pytest.raises(ConfigError, match=r"23\.11"):
        render_files(site, s, generated_artefacts(site, s))


def test_epilog_script_quotes_paths_and_always_exits_zero(tmp_path: Path) -> None:
    site = load_site(SITE_PATH)
    odd = tmp_path / "it's a $dir"
    odd.mkdir()
    record = tmp_path / "argv.txt"
    fake_python = odd / "py thon"
    fake_python.write_text("#!/bin/sh\nprintf '%s\\n' \"$@\" \"$SLURMPOD_SPOOL\" \"$PYTHONPATH\""
                           f" \"$PATH\" > '{record}'\nexit 7\n")
    fake_python.chmod(0o755)
    root = tmp_path / "state"
    s = _settings(root, python=str(fake_python), slurm_bin=str(odd))
    script = render_files(site, s, generated_artefacts(site, s))["hooks/epilog-slurmctld"]
    hook = tmp_path / "epilog"
    hook.write_text(script)
    hook.chmod(0o755)
    (root / "log").mkdir(parents=True)
    cp = subprocess.run([str(hook)], capture_output=True, text=True, timeout=10, check=False,
                        env={"PATH": os.environ.get("PATH", "/usr/bin:/bin")})
    assert cp.returncode == 0  # the hook failed (exit 7), the epilog still succeeds
    args = record.read_text().splitlines()
    assert args == ["-m", "slurmpod", "hook", "epilog", "--spool", f"{root}/spool",
                    "--site", str(SITE_PATH), "--slurm-conf", f"{root}/etc/slurm.conf",
                    f"{root}/spool", str(Path(slurmpod.__file__).resolve().parent.parent),
                    f"{root}/bin:{odd}:/usr/bin:/bin"]  # the emulated dcgmi, then Slurm's


@pytest.mark.parametrize("path", ["/tmp/a b", "/tmp/x[1]", "/tmp/a,b", "/tmp/a=b", "/tmp/#x"])
def test_state_paths_slurm_cannot_hold_are_refused(path: str) -> None:
    with pytest.raises(ConfigError, match="choose a state directory"):
        check_state_path(Path(path))


def test_plain_state_path_is_accepted() -> None:
    check_state_path(Path("/tmp/slurmpod-sandbox_1.x/state"))


@pytest.mark.parametrize(("text", "want"), [
    ("slurm-wlm 22.05.8\n", (22, 5, 8)),
    ("slurm 24.11.5\n", (24, 11, 5)),
    ("slurm 23.11\n", (23, 11, 0)),
])
def test_parse_slurm_version(text: str, want: tuple[int, int, int]) -> None:
    assert parse_slurm_version(text) == want


def test_unreadable_slurm_version() -> None:
    with pytest.raises(ConfigError, match="cannot read the Slurm version"):
        parse_slurm_version("command not found")


def _fake_programs(root: Path, names: list[str], release: str) -> None:
    root.mkdir(parents=True, exist_ok=True)
    for name in names:
        path = root / name
        path.write_text(f"#!/bin/sh\necho 'slurm {release}'\n")
        path.chmod(0o755)


def _two_slurms(tmp_path: Path) -> tuple[list[str], Path]:
    """System programs (Slurm 22.05.8) in tmp/usr, a Slurm 25.11.7 in tmp/opt/slurm-25.11."""
    from slurmpod.sandbox.prereqs import REQUIRED

    clients = ["sinfo", "scontrol", "sacctmgr", "squeue", "scancel"]
    daemons = ["slurmctld", "slurmd", "slurmdbd"]
    others = [p for p in REQUIRED if p not in clients + daemons]
    _fake_programs(tmp_path / "usr" / "sbin", others + daemons, "22.05.8")
    _fake_programs(tmp_path / "usr" / "bin", clients, "22.05.8")
    opt = tmp_path / "opt" / "slurm-25.11"
    _fake_programs(opt / "sbin", daemons, "25.11.7")
    _fake_programs(opt / "bin", clients, "25.11.7")
    return [str(tmp_path / "usr" / "sbin"), str(tmp_path / "usr" / "bin")], opt


def test_slurm_from_another_prefix_is_found_first_on_path(tmp_path: Path) -> None:
    """PATH=/opt/slurm-X/sbin:/opt/slurm-X/bin:… picks that Slurm; the rest comes from PATH."""
    from slurmpod.sandbox.prereqs import check_one_slurm, find_tools, slurm_prefix, slurm_version

    system, opt = _two_slurms(tmp_path)
    tools = find_tools(path=os.pathsep.join([str(opt / "sbin"), str(opt / "bin"), *system]))
    assert {slurm_prefix(tools[p]) for p in ("slurmctld", "slurmd", "sinfo", "sacctmgr")} == {opt}
    assert slurm_prefix(tools["munged"]) == tmp_path / "usr"
    version = slurm_version(tools["slurmd"])
    assert version == (25, 11, 7)
    check_one_slurm(tools, version)


def test_daemons_and_clients_of_two_slurms_are_refused(tmp_path: Path) -> None:
    from slurmpod.sandbox.prereqs import check_one_slurm, find_tools, slurm_version

    system, opt = _two_slurms(tmp_path)
    tools = find_tools(path=os.pathsep.join([str(opt / "sbin"), *system]))
    with pytest.raises(ConfigError, match=r"Slurm 25\.11\.7 daemons .* but Slurm 22\.05\.8 "
                                          r"clients") as info:
        check_one_slurm(tools, slurm_version(tools["slurmd"]))
    assert f"{opt}/sbin:{opt}/bin" in (info.value.hint or "")


def test_task_prolog_puts_the_gpu_shims_first_on_path(tmp_path: Path) -> None:
    """slurmstepd reads `export NAME=value` lines from the TaskProlog (Slurm 22.05+)."""
    site = load_site(SITE_PATH)
    s = _settings(tmp_path)
    files = render_files(site, s, generated_artefacts(site, s))
    assert _conf(files["etc/slurm.conf"])["TaskProlog"] == f"{tmp_path}/hooks/task-prolog"
    hook = tmp_path / "tp"
    hook.write_text(files["hooks/task-prolog"])
    hook.chmod(0o755)
    cp = subprocess.run([str(hook)], capture_output=True, text=True, timeout=10, check=True,
                        env={"PATH": "/usr/bin:/bin"})
    assert cp.stdout.splitlines() == [f"export PATH={tmp_path}/bin:/usr/bin:/bin",
                                      f"export SLURMPOD_EMU_GPU_DIR={tmp_path}/gpu"]
    for tool in ("dcgmi", "nvidia-smi"):
        text = files[f"bin/{tool}"]
        assert text.startswith(f"#!{s.python}\n") and "slurmpod sandbox only" in text
        compile(text, tool, "exec")  # the figures literal is valid Python
