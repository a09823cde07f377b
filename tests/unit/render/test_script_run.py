"""Run rendered scripts under bash with stand-ins for srun/scontrol/sinfo and the trainer.

Hostile values (quotes, `$()`, `;`, newlines) in the run spec must reach the trainer's argv and
environment exactly; the auto-resume logic must requeue (bounded by SLURM_RESTART_COUNT),
forward SIGTERM, skip finished runs and route around failed nodes when spares exist.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from slurmpod.config import builtin_site_path, load_site
from slurmpod.megatron.runspec import run_from_dict
from slurmpod.render.sbatch import PlanFacts, RenderOptions, build_context, render_script

SITE = load_site(builtin_site_path("sandbox"))

SRUN = r"""#!/bin/bash
printf '%s\0' "$@" > "$STUB_DIR/srun.args"
echo $$ > "$STUB_DIR/srun.pid"
while [ $# -gt 0 ] && [[ "$1" == --* ]]; do shift; done
export SLURM_NTASKS=2 SLURM_NTASKS_PER_NODE=2
pids=()
for t in 0 1; do SLURM_PROCID=$t SLURM_LOCALID=$t "$@" & pids+=($!); done
trap 'kill -TERM "${pids[@]}" 2>/dev/null' TERM
rc=0
for p in "${pids[@]}"; do
  while :; do
    wait "$p"; r=$?
    if [ $r -gt 128 ] && kill -0 "$p" 2>/dev/null; then continue; fi
    break
  done
  [ $r -ne 0 ] && rc=$r
done
exit $rc
"""
SCONTROL = r"""#!/bin/bash
echo "$*" >> "$STUB_DIR/scontrol.log"
restarts=${STUB_RESTARTS:-${SLURM_RESTART_COUNT:-0}}
state=${STUB_JOB_STATE:-RUNNING}
# STUB_REQUEUE_LOST: slurmctld takes the first requeue but scontrol dies before it replies.
if [ -e "$STUB_DIR/requeued" ]; then restarts=$((restarts + 1)); state=PENDING; fi
case "$1 $2" in
  "show hostnames") printf 'gpu001\ngpu002\ngpu003\n' ;;
  "show node") echo "NodeName=$3 Arch=x86_64 NodeAddr=10.0.0.${3: -1} NodeHostName=$3" ;;
  "show job") echo "JobId=4242 JobName=stub JobState=$state" \
      "Reason=${STUB_REASON:-None} Restarts=$restarts" \
      "PreemptTime=${STUB_PREEMPT:-None} NodeList=gpu[001-003] BatchHost=gpu001" ;;
  "requeue 4242")
    if [ -n "${STUB_REQUEUE_LOST:-}" ]; then
      [ "$state" = PENDING ] && { echo "Job is pending execution for job 4242" >&2; exit 1; }
      touch "$STUB_DIR/requeued"; exit 143
    fi
    if [ -n "${STUB_REQUEUE_REFUSED:-}" ]; then
      echo "Requested operation is presently disabled for job 4242" >&2; exit 1
    fi ;;
esac
exit 0
"""
SCANCEL = r"""#!/bin/bash
# Like `scancel --signal=TERM JOB`: the step's tasks get the signal (through the srun stand-in).
echo "$*" >> "$STUB_DIR/scancel.log"
kill -TERM "$(cat "$STUB_DIR/srun.pid")"
"""
SINFO = r"""#!/bin/bash
printf '%s\n' ${STUB_BAD_NODES:-}
"""
TRAINER = r"""#!/bin/bash
printf '%s\0' "$@" > "$STUB_DIR/argv.$RANK"
env -0 > "$STUB_DIR/env.$RANK"
save=""; iters=""
while [ $# -gt 0 ]; do
  case "$1" in --save) save="$2"; shift ;; --train-iters) iters="$2"; shift ;; esac
  shift
