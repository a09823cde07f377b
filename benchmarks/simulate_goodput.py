"""`slurmpod simulate` speed, and the goodput figures of docs/resilience.md.

Prints (1) the time to simulate a 90-day run of 100,000 GPUs (12,500 nodes, ~4,300 failures a
run) with `--samples` sample runs and the 41-point interval search, for exponential and Weibull
(k = 0.7) nodes (target: < 5 s on a 2-core machine, fastest of `--repeat`); (2) the table of
goodput at 1k/10k/100k GPUs for the site's default node MTBF (6,300 h), a 60 s save (a 405B
model's 5.7 TB at ~100 GB/s) and restarts of 10 and 2 minutes.

    .venv/bin/python benchmarks/simulate_goodput.py [--samples 200] [--repeat 3]
"""

from __future__ import annotations

import argparse
import time

from slurmpod.resilience.interval import expected_goodput
from slurmpod.resilience.simulate import Scenario, simulate


def timed(scn: Scenario, samples: int, repeat: int) -> tuple[float, float]:
    best = float("inf")
    failures = 0.0
    for _ in range(repeat):
        t = time.perf_counter()
        res = simulate(scn, samples=samples, seed=0)
        best = min(best, time.perf_counter() - t)
        failures = res.failures_mean
    return best, failures


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--samples", type=int, default=200)
    ap.add_argument("--repeat", type=int, default=3)
    a = ap.parse_args()
    print(f"90-day run of 100,000 GPUs, {a.samples} sample runs, 41-point interval search "
          f"(fastest of {a.repeat}):")
    for law, shape in (("exponential", 1.0), ("weibull", 0.7)):
        scn = Scenario(nodes=12_500, days=90, node_mtbf_hours=6300, save_s=60, restart_s=600,
                       law=law, shape=shape)  # type: ignore[arg-type]
        secs, failures = timed(scn, a.samples, a.repeat)
        name = law if law == "exponential" else f"weibull k={shape:g}"
        print(f"  {name:<14} {secs:6.2f} s  ({failures:,.0f} failures per run)")
    print()
    print("| GPUs | job MTBF | restart | best interval | goodput mean (p5-p95) | Daly closed form "
          "| lost: restart / saves / recomputed |")
    print("|---:|---:|---:|---:|---|---:|---|")
    for gpus in (1_024, 10_240, 102_400):
        for restart in (600.0, 120.0):
            scn = Scenario(nodes=gpus // 8, days=90, node_mtbf_hours=6300, save_s=60,
                           restart_s=restart)
            res = simulate(scn, samples=a.samples, seed=0)
            best = simulate(scn, samples=a.samples, seed=0, interval_s=res.best_interval_s)
            g = best.policy.stats()
            wall = a.samples * scn.horizon_s
            p = best.policy
            closed = expected_goodput(res.daly_interval_s, 60, restart, scn.job_mtbf_s)
            print(f"| {gpus:,} | {scn.job_mtbf_s / 3600:.3g} h | {restart / 60:g} min | "
                  f"{res.best_interval_s / 60:.3g} min | {g['mean']:.1%} ({g['p5']:.1%}-"
                  f"{g['p95']:.1%}) | {closed:.1%} | {p.restart_s.sum() / wall:.1%} / "
                  f"{p.save_s.sum() / wall:.1%} / {p.lost_s.sum() / wall:.1%} |")


if __name__ == "__main__":
    main()
