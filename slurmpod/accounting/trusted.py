"""What the epilog may believe about a job: Slurm's record and the site file, never the job.

The numbers that decide MFU, GPU-hours and money (the GPU count, the GPU's peak, the attempt,
the job's start and end) come from here. The job's Comment and log supply only what the job
measured itself (docs/accounting.md, "What slurmpod trusts"). Pure: text and the site model in,
values out.

`scontrol show job` prints free text that the job controls (JobName, Comment, WorkDir, StdOut,
Features…) between Slurm's own `Key=Value` fields, so a job named `x Restarts=9 TRES=gres/gpu=4096`
could plant keys. Two rules make the fields read here safe on Slurm 22.05 and 24.11:
- the line must start with `JobId=<id> [Array…/HetJob…=…] JobName=<the name Slurm exported to
  the epilog>`; that exact prefix is cut off (a mismatch reads nothing);
- after it, the first occurrence of a key wins: Slurm prints `Restarts`, `StartTime`,
  `EndTime`, `NodeList` and `TRES` (22.05) / `AllocTRES` (24.11) before any job-controlled text
  (`Features`, `Command`, `WorkDir`, `Comment`, `StdOut` come after them).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from slurmpod.model.hostlist import expand
from slurmpod.model.site import Inventory, Site

_HEAD = re.compile(r"^JobId=(\d+)((?: (?:ArrayJobId|ArrayTaskId|ArrayTaskThrottle|HetJobId|"
                   r"HetJobIdSet|HetJobOffset)=\S+)*) JobName=")
_KV = re.compile(r"(?:^|\s)([A-Za-z][\w:/]*)=")
WANTED = ("Restarts", "StartTime", "EndTime", "NodeList", "NumNodes", "TRES", "AllocTRES",
          "JobState")


@dataclass(frozen=True)
class SlurmJob:
    """The fields of `scontrol show job` the epilog uses (None: Slurm did not say)."""

    restarts: int | None = None
    start_time: int | None = None
    end_time: int | None = None
    nodelist: str | None = None
    n_nodes: int | None = None
    gpus: int | None = None  # gres/gpu of the allocation


def parse_scontrol_job(text: str, job_id: str, job_name: str) -> SlurmJob | None:
    """`scontrol --oneliner show job ID` (SLURM_TIME_FORMAT=%s) -> SlurmJob, or None when the
    output does not start with this job's id and exact name (so no field can be trusted)."""
    line = text.split("\n", 1)[0] if "\n" not in job_name else text
    m = _HEAD.match(line)
    if m is None or m.group(1) != job_id:  # the epilog's SLURM_JOB_ID is the raw id
        return None
    rest = line[m.end():]
    if not rest.startswith(job_name + " "):
        return None
    rest = rest[len(job_name):]
    fields: dict[str, str] = {}
    keys = list(_KV.finditer(rest))
    for i, k in enumerate(keys):
        name = k.group(1)
        if name in fields or name not in WANTED:
            continue
        end = keys[i + 1].start() if i + 1 < len(keys) else len(rest)
        fields[name] = rest[k.end():end].strip()
    tres = fields.get("AllocTRES") or fields.get("TRES") or ""
    return SlurmJob(restarts=_int(fields.get("Restarts")),
                    start_time=_epoch(fields.get("StartTime")),
                    end_time=_epoch(fields.get("EndTime")),
                    nodelist=fields.get("NodeList") or None,
                    n_nodes=_int(fields.get("NumNodes")),
                    gpus=gpus_in_tres(tres))


def gpus_in_tres(tres: str) -> int | None:
    """`gres/gpu=16` (or the sum of typed `gres/gpu:h100=16` entries); None without GPUs."""
    untyped: int | None = None
    typed = 0
    for item in tres.split(","):
        key, _, val = item.partition("=")
        if key == "gres/gpu" and val.isdigit():
            untyped = int(val)
        elif key.startswith("gres/gpu:") and val.isdigit():
            typed += int(val)
    count = untyped if untyped is not None else typed
    return count or None


def gpus_from_env(env_gpus: str, n_nodes: int | None) -> int | None:
    """`SLURM_JOB_GPUS` lists one node's GPU indices (22.05: `0,1,…,7`); × nodes for whole-node
    jobs. Slurm sets it, the job cannot."""
    per_node = len([g for g in env_gpus.split(",") if g.strip()])
    return per_node * n_nodes if per_node and n_nodes and n_nodes > 0 else None


@dataclass(frozen=True)
class SiteGpu:
    """The site file's GPU for a job's nodes."""

    node_type: str
    gpus_per_node: int
    peak_tflops: float  # dense BF16
    peak_fp8: float | None
    model: str | None = None  # gres Type (catalog key): the telemetry's power and memory bounds


def site_gpu(nodelist: str, site: Site, inventory: Inventory) -> SiteGpu | None:
    """The GPU of the job's nodes in the site file; None when a node is unknown or the nodes
    are of different types (no single peak would be right)."""
    try:
        hosts = expand(nodelist)
    except ValueError:
        return None
    by_name = inventory.by_name
    types = {by_name[h].node_type for h in hosts if h in by_name}
    if not hosts or len(types) != 1 or any(h not in by_name for h in hosts):
        return None
    name = types.pop()
    nt = site.node_types[name]
    return SiteGpu(name, nt.gpus, nt.gpu.peak_tflops_bf16, nt.gpu.peak_tflops_fp8,
                   nt.gpu.model)


def allocated_gpus(slurm: SlurmJob | None, job: Mapping[str, object],
                   gpu: SiteGpu | None) -> tuple[int | None, str | None]:
    """(GPUs, where from): Slurm's gres/gpu allocation, else `SLURM_JOB_GPUS` × nodes, else the
    site's GPUs per node × the job's nodes (a whole-node job that asked for no gres)."""
    if slurm is not None and slurm.gpus:
        return slurm.gpus, "slurm"
    n_nodes = job.get("n_nodes")
    nodes = n_nodes if isinstance(n_nodes, int) else None
    env = gpus_from_env(str(job.get("gpus") or ""), nodes)
    if env:
        return env, "slurm"
    if gpu is not None and nodes:
        return gpu.gpus_per_node * nodes, "site"
    return None, None


def _int(text: str | None) -> int | None:
    return int(text) if text and text.isdigit() else None


def _epoch(text: str | None) -> int | None:
    v = _int(text)
    return v if v else None
