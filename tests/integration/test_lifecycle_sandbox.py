"""How each end of a slurmpod job is handled, on the real sandbox Slurm: cancel, segments that
end before the time limit, failures with and without progress, preemption, a node that goes
down under a job with a hot spare, and a rendered script run by plain `sbatch` from an empty
environment. The attempt record (`.slurmpod/attempts.jsonl`) says why each attempt ended."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from tests.integration.test_submit_sandbox import log_of, slurmpod, submit_json, wait_for, write_run


def ends_of(run_dir: Path) -> list[dict[str, Any]]:
    path = run_dir / ".slurmpod" / "attempts.jsonl"
    if not path.exists():
        return []
    return [json.loads(x) for x in path.read_text().splitlines() if '"event":"end"' in x]


def restarts_of(sandbox: Any, job_id: str) -> int:
    cp = sandbox.run(["scontrol", "show", "job", "-o", job_id], check=False)
    m = re.search(r"\bRestarts=(\d+)", cp.stdout)
    return int(m.group(1)) if m else 0


def drive_to_end(sandbox: Any, job_id: str, timeout_s: float) -> None:
    """Wait for the job to finish, letting each requeued attempt start again in seconds (once
    per requeue: every release moves the begin time on again)."""
    deadline = time.monotonic() + timeout_s
    released = 0
    while time.monotonic() < deadline:
        state = sandbox.squeue_state(job_id)
        if state == "":
            return
        if state == "PENDING":
            restarts = restarts_of(sandbox, job_id)
            if restarts > released:
                sandbox.release_requeued(job_id)
                released = restarts
        time.sleep(1)
    raise AssertionError(f"job {job_id} still {sandbox.squeue_state(job_id)!r} after "
                         f"{timeout_s} s ({released} releases)")


def test_scancel_ends_cancelled_after_one_attempt(sandbox: Any) -> None:
    d = sandbox.tmp_dir / "cancel"
    d.mkdir(exist_ok=True)
    run = write_run(d / "run.toml", "cancel", 1, train_iters=100_000, hidden=512, seq=256)
    res = submit_json(sandbox, run, "--wait")
    jid, run_dir = res["job_id"], d / "cancel"
    its = re.compile(r"iteration\s+(\d+)/")
    wait_for(lambda: len(its.findall(log_of(run_dir))) >= 2, 120, "two iterations")
    sandbox.run(["scancel", jid])
    job = sandbox.wait_job(jid, timeout_s=120)
    assert "CANCELLED" in json.dumps(job["state"]), job["state"]
    # The trap writes the record while Slurm ends the job: sacct may say CANCELLED first.
    wait_for(lambda: bool(ends_of(run_dir)), 30, "the attempt's end record")
    assert [e["end"] for e in ends_of(run_dir)] == ["cancelled"]
    assert "requeueing" not in log_of(run_dir)


def test_three_segments_complete_with_no_restart_budget(sandbox: Any) -> None:
    # The trainer's own exit before the time limit (--exit-duration-in-mins; here
    # --exit-interval stands in for it, to make exactly three segments) is not a failure.
    d = sandbox.tmp_dir / "segments"
    d.mkdir(exist_ok=True)
    run = write_run(d / "run.toml", "segments", 1, train_iters=9, extra="exit_interval = 3")
    res = submit_json(sandbox, run, "--max-restarts", "0")
    jid, run_dir = res["job_id"], d / "segments"
    drive_to_end(sandbox, jid, 400)
    job = sandbox.wait_job(jid)
    assert "COMPLETED" in json.dumps(job["state"]), job["state"]
    ends = ends_of(run_dir)
    assert [e["end"] for e in ends] == ["timelimit", "timelimit", "completed"], ends
    assert [e["iteration"] for e in ends] == [3, 6, 9]
    assert all(e["failures"] == 0 for e in ends)


def test_failure_after_progress_is_retried_without_budget(sandbox: Any) -> None:
    d = sandbox.tmp_dir / "fail-progress"
    d.mkdir(exist_ok=True)
    run = write_run(d / "run.toml", "failprog", 1, train_iters=8,
                    extra="save_interval = 2\nemu_fail_at_iteration = 5")
    res = submit_json(sandbox, run, "--max-restarts", "0")
    jid, run_dir = res["job_id"], d / "failprog"
    drive_to_end(sandbox, jid, 300)
    ends = ends_of(run_dir)
    assert [(e["end"], e["progress"], e["failures"]) for e in ends] == \
        [("failure", True, 0), ("completed", True, 0)], ends
    assert "COMPLETED" in json.dumps(sandbox.wait_job(jid)["state"])


def test_failure_without_progress_spends_the_budget(sandbox: Any) -> None:
    d = sandbox.tmp_dir / "fail-noprogress"
    d.mkdir(exist_ok=True)
    run = write_run(d / "run.toml", "failnoprog", 1, train_iters=8,
                    extra="save_interval = 100\nemu_fail_at_iteration = 3")
    res = submit_json(sandbox, run, "--max-restarts", "0")
    jid, run_dir = res["job_id"], d / "failnoprog"
    job = sandbox.wait_job(jid, timeout_s=180)
    assert "FAILED" in json.dumps(job["state"]), job["state"]
    ends = ends_of(run_dir)
    assert [(e["end"], e["progress"], e["failures"]) for e in ends] == [("failure", False, 1)]
    assert "failure budget (0) used up" in log_of(run_dir)


def test_same_failure_before_training_fails_fast(sandbox: Any) -> None:
    d = sandbox.tmp_dir / "fail-fast"
    d.mkdir(exist_ok=True)
    run = write_run(d / "run.toml", "failfast", 1, train_iters=8, extra="emu_fail_at_start = 2")
    res = submit_json(sandbox, run, "--max-restarts", "5")
    jid, run_dir = res["job_id"], d / "failfast"
    drive_to_end(sandbox, jid, 300)
    ends = ends_of(run_dir)
    assert [e["end"] for e in ends] == ["failure", "failure"], ends
    assert "died before training" in log_of(run_dir)


def test_preempted_run_saves_requeues_and_resumes(sandbox: Any) -> None:
    d = sandbox.tmp_dir / "preempt"
    d.mkdir(exist_ok=True)
    run = write_run(d / "run.toml", "preempt", 1, train_iters=1_000_000, hidden=512, seq=256,
                    extra="save_interval = 1000000", job_extra='partition = "preemptible"')
    res = submit_json(sandbox, run, "--max-restarts", "0", "--wait")
    jid, run_dir = res["job_id"], d / "preempt"
    its = re.compile(r"iteration\s+(\d+)/")
    try:
        wait_for(lambda: len(its.findall(log_of(run_dir))) >= 3, 120, "three iterations")
        # A job in the higher-tier partition that needs every node preempts it (GraceTime 30).
        urgent = sandbox.sbatch("-p", "urgent", "-N", str(len(sandbox.inventory.nodes)),
                                "--exclusive", "--wrap", "sleep 1")
        wait_for(lambda: any(e["end"] == "preempted" for e in ends_of(run_dir)), 120,
                 "the preempted attempt")
        sandbox.wait_job(urgent, timeout_s=180)
        seen = 0
        while restarts_of(sandbox, jid) < 1:
            seen += 1
            assert seen < 120, "never requeued"
            time.sleep(1)
        sandbox.release_requeued(jid)

        def resumed() -> bool:  # one read: the restart line and two iterations after it
            _, mark, after = log_of(run_dir).partition("restart 1 on")
            return bool(mark) and len(its.findall(after)) >= 2

        wait_for(resumed, 240, "the resumed run")
        ends = ends_of(run_dir)
        assert [(e["end"], e["failures"]) for e in ends] == [("preempted", 0)], ends
        first, second = log_of(run_dir).split("restart 1 on", 1)
        saved = re.findall(r"successfully saved checkpoint from iteration\s+(\d+)", first)
        assert saved and int(its.findall(second)[0]) == int(saved[-1]) + 1
    finally:
        sandbox.cancel(jid)


def test_node_down_mid_run_hands_over_to_the_spare(sandbox: Any) -> None:
    d = sandbox.tmp_dir / "spare-down"
    d.mkdir(exist_ok=True)
    run = write_run(d / "run.toml", "sparedown", 2, train_iters=1_000_000, hidden=512, seq=256,
                    extra="save_interval = 2")
    res = submit_json(sandbox, run, "--spares", "1", "--wait")
    jid, run_dir = res["job_id"], d / "sparedown"
    allocated = sandbox.nodes_of(jid)
    assert len(allocated) == 3
    its = re.compile(r"iteration\s+(\d+)/")
    victim = allocated[1]  # in the step, not the batch host (allocated[0]), not the spare

    def starts() -> list[dict[str, Any]]:
        path = run_dir / ".slurmpod" / "attempts.jsonl"
        return [json.loads(x) for x in path.read_text().splitlines()
                if '"event":"start"' in x] if path.exists() else []

    try:
        wait_for(lambda: len(its.findall(log_of(run_dir))) >= 3, 120, "three iterations")
        sandbox.run(["scontrol", "update", f"NodeName={victim}", "State=DOWN",
                     "Reason=slurmpod-test"])
        wait_for(lambda: len(starts()) >= 2, 180, "the relaunch")

        def trains_again() -> bool:  # one read: iterations after the second launch line
            _, mark, after = log_of(run_dir).partition("attempt 2: launching")
            return bool(mark) and len(its.findall(after)) >= 2

        wait_for(trains_again, 180, "training on the spare")
        s = starts()
        assert s[0]["nodes"] == allocated[:2]
        assert victim not in s[1]["nodes"] and allocated[2] in s[1]["nodes"], s
        assert sandbox.squeue_state(jid) == "RUNNING"  # same allocation, not requeued
        assert restarts_of(sandbox, jid) == 0
    finally:
        sandbox.run(["scontrol", "update", f"NodeName={victim}", "State=RESUME"], check=False)
        sandbox.cancel(jid)


def test_rendered_script_runs_with_plain_sbatch_from_an_empty_environment(sandbox: Any) -> None:
    d = sandbox.tmp_dir / "plain"
    d.mkdir(exist_ok=True)
    run = write_run(d / "run.toml", "plain", 1, train_iters=3)
    script = d / "x.sbatch"
    cp = slurmpod(sandbox, "render", str(run), "--topo-dir", "", "-o", str(script))
    assert cp.returncode == 0, cp.stderr
    # A bare PATH: the sandbox Slurm's clients (the system's, or another prefix's) and /bin.
    slurm_bin = os.path.dirname(shutil.which("sbatch", path=sandbox.env.get("PATH")) or
                                "/usr/bin/sbatch")
    env = {"PATH": f"{slurm_bin}:/usr/bin:/bin", "SLURM_CONF": sandbox.env["SLURM_CONF"]}
    out = subprocess.run(["sbatch", "--parsable", str(script)], env=env, capture_output=True,
                         text=True, timeout=30, cwd="/", stdin=subprocess.DEVNULL)
    assert out.returncode == 0, out.stderr
    jid = out.stdout.strip().split(";")[0]
    job = sandbox.wait_job(jid, timeout_s=180)
    assert "COMPLETED" in json.dumps(job["state"]), (job["state"], log_of(d / "plain"))
    assert "training complete" in log_of(d / "plain")
    assert sys.executable in script.read_text() and os.path.isabs(sys.executable)


def test_hard_time_limit_before_the_warning_still_requeues(sandbox: Any) -> None:
    # A script without the USR2 warning (as if the lead were too short): at the limit Slurm
    # sends SIGTERM with Reason=TimeLimit and would end the job TIMEOUT; the trap requeues it.
    d = sandbox.tmp_dir / "hardlimit"
    d.mkdir(exist_ok=True)
    run = write_run(d / "run.toml", "hardlimit", 1, train_iters=100_000, hidden=512, seq=256,
                    extra="save_interval = 1000000", job_extra='time_limit = "00:01:00"')
    text = (d / "run.toml").read_text().replace('time_limit = "00:10:00"\n', "")
    (d / "run.toml").write_text(text)
    script = d / "x.sbatch"
    cp = slurmpod(sandbox, "render", str(run), "--topo-dir", "", "-o", str(script))
    assert cp.returncode == 0, cp.stderr
    body = "".join(x for x in script.read_text().splitlines(keepends=True)
                   if not x.startswith("#SBATCH --signal="))
    script.write_text(body)
    jid = sandbox.sbatch(f"--output={d}/hardlimit/logs/%x-%j.out", str(script))
    run_dir = d / "hardlimit"
    try:
        wait_for(lambda: restarts_of(sandbox, jid) >= 1, 240, "the requeue at the time limit")
        ends = ends_of(run_dir)
        assert [(e["end"], e["failures"]) for e in ends] == [("timelimit", 0)], ends
        # The trap requeues at once; should Slurm's signals end the shell's scontrol first, the
        # script's end requeues instead. Either way one requeue, none refused.
        log = log_of(run_dir)
        assert ("time limit reached before the warning; requeueing" in log
                or "requeueing (timelimit, not counted as a failure)" in log), log
        assert "requeue failed" not in log, log
    finally:
        sandbox.cancel(jid)
