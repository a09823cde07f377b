"""The launch line: srun options, the per-rank CPU/NUMA wrapper and the Megatron command line.

Pure functions from the run spec and the site's node type to argv lists; the sbatch template
quotes every element. Megatron is started one process per GPU by srun (8 tasks per node), each
rank finding RANK/LOCAL_RANK/WORLD_SIZE from Slurm and MASTER_ADDR/PORT from the first node.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from slurmpod.errors import ConfigError
from slurmpod.model.slurm_time import limit_minutes

# Which flag a dest renders as (`fp8` -> `--fp8-format`, store_false args -> `--no-…`) lives in
# one place with Megatron's argument names per release: slurmpod.megatron.argnames.

# Keys slurmpod derives for every job; a value the user gives in [megatron] wins.
DERIVED_KEYS = ("log_throughput", "save", "load", "exit_signal_handler", "exit_duration_in_mins",
                "distributed_timeout_minutes", "save_interval")

# Megatron's --distributed-timeout-minutes (default 10; megatron/training/arguments.py, core
# 0.14) is the timeout initialize.py gives init_process_group and every parallel group, so one
# value covers both the slowest legitimate wait and hang detection. 10 min is too short at
# scale: ranks wait in a collective while rank 0 builds the dataset index caches on a first
# run, while a resumed job loads a multi-TB checkpoint, and while NCCL sets up its first
# communicators on thousands of GPUs; a timeout there kills a healthy job, which then requeues
# into the same wait. Hours (public Megatron launch scripts use 60 to 1440) are too long: a
# hung collective holds the whole allocation until the watchdog fires, and at 10k GPUs the
# mean time between failures is only 1-4 hours. 30 minutes is 3x Megatron's default and bounds
# a hang at half an hour of the allocation; `distributed_timeout_minutes` in [megatron] wins.
DISTRIBUTED_TIMEOUT_MIN = 30


def flag_name(dest: str) -> str:
    """Megatron dest name (or a flag name already) -> its flag: `--flag-name`, or the flag
    Megatron declares for that dest where they differ (`fp8` -> `--fp8-format`)."""
    from slurmpod.megatron.argnames import flag_for  # lazy: start-up

    return flag_for(dest)


def _scalar(value: Any, key: str) -> str:
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ConfigError(f"{value!r} is not a finite number", key=f"megatron.{key}")
        return repr(value)
    if isinstance(value, str | int):
        return str(value)
    raise ConfigError(f"cannot pass a {type(value).__name__} to Megatron; use a string, number, "
                      "boolean or a list of those", key=f"megatron.{key}")


def _as_arguments(args: Mapping[str, Any], rendered_as: Mapping[str, str]) -> dict[str, Any]:
    """The table with each dump-only key under the argument that sets it, in place; left out
    where the table already states it that way (or as layers per virtual stage), or where a
    `pipeline_model_parallel_layout` decides the virtual stages (Megatron takes those from the
    layout and refuses a second source)."""
    vpp_set = any(args.get(k) is not None for k in (
        "num_virtual_stages_per_pipeline_rank", "num_layers_per_virtual_pipeline_stage",
        "pipeline_model_parallel_layout"))
    out: dict[str, Any] = {}
    for key, value in args.items():
        arg = rendered_as.get(key)
        if arg is None:
            out[key] = value
        elif not vpp_set:
            out[arg] = value
    return out


def megatron_argv(args: Mapping[str, Any]) -> list[str]:
    """`[megatron]` table -> Megatron command-line arguments, in the table's order.

    Booleans are flags (true -> `--flag`, false -> nothing, or `--no-…` for store_false args),
    lists become nargs='+' values, or one string where Megatron parses the list from one
    (`--moe-layer-freq [0,0,0,1]`, `--window-size 127,0`), None is left out, everything else is
    one value.
    """
    from slurmpod.megatron.argnames import (  # lazy: start-up
        MODEL_ONLY,
        PATTERN_ARGS,
        RENDERED_AS,
        TUPLE_ARGS,
        store_false_flags,
    )

    store_false = store_false_flags()
    out: list[str] = []
    for key, value in _as_arguments(args, RENDERED_AS).items():
        if value is None or key in MODEL_ONLY:
            continue
        if isinstance(value, bool):
            if key in store_false:
                if not value:
                    out.append(store_false[key])
            elif value:
                out.append(flag_name(key))
            continue
        if isinstance(value, list | tuple):
            if not value:
                continue
            items = [_scalar(v, key) for v in value]
            if key in PATTERN_ARGS:
                out += [flag_name(key), "[" + ",".join(items) + "]"]
            elif key in TUPLE_ARGS:
                out += [flag_name(key), ",".join(items)]
            else:
                out += [flag_name(key), *items]
            continue
        out += [flag_name(key), _scalar(value, key)]
    return out


def parse_time_limit_min(limit: str) -> int | None:
    """Slurm time -> whole minutes as Slurm stores it (seconds round up); None means no limit.
    model/slurm_time.py is the one parser; this name stays for render/sbatch.py."""
    return limit_minutes(limit)


# Bytes per parameter a Megatron checkpoint writes with the distributed optimizer: bf16 weights
# (2) + fp32 master weights (4) + Adam's two moments (4 + 4); gradients are not saved
# (megatron/core/optimizer/distrib_optimizer.py sharded_state_dict, core 0.12-0.14).
CHECKPOINT_BYTES_PER_PARAM = 14


def predicted_save_s(params_total: float, write_gb_per_s: float) -> float:
    """Seconds one checkpoint save takes: its bytes over the checkpoint filesystem's sustained
    write bandwidth for one job (site `[storage] checkpoint_write_gb_per_s`)."""
    if params_total <= 0 or write_gb_per_s <= 0:
        return 0.0
    return params_total * CHECKPOINT_BYTES_PER_PARAM / (write_gb_per_s * 1e9)


def signal_lead(limit_min: int | None, save_s: float, asked_s: int | None) -> int:
    """Seconds before the time limit the batch shell is warned (--signal=B:USR2@lead).

    The trainer must finish its current iteration, then save: twice the predicted save time
    plus 60 s for the iteration in flight and the collective teardown, unless `--signal-lead`
    says otherwise. Never more than a quarter of a short limit (a 10-minute job still trains
    most of its time), never under 10 s. Slurm may send it up to 60 s early (sbatch(1)
    --signal: "resolution of event handling"), which only adds margin."""
    lead = asked_s if asked_s is not None else 60 + math.ceil(2 * save_s)
    if limit_min is not None:
        lead = min(lead, limit_min * 60 // 4)
    return max(10, lead)


def exit_duration_min(limit_min: int | None, signal_lead_s: int, save_s: float) -> int | None:
    """Minutes Megatron may train before it saves and exits on its own
    (--exit-duration-in-mins): the limit less the signal lead and room for one more save, so
    its own exit comes before the warning. None (leave it to the signal) when that leaves less
    than a minute: a 1-minute limit must not pass the whole limit."""
    if limit_min is None:
        return None
    minutes = (limit_min * 60 - signal_lead_s - math.ceil(2 * save_s)) // 60
    return minutes if minutes >= 1 else None


def with_derived(args: Mapping[str, Any], *, checkpoint_dir: str, exit_duration: int | None,
                 distributed_timeout_min: int | None = DISTRIBUTED_TIMEOUT_MIN,
                 save_interval: int | None = None) -> dict[str, Any]:
    """The user's [megatron] table plus what every slurmpod job needs for throughput logging,
    checkpoint/resume, a clean exit before the time limit, a collective timeout that fits
    large jobs (DISTRIBUTED_TIMEOUT_MIN) and, when `submit` computed one, the checkpoint
    interval (slurmpod.resilience.interval). User values win."""
    out = dict(args)
    derived: dict[str, Any] = {
        "log_throughput": True,
        "save": checkpoint_dir,
        "load": checkpoint_dir,
        "exit_signal_handler": True,
        "exit_duration_in_mins": exit_duration,
        "distributed_timeout_minutes": distributed_timeout_min,
        "save_interval": save_interval,
    }
    for key in DERIVED_KEYS:
        if key not in out and derived[key] is not None:
            out[key] = derived[key]
    return out


def gpu_numa_map(gpu_numa: Sequence[int]) -> str:
    """`0 0 0 0 1 1 1 1`: NUMA node of each local rank's GPU (rank i drives GPU i)."""
    return " ".join(str(n) for n in gpu_numa)


