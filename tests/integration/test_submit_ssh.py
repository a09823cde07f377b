"""`slurmpod submit --host` against a real sshd on 127.0.0.1: the script is uploaded into the
run directory over SFTP and queued on the sandbox Slurm; a host key mismatch is one line, exit 5,
and nothing is queued."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from tests.integration.ssh_fixture import SshdServer, sshd  # noqa: F401
from tests.integration.test_submit_sandbox import log_of, wait_for, write_run


def _home(tmp_path: Path, server: SshdServer, known_hosts: str | None = None) -> Path:
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True, exist_ok=True)
    shutil.copy(server.ssh_config, home / ".ssh" / "config")
    (home / ".ssh" / "known_hosts").write_text(known_hosts or server.known_hosts.read_text())
    return home


def _submit(sandbox: Any, server: SshdServer, run: Path, home: Path, *args: str
            ) -> subprocess.CompletedProcess[str]:
    env = {**sandbox.env, "HOME": str(home)}
    env.pop("SLURM_CONF")  # the remote side gets it through --remote-env, as a site would
    # ... and the PATH of the sandbox's Slurm, which may not be the one sshd's login PATH finds.
    return subprocess.run(
        [sys.executable, "-m", "slurmpod", "submit", str(run), "--host", server.alias,
         "--remote-env", f"SLURM_CONF={sandbox.sb.slurm_conf}",
         "--remote-env", f"PATH={sandbox.env['PATH']}", "--topo-dir", "", *args],
        env=env, capture_output=True, text=True, timeout=180, stdin=subprocess.DEVNULL)


def test_submit_over_ssh_uploads_and_queues(sandbox: Any, sshd: SshdServer,  # noqa: F811
                                            tmp_path: Path) -> None:
    d = sandbox.tmp_dir / "over-ssh"
    d.mkdir(exist_ok=True)
    run = write_run(d / "run.toml", "over-ssh", 1, train_iters=3)
    t0 = time.monotonic()
    cp = _submit(sandbox, sshd, run, _home(tmp_path, sshd), "--json")
    assert cp.returncode == 0, cp.stderr
    res = json.loads(cp.stdout)
    assert res["where"].startswith("ssh ") and res["job_id"]
    script = Path(res["script"])
    assert script == d / "over-ssh" / "over-ssh.sbatch" and script.read_text().startswith("#!")
    marker = json.loads((d / "over-ssh" / ".slurmpod" / "submission.json").read_text())
    assert marker["job_ids"] == [res["job_id"]]
    wait_for(lambda: "training complete" in log_of(d / "over-ssh"), 120, "the job over SSH")
    # The log says so before Slurm has ended the job (its script still records the end): wait
    # for Slurm, or the new submission finds the run still active and returns its job id.
    sandbox.wait_job(res["job_id"], timeout_s=120)
    # The marker is read back over SSH; the finished job does not block a new run.
    again = _submit(sandbox, sshd, run, _home(tmp_path, sshd), "--json")
    assert again.returncode == 0, again.stderr
    second = json.loads(again.stdout)["job_id"]
    sandbox.cancel(second)
    assert second != res["job_id"]  # the first one had finished: this is a new run
    assert time.monotonic() - t0 < 170


def test_host_key_mismatch_is_exit_5_and_queues_nothing(sandbox: Any, sshd: SshdServer,  # noqa: F811
                                                        tmp_path: Path) -> None:
    d = sandbox.tmp_dir / "ssh-bad-key"
    d.mkdir(exist_ok=True)
    run = write_run(d / "run.toml", "ssh-bad-key", 1)
    stranger = " ".join(sshd.stranger_key.with_suffix(".pub").read_text().split()[:2])
    home = _home(tmp_path, sshd, known_hosts=sshd.known_hosts_line(stranger))
    cp = _submit(sandbox, sshd, run, home)
    assert cp.returncode == 5, cp.stderr
    errors = [ln for ln in cp.stderr.splitlines() if ln.startswith("slurmpod: error:")]
    assert len(errors) == 1 and "Traceback" not in cp.stderr
    assert sandbox.run(["squeue", "-h", "-n", "ssh-bad-key"]).stdout.strip() == ""
    assert not (d / "ssh-bad-key").exists()
