"""`slurmpod submit` on the real sandbox Slurm: whole nodes, 8 tasks per node with the NCCL
environment in every task, placement in the fewest SUs, requeue resuming from the checkpoint,
no duplicate submission on retry, exit 3 before anything is queued."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.helpers import EMU, wait_for


def write_run(path: Path, name: str, nodes: int, *, tp: int = 8, train_iters: int = 6,
              hidden: int = 128, seq: int = 64, extra: str = "", job_extra: str = "") -> Path:
    path.write_text(f"""
[job]
name = "{name}"
nodes = {nodes}
time_limit = "00:10:00"
entrypoint = "{' '.join(EMU)}"
work_dir = "{path.parent / name}"
{job_extra}

[megatron]
num_layers = 4
hidden_size = {hidden}
num_attention_heads = 8
seq_length = {seq}
vocab_size = 1024
tensor_model_parallel_size = {tp}
micro_batch_size = 1
global_batch_size = {nodes * 8 // tp * 2}
train_iters = {train_iters}
log_interval = 1
emu_report_env = true
{extra}
""")
    return path


def slurmpod(sandbox: Any, *args: str, timeout_s: float = 120
             ) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "slurmpod", *args], env=sandbox.env,
                          capture_output=True, text=True, timeout=timeout_s,
                          cwd=sandbox.tmp_dir, stdin=subprocess.DEVNULL)


def submit_json(sandbox: Any, run: Path, *args: str) -> dict[str, Any]:
    cp = slurmpod(sandbox, "submit", str(run), "--topo-dir", "", "--json", *args)
    assert cp.returncode == 0, cp.stderr
    return json.loads(cp.stdout)


def log_of(run_dir: Path) -> str:
    return "".join(p.read_text() for p in sorted((run_dir / "logs").glob("*.out")))


def sus_of(sandbox: Any, nodes: list[str]) -> set[int]:
    by_name = sandbox.inventory.by_name
    return {by_name[n].su for n in nodes}


def test_two_su_job_runs_8_tasks_per_node_with_nccl_env(sandbox: Any, tmp_path: Path) -> None:
    d = sandbox.tmp_dir / "two-su"
    d.mkdir(exist_ok=True)
    run = write_run(d / "run.toml", "two-su", 8)
    res = submit_json(sandbox, run, "--wait")
    jid = res["job_id"]
    assert res["min_sus"] == 2
    assert len(res["sus"]) == 2, res  # 8 nodes of 4-node SUs: exactly two SUs
    sandbox.wait_job(jid, timeout_s=180)
    log = log_of(d / "two-su")
    ranks = re.findall(r"megatron_emu: rank (\d+)/64 node (\S+) local_rank (\d+) (.*)", log)
    assert sorted(int(r[0]) for r in ranks) == list(range(64)), log[-2000:]
    per_node: dict[str, int] = {}
    for _rank, node, _local, env in ranks:
        per_node[node] = per_node.get(node, 0) + 1
        assert "NCCL_IB_HCA==mlx5_0,mlx5_1,mlx5_2,mlx5_3,mlx5_4,mlx5_5,mlx5_6,mlx5_7" in env
        assert "CUDA_DEVICE_MAX_CONNECTIONS=1" in env
        assert "NCCL_SOCKET_IFNAME==ibp24s0" in env
        assert "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True" in env
    assert sorted(per_node.values()) == [8] * 8
    assert sus_of(sandbox, sorted(per_node)) == sus_of(sandbox, sandbox.nodes_of(jid))
    assert "training complete" in log
    # The #SBATCH --comment reached Slurm intact (JSON with our token).
    comment = sandbox.run(["squeue", "-h", "-j", jid, "-o", "%k"], check=False).stdout.strip()
    if comment:  # still known to the controller
        assert json.loads(comment)["token"] == res["token"]


def test_job_that_fits_one_su_lands_in_one_su(sandbox: Any) -> None:
    # Fragment the cluster: one busy node in su1 and one in su2.
    blockers = [sandbox.sbatch("-N1", "--exclusive", f"--nodelist={n}", "--wrap", "sleep 60")
                for n in ("gpu001", "gpu005")]
    try:
        for b in blockers:
            sandbox.wait_running(b)
        d = sandbox.tmp_dir / "one-su"
        d.mkdir(exist_ok=True)
        run = write_run(d / "run.toml", "one-su", 4, train_iters=3)
        res = submit_json(sandbox, run, "--wait")
        assert res["min_sus"] == 1
        assert len(res["sus"]) == 1, res
        nodes = sandbox.nodes_of(res["job_id"])
        assert len(nodes) == 4 and len(sus_of(sandbox, nodes)) == 1
        sandbox.wait_job(res["job_id"], timeout_s=120)
    finally:
        sandbox.cancel(*blockers)


def test_requeue_mid_run_resumes_from_last_checkpoint(sandbox: Any) -> None:
    d = sandbox.tmp_dir / "requeue"
    d.mkdir(exist_ok=True)
    # About half a second per iteration on a CI core: the requeue lands mid-run.
    run = write_run(d / "run.toml", "requeue", 2, train_iters=30, tp=8, hidden=512, seq=256,
                    extra="save_interval = 1000")
    res = submit_json(sandbox, run, "--wait")
    jid, run_dir = res["job_id"], d / "requeue"
    its = re.compile(r"iteration\s+(\d+)/\s*30 ")
    wait_for(lambda: len(its.findall(log_of(run_dir))) >= 5, 120, "five iterations")
    sandbox.run(["scontrol", "requeue", jid])
    # Slurm holds a requeued batch job back for its credential lifetime (about 2 minutes);
    # let it start again at once.
    wait_for(lambda: sandbox.squeue_state(jid) == "PENDING", 60, "the requeue")
    sandbox.release_requeued(jid)
    wait_for(lambda: "restart 1 on" in log_of(run_dir), 180, "the restarted job")
    wait_for(lambda: "training complete" in log_of(run_dir), 240, "the resumed run to finish")
    log = log_of(run_dir)
    first, second = log.split("restart 1 on", 1)
    saved = [int(m) for m in re.findall(r"successfully saved checkpoint from iteration\s+(\d+)",
                                        first)]
    assert saved, first[-2000:]
    resumed = [int(m) for m in its.findall(second)]
    assert resumed[0] == saved[-1] + 1, (saved, resumed[:3])
    assert resumed[-1] == 30
    wait_for(lambda: sandbox.squeue_state(jid) in ("", "COMPLETED"), 60, "the job to end")


# The script's fallback when the hard limit came first (templates/sbatch, on_slurm_signal).
NO_WARNING = "time limit reached before the warning"


def _time_limited_run(sandbox: Any, name: str) -> tuple[Path, str, str, dict[str, Any]]:
    """A 4-minute job that trains past its limit, requeued by its script and released: (run
    dir, the log before and after the restart line, submit's JSON)."""
    d = sandbox.tmp_dir / name
    d.mkdir(exist_ok=True)
    # exit_duration_in_mins set high so the signal, not Megatron's own timer, ends the run.
    run = write_run(d / "run.toml", name, 1, train_iters=1_000_000, hidden=512, seq=256,
                    extra="save_interval = 1000000\nexit_duration_in_mins = 100",
                    job_extra='time_limit = "00:04:00"')
    text = (d / "run.toml").read_text().replace('time_limit = "00:10:00"\n', "")
    (d / "run.toml").write_text(text)
    res = submit_json(sandbox, run, "--wait", "--max-restarts", "0")
    jid, run_dir = res["job_id"], d / name
    try:
        wait_for(lambda: sandbox.squeue_state(jid) == "PENDING", 330, "the requeue")
        sandbox.release_requeued(jid)
        its = re.compile(r"iteration\s+(\d+)/")

        def resumed() -> bool:  # one read: the restart line and two iterations after it
            _, mark, after = log_of(run_dir).partition("restart 1 on")
            return bool(mark) and len(its.findall(after)) >= 2

        wait_for(resumed, 120, "the resumed run")
        first, second = log_of(run_dir).split("restart 1 on", 1)
        return run_dir, first, second, res
    finally:
        sandbox.cancel(jid)


def test_time_limit_signal_saves_then_requeues_and_resumes(sandbox: Any) -> None:
    """The real --signal=B:USR2@lead path: a 4-minute job's shell is warned 60 s before its
    limit, the trainer saves, the script requeues the job, the next run continues from the
    save, and the segment costs no restart (--max-restarts 0).

    slurmctld sends the warning from its 30 s periodic time-limit check (Slurm 22.05-24.11
    job_mgr.c send_job_warn_signal); on a loaded 2-core CI machine it has, rarely, not reached
    the shell before the limit, and the script then requeued the job through its fallback
    (NO_WARNING; the run resumed, which this checks). Only then is the run repeated once: the
    warning path must work on one of two tries."""
    run_dir, first, second, res = _time_limited_run(sandbox, "timelimit")
    if NO_WARNING in first and "asking the trainer to save" not in first:
        # The fallback says "requeueing" before it requeues (once requeued, Slurm may end the
        # shell): the attempt ended as a time limit, and the helper saw the run resume.
        assert f"{NO_WARNING}; requeueing" in first
        ends = [json.loads(line) for line in (run_dir / ".slurmpod" / "attempts.jsonl")
                .read_text().splitlines() if '"event":"end"' in line]
        assert ends[0]["end"] == "timelimit", ends
        run_dir, first, second, res = _time_limited_run(sandbox, "timelimit-again")
    # A 60 s lead (a quarter of the limit): slurmctld acts on time limits from a periodic
    # check, and on a busy controller a 30 s lead left the trainer no time to save.
    assert "#SBATCH --signal=B:USR2@60" in Path(res["script"]).read_text()
    its = re.compile(r"iteration\s+(\d+)/")
    assert "asking the trainer to save" in first and "requeueing (timelimit" in first, \
        "".join(ln for ln in first.splitlines(keepends=True) if " iteration " not in ln)
    ends = [json.loads(line) for line in (run_dir / ".slurmpod" / "attempts.jsonl")
            .read_text().splitlines() if '"event":"end"' in line]
    assert ends[0]["end"] == "timelimit" and ends[0]["failures"] == 0, ends
    saved = re.findall(r"successfully saved checkpoint from iteration\s+(\d+)", first)
    assert saved and int(its.findall(second)[0]) == int(saved[-1]) + 1


def test_hot_spare_allocated_but_not_used(sandbox: Any) -> None:
    d = sandbox.tmp_dir / "spare"
    d.mkdir(exist_ok=True)
    run = write_run(d / "run.toml", "spare", 1, train_iters=3)
    res = submit_json(sandbox, run, "--spares", "1", "--wait")
    jid = res["job_id"]
    wait_for(lambda: "training complete" in log_of(d / "spare"), 120, "the job")
    allocated = sandbox.nodes_of(jid)
    ranks = re.findall(r"megatron_emu: rank (\d+)/8 node (\S+)", log_of(d / "spare"))
    assert len(allocated) == 2 and len(ranks) == 8
    assert {node for _, node in ranks} == {allocated[0]}  # the spare stood by


def test_chain_of_singletons_stops_when_training_is_done(sandbox: Any) -> None:
    d = sandbox.tmp_dir / "chain"
    d.mkdir(exist_ok=True)
    run = write_run(d / "run.toml", "chain", 1, train_iters=3)
    res = submit_json(sandbox, run, "--chain", "2")
    first, second = res["job_ids"]
    wait_for(lambda: "nothing left to train" in log_of(d / "chain"), 180, "the second job")
    log = log_of(d / "chain")
    # The second job started only after the first had finished, then found the work done.
    assert log.index("training complete") < log.index(f"job {second} run chain")
    assert f"job {first} run chain" in log


def test_retry_does_not_submit_twice(sandbox: Any) -> None:
    d = sandbox.tmp_dir / "idem"
    d.mkdir(exist_ok=True)
    run = write_run(d / "run.toml", "idem", 1, train_iters=200)
    a = submit_json(sandbox, run)
    b = submit_json(sandbox, run)
    try:
        assert b["reused"] is True and b["job_ids"] == a["job_ids"]
        names = sandbox.run(["squeue", "-h", "-n", "idem", "-o", "%i"]).stdout.split()
        assert names == a["job_ids"]
    finally:
        sandbox.cancel(*a["job_ids"])


def test_invalid_plan_exits_3_and_queues_nothing(sandbox: Any) -> None:
    d = sandbox.tmp_dir / "bad"
    d.mkdir(exist_ok=True)
    run = write_run(d / "run.toml", "bad-plan", 2, tp=3)  # 8 heads not divisible by TP=3
    cp = slurmpod(sandbox, "submit", str(run))
    assert cp.returncode == 3, cp.stderr
    assert cp.stderr.startswith("slurmpod: error:") and "Traceback" not in cp.stderr
    assert sandbox.run(["squeue", "-h", "-n", "bad-plan"]).stdout.strip() == ""
    assert not (d / "bad-plan").exists()


def test_slurm_down_is_one_line_exit_4(sandbox: Any, tmp_path: Path) -> None:
    d = tmp_path
    run = write_run(d / "run.toml", "nowhere", 1)
    conf = tmp_path / "slurm.conf"
    conf.write_text(sandbox.etc("slurm.conf").replace(
        re.search(r"SlurmctldPort=\S+", sandbox.etc("slurm.conf")).group(0),  # type: ignore
        "SlurmctldPort=1"))
    env = {**sandbox.env, "SLURM_CONF": str(conf)}
    cp = subprocess.run([sys.executable, "-m", "slurmpod", "submit", str(run), "--topo-dir", ""],
                        env=env, capture_output=True, text=True, timeout=120,
                        stdin=subprocess.DEVNULL)
    assert cp.returncode == 4, cp.stderr
    lines = [ln for ln in cp.stderr.splitlines() if ln.startswith("slurmpod: error:")]
    # The first command that needs slurmctld names it: scontrol (the partition's MaxTime,
    # checked before queueing) or sbatch.
    assert len(lines) == 1 and re.search(r"\b(scontrol|sbatch)\b", lines[0]), lines
    assert "Unable to contact slurm controller" in lines[0]
