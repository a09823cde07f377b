"""Cost of the accounting hooks on big logs: the epilog (capped read, parse, summary, record) and
one monitor poll, for synthetic Megatron logs of growing size.

Prints, per log size: wall time and peak RSS of one epilog run (each in a fresh process, so the
RSS is its own), and the time of a monitor poll over a fixed-size chunk. The epilog reads at most
1 MiB + 64 MiB, so its time and memory should stop growing once the log is larger than that.

Then the two figures an admin cares about on a busy controller:
- the epilog of a job that is not slurmpod's (no slurmpod Comment, a 36 MiB log of other
  output): the hook decides from the Comment and the log's first MiB (target < 20 ms in the
  process; the interpreter's start-up is printed separately);
- N epilogs of N slurmpod jobs with 36 MiB logs at the same time (a wave of jobs ending
  together; target < 1 s each for 6).

    .venv/bin/python benchmarks/hook_epilog.py [--sizes-mb 8,64,512] [--concurrent 6]
        [--concurrent-mb 36] [--dir /tmp]
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


def make_other_log(path: Path, size_mb: int) -> int:
    """Output of a job that is not Megatron's (a simulation printing progress lines)."""
    line = "step {k:9d}  t = {t:.6e}  residual = 1.234567e-05  cfl = 0.81  dt = 2.5e-4\n"
    target = size_mb << 20
    written, k = 0, 1
    with path.open("wb") as fh:
        while written < target:
            data = "".join(line.format(k=j, t=j * 2.5e-4) for j in range(k, k + 5000)).encode()
            fh.write(data)
            written += len(data)
            k += 5000
    return written


CHILD = r"""
import json, os, resource, sys, time
t0 = time.perf_counter()
from slurmpod.accounting.epilog import run_epilog
log, spool, job_id, tracked = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4] == "1"
comment = json.dumps({"slurmpod": "bench", "flops_per_iter": 4.075e17}) if tracked else ""
env = {"SLURM_JOB_ID": job_id, "SLURM_JOB_UID": str(os.getuid()), "SLURM_JOB_STDOUT": log,
       "SLURM_JOB_NAME": "bench", "SLURM_JOB_NUM_NODES": "128",
       "SLURM_JOB_GPUS": "0,1,2,3,4,5,6,7", "SLURM_JOB_COMMENT": comment}
got = []
t_import = time.perf_counter() - t0
t = time.perf_counter()
run_epilog(env, spool, deliver=lambda j, k, v: got.append(v), peak_tflops=989.0,
           show_job=lambda jid: None, admin_now=lambda jid: None)
dt = time.perf_counter() - t
print(json.dumps({"s": dt, "rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                  "import_s": t_import, "admin": got[0] if got else None}))
"""


def _child(log: Path, spool: Path, job_id: str = "1", tracked: bool = True) -> list[str]:
    return [sys.executable, "-c", CHILD, str(log), str(spool), job_id, "1" if tracked else "0"]


def epilog_run(log: Path, spool: Path, tracked: bool = True) -> dict:
    t = time.perf_counter()
    cp = subprocess.run(_child(log, spool, tracked=tracked), capture_output=True, text=True,
                        check=True)
    res = json.loads(cp.stdout.strip().splitlines()[-1])
    res["process_s"] = time.perf_counter() - t
    return res


def concurrent_epilogs(base: Path, n: int, size_mb: int) -> list[dict]:
    """n epilogs of n different jobs' logs at once, each in its own process."""
    logs = []
    for k in range(n):
        log = base / f"wave-{k}.out"
        make_log(log, size_mb)
        logs.append(log)
    procs = [subprocess.Popen(_child(log, base / "spool-wave", str(100 + k)),
                              stdout=subprocess.PIPE, text=True)
             for k, log in enumerate(logs)]
    out = []
    for p in procs:
        stdout, _ = p.communicate()
        out.append(json.loads(stdout.strip().splitlines()[-1]))
    for log in logs:
        os.unlink(log)
    return out


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
    ap.add_argument("--concurrent", type=int, default=6)
    ap.add_argument("--concurrent-mb", type=int, default=36)
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

        other = base / "other.out"
        n = make_other_log(other, args.concurrent_mb)
        runs = sorted((epilog_run(other, base / "spool-other", tracked=False)
                       for _ in range(5)), key=lambda r: r["s"])
        med = runs[len(runs) // 2]
        print(f"\nnot a slurmpod job, {n / (1 << 20):.0f} MiB log of other output: epilog "
              f"{med['s'] * 1000:.1f} ms in the process (median of 5; target < 20 ms), "
              f"{med['import_s'] * 1000:.0f} ms imports, {med['process_s'] * 1000:.0f} ms "
              f"for the whole process; stored: {med['admin'] is not None}")
        os.unlink(other)

        wave = concurrent_epilogs(base, args.concurrent, args.concurrent_mb)
        times = sorted(r["s"] for r in wave)
        print(f"{args.concurrent} concurrent epilogs of {args.concurrent_mb} MiB iteration-line "
              f"logs on {os.cpu_count()} CPUs: {', '.join(f'{t:.2f}' for t in times)} s each "
              f"(worst {times[-1]:.2f} s; target < 1 s), peak RSS "
              f"{max(r['rss_mib'] for r in wave):.0f} MiB")


if __name__ == "__main__":
    main()
