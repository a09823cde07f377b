"""What `slurmpod submit` adds over a bare `sbatch` of the same script, on a running sandbox.

Both paths queue the identical script (the one slurmpod stores in the run directory). slurmpod's
time includes Python start-up, loading site and run spec, planning, rendering, the marker file
and its own `sbatch --parsable`. Target: under 0.3 s added per submission.

    python benchmarks/submit_overhead.py [--rounds 10] [--state DIR]

Without --state (or $SLURMPOD_SANDBOX) a private sandbox without accounting is started and
stopped again. Jobs are submitted held (`--hold` for sbatch, a hold right after slurmpod) and
cancelled at the end, so the cluster stays idle.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

RUN = """
[job]
name = "overhead"
nodes = 1
time_limit = "00:05:00"
entrypoint = "/bin/true"
work_dir = "{work}"

[megatron]
num_layers = 4
hidden_size = 256
num_attention_heads = 8
seq_length = 128
vocab_size = 1024
tensor_model_parallel_size = 8
global_batch_size = 8
train_iters = 10
"""


def _child_cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def timed(argv: list[str], env: dict[str, str]) -> tuple[float, float, str]:
    """Wall seconds, CPU seconds of the command (and its children), stdout."""
    c = _child_cpu()
    t = time.perf_counter()
    cp = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120,
                        stdin=subprocess.DEVNULL)
    dt = time.perf_counter() - t
    if cp.returncode != 0:
        sys.exit(f"{' '.join(argv[:4])} failed: {cp.stderr.strip()}")
    return dt, _child_cpu() - c, cp.stdout.strip()


PHASES = r"""
import sys, time
t0 = time.process_time(); marks = []
def mark(name): marks.append((name, time.process_time()))
import click; mark("python + click")
from slurmpod.submit import read_run_and_site, resolve_run_dir, plan_or_refuse, prepare
from slurmpod.render.sbatch import RenderOptions
mark("slurmpod.submit import")
run, site, label = read_run_and_site(__import__("pathlib").Path(sys.argv[1]), None)
mark("site + run spec (pydantic)")
plan_or_refuse(run, site); mark("plan (planner + numpy)")
prepare(run, site, RenderOptions(topo_dir=""), "/tmp/x"); mark("plan again + render (jinja2)")
prev = 0.0
for name, t in marks:
    print(f"  {name:<32}{t - prev:8.3f} s CPU"); prev = t
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--state", default=os.environ.get("SLURMPOD_SANDBOX"))
    args = ap.parse_args()

    from slurmpod.sandbox.cluster import Sandbox

    own = args.state is None
    state = Path(args.state or tempfile.mkdtemp(prefix="slurmpod-bench-", dir="/tmp"))
    sb = Sandbox(state, accounting=False)
    if own:
        sb.up()
    env = {**os.environ, **sb.client_env()}
    work = Path(tempfile.mkdtemp(prefix="slurmpod-overhead-", dir="/tmp"))
    run = work / "run.toml"
    run.write_text(RUN.format(work=work / "run"))
    jobs: list[str] = []
    t_sp: list[float] = []
    t_sb: list[float] = []
    c_sp: list[float] = []
    c_sb: list[float] = []
    try:
        slurmpod = [sys.executable, "-m", "slurmpod", "submit", str(run), "--force",
                    "--topo-dir", ""]
        timed(slurmpod, env)  # warm the page cache for both paths
        script = work / "run" / "overhead.sbatch"
        for _ in range(args.rounds):
            dt, cpu, out = timed(slurmpod, env)
            jobs.append(out.split()[-1])
            subprocess.run(["scontrol", "hold", jobs[-1]], env=env, capture_output=True)
            t_sp.append(dt)
            c_sp.append(cpu)
            dt, cpu, out = timed(["sbatch", "--parsable", "--hold", str(script)], env)
            jobs.append(out.split(";")[0])
            t_sb.append(dt)
            c_sb.append(cpu)
    finally:
        if jobs:
            subprocess.run(["scancel", *jobs], env=env, capture_output=True)
        if own:
            sb.down()

    med_sp, med_sb = statistics.median(t_sp), statistics.median(t_sb)
    print(f"rounds: {args.rounds}   script: {script.stat().st_size} bytes, "
          f"{len(script.read_text().splitlines())} lines")
    load = os.getloadavg()[0]
    print(f"load average during the run: {load:.1f} on {os.cpu_count()} CPUs "
          "(wall times stretch with load; CPU times do not)")
    print(f"{'path':<28}{'median s':>10}{'mean s':>10}{'min s':>10}{'max s':>10}"
          f"{'CPU med s':>11}")
    for name, t, c in (("slurmpod submit (CLI)", t_sp, c_sp),
                       ("bare sbatch, same script", t_sb, c_sb)):
        print(f"{name:<28}{statistics.median(t):>10.3f}{statistics.mean(t):>10.3f}"
              f"{min(t):>10.3f}{max(t):>10.3f}{statistics.median(c):>11.3f}")
    print("where slurmpod's CPU goes (one fresh process, in order):")
    subprocess.run([sys.executable, "-c", PHASES, str(run)], env=env, check=False)
    added = med_sp - med_sb
    added_cpu = statistics.median(c_sp) - statistics.median(c_sb)
    print(f"slurmpod adds {added:.3f} s wall ({added_cpu:.3f} s CPU) per submission (median), "
          f"ratio {med_sp / med_sb:.1f}x; target < 0.300 s: "
          f"{'met' if added < 0.3 else 'NOT met'}")


if __name__ == "__main__":
    main()
