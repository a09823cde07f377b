"""Fleet report over many jobs: synthetic sacct output in the recorded Slurm 22.05 shapes.

Two inputs for the same jobs: `sacct --json -D` (22.05 dbv0.0.38 shape) and the two text
queries `slurmpod report --since` runs (slurmpod's `--parsable2` fields, allocation rows only,
plus the attempts query). Job entries are copies of a recorded 22.05 job
(tests/data/slurm/22.05/sacct.json, with its batch/extern/srun steps) with varied users,
accounts, node lists, times and AdminComments as sacctmgr stores them (backticks); 5 % of the
jobs were requeued once (two attempts), 10 % have no training figures. Prints the input sizes
and the time of each stage (parse, per-job reports, aggregation, renderings) against the 3 s
target for 10,000 jobs.

    .venv/bin/python benchmarks/report_scale.py [--jobs 10000] [--html]
"""

from __future__ import annotations

import argparse
import copy
import json
import random
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TARGET_S = 3.0


def synth(n_jobs: int, seed: int = 7) -> tuple[str, str, int, str, str]:
    rec = json.loads((ROOT / "tests/data/slurm/22.05/sacct.json").read_text())
    base = next(j for j in rec["jobs"] if j["job_id"] == 9)  # 3 steps, comment set
    rnd = random.Random(seed)
    t0 = 1795000000
    jobs, codes, rows, att = [], [], [], []
    for k in range(n_jobs):
        jid = 100000 + k
        n_nodes = rnd.choice([1, 2, 4, 8, 16, 32, 64])
        first = rnd.randrange(0, 1000 - n_nodes)
        nodes = f"node[{first + 1:04d}-{first + n_nodes:04d}]" if n_nodes > 1 else \
            f"node{first + 1:04d}"
        elapsed = rnd.randrange(600, 86400)
        start = t0 + rnd.randrange(0, 7 * 86400)
        requeued = rnd.random() < 0.05
        no_fig = rnd.random() < 0.10
        mfu = rnd.uniform(0.05, 0.55)
        admin = None if no_fig else json.dumps({
            "v": 1, "mfu": round(mfu, 4), "mfu_p10": round(mfu * 0.95, 4),
            "mfu_p90": round(mfu * 1.04, 4), "tflops": round(mfu * 989, 1),
            "tokens_per_s": round(rnd.uniform(1e4, 1e6)), "iter_ms": 1500.0, "iters": 500,
            "last_iter": 5000, "gpus": 8 * n_nodes, "peak": 989.0,
            "goodput": round(rnd.uniform(0.5, 0.97), 4), "ttfi_s": rnd.randrange(60, 900),
            "ckpt_s": rnd.randrange(0, 600), "restarts": int(requeued), "fv": "mlm-core-0.14",
            "src": "comment"}, separators=(",", ":")).replace('"', "`")
        attempts = [("REQUEUED", start - 3600, 1800)] if requeued else []
        attempts.append(("COMPLETED" if rnd.random() < 0.85 else "FAILED", start, elapsed))
        for state, st, el in attempts:
            j = copy.deepcopy(base)
            j["job_id"] = jid
            j["name"] = f"train-{k % 97}"
            j["user"] = j["association"]["user"] = f"user{k % 40}"
            j["account"] = j["association"]["account"] = f"acct{k % 9}"
            j["nodes"] = nodes
            j["state"] = {"current": state, "reason": "None"}
            j["time"].update(submission=st - 60, eligible=st - 60, start=st, end=st + el,
                             elapsed=el)
            for tres in j["tres"]["allocated"]:
                if tres["type"] == "node":
                    tres["count"] = n_nodes
                if tres["type"] == "gres":
                    tres["count"] = 8 * n_nodes
            j["comment"] = {"administrator": admin, "job": j["comment"]["job"], "system": None}
            for s in j["steps"]:
                s["nodes"]["range"] = nodes
            jobs.append(j)
            code = f"{'3' if state == 'FAILED' else '0'}:0"
            codes.append(f"{jid}|{code}")
            g = 8 * n_nodes
            rows.append("\x1f".join([
                str(jid), j["name"], j["user"], j["account"], "batch", state, code, str(st - 60),
                str(st), str(st + el), str(el), nodes, str(n_nodes), "",
                f"billing={32 * n_nodes},cpu={32 * n_nodes},gres/gpu={g},node={n_nodes}",
                admin or "", j["comment"]["job"] or "", str(jid)]))
            att.append(f"{jid}|{st - 60}|{st}|{st + el}|{el}|{state}")
    rec["jobs"] = jobs
    return (json.dumps(rec, indent=2), "\n".join(codes) + "\n", len(jobs),
            "\n".join(rows) + "\n", "\n".join(att) + "\n")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=10000)
    ap.add_argument("--html", action="store_true", help="also time the fleet HTML (matplotlib)")
    args = ap.parse_args()
    sys.path.insert(0, str(ROOT))
    from slurmpod.report.fleet import build_fleet
    from slurmpod.report.model import build_job_report
    from slurmpod.report.prom import fleet_exposition
    from slurmpod.report.sacct import (
        jobs_from_text,
        parse_exit_codes,
        parse_sacct_jobs,
        with_exit_codes,
    )
    from slurmpod.report.text import fleet_text

    text, code_text, n_entries, rec_text, att_text = synth(args.jobs)
    print(f"input: {args.jobs} jobs, {n_entries} sacct entries (attempts): "
          f"{len(text) / 2**20:.1f} MiB as sacct --json (22.05, indented as sacct prints), "
          f"{(len(rec_text) + len(att_text)) / 2**20:.1f} MiB as slurmpod's two text queries")
    t = time.perf_counter()
    json_jobs = with_exit_codes(parse_sacct_jobs(text), parse_exit_codes(code_text))
    json_s = time.perf_counter() - t
    print(f"  sacct --json path (parse + exit codes): {json_s:.2f} s (for comparison)")
    times: dict[str, float] = {}
    t = time.perf_counter()
    jobs = jobs_from_text(rec_text, att_text)
    times["parse sacct text queries"] = time.perf_counter() - t
    assert [(j.record.job_id, j.record.exit_code, j.attempts) for j in jobs] == [
        (j.record.job_id, j.record.exit_code, j.attempts) for j in json_jobs]
    t = time.perf_counter()
    reports = [build_job_report(sj, with_series=False, with_notes=False) for sj in jobs]
    times["per-job reports"] = time.perf_counter() - t
    t = time.perf_counter()
    fl = build_fleet(reports, window="7d")
    times["aggregate"] = time.perf_counter() - t
    t = time.perf_counter()
    out_text = fleet_text(fl)
    times["render text (the default)"] = time.perf_counter() - t
    total = sum(times.values())
    for k, v in times.items():
        print(f"  {k:28s} {v * 1000:8.1f} ms")
    other: dict[str, float] = {}
    t = time.perf_counter()
    out_json = json.dumps(fl.to_json(jobs=True))
    other["--json --jobs"] = time.perf_counter() - t
    t = time.perf_counter()
    out_csv = fl.to_csv()
    other["--csv"] = time.perf_counter() - t
    t = time.perf_counter()
    out_prom = fleet_exposition(fl)
    other["--prometheus"] = time.perf_counter() - t
    print("  other renderings, instead of text: " + ", ".join(
        f"{k} {v * 1000:.0f} ms" for k, v in other.items()))
    print(f"text path total {total:.2f} s for {len(reports)} jobs "
          f"({total / len(reports) * 1e6:.0f} us/job);"
          f" target {TARGET_S:.1f} s: {'OK' if total < TARGET_S else 'OVER'} "
          f"({total / TARGET_S:.2f} of target)")
    print(f"outputs: text {len(out_text)} B, JSON {len(out_json) / 2**20:.1f} MiB, "
          f"CSV {len(out_csv) / 2**20:.1f} MiB, Prometheus {len(out_prom)} B; "
          f"fleet {fl.total.gpu_hours:.0f} GPU-h, weighted MFU {fl.total.mfu:.3f}")
    if args.html:
        from slurmpod.report.html import fleet_html

        t = time.perf_counter()
        html = fleet_html(fl, generated="benchmark")
        print(f"fleet HTML with plots: {(time.perf_counter() - t) * 1000:.0f} ms, "
              f"{len(html) / 1024:.0f} KiB")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
