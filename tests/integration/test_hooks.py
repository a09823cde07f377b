"""Accounting hooks on the real sandbox Slurm: live MFU in the Comment while a job runs, the final
summary in AdminComment after it ends (sacct --json), a symlinked log refused, and an
AdminComment spooled while slurmdbd is down and delivered after it restarts."""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from slurmpod.model.comment import decode_field, validate_admin_comment, validate_comment
from tests.helpers import EMU, TINY, log_iterations, wait_for


def hook_env(sandbox: Any) -> dict[str, str]:
    """The sandbox client environment, with this venv first on PATH (so the rendered script
    finds `slurmpod`) and a 1 s monitor interval instead of 180 s."""
    env = dict(sandbox.env)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["SLURMPOD_MONITOR_INTERVAL_S"] = "1"
    return env


def live_comment(sandbox: Any, job_id: str) -> tuple[str, dict[str, Any]] | None:
    """(state, Comment) once the Comment has MFU in it."""
    cp = sandbox.run(["squeue", "-h", "-j", job_id, "-o", "%T|%k"], check=False)
    state, _, text = cp.stdout.strip().partition("|")
    doc = decode_field(text)
    return (state, doc) if doc and "mfu" in doc else None


def admin_comment(sandbox: Any, job_id: str) -> dict[str, Any] | None:
    job = sandbox.sacct_job(job_id) or {}
    return decode_field((job.get("comment") or {}).get("administrator"))


def mfu_of(ms: float, comment: dict[str, Any]) -> float:
    return comment["flops_per_iter"] / (ms / 1000) / comment["gpus"] / 1e12 / comment[
        "peak_tflops"]


def test_live_mfu_in_comment_and_final_in_admin_comment(sandbox: Any) -> None:
    """The job holds after iteration 20 until the test has seen the live Comment while it runs
    (the emulator's --emu-hold-after-iteration): 40 short iterations could otherwise end before
    the monitor's first update on a busy machine."""
    d = sandbox.tmp_dir / "hooks-live"
    d.mkdir(exist_ok=True)
    release = d / "release"
    run = d / "run.toml"
    run.write_text(f"""
[job]
name = "hooks-live"
nodes = 1
time_limit = "00:10:00"
entrypoint = "{' '.join(EMU)}"
work_dir = "{d / 'hooks-live'}"

[megatron]
num_layers = 8
hidden_size = 512
num_attention_heads = 8
seq_length = 64
vocab_size = 1024
tensor_model_parallel_size = 8
micro_batch_size = 1
global_batch_size = 2
train_iters = 40
log_interval = 1
emu_hold_after_iteration = 20
emu_hold_file = "{release}"
""")
    cp = subprocess.run([sys.executable, "-m", "slurmpod", "submit", str(run), "--topo-dir", "",
                         "--json"], env=hook_env(sandbox), capture_output=True, text=True,
                        timeout=120, cwd=d, stdin=subprocess.DEVNULL)
    assert cp.returncode == 0, cp.stderr
    job_id = json.loads(cp.stdout)["job_id"]
    try:
        # Held at iteration 20, the job cannot end before the monitor has published it.
        state, live = wait_for(lambda: (lc := live_comment(sandbox, job_id)) and
                               lc[1].get("iter", 0) >= 20 and lc, 90,
                               "MFU of the held iteration in the live Comment")
    except BaseException:
        sandbox.cancel(job_id)  # leave the shared cluster idle
        raise
    finally:
        release.touch()
    assert state == "RUNNING", (state, live)  # seen while the job runs, not only at its end
    assert validate_comment(live) == []
    assert live["run"] == "hooks-live" and "token" in live  # submit-time keys preserved
    assert live["peak"] == live["peak_tflops"]
    # The monitor's figure is the median over the records it had (window of 64 > 40 here):
    # recompute it from the log lines up to the iteration it reported.
    log_text = "".join(p.read_text() for p in (d / "hooks-live" / "logs").glob("*.out"))
    seen = [ms for i, ms in log_iterations(log_text) if i <= live["iter"]]
    assert seen, log_text[-2000:]
    want = float(np.median([mfu_of(ms, live) for ms in seen]))
    assert live["mfu"] == pytest.approx(want, rel=2e-3, abs=1e-4)
    assert 0 < live["mfu"] <= 1

    sandbox.wait_job(job_id, timeout_s=180)
    final = wait_for(lambda: admin_comment(sandbox, job_id), 60, "AdminComment in sacct")
    assert validate_admin_comment(final) == [], final
    log_text = "".join(p.read_text() for p in (d / "hooks-live" / "logs").glob("*.out"))
    its = log_iterations(log_text)
    assert final["iters"] == len(its) == 40 and final["last_iter"] == 40
    # Steady state (metrics.job_metrics): records covering the first 10 iterations are warm-up.
    steady = [mfu_of(ms, live) for i, ms in its if i > 10]
    assert final["mfu"] == pytest.approx(float(np.median(steady)), rel=2e-3, abs=1e-4)
    assert final["peak"] == live["peak_tflops"] and final["gpus"] == 8
    # The peak is this CPU's, measured at `sandbox up`, and the workload is paced to it
    # (docs/workload.md): MFU can never pass 100 %, not even for one logged iteration, and the
    # job's log shows it paced to the very peak in its comment.
    assert 0 < final["mfu"] <= 1
    assert all(0 < mfu_of(ms, live) <= 1 for _, ms in its), its
    assert f"megatron_emu: emulated GPU peak {live['peak_tflops']:.4g} TFLOP/s ($SLURMPOD_SITE " \
        f"{sandbox.sb.layout.site_file})" in log_text
    assert final["src"] == "comment" and final["fv"] == live["formula"]
    rec = json.loads((sandbox.sb.spool_dir / "records" / f"{job_id}.0.json").read_text())
    assert rec["job"]["job_id"] == job_id and len(rec["series"]["iter"]) == 40
    assert decode_field(rec["admin_comment"]) == final