done
case "${STUB_MODE:-done}" in
  done) [ "$RANK" = 0 ] && echo "$iters" > "$save/latest_checkpointed_iteration.txt"; exit 0 ;;
  fail) exit 7 ;;
  fail_trained)  # an iteration in the job's log, then a crash without a new checkpoint
    echo " [x] iteration        1/       5 | elapsed" >> "$save/../logs/stub-$SLURM_JOB_ID.out"
    exit 7 ;;
  fail_progress)  # a new checkpoint, then a crash
    [ "$RANK" = 0 ] && echo "$(( $(cat "$save/latest_checkpointed_iteration.txt" 2>/dev/null \
                                  || echo 0) + 1 ))" > "$save/latest_checkpointed_iteration.txt"
    exit 7 ;;
  term)
    on_term() {
      echo term > "$STUB_DIR/term.$RANK"
      [ "$RANK" = 0 ] && echo 3 > "$save/latest_checkpointed_iteration.txt"
      exit 0
    }
    trap on_term TERM
    touch "$STUB_DIR/started.$RANK"
    for _ in $(seq 200); do sleep 0.05; done; exit 3 ;;
esac
"""


def _stubs(tmp: Path) -> Path:
    bin_dir = tmp / "bin"
    bin_dir.mkdir(exist_ok=True)
    for name, text in (("srun", SRUN), ("scontrol", SCONTROL), ("sinfo", SINFO),
                       ("scancel", SCANCEL), ("trainer", TRAINER)):
        p = bin_dir / name
        p.write_text(text)
        p.chmod(0o755)
    return bin_dir


def _render(tmp: Path, job: dict[str, Any] | None = None, megatron: dict[str, Any] | None = None,
            **opts: Any) -> Path:
    bin_dir = _stubs(tmp)
    mg = {"num_layers": 2, "hidden_size": 64, "num_attention_heads": 4, "seq_length": 32,
          "vocab_size": 100, "tensor_model_parallel_size": 2, "train_iters": 5,
          **(megatron or {})}
    run = run_from_dict({"job": {"name": "stub", "nodes": 2,
                                 "entrypoint": shlex.quote(str(bin_dir / "trainer")),
                                 **(job or {})}, "megatron": mg}, "run.toml")
    plan = PlanFacts(nodes=2, gpus_per_node=8, min_sus=1, min_blocks=1,
                     flops_per_iteration=1.0, peak_tflops=1.0, formula="t")
    o = {"run_dir": str(tmp / "run"), "topo_dir": "", "monitor": False, **opts}
    script = tmp / "job.sbatch"
    script.write_text(render_script(build_context(run, SITE, plan, RenderOptions(**o))))
    return script


def _env(tmp: Path, **extra: str) -> dict[str, str]:
    return {"PATH": f"{tmp / 'bin'}:/usr/bin:/bin", "STUB_DIR": str(tmp), "HOME": str(tmp),
            "SLURM_JOB_ID": "4242", "SLURM_JOB_NODELIST": "gpu[001-003]", **extra}


def _run(tmp: Path, script: Path, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", str(script)], env=_env(tmp, **env), capture_output=True,
                          text=True, timeout=60, cwd=tmp)


def _nul_list(path: Path) -> list[str]:
    return path.read_bytes().decode().split("\0")[:-1]


def _requeued(tmp: Path) -> bool:
    log = tmp / "scontrol.log"
    return log.exists() and "requeue 4242" in log.read_text()


# Shell metacharacters drawn often, plus any other character now and then.
_META = st.sampled_from([*"'\"$`\\;&|<>(){}[] \n\t*?!#~%=-", "$(id)", "${X}", "é", "✓"])
NASTY = st.one_of(
    st.sampled_from(["", "$(touch pwned)", "a'b", 'a"b', "`id`", "x;y", "l1\nl2", "\\", "-x"]),
    st.lists(st.one_of(_META, st.characters(blacklist_characters="\x00",
                                            blacklist_categories=("Cs",))),
             max_size=25).map("".join),
)
PATHY = st.text(alphabet=st.characters(blacklist_characters="/\x00",
                                       blacklist_categories=("Cs", "Cc")), min_size=1,
                max_size=20)


@given(arg=NASTY, env_value=NASTY, mounts=NASTY, run_suffix=PATHY)
@settings(max_examples=25, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_hostile_values_reach_trainer_exactly(tmp_path_factory: Any, arg: str, env_value: str,
                                              mounts: str, run_suffix: str) -> None:
    tmp = tmp_path_factory.mktemp("hostile")
    run_dir = tmp / f"r-{run_suffix}"
    script = _render(tmp, job={"env": {"MY_VALUE": env_value}},
                     megatron={"data_path": arg, "tokenizer_type": "x'y\"z"},
                     run_dir=str(run_dir), run_env={"OTHER": mounts})
    proc = _run(tmp, script)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for rank in ("0", "1"):
        argv = _nul_list(tmp / f"argv.{rank}")
        assert argv[argv.index("--data-path") + 1] == arg
        assert argv[argv.index("--tokenizer-type") + 1] == "x'y\"z"
        assert argv[argv.index("--save") + 1] == f"{run_dir}/checkpoints"
        env = dict(e.split("=", 1) for e in _nul_list(tmp / f"env.{rank}"))
        assert env["MY_VALUE"] == env_value and env["OTHER"] == mounts
        assert env["RANK"] == rank and env["LOCAL_RANK"] == rank and env["WORLD_SIZE"] == "2"
        assert env["NCCL_IB_HCA"].startswith("=mlx5_0,")
        assert env["SLURMPOD_NUMA_NODE"] == "0"  # GPUs 0 and 1 sit on NUMA node 0
    assert (run_dir / "checkpoints" / "latest_checkpointed_iteration.txt").read_text() == "5\n"


def test_finished_run_exits_zero_without_requeue(tmp_path: Path) -> None:
    proc = _run(tmp_path, _render(tmp_path))
    assert proc.returncode == 0, proc.stderr
    assert "training complete" in proc.stdout and not _requeued(tmp_path)
    env = dict(e.split("=", 1) for e in _nul_list(tmp_path / "env.0"))
    assert env["MASTER_ADDR"] == "10.0.0.1" and env["MASTER_PORT"] == str(20000 + 4242)


def _ends(tmp: Path) -> list[dict[str, Any]]:
    path = tmp / "run" / ".slurmpod" / "attempts.jsonl"
    lines = [json.loads(x) for x in path.read_text().splitlines()]
    return [x for x in lines if x["event"] == "end"]


def test_failures_without_progress_use_the_budget(tmp_path: Path) -> None:
    # A failed step is restarted inside the allocation (no requeue) while the budget lasts.
    script = _render(tmp_path, max_restarts=1)
    proc = _run(tmp_path, script, STUB_MODE="fail_trained")
    assert proc.returncode == 7 and not _requeued(tmp_path), proc.stderr
    assert "restarting inside the allocation" in proc.stderr
    assert "failure budget (1) used up" in proc.stderr
    assert [(e["end"], e["failures"], e["attempt"], e["restart"]) for e in _ends(tmp_path)] == \
        [("failure", 1, 1, 0), ("failure", 2, 2, 0)]


def test_failure_after_progress_costs_no_restart(tmp_path: Path) -> None:
    # Each attempt saves one more iteration, then crashes: restarted in place until done.
    script = _render(tmp_path, max_restarts=0)
    proc = _run(tmp_path, script, STUB_MODE="fail_progress")
    assert proc.returncode == 0 and not _requeued(tmp_path), proc.stderr
    ends = _ends(tmp_path)
    assert [e["end"] for e in ends] == ["failure"] * 4 + ["completed"]
    assert all(e["progress"] for e in ends) and ends[-1]["failures"] == 0


def test_same_failure_before_training_fails_fast(tmp_path: Path) -> None:
    script = _render(tmp_path, max_restarts=5)
    proc = _run(tmp_path, script, STUB_MODE="fail")
    assert proc.returncode == 7, proc.stderr
    assert "died before training" in proc.stderr and not _requeued(tmp_path)
    assert [e["end"] for e in _ends(tmp_path)] == ["failure", "failure"]


def test_already_finished_checkpoint_skips_launch(tmp_path: Path) -> None:
    script = _render(tmp_path)
    ck = tmp_path / "run" / "checkpoints"
    ck.mkdir(parents=True)
    (ck / "latest_checkpointed_iteration.txt").write_text("5\n")
    proc = _run(tmp_path, script)
    assert proc.returncode == 0 and "nothing left to train" in proc.stdout
    assert not (tmp_path / "srun.args").exists()


def _start(tmp: Path, script: Path, **env: str) -> subprocess.Popen[str]:
    proc = subprocess.Popen(["bash", str(script)], env=_env(tmp, STUB_MODE="term", **env),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp)
    deadline = time.monotonic() + 20
    while not all((tmp / f"started.{r}").exists() for r in "01"):
        assert time.monotonic() < deadline, "trainer never started"
        time.sleep(0.05)
    return proc


def test_time_limit_warning_saves_and_requeues_free(tmp_path: Path) -> None:
    proc = _start(tmp_path, _render(tmp_path, max_restarts=0))
    proc.send_signal(signal.SIGUSR2)  # what --signal=B:USR2@lead delivers to the batch shell
    out, err = proc.communicate(timeout=30)
    assert "asking the trainer to save" in err
    assert (tmp_path / "scancel.log").read_text() == "--signal=TERM 4242\n"
    assert (tmp_path / "term.0").exists() and (tmp_path / "term.1").exists()
    assert _requeued(tmp_path) and proc.returncode == 0, out + err
    ck = tmp_path / "run" / "checkpoints" / "latest_checkpointed_iteration.txt"
    assert ck.read_text() == "3\n"
    [end] = _ends(tmp_path)
    assert (end["end"], end["failures"], end["progress"]) == ("timelimit", 0, True)


def test_scancel_ends_the_run_without_requeue(tmp_path: Path) -> None:
    # scancel: Slurm marks the job COMPLETING, then sends SIGTERM to the shell and the steps.
    proc = _start(tmp_path, _render(tmp_path), STUB_JOB_STATE="COMPLETING")
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=30)
    assert not _requeued(tmp_path), out + err
    assert "--signal=KILL 4242" in (tmp_path / "scancel.log").read_text()
    assert [e["end"] for e in _ends(tmp_path)] == ["cancelled"]


def test_save_on_cancel_lets_the_trainer_save(tmp_path: Path) -> None:
    proc = _start(tmp_path, _render(tmp_path, save_on_cancel=True), STUB_JOB_STATE="COMPLETING")
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=30)
    assert not _requeued(tmp_path)
    assert "--signal=KILL" not in (tmp_path / "scancel.log").read_text() \
        if (tmp_path / "scancel.log").exists() else True


def _hard_time_limit(tmp: Path, **env: str) -> tuple[subprocess.Popen[str], str, str]:
    """The limit came before the warning: Slurm ends the job TIMEOUT (Reason=TimeLimit) and
    would not requeue it; SIGTERM reaches the shell."""
    proc = _start(tmp, _render(tmp, max_restarts=0), STUB_JOB_STATE="COMPLETING",
                  STUB_REASON="TimeLimit", **env)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=30)
    return proc, out, err


def test_hard_time_limit_requeues_from_the_trap(tmp_path: Path) -> None:
    proc, out, err = _hard_time_limit(tmp_path)
    assert _requeued(tmp_path) and proc.returncode == 0, out + err
    assert (tmp_path / "scontrol.log").read_text().count("requeue 4242") == 1
    [end] = _ends(tmp_path)
    assert (end["end"], end["failures"]) == ("timelimit", 0)


def test_a_requeue_whose_reply_is_lost_counts_as_done(tmp_path: Path) -> None:
    # Slurm's SIGTERM reaches every process of the batch step: an scontrol in flight can die
    # after slurmctld took the requeue, and asking again fails "Job is pending execution".
    proc, out, err = _hard_time_limit(tmp_path, STUB_REQUEUE_LOST="1")
    assert proc.returncode == 0 and "requeue failed" not in err, out + err
    assert "time limit reached before the warning; requeueing" in err
    [end] = _ends(tmp_path)
    assert (end["end"], end["failures"]) == ("timelimit", 0)


def test_a_requeue_that_slurm_refuses_fails_the_job(tmp_path: Path) -> None:
    # JobRequeue=0 (or --no-requeue): no requeue, and the job must not claim one.
    proc, out, err = _hard_time_limit(tmp_path, STUB_REQUEUE_REFUSED="1")
    assert proc.returncode != 0 and "scontrol requeue failed" in err, out + err
    assert "Requested operation is presently disabled" in err
    assert "requeued" not in err.replace("requeue failed", "")


def test_admin_requeue_is_left_to_slurm(tmp_path: Path) -> None:
    proc = _start(tmp_path, _render(tmp_path), STUB_JOB_STATE="COMPLETING", STUB_RESTARTS="1")
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=30)
    assert not _requeued(tmp_path) and proc.returncode == 0
    assert [e["end"] for e in _ends(tmp_path)] == ["requeued"]


def _signal_steps(tmp: Path) -> None:
    os.kill(int((tmp / "srun.pid").read_text()), signal.SIGTERM)


def test_preempted_steps_save_and_the_job_requeues_free(tmp_path: Path) -> None:
    # Preemption with GraceTime (Slurm 22.05): SIGTERM to the steps only, PreemptTime set.
    proc = _start(tmp_path, _render(tmp_path, max_restarts=0),
                  STUB_PREEMPT="2026-12-01T11:38:17")
    _signal_steps(tmp_path)
    out, err = proc.communicate(timeout=30)
    assert _requeued(tmp_path) and proc.returncode == 0, out + err
    [end] = _ends(tmp_path)
    assert (end["end"], end["failures"]) == ("preempted", 0)


def test_user_signal_to_the_steps_is_a_cancel(tmp_path: Path) -> None:
    # scancel --signal=TERM JOBID: the steps only, the job stays RUNNING; it saves and stops.
    proc = _start(tmp_path, _render(tmp_path))
    _signal_steps(tmp_path)
    out, err = proc.communicate(timeout=30)
    assert not _requeued(tmp_path), out + err
    assert (tmp_path / "scancel.log").read_text().splitlines()[-1] == "4242"
    assert [e["end"] for e in _ends(tmp_path)] == ["cancelled"]


def test_spares_skip_failed_nodes(tmp_path: Path) -> None:
    script = _render(tmp_path, spares=1)
    proc = _run(tmp_path, script, STUB_BAD_NODES="gpu001")
    assert proc.returncode == 0, proc.stderr
    args = _nul_list(tmp_path / "srun.args")
    assert "--nodelist=gpu002,gpu003" in args
    env = dict(e.split("=", 1) for e in _nul_list(tmp_path / "env.0"))
    assert env["MASTER_ADDR"] == "10.0.0.2"


def test_cpu_bind_slurm_passes_locality_map(tmp_path: Path) -> None:
    script = _render(tmp_path, cpu_bind="slurm")
    assert _run(tmp_path, script).returncode == 0
    assert "--cpu-bind=map_ldom:0,0,0,0,1,1,1,1" in _nul_list(tmp_path / "srun.args")
    assert os.path.exists(tmp_path / "argv.1")


# A stand-in for pyxis (a SPANK plugin, not packaged in Debian, so neither this test nor the
# sandbox can run the real one): it reads the --container-* options as pyxis 0.11+ does,
# refuses a mount whose source is missing (enroot-mount fails unless `nofail`), starts the tasks
# in --container-workdir and tells the trainer which paths the container can see.
PYXIS_SRUN = r"""#!/bin/bash
printf '%s\0' "$@" > "$STUB_DIR/srun.args"
echo $$ > "$STUB_DIR/srun.pid"
mounts="" workdir=""
while [ $# -gt 0 ] && [[ "$1" == --* ]]; do
  case "$1" in
    --container-image=*) [[ "${1#*=}" == *'#'* ]] || { echo "enroot: bad image $1" >&2; exit 1; } ;;
    --container-mounts=*) mounts="${1#*=}" ;;
    --container-workdir=*) workdir="${1#*=}" ;;
  esac
  shift
