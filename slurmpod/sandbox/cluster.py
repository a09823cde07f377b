"""Bring a sandbox up, report on it and take it down: the `Sandbox` API behind `slurmpod sandbox`.

Order of start: munged -> MariaDB -> slurmdbd (+ cluster registered) -> slurmctld -> one
`slurmd -D -N <node>` per site node, then wait until every node is idle. What was started is
recorded in `<state>/sandbox.json` after each daemon, so `down` (and a later `up` on a stale
directory) find exactly those processes and no others.
"""

from __future__ import annotations

import contextlib
import fcntl
import getpass
import json
import os
import random
import re
import secrets
import shutil
import signal
import stat
import subprocess
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from slurmpod.errors import CommandError, ConfigError, SlurmError
from slurmpod.fsutil import write_atomic, write_tree_atomic
from slurmpod.sandbox import procs
from slurmpod.sandbox.layout import Layout, Ports
from slurmpod.sandbox.prereqs import (
    Tools,
    check_host_name,
    check_one_slurm,
    find_tools,
    release_string,
    search_path,
    slurm_prefix,
    slurm_version,
)

STATE_FORMAT = 1
# Ports below the kernel's ephemeral range (32768+), so outgoing connections never take them.
PORT_RANGE = (10000, 32000)
CLIENT_TIMEOUT_S = 30.0


class SandboxError(SlurmError):
    """A sandbox daemon failed, a port is taken, or the nodes never became idle."""


Progress = Callable[[str], None]


@dataclass(frozen=True)
class UpResult:
    already_running: bool
    recovered: bool
    elapsed_s: float
    nodes: int


@dataclass(frozen=True)
class ProcStatus:
    name: str
    pid: int
    alive: bool


@dataclass(frozen=True)
class SandboxStatus:
    state_dir: str
    state: str  # running | degraded | stopped | absent
    slurm_conf: str
    site: str
    ports: dict[str, int]
    processes: list[ProcStatus] = field(default_factory=list)
    nodes: dict[str, int] = field(default_factory=dict)  # Slurm node state -> count

    def to_dict(self) -> dict[str, Any]:
        return {
            "state_dir": self.state_dir, "state": self.state, "slurm_conf": self.slurm_conf,
            "site": self.site, "ports": self.ports,
            "processes": [p.__dict__ for p in self.processes], "nodes": self.nodes,
        }


def default_state_dir() -> Path:
    return Path(os.environ.get("SLURMPOD_SANDBOX") or ".sandbox")


_UNSAFE_PATH = re.compile(r"[\s\[\],=#\"'\\$`]")


def check_state_path(path: Path) -> None:
    """slurm.conf and gres.conf cannot quote a path: refuse characters they would split on."""
    bad = sorted(set(_UNSAFE_PATH.findall(str(path))))
    if bad:
        raise ConfigError(
            f"--state {str(path)!r}: Slurm's configuration files cannot hold a path with "
            f"{' '.join(repr(c) for c in bad)}; choose a state directory without them")


def _user() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return str(os.getuid())


