"""Fault injection on the real sandbox: one emulated run with `--spares 1` meets ten faults —
nodes set DOWN, ranks killed (SIGKILL), ranks frozen (SIGSTOP) — and still completes.

Checked: the run reaches train_iters; every attempt resumes from the checkpoint the previous
one left (no progress lost beyond it); each hung attempt is detected within its bound
(max(k x median step, floor) plus one poll) and ended; every faulty node is excluded with its
evidence and used by no later attempt; the attempts record lists every fault. Figures (detection
time, restart latency fault -> training again) are printed, not asserted (docs/
resilience-in-job.md quotes them). Synchronisation is on the job's own records, never sleeps.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import signal
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path
from typing import Any

from slurmpod.runs.attempts import parse_attempts
from tests.integration.test_lifecycle_sandbox import restarts_of
from tests.integration.test_submit_sandbox import log_of, wait_for, write_run

FAULTS = ("kill", "freeze", "down", "kill", "freeze", "down", "kill", "freeze", "down", "kill")
HANG = {"SLURMPOD_HANG_K": "10", "SLURMPOD_HANG_FLOOR_S": "5", "SLURMPOD_HANG_POLL_S": "0.5",
        "SLURMPOD_HANG_SETUP_S": "120", "SLURMPOD_SHED_FRACTION": "0.75"}
_ITER = re.compile(r"^\s*0:\s+\[([0-9-]+ [0-9:.]+)\] iteration\s+(\d+)/", re.M)


def attempts(run_dir: Path) -> Any:
    path = run_dir / ".slurmpod" / "attempts.jsonl"
    return parse_attempts(path.read_bytes() if path.exists() else b"")


def training_in(run_dir: Path, job_id: str, attempt: int, after_iteration: int | None) -> bool:
    """Attempt `attempt` logged an iteration past a checkpoint it saved itself."""
    att = attempts(run_dir).find(job_id, attempt)
    if att is None or att.end is not None or att.log_offset is None:
        return False
    part = log_of(run_dir)[att.log_offset:]
    saved = re.findall(r"successfully saved checkpoint from iteration\s+(\d+)", part)
    return bool(saved) and (after_iteration is None or int(saved[-1]) > after_iteration)


def rank_pid(run_dir: Path, job_id: str, node: str) -> tuple[int, int]:
    """(rank, pid) of a trainer rank on `node`, from the rank wrapper's note."""
    for f in sorted((run_dir / ".slurmpod" / f"ranks-{job_id}").glob("rank-*")):
        words = f.read_text().split()
        if len(words) >= 2 and words[0] == node:
            return int(f.name.split("-")[1]), int(words[1])
    raise AssertionError(f"no rank of {node} noted")


