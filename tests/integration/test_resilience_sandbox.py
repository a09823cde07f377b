"""Fault injection on the real sandbox: one emulated run with `--spares 1` meets ten faults —
nodes set DOWN, ranks killed (SIGKILL), ranks frozen (SIGSTOP), a node's slurmd killed — and
still completes.

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

import pytest

from slurmpod.runs.attempts import parse_attempts
from tests.integration.test_lifecycle_sandbox import restarts_of
from tests.integration.test_submit_sandbox import log_of, wait_for, write_run

FAULTS = ("kill", "freeze", "down", "slurmd", "kill", "freeze", "down", "kill", "freeze",
          "down")
HANG = {"SLURMPOD_HANG_K": "10", "SLURMPOD_HANG_FLOOR_S": "5", "SLURMPOD_HANG_POLL_S": "0.5",
        "SLURMPOD_HANG_SETUP_S": "120", "SLURMPOD_SHED_FRACTION": "0.75"}
# Enough work that the run cannot finish under a fault: iterations are paced to >= 20.8 ms on
# the sandbox's emulated GPU, and a killed slurmd ends the step only once slurmctld declares the
# node DOWN (SlurmdTimeout 30 s + a ping); 600 iterations let a quiet machine train to the end
# first. 4,000 are >= 83 s of training in all.
TRAIN_ITERS = 4000
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


def node_state(sandbox: Any, node: str) -> str:
    cp = sandbox.run(["sinfo", "-h", "-N", "-n", node, "-o", "%T"], check=False)
    return (cp.stdout.split() or [""])[0]


def _state(sandbox: Any, jid: str, run_dir: Path, node: str) -> str:
    """What Slurm and the run's record say, for a failure message."""
    out = []
    for argv in (["squeue", "-h", "-j", jid, "-o", "%T %r %N"], ["sinfo", "-h", "-N", "-o",
                 "%N %T %E"], ["scontrol", "show", "job", jid]):
        cp = sandbox.run(argv, check=False)
        out.append(f"$ {' '.join(argv)}\n{cp.stdout.strip()}{cp.stderr.strip()}")
    rec = run_dir / ".slurmpod" / "attempts.jsonl"
    out.append("attempts.jsonl (last 8 lines):\n" + "\n".join(
        rec.read_text().splitlines()[-8:] if rec.exists() else ["(none)"]))
    out.append("log (last 30 lines but iterations):\n" + "\n".join(
        [ln for ln in log_of(run_dir).splitlines() if " iteration " not in ln][-30:]))
    return f"node {node}\n" + "\n".join(out)


