"""Find the system programs a sandbox needs and the installed Slurm version.

A missing program is a ConfigError (exit 3) naming the package to install, never a traceback.
Slurm is looked up on PATH first, then in /usr/sbin and friends, so a Slurm installed under
another prefix is used by putting its `sbin` and `bin` first on PATH (docs/sandbox.md). Its
daemons find their plugins in the PluginDir compiled into them (`<prefix>/lib/slurm`), which the
sandbox's slurm.conf leaves unset for that reason.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from slurmpod.errors import ConfigError

# program -> Debian package that ships it (Debian 12 and 13 use the same names).
REQUIRED: dict[str, str] = {
    "munged": "munge",
    "mariadbd": "mariadb-server",
    "mariadb-install-db": "mariadb-server",
    "slurmdbd": "slurmdbd",
    "slurmctld": "slurmctld",
    "slurmd": "slurmd",
    "sinfo": "slurm-client",
    "scontrol": "slurm-client",
    "sacctmgr": "slurm-client",
    "squeue": "slurm-client",
    "scancel": "slurm-client",
}

# Daemons live in /usr/sbin, which an ordinary user's PATH often lacks.
EXTRA_DIRS = ("/usr/sbin", "/sbin", "/usr/local/sbin")

INSTALL_HINT = (
    "sudo apt-get install -y slurm-wlm slurmctld slurmd slurm-client slurmdbd munge mariadb-server"
)


@dataclass(frozen=True)
class Tools:
    paths: dict[str, str]

    def __getitem__(self, name: str) -> str:
        return self.paths[name]


def search_path(path: str | None = None) -> str:
    base = os.environ.get("PATH", "") if path is None else path
    dirs = [d for d in base.split(os.pathsep) if d]
    if path is None:
        dirs += [d for d in EXTRA_DIRS if d not in dirs]
    return os.pathsep.join(dirs)


def find_tools(path: str | None = None) -> Tools:
    """Locate every required program, or raise one ConfigError listing the missing packages."""
    where = search_path(path)
    found: dict[str, str] = {}
    missing: list[str] = []
    for prog in REQUIRED:
        hit = shutil.which(prog, path=where)
        if hit is None:
            missing.append(prog)
        else:
            found[prog] = hit
    if missing:
        pkgs = sorted({REQUIRED[p] for p in missing})
        raise ConfigError(
            f"the sandbox needs {', '.join(missing)} (Debian packages: {' '.join(pkgs)}); "
            f"install them with: {INSTALL_HINT}"
        )
    return Tools(found)


def check_host_name(name: str | None = None) -> None:
    """This machine's host name must resolve: srun tells slurmctld where to reach it by that name,
    and where it does not resolve (a bare chroot or container), cancelling a job with a running
    step, draining its node or requeueing it times out ("Socket timed out on send/recv
    operation", Slurm 24.11) long after `sandbox up` said all was well."""
    host = name or socket.gethostname()
    try:
        socket.getaddrinfo(host, None)
    except (socket.gaierror, UnicodeError):
        raise ConfigError(
            f"this machine's host name {host!r} does not resolve; Slurm's clients and daemons "
            f"reach each other by it",
            hint=f"add the line '127.0.0.1 {host}' to /etc/hosts") from None


def slurm_prefix(program: str) -> Path:
    """`/opt/slurm-25.11/sbin/slurmctld` -> `/opt/slurm-25.11`; `/usr/bin/sinfo` -> `/usr`."""
    return Path(program).resolve().parent.parent


def check_one_slurm(tools: Tools, daemons: tuple[int, int, int],
                    env: Mapping[str, str] | None = None) -> None:
    """The clients must be the daemons' release: with only `<prefix>/sbin` on PATH, `sinfo` and
    `sacctmgr` would come from the system's (older) Slurm, whose RPCs the daemons refuse.
    `env` must name a readable slurm.conf (SLURM_CONF): clients fail -V without one."""
    clients = slurm_version(tools["sinfo"], env)
    if clients[:2] != daemons[:2]:
        raise ConfigError(
            f"the sandbox found Slurm {release_string(daemons)} daemons ({tools['slurmd']}) "
            f"but Slurm {release_string(clients)} clients ({tools['sinfo']})",
            hint=f"put both sbin and bin of one Slurm first on PATH, e.g. PATH="
                 f"{slurm_prefix(tools['slurmd'])}/sbin:{slurm_prefix(tools['slurmd'])}/bin:$PATH")


_VERSION = re.compile(r"(\d+)\.(\d+)(?:\.(\d+))?")


def parse_slurm_version(text: str) -> tuple[int, int, int]:
    """`slurm-wlm 22.05.8` (Debian) or `slurm 24.11.5` -> (22, 5, 8)."""
    m = _VERSION.search(text)
    if m is None:
        raise ConfigError(f"cannot read the Slurm version from `slurmd -V` output {text.strip()!r}")
    return int(m.group(1)), int(m.group(2)), int(m.group(3) or 0)


def slurm_version(slurmd: str | Path, env: Mapping[str, str] | None = None
                  ) -> tuple[int, int, int]:
    """`PROGRAM -V`. The clients (sinfo, …) read slurm.conf even for -V: give them SLURM_CONF."""
    try:
        out = subprocess.run([str(slurmd), "-V"], capture_output=True, text=True, timeout=10,
                             check=False, env=None if env is None else dict(env))
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ConfigError(f"cannot run `{slurmd} -V`: {exc}", hint=INSTALL_HINT) from None
    return parse_slurm_version(out.stdout or out.stderr)


def version_string(v: tuple[int, int, int]) -> str:
    """The `MM.mm` form the site model and the topology generator use."""
    return f"{v[0]:02d}.{v[1]:02d}"


def release_string(v: tuple[int, int, int]) -> str:
    """(22, 5, 8) -> "22.05.8", as Slurm prints it."""
    return f"{v[0]}.{v[1]:02d}.{v[2]}"
