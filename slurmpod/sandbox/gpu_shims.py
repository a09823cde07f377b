"""The sandbox's `dcgmi` and `nvidia-smi`: emulated GPUs behind the real tools' interfaces.

Sandbox only. `slurmpod sandbox up` writes two small scripts into `<state>/bin/` that call
`main()` here, and a TaskProlog that puts that directory first on every task's PATH (and
exports `SLURMPOD_EMU_GPU_DIR`); the EpilogSlurmctld wrapper has it on PATH too. So
`slurmpod hook monitor` inside a job and the epilog's DCGM source run exactly as on a real
site, against figures derived from what the emulator really did (sandbox/workload/gpu_activity.py):

- utilisation: the share of wall time the emulator spent in its GEMMs (every GPU with a rank of
  the job shows rank 0's activity; an allocated GPU without a rank is idle, 0 %);
- memory used: the bytes of the emulator's arrays;
- power: the emulated GPU's idle power plus utilisation × (board limit − idle), board limit from
  the telemetry schema's `POWER_LIMIT_W` for the site's GPU model (`emu`: 700 W), idle 10 % of
  it; energy is that power integrated: idle × span + (limit − idle) × busy seconds;
- what the emulator has no analogue for (memory-controller utilisation, temperature, clocks)
  prints `N/A`, as real tools do for fields a GPU does not support.

`dcgmi stats -j ID -v [--host NODE]` prints DCGM 3.x's job statistics boxes (format in
slurmpod/telemetry/dcgm.py); `nvidia-smi --query-gpu=… --format=csv[,noheader][,nounits]
[--id=…]` prints current values of the calling node's (`SLURMD_NODENAME`) GPUs and, like
drivers without NVML's energy counter, rejects `total_energy_consumption`.
"""

from __future__ import annotations

import json
import os
import sys
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from slurmpod.sandbox.workload import gpu_activity
from slurmpod.telemetry.schema import POWER_LIMIT_UNKNOWN_W, POWER_LIMIT_W

IDLE_SHARE = 0.10  # idle power as a share of the board limit (H100 SXM: ~70 of 700 W)
LIVE_S = 15.0  # nvidia-smi: a job whose counters moved within this is running
MIB = 1 << 20


@dataclass(frozen=True)
class EmuGpu:
    """The emulated GPU's figures, fixed at `sandbox up` from the site."""

    name: str
    hbm_gib: float
    max_w: float
    idle_w: float

    def power(self, util: float) -> float:
        """Watts at a busy fraction 0..1."""
        return self.idle_w + (self.max_w - self.idle_w) * min(max(util, 0.0), 1.0)


@dataclass
class GpuFigures:
    index: int
    span_s: float
    busy_s: float
    util_max: float
    mem_bytes: int


def _num(v: Any, default: float = 0.0) -> float:
    return float(v) if isinstance(v, int | float) and v == v and v >= 0 else default


def job_on_node(gpu_dir: Path, job_id: str, node: str, now: float | None = None
                ) -> list[GpuFigures]:
    """Per GPU of `job_id` on `node` (the job's GPUs there, from its ranks' records), what the
    emulator did on it; [] when the job never ran the emulator on that node."""
    if not job_id.isdigit():
        return []
    act, ranks = gpu_activity.read_job(gpu_dir / job_id)
    here = [r for r in ranks if r.get("node") == node]
    if not here:
        return []
    active = {int(r["gpu"]) for r in here}
    allocated = set(active)
    for r in here:
        if isinstance(r.get("job_gpus"), list):
            allocated |= {g for g in r["job_gpus"] if isinstance(g, int) and 0 <= g < 1024}
    t_first = min(_num(r.get("t")) for r in here)
    if act is not None:
        t0, t1 = _num(act.get("t0")), _num(act.get("t"))
        span = max(t1 - min(t0, t_first), 0.0)
        busy = min(_num(act.get("busy_s")), span)
        util_max = min(_num(act.get("util_max")), 1.0)
        mem = int(_num(act.get("mem_bytes")))
    else:  # the ranks started but no iteration finished
        span, busy, util_max, mem = max((now or time.time()) - t_first, 0.0), 0.0, 0.0, 0
    return [GpuFigures(i, span, busy if i in active else 0.0,
                       util_max if i in active else 0.0, mem if i in active else 0)
            for i in sorted(allocated)]