def test_symlinked_log_of_another_user_is_refused(sandbox: Any) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root to own a file as another user")
    d = sandbox.tmp_dir / "hooks-symlink"
    d.mkdir(exist_ok=True)
    secret = d / "other-user.log"
    secret.write_text("".join(
        f" iteration {i:8d}/      10 | elapsed time per iteration (ms): 100.0 | global batch "
        f"size:     8 | lm loss: 1.0E+00 | loss scale: 1.0 | number of skipped iterations:   0 "
        f"| number of nan iterations:   0 |\n" for i in range(1, 11)))
    os.chown(secret, 4242, 4242)
    secret.chmod(0o600)
    comment = json.dumps({"slurmpod": "it", "fmt": 1, "flops_per_iter": 1e9, "gpus": 8,
                          "peak_tflops": 1.0})
    out = d / "sym-%j.out"
    job_id = sandbox.sbatch(
        "-N1", "--exclusive", f"--output={out}", f"--comment={comment}", "--wrap",
        f"echo start; rm -f {d}/sym-$SLURM_JOB_ID.out; ln -s {secret} {d}/sym-$SLURM_JOB_ID.out")
    sandbox.wait_job(job_id, timeout_s=120)
    final = wait_for(lambda: admin_comment(sandbox, job_id), 60, "AdminComment in sacct")
    # nothing from the log; what Slurm says (the attempt, the allocation) is still recorded
    assert final["err"] == "symlink" and final["attempt"] == 0 and "iters" not in final
    rec = json.loads((sandbox.sb.spool_dir / "records" / f"{job_id}.0.json").read_text())
    assert rec["log"] == {"path": f"{d}/sym-{job_id}.out", "refused": "symlink"}
    assert rec["series"] == {} and "iters" not in rec["summary"]  # nothing of it was parsed
    hook_log = (sandbox.sb.spool_dir / "hook.log").read_text()
    assert re.search(rf"job {job_id}: log \S+ refused \(symlink\).*no data read", hook_log)


