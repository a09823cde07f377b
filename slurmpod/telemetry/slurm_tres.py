"""Slurm's own GPU accounting: `sacct` TRESUsageInAve/Max with `gres/gpuutil`, `gres/gpumem`.

Since Slurm 21.08, slurmstepd's jobacct_gather polls the GPUs through the GPU plugin
(`gpu/nvml`, `gpu/rsmi`) and records `gres/gpuutil` (%) and `gres/gpumem` (bytes, printed with
a unit suffix) per step when `AccountingStorageTRES` lists them (e.g.
`AccountingStorageTRES=gres/gpu,gres/gpumem,gres/gpuutil`); `ConsumedEnergyRaw` (J) is whatever
`AcctGatherEnergyType` measures (`acct_gather_energy/gpu` the GPUs, `ipmi`/`rapl` the node or
CPU package: the report names it `slurm`). TRES strings look like
`cpu=00:01:02,energy=4321,fs/disk=1234,gres/gpumem=71234M,gres/gpuutil=87,mem=1.50G,pages=0`.
Slurm's figures are per task, not per GPU, so this source gives the job's level only.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from slurmpod.telemetry.stats import GpuStat, Telemetry

_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40, "P": 1 << 50}
_SIZE = re.compile(r"^(\d+(?:\.\d+)?)([KMGTP]?)$")


def parse_tres(text: str) -> dict[str, str]:
    """`name=value,…` -> dict; malformed items are skipped."""
    out: dict[str, str] = {}
    for item in text.strip().split(","):
        name, eq, value = item.partition("=")
        if eq and name and value and name not in out:
            out[name.strip().lower()] = value.strip()
    return out


def size_bytes(value: str) -> float | None:
    m = _SIZE.match(value.strip().upper())
    return float(m.group(1)) * _UNITS[m.group(2)] if m else None


def parse_steps(text: str, sep: str = "|") -> Telemetry | None:
    """Rows of `sacct -P -n --format=JobID,TRESUsageInAve,TRESUsageInMax,ConsumedEnergyRaw,
    ElapsedRaw -j ID`: the job's GPU utilisation (mean over its srun steps, else the batch
    step, weighted by their elapsed time), the most GPU memory of any step, and the
    allocation's energy."""
    utils: list[tuple[bool, float, float]] = []  # (srun step?, util, elapsed)
    mem_max: float | None = None
    energy: float | None = None
    span = 0.0
    for line in text.splitlines():
        parts = line.split(sep)
        if len(parts) != 5:
            continue
        job, ave, mx, energy_s, elapsed_s = parts
        try:
            elapsed = float(elapsed_s) if elapsed_s else 0.0
        except ValueError:
            continue
        if "." not in job:  # the allocation's row: energy of the whole job, its span
            try:
                e = float(energy_s) if energy_s else None
            except ValueError:
                e = None
            if e is not None and 0 <= e < 1e15:
                energy = e
            span = max(span, elapsed)
            continue
        a, m = parse_tres(ave), parse_tres(mx)
        try:
            u = float(a["gres/gpuutil"]) if "gres/gpuutil" in a else None
        except ValueError:
            u = None
        if u is not None and 0 <= u <= 100 and elapsed > 0:
            utils.append((job.rsplit(".", 1)[1].isdigit(), u, elapsed))
        b = size_bytes(m.get("gres/gpumem", "")) if "gres/gpumem" in m else None
        if b is not None and b >= 0:
            mem_max = max(mem_max or 0.0, b)
    # The batch step spans the job: when srun steps ran, they did the GPU work and the batch
    # step's 0 % would only dilute theirs (steps may also overlap: no weighting across kinds).
    chosen = [(u, e) for srun, u, e in utils if srun] or [(u, e) for _, u, e in utils]
    util_w = sum(e for _, e in chosen)
    util_sum = sum(u * e for u, e in chosen)
    if util_w == 0 and mem_max is None:
        return None  # Slurm did not measure the GPUs (no gpu plugin or TRES not tracked)
    g = GpuStat(util=util_sum / util_w if util_w else None,
                mem_gib=None if mem_max is None else mem_max / (1 << 30), span_s=span or None,
                energy_j=energy)
    return Telemetry("sacct", "site", [g], span_s=span or None,
                     energy_src="slurm" if energy is not None else None)


Run = Callable[[list[str], float], tuple[int, str, str]]


def job_telemetry(run: Run, job_id: str, *, timeout_s: float = 20.0) -> Telemetry | None:
    """Ask sacct. The fields asked hold no job-controlled text, so `|` cannot be forged."""
    argv = ["sacct", "-P", "-n", "-j", job_id,
            "--format=JobID,TRESUsageInAve,TRESUsageInMax,ConsumedEnergyRaw,ElapsedRaw"]
    try:
        rc, out, _ = run(argv, timeout_s)
    except OSError:
        return None
    return parse_steps(out) if rc == 0 else None
