"""Render a sandbox's configuration: the site's generated artefacts plus the daemons' own files.

The topology generator's `nodes.conf`, `gres.conf` and tree or block topology are used unmodified
(nodes.conf through `Include`, the others under the names Slurm reads from SLURM_CONF's
directory). Only the daemon settings (ports, paths, users, accounting) come from
`templates/sandbox/`.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import slurmpod
from slurmpod.errors import ConfigError
from slurmpod.sandbox.layout import Layout, Ports
from slurmpod.sandbox.prereqs import release_string, version_string

if TYPE_CHECKING:
    from slurmpod.model.site import Site


@dataclass(frozen=True)
class SandboxSettings:
    """Everything the templates need besides the site."""

    layout: Layout
    ports: Ports
    user: str
    slurm_version: tuple[int, int, int]
    site_path: Path
    accounting: bool = True
    python: str = sys.executable
    slurm_bin: str = "/usr/bin"  # where the clients of the running Slurm are (scontrol, sacctmgr)


def _options(s: SandboxSettings) -> Any:
    from slurmpod.topology.generate import GenerateOptions  # lazy: start-up

    return GenerateOptions(slurm_version=version_string(s.slurm_version),
                           gres_file_prefix=s.layout.gres_file_prefix,
                           localhost_base_port=s.ports.slurmd_base)


def generated_artefacts(site: Site, s: SandboxSettings) -> dict[str, str]:
    """The topology generator's files for this sandbox (node ports on 127.0.0.1, fake GPUs)."""
    from slurmpod.topology.generate import generate  # lazy: start-up

    return generate(site, _options(s))


def pick_slurm_files(site: Site, s: SandboxSettings, artefacts: dict[str, str]
                     ) -> dict[str, str]:
    """Generator output -> the names Slurm reads from SLURM_CONF's directory; text untouched.

    The topology file is topology.conf (tree), topology-block.conf installed as topology.conf
    (block, Slurm >= 23.11) or topology.yaml (Slurm >= 25.05): the generator decides which.
    """
    from slurmpod.topology.generate import topology_file_to_install  # lazy: start-up

    topo_src = topology_file_to_install(site, _options(s))
    topo_dst = "topology.yaml" if topo_src.endswith(".yaml") else "topology.conf"
    out: dict[str, str] = {}
    for dst, src in (("nodes.conf", "nodes.conf"), ("gres.conf", "gres.conf"),
                     (topo_dst, topo_src)):
        if src not in artefacts:
            raise ConfigError(
                f"the topology generator produced no {src} for site {site.site.name!r} "
                f"(got: {', '.join(sorted(artefacts)) or 'nothing'})"
            )
        out[dst] = artefacts[src]
    return out


def topology_plugin(site: Site, s: SandboxSettings) -> str:
    from slurmpod.topology.generate import topology_plugin as plugin_for  # lazy: start-up

    return plugin_for(site, s.slurm_version[:2])


# slurmdbd's StorageLoc. MariaDB creates it at every start (`--init-file`, ACCOUNTING_DB_INIT)
# rather than slurmdbd on its first connection: slurmdbd 24.11 then retries the connect on the
# handle whose first connect failed (ER_BAD_DB_ERROR), and with MariaDB Connector/C 3.4.10
# (Debian 13's libmariadb3 1:11.8.9) that handle refuses every result set ("5027 Number of
# columns in result (=1) ... (=0)"), so slurmdbd dies at its first check query.
ACCOUNTING_DB = "slurm_acct_db"
ACCOUNTING_DB_INIT = f"CREATE DATABASE IF NOT EXISTS `{ACCOUNTING_DB}`;\n"


def render_files(site: Site, s: SandboxSettings, artefacts: dict[str, str]) -> dict[str, str]:
    """All files of `etc/` and `hooks/`, relative to the state directory."""
    from slurmpod.render.env import header, make_env  # lazy: start-up

    lay = s.layout
    env = make_env()
    ctx: dict[str, Any] = {
        "root": str(lay.root),
        "cluster_name": site.slurm.cluster_name,
        "accounting_db": ACCOUNTING_DB,
        "slurm_version": release_string(s.slurm_version),
        "ports": s.ports,
        "user": s.user,
        "munge_socket": str(lay.munge_socket),
        "state_save": str(lay.state_save),
        "slurmd_spool": str(lay.slurmd_spool),
        "run": str(lay.run),
        "log": str(lay.log),
        "topology_plugin": topology_plugin(site, s),
        "accounting": s.accounting,
        "epilog_slurmctld": str(lay.epilog_slurmctld),
        "nodes_conf": str(lay.etc / "nodes.conf"),
        "cgroup_disabled": s.slurm_version[:2] >= (24, 5),
        "spool": str(lay.spool),
        "python": s.python,
        "hook_log": str(lay.logfile("hook-epilog")),
        "site_path": str(s.site_path),
        "package_parent": str(Path(slurmpod.__file__).resolve().parent.parent),
        "slurm_conf": str(lay.slurm_conf),
        "slurm_bin": s.slurm_bin,
        "task_prolog": str(lay.task_prolog),
        "shim_bin": str(lay.bin),
        "gpu_state": str(lay.gpu_state),
    }
    files = {f"etc/{k}": v for k, v in pick_slurm_files(site, s, artefacts).items()}
    for name, tpl in (("etc/slurm.conf", "slurm.conf.j2"),
                      ("etc/slurmdbd.conf", "slurmdbd.conf.j2"),
                      ("etc/cgroup.conf", "cgroup.conf.j2"),
                      ("hooks/epilog-slurmctld", "epilog-slurmctld.sh.j2"),
                      ("hooks/task-prolog", "task-prolog.sh.j2")):
        ctx["header"] = header("#", f"sandbox/{tpl}", site.site.name)
        files[name] = env.get_template(f"sandbox/{tpl}").render(**ctx)
    files["etc/mariadb-init.sql"] = ACCOUNTING_DB_INIT
    files.update(shim_files(site, s))
    return files


SHIMS = ("dcgmi", "nvidia-smi")


def shim_files(site: Site, s: SandboxSettings) -> dict[str, str]:
    """`bin/dcgmi` and `bin/nvidia-smi`: the emulated GPUs' tools (sandbox/gpu_shims.py)."""
    from slurmpod.sandbox.gpu_shims import shim_figures, shim_script  # lazy: start-up

    figures = shim_figures(site)
    parent = str(Path(slurmpod.__file__).resolve().parent.parent)
    return {f"bin/{tool}": shim_script(tool, s.python, parent, str(s.layout.gpu_state), figures)
            for tool in SHIMS}
