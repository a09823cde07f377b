"""Which nodes a failed attempt blames (srun's task lines as Slurm 22.05/24.11 print them, node
states, the hang's stack dump, the health gate), and the bound on exclusions."""

from __future__ import annotations

from slurmpod.resilience import health, shedding
from slurmpod.resilience.shedding import Culprit

# srun with --kill-on-bad-exit --label after `kill -KILL` of task 3 (measured on the sandbox,
# Slurm 22.05.8): the killed task first, then the step's end and the tasks it terminated.
KILLED = """\
 0: iteration 12/100 | elapsed time per iteration (ms): 9.0 |
srun: error: gpu002: task 3: Killed
srun: launch/slurm: _step_signal: Terminating StepId=1.0
 0: slurmstepd-gpu001: error: *** STEP 1.0 ON gpu001 CANCELLED AT 2026-12-01T14:47:17 ***
srun: error: gpu001: tasks 0-2: Killed
srun: Force Terminated StepId=1.0
"""


def test_the_task_killed_first_is_blamed_not_those_srun_killed_after() -> None:
    assert shedding.from_srun(KILLED) == [Culprit("gpu002", "srun: task 3 Killed")]


# A node whose slurmd was killed (the fault campaign, Slurm 22.05.8): once slurmctld declares it
# DOWN (SlurmdTimeout), srun reports the node failure and the *other* node's tasks, killed by
# Slurm, before its `Terminating StepId` line; the failed node's own tasks never report.
SLURMD_KILLED = """\
 0: [2026-12-01 17:22:50.120] iteration      352/     600 | elapsed time per iteration (ms): 21.1 |
srun: error: Node failure on gpu007
srun: error: gpu005: tasks 0-7: Killed
srun: launch/slurm: _step_signal: Terminating StepId=1.3
srun: Force Terminated StepId=1.3
"""


def test_after_a_node_failure_the_tasks_slurm_killed_are_not_blamed() -> None:
    assert shedding.from_srun(SLURMD_KILLED) == [Culprit("gpu007", "srun: node failure")]
    # A task killed before the node failure is still its node's fault.
    text = "srun: error: gpu002: task 3: Killed\n" + SLURMD_KILLED
    assert [c.node for c in shedding.from_srun(text)] == ["gpu002", "gpu007"]


def test_exit_codes_and_terminated_tasks_blame_nobody() -> None:
    text = ("srun: error: gpu003: tasks 8-15: Exited with exit code 1\n"
            "srun: error: gpu001: task 0: Terminated\n")
    assert shedding.from_srun(text) == []


def test_node_failure_and_launch_failure_blame_the_node() -> None:
    text = ("srun: error: Node failure on gpu006\n"
            "srun: error: Task launch for StepId=7.2 failed on node gpu009: Communication "
            "connection failure\n")
    assert [c.node for c in shedding.from_srun(text)] == ["gpu006", "gpu009"]


def test_bad_slurm_states_of_the_jobs_nodes_only() -> None:
    sinfo = "gpu001|allocated|none\ngpu002|down|slurmpod-test\ngpu003|idle*|none\n" \
            "gpu009|drained|bad HCA\n"
    got = shedding.from_states(sinfo, ["gpu001", "gpu002", "gpu003"])
    assert got == [Culprit("gpu002", "Slurm state DOWN (slurmpod-test)"),
                   Culprit("gpu003", "Slurm state IDLE*")]


def test_the_dump_blames_stopped_ranks_and_silent_nodes() -> None:
    dump = ("slurmpod-dump: gpu001 rank 0 pid 10 state S\nslurmpod-dump: gpu001 done\n"
            "slurmpod-dump: gpu002 rank 9 pid 19 state T\nslurmpod-dump: gpu002 done\n")
    got = shedding.from_dump(dump, ["gpu001", "gpu002", "gpu003"])
    assert got == [Culprit("gpu002", "hang: rank 9 (pid 19) stopped"),
                   Culprit("gpu003", "hang: node did not answer the stack dump")]