def test_ten_faults_one_run_completes_without_lost_progress(sandbox: Any) -> None:
    d = sandbox.tmp_dir / "faults"
    d.mkdir(exist_ok=True)
    run = write_run(d / "run.toml", "faults", 2, train_iters=TRAIN_ITERS, hidden=512, seq=256,
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
    killed_slurmd: list[str] = []
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
            elif kind == "slurmd":
                # The step lives on (slurmstepd outlives slurmd) until slurmctld declares the
                # node DOWN after SlurmdTimeout (30 s in the sandbox) and srun ends the step.
                assert sandbox.sb.kill_slurmd(victim)
                killed_slurmd.append(victim)
            else:
                _rank, pid = rank_pid(run_dir, jid, victim)
                os.kill(pid, signal.SIGKILL if kind == "kill" else signal.SIGSTOP)
            injected.append({"kind": kind, "node": victim, "attempt": att.attempt,
                             "job": jid, "time": t0})
            # The next attempt (in this allocation, or after a requeue) trains again.
            try:
                wait_for(lambda a=att: (cur := current()) is not None and cur.attempt > a.attempt,
                         240, f"training again after {kind} on {victim}")
            except pytest.fail.Exception as exc:
                pytest.fail(f"{exc}\n{_state(sandbox, jid, run_dir, victim)}", pytrace=False)
        wait_for(lambda: sandbox.squeue_state(jid) in ("", "COMPLETED"), 600, "the end")
        job = sandbox.wait_job(jid, timeout_s=120)
        assert "COMPLETED" in json.dumps(job["state"]), job["state"]
    finally:
        for n in downed:
            sandbox.run(["scontrol", "update", f"NodeName={n}", "State=RESUME"], check=False)
        sandbox.cancel(jid)
        for n in killed_slurmd:
            # Back in service (ReturnToService=2) once it registers: leave the sandbox healthy.
            sandbox.sb.start_slurmd(n)
            wait_for(lambda n=n: node_state(sandbox, n) in ("idle", "mixed", "allocated"), 90,
                     f"{n} idle again after its slurmd restarted")

    atts = attempts(run_dir).of_job(jid)
    log = log_of(run_dir)
    assert atts[-1].end == "completed" and atts[-1].iteration == TRAIN_ITERS
    # No progress lost beyond the last checkpoint: each attempt starts where the last ended.
    for prev, nxt in itertools.pairwise(atts):
        part = log[nxt.log_offset:]
        m = re.search(r"successfully loaded checkpoint from \S+ \[[^]]*\] at iteration (\d+)",
                      part)
        assert m and int(m.group(1)) == prev.iteration, (prev, nxt)
    excluded = {ex["node"]: (a.attempt, ex) for a in atts for ex in a.excluded
                if ex["action"] == "excluded"}
    # Only the faulty nodes: a healthy node Slurm killed the tasks of is not blamed.
    assert set(excluded) == {f["node"] for f in injected}, (excluded, injected)
    figures = []
    for f in injected:
        att = next(a for a in atts if a.attempt == f["attempt"])
        assert f["node"] in excluded, (f, excluded)
        shed_at, ex = excluded[f["node"]]
        assert shed_at == f["attempt"], (f, ex)
        later = [a for a in atts if a.attempt > shed_at]
        assert all(f["node"] not in a.nodes for a in later), (f, later)  # never used again
        # A node set DOWN may be idle again at once (ReturnToService=2, RESIZING): srun saw it.
        # A killed slurmd: srun hears of the node's failure from slurmctld once the node is
        # DOWN; or the shedder finds it NOT_RESPONDING in sinfo first.
        want = {"kill": ("srun: task",), "freeze": ("hang: rank",), "down": ("node failure",),
                "slurmd": ("node failure", "Not responding", "NOT_RESPONDING")}
        assert any(w in ex["evidence"] for w in want[f["kind"]]), (f, ex)
        if f["kind"] == "freeze":
            assert att.end == "hang" and att.hang is not None
            # ended within the bound (+ one poll, the dump step and the kill)
            assert att.hang["silent_s"] <= att.hang["bound_s"] + 1.0, att.hang
        nxt = next(a for a in atts if a.attempt > f["attempt"])
        first = _ITER.search(log[nxt.log_offset:])
        assert first
        back = datetime.strptime(first.group(1), "%Y-%m-%d %H:%M:%S.%f").timestamp()
        if f["kind"] == "slurmd":
            # Slurm's detection: the node is DOWN within SlurmdTimeout + one ping interval
            # (30 + 10 s), plus srun ending the step and the script recording it.
            assert att.end_s is not None and att.end_s - f["time"] <= 30 + 10 + 20, att
        figures.append((f["kind"], f["node"], round(back - f["time"], 1),
                        "in-job" if nxt.restart == att.restart else "requeue",
                        att.hang["silent_s"] if att.hang else None))
    for row in figures:
        kind, node, back_s, how, hang_s = row
        print(f"fault {kind:6} on {node}: training again after {back_s:5.1f} s ({how}), "
              f"hang seen after {hang_s} s")
    replay_through_simulator(log, atts, injected)
    # The run's view lists every fault: a step that failed or hung, and each node shed with
    # its evidence.
    cp = subprocess.run([sys.executable, "-m", "slurmpod", "runs", "--json", "--since", "1d"],
                        env=sandbox.env, capture_output=True, text=True, timeout=120,
                        cwd=sandbox.tmp_dir, stdin=subprocess.DEVNULL)
    assert cp.returncode == 0, cp.stderr
    (row,) = [r for r in json.loads(cp.stdout) if r["job_id"] == jid]
    listed = {(a["attempt"], x["kind"], x.get("node")) for a in row["attempts"]
              for x in a["faults"]}
    for f in injected:
        assert (f["attempt"], "excluded", f["node"]) in listed, (f, listed)
        assert (f["attempt"], "hang" if f["kind"] == "freeze" else "failure", None) in listed \
            or (f["attempt"], "node_fail", None) in listed, (f, listed)


def _stamp(text: str) -> float:
    return datetime.strptime(text, "%Y-%m-%d %H:%M:%S.%f").timestamp()


def replay_through_simulator(log: str, atts: Any, injected: list[dict[str, Any]]) -> None:
    """The simulator's cost model against this run: the measured timeline (when each fault
    stopped training, how long until training again) replayed through
    `resilience.simulate.score` with the measured step, save interval and save stall must give
    the run's own goodput.

    The campaign's faults are not a Poisson process (each waits for the attempt to train and
    save first), so it is not compared with random paths of the same rate; replaying its
    timeline tests what every failure costs in the model: the restart, the work since the last
    completed save, the saves themselves.

    Tolerance: one save cycle (tau + delta) per gap between faults, over the run's wall time.
    The model keeps whole cycles per gap; the campaign injects each fault just after a save, at
    a cycle's edge, where the measured clock's jitter (a 20-40 ms step on a shared 2-core host)
    decides whether the cycle counts, so each gap may differ by one cycle either way.
    """
    from slurmpod.resilience.simulate import score, timeline

    # Per attempt: rank 0's iteration lines (time, iteration), whether a save came before each.
    steps: list[float] = []
    stalls: list[float] = []
    first_t: float | None = None
    first_it = 0
    end_t = 0.0
    last_iter_t: dict[int, float] = {}
    first_iter_t: dict[int, float] = {}
    for a in atts:
        part = log[a.log_offset:a.log_end] if a.log_end is not None else log[a.log_offset:]
        prev: tuple[float, int] | None = None
        saved = False
        for line in part.splitlines():
            m = _ITER.match(line)
            if m:
                t, it = _stamp(m.group(1)), int(m.group(2))
                first_iter_t.setdefault(a.attempt, t)
                last_iter_t[a.attempt] = t
                if first_t is None:
                    first_t, first_it = t, it
                if prev is not None and it == prev[1] + 1:
                    (stalls if saved else steps).append(t - prev[0])
                prev, saved = (t, it), False
                end_t = t
            elif "successfully saved checkpoint" in line:
                saved = True
    assert first_t is not None and steps and stalls
    step = float(sum(steps) / len(steps))
    save = max(0.0, float(sum(stalls) / len(stalls)) - step)
    interval = re.search(r"save_interval \.+ (\d+)", log)
    assert interval
    tau = int(interval.group(1)) * step
    # Training stopped at the fault, or at the attempt's last iteration when it trained on
    # (a killed slurmd: the step runs until Slurm declares the node DOWN).
    stops = [max(f["time"], last_iter_t[f["attempt"]]) for f in injected]
    backs = [first_iter_t[next(a.attempt for a in atts if a.attempt > f["attempt"])]
             for f in injected]
    edges = [first_t, *stops, end_t]
    gaps = [b - a for a, b in itertools.pairwise(edges)]
    restarts = [0.0, *(b - s for s, b in zip(stops, backs, strict=True))]
    out = score(timeline(gaps, restarts), tau, save)
    wall = end_t - first_t
    measured = (atts[-1].iteration - first_it) * step / wall
    simulated = float(out.goodput[0])
    tol = len(gaps) * (tau + save) / wall
    print(f"replay: {len(injected)} faults over {wall:.1f} s, step {step * 1e3:.1f} ms, "
          f"save interval {tau:.2f} s, save {save * 1e3:.1f} ms, restarts "
          f"{min(restarts[1:]):.1f}-{max(restarts[1:]):.1f} s (mean "
          f"{sum(restarts) / len(injected):.1f} s); goodput measured {measured:.2%}, "
          f"simulator {simulated:.2%} (tolerance {tol:.2%}); simulator's lost: restart "
          f"{out.restart_s[0]:.1f} s, saves {out.save_s[0]:.1f} s, recomputed "
          f"{out.lost_s[0]:.1f} s")
    assert abs(measured - simulated) <= tol, (measured, simulated, tol)
