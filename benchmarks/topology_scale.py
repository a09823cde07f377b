"""Benchmark: generate every topology artefact for 1k, 10k and 100k GPUs (8-GPU DGX H100 nodes).

Prints, per size: nodes, GPUs, artefact bytes, the time to validate the site and build its
inventory, to plan the fabric, and to generate all files (best of --repeat runs), and the growth
ratio of generation time against the growth in nodes (1.0 = linear). Target: 100k GPUs
(12,500 nodes) in under 2 s on a 2-core machine.

    .venv/bin/python benchmarks/topology_scale.py [--repeat 3]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from slurmpod.topology.fabric_plan import plan_fabric
from slurmpod.topology.generate import generate
from tests.unit.topology.test_support import scale_site

SIZES_GPUS = (1_000, 10_000, 100_000)


def best_of(repeat: int, fn):  # type: ignore[no-untyped-def]
    best, result = float("inf"), None
    for _ in range(repeat):
        t0 = time.perf_counter()
        result = fn()
        best = min(best, time.perf_counter() - t0)
    return best, result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    print(f"{'GPUs':>8} {'nodes':>6} {'SUs':>4} {'tiers':>5} {'cables':>7} {'MB':>6} "
          f"{'site_s':>7} {'plan_s':>7} {'generate_s':>10} {'time/size growth':>16}")
    prev: tuple[int, float] | None = None
    for gpus in SIZES_GPUS:
        nodes = gpus // 8
        t_site, site = best_of(args.repeat, lambda n=nodes: scale_site(n))
        t_plan, plan = best_of(args.repeat, lambda s=site: plan_fabric(s))
        t_gen, files = best_of(args.repeat, lambda s=site: generate(s))
        size_mb = sum(len(v) for v in files.values()) / 1e6
        cables = len(plan.node_links) + len(plan.switch_links)
        growth = "-" if prev is None else f"{(t_gen / prev[1]) / (nodes / prev[0]):.2f}"
        print(f"{gpus:>8} {nodes:>6} {len(site.inventory.su_names):>4} {plan.tiers:>5} "
              f"{cables:>7} {size_mb:>6.1f} {t_site:>7.3f} {t_plan:>7.3f} {t_gen:>10.3f} "
              f"{growth:>16}")
        prev = (nodes, t_gen)
    print("generate_s includes planning the fabric; target: 100k GPUs < 2 s.")


if __name__ == "__main__":
    main()