def test_exclusions_are_bounded_by_spares_plus_a_fraction_of_the_partition() -> None:
    assert shedding.limit(spares=1, partition_nodes=1000, fraction=0.02) == 21
    culprits = [Culprit(f"gpu{i:03d}", "x") for i in range(5)]
    take, refuse = shedding.decide(culprits, already=["gpu100"], cap=3)
    assert [c.node for c in take] == ["gpu000", "gpu001"]
    assert [c.node for c in refuse] == ["gpu002", "gpu003", "gpu004"]
    # one entry per node, its evidence joined; an already excluded node is not counted again
    take, _ = shedding.decide([Culprit("a", "e1"), Culprit("a", "e2"), Culprit("b", "e")],
                              already=["b"], cap=5)
    assert take == [Culprit("a", "e1; e2")]


def test_drain_reason_cannot_escape_its_argument() -> None:
    r = shedding.drain_reason('srun: task 3 "Killed"\n; State=RESUME ' + "x" * 300)
    assert '"' not in r and "\n" not in r and len(r) <= 200 and r.startswith("slurmpod: ")


def test_exclusions_so_far_come_back_from_the_record() -> None:
    rec = shedding.record("5", 1, "gpu002", "srun: task 3 Killed", "excluded") + \
        shedding.record("5", 2, "gpu004", "limit", "not_excluded") + \
        shedding.record("6", 1, "gpu009", "other job", "excluded")
    assert shedding.excluded_so_far(rec, "5") == ["gpu002"]


def test_health_gate_output_names_failures_and_silent_nodes() -> None:
    out = ("slurmpod-health: gpu001 ok\n"
           "slurmpod-health: gpu002 fail 6 of 8 GPUs visible (CUDA_VISIBLE_DEVICES)\n")
    got = health.failed_nodes(out, ["gpu001", "gpu002", "gpu003"])
    assert got == {"gpu002": "6 of 8 GPUs visible (CUDA_VISIBLE_DEVICES)",
                   "gpu003": "no answer from the node's check (slurmd down or the check hung)"}


def test_health_check_script_runs_and_fails_a_short_node(tmp_path) -> None:
    import subprocess

    def run(visible: str, ckpt: str) -> str:
        env = {"PATH": "/usr/bin:/bin", "SLURMD_NODENAME": "gpu007",
               "CUDA_VISIBLE_DEVICES": visible}
        return subprocess.run(["bash", "-c", health.NODE_CHECK, "h", "8", "", "", ckpt, "1", ""],
                              env=env, capture_output=True, text=True, timeout=30).stdout

    assert run("0,1,2,3,4,5,6,7", str(tmp_path)) == "slurmpod-health: gpu007 ok\n"
    assert "fail 7 of 8 GPUs" in run("0,1,2,3,4,5,6", str(tmp_path))
    ro = tmp_path / "ro"
    ro.mkdir(mode=0o500)
    import os

    if os.geteuid() != 0:  # root writes anywhere
        assert "not writable" in run("0,1,2,3,4,5,6,7", str(ro / "ck"))


def test_health_check_counts_gpus_with_nvidia_smis_query_form(tmp_path) -> None:
    import subprocess

    fake = tmp_path / "nvidia-smi"
    # Real nvidia-smi answers `--query-gpu=index --format=csv,noheader` with one index a line.
    fake.write_text('#!/bin/sh\n[ "$1" = --query-gpu=index ] || exit 2\nseq 0 $((N - 1))\n')
    fake.chmod(0o755)
    for n, want in (("8", "ok"), ("6", "fail nvidia-smi lists 6 of 8 GPUs")):
        env = {"PATH": f"{tmp_path}:/usr/bin:/bin", "SLURMD_NODENAME": "gpu001", "N": n}
        out = subprocess.run(["bash", "-c", health.NODE_CHECK, "h", "8", "", "", "", "0", ""],
                             env=env, capture_output=True, text=True, timeout=30).stdout
        assert out == f"slurmpod-health: gpu001 {want}\n"
