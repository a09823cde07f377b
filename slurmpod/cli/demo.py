"""`slurmpod demo`: the main job end to end on the embedded sandbox.

Generates the sandbox site's topology, brings up a real Slurm on this machine, plans and submits
a tiny Megatron-style run (the sandbox workload stands in for Megatron), waits for it, and shows
what Slurm accounting and slurmpod's hooks recorded: placement, MFU, goodput, the report.
Each step is the same slurmpod command a user would type, run as a subprocess.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import click

from slurmpod.errors import SlurmError, SlurmpodError
from slurmpod.sandbox.workload import EMULATOR_MODULE

DEMO_RUN = """\
# The demo run: a tiny GPT on 2 emulated nodes x 8 "GPUs" of the sandbox site.
[job]
name = "demo-gpt"
nodes = 2
partition = "batch"
time_limit = "00:10:00"
entrypoint = {entrypoint}
work_dir = {work_dir}

[megatron]
num_layers = 4
hidden_size = 256
num_attention_heads = 4
seq_length = 256
max_position_embeddings = 256
vocab_size = 1024
tensor_model_parallel_size = 2
pipeline_model_parallel_size = 2
sequence_parallel = true
use_distributed_optimizer = true
micro_batch_size = 2
global_batch_size = 32
train_iters = {iters}
log_interval = 1
save_interval = 10
bf16 = true
"""


def _step(n: int, total: int, text: str) -> None:
    click.secho(f"\n[{n}/{total}] {text}", bold=True, err=True)


def _slurmpod(args: list[str], env: dict[str, str], *, timeout_s: float = 300,
              check: bool = True) -> subprocess.CompletedProcess[str]:
    cp = subprocess.run([sys.executable, "-m", "slurmpod", *args], env=env, text=True,
                        capture_output=True, timeout=timeout_s, stdin=subprocess.DEVNULL,
                        check=False)
    if check and cp.returncode != 0:
        last = (cp.stderr or cp.stdout).strip().splitlines()[-1:] or ["no output"]
        raise SlurmpodError(f"`slurmpod {' '.join(args[:2])}` failed: {last[0]}")
    return cp


def _echo_indented(text: str) -> None:
    for line in text.rstrip().splitlines():
        click.echo(f"    {line}")


@click.command()
@click.option("--state", "state_dir", type=click.Path(file_okay=False, path_type=Path),
              default=None,
              help="Sandbox state directory [default: $SLURMPOD_SANDBOX or ./.sandbox].")
@click.option("--iters", type=click.IntRange(5, 10_000), default=30, show_default=True,
              help="Training iterations of the demo run.")
@click.option("--timeout", "timeout_s", type=float, default=600.0, show_default=True,
              help="Seconds to wait for the job to finish.")
@click.option("--down", is_flag=True, help="Stop the sandbox at the end.")
def demo(state_dir: Path | None, iters: int, timeout_s: float, down: bool) -> None:
    """Run slurmpod end to end on the embedded sandbox (a real Slurm on this machine)."""
    from slurmpod.sandbox.cluster import Sandbox, default_state_dir  # lazy: start-up

    state = (state_dir or default_state_dir()).absolute()
    total = 6
    _step(1, total, "Site: the embedded sandbox (site_configs/sandbox.toml)")
    env = dict(os.environ)
    _echo_indented(_slurmpod(["topo", "show", "sandbox"], env).stdout)
    out_dir = state / "demo" / "topology"
    _slurmpod(["topo", "generate", "sandbox", "-o", str(out_dir)], env)
    click.echo(f"    artefacts: {', '.join(sorted(p.name for p in out_dir.iterdir()))} "
               f"in {out_dir}")

    _step(2, total, f"Sandbox: real munge, MariaDB, slurmdbd, slurmctld and 16 slurmd ({state})")
    sb = Sandbox(state, None, progress=lambda m: click.echo(f"    {m}", err=True))
    res = sb.up()
    click.echo(f"    {'already running' if res.already_running else 'up'}: {res.nodes} nodes idle")
    # SLURM_CONF, and SLURMPOD_SITE: the sandbox site with the "GPU" peak measured on this CPU.
    env = sb.client_env()
    _echo_indented(sb.run(["scontrol", "show", "topology"]).stdout)

    _step(3, total, "Plan: a tiny GPT on 2 nodes x 8 GPUs (TP=2, PP=2, DP=4)")
    run_dir = state / "demo" / "run"
    run_file = state / "demo" / "run.toml"
    # A fresh run each time: the last demo's checkpoint is at the final iteration, so resuming
    # from it would end the job at once with nothing to report.
    shutil.rmtree(run_dir, ignore_errors=True)
    entry = f"{sys.executable} -m {EMULATOR_MODULE}"
    run_file.write_text(DEMO_RUN.format(entrypoint=json.dumps(entry),
                                        work_dir=json.dumps(str(run_dir)), iters=iters))
    _echo_indented(_slurmpod(["plan", str(run_file)], env).stdout)

    _step(4, total, "Submit: render the sbatch script and queue it on the sandbox")
    topo_dir = out_dir / "nccl-topo"
    sub = json.loads(_slurmpod(["submit", str(run_file), "--force",
                                "--topo-dir", str(topo_dir), "--json"], env).stdout)
    job_id = sub["job_ids"][-1]
    click.echo(f"    job {job_id} submitted; script {sub.get('script')}")

    _step(5, total, f"Run: waiting for job {job_id}")
    record = _wait(sb, job_id, timeout_s)
    click.echo(f"    job {job_id} {record['State']} in {record['Elapsed']} on {record['NodeList']}")

    _step(6, total, f"Report: what Slurm accounting and the hooks recorded for job {job_id}")
    rep = _slurmpod(["report", job_id, "--spool", str(sb.spool_dir)], env,
                    check=False)
    if rep.returncode == 0:
        _echo_indented(rep.stdout)
    else:
        click.echo(f"    AdminComment: {record.get('AdminComment') or '(none)'}")
        click.echo(f"    Comment: {record.get('Comment') or '(none)'}")
    if down:
        sb.down()
        click.echo("\nsandbox stopped")
    else:
        click.echo(f'\nThe sandbox is still running: eval "$(slurmpod sandbox env --state {state})"'
                   f"; stop it with: slurmpod sandbox down --state {state}")


def _wait(sb: Any, job_id: str, timeout_s: float) -> dict[str, str]:
    """Poll sacct until the job has ended and its epilog record is in; return the row."""
    fields = "JobID,State,Elapsed,NodeList,Comment,AdminComment"
    deadline = time.monotonic() + timeout_s
    ended_at: float | None = None
    last_state = ""
    while True:
        cp = sb.run(["sacct", "-X", "-n", "-P", "-j", job_id, "-o", fields], check=False)
        rows = [r.split("|") for r in cp.stdout.splitlines() if r.startswith(job_id + "|")]
        row = dict(zip(fields.split(","), rows[-1], strict=False)) if rows else {}
        state = row.get("State", "PENDING")
        if state != last_state:
            click.echo(f"    {time.strftime('%H:%M:%S')} {state}", err=True)
            last_state = state
        ended = state and not state.startswith(("PENDING", "RUNNING", "REQUEUED", "COMPLETING",
                                                "CONFIGURING", "SUSPENDED"))
        if ended:
            ended_at = ended_at or time.monotonic()
            # The EpilogSlurmctld hook writes AdminComment a moment after the job ends.
            if row.get("AdminComment") or time.monotonic() - ended_at > 30:
                return row
        if time.monotonic() > deadline:
            if ended:
                return row
            raise SlurmError(f"job {job_id} did not finish within {timeout_s:g} s (state {state})",
                             hint="raise --timeout, or look at squeue and the job's log")
        time.sleep(1.0)