@dataclass(frozen=True)
class Container:
    """pyxis options of the launch step (slurmpod.render.container decides them)."""

    image: str  # normalised for enroot (REGISTRY#IMAGE:TAG)
    mounts: tuple[str, ...] = ()  # SRC:DST[:FLAGS]
    workdir: str | None = None
    name: str | None = None  # --container-name; None: an unnamed container per step
    mount_home: bool = False
    writable: bool | None = None  # None: the site's enroot default (ENROOT_ROOTFS_WRITABLE)


# Seconds srun waits after the first rank exits before ending the others. Megatron's ranks
# leave within seconds of each other after a save; 5 minutes covers a slow checkpoint flush on
# one rank while still ending a step whose other ranks hang in a collective.
STEP_WAIT_S = 300


def srun_argv(*, nodes: int, tasks_per_node: int, container: Container | None,
              cpu_bind: str, gpu_numa: Sequence[int], extra: Sequence[str] = ()) -> list[str]:
    """srun options for one rank per GPU; `--kill-on-bad-exit` so one dead rank ends the step
    (a hung collective would otherwise burn the allocation until the time limit), `--wait` so
    ranks left waiting on one that exited cleanly are ended too, `--label` so every line names
    its rank (`slurmpod logs --rank`; the log parser strips the prefix)."""
    argv = ["srun", f"--nodes={nodes}", f"--ntasks-per-node={tasks_per_node}",
            f"--ntasks={nodes * tasks_per_node}", "--kill-on-bad-exit=1",
            f"--wait={STEP_WAIT_S}", "--label"]
    if cpu_bind == "slurm":
        # Slurm binds each local rank to the locality domain (NUMA node) of its GPU.
        argv.append("--cpu-bind=map_ldom:" + ",".join(str(n) for n in gpu_numa))
    if container is not None:
        argv.append(f"--container-image={container.image}")
        if container.mounts:
            argv.append("--container-mounts=" + ",".join(container.mounts))
        if container.workdir:
            argv.append(f"--container-workdir={container.workdir}")
        if container.name:
            argv.append(f"--container-name={container.name}")
        # pyxis mounts $HOME unless told not to (--no-container-mount-home, pyxis 0.3+).
        argv.append("--container-mount-home" if container.mount_home
                    else "--no-container-mount-home")
        if container.writable is not None:  # pyxis 0.11+
            argv.append("--container-writable" if container.writable
                        else "--container-readonly")
    argv += list(extra)
    return argv


