"""Reports from data recorded on the real sandbox (tests/data/report/sandbox-22.05/: sacct JSON,
the hook's spool records and the jobs' own logs). Every figure is re-derived here from the logs
and from the raw sacct JSON, independently of slurmpod's parsers."""

from __future__ import annotations

import json

import numpy as np
import pytest

from slurmpod.config import load_site, resolve_site_path
from slurmpod.report.build import build_job_report
from slurmpod.report.fleet import build_fleet
from slurmpod.report.sacct import parse_exit_codes, parse_sacct_jobs, with_exit_codes
from tests.helpers import DATA_DIR, LOADED, segments

REC = DATA_DIR / "report" / "sandbox-22.05"
FLOPS, PEAK = 2.0e9, 0.05  # the jobs' Comment (flops_per_iter, peak_tflops)
LOGS = {"1": "done-1.out", "2": "failed-2.out", "3": "requeued-3.out", "4": "nolog-4.out"}


def raw_elapsed(job_id: str) -> list[int]:
    jobs = json.loads((REC / "sacct.json").read_text())["jobs"]
    return [j["time"]["elapsed"] for j in jobs if str(j["job_id"]) == job_id]


@pytest.fixture(scope="module")
def reports() -> dict:
    jobs = with_exit_codes(parse_sacct_jobs((REC / "sacct.json").read_text()),
                           parse_exit_codes((REC / "exit_codes.txt").read_text()))
    inv = load_site(resolve_site_path("sandbox")).inventory
    out = {}
    for sj in jobs:
        recs = sorted((REC / "records").glob(f"{sj.record.job_id}.*.json"))
        rec = json.loads(recs[-1].read_text()) if recs else None
        out[sj.record.job_id] = build_job_report(sj, spool_record=rec, inventory=inv)
    return out


def test_completed_two_su_job(reports: dict) -> None:
    r = reports["1"]
    (seg,) = segments((REC / LOGS["1"]).read_text())
    steady = [FLOPS / (ms / 1000) / 16 / 1e12 / PEAK for i, ms in seg if i > 10]
    assert r.figures.mfu.median == pytest.approx(float(np.median(steady)), rel=2e-3)
    assert r.figures.mfu.p10 == pytest.approx(float(np.percentile(steady, 10)), rel=2e-3)
    alloc_s = sum(raw_elapsed("1"))
    prod_s = sum(ms for _, ms in seg) / 1000
    assert r.loss.allocated_gpu_s == alloc_s * 16
    assert r.loss.productive_gpu_s == pytest.approx(prod_s * 16, rel=1e-3)
    assert sum(r.loss.by_cause_gpu_s.values()) == pytest.approx((alloc_s - prod_s) * 16,
                                                                 rel=1e-3)
    assert r.placement.sus == ("su1", "su2") and r.placement.min_sus == 1
    assert "placement-wide-sus" in [n.code for n in r.notes]


def test_failed_job_exit_code(reports: dict) -> None:
    r = reports["2"]
    assert str(r.job.state) == "FAILED" and r.job.exit_code == 3
    assert r.figures.iters == len(segments((REC / LOGS["2"]).read_text())[0]) == 15


def test_requeued_job(reports: dict) -> None:
    r = reports["3"]
    text = (REC / LOGS["3"]).read_text()
    first, second = segments(text)
    resumed = int(LOADED.findall(text)[-1])
    assert (first[-1][0], resumed, second[0][0], second[-1][0]) == (17, 10, 11, 30)
    redone_ms = sum(ms for i, ms in first if i > resumed)
    prod_s = (sum(ms for _, ms in first + second) - redone_ms) / 1000
    alloc_s = sum(raw_elapsed("3"))
    assert [a.elapsed_s for a in r.attempts] == raw_elapsed("3") and len(r.attempts) == 2
    assert r.loss.allocated_gpu_s == alloc_s * 8
    assert r.loss.productive_gpu_s == pytest.approx(prod_s * 8, rel=1e-3)
    assert r.figures.redone_s == pytest.approx(redone_ms / 1000, rel=1e-3)
    assert r.loss.by_cause_gpu_s["restarts"] >= redone_ms / 1000 * 8 * 0.999
    assert r.loss.by_cause_gpu_s["other"] == 0


def test_no_log_job(reports: dict) -> None:
    assert reports["4"].status == "no-training-log"


def test_fleet_over_the_recorded_jobs(reports: dict) -> None:
    fl = build_fleet(reports.values(), window="1d")
    gpu_h = {k: r.loss.allocated_gpu_s / 3600 for k, r in reports.items()}
    mfu = {k: r.figures.mfu.median for k, r in reports.items() if r.figures.mfu}
    assert fl.total.gpu_hours == pytest.approx(sum(gpu_h.values()))
    assert fl.total.mfu == pytest.approx(sum(mfu[k] * gpu_h[k] for k in mfu)
                                         / sum(gpu_h[k] for k in mfu))
    assert fl.top_lost[0].job_id == max(
        (k for k in reports if reports[k].loss.lost_gpu_s),
        key=lambda k: reports[k].loss.lost_gpu_s)