def _box_row(name: str, value: str) -> str:
    return f"| {name:<35}| {value:<40}|"


def dcgmi_job_stats(job_id: str, gpus: Sequence[GpuFigures], emu: EmuGpu,
                    start: float) -> str:
    """DCGM 3.x `dcgmi stats -j ID -v`: one box per GPU (see telemetry/dcgm.py)."""
    rule = "+" + "-" * 78 + "+"
    lines = [f"Successfully retrieved statistics for job: {job_id}. "]
    stamp = time.strftime("%a %b %d %H:%M:%S %Y", time.localtime(start))
    for g in gpus:
        util = 100.0 * g.busy_s / g.span_s if g.span_s > 0 else 0.0
        energy = emu.idle_w * g.span_s + (emu.max_w - emu.idle_w) * g.busy_s
        power = energy / g.span_s if g.span_s > 0 else emu.idle_w
        lines += [
            rule, f"| GPU ID: {g.index:<69}|",
            "+====================================+=========================================+",
            "|-----  Execution Stats  ------------+-----------------------------------------|",
            _box_row("Start Time", stamp),
            _box_row("End Time", time.strftime("%a %b %d %H:%M:%S %Y",
                                               time.localtime(start + g.span_s))),
            _box_row("Total Execution Time (sec)", f"{g.span_s:.2f}"),
            _box_row("No. of Processes", "1" if g.busy_s > 0 else "0"),
            "+-----  Performance Stats  ----------+-----------------------------------------+",
            _box_row("Energy Consumed (Joules)", f"{energy:.0f}"),
            _box_row("Power Usage (Watts)", f"Avg: {power:.3f}, Max: "
                     f"{emu.power(g.util_max):.3f}, Min: {emu.idle_w:.3f}"),
            _box_row("Max GPU Memory Used (bytes)", str(g.mem_bytes)),
            _box_row("SM Clock (MHz)", "Avg: N/A, Max: N/A, Min: N/A"),
            _box_row("Memory Clock (MHz)", "Avg: N/A, Max: N/A, Min: N/A"),
            _box_row("SM Utilization (%)", f"Avg: {util:.0f}, Max: {100 * g.util_max:.0f}, "
                     "Min: 0"),
            _box_row("Memory Utilization (%)", "Avg: N/A, Max: N/A, Min: N/A"),
            _box_row("PCIe Rx Bandwidth (megabytes)", "Avg: N/A, Max: N/A, Min: N/A"),
            _box_row("PCIe Tx Bandwidth (megabytes)", "Avg: N/A, Max: N/A, Min: N/A"),
            "+-----  Event Stats  ----------------+-----------------------------------------+",
            _box_row("Single Bit ECC Errors", "0"),
            _box_row("Double Bit ECC Errors", "0"),
            _box_row("PCIe Replay Warnings", "0"),
            _box_row("Critical XID Errors", "0"),
            "+-----  Slowdown Stats  -------------+-----------------------------------------+",
            _box_row("Due to - Power (%)", "0"),
            _box_row("       - Thermal (%)", "0"),
            "+-----  Process Utilization  --------+-----------------------------------------+",
            "+-----  Overall Health  -------------+-----------------------------------------+",
            _box_row("Overall Health", "Healthy"),
            rule,
        ]
    return "\n".join(lines) + "\n"


def _gpu_uuid(node: str, index: int) -> str:
    return "GPU-" + str(uuid.uuid5(uuid.NAMESPACE_URL, f"slurmpod-sandbox:{node}:{index}"))


