"""Replay one mixed job trace on the sandbox twice: plain sbatch vs slurmpod's placement flags.

The trace (seeded) has jobs of 1 node up to 2 SUs (8 nodes of the 4-node sandbox SUs), staggered
arrivals and sleep-based run times. Run 1 ("plain") uses a sandbox of the same 16 nodes wired as
one flat switch (no topology information) and plain whole-node sbatch options. Run 2
("slurmpod") uses the real 4-SU tree topology and the placement flags slurmpod renders for each
job (`--switches=<fewest SUs>@<wait>`, from the plan). For every job it prints the SUs spanned
against the minimum, the queue wait, and for each run the share of jobs placed in their minimum
SU count and the makespan. Targets: 100 % in the minimum SU count, makespan within 10 % of plain.

    python benchmarks/placement_replay.py [--jobs 24] [--seed 7] [--scale 1.0]

`--packing` replays instead a high-load mixed trace (1 node up to 2 whole SUs) twice on the same
4-SU tree sandbox with slurmpod's flags, at once, side by side: once with every node at Slurm's
default weight ("no weights": Slurm's own best fit), once with the SU-ordered weights of
`slurm_files.su_packing_weights` ("su-order", set with `scontrol update NodeName=.. Weight=..`).
It prints, per run, the share of large jobs (a whole SU or more) in their minimum SU count, their
mean wait, the mean wait of all jobs, utilisation (node-seconds of work / nodes x makespan) and
how far small jobs packed toward SU 1.

Run time is about two makespans (a few minutes at scale 1.0). Needs Slurm, munge and MariaDB
(`bash .ci/install`); put another Slurm's bin/sbin first on PATH to replay on it.
"""

from __future__ import annotations

import argparse
import math
import os
import random
import statistics
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

SIZES = (1, 1, 1, 2, 2, 3, 3, 4, 4, 5, 6, 8)


@dataclass(frozen=True)
class TraceJob:
    name: str
    nodes: int
    arrival_s: float
    duration_s: int


@dataclass
class Outcome:
    job_id: str
    nodes: list[str]
    submit: int
    start: int
    end: int


def make_trace(n: int, seed: int, scale: float) -> list[TraceJob]:
    rng = random.Random(seed)
    t = 0.0
    jobs = []
    for i in range(n):
        jobs.append(TraceJob(f"replay{i:02d}", rng.choice(SIZES), round(t, 2),
                             max(2, round(rng.uniform(6, 24) * scale))))
        t += rng.expovariate(1 / (2.5 * scale))
    return jobs


def flat_site_file(dir_: Path) -> Path:
    """The sandbox's 16 nodes, same names, behind one flat leaf: no topology to exploit."""
    from slurmpod.config import builtin_site_path, load_site

    text = builtin_site_path("sandbox").read_text()
    text = text.replace('name = "sandbox"', 'name = "sandbox-flat"')
    text = text.replace("leaf_radix = 16", "leaf_radix = 32")
    text = text.replace("sus = 4\nnodes_per_su = 4", "sus = 1\nnodes_per_su = 16")
    path = dir_ / "sandbox-flat.toml"
    path.write_text(text)
    assert len(load_site(path).inventory.su_names) == 1
    return path


def slurmpod_flags(nodes: int) -> tuple[list[str], int]:
    """Whole-node and placement options exactly as `slurmpod render` writes them."""
    from slurmpod.config import builtin_site_path, load_site
    from slurmpod.megatron.runspec import run_from_dict
    from slurmpod.render.sbatch import PlanFacts, RenderOptions, build_context
    from slurmpod.submit import plan_or_refuse

    site = load_site(builtin_site_path("sandbox"))
    run = run_from_dict({"job": {"name": "replay", "nodes": nodes}, "megatron": {
        "num_layers": 4, "hidden_size": 256, "num_attention_heads": 8, "seq_length": 128,
        "vocab_size": 1024, "tensor_model_parallel_size": 8, "global_batch_size": 2 * nodes,
    }}, "replay.toml")
    facts = PlanFacts.of(plan_or_refuse(run, site))
    ctx = build_context(run, site, facts, RenderOptions(run_dir="/tmp"))
    keep = ("--nodes=", "--ntasks-per-node=", "--gpus-per-node=", "--exclusive", "--mem=",
            "--switches=", "--segment=")
    flags = [line.split()[1] for line in ctx.directives
             if line.split()[1].startswith(keep)]
    return flags, facts.min_sus


def plain_flags(nodes: int) -> list[str]:
    return [f"--nodes={nodes}", "--ntasks-per-node=8", "--gpus-per-node=8", "--exclusive",
            "--mem=0"]


