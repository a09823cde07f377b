"""Fleet report over 10,000 and 100,000 jobs with realistic spool records: old path vs new path.

Inputs, generated per size:
- the two sacct text queries `slurmpod report --since` runs (slurmpod's `--parsable2` fields,
  allocation rows only, plus the attempts query), in Slurm 22.05's shapes: varied users,
  accounts, node lists, times and AdminComments as sacctmgr stores them (backticks); 5 % of the
  jobs were requeued once (two attempts), 10 % printed no training log;
- the EpilogSlurmctld hook's spool: one record per attempt, built like the hook builds it
  (`figures.summarise_log` over a synthetic 20,000-iteration Megatron-LM log with an arguments
  dump, throughput, checkpoint saves, then `epilog.build_record`; 30-35 KB with its 512-point
  series), per job varied, written with `Spool.write_record`'s layout (record + compact summary).

Times (page cache warm, the sacct subprocess itself excluded, parsing its text included):
- old path: what `slurmpod report --since` did before the compact summaries, every job's full
  record read with a buffered file object and parsed (series and all);
- new path: `cli.report.fleet_of` (what `slurmpod report --since` runs) reading the compact
  summaries, building and aggregating the rows, then the text; in one process, and by default
  (from `PARALLEL_MIN_JOBS` jobs on, a forked child does half the jobs).
Both must give the same fleet figures (checked). Also: one durable `Spool.write_record` (what an
epilog pays) and `Spool.newest` at that spool size.

    .venv/bin/python benchmarks/report_scale.py [--jobs 10000,100000] [--dir DIR] [--no-old]
                                                [--sacct-json] [--html]
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
TARGETS_S = {10_000: 1.0, 100_000: 5.0}
LOG_HEAD = ROOT / "tests/data/megatron/megatron-2026-microseconds.log"
ITER = ("63:  [{ts}] iteration {i:8d}/   20000 | consumed samples: {c:12d} | elapsed time per "
        "iteration (ms): {ms:.1f} | throughput per GPU (TFLOP/s/GPU): {tf:.1f} | learning rate: "
        "1.500000E-04 | global batch size:   128 | lm loss: 2.750000E+00 | loss scale: 1.0 | "
        "grad norm: 0.812 | num zeros: 0 | number of skipped iterations:   0 | number of nan "
        "iterations:   0 |\n")


def megatron_log(n_iters: int = 20000, interval: int = 5, ckpt_every: int = 1000) -> bytes:
    """A Megatron-LM (core 0.14 era) log: the recorded arguments dump and start-up lines, then
    iteration lines every `interval` iterations and a checkpoint save every `ckpt_every`."""
    from datetime import datetime, timedelta

    head = [ln for ln in LOG_HEAD.read_text().splitlines(keepends=True)
            if " iteration " not in ln and "checkpoint" not in ln and "after training" not in ln
            and "NCCL INFO" not in ln]
    head = [ln.replace("train_iters ..................................... 500",
                       "train_iters ..................................... 20000") for ln in head]
    t = datetime(2026, 3, 2, 14, 0, 45)
    rnd = random.Random(1)
    out = head
    for i in range(interval, n_iters + 1, interval):
        ms = 2050.0 * (1 + rnd.gauss(0, 0.01)) * (3 if rnd.random() < 0.002 else 1)
        t += timedelta(milliseconds=ms * interval)
        ts = t.strftime("%Y-%m-%d %H:%M:%S.%f")
        out.append(ITER.format(ts=ts, i=i, c=i * 128, ms=ms, tf=519.7 * 2050.0 / ms))
        if i % ckpt_every == 0:
            out.append(f"0: [{ts}] saving checkpoint at iteration {i:7d} to /ckpt/llama3-8b in "
                       "torch_dist format\n")
            t += timedelta(seconds=30)
            out.append(f"0:   [{t.strftime('%Y-%m-%d %H:%M:%S.%f')}] successfully saved "
                       f"checkpoint from iteration {i:7d} to /ckpt/llama3-8b [ t 1/1, gtp_remat "
                       "1/1, p 1/1 ]\n")
    return "".join(out).encode()


def template_record() -> dict[str, Any]:
    """One record as the epilog writes it, for a 64-GPU job (the hook's own code)."""
    from slurmpod.accounting.epilog import build_record
    from slurmpod.accounting.figures import summarise_log
    from slurmpod.model import comment as hooks

    start = 1772460000
    comment = json.dumps({"slurmpod": "llama3-8b", "gpus": 64, "peak_tflops": 989.0})
    job = {"job_id": "1", "uid": 1000, "user": "user0", "name": "train-0",
           "nodelist": "node[0001-0008]", "n_nodes": 8, "restart": 0, "exit_code": "0:0",
           "derived_ec": 0, "partition": "batch", "comment": comment, "start_time": start,
           "end_time": start + 12 * 3600, "gpus": "0,1,2,3,4,5,6,7", "alloc_gpus": 64}
    summary, series = summarise_log(megatron_log(), job, peak_tflops=989.0)
    admin = hooks.build_admin_comment(summary)
    return build_record(job, "/home/user0/run/logs/train-0-1.out",
                        {"bytes": 9_000_000, "truncated": False}, summary, series, admin,
                        start + 12 * 3600 + 1)


class Job:
    def __init__(self, k: int, rnd: random.Random) -> None:
        self.jid = str(100000 + k)
        self.n_nodes = rnd.choice([1, 2, 4, 8, 16, 32, 64])
        first = rnd.randrange(0, 1000 - self.n_nodes)
        self.nodes = (f"node[{first + 1:04d}-{first + self.n_nodes:04d}]" if self.n_nodes > 1
                      else f"node{first + 1:04d}")
        self.elapsed = rnd.randrange(600, 86400)
        self.start = 1795000000 + rnd.randrange(0, 7 * 86400)
        self.requeued = rnd.random() < 0.05
        self.no_fig = rnd.random() < 0.10
        self.mfu = rnd.uniform(0.05, 0.55)
        self.tokens = round(rnd.uniform(1e4, 1e6))
        self.goodput = round(rnd.uniform(0.5, 0.97), 4)
        self.ttfi = rnd.randrange(60, 900)
        self.ckpt = rnd.randrange(0, 600)
        self.failed = rnd.random() >= 0.85
        self.name, self.user, self.account = f"train-{k % 97}", f"user{k % 40}", f"acct{k % 9}"

    def admin(self) -> str:
        if self.no_fig:
            return ""
        return json.dumps({
            "v": 1, "mfu": round(self.mfu, 4), "mfu_p10": round(self.mfu * 0.95, 4),
            "mfu_p90": round(self.mfu * 1.04, 4), "tflops": round(self.mfu * 989, 1),
            "tokens_per_s": self.tokens, "iter_ms": 1500.0, "iters": 500, "last_iter": 5000,
            "gpus": 8 * self.n_nodes, "peak": 989.0, "goodput": self.goodput,
            "ttfi_s": self.ttfi, "ckpt_s": self.ckpt, "restarts": int(self.requeued),
            "fv": "mlm-core-0.14", "src": "comment"}, separators=(",", ":")).replace('"', "`")

    def attempts(self) -> list[tuple[str, int, int]]:
        out = [("REQUEUED", self.start - 3600, 1800)] if self.requeued else []
        return [*out, ("FAILED" if self.failed else "COMPLETED", self.start, self.elapsed)]


def sacct_text(jobs: list[Job]) -> tuple[str, str]:
    rows, att = [], []
    for j in jobs:
        g = 8 * j.n_nodes
        for state, st, el in j.attempts():
            code = f"{'3' if state == 'FAILED' else '0'}:0"
            rows.append("\x1f".join([
                j.jid, j.name, j.user, j.account, "batch", state, code, str(st - 60), str(st),
                str(st + el), str(el), j.nodes, str(j.n_nodes), "",
                f"billing={32 * j.n_nodes},cpu={32 * j.n_nodes},gres/gpu={g},node={j.n_nodes}",
                j.admin(), "", j.jid]))
            att.append(f"{j.jid}|{st - 60}|{st}|{st + el}|{el}|{state}")
    return "\n".join(rows) + "\n", "\n".join(att) + "\n"


def job_record(tpl: dict[str, Any], j: Job, attempt: int, st: int, el: int) -> dict[str, Any]:
    """The template record with this job's identity and figures (the series stays shared)."""
    rec = {k: v for k, v in tpl.items() if k not in ("job", "summary", "series")}
    rec["job"] = {**tpl["job"], "job_id": j.jid, "user": j.user, "name": j.name,
                  "nodelist": j.nodes, "n_nodes": j.n_nodes, "restart": attempt,
                  "start_time": st, "end_time": st + el}
    rec["log"] = {**tpl["log"], "path": f"/home/{j.user}/run/logs/{j.name}-{j.jid}.out"}
    if j.no_fig:
        rec["summary"] = {"iters": 0, "restarts": 0, "src": "comment", "gpus": 8 * j.n_nodes,
                          "peak": 989.0, "fv": None, "err": "no-iterations"}
        rec["series"] = {}
        return rec
    s = copy.deepcopy(tpl["summary"])
    f = j.mfu / s["mfu"]
    for k in ("mfu", "mfu_p10", "mfu_p90", "tflops"):
        s[k] *= f
    for k in ("mfu", "tflops_per_gpu"):
        s["metrics"][k] = {a: (b * f if a != "n" else b) for a, b in s["metrics"][k].items()}
    s.update(gpus=8 * j.n_nodes, goodput=j.goodput, ttfi_s=float(j.ttfi),
             tokens_per_s=float(j.tokens), restarts=attempt)
    s["metrics"]["productive_s"] = j.goodput * el
    # GPU telemetry as the epilog stores it (docs/telemetry.md), so fleet rows read it too.
    n = 8 * j.n_nodes
    s["gpu"] = {"v": 1, "src": "dcgm", "trust": "site", "n": n, "span_s": float(el),
                "util": round(60 + 30 * j.goodput, 2), "idle_gpus": 0, "mem_gib": 61.5,
                "power_w": 520.0, "power_max_w": 690.0, "energy_j": round(520.0 * n * el),
                "energy_src": "dcgm", "xid": 0}
    rec["summary"] = s
    rec["series"] = tpl["series"]
    return rec


def write_spool(root: Path, tpl: dict[str, Any], jobs: list[Job]) -> None:
    """Files exactly as `Spool.write_record` lays them out, without its fsyncs (generating
    100,000 durably would take minutes; one durable write is timed apart)."""
    from slurmpod.accounting.spool import Spool, compact_record

    spool = Spool(root)
    ser_text = {id(tpl["series"]): json.dumps(tpl["series"], separators=(",", ":"),
                                             sort_keys=True)}
    seq = time.time_ns()
    for j in jobs:
        for a, (_, st, el) in enumerate(j.attempts()):
            rec = job_record(tpl, j, a, st, el)
            seq += 1
            rec["attempt"], rec["seq"] = a, seq
            series = rec.pop("series")
            head = json.dumps(rec, separators=(",", ":"), sort_keys=True)
            body = ser_text.get(id(series)) or json.dumps(series, separators=(",", ":"))
            (spool.records / f"{j.jid}.{a}.json").write_text(
                f'{head[:-1]},"series":{body}}}\n')
            rec["series"] = series
            (spool.summaries / f"{j.jid}.{a}.json").write_text(
                json.dumps(compact_record(rec), separators=(",", ":"), sort_keys=True) + "\n")


def old_build_reports(jobs: list[Any], spool: Path) -> list[Any]:
    """The fleet path before compact summaries: newest full record of each job, read whole."""
    from slurmpod.cli.report import spool_index
    from slurmpod.report.build import build_job_report

    index = spool_index(spool)
    out = []
    for sj in jobs:
        path = index.get(sj.record.job_id)
        rec = None
        if path is not None:
            try:
                rec = json.loads(path.read_text(encoding="utf-8"))
            except (OSError, ValueError):
                rec = None
        out.append(build_job_report(sj, spool_record=rec, inventory=None, with_series=False,
                                    with_notes=False))
    return out


def dir_size(d: Path) -> tuple[int, int]:
    n = total = 0
    with os.scandir(d) as it:
        for e in it:
            n += 1
            total += e.stat().st_size
    return n, total


def one_size(n_jobs: int, tpl: dict[str, Any], base: Path, old: bool) -> dict[str, float]:
    from slurmpod.accounting.spool import Spool
    from slurmpod.cli import report as cli_report
    from slurmpod.cli.report import _no_cyclic_gc
    from slurmpod.report.fleet import build_fleet
    from slurmpod.report.sacct import jobs_from_text
    from slurmpod.report.text import fleet_text

    rnd = random.Random(7)
    jobs = [Job(k, rnd) for k in range(n_jobs)]
    rec_text, att_text = sacct_text(jobs)
    root = base / f"spool-{n_jobs}"
    t = time.perf_counter()
    write_spool(root, tpl, jobs)
    os.sync()  # no writeback of the fresh files during the timings
    gen_s = time.perf_counter() - t
    n_rec, rec_b = dir_size(root / "records")
    n_sum, sum_b = dir_size(root / "summaries")
    print(f"\n{n_jobs} jobs: {n_rec} records (attempts), sacct text "
          f"{(len(rec_text) + len(att_text)) / 2**20:.1f} MiB; records {rec_b / 2**20:.0f} MiB "
          f"(mean {rec_b / n_rec / 1024:.1f} KiB, with figures "
          f"{json_size(root, jobs, 'records') / 1024:.1f} KiB), summaries "
          f"{sum_b / 2**20:.1f} MiB (mean {sum_b / n_sum:.0f} B); generated in {gen_s:.0f} s")

    def new_path(parallel_from: int) -> tuple[Any, dict[str, float], float]:
        st: dict[str, float] = {}
        cpu = time.process_time()
        t = time.perf_counter()
        with _no_cyclic_gc():  # as `slurmpod report --since` parses sacct's output
            sj = jobs_from_text(rec_text, att_text)
        st["parse sacct text"] = time.perf_counter() - t
        t = time.perf_counter()
        old_min, cli_report.PARALLEL_MIN_JOBS = cli_report.PARALLEL_MIN_JOBS, parallel_from
        try:
            fl = cli_report.fleet_of(sj, root, window="7d")
        finally:
            cli_report.PARALLEL_MIN_JOBS = old_min
        st["summaries, job reports, aggregate"] = time.perf_counter() - t
        t = time.perf_counter()
        fleet_text(fl)
        st["render text"] = time.perf_counter() - t
        return fl, st, time.process_time() - cpu

    new_path(10**9)  # warm the page cache and imports, as a site's cron run would find them
    target = TARGETS_S.get(n_jobs)
    for label, parallel_from in (("1 process", 10**9),
                                 ("default", cli_report.PARALLEL_MIN_JOBS)):
        fl, stages, cpu_s = new_path(parallel_from)
        new_s = sum(stages.values())
        print(f"  new path, {label}: " + ", ".join(f"{k} {v * 1000:.0f} ms"
                                                  for k, v in stages.items()))
        verdict = (f"; target {target:.0f} s: {'OK' if new_s < target else 'OVER'}"
                   if target else "")
        print(f"    total {new_s:.2f} s wall, {cpu_s:.2f} s CPU in this process "
              f"({new_s / n_jobs * 1e6:.0f} us/job){verdict}")
    other = {}
    for name, render in (("--json --jobs", lambda: json.dumps(fl.to_json(jobs=True))),
                         ("--csv", fl.to_csv)):
        t = time.perf_counter()
        with _no_cyclic_gc():  # as the CLI renders them
            size = len(render())
        other[name] = (time.perf_counter() - t, size)
    print("  instead of text: " + ", ".join(f"{k} {v * 1000:.0f} ms ({b / 2**20:.1f} MiB)"
                                            for k, (v, b) in other.items()))
    out = {"new_s": new_s}
    if old:
        t = time.perf_counter()
        sj = jobs_from_text(rec_text, att_text)
        fl_old = build_fleet(old_build_reports(sj, root), window="7d")
        fleet_text(fl_old)
        old_s = time.perf_counter() - t
        same = (json.dumps(fl_old.to_json(jobs=True), sort_keys=True)
                == json.dumps(fl.to_json(jobs=True), sort_keys=True))
        print(f"  old path total {old_s:.2f} s (full records read whole); old/new "
              f"{old_s / new_s:.1f}x; same fleet figures: {same}")
        out["old_s"] = old_s
        if not same:
            raise SystemExit("the compact summaries changed the fleet figures")
    spool = Spool(root)
    some = jobs[len(jobs) // 2]
    tw = []
    for k in range(20):
        rec = job_record(tpl, some, 5 + k, some.start, some.elapsed)
        t = time.perf_counter()
        spool.write_record(some.jid, 5 + k, rec)
        tw.append(time.perf_counter() - t)
    t = time.perf_counter()
    newest = spool.newest(some.jid)
    nt = time.perf_counter() - t
    print(f"  epilog side: durable write_record (record + summary, 2 fsyncs each) median "
          f"{sorted(tw)[len(tw) // 2] * 1000:.1f} ms; newest() over {n_rec} records "
          f"{nt * 1000:.0f} ms -> attempt {newest[0] if newest else None}")
    return out


def json_size(root: Path, jobs: list[Job], sub: str) -> float:
    sizes = [(root / sub / f"{j.jid}.0.json").stat().st_size for j in jobs[:500]
             if not j.no_fig]
    return sum(sizes) / max(1, len(sizes))


def sacct_json_compare(n_jobs: int) -> None:
    """The same jobs as `sacct --json -D` (22.05 dbv0.0.38): why the report reads text."""
    from slurmpod.report.sacct import parse_exit_codes, parse_sacct_jobs, with_exit_codes

    rec = json.loads((ROOT / "tests/data/slurm/22.05/sacct.json").read_text())
    base = next(j for j in rec["jobs"] if j["job_id"] == 9)
    rnd = random.Random(7)
    entries, codes = [], []
    for k in range(n_jobs):
        j0 = Job(k, rnd)
        for state, st, el in j0.attempts():
            j = copy.deepcopy(base)
            j.update(job_id=int(j0.jid), name=j0.name, user=j0.user, account=j0.account,
                     nodes=j0.nodes, state={"current": state, "reason": "None"})
            j["time"].update(submission=st - 60, start=st, end=st + el, elapsed=el)
            entries.append(j)
            codes.append(f"{j0.jid}|{'3' if state == 'FAILED' else '0'}:0")
    rec["jobs"] = entries
    text = json.dumps(rec, indent=2)
    t = time.perf_counter()
    with_exit_codes(parse_sacct_jobs(text), parse_exit_codes("\n".join(codes)))
    print(f"sacct --json for {n_jobs} jobs: {len(text) / 2**20:.0f} MiB, parse + exit codes "
          f"{time.perf_counter() - t:.1f} s (the text queries: see above)")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", default="10000,100000", help="comma-separated job counts")
    ap.add_argument("--dir", help="where to build the spools (default: a temp dir, removed)")
    ap.add_argument("--no-old", action="store_true", help="skip the old path (minutes at 100k)")
    ap.add_argument("--sacct-json", action="store_true",
                    help="also time the first size as sacct --json")
    ap.add_argument("--html", action="store_true", help="also time the fleet HTML (SVG plots)")
    ap.add_argument("--template", type=Path,
                    help="a spool record to use instead of building one (--save-template)")
    ap.add_argument("--save-template", type=Path, help="write the built record here and exit")
    args = ap.parse_args()
    sizes = [int(x) for x in args.jobs.split(",") if x.strip()]
    t = time.perf_counter()
    tpl = (json.loads(args.template.read_text()) if args.template else template_record())
    if args.save_template:
        args.save_template.write_text(json.dumps(tpl))
        return 0
    full = len(json.dumps(tpl, separators=(",", ":")))
    origin = args.template or "summarise_log + build_record over a 20,000-iteration log"
    points = len(tpl["series"].get("iter", []))
    print(f"template record ({origin}): {full / 1024:.1f} KiB, series {points} points "
          f"({time.perf_counter() - t:.1f} s)")
    base = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="report-scale-"))
    base.mkdir(parents=True, exist_ok=True)
    try:
        for n in sizes:
            one_size(n, tpl, base, old=not args.no_old)
            shutil.rmtree(base / f"spool-{n}", ignore_errors=True)
        if args.sacct_json and sizes:
            sacct_json_compare(sizes[0])
        if args.html and sizes:
            from slurmpod.report.build import build_job_report
            from slurmpod.report.fleet import build_fleet
            from slurmpod.report.html import fleet_html
            from slurmpod.report.sacct import jobs_from_text

            rnd = random.Random(7)
            sj = jobs_from_text(*sacct_text([Job(k, rnd) for k in range(sizes[0])]))
            fl = build_fleet([build_job_report(s, with_series=False, with_notes=False)
                              for s in sj], window="7d")
            t = time.perf_counter()
            html = fleet_html(fl, generated="benchmark")
            print(f"fleet HTML with plots: {(time.perf_counter() - t) * 1000:.0f} ms, "
                  f"{len(html) / 1024:.0f} KiB")
    finally:
        if not args.dir:
            shutil.rmtree(base, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
