"""Benchmark `topo check` and `topo discover` on a 12,500-node (100,000-GPU) fabric.

The site is dgx-h100-superpod.toml grown to 391 SUs (390 x 32 nodes + one of 20), which the
fabric plan turns into three tiers (leaf, spine, core). At that size 64-port spines shared by all
rails would need a fourth tier, so the big site keeps each rail a plane of its own
(`spine_groups = "per_rail"`), saved as one ibnetdiscover dump per rail, as such sites do. The
synthesized dumps carry SHARP aggregation nodes (Switch 65), `host HCA-N` descriptions, uplinks in
shuffled ports and a few injected faults, so the check does real work. Prints sizes and the time
of each stage; targets on a 2-core machine: check (parse every dump, merge, check) <= 3 s,
discover (parse, merge, discover, draft) <= 5 s.

    .venv/bin/python benchmarks/fabric_check.py [--nodes 12500] [--repeat 3]
"""

from __future__ import annotations

import argparse
import os
import time
import tomllib

from slurmpod.config import builtin_site_path, validate
from slurmpod.fabric.check import check_fabric
from slurmpod.fabric.discover import discover_site, draft_site_toml
from slurmpod.fabric.ibnetdiscover import merge, parse
from slurmpod.fabric.synth import Fault, synthesize_planes
from slurmpod.model.site import Site
from slurmpod.topology.fabric_plan import plan_fabric


def big_site(nodes: int) -> Site:
    data = tomllib.loads(builtin_site_path("dgx-h100-superpod").read_text())
    per_su = data["su_groups"][0]["nodes_per_su"]
    full, rest = divmod(nodes, per_su)
    groups = [dict(data["su_groups"][0], sus=full)]
    if rest:
        groups.append(dict(data["su_groups"][0], sus=1, nodes_per_su=rest))
    data["su_groups"] = groups
    data["naming"]["hostname"] = "dgx{n:05d}"
    data["fabric"]["spine_groups"] = "per_rail"
    data["partitions"] = [p for p in data["partitions"] if p.get("sus", "all") == "all"]
    return validate(Site, data, "benchmark site")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=12_500)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()

    t0 = time.perf_counter()
    site = big_site(args.nodes)
    plan = plan_fabric(site)
    t_plan = time.perf_counter() - t0
    gpus = sum(site.node_types[n.node_type].gpus for n in site.inventory.nodes)
    print(f"site: {len(site.inventory.nodes):,} nodes, {gpus:,} GPUs, "
          f"{len(site.inventory.su_names)} SUs, {plan.tiers} tiers, {len(plan.leaves):,} leaves, "
          f"{len(plan.spines):,} spines, {len(plan.cores):,} cores")
    print(f"plan: {len(plan.node_links):,} HCA links + {len(plan.switch_links):,} switch links "
          f"in {t_plan:.2f} s")

    faults = [Fault("swap", "dgx00001:mlx5_0,dgx00001:mlx5_3"), Fault("missing", "dgx00100:mlx5_4"),
              Fault("slow", "dgx00200:mlx5_5=4xHDR"), Fault("move", "dgx00300=su391")]
    t0 = time.perf_counter()
    texts = synthesize_planes(site, plan, faults, desc="hca", uplinks="shuffle")
    t_synth = time.perf_counter() - t0
    n_lines = sum(t.count("\n") for t in texts)
    print(f"ibnetdiscover: {len(texts)} dumps (one per rail subnet), {n_lines:,} lines, "
          f"{sum(map(len, texts)) / 1e6:.1f} MB (synthesized in {t_synth:.2f} s)")

    def parse_all() -> object:
        return merge([parse(t, f"rail{i}.txt") for i, t in enumerate(texts)])

    parse_s, check_s, disc_s, parse_cpu, check_cpu, disc_cpu = [], [], [], [], [], []
    for _ in range(args.repeat):
        t0, c0 = time.perf_counter(), time.process_time()
        fabric = parse_all()
        t1, c1 = time.perf_counter(), time.process_time()
        report = check_fabric(site, plan, fabric)
        t2, c2 = time.perf_counter(), time.process_time()
        found = discover_site(fabric)
        draft = draft_site_toml(found, "bench")
        t3, c3 = time.perf_counter(), time.process_time()
        parse_s.append(t1 - t0)
        check_s.append(t2 - t1)
        disc_s.append(t3 - t2)
        parse_cpu.append(c1 - c0)
        check_cpu.append(c2 - c1)
        disc_cpu.append(c3 - c2)
    p, c, d = min(parse_s), min(check_s), min(disc_s)
    pc, cc, dc = min(parse_cpu), min(check_cpu), min(disc_cpu)
    print(f"parse + merge: {p:.2f} s wall, {pc:.2f} s CPU ({n_lines / p / 1e6:.2f} M lines/s); "
          f"nodes in fabric {len(fabric.nodes):,}")
    print(f"check: {c:.2f} s wall, {cc:.2f} s CPU; findings {len(report.findings)} "
          f"{report.counts()}")
    print(f"discover + draft: {d:.2f} s wall, {dc:.2f} s CPU; {found.summary()['nodes']:,} "
          f"nodes, {len(found.sus)} SUs, draft {len(draft) / 1e3:.0f} kB")
    for name, wall, cpu, target in (("topo check", p + c, pc + cc, 3.0),
                                    ("topo discover", p + d, pc + dc, 5.0)):
        print(f"{name} (parse + merge + work): {wall:.2f} s wall, {cpu:.2f} s CPU (best of "
              f"{args.repeat}); target <= {target:g} s -> "
              f"{'met' if wall <= target else 'NOT met'} ({wall / target:.0%} of budget)")
    load = os.getloadavg()[0]
    print(f"load average {load:.1f} on {os.cpu_count()} CPUs"
          + (" — the machine is busy: wall times are inflated" if load > (os.cpu_count() or 1)
             else ""))


if __name__ == "__main__":
    main()