class Sandbox:
    """A real Slurm under `state_dir`, built from the site file `site_path`.

    `up()`, `down()`, `status()`, `env()`; paths: `slurm_conf`, `spool_dir`, `log_dir`.
    """

    def __init__(self, state_dir: Path | str, site_path: Path | str | None = None, *,
                 base_port: int | None = None, accounting: bool = True,
                 progress: Progress | None = None, idle_timeout_s: float = 90.0) -> None:
        from slurmpod.config import builtin_site_path, resolve_site_path  # lazy: start-up

        self.layout = Layout(Path(state_dir).absolute())
        self._site_given = site_path is not None
        # The default is the built-in sandbox site, never $SLURMPOD_SITE (which `sandbox env`
        # points at a running sandbox's measured copy).
        self.site_path = (resolve_site_path(str(site_path)) if site_path is not None
                          else builtin_site_path("sandbox"))
        self.base_port = base_port
        self.accounting = accounting
        self.progress: Progress = progress or (lambda _msg: None)
        self.idle_timeout_s = idle_timeout_s
        self._launcher: procs.Launcher | None = None
        self._records: list[procs.ProcRecord] = []

    # -- paths and environment -------------------------------------------------------------
    @property
    def state_dir(self) -> Path:
        return self.layout.root

    @property
    def slurm_conf(self) -> Path:
        return self.layout.slurm_conf

    @property
    def spool_dir(self) -> Path:
        return self.layout.spool

    @property
    def log_dir(self) -> Path:
        return self.layout.log

    def env(self) -> dict[str, str]:
        """What a client needs to talk to this sandbox (add it to os.environ)."""
        env = {"SLURM_CONF": str(self.slurm_conf), "SLURMPOD_SANDBOX": str(self.state_dir)}
        if self.layout.site_file.is_file():
            env["SLURMPOD_SITE"] = str(self.layout.site_file)
        return env

    def client_env(self) -> dict[str, str]:
        """os.environ without inherited job variables, plus `env()` and the sbin directories."""
        base = {k: v for k, v in os.environ.items()
                if not k.startswith(("SLURM_", "SBATCH_", "SALLOC_", "SRUN_", "SQUEUE_"))}
        base["PATH"] = search_path()
        base.update(self.env())
        return base

    def run(self, argv: Sequence[str], timeout_s: float = CLIENT_TIMEOUT_S, check: bool = True
            ) -> subprocess.CompletedProcess[str]:
        """Run a Slurm client command against this sandbox, always under a timeout."""
        try:
            cp = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout_s,
                                env=self.client_env(), check=False, stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired:
            raise SandboxError(
                f"`{' '.join(argv)}` did not finish within {timeout_s:g} s") from None
        except FileNotFoundError:
            raise ConfigError(f"`{argv[0]}` not found; install slurm-client") from None
        if check and cp.returncode != 0:

            raise CommandError(list(argv), cp.returncode, cp.stderr or cp.stdout)
        return cp

    # -- state file --------------------------------------------------------------------------
    def _read_state(self) -> dict[str, Any] | None:
        try:
            data = json.loads(self.layout.state_file.read_text())
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as exc:
            raise ConfigError(f"unreadable sandbox state: {exc}; remove it to start afresh",
                              file=str(self.layout.state_file)) from None
        return data if isinstance(data, dict) else None

    def _records_from(self, state: dict[str, Any] | None) -> list[procs.ProcRecord]:
        if not state:
            return []
        try:
            return [procs.ProcRecord.from_dict(d) for d in state.get("processes", [])]
        except (KeyError, TypeError, ValueError):
            raise ConfigError("malformed process list; remove the file to start afresh",
                              file=str(self.layout.state_file), key="processes") from None

    def _write_state(self, ports: Ports, version: tuple[int, int, int]) -> None:
        doc = {
            "format": STATE_FORMAT, "site": str(self.site_path.absolute()), "user": _user(),
            "slurm_version": release_string(version), "accounting": self.accounting,
            "ports": ports.to_dict(), "processes": [r.to_dict() for r in self._records],
        }
        write_atomic(self.layout.state_file, json.dumps(doc, indent=2) + "\n")

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        """One `up`/`down` at a time per state directory."""
        self.layout.root.mkdir(parents=True, exist_ok=True)
        with open(self.layout.lock_file, "a") as fh:
            try:
                fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise SandboxError(f"another slurmpod is starting or stopping {self.state_dir}; "
                                   "wait for it to finish") from None
            try:
                yield
            finally:
                fcntl.flock(fh, fcntl.LOCK_UN)

    # -- status ------------------------------------------------------------------------------
    def status(self) -> SandboxStatus:
        state = self._read_state()
        recs = self._records_from(state)
        plist = [ProcStatus(r.name, r.pid, procs.is_ours(r)) for r in recs]
        n_alive = sum(p.alive for p in plist)
        if state is None:
            word = "absent"
        elif plist and n_alive == len(plist):
            word = "running"
        elif n_alive:
            word = "degraded"
        else:
            word = "stopped"
        nodes: dict[str, int] = {}
        if word in ("running", "degraded") and any(p.alive and p.name == "slurmctld"
                                                   for p in plist):
            with contextlib.suppress(SlurmError, ConfigError):
                nodes = self._node_states()
        return SandboxStatus(str(self.state_dir), word, str(self.slurm_conf),
                             str((state or {}).get("site", self.site_path)),
                             dict((state or {}).get("ports", {})), plist, nodes)

    def _node_states(self) -> dict[str, int]:
        cp = self.run(["sinfo", "-h", "-N", "-o", "%N|%T"], timeout_s=10)
        # `sinfo -N` lists a node once per partition it is in: count each node once.
        state_of = dict(line.split("|", 1) for line in cp.stdout.splitlines() if "|" in line)
        counts: dict[str, int] = {}
        for st in state_of.values():
            if st:
                counts[st] = counts.get(st, 0) + 1
        return counts

    # -- up ----------------------------------------------------------------------------------
    def up(self) -> UpResult:
        t0 = time.monotonic()
        check_state_path(self.state_dir)
        tools = find_tools()
        check_host_name()
        version = slurm_version(tools["slurmd"])
        with self._locked():
            state = self._read_state()
            old = self._records_from(state)
            live = [r for r in old if procs.is_ours(r)]
            if old and len(live) == len(old):
                running_site = str((state or {}).get("site", ""))
                if self._site_given and running_site != str(self.site_path.absolute()):
                    raise SandboxError(
                        f"{self.state_dir} already runs site {running_site}",
                        hint=f"stop it first (slurmpod sandbox down --state {self.state_dir}) "
                             f"to start {self.site_path}")
                self._records = old
                return UpResult(True, False, time.monotonic() - t0,
                                sum(r.name.startswith("slurmd:") for r in old))
            recovered = state is not None and bool(old)
            if live:
                self.progress(f"stale sandbox: {len(old) - len(live)} of {len(old)} daemons gone;"
                              " stopping the rest and restarting")
                procs.stop(live, children=self._children())
            elif recovered:
                self.progress("stale sandbox: no daemon left running; restarting")
            n = self._start(tools, version, state, t0)
            return UpResult(False, recovered, time.monotonic() - t0, n)

    def _start(self, tools: Tools, version: tuple[int, int, int],
               state: dict[str, Any] | None, t0: float) -> int:
        from slurmpod.config import load_site  # lazy: start-up

        # lazy: start-up
        # lazy: start-up
        from slurmpod.sandbox.configs import (
            SHIMS,
            SandboxSettings,
            generated_artefacts,
            render_files,
        )
        from slurmpod.sandbox.measured_site import write_measured_site  # lazy: start-up

        site = load_site(self.site_path)
        nodes = [n.name for n in site.inventory.nodes]
        ports = self._choose_ports(len(nodes), state)
        peak = write_measured_site(self.site_path, self.layout.site_file)
        if peak is not None:
            self.progress(f"emulated GPU peak: {peak * 1e3:.2f} GFLOP/s measured on this CPU "
                          f"({self.layout.site_file})")
        # The hooks get the measured site, so their MFU uses the same peak as submit and plan.
        hook_site = self.layout.site_file if peak is not None else self.site_path.absolute()
        settings = SandboxSettings(self.layout, ports, _user(), version, hook_site,
                                    self.accounting,
                                    slurm_bin=str(Path(tools["scontrol"]).parent))
        files = render_files(site, settings, generated_artefacts(site, settings))
        self._rotate_logs()
        self._prepare_dirs(nodes)
        write_tree_atomic(self.layout.root, files)
        self.layout.epilog_slurmctld.chmod(0o755)
        self.layout.task_prolog.chmod(0o755)
        for tool in SHIMS:
            (self.layout.bin / tool).chmod(0o755)
        # slurmdbd refuses a slurmdbd.conf readable by others (it may hold StoragePass).
        self.layout.slurmdbd_conf.chmod(0o600)

        env = self.client_env()
        check_one_slurm(tools, version, env)  # needs the slurm.conf just written
        self._launcher = procs.Launcher(env, self.layout.root)
        self._records = []
        accounts: Future[None] | None = None
        pool = ThreadPoolExecutor(max_workers=1)
        try:
            self._start_munge(tools, ports, version)
            if self.accounting:
                self._start_accounting(tools, ports, version, site.slurm.cluster_name)
                # sacctmgr talks to slurmdbd only: register the account while Slurm starts.
                accounts = pool.submit(self._add_accounts, site.slurm.cluster_name)
            self._start_slurm(tools, ports, version, nodes)
            self._wait_idle(nodes, t0)
            if accounts is not None:
                accounts.result()
        except BaseException:
            if accounts is not None:
                with contextlib.suppress(BaseException):
                    accounts.result()
            self.progress("start-up failed; stopping what was started")
            procs.stop(self._records, timeout_s=10, children=self._children())
            self._records = []
            self._write_state(ports, version)
            raise
        finally:
            pool.shutdown(wait=True)
        self._write_state(ports, version)
        return len(nodes)

    def _choose_ports(self, n_nodes: int, state: dict[str, Any] | None) -> Ports:
        if self.base_port is not None:
            ports = Ports.from_base(self.base_port, n_nodes)
            if ports.block.stop > 65536 or self.base_port < 1:
                raise ConfigError(f"--base-port {self.base_port}: needs {n_nodes + 3} ports "
                                  "below 65536; choose a smaller base port")
            # Name every taken port, not just the first: the user frees them all in one go.
            taken = [(what, port) for what, port in ports.named() if procs.port_in_use(port)]
            if taken:
                listed = "; ".join(f"port {port} on 127.0.0.1 ({what}) is in use"
                                   for what, port in taken)
                raise SandboxError(
                    f"{listed} by another program",
                    hint=f"free {'it' if len(taken) == 1 else 'them'}, or choose another "
                         f"--base-port (the sandbox needs {ports.block.start}-"
                         f"{ports.block.stop - 1})")
            return ports
        # Reuse the last ports when free (a warm restart keeps the same addresses).
        prev = (state or {}).get("ports", {}).get("slurmd_base")
        candidates = [int(prev)] if isinstance(prev, int) else []
        rng = random.Random()
        candidates += [rng.randrange(PORT_RANGE[0], PORT_RANGE[1] - n_nodes - 3)
                       for _ in range(64)]
        for base in candidates:
            ports = Ports.from_base(base, n_nodes)
            if not any(procs.port_in_use(p) for p in ports.block):
                return ports
        raise SandboxError(f"found no {n_nodes + 3} consecutive free ports on 127.0.0.1 in "
                           f"{PORT_RANGE[0]}-{PORT_RANGE[1]}", hint="pass --base-port")

    def _rotate_logs(self) -> None:
        """Keep the previous run's logs in log.1, so errors quote only this run's lines."""
        lay = self.layout
        if lay.log.is_dir() and any(lay.log.iterdir()):
            prev = lay.root / "log.1"
            shutil.rmtree(prev, ignore_errors=True)
            lay.log.rename(prev)

    def _prepare_dirs(self, nodes: Sequence[str]) -> None:
        lay = self.layout
        # munged 0.5.15 insists that the socket directory be 0755 and the key directory 0700,
        # and checks the directories above them: keep the state directory itself 0755.
        lay.root.chmod(0o755)
        for d in (lay.etc, lay.log, lay.run, lay.dev, lay.state_save, lay.slurmd_spool,
                  lay.hooks, lay.spool, lay.munge_run, lay.root / "db", lay.bin):
            d.mkdir(parents=True, exist_ok=True)
        # The emulated GPUs' counters of the previous run's jobs mean nothing to this one.
        shutil.rmtree(lay.gpu_state, ignore_errors=True)
        lay.gpu_state.mkdir()
        lay.munge_run.chmod(0o755)
        for name in nodes:
            (lay.slurmd_spool / name).mkdir(exist_ok=True)
        lay.munge_key_dir.mkdir(parents=True, exist_ok=True)
        lay.munge_key_dir.chmod(0o700)
        if not lay.munge_key.exists():
            write_atomic(lay.munge_key, secrets.token_hex(512), mode=0o400)
        self._make_fake_gpus(8)
        # A stale socket or pid file from a killed run would make munged refuse to start.
        for stale in (lay.munge_socket, Path(f"{lay.munge_socket}.lock")):
            stale.unlink(missing_ok=True)

    def _make_fake_gpus(self, count: int) -> None:
        """gres.conf needs File= paths (Slurm 22.05 drops file-less GPUs). Character devices
        195:N when we may create them, plain files otherwise (slurmd then only logs a warning)."""
        for i in range(count):
            path = self.layout.dev / f"nvidia{i}"
            if path.exists() or path.is_symlink():
                continue
            try:
                os.mknod(path, 0o644 | stat.S_IFCHR, os.makedev(195, i))
            except (PermissionError, OSError):
                path.touch(mode=0o644)

    def _children(self) -> dict[int, subprocess.Popen[bytes]]:
        return self._launcher.children if self._launcher is not None else {}

    def _launch(self, name: str, argv: Sequence[str], log: Path | None = None
                ) -> procs.ProcRecord:
        assert self._launcher is not None
        out = self.layout.log / f"{name.replace(':', '-')}.out"
        rec = self._launcher.start(name, argv, out, log)
        self._records.append(rec)
        return rec

    def _wait(self, what: str, ready: Callable[[], bool], watch: Sequence[procs.ProcRecord],
              timeout_s: float = 30.0) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            if ready():
                return
            for rec in watch:
                self._check_alive(rec)
            if time.monotonic() > deadline:
                rec = watch[0]
                raise SandboxError(f"{what} not ready after {timeout_s:g} s; last lines of "
                                   f"{rec.log}:\n{procs.tail(rec.log)}")
            time.sleep(0.05)

    def _check_alive(self, rec: procs.ProcRecord) -> None:
        assert self._launcher is not None
        if self._launcher.running(rec):
            return
        code = self._launcher.exit_code(rec)
        # Slurm's daemons under -D write their log file and stderr alike; quote one of them.
        path = rec.log if procs.tail(rec.log) else rec.out
        text = procs.tail(path)
        raise SandboxError(f"{rec.name} exited during start-up (exit code {code}); "
                           + (f"last lines of {path}:\n{text}" if text
                              else f"its log {rec.log} is empty"))

    def _timed(self, what: str, t: float) -> None:
        self.progress(f"  {what} ({time.monotonic() - t:.2f} s)")

    def _start_munge(self, tools: Tools, ports: Ports, version: tuple[int, int, int]) -> None:
        lay = self.layout
        t = time.monotonic()
        rec = self._launch("munged", [
            # --force: munged 0.5.15 refuses a socket below a 0700 directory (a home directory,
            # /root); the sandbox's clients all run as the owner, who can reach it.
            tools["munged"], "--foreground", "--force", f"--socket={lay.munge_socket}",
            f"--key-file={lay.munge_key}", f"--pid-file={lay.pidfile('munged')}",
            f"--log-file={lay.logfile('munged')}", f"--seed-file={lay.munge_seed}",
        ])
        self._write_state(ports, version)
        self._wait("munged", lambda: procs.unix_can_connect(lay.munge_socket), [rec])
        self._timed("munged up", t)

    def _start_accounting(self, tools: Tools, ports: Ports, version: tuple[int, int, int],
                          cluster: str) -> None:
        lay = self.layout
        t = time.monotonic()
        as_root = ["--user=root"] if os.geteuid() == 0 else []
        marker = lay.root / "db" / "installed"
        if not marker.exists():
            shutil.rmtree(lay.db_data, ignore_errors=True)
            cp = subprocess.run(
                [tools["mariadb-install-db"], "--no-defaults", f"--datadir={lay.db_data}",
                 "--auth-root-authentication-method=normal", "--skip-test-db", *as_root],
                capture_output=True, text=True, timeout=120, env=self.client_env(), check=False)
            if cp.returncode != 0:
                raise SandboxError(f"mariadb-install-db exited {cp.returncode}; last lines:\n"
                                   + "\n".join((cp.stdout + cp.stderr).splitlines()[-15:]))
            marker.touch()
            self._timed("MariaDB data directory created", t)
        t = time.monotonic()
        db = self._launch("mariadbd", [
            tools["mariadbd"], "--no-defaults", *as_root, f"--datadir={lay.db_data}",
            f"--socket={lay.db_socket}", f"--port={ports.mariadb}", "--bind-address=127.0.0.1",
            f"--pid-file={lay.pidfile('mariadbd')}", f"--log-error={lay.logfile('mariadbd')}",
            "--skip-name-resolve", "--innodb-buffer-pool-size=64M", f"--init-file={lay.db_init}",
        ], lay.logfile("mariadbd"))
        self._write_state(ports, version)
        self._wait("MariaDB", lambda: procs.can_connect(ports.mariadb), [db])
        self._timed(f"MariaDB up on 127.0.0.1:{ports.mariadb}", t)
        t = time.monotonic()
        dbd = self._launch("slurmdbd", [tools["slurmdbd"], "-D"], lay.logfile("slurmdbd"))
        self._write_state(ports, version)
        self._wait("slurmdbd", lambda: procs.can_connect(ports.slurmdbd), [dbd, db])
        self._timed(f"slurmdbd up on 127.0.0.1:{ports.slurmdbd}", t)
        # The cluster must exist in the database before slurmctld registers with slurmdbd.
        self._sacctmgr_add(["cluster", cluster])

    def _sacctmgr_add(self, args: list[str]) -> None:
        cp = self.run(["sacctmgr", "-i", "add", *args], check=False)
        text = (cp.stdout + cp.stderr).strip()
        # A warm restart finds everything registered already: sacctmgr then says so and exits 1
        # ("… already exists" / "Nothing new added" in 22.05; 25.11 says "Already existing
        # account ml on cluster sandbox", and "Nothing added." for a known user).
        known = ("already exists", "already existing", "nothing new", "nothing added")
        if cp.returncode != 0 and not any(k in text.lower() for k in known):
            raise SandboxError(f"`sacctmgr add {' '.join(args)}` exited {cp.returncode}: "
                               f"{text.splitlines()[-1] if text else 'no output'}")

    def _add_accounts(self, cluster: str) -> None:
        t = time.monotonic()
        self._sacctmgr_add(["account", "ml", f"Cluster={cluster}",
                            "Description=sandbox users", "Organization=slurmpod"])
        users = sorted({"root", _user()})
        self._sacctmgr_add(["user", ",".join(users), "Account=ml", f"Cluster={cluster}"])
        self._timed(f"account ml with user(s) {', '.join(users)}", t)

    def _start_slurm(self, tools: Tools, ports: Ports, version: tuple[int, int, int],
                     nodes: Sequence[str]) -> None:
        lay = self.layout
        conf = str(lay.slurm_conf)
        t = time.monotonic()
        ctld = self._launch("slurmctld", [tools["slurmctld"], "-D", "-i", "-f", conf],
                            lay.logfile("slurmctld"))
        # slurmd start-up (plugin loading) overlaps slurmctld's; slurmd retries registering.
        for name in nodes:
            self._launch(f"slurmd:{name}", [tools["slurmd"], "-D", "-f", conf, "-N", name],
                         lay.log / f"slurmd-{name}.log")
        self._write_state(ports, version)
        self.progress(f"  started {len(nodes)} slurmd (ports {ports.slurmd_base}-"
                      f"{ports.slurmd_base + len(nodes) - 1})")
        self._wait("slurmctld", lambda: procs.can_connect(ports.slurmctld), [ctld])
        self._timed(f"slurmctld up on 127.0.0.1:{ports.slurmctld}", t)
        self._check_multiple_slurmd(tools)

    def _check_multiple_slurmd(self, tools: Tools) -> None:
        """Many slurmd on one host need a Slurm built with --enable-multiple-slurmd (Debian's
        is). Without it the nodes still register and turn idle, but slurmctld cannot tell their
        addresses apart and every job ends in NODE_FAIL (seen with a default 25.11.7 build)."""
        cp = self.run([tools["scontrol"], "show", "config"], timeout_s=10, check=False)
        if cp.returncode == 0 and "MULTIPLE_SLURMD" not in cp.stdout:
            raise SandboxError(
                f"the Slurm in {slurm_prefix(tools['slurmctld'])} was built without "
                "multiple-slurmd support, which the sandbox's one slurmd per node needs",
                hint="rebuild it with ./configure --enable-multiple-slurmd (docs/sandbox.md)")

    def _wait_idle(self, nodes: Sequence[str], t0: float) -> None:
        t = time.monotonic()
        deadline = t + self.idle_timeout_s
        states: dict[str, str] = {}
        while time.monotonic() < deadline:
            for rec in self._records:
                self._check_alive(rec)
            cp = self.run(["sinfo", "-h", "-N", "-o", "%N|%T"], timeout_s=10, check=False)
            if cp.returncode == 0:
                states = dict(line.split("|", 1) for line in cp.stdout.splitlines()
                              if "|" in line)
                if all(states.get(n) == "idle" for n in nodes):
                    self.progress(f"all {len(nodes)} nodes idle "
                                  f"({time.monotonic() - t0:.2f} s from start)")
                    return
            time.sleep(0.2)
        bad = {n: states.get(n, "missing") for n in nodes if states.get(n) != "idle"}
        reasons = self.run(["sinfo", "-h", "-R", "-o", "%N: %E"], timeout_s=10, check=False)
        shown = ", ".join(f"{n}={s}" for n, s in list(bad.items())[:8])
        raise SandboxError(
            f"{len(bad)} of {len(nodes)} nodes not idle after {self.idle_timeout_s:g} s ({shown});"
            f" reasons: {reasons.stdout.strip() or 'none given'}; see {self.layout.log}/")

    # -- one node's slurmd (fault injection) --------------------------------------------------
    def kill_slurmd(self, node: str) -> bool:
        """SIGKILL one node's slurmd, as a crash would: its jobs' slurmstepd and tasks live on,
        and slurmctld marks the node NOT_RESPONDING, then DOWN after `SlurmdTimeout`. False when
        that slurmd is not running (or its PID is no longer ours)."""
        with self._locked():
            rec = self._slurmd_record(node)
            if rec is None or not procs.is_ours(rec):
                return False
            with contextlib.suppress(ProcessLookupError):
                os.kill(rec.pid, signal.SIGKILL)
            procs.stop([rec], timeout_s=5, children=self._children())  # reaps it
            return True

    def start_slurmd(self, node: str) -> bool:
        """Start a node's slurmd again with the command line it was started with, recorded in
        the state file so that `down` stops it; False when it is already running. slurmd
        re-attaches to the slurmstepds it finds in its spool directory and registers, and
        with ReturnToService=2 a node DOWN for not responding comes back."""
        with self._locked():
            state = self._read_state()
            rec = self._slurmd_record(node, state)
            if rec is None:
                raise SandboxError(f"no slurmd of node {node} recorded in {self.state_dir}")
            if procs.is_ours(rec):
                return False
            if self._launcher is None:
                self._launcher = procs.Launcher(self.client_env(), self.layout.root)
            out = self.layout.log / f"{rec.name.replace(':', '-')}.out"
            new = self._launcher.start(rec.name, rec.argv, out, Path(rec.log) if rec.log else None)
            assert state is not None
            state["processes"] = [new.to_dict() if d.get("name") == rec.name else d
                                  for d in state.get("processes", [])]
            self._records = [new if r.name == rec.name else r for r in self._records] \
                if self._records else self._records_from(state)
            write_atomic(self.layout.state_file, json.dumps(state, indent=2) + "\n")
            return True

    def _slurmd_record(self, node: str, state: dict[str, Any] | None = None
                       ) -> procs.ProcRecord | None:
        recs = self._records_from(state if state is not None else self._read_state())
        return next((r for r in recs if r.name == f"slurmd:{node}"), None)

    # -- down --------------------------------------------------------------------------------
    def down(self) -> list[str]:
        """Stop every process this sandbox started (only those: PID, argv and start time must
        match the record). Returns the names stopped."""
        with self._locked():
            state = self._read_state()
            recs = self._records_from(state)
            live = [r for r in recs if procs.is_ours(r)]
            if any(r.name == "slurmctld" for r in live):
                self._cancel_jobs()
            order = (
                [r for r in live if r.name.startswith("slurmd:") or r.name == "slurmctld"],
                [r for r in live if r.name == "slurmdbd"],
                [r for r in live if r.name in ("mariadbd", "munged")],
            )
            for group in order:
                procs.stop(group, children=self._children())
            if state is not None:
                state["processes"] = []
                write_atomic(self.layout.state_file, json.dumps(state, indent=2) + "\n")
            return [r.name for r in live]

    def _cancel_jobs(self) -> None:
        """Jobs' slurmstepd processes outlive slurmd: end the jobs first."""
        cp = self.run(["squeue", "-h", "-o", "%i"], timeout_s=10, check=False)
        if cp.returncode != 0 or not cp.stdout.strip():
            return
        self.run(["scancel", "--full", *cp.stdout.split()], timeout_s=10, check=False)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            cp = self.run(["squeue", "-h", "-t", "running,completing", "-o", "%i"],
                          timeout_s=10, check=False)
            if cp.returncode != 0 or not cp.stdout.strip():
                return
            time.sleep(0.2)
