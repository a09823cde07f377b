"""Benchmark the Slurm backend plumbing: parser throughput on recorded Slurm 22.05 output grown
to large clusters, LocalRunner overhead over a bare subprocess, and (with --ssh HOST) the cost of
one reused SSH connection versus a new `ssh` per command.

    .venv/bin/python benchmarks/backend_overhead.py [--jobs 1000 10000 50000] [--ssh ALIAS]

Prints sizes, times and ratios; asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import time
from pathlib import Path

from slurmpod.backends.parse import (
    SACCT_DELIMITER,
    parse_sacct_parsable,
    parse_squeue_json,
)
from slurmpod.transport.local import LocalRunner

DATA = Path(__file__).resolve().parents[1] / "tests" / "data" / "slurm" / "22.05"


def grow_sacct(n_jobs: int) -> str:
    """n_jobs copies of recorded job 9 (job + batch + 2 steps), with fresh ids."""
    rows = [ln for ln in (DATA / "sacct.parsable2.txt").read_text().split("\n")
            if ln.split(SACCT_DELIMITER)[0].split(".")[0] == "9"]
    out = []
    for i in range(n_jobs):
        jid = str(100000 + i)
        for row in rows:
            f = row.split(SACCT_DELIMITER)
            f[0] = f[0].replace("9", jid, 1)
            f[-1] = f[-1].replace("9", jid, 1)
            out.append(SACCT_DELIMITER.join(f))
    return "\n".join(out) + "\n"


def grow_squeue(n_jobs: int) -> str:
    data = json.loads((DATA / "squeue.json").read_text())
    proto = data["jobs"]
    jobs = []
    for i in range(n_jobs):
        job = dict(proto[i % len(proto)])
        job["job_id"] = 100000 + i
        job["array_job_id"], job["array_task_id"] = 0, None
        jobs.append(job)
    data["jobs"] = jobs
    return json.dumps(data)


def timed(fn, repeat: int = 3) -> float:
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def bench_parsers(sizes: list[int]) -> None:
    print("parsers (best of 3)")
    print(f"  {'jobs':>7} {'sacct MB':>9} {'sacct s':>8} {'jobs/s':>9} "
          f"{'squeue MB':>10} {'squeue s':>9} {'jobs/s':>9}")
    for n in sizes:
        sacct = grow_sacct(n)
        squeue = grow_squeue(n)
        ts = timed(lambda s=sacct: parse_sacct_parsable(s))
        tq = timed(lambda s=squeue: parse_squeue_json(s))
        assert len(parse_sacct_parsable(sacct)) == n
        print(f"  {n:7d} {len(sacct) / 1e6:9.2f} {ts:8.3f} {n / ts:9.0f} "
              f"{len(squeue) / 1e6:10.2f} {tq:9.3f} {n / tq:9.0f}")


def bench_local(reps: int) -> None:
    runner = LocalRunner()
    bare, ours = [], []
    for _ in range(reps):
        t0 = time.perf_counter()
        subprocess.run(["true"], capture_output=True, check=True)
        bare.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        runner.run(["true"])
        ours.append(time.perf_counter() - t0)
    b, o = statistics.median(bare) * 1e3, statistics.median(ours) * 1e3
    print(f"local `true` x{reps}: bare subprocess {b:.2f} ms, LocalRunner {o:.2f} ms "
          f"(ratio {o / b:.2f})")


def bench_ssh(alias: str, reps: int, ssh_config: str, known_hosts: str | None) -> None:
    from slurmpod.transport.ssh import SshRunner

    runner = SshRunner(alias, ssh_config=ssh_config, known_hosts=known_hosts)
    t0 = time.perf_counter()
    runner.run(["true"])
    first = time.perf_counter() - t0
    reused = []
    for _ in range(reps):
        t0 = time.perf_counter()
        runner.run(["true"])
        reused.append(time.perf_counter() - t0)
    runner.close()
    fresh = []
    for _ in range(max(reps // 4, 3)):
        t0 = time.perf_counter()
        opts = ["-F", str(Path(ssh_config).expanduser()), "-o", "BatchMode=yes"]
        if known_hosts:
            opts += ["-o", f"UserKnownHostsFile={known_hosts}"]
        subprocess.run(["ssh", *opts, alias, "true"], capture_output=True, check=True,
                       timeout=30)
        fresh.append(time.perf_counter() - t0)
    r, f = statistics.median(reused) * 1e3, statistics.median(fresh) * 1e3
    print(f"ssh {alias}: first command (connect + auth) {first * 1e3:.1f} ms, "
          f"reused connection {r:.1f} ms/command, new `ssh` per command {f:.1f} ms "
          f"(reuse is {f / r:.1f}x faster)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, nargs="+", default=[1000, 10000, 50000])
    ap.add_argument("--reps", type=int, default=40)
    ap.add_argument("--ssh", metavar="HOST", default=None)
    ap.add_argument("--ssh-config", default="~/.ssh/config")
    ap.add_argument("--known-hosts", default=None)
    args = ap.parse_args()
    bench_parsers(args.jobs)
    bench_local(args.reps)
    if args.ssh:
        bench_ssh(args.ssh, args.reps, args.ssh_config, args.known_hosts)


if __name__ == "__main__":
    main()
