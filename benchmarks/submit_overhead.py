"""What `slurmpod submit` adds over a bare `sbatch` of the same script, on a running sandbox.

Both paths queue the identical script (the one slurmpod stores in the run directory). slurmpod's
time includes Python start-up, loading site and run spec, planning, rendering, the marker file
and its own `sbatch --parsable`. Target: under 0.3 s added per submission.

Two slurmpod rows: "resubmit" queues the same run spec again (its prepared script comes from
~/.cache/slurmpod/prepared), "edited spec" gets a run spec whose bytes changed since the last
round (a comment line), so it validates, plans and renders in full. slurmpod's bytecode is
compiled first, as pip does at install (with PYTHONDONTWRITEBYTECODE set, a source checkout would
otherwise recompile every module on every run).

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
from typing import Any

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
mark("site + run spec (msgspec)")
plan_or_refuse(run, site); mark("plan (no placement: no numpy)")
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

    import compileall

    import slurmpod
    from slurmpod.sandbox.cluster import Sandbox

    compileall.compile_dir(Path(slurmpod.__file__).parent, quiet=2)

    own = args.state is None
    state = Path(args.state or tempfile.mkdtemp(prefix="slurmpod-bench-", dir="/tmp"))
    sb = Sandbox(state, accounting=False)
    if own:
        sb.up()
    env = {**os.environ, **sb.client_env()}
    work = Path(tempfile.mkdtemp(prefix="slurmpod-overhead-", dir="/tmp"))
    run = work / "run.toml"
    run.write_text(RUN.format(work=work / "run"))
    edited = work / "edited.toml"
    jobs: list[str] = []
    rows = {"resubmit": ([], []), "edited spec": ([], []), "sbatch": ([], [])}

    def slurmpod(path: Path) -> list[str]:
        return [sys.executable, "-m", "slurmpod", "submit", str(path), "--force", "--topo-dir",
                ""]

    def queue(name: str, argv: list[str], job_of: Any) -> None:
        dt, cpu, out = timed(argv, env)
        jobs.append(job_of(out))
        if name != "sbatch":
            subprocess.run(["scontrol", "hold", jobs[-1]], env=env, capture_output=True)
        rows[name][0].append(dt)
        rows[name][1].append(cpu)

    try:
        timed(slurmpod(run), env)  # warm the page cache (and the prepared script of run.toml)
        script = work / "run" / "overhead.sbatch"
        for i in range(args.rounds):
            queue("resubmit", slurmpod(run), lambda out: out.split()[-1])
            # New bytes, same meaning: a comment line (the script and its token stay the same).
            edited.write_text(run.read_text() + f"# edit {i} {time.time()}\n")
            queue("edited spec", slurmpod(edited), lambda out: out.split()[-1])
            queue("sbatch", ["sbatch", "--parsable", "--hold", str(script)],
                  lambda out: out.split(";")[0])
    finally:
        if jobs:
            subprocess.run(["scancel", *jobs], env=env, capture_output=True)
        if own:
            sb.down()

    print(f"rounds: {args.rounds}   script: {script.stat().st_size} bytes, "
          f"{len(script.read_text().splitlines())} lines")
    load = os.getloadavg()[0]
    print(f"load average during the run: {load:.1f} on {os.cpu_count()} CPUs "
          "(wall times stretch with load; CPU times do not)")
    print(f"{'path':<34}{'median s':>10}{'mean s':>10}{'min s':>10}{'max s':>10}"
          f"{'CPU med s':>11}")
    labels = {"resubmit": "slurmpod submit, resubmit", "edited spec":
              "slurmpod submit, edited spec", "sbatch": "bare sbatch, same script"}
    for name, (t, c) in rows.items():
        print(f"{labels[name]:<34}{statistics.median(t):>10.3f}{statistics.mean(t):>10.3f}"
              f"{min(t):>10.3f}{max(t):>10.3f}{statistics.median(c):>11.3f}")
    print("where an edited spec's CPU goes (one fresh process, in order):")
    subprocess.run([sys.executable, "-c", PHASES, str(run)], env=env, check=False)
    med_sb, cpu_sb = (statistics.median(v) for v in rows["sbatch"])
    for name in ("resubmit", "edited spec"):
        med, cpu = (statistics.median(v) for v in rows[name])
        added = med - med_sb
        print(f"{name}: slurmpod adds {added:.3f} s wall ({cpu - cpu_sb:.3f} s CPU) per "
              f"submission (median), ratio {med / med_sb:.1f}x; target < 0.300 s: "
              f"{'met' if added < 0.3 else 'NOT met'}")


if __name__ == "__main__":
    main()
