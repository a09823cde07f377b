"""Time from nothing to every node idle for the sandbox (16 emulated 8-GPU nodes, accounting on).

cold: a fresh state directory (munge key, MariaDB data directory, Slurm state all created);
warm: `up` again on the same directory after `down` (database and Slurm state kept).
Also prints `down` time and the memory (RSS) of the running daemons. Target: cold < 10 s.

    .venv/bin/python benchmarks/sandbox_start.py [--runs 2] [--site sandbox]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from slurmpod.sandbox.cluster import Sandbox

TARGET_S = 10.0


def rss_mib(pids: list[int]) -> float:
    total_kib = 0
    for pid in pids:
        try:
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total_kib += int(line.split()[1])
        except OSError:
            continue
    return total_kib / 1024


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=2, help="cold and warm starts to time (each)")
    ap.add_argument("--site", default=None, help="site file or built-in name (default sandbox)")
    args = ap.parse_args()

    cold: list[float] = []
    warm: list[float] = []
    downs: list[float] = []
    nodes = 0
    rss = 0.0
    n_procs = 0
    for run in range(args.runs):
        state = Path(tempfile.mkdtemp(prefix="slurmpod-bench-", dir="/tmp"))
        try:
            sb = Sandbox(state, args.site)
            for kind, sink in (("cold", cold), ("warm", warm)):
                t = time.perf_counter()
                res = sb.up()
                sink.append(time.perf_counter() - t)
                nodes = res.nodes
                if run == 0 and kind == "cold":
                    pids = [p.pid for p in sb.status().processes if p.alive]
                    n_procs, rss = len(pids), rss_mib(pids)
                t = time.perf_counter()
                sb.down()
                downs.append(time.perf_counter() - t)
                print(f"run {run + 1} {kind}: {sink[-1]:.2f} s to {nodes} idle nodes, "
                      f"down {downs[-1]:.2f} s", flush=True)
        finally:
            Sandbox(state, args.site).down()
            shutil.rmtree(state, ignore_errors=True)

    def fmt(xs: list[float]) -> str:
        return f"median {statistics.median(xs):.2f} s (min {min(xs):.2f}, max {max(xs):.2f})"

    load = os.getloadavg()
    print(f"host: {os.cpu_count()} CPUs, load average {load[0]:.1f} {load[1]:.1f} {load[2]:.1f} "
          "(other work on the host slows every start)")
    print(f"nodes: {nodes} (x 8 emulated GPUs), accounting: MariaDB + slurmdbd")
    print(f"cold start (fresh directory): {fmt(cold)}")
    print(f"warm start (same directory):  {fmt(warm)}")
    print(f"down:                         {fmt(downs)}")
    print(f"cold/warm ratio: {statistics.median(cold) / statistics.median(warm):.2f}")
    print(f"daemons: {n_procs} processes, {rss:.0f} MiB RSS in all "
          f"({rss / max(n_procs, 1):.1f} MiB each on average)")
    verdict = "met" if statistics.median(cold) < TARGET_S else "MISSED"
    print(f"target: cold start < {TARGET_S:.0f} s: {verdict} "
          f"({statistics.median(cold) / TARGET_S:.0%} of the budget)")


if __name__ == "__main__":
    main()
