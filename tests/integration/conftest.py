"""Integration tests run against a real Slurm: slurmpod's own sandbox, started once per session.

Every test under tests/integration/ gets the `slurm` marker automatically.

Fixture `sandbox` (session scope) -> `SandboxFixture`, with:

- `sb`: the `slurmpod.sandbox.cluster.Sandbox` (its `state_dir`, `slurm_conf`, `spool_dir`,
  `log_dir`, `status()`); the built-in `sandbox` site, 16 nodes of 8 emulated GPUs in 4 SUs.
- `env`: a full environment dict for subprocesses (os.environ without inherited SLURM_* job
  variables, plus SLURM_CONF and SLURMPOD_SANDBOX; sbin directories on PATH).
- `site`, `inventory`: the site model and its nodes (`inventory.nodes_in_su(i)`, `su_names`).
- `etc(name)`: text of a file Slurm reads (`slurm.conf`, `nodes.conf`, `gres.conf`,
  `topology.conf` or `topology.yaml`, …) as installed in the sandbox.
- `slurm_version`, `generated_topology()`: the sandbox's Slurm release, and the name of the
  topology file installed for it with the generator's output for that release.
- `run(argv, timeout_s=60, check=True)`: run any command with `env`, always under a timeout;
  returns `CompletedProcess[str]`; a non-zero exit fails the test with stderr when `check`.
- `sbatch(*args, timeout_s=30) -> job id`: `sbatch --parsable` with your args (output goes to
  a file in `tmp_dir` unless you pass `-o`).
- `wait_job(job_id, timeout_s=120) -> dict`: waits until the job has finished *and* slurmdbd
  has its complete record (see the method), then returns that job's `sacct --json` entry.
- `wait_running(job_id, timeout_s=60)`: waits until the job runs.
- `nodes_of(job_id) -> list[str]`: the job's expanded node list (from squeue/sacct).
- `release_requeued(job_id)`: a requeued job may start again in 5 s (not Slurm's ~2 minutes).
- `cancel(*job_ids)`: scancel and wait until they are gone from the running set.
- `tmp_dir`: a session scratch directory under /tmp readable by the Slurm daemons.

Rules for tests that share it: leave the cluster idle (cancel what you start), do not change
its configuration, and keep every command under a timeout.

When Slurm, munge or MariaDB are not installed the tests skip locally, but FAIL when `CI` is
set (CI must run them; `bash .ci/install` installs the packages). The one skip CI allows is
`require_matching_pyslurm`: PyPI has no pyslurm for Debian's Slurm 22.05, so the pyslurm backend's
contract skips there (set SLURMPOD_REQUIRE_PYSLURM=1 to make that skip a failure).
`SLURMPOD_KEEP_SANDBOX=1` keeps the state directory (logs) after the session.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from slurmpod.errors import ConfigError, SlurmpodError
from slurmpod.model.hostlist import expand
from slurmpod.model.site import Inventory, Site

TERMINAL = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY",
            "PREEMPTED", "BOOT_FAIL", "DEADLINE"}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if here in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.slurm)


def require_sandbox_tools() -> None:
    """Skip when the system packages are missing, but fail under CI (they must run there)."""
    from slurmpod.sandbox.prereqs import find_tools

    try:
        find_tools()
    except ConfigError as exc:
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail(f"CI must run the real-Slurm tests: {exc.message}", pytrace=False)
        pytest.skip(f"real Slurm not available: {exc.message}")


def require_matching_pyslurm(slurm_version: str) -> str:
    """The installed pyslurm's version when its major.minor is `slurm_version`'s; skip otherwise.

    Explicitly exempt from the CI rule above: a matching pyslurm is optional (Debian 12's Slurm
    22.05 has none on PyPI, which only carries 25.11), unlike Slurm itself. Found through its
    package metadata, without importing it: the import reads slurm.conf (see
    tests/integration/test_backend_contract.py). SLURMPOD_REQUIRE_PYSLURM=1 turns the skip into
    a failure, for a cluster where the pyslurm backend must be checked.
    """
    from importlib.metadata import PackageNotFoundError, version
    from importlib.util import find_spec

    from slurmpod.backends.pyslurm_backend import _major_minor

    try:
        have = version("pyslurm") if find_spec("pyslurm") is not None else None
    except PackageNotFoundError:
        have = None
    why = None
    if have is None:
        why = f"pyslurm is not installed (the sandbox runs Slurm {slurm_version})"
    elif _major_minor(have) != _major_minor(slurm_version):
        why = f"pyslurm {have} does not match the sandbox's Slurm {slurm_version}"
    if why is None:
        return str(have)
    if os.environ.get("SLURMPOD_REQUIRE_PYSLURM", "").lower() in ("1", "true", "yes"):
        pytest.fail(f"SLURMPOD_REQUIRE_PYSLURM is set but {why}", pytrace=False)
    pytest.skip(f"pyslurm backend contract needs a pyslurm built for this Slurm: {why}")


def new_state_dir(prefix: str) -> Path:
    """A fresh directory under /tmp (never the repository): concurrent runs do not clash."""
    return Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))


def sandbox_site_variant(where: Path, name: str, changes: Sequence[tuple[str, str]]) -> Path:
    """The built-in sandbox site with textual `changes` (old, new) and cluster_name `name`,
    written to `where/<name>.toml`. A change whose text is gone from sandbox.toml fails the test
    instead of silently testing the unchanged site."""
    from slurmpod.config import builtin_site_path

    text = builtin_site_path("sandbox").read_text()
    for old, new in (*changes, ('cluster_name = "sandbox"', f'cluster_name = "{name}"')):
        assert old in text, f"sandbox.toml changed: {old!r} not found"
        text = text.replace(old, new)
    path = where / f"{name}.toml"
    path.write_text(text)
    return path


@dataclass
class SandboxFixture:
    sb: Any  # slurmpod.sandbox.cluster.Sandbox
    site: Site
    tmp_dir: Path

    @property
    def inventory(self) -> Inventory:
        return self.site.inventory

    @property
    def env(self) -> dict[str, str]:
        return self.sb.client_env()

    def etc(self, name: str) -> str:
        return (self.sb.slurm_conf.parent / name).read_text()

    @property
    def slurm_version(self) -> str:
        """The release the sandbox runs, as recorded when it started (e.g. "22.05.8")."""
        return str(json.loads(self.sb.layout.state_file.read_text())["slurm_version"])

    def generated_topology(self) -> tuple[str, dict[str, str]]:
        """(installed file name, generator output) for the sandbox's Slurm release.

        The generator writes topology.conf and topology-block.conf for every release; the sandbox
        installs one of them as topology.conf, or topology.yaml (both topologies) on >= 25.05.
        """
        from slurmpod.topology import generate as gen

        opts = gen.GenerateOptions(slurm_version=".".join(self.slurm_version.split(".")[:2]))
        return gen.topology_file_to_install(self.site, opts), gen.generate(self.site, opts)

    def run(self, argv: Sequence[str], timeout_s: float = 60, check: bool = True
            ) -> subprocess.CompletedProcess[str]:
        try:
            cp = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout_s,
                                env=self.env, stdin=subprocess.DEVNULL, check=False,
                                cwd=self.tmp_dir)
        except subprocess.TimeoutExpired:
            pytest.fail(f"`{' '.join(argv)}` did not finish within {timeout_s} s", pytrace=False)
        if check and cp.returncode != 0:
            pytest.fail(f"`{' '.join(argv)}` exited {cp.returncode}: {cp.stderr.strip()}",
                        pytrace=False)
        return cp

    def sbatch(self, *args: str, timeout_s: float = 30) -> str:
        argv = ["sbatch", "--parsable", *args]
        if not any(a in ("-o", "--output") or a.startswith("--output=") for a in args):
            argv.insert(2, f"--output={self.tmp_dir}/slurm-%j.out")
        return self.run(argv, timeout_s=timeout_s).stdout.strip().split(";")[0]

    def squeue_state(self, job_id: str) -> str:
        cp = self.run(["squeue", "-h", "-j", job_id, "-o", "%T"], check=False)
        return cp.stdout.strip()

    def wait_running(self, job_id: str, timeout_s: float = 60) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            state = self.squeue_state(job_id)
            if state == "RUNNING":
                return
            if state in TERMINAL:
                pytest.fail(f"job {job_id} ended ({state}) before it was seen running")
            time.sleep(0.2)
        pytest.fail(f"job {job_id} not running after {timeout_s} s "
                    f"(state {self.squeue_state(job_id)!r})")

    def sacct_job(self, job_id: str) -> dict[str, Any] | None:
        cp = self.run(["sacct", "--json", "-j", job_id], check=False, timeout_s=30)
        if cp.returncode != 0:
            return None
        # A requeued job has one record per attempt; the earlier ones end REQUEUED. The last
        # attempt's record is the job's.
        found = [job for job in json.loads(cp.stdout).get("jobs", [])
                 if str(job.get("job_id")) == job_id]
        final = [job for job in found if _sacct_state(job) != "REQUEUED"]
        # After many requeues slurmdbd can also hold a PENDING record of an attempt that never
        # ran, listed after the one that finished: a finished record is the job's end.
        ended = [job for job in final if _sacct_state(job) in TERMINAL]
        return (ended or final or found)[-1] if found else None

    def wait_job(self, job_id: str, timeout_s: float = 120) -> dict[str, Any]:
        """The job's sacct --json record once it has finished and is complete.

        slurmdbd can store a job's end before its start (Slurm 22.05): for about a second sacct
        then shows a terminal state with name "allocation", no partition and only the first
        node. A complete record has its partition.
        """
        deadline = time.monotonic() + timeout_s
        job: dict[str, Any] | None = None
        while time.monotonic() < deadline:
            job = self.sacct_job(job_id)
            if job is not None and _sacct_state(job) in TERMINAL and job.get("partition"):
                return job
            time.sleep(0.3)
        pytest.fail(f"job {job_id} not finished in accounting after {timeout_s} s "
                    f"(squeue: {self.squeue_state(job_id)!r}, sacct: "
                    f"{_sacct_state(job) if job else 'no record'})")

    def nodes_of(self, job_id: str) -> list[str]:
        cp = self.run(["squeue", "-h", "-j", job_id, "-o", "%N"], check=False)
        text = cp.stdout.strip()
        if not text:
            # Gone from squeue: finished. Only a complete sacct record lists every node.
            job = self.wait_job(job_id)
            text = str(job.get("nodes", ""))
        return expand(text) if text and text != "None assigned" else []

    def release_requeued(self, job_id: str) -> None:
        """Let a requeued batch job start again in a few seconds instead of Slurm's ~2 minutes.

        Not `StartTime=now`: slurmd refuses a launch credential not newer than the time it
        recorded for revoking the job's previous one (cred_context.c, whole seconds); on 24.11
        the job then ends with exit 1 ("Killing non-startable batch JobId=…: Job credential
        revoked").
        """
        self.run(["scontrol", "update", f"JobId={job_id}", "StartTime=now+5"])

    def cancel(self, *job_ids: str) -> None:
        if not job_ids:
            return
        self.run(["scancel", *job_ids], check=False)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            cp = self.run(["squeue", "-h", "-o", "%i", "-j", ",".join(job_ids)], check=False)
            if not cp.stdout.strip():
                return
            time.sleep(0.2)


def _sacct_state(job: dict[str, Any]) -> str:
    state = job.get("state", {})
    # 22.05 (dbv0.0.38): {"current": "COMPLETED"}; 24.11: {"current": ["COMPLETED"]}.
    cur = state.get("current") if isinstance(state, dict) else state
    if isinstance(cur, list):
        cur = cur[0] if cur else ""
    return str(cur)


def start_sandbox(state_dir: Path, site: Path | str | None = None, **kw: Any) -> Any:
    """Bring a sandbox up for a test; on failure, fail with the error and its hint."""
    from slurmpod.sandbox.cluster import Sandbox

    sb = Sandbox(state_dir, site, **kw)
    try:
        sb.up()
    except SlurmpodError as exc:
        with contextlib.suppress(Exception):
            sb.down()
        pytest.fail(f"sandbox up failed: {exc.message}\n{exc.hint or ''}", pytrace=False)
    return sb


def finish_sandbox(sb: Any) -> None:
    sb.down()
    if not os.environ.get("SLURMPOD_KEEP_SANDBOX"):
        shutil.rmtree(sb.state_dir, ignore_errors=True)


@pytest.fixture(scope="session")
def sandbox() -> Iterator[SandboxFixture]:
    require_sandbox_tools()
    from slurmpod.config import load_site

    state = new_state_dir("slurmpod-it-")
    scratch = state / "work"
    scratch.mkdir()
    # `timeout pytest …` sends SIGTERM: turn it into an interrupt so the sandbox still goes down
    # (its daemons run in their own sessions and would otherwise outlive the test run).
    previous = signal.getsignal(signal.SIGTERM)
    if previous is signal.SIG_DFL:
        signal.signal(signal.SIGTERM, _interrupt)
    sb = start_sandbox(state)
    try:
        # the site the sandbox was built from (not the default site, which $SLURMPOD_SITE picks)
        yield SandboxFixture(sb, load_site(sb.site_path), scratch)
    finally:
        if previous is signal.SIG_DFL:  # a second SIGTERM must not cut `down` short
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
        try:
            finish_sandbox(sb)
        finally:
            if previous is signal.SIG_DFL:
                signal.signal(signal.SIGTERM, signal.SIG_DFL)


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")
