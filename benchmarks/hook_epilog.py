"""Cost of the accounting hooks on big logs: the epilog (capped read, parse, summary, record) and
one monitor poll, for synthetic Megatron logs of growing size.

Prints, per log size: wall time and peak RSS of one epilog run (each in a fresh process, so the
RSS is its own), and the time of a monitor poll over a fixed-size chunk. The epilog reads at most
1 MiB + 64 MiB, so its time and memory should stop growing once the log is larger than that.

    .venv/bin/python benchmarks/hook_epilog.py [--sizes-mb 8,64,512] [--dir /tmp]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

LINE = (" [2026-01-02 03:04:05.123456] iteration {i:8d}/ 9999999 | consumed samples: {c:12d} | "
        "elapsed time per iteration (ms): {ms:.1f} | throughput per GPU (TFLOP/s/GPU): 412.3 | "
        "learning rate: 1.000000E-04 | global batch size:  1024 | lm loss: 2.123456E+00 | "
        "loss scale: 1.0 | grad norm: 0.512 | number of skipped iterations:   0 | "
        "number of nan iterations:   0 |\n")


def make_log(path: Path, size_mb: int) -> int:
    target = size_mb << 20
    written, i = 0, 1
    with path.open("wb") as fh:
        while written < target:
            data = "".join(LINE.format(i=k, c=k * 1024, ms=1000.0 + (k % 13))
                           for k in range(i, i + 5000)).encode()
            fh.write(data)
            written += len(data)
            i += 5000
    return written


CHILD = r"""
import json, os, resource, sys, time
from slurmpod.accounting.epilog import run_epilog
log, spool = sys.argv[1], sys.argv[2]
env = {"SLURM_JOB_ID": "1", "SLURM_JOB_UID": str(os.getuid()), "SLURM_JOB_STDOUT": log,
       "SLURM_JOB_COMMENT": json.dumps({"slurmpod": "bench", "flops_per_iter": 4.075e17,
                                        "gpus": 1024, "peak_tflops": 989.0})}
got = []
t = time.perf_counter()
run_epilog(env, spool, deliver=lambda j, k, v: got.append(v))
dt = time.perf_counter() - t
print(json.dumps({"s": dt, "rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                  "admin": got[0] if got else None}))
"""


def epilog_run(log: Path, spool: Path) -> dict:
    cp = subprocess.run([sys.executable, "-c", CHILD, str(log), str(spool)], capture_output=True,
                        text=True, check=True)
    return json.loads(cp.stdout.strip().splitlines()[-1])


def monitor_poll(log: Path, chunk_mb: int) -> tuple[float, int]:
    from slurmpod.accounting.monitor import LogTail, MonitorState, parse_chunk

    tail = LogTail(log, max_chunk_bytes=chunk_mb << 20)
    state = MonitorState()
    t = time.perf_counter()
    data = tail.read_new()
    parse_chunk(data, state)
    return time.perf_counter() - t, len(data)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes-mb", default="8,64,512")
    ap.add_argument("--dir", default=tempfile.gettempdir())
    args = ap.parse_args()
    sizes = [int(s) for s in args.sizes_mb.split(",")]
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        base = Path(tmp)
        print(f"{'log MiB':>8} {'epilog s':>9} {'MiB/s read':>11} {'RSS MiB':>8} "
              f"{'poll 64MiB s':>13} {'poll MiB/s':>11}")
        first = None
        for size in sizes:
            log = base / f"log-{size}.out"
            n = make_log(log, size)
            res = epilog_run(log, base / f"spool-{size}")
            read_mib = min(n, (1 + 64) << 20) / (1 << 20)
            poll_s, poll_n = monitor_poll(log, 64)
            print(f"{n / (1 << 20):8.0f} {res['s']:9.2f} {read_mib / res['s']:11.0f} "
                  f"{res['rss_mib']:8.0f} {poll_s:13.2f} {poll_n / (1 << 20) / poll_s:11.0f}")
            first = first or res
            last = res
            os.unlink(log)
        print(f"epilog time ratio largest/smallest log: {last['s'] / first['s']:.2f} "
              f"(logs {sizes[-1] / sizes[0]:.0f}x larger); RSS ratio "
              f"{last['rss_mib'] / first['rss_mib']:.2f}")
        print(f"AdminComment ({len(last['admin'])} bytes): {last['admin']}")


if __name__ == "__main__":
    main()