# The per-rank wrapper, run as `bash -c "$SLURMPOD_RANK_WRAPPER" slurmpod-rank CMD...` by every
# task. It holds no user value (those arrive as "$@"), so it can be a fixed, quoted string.
# It runs where the trainer runs (inside the container under pyxis): local rank 0 of each node
# creates the directories in $SLURMPOD_TRAINER_DIRS (one per line) and proves it can write
# there, so a missing mount or a read-only one fails the step at once with one line, not at
# the first checkpoint hours later.
RANK_WRAPPER = r"""set -eu
export RANK="$SLURM_PROCID" LOCAL_RANK="$SLURM_LOCALID" WORLD_SIZE="$SLURM_NTASKS"
export LOCAL_WORLD_SIZE="${SLURM_NTASKS_PER_NODE%%(*}"
read -r -a map <<< "${SLURMPOD_GPU_NUMA_MAP:-}"
numa="${map[$SLURM_LOCALID]:-}"
export SLURMPOD_NUMA_NODE="$numa"
if [ -n "${SLURMPOD_TRAINER_DIRS:-}" ] && [ "$SLURM_LOCALID" = 0 ]; then
  while IFS= read -r d; do
    [ -n "$d" ] || continue
    probe="$d/.slurmpod-write-test.${SLURM_JOB_ID:-0}.${SLURMD_NODENAME:-node}"
    if ! { mkdir -p -- "$d" && : > "$probe" && rm -f -- "$probe"; } 2>/dev/null; then
      echo "slurmpod: rank $RANK on ${SLURMD_NODENAME:-?}: cannot create or write $d where" \
           "the trainer runs; check container_mounts and the permissions there" >&2
      exit 1
    fi
  done <<< "$SLURMPOD_TRAINER_DIRS"
fi
if [ "${SLURMPOD_CPU_BIND:-numactl}" = numactl ] && [ -n "$numa" ] \
   && [ -d "/sys/devices/system/node/node$numa" ]; then
  if command -v numactl >/dev/null 2>&1; then
    set -- numactl --cpunodebind="$numa" --membind="$numa" -- "$@"
  elif [ "$SLURM_LOCALID" = 0 ]; then
    echo "slurmpod: warning: no numactl on ${SLURMD_NODENAME:-this node}: ranks run without" \
         "CPU/memory binding (install numactl, or render with --cpu-bind slurm)" >&2
  fi
fi
note_pid() {
  # "node pid step" of this rank's trainer, for the stack dump after a hang and to end the
  # step (docs/resilience-in-job.md); the run directory is on a filesystem every node sees.
  [ -n "${SLURMPOD_PIDS_DIR:-}" ] || return 0
  echo "${SLURMD_NODENAME:-?} $1 ${SLURM_STEP_ID:-}" > "$SLURMPOD_PIDS_DIR/rank-$SLURM_PROCID" \
    2>/dev/null || true
}
if [ "$SLURM_PROCID" = 0 ] && [ -n "${SLURMPOD_STEP_TERM_MARK:-}" ]; then
  # `scancel --signal=TERM JOBID` reaches the steps only: rank 0 notes it, so the batch shell
  # can tell a user's stop from the trainer's own exit. slurmstepd signals the trainer too;
  # passing it on again is harmless (Megatron's handler only sets a flag).
  trap ': > "$SLURMPOD_STEP_TERM_MARK" 2>/dev/null; kill -TERM "$child" 2>/dev/null; :' TERM
  "$@" &
  child=$!
  note_pid "$child"
  while :; do
    rc=0
    wait "$child" || rc=$?
    if [ "$rc" -gt 128 ] && kill -0 "$child" 2>/dev/null; then continue; fi
    exit "$rc"
  done
fi
note_pid "$$"
exec "$@"
"""