def replay(site_path: Path | None, trace: list[TraceJob], flags: dict[int, list[str]],
           label: str, weights: dict[str, int] | None = None) -> dict[str, Outcome]:
    from slurmpod.model.hostlist import compress
    from slurmpod.sandbox.cluster import Sandbox

    state = Path(tempfile.mkdtemp(prefix=f"slurmpod-replay-{label}-", dir="/tmp"))
    sb = Sandbox(state, site_path)
    sb.up()
    env = {**os.environ, **sb.client_env(), "SLURM_TIME_FORMAT": "%s"}
    ids: dict[str, str] = {}
    try:
        by_weight: dict[int, list[str]] = {}
        for node, w in (weights or {}).items():
            by_weight.setdefault(w, []).append(node)
        for w, nodes in sorted(by_weight.items()):
            subprocess.run(["scontrol", "update", f"NodeName={compress(nodes)}", f"Weight={w}"],
                           env=env, check=True, capture_output=True, timeout=60)
        t0 = time.monotonic()
        for job in trace:
            time.sleep(max(0.0, job.arrival_s - (time.monotonic() - t0)))
            limit_min = math.ceil(job.duration_s / 60) + 1
            argv = ["sbatch", "--parsable", f"--job-name={job.name}", "--output=/dev/null",
                    f"--time={limit_min}", *flags[job.nodes], "--wrap",
                    f"sleep {job.duration_s}"]
            cp = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)
            if cp.returncode != 0:
                raise SystemExit(f"{label}: sbatch failed: {cp.stderr.strip()}")
            ids[job.name] = cp.stdout.strip().split(";")[0]
        return _collect(env, ids, label)
    finally:
        sb.down()


def _collect(env: dict[str, str], ids: dict[str, str], label: str,
             timeout_s: float = 1800) -> dict[str, Outcome]:
    from slurmpod.model.hostlist import expand

    deadline = time.monotonic() + timeout_s
    while True:
        cp = subprocess.run(["sacct", "-X", "-n", "-P", "-o",
                             "JobID,Submit,Start,End,NodeList,State,Partition",
                             "-j", ",".join(ids.values())],
                            env=env, capture_output=True, text=True, timeout=60)
        rows = {}
        for line in cp.stdout.splitlines():
            jid, sub, start, end, nodes, state, part = line.split("|")
            if state.startswith("COMPLETED") and part and end.isdigit() and start.isdigit():
                rows[jid] = Outcome(jid, expand(nodes), int(sub), int(start), int(end))
        if len(rows) == len(ids):
            return {name: rows[jid] for name, jid in ids.items()}
        if time.monotonic() > deadline:
            raise SystemExit(f"{label}: only {len(rows)}/{len(ids)} jobs finished")
        time.sleep(2)


# Packing trace: mostly small jobs, a steady share of whole-SU (4) and two-SU (8) jobs.
PACK_SIZES = (1, 1, 1, 1, 2, 2, 2, 3, 4, 4, 8)


def make_packing_trace(n: int, seed: int, scale: float) -> list[TraceJob]:
    """High load: arrivals every ~1.2 s (scale 1) against runs of 8-30 s on 16 nodes."""
    rng = random.Random(seed)
    t = 0.0
    jobs = []
    for i in range(n):
        jobs.append(TraceJob(f"pack{i:03d}", rng.choice(PACK_SIZES), round(t, 2),
                             max(2, round(rng.uniform(8, 30) * scale))))
        t += rng.expovariate(1 / (1.2 * scale))
    return jobs


