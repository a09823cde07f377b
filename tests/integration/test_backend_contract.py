"""The backend contract (tests/unit/backends/test_contract.py) against the real Slurm sandbox:
the CLI backend run locally, the same backend over SSH to a real sshd on 127.0.0.1, and the
pyslurm backend where a pyslurm built for the sandbox's Slurm is installed (it skips otherwise,
also under CI: see require_matching_pyslurm in conftest.py)."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path, PurePath
from typing import Any

import pytest

from slurmpod.backends.cli import CliBackend
from slurmpod.model.jobs import JobState
from slurmpod.transport.local import LocalRunner
from tests.integration.conftest import require_matching_pyslurm
from tests.integration.ssh_fixture import SshdServer, sshd  # noqa: F401
from tests.unit.backends.test_contract import BackendContract, batch_script

pytestmark = pytest.mark.slurm


def _placer(sandbox: Any) -> Callable[[str], PurePath]:
    counter = iter(range(1_000_000))

    def place(text: str) -> PurePath:
        path = sandbox.tmp_dir / f"contract-{next(counter)}.sbatch"
        path.write_text(text)
        return PurePath(path)

    return place


class TestCliBackendContract(BackendContract):
    @pytest.fixture
    def backend(self, sandbox: Any) -> CliBackend:
        return CliBackend(LocalRunner(env=sandbox.env))

    @pytest.fixture
    def place_script(self, sandbox: Any) -> Callable[[str], PurePath]:
        return _placer(sandbox)


def import_pyslurm_for(slurm_conf: Path) -> Any:
    """pyslurm, initialised with the sandbox's slurm.conf.

    libslurm reads slurm.conf once, in slurm_init(), and `import pyslurm` calls slurm_init()
    with no path, so libslurm takes SLURM_CONF from this process's environment at import time.
    pytest was not started with the sandbox's SLURM_CONF (the sandbox is started inside it), so
    setting it afterwards would be too late for an already imported pyslurm and would leak into
    every later test. Instead the import skips the automatic init (PYSLURM_DISABLE_AUTO_INIT,
    pyslurm 23.2+) and slurm_init() gets the sandbox's slurm.conf path explicitly. A pyslurm
    that was already initialised in this process is finalised first (slurm_fini) so that its
    configuration is read again.
    """
    already = "pyslurm" in sys.modules
    saved = os.environ.get("PYSLURM_DISABLE_AUTO_INIT")
    os.environ["PYSLURM_DISABLE_AUTO_INIT"] = "1"
    try:
        import pyslurm
    finally:
        if saved is None:
            del os.environ["PYSLURM_DISABLE_AUTO_INIT"]
        else:
            os.environ["PYSLURM_DISABLE_AUTO_INIT"] = saved
    if already:
        pyslurm.slurm_fini()
    pyslurm.slurm_init(str(slurm_conf))
    return pyslurm


@pytest.fixture(scope="module")
def pyslurm_backend(sandbox: Any) -> Any:
    from slurmpod.backends.pyslurm_backend import PyslurmBackend

    slurm = CliBackend(LocalRunner(env=sandbox.env)).version()
    require_matching_pyslurm(slurm)
    module = import_pyslurm_for(sandbox.sb.slurm_conf)
    backend = PyslurmBackend(slurm)  # the real load_pyslurm: import and version check
    assert backend.ps is module
    return backend


class TestPyslurmBackendContract(BackendContract):
    @pytest.fixture
    def backend(self, pyslurm_backend: Any) -> Any:
        return pyslurm_backend

    @pytest.fixture
    def place_script(self, sandbox: Any) -> Callable[[str], PurePath]:
        return _placer(sandbox)  # pyslurm reads the script here, like sbatch


@pytest.fixture
def ssh_backend(sandbox: Any, sshd: SshdServer,  # noqa: F811
                monkeypatch: pytest.MonkeyPatch) -> Iterator[CliBackend]:
    from slurmpod.transport.ssh import SshRunner

    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
    runner = SshRunner(sshd.alias, ssh_config=sshd.ssh_config, known_hosts=sshd.known_hosts)
    # The login node's Slurm client needs SLURM_CONF (and the sbin PATH) of the sandbox.
    env = {k: sandbox.env[k] for k in ("SLURM_CONF", "PATH")}
    backend = CliBackend(_EnvRunner(runner, env))
    yield backend
    runner.close()


class _EnvRunner:
    """Adds fixed environment to every remote command (a login node's profile would)."""

    def __init__(self, inner: Any, env: dict[str, str]) -> None:
        self.inner, self.env = inner, env

    @property
    def where(self) -> str:
        return self.inner.where

    def run(self, argv, **kw):  # type: ignore[no-untyped-def]
        kw["env"] = {**self.env, **(kw.get("env") or {})}
        return self.inner.run(argv, **kw)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def test_submit_over_ssh_uploads_script_and_runs(ssh_backend: CliBackend, sandbox: Any,
                                                 sshd: SshdServer) -> None:  # noqa: F811
    run_dir = sandbox.tmp_dir / "ssh run dir"
    script = batch_script("echo ran-over-ssh", name="over-ssh")
    runner = ssh_backend.runner
    remote = runner.write_text(str(run_dir / "job.sbatch"), script, mode=0o755)
    # a path with a space and a JSON comment: argv elements, quoted for the remote shell
    job_id = ssh_backend.submit(PurePath(remote), cwd=str(run_dir), args=[
        f"--output={run_dir}/out-%j.txt", '--comment={"via": "ssh; $(x)"}'])
    rec = BackendContract().wait_record(ssh_backend, job_id, name="over-ssh")
    assert rec.state is JobState.COMPLETED and rec.comment == '{"via": "ssh; $(x)"}'
    assert (run_dir / f"out-{job_id}.txt").read_text() == "ran-over-ssh\n"
