"""Time `make_plan` for every preset over node counts 1..1024 on the built-in DGX H100 site.

Prints, per preset, plans per second and the median / p99 / max time per plan, and how many node
counts gave a valid, fitting plan. The target is < 5 ms per plan. Each plan is timed `--repeat`
times and the fastest run counts (the usual guard against a busy machine); the CPU time of the
whole sweep is printed too. Node counts above the site's
128 nodes are planned too (the placement extrapolates further SUs; the plan carries an error).

    .venv/bin/python benchmarks/plan_presets.py [--max-nodes 1024] [--site dgx-h100-superpod]
"""

from __future__ import annotations

import argparse
import statistics
import time

from slurmpod.config import load_site, resolve_site_path
from slurmpod.megatron.plan import make_plan
from slurmpod.megatron.runspec import list_presets, load_run, preset_path


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--max-nodes", type=int, default=1024)
    ap.add_argument("--site", default="dgx-h100-superpod")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    site = load_site(resolve_site_path(args.site))
    make_plan(load_run(preset_path("llama3-8b")), site)  # warm caches (inventory arrays)
    print(f"site {args.site}, node counts 1..{args.max_nodes}")
    print(f"{'preset':<15} {'plans':>6} {'ok':>5} {'median ms':>10} {'p99 ms':>8} {'max ms':>8}"
          f" {'plans/s':>8}")
    all_times: list[float] = []
    cpu0 = time.process_time()
    for name in list_presets():
        run = load_run(preset_path(name))
        times: list[float] = []
        ok = 0
        for nodes in range(1, args.max_nodes + 1):
            best = float("inf")
            for _ in range(args.repeat):
                t0 = time.perf_counter()
                plan = make_plan(run, site, nodes=nodes)
                best = min(best, time.perf_counter() - t0)
            times.append(best)
            ok += plan.ok
        times.sort()
        all_times += times
        p99 = times[int(0.99 * (len(times) - 1))]
        print(f"{name:<15} {len(times):>6} {ok:>5} {statistics.median(times) * 1e3:>10.3f} "
              f"{p99 * 1e3:>8.3f} {times[-1] * 1e3:>8.3f} {len(times) / sum(times):>8.0f}")
    all_times.sort()
    mean = sum(all_times) / len(all_times)
    print(f"{'all':<15} {len(all_times):>6} {'':>5} {statistics.median(all_times) * 1e3:>10.3f} "
          f"{all_times[int(0.99 * (len(all_times) - 1))] * 1e3:>8.3f} {all_times[-1] * 1e3:>8.3f}"
          f" {1 / mean:>8.0f}")
    cpu = (time.process_time() - cpu0) / (len(all_times) * args.repeat)
    print(f"mean {mean * 1e3:.3f} ms per plan (wall, best of {args.repeat}); CPU {cpu * 1e3:.3f} ms"
          f" per plan; target 5 ms -> {5e-3 / mean:.1f}x headroom")


if __name__ == "__main__":
    main()