# -- slurmdbd down ------------------------------------------------------------------------------

@contextlib.contextmanager
def slurmdbd_stopped(sandbox: Any) -> Iterator[None]:
    """Stop the sandbox's slurmdbd, and start it again afterwards (same command, same port).

    Uses the Sandbox's process records; a public stop/start of one daemon would be nicer."""
    from slurmpod.fsutil import write_atomic
    from slurmpod.sandbox import procs
    from slurmpod.sandbox.prereqs import find_tools

    sb = sandbox.sb
    stop = getattr(sb, "stop_daemon", None)
    start = getattr(sb, "start_daemon", None)
    if stop is not None and start is not None:
        stop("slurmdbd")
        try:
            yield
        finally:
            start("slurmdbd")
        return
    rec = next(r for r in sb._records if r.name == "slurmdbd")
    procs.stop([rec])
    try:
        yield
    finally:
        sb._records = [r for r in sb._records if r is not rec]
        sb._launch("slurmdbd", [find_tools()["slurmdbd"], "-D"], sb.layout.logfile("slurmdbd"))
        state = json.loads(sb.layout.state_file.read_text())
        state["processes"] = [r.to_dict() for r in sb._records]
        write_atomic(sb.layout.state_file, json.dumps(state, indent=2) + "\n")
        port = int(state["ports"]["slurmdbd"])
        wait_for(lambda: procs.can_connect(port), 30, "slurmdbd to listen again")


def test_admin_comment_spooled_while_slurmdbd_down_then_delivered(sandbox: Any) -> None:
    d = sandbox.tmp_dir / "hooks-dbd"
    d.mkdir(exist_ok=True)
    comment = json.dumps({"slurmpod": "it", "fmt": 1, "flops_per_iter": 2.0e9, "gpus": 1,
                          "peak_tflops": 0.05})
    emu = " ".join([*EMU, *TINY, "--train-iters", "15"])
    job_id = sandbox.sbatch("-N1", "--exclusive", f"--output={d}/dbd-%j.out",
                            f"--comment={comment}", "--wrap",
                            f"sleep 2; env RANK=0 WORLD_SIZE=1 LOCAL_RANK=0 {emu}")
    sandbox.wait_running(job_id)
    spool = sandbox.sb.spool_dir
    pending = spool / "pending" / f"{job_id}.admin_comment.json"
    with slurmdbd_stopped(sandbox):
        wait_for(lambda: sandbox.squeue_state(job_id) in ("", "COMPLETED"), 120, "the job to end")
        wait_for(lambda: f"job {job_id}: admin comment queued" in (spool / "hook.log").read_text(),
                 60, "the epilog to queue the AdminComment")
        queued = json.loads(pending.read_text())
        assert queued["job_id"] == job_id and "mfu" in decode_field(queued["value"])
        assert admin_comment_from_db_fails(sandbox)
    # slurmdbd is back: `slurmpod hook flush` delivers (slurmctld may still be replaying the
    # job's records into slurmdbd, so "Nothing modified" keeps it pending for the next try).
    env = hook_env(sandbox)

    def flushed() -> bool:
        subprocess.run([sys.executable, "-m", "slurmpod", "hook", "flush", "--spool", str(spool),
                        "--json"], env=env, capture_output=True, text=True, timeout=60,
                       stdin=subprocess.DEVNULL)
        return not pending.exists()

    wait_for(flushed, 90, "hook flush to deliver the queued AdminComment")
    final = wait_for(lambda: admin_comment(sandbox, job_id), 60, "AdminComment in sacct")
    assert final == decode_field(queued["value"])
    assert validate_admin_comment(final) == [] and final["iters"] == 15


def admin_comment_from_db_fails(sandbox: Any) -> bool:
    """With slurmdbd down, sacct cannot answer at all (so nothing was delivered behind our back)."""
    cp = sandbox.run(["sacct", "--json", "-j", "1"], check=False, timeout_s=60)
    return cp.returncode != 0 or not json.loads(cp.stdout or "{}").get("jobs")