def test_ten_faults_one_run_completes_without_lost_progress(sandbox: Any) -> None:
    d = sandbox.tmp_dir / "faults"
    d.mkdir(exist_ok=True)
    run = write_run(d / "run.toml", "faults", 2, train_iters=600, hidden=512, seq=256,
                    extra="save_interval = 5")
    cp = subprocess.run([sys.executable, "-m", "slurmpod", "submit", str(run), "--topo-dir", "",
                         "--json", "--spares", "1", "--max-restarts", "2",
                         # Ten excluded nodes can leave no SU with room for the job: wait for
                         # nothing, take nodes from any SU (docs/resilience-in-job.md).
                         "--switch-wait", "0"],
                        env={**sandbox.env, **HANG}, capture_output=True, text=True, timeout=120,
                        cwd=sandbox.tmp_dir, stdin=subprocess.DEVNULL)
    assert cp.returncode == 0, cp.stderr
    jid, run_dir = json.loads(cp.stdout)["job_id"], d / "faults"
    downed: list[str] = []
    injected: list[dict[str, Any]] = []
    released = 0
    try:
        for kind in FAULTS:
            # The attempt running now, training past a checkpoint of its own.
            def current() -> Any:
                nonlocal released
                r = restarts_of(sandbox, jid)
                if r > released and sandbox.squeue_state(jid) == "PENDING":
                    sandbox.release_requeued(jid)
                    released = r
                atts = attempts(run_dir).of_job(jid)
                return atts[-1] if atts and training_in(run_dir, jid, atts[-1].attempt, None) \
                    else None

            wait_for(lambda: current() is not None, 240, f"training before fault {kind}")
            att = current()
            batch_host = att.nodes[0]  # rank 0's node hosts the batch script: spare it
            victim = att.nodes[-1]
            assert victim != batch_host
            t0 = time.time()
            if kind == "down":
                sandbox.run(["scontrol", "update", f"NodeName={victim}", "State=DOWN",
                             "Reason=slurmpod-fault-test"])
                downed.append(victim)
            else:
                _rank, pid = rank_pid(run_dir, jid, victim)
                os.kill(pid, signal.SIGKILL if kind == "kill" else signal.SIGSTOP)
            injected.append({"kind": kind, "node": victim, "attempt": att.attempt,
                             "job": jid, "time": t0})
            # The next attempt (in this allocation, or after a requeue) trains again.
            wait_for(lambda a=att: (cur := current()) is not None and cur.attempt > a.attempt,
                     240, f"training again after {kind} on {victim}")
        wait_for(lambda: sandbox.squeue_state(jid) in ("", "COMPLETED"), 600, "the end")
        job = sandbox.wait_job(jid, timeout_s=120)
        assert "COMPLETED" in json.dumps(job["state"]), job["state"]
    finally:
        for n in downed:
            sandbox.run(["scontrol", "update", f"NodeName={n}", "State=RESUME"], check=False)
        sandbox.cancel(jid)

    atts = attempts(run_dir).of_job(jid)
    log = log_of(run_dir)
    assert atts[-1].end == "completed" and atts[-1].iteration == 600
    # No progress lost beyond the last checkpoint: each attempt starts where the last ended.
    for prev, nxt in itertools.pairwise(atts):
        part = log[nxt.log_offset:]
        m = re.search(r"successfully loaded checkpoint from \S+ \[[^]]*\] at iteration (\d+)",
                      part)
        assert m and int(m.group(1)) == prev.iteration, (prev, nxt)
    excluded = {ex["node"]: (a.attempt, ex) for a in atts for ex in a.excluded
                if ex["action"] == "excluded"}
    figures = []
    for f in injected:
        att = next(a for a in atts if a.attempt == f["attempt"])
        assert f["node"] in excluded, (f, excluded)
        shed_at, ex = excluded[f["node"]]
        assert shed_at == f["attempt"], (f, ex)
        later = [a for a in atts if a.attempt > shed_at]
        assert all(f["node"] not in a.nodes for a in later), (f, later)  # never used again
        # A node set DOWN may be idle again at once (ReturnToService=2, RESIZING): srun saw it.
        want = {"kill": "srun: task", "freeze": "hang: rank", "down": "node failure"}
        assert want[f["kind"]] in ex["evidence"], (f, ex)
        if f["kind"] == "freeze":
            assert att.end == "hang" and att.hang is not None
            # ended within the bound (+ one poll, the dump step and the kill)
            assert att.hang["silent_s"] <= att.hang["bound_s"] + 1.0, att.hang
        nxt = next(a for a in atts if a.attempt > f["attempt"])
        first = _ITER.search(log[nxt.log_offset:])
        assert first
        back = datetime.strptime(first.group(1), "%Y-%m-%d %H:%M:%S.%f").timestamp()
        figures.append((f["kind"], f["node"], round(back - f["time"], 1),
                        "in-job" if nxt.restart == att.restart else "requeue",
                        att.hang["silent_s"] if att.hang else None))
    for row in figures:
        kind, node, back_s, how, hang_s = row
        print(f"fault {kind:6} on {node}: training again after {back_s:5.1f} s ({how}), "
              f"hang seen after {hang_s} s")
