"""Where every file of a sandbox lives under its state directory, and which ports it uses.

Pure: paths are computed, never created here (cluster.py creates them).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path


@dataclass(frozen=True)
class Ports:
    """TCP ports on 127.0.0.1. Node `i` (0-based) of the site listens on `slurmd_base + i`."""

    slurmd_base: int
    n_nodes: int
    slurmctld: int
    slurmdbd: int
    mariadb: int

    @classmethod
    def from_base(cls, base: int, n_nodes: int) -> Ports:
        """One contiguous block: the slurmd range first, then slurmctld, slurmdbd, MariaDB."""
        return cls(base, n_nodes, base + n_nodes, base + n_nodes + 1, base + n_nodes + 2)

    @property
    def block(self) -> range:
        return range(self.slurmd_base, self.slurmd_base + self.n_nodes + 3)

    def named(self) -> list[tuple[str, int]]:
        """Every port with what uses it, for error messages."""
        out = [(f"slurmd #{i + 1}", self.slurmd_base + i) for i in range(self.n_nodes)]
        return [*out, ("slurmctld", self.slurmctld), ("slurmdbd", self.slurmdbd),
                ("mariadb", self.mariadb)]

    def to_dict(self) -> dict[str, int]:
        return asdict(self)


@dataclass(frozen=True)
class Layout:
    root: Path

    # Configuration read by the daemons and the clients (SLURM_CONF points here).
    @property
    def etc(self) -> Path:
        return self.root / "etc"

    @property
    def slurm_conf(self) -> Path:
        return self.etc / "slurm.conf"

    @property
    def slurmdbd_conf(self) -> Path:
        return self.etc / "slurmdbd.conf"

    @property
    def site_file(self) -> Path:
        """The site with its emulated GPUs' peak measured on this CPU (see measured_site.py)."""
        return self.root / "site.toml"

    @property
    def state_file(self) -> Path:
        """What `up` started (PIDs, argv, start times), the ports and the site."""
        return self.root / "sandbox.json"

    @property
    def lock_file(self) -> Path:
        return self.root / ".lock"

    @property
    def log(self) -> Path:
        return self.root / "log"

    @property
    def run(self) -> Path:
        return self.root / "run"

    @property
    def dev(self) -> Path:
        """Fake GPU device files (gres.conf needs File= paths, see docs/sandbox.md)."""
        return self.root / "dev"

    @property
    def gres_file_prefix(self) -> str:
        return str(self.dev / "nvidia")

    # munge: the key directory must not be group/other writable and the socket directory must
    # be 0755, or munged 0.5.15 refuses to start.
    @property
    def munge_key_dir(self) -> Path:
        return self.root / "munge" / "key"

    @property
    def munge_key(self) -> Path:
        return self.munge_key_dir / "munge.key"

    @property
    def munge_run(self) -> Path:
        return self.root / "munge" / "run"

    @property
    def munge_socket(self) -> Path:
        return self.munge_run / "munge.sock"

    @property
    def munge_seed(self) -> Path:
        return self.root / "munge" / "seed"

    @property
    def db_data(self) -> Path:
        return self.root / "db" / "data"

    @property
    def db_init(self) -> Path:
        """SQL MariaDB runs at each start (`--init-file`): creates slurmdbd's database."""
        return self.etc / "mariadb-init.sql"

    @property
    def db_socket(self) -> Path:
        return self.run / "mariadb.sock"

    @property
    def state_save(self) -> Path:
        """slurmctld StateSaveLocation."""
        return self.root / "slurm" / "ctld"

    @property
    def slurmd_spool(self) -> Path:
        """Parent of the per-node SlurmdSpoolDir (`%n`)."""
        return self.root / "slurm" / "d"

    @property
    def hooks(self) -> Path:
        return self.root / "hooks"

    @property
    def epilog_slurmctld(self) -> Path:
        return self.hooks / "epilog-slurmctld"

    @property
    def task_prolog(self) -> Path:
        """TaskProlog: the emulated GPUs' tools on every task's PATH (gpu_shims.py)."""
        return self.hooks / "task-prolog"

    @property
    def bin(self) -> Path:
        """The sandbox's `dcgmi` and `nvidia-smi` shims (never installed on a real cluster)."""
        return self.root / "bin"

    @property
    def gpu_state(self) -> Path:
        """What the emulator's ranks did, per job (sandbox/workload/gpu_activity.py)."""
        return self.root / "gpu"

    @property
    def spool(self) -> Path:
        """slurmpod's own spool: what the accounting hooks write for reports."""
        return self.root / "spool"

    def logfile(self, daemon: str) -> Path:
        return self.log / f"{daemon}.log"

    def pidfile(self, daemon: str) -> Path:
        return self.run / f"{daemon}.pid"