# Run after a hang, one task per node of the hung step (`srun --overlap`), as
# `bash -c "$SLURMPOD_DUMP_SCRIPT" slurmpod-dump PIDS_DIR OUT_DIR`: for each of this node's ranks
# one `slurmpod-dump: NODE rank R pid P state S` line (S from /proc: R, S, D, T stopped, Z, or
# `gone`) and, where py-spy is installed, its Python stacks in OUT_DIR/rank-R.txt; then
# `slurmpod-dump: NODE done`. slurmpod.resilience.shedding reads these lines.
DUMP_SCRIPT = r"""node="${SLURMD_NODENAME:-$(hostname -s)}"
for f in "$1"/rank-*; do
  [ -e "$f" ] || continue
  read -r n pid _ < "$f" || continue
  [ "$n" = "$node" ] || continue
  r="${f##*/rank-}"
  st=$(sed 's/.*) //' "/proc/$pid/stat" 2>/dev/null | cut -d' ' -f1)
  echo "slurmpod-dump: $node rank $r pid $pid state ${st:-gone}"
  if [ -n "$st" ] && command -v py-spy >/dev/null 2>&1; then
    timeout 30 py-spy dump --pid "$pid" > "$2/rank-$r.txt" 2>&1 || true
  fi
done
echo "slurmpod-dump: $node done"
"""
