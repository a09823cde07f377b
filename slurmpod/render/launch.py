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

# Which flag a dest renders as (`fp8` -> `--fp8-format`, store_false args -> `--no-…`) lives in
# one place with Megatron's argument names per release: slurmpod.megatron.argnames.

# Keys slurmpod derives for every job; a value the user gives in [megatron] wins.
DERIVED_KEYS = ("log_throughput", "save", "load", "exit_signal_handler", "exit_duration_in_mins",
                "distributed_timeout_minutes")

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
    from slurmpod.megatron.argnames import flag_for

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


def megatron_argv(args: Mapping[str, Any]) -> list[str]:
    """`[megatron]` table -> Megatron command-line arguments, in the table's order.

    Booleans are flags (true -> `--flag`, false -> nothing, or `--no-…` for store_false args),
    lists become nargs='+' values, None is left out, everything else is one value.
    """
    from slurmpod.megatron.argnames import store_false_flags

    store_false = store_false_flags()
    out: list[str] = []
    for key, value in args.items():
        if value is None:
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
            out += [flag_name(key), *(_scalar(v, key) for v in value)]
            continue
        out += [flag_name(key), _scalar(value, key)]
    return out


def parse_time_limit_min(limit: str) -> int | None:
    """Slurm time (`mm`, `mm:ss`, `hh:mm:ss`, `d-hh[:mm[:ss]]`) -> whole minutes.

    None means no limit."""
    if limit.upper() in ("INFINITE", "UNLIMITED"):
        return None
    days = 0
    rest = limit
    if "-" in limit:
        d, rest = limit.split("-", 1)
        days = int(d)
        parts = [int(p) for p in rest.split(":")]
        h, m, s = [*parts, 0, 0][:3]
    else:
        parts = [int(p) for p in rest.split(":")]
        if len(parts) == 1:
            h, m, s = 0, parts[0], 0
        elif len(parts) == 2:
            h, m, s = 0, parts[0], parts[1]
        else:
            h, m, s = parts[:3]
    return days * 1440 + h * 60 + m + s // 60


def scaled_lead(limit_min: int | None, lead_s: int, margin_min: int) -> tuple[int, int]:
    """Signal lead and save margin for a time limit: as asked, but at most a quarter (lead) and
    a tenth (margin) of a short limit, so a 10-minute job still trains for most of its time."""
    if limit_min is None:
        return lead_s, margin_min
    return (max(10, min(lead_s, limit_min * 60 // 4)),
            max(1, min(margin_min, limit_min // 10)))


def exit_duration_min(limit_min: int | None, signal_lead_s: int,
                      save_margin_min: int) -> int | None:
    """Minutes Megatron may train before it saves and exits on its own: the time limit minus the
    signal lead and a margin for the final checkpoint (at least 1 minute)."""
    if limit_min is None:
        return None
    return max(1, limit_min - math.ceil(signal_lead_s / 60) - save_margin_min)


def with_derived(args: Mapping[str, Any], *, checkpoint_dir: str, exit_duration: int | None,
                 distributed_timeout_min: int | None = DISTRIBUTED_TIMEOUT_MIN) -> dict[str, Any]:
    """The user's [megatron] table plus what every slurmpod job needs for throughput logging,
    checkpoint/resume, a clean exit before the time limit and a collective timeout that fits
    large jobs (DISTRIBUTED_TIMEOUT_MIN). User values win."""
    out = dict(args)
    derived: dict[str, Any] = {
        "log_throughput": True,
        "save": checkpoint_dir,
        "load": checkpoint_dir,
        "exit_signal_handler": True,
        "exit_duration_in_mins": exit_duration,
        "distributed_timeout_minutes": distributed_timeout_min,
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


def srun_argv(*, nodes: int, tasks_per_node: int, container: Container | None,
              cpu_bind: str, gpu_numa: Sequence[int], extra: Sequence[str] = ()) -> list[str]:
    """srun options for one rank per GPU; `--kill-on-bad-exit` so one dead rank ends the step
    (a hung collective would otherwise burn the allocation until the time limit)."""
    argv = ["srun", f"--nodes={nodes}", f"--ntasks-per-node={tasks_per_node}",
            f"--ntasks={nodes * tasks_per_node}", "--kill-on-bad-exit=1"]
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
   && [ -d "/sys/devices/system/node/node$numa" ] && command -v numactl >/dev/null 2>&1; then
  exec numactl --cpunodebind="$numa" --membind="$numa" -- "$@"
fi
exec "$@"
"""