def packing_main(args: argparse.Namespace) -> None:
    import threading

    from slurmpod.config import builtin_site_path, load_site
    from slurmpod.topology.slurm_files import su_packing_weights

    site = load_site(builtin_site_path("sandbox"))
    inv = site.inventory
    per_su = len(inv.nodes_in_su(0))
    trace = make_packing_trace(args.jobs, args.seed, args.scale)
    sizes = sorted({j.nodes for j in trace})
    flags = {n: slurmpod_flags(n)[0] for n in sizes}
    min_sus = {n: -(-n // per_su) for n in sizes}
    work = sum(j.nodes * j.duration_s for j in trace)
    # slurmctld -V needs no slurm.conf (the client commands do).
    ver = subprocess.run(["slurmctld", "-V"], capture_output=True, text=True).stdout.strip()
    print(f"{ver}: trace of {len(trace)} jobs ({sum(j.nodes >= per_su for j in trace)} of a "
          f"whole SU or more), sizes {sizes} nodes, last arrival {trace[-1].arrival_s:.1f} s, "
          f"{work} node-s of work on {len(inv.nodes)} nodes in {len(inv.su_names)} SUs of "
          f"{per_su}; flags: {flags[max(sizes)]}")
    configs = {"no weights": None, "su-order": su_packing_weights(site)}
    runs: dict[str, dict[str, Outcome]] = {}
    errors: list[BaseException] = []

    def one(label: str, weights: dict[str, int] | None) -> None:
        try:
            runs[label] = replay(None, trace, flags, label.replace(" ", "-"), weights)
        except BaseException as exc:  # reported after both runs
            errors.append(exc)

    threads = [threading.Thread(target=one, args=item) for item in configs.items()]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    if errors:
        raise SystemExit(f"replay failed: {errors[0]}")

    def spans(o: Outcome) -> int:
        return len({inv.by_name[n].su for n in o.nodes})

    print(f"\n{'run':<12}{'large in min SUs':>18}{'large wait s':>14}{'all wait s':>12}"
          f"{'util %':>8}{'makespan s':>12}{'small in SU1 %':>16}")
    for label, out in runs.items():
        large = [j for j in trace if j.nodes >= per_su]
        small = [j for j in trace if j.nodes < per_su]
        in_min = sum(spans(out[j.name]) == min_sus[j.nodes] for j in large)
        lw = statistics.mean(out[j.name].start - out[j.name].submit for j in large)
        aw = statistics.mean(out[j.name].start - out[j.name].submit for j in trace)
        makespan = max(o.end for o in out.values()) - min(o.submit for o in out.values())
        busy = sum(len(o.nodes) * (o.end - o.start) for o in out.values())
        util = 100 * busy / (len(inv.nodes) * makespan)
        su1 = sum(all(inv.by_name[n].su == 0 for n in out[j.name].nodes) for j in small)
        print(f"{label:<12}{f'{in_min}/{len(large)}':>18}{lw:>14.1f}{aw:>12.1f}{util:>8.1f}"
              f"{makespan:>12}{100 * su1 / len(small):>16.0f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=24)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--scale", type=float, default=1.0, help="multiplies run times and gaps")
    ap.add_argument("--packing", action="store_true",
                    help="compare Slurm's default weights with SU-ordered weights (see above)")
    args = ap.parse_args()
    if args.packing:
        packing_main(args)
        return

    from slurmpod.config import builtin_site_path, load_site

    inv = load_site(builtin_site_path("sandbox")).inventory  # the real SUs, for both runs
    nodes_per_su = len(inv.nodes_in_su(0))
    trace = make_trace(args.jobs, args.seed, args.scale)
    sizes = sorted({j.nodes for j in trace})
    sp_flags: dict[int, list[str]] = {}
    min_sus: dict[int, int] = {}
    for n in sizes:
        sp_flags[n], min_sus[n] = slurmpod_flags(n)
        # An independent count: SUs here are equal, so the minimum is a ceiling division.
        assert min_sus[n] == -(-n // nodes_per_su), (n, min_sus[n])
    print(f"trace: {len(trace)} jobs, sizes {sizes} nodes, last arrival "
          f"{trace[-1].arrival_s:.1f} s, {sum(j.nodes * j.duration_s for j in trace)} node-s "
          f"of work on {len(inv.nodes)} nodes in {len(inv.su_names)} SUs of {nodes_per_su}")
    print("slurmpod flags by size: " + "; ".join(
        f"{n}: {' '.join(f for f in sp_flags[n] if f.startswith(('--switches', '--segment')))}"
        for n in sizes))

    with tempfile.TemporaryDirectory(prefix="slurmpod-replay-") as tmp:
        flat = flat_site_file(Path(tmp))
        runs = {
            "plain": replay(flat, trace, {n: plain_flags(n) for n in sizes}, "plain"),
            "slurmpod": replay(None, trace, sp_flags, "slurmpod"),
        }

    def spans(o: Outcome) -> int:
        return len({inv.by_name[n].su for n in o.nodes})

    print(f"\n{'job':<10}{'nodes':>6}{'min SUs':>8}{'arrive s':>9} |"
          f"{'plain SUs':>10}{'wait s':>8} |{'slurmpod SUs':>13}{'wait s':>8}  nodes (slurmpod)")
    for j in trace:
        p, s = runs["plain"][j.name], runs["slurmpod"][j.name]
        print(f"{j.name:<10}{j.nodes:>6}{min_sus[j.nodes]:>8}{j.arrival_s:>9.1f} |"
              f"{spans(p):>10}{p.start - p.submit:>8} |{spans(s):>13}{s.start - s.submit:>8}"
              f"  {','.join(s.nodes)}")
    print()
    makespans = {}
    for label, out in runs.items():
        in_min = sum(spans(out[j.name]) == min_sus[j.nodes] for j in trace)
        waits = [out[j.name].start - out[j.name].submit for j in trace]
        makespan = max(o.end for o in out.values()) - min(o.submit for o in out.values())
        makespans[label] = makespan
        print(f"{label:<9} in minimum SU count: {in_min}/{len(trace)} "
              f"({100 * in_min / len(trace):.0f} %)  queue wait mean {statistics.mean(waits):.1f} s"
              f" median {statistics.median(waits):.1f} s max {max(waits)} s  "
              f"makespan {makespan} s")
    ratio = makespans["slurmpod"] / makespans["plain"]
    print(f"makespan slurmpod / plain = {ratio:.3f} (target <= 1.10: "
          f"{'met' if ratio <= 1.10 else 'NOT met'})")


if __name__ == "__main__":
    main()