def live_gpus(gpu_dir: Path, node: str, now: float) -> dict[int, tuple[float, int]]:
    """GPU index -> (current busy fraction, memory bytes) of jobs running on `node`."""
    out: dict[int, tuple[float, int]] = {}
    try:
        jobs = os.listdir(gpu_dir)
    except OSError:
        return out
    for job in jobs:
        d = gpu_dir / job
        try:
            moved = max((d / f).stat().st_mtime for f in os.listdir(d))
        except (OSError, ValueError):
            continue
        if now - moved > LIVE_S:
            continue
        act, ranks = gpu_activity.read_job(d)
        for r in ranks:
            if r.get("node") != node:
                continue
            if act is None:
                out.setdefault(int(r["gpu"]), (0.0, 0))
            else:
                out[int(r["gpu"])] = (min(_num(act.get("util_last")), 1.0),
                                      int(_num(act.get("mem_bytes"))))
    return out


def nvidia_smi_values(field: str, node: str, index: int, busy: float, mem: int,
                      emu: EmuGpu) -> str | None:
    """One field's value as `--format=csv,nounits` prints it; None: not a valid field."""
    na = "[N/A]"
    values: dict[str, str] = {
        "index": str(index), "uuid": _gpu_uuid(node, index), "name": emu.name,
        "utilization.gpu": f"{100 * busy:.0f}", "utilization.memory": na,
        "memory.used": f"{mem / MIB:.0f}", "memory.total": f"{emu.hbm_gib * 1024:.0f}",
        "power.draw": f"{emu.power(busy):.2f}", "power.limit": f"{emu.max_w:.2f}",
        "temperature.gpu": na, "clocks.sm": na, "clocks.mem": na,
    }
    return values.get(field)


_UNITS = {"utilization.gpu": " %", "memory.used": " MiB", "memory.total": " MiB",
          "power.draw": " W", "power.limit": " W"}
_HEAD = {"utilization.gpu": "utilization.gpu [%]", "memory.used": "memory.used [MiB]",
         "memory.total": "memory.total [MiB]", "power.draw": "power.draw [W]",
         "power.limit": "power.limit [W]"}


def nvidia_smi(argv: Sequence[str], gpu_dir: Path, emu: EmuGpu, gpus_of: Mapping[str, int],
               env: Mapping[str, str], out: TextIO, err: TextIO) -> int:
    fields: list[str] = []
    fmt: set[str] = set()
    ids: list[int] | None = None
    for a in argv:
        if a.startswith("--query-gpu="):
            fields = [f.strip() for f in a.split("=", 1)[1].split(",") if f.strip()]
        elif a.startswith("--format="):
            fmt = set(a.split("=", 1)[1].split(","))
        elif a.startswith(("--id=", "-i=")):
            try:
                ids = [int(x) for x in a.split("=", 1)[1].split(",")]
            except ValueError:
                print(f"Invalid GPU id: {a}", file=err)
                return 2
    if not fields or "csv" not in fmt:
        print("slurmpod sandbox nvidia-smi: only --query-gpu=… --format=csv[,noheader]"
              "[,nounits] [--id=…] is emulated", file=err)
        return 2
    node = env.get("SLURMD_NODENAME", "")
    count = gpus_of.get(node, 0)
    if count == 0:
        print("No devices were found", file=out)
        return 6
    for f in fields:
        if nvidia_smi_values(f, node, 0, 0.0, 0, emu) is None:
            print(f'Field "{f}" is not a valid field to query.', file=out)
            print("\nTry \"nvidia-smi --help-query-gpu\" for more information.", file=out)
            return 2
    now = time.time()
    live = live_gpus(gpu_dir, node, now)
    if ids is not None and any(not 0 <= i < count for i in ids):
        print("No devices were found", file=out)
        return 6
    if "noheader" not in fmt:
        print(", ".join(_HEAD.get(f, f) if "nounits" not in fmt else f for f in fields),
              file=out)
    for i in (ids if ids is not None else range(count)):
        busy, mem = live.get(i, (0.0, 0))
        row = []
        for f in fields:
            v = nvidia_smi_values(f, node, i, busy, mem, emu) or ""
            if "nounits" not in fmt and v != "[N/A]":
                v += _UNITS.get(f, "")
            row.append(v)
        print(", ".join(row), file=out)
    return 0