done
visible=""
IFS=, read -r -a entries <<< "$mounts"
for m in "${entries[@]}"; do
  IFS=: read -r src dst flags <<< "$m"
  if [ ! -e "$src" ] && [[ "+$flags+" != *+nofail+* ]]; then
    echo "enroot-mount: failed to mount: $src at $dst: No such file or directory" >&2; exit 1
  fi
  [ "$src" = "$dst" ] || { echo "stand-in: only same-path mounts expected: $m" >&2; exit 1; }
  visible+="$dst"$'\n'
done
export STUB_VISIBLE="$visible" SLURM_NTASKS=2 SLURM_NTASKS_PER_NODE=2
cd "$workdir" || exit 1
for t in 0 1; do SLURM_PROCID=$t SLURM_LOCALID=$t "$@" & done
rc=0
for p in $(jobs -p); do wait "$p" || rc=$?; done
exit $rc
"""
CONTAINER_TRAINER = r"""#!/bin/bash
# The trainer in the container: --save must lie under a mount, or the checkpoint is lost.
printf '%s\0' "$@" > "$STUB_DIR/argv.$RANK"
env -0 > "$STUB_DIR/env.$RANK"
pwd > "$STUB_DIR/cwd.$RANK"
while [ $# -gt 0 ]; do case "$1" in --save) save="$2"; shift ;; esac; shift; done
ok=0
while IFS= read -r dst; do
  [ -n "$dst" ] && [[ "$save/" == "$dst/"* ]] && ok=1
done <<< "$STUB_VISIBLE"
[ "$ok" = 1 ] || { echo "trainer: $save is not mounted" >&2; exit 9; }
[ "$RANK" = 0 ] && echo 5 > "$save/latest_checkpointed_iteration.txt"
exit 0
"""


def test_container_run_with_pyxis_stand_in(tmp_path: Path) -> None:
    (tmp_path / "data").mkdir()
    ckpt = tmp_path / "elsewhere" / "ckpt"  # outside the run dir: a mount of its own
    script = _render(tmp_path, job={"container_image": "nvcr.io/nvidia/pytorch:24.12-py3",
                                    "checkpoint_dir": str(ckpt),
                                    "data_dir": str(tmp_path / "data")},
                     topo_dir="/nonexistent/nccl-topo")
    for name, text in (("srun", PYXIS_SRUN), ("trainer", CONTAINER_TRAINER)):
        (tmp_path / "bin" / name).write_text(text)
    proc = _run(tmp_path, script)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    args = _nul_list(tmp_path / "srun.args")
    run_dir = tmp_path / "run"
    assert "--container-image=nvcr.io#nvidia/pytorch:24.12-py3" in args
    assert "--no-container-mount-home" in args and f"--container-workdir={run_dir}" in args
    (mounts,) = (a.split("=", 1)[1] for a in args if a.startswith("--container-mounts="))
    data = tmp_path / "data"
    assert set(mounts.split(",")) == {f"{run_dir}:{run_dir}", f"{data}:{data}", f"{ckpt}:{ckpt}",
                                      "/nonexistent/nccl-topo:/nonexistent/nccl-topo:ro+nofail"}
    assert (tmp_path / "cwd.0").read_text().strip() == str(run_dir)
    assert (ckpt / "latest_checkpointed_iteration.txt").read_text() == "5\n"
    if "export SLURMPOD_TRAINER_DIRS=" in script.read_text():  # the template passes them on
        env = dict(e.split("=", 1) for e in _nul_list(tmp_path / "env.0"))
        assert env["SLURMPOD_TRAINER_DIRS"] == str(ckpt)


def _wrapper(tmp: Path, dirs: str, localid: str = "0") -> subprocess.CompletedProcess[str]:
    from slurmpod.render.launch import RANK_WRAPPER

    env = {"PATH": "/usr/bin:/bin", "SLURM_PROCID": localid, "SLURM_LOCALID": localid,
           "SLURM_NTASKS": "2", "SLURM_NTASKS_PER_NODE": "2", "SLURM_JOB_ID": "7",
           "SLURMD_NODENAME": "gpu001", "SLURMPOD_CPU_BIND": "none",
           "SLURMPOD_TRAINER_DIRS": dirs}
    return subprocess.run(["bash", "-c", RANK_WRAPPER, "slurmpod-rank", "true"], env=env,
                          capture_output=True, text=True, timeout=30, cwd=tmp)


def test_rank_wrapper_creates_trainer_dirs_where_the_trainer_runs(tmp_path: Path) -> None:
    odd = tmp_path / "a dir with 'quotes' and $(x)" / "ckpt"
    plain = tmp_path / "plain"
    proc = _wrapper(tmp_path, f"{odd}\n{plain}")
    assert proc.returncode == 0, proc.stderr
    assert odd.is_dir() and plain.is_dir() and not list(plain.iterdir())  # probe removed
    other = tmp_path / "other"
    assert _wrapper(tmp_path, str(other), localid="1").returncode == 0
    assert not other.exists()  # only local rank 0 of a node creates and checks


def test_rank_wrapper_fails_the_rank_on_an_unusable_dir(tmp_path: Path) -> None:
    blocker = tmp_path / "not-a-dir"  # a file where a directory should be: fails even for root
    blocker.write_text("")
    proc = _wrapper(tmp_path, f"{tmp_path / 'fine'}\n{blocker / 'ckpt'}")
    assert proc.returncode == 1
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "cannot create or write" in lines[0] and "gpu001" in lines[0]
