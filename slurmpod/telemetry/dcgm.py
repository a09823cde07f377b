"""DCGM job statistics: `dcgmi stats --job ID -v` (per GPU) and `dcgmi stats -j ID` (summary).

A site enables them once (`dcgmi stats -e`) and brackets each job in slurmd's Prolog/Epilog
(`dcgmi group -c j$SLURM_JOB_ID -a $CUDA_VISIBLE_DEVICES`, `dcgmi stats -g GROUP -s
$SLURM_JOB_ID`, … `dcgmi stats -x $SLURM_JOB_ID`); the host engine then keeps the job's figures
and anyone may read them afterwards, also from another host (`--host NODE`). The output (DCGM 2.x
and 3.x) is a box per GPU (`-v`) or one `Summary` box:

    Successfully retrieved statistics for job: 4242.
    +------------------------------------------------------------------------------+
    | GPU ID: 0                                                                    |
    +====================================+=========================================+
    |-----  Execution Stats  ------------+-----------------------------------------|
    | Start Time                         | Tue Mar  4 10:00:00 2025                |
    | Total Execution Time (sec)         | 3600.12                                 |
    +-----  Performance Stats  ----------+-----------------------------------------+
    | Energy Consumed (Joules)           | 1843200                                 |
    | Power Usage (Watts)                | Avg: 512, Max: 688.1, Min: 71.2         |
    | Max GPU Memory Used (bytes)        | 76468715520                             |
    | SM Clock (MHz)                     | Avg: 1980, Max: 1980, Min: 345          |
    | SM Utilization (%)                 | Avg: 91, Max: 100, Min: 0               |
    +-----  Event Stats  ----------------+-----------------------------------------+
    | Critical XID Errors                | 0                                       |

`SM Utilization` there is NVML's GPU utilisation (a kernel was running), not the profiling
metric SM activity. Rows a GPU does not support print `N/A` (also inside `Avg: N/A, …`); they
stay "not measured". Unknown rows are ignored, so later DCGM releases' extra rows do no harm.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Sequence

from slurmpod.telemetry.schema import HBM_UNKNOWN_GIB, POWER_LIMIT_UNKNOWN_W, POWER_SLACK
from slurmpod.telemetry.stats import GpuStat, Telemetry

_ROW = re.compile(r"^\|\s*([^|]+?)\s*\|\s*(.*?)\s*\|\s*$")
_GPU = re.compile(r"^\|\s*(?:GPU ID:\s*(\d{1,4})|(Summary))\s*\|\s*$")
_AVG = re.compile(r"\bAvg:\s*([-+0-9.eE]+|N/A)")
_MAX = re.compile(r"\bMax:\s*([-+0-9.eE]+|N/A)")
_OK = "Successfully retrieved statistics for job"


def _float(text: str | None, lo: float, hi: float) -> float | None:
    if text is None or text.strip() in ("", "N/A", "Not Supported"):
        return None
    try:
        v = float(text.strip())
    except ValueError:
        return None
    return v if lo <= v <= hi else None


def _stat(value: str, which: re.Pattern[str], lo: float, hi: float) -> float | None:
    m = which.search(value)
    return _float(m.group(1), lo, hi) if m else None


def parse_job_stats(text: str, node: str = "") -> list[GpuStat]:
    """Per-GPU figures from `dcgmi stats -j ID [-v]` output; [] when it has none (the job was
    never started with `stats -s`, DCGM not running, garbage). A `Summary` box counts as one
    entry only when there is no per-GPU box."""
    if _OK not in text:
        return []
    gpus: list[GpuStat] = []
    summary: GpuStat | None = None
    cur: GpuStat | None = None
    p_hi = POWER_LIMIT_UNKNOWN_W * POWER_SLACK
    for raw in text.splitlines():
        line = raw.rstrip()
        g = _GPU.match(line)
        if g:
            if g.group(1) is not None:
                cur = GpuStat(node=node, index=int(g.group(1)))
                gpus.append(cur)
            else:
                cur = summary = GpuStat(node=node)
            continue
        m = _ROW.match(line)
        if cur is None or not m:
            continue
        name, value = m.group(1).lower(), m.group(2)
        if name.startswith("total execution time"):
            cur.span_s = _float(value, 0, 4e7)
        elif name.startswith("energy consumed"):
            cur.energy_j = _float(value, 0, 1e13)
        elif name.startswith("power usage"):
            cur.power_w = _stat(value, _AVG, 0, p_hi)
            cur.power_max_w = _stat(value, _MAX, 0, p_hi)
        elif name.startswith("max gpu memory used"):
            b = _float(value, 0, HBM_UNKNOWN_GIB * (1 << 30))
            cur.mem_gib = None if b is None else b / (1 << 30)
        elif name.startswith("sm clock"):
            cur.sm_mhz = _stat(value, _AVG, 0, 10000)
        elif name.startswith("memory clock"):
            cur.mem_mhz = _stat(value, _AVG, 0, 20000)
        elif name.startswith("sm utilization"):
            cur.util = _stat(value, _AVG, 0, 100)
        elif name.startswith("memory utilization"):
            cur.mem_util = _stat(value, _AVG, 0, 100)
        elif name.startswith("critical xid errors"):
            x = _float(value, 0, 1e6)
            cur.xid = None if x is None else int(x)
        elif name.startswith("temperature") or name.startswith("max temperature"):
            cur.temp_max_c = _stat(value, _MAX, 0, 130) or _float(value, 0, 130)
    if gpus:
        return gpus
    return [summary] if summary is not None else []


Run = Callable[[list[str], float], tuple[int, str, str]]


def job_stats(run: Run, job_id: str, nodes: Sequence[str], *, timeout_s: float = 10.0,
              budget_s: float = 60.0, exe: str = "dcgmi") -> Telemetry | None:
    """DCGM job statistics of `job_id` from each node's host engine (`--host NODE`), at most
    `timeout_s` per node and `budget_s` in all. None unless every node answered: a job half
    measured would under-count its energy."""

    t0 = time.monotonic()
    gpus: list[GpuStat] = []
    for node in nodes:
        left = budget_s - (time.monotonic() - t0)
        if left <= 0:
            return None
        try:
            rc, out, _ = run([exe, "stats", "--host", node, "-j", job_id, "-v"],
                             min(timeout_s, left))
        except OSError:
            return None
        got = parse_job_stats(out, node) if rc == 0 else []
        if not got:
            return None
        gpus.extend(got)
    if not gpus:
        return None
    return Telemetry("dcgm", "site", gpus, energy_src="dcgm")