def dcgmi(argv: Sequence[str], gpu_dir: Path, emu: EmuGpu, out: TextIO, err: TextIO) -> int:
    args = list(argv)
    if not args or args[0] != "stats":
        print("slurmpod sandbox dcgmi: only `dcgmi stats -j JOBID [-v] [--host NODE]` is "
              "emulated", file=err)
        return 2
    job = host = None
    i = 1
    while i < len(args):
        a = args[i]
        if a in ("-j", "--jobid", "--job") and i + 1 < len(args):
            job, i = args[i + 1], i + 2
        elif a == "--host" and i + 1 < len(args):
            host, i = args[i + 1], i + 2
        elif a in ("-v", "--verbose"):
            i += 1
        else:  # -s/-x/-e/-g: the site's Prolog/Epilog bracketing; the sandbox needs none
            i += 1
    if job is None:
        print("Error: -j JOBID is required", file=err)
        return 2
    node = host or os.environ.get("SLURMD_NODENAME", "")
    gpus = job_on_node(gpu_dir, job, node)
    if not gpus:
        print("Error: Unable to get job statistics. Return: No data is available", file=out)
        return 255
    act, ranks = gpu_activity.read_job(gpu_dir / job)
    start = min([_num(r.get("t")) for r in ranks if r.get("node") == node]
                + ([_num(act.get("t0"))] if act else []))
    out.write(dcgmi_job_stats(job, gpus, emu, start))
    return 0


def main(tool: str, argv: Sequence[str], gpu_dir: str, figures: Mapping[str, Any]) -> int:
    """Entry point of the installed shims (`<state>/bin/dcgmi`, `<state>/bin/nvidia-smi`)."""
    emu = EmuGpu(str(figures["name"]), float(figures["hbm_gib"]), float(figures["max_w"]),
                 float(figures["idle_w"]))
    try:
        if tool == "dcgmi":
            return dcgmi(argv, Path(gpu_dir), emu, sys.stdout, sys.stderr)
        return nvidia_smi(argv, Path(gpu_dir), emu, dict(figures["nodes"]), os.environ,
                          sys.stdout, sys.stderr)
    except BrokenPipeError:
        return 1


def shim_figures(site: Any) -> dict[str, Any]:
    """The emulated GPU's figures and each node's GPU count, from the site (`sandbox up`)."""

    nodes: dict[str, int] = {}
    name, hbm, model = "emulated GPU", 80.0, "emu"
    for n in site.inventory.nodes:
        nt = site.node_types[n.node_type]
        nodes[n.name] = int(nt.gpus)
        name, hbm, model = nt.gpu.name, float(nt.gpu.hbm_gib), nt.gpu.model
    max_w = POWER_LIMIT_W.get(model.lower(), POWER_LIMIT_UNKNOWN_W)
    return {"name": name, "hbm_gib": hbm, "max_w": max_w, "idle_w": max_w * IDLE_SHARE,
            "nodes": nodes}


def shim_script(tool: str, python: str, package_parent: str, gpu_dir: str,
                figures: Mapping[str, Any]) -> str:
    """The text of `<state>/bin/<tool>`: the sandbox's interpreter, no shell. The figures are
    a literal (JSON of strings and numbers, which Python reads as is)."""

    literal = json.dumps(dict(figures), indent=1, sort_keys=True)
    return (f"#!{python}\n"
            f"# slurmpod sandbox only: an emulated {tool} (slurmpod/sandbox/gpu_shims.py).\n"
            "import sys\n"
            f"sys.path.insert(0, {package_parent!r})\n"
            "from slurmpod.sandbox.gpu_shims import main\n"
            f"sys.exit(main({tool!r}, sys.argv[1:], {gpu_dir!r},\n{literal}))\n")
