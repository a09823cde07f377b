"""`slurmpod runs`, `logs` and `cancel --save` against a run on the real sandbox Slurm: the
run is listed with its attempt and iteration, its log can be read by attempt and rank, and a
save-then-cancel leaves a checkpoint and a CANCELLED job that is not requeued."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from tests.integration.test_lifecycle_sandbox import ends_of
from tests.integration.test_submit_sandbox import log_of, slurmpod, submit_json, wait_for, write_run


def test_runs_logs_and_cancel_with_a_save(sandbox: Any) -> None:
    d = sandbox.tmp_dir / "steer"
    d.mkdir(exist_ok=True)
    run = write_run(d / "run.toml", "steer", 1, train_iters=100_000, hidden=512, seq=256,
                    extra="save_interval = 1000000")
    res = submit_json(sandbox, run, "--wait")
    jid, run_dir = res["job_id"], d / "steer"
    its = re.compile(r"iteration\s+(\d+)/")
    wait_for(lambda: len(its.findall(log_of(run_dir))) >= 3, 120, "three iterations")

    def listed() -> dict[str, Any] | None:
        cp = slurmpod(sandbox, "runs", "--json")
        assert cp.returncode == 0, cp.stderr
        return next((r for r in json.loads(cp.stdout) if r["job_id"] == jid), None)

    wait_for(lambda: listed() is not None, 60, "the run in `slurmpod runs`")
    row = listed()
    assert row is not None
    assert row["run"] == "steer" and row["state"] == "RUNNING" and row["attempt"] == 1
    assert row["attempt_running"] is True and (row["iteration"] or 0) >= 3
    assert Path(row["work_dir"]) == run_dir

    cp = slurmpod(sandbox, "logs", "steer", "--attempt", "1", "--rank", "0")
    assert cp.returncode == 0, cp.stderr
    lines = cp.stdout.splitlines()
    assert lines and all(re.match(r"\s*0: ", x) for x in lines)
    assert any(its.search(x) for x in lines)

    cp = slurmpod(sandbox, "cancel", jid, "--save", "--json")
    assert cp.returncode == 0, cp.stderr
    assert json.loads(cp.stdout)["action"] == "save-then-cancel"
    job = sandbox.wait_job(jid, timeout_s=120)
    assert "CANCELLED" in json.dumps(job["state"]), job["state"]
    assert [e["end"] for e in ends_of(run_dir)] == ["cancelled"]
    saved = (run_dir / "checkpoints" / "latest_checkpointed_iteration.txt").read_text()
    assert int(saved) >= 3  # the trainer saved before the job ended
    assert "requeueing" not in log_of(run_dir)

    # An ended job: one line, exit 4.
    cp = slurmpod(sandbox, "cancel", jid)
    assert cp.returncode == 4 and "already ended" in cp.stderr
