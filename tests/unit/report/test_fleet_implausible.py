"""Implausible jobs in the fleet report: listed with their reasons, in no aggregate. Over the
hand-made 22.05-shape jobs of tests/data/report/ (101: 32 GPU-h at MFU 0.4; 102: 8 GPU-h at
0.1, productive 4; 103: 4 GPU-h at 0.3, productive 2; 104: 60 s × 8 GPUs, no figures; 105
running), with job 101 flagged by hand."""

from __future__ import annotations

import csv
import dataclasses
import io
import json
from types import SimpleNamespace

import pytest

from slurmpod.report.build import build_job_report
from slurmpod.report.fleet import CSV_COLUMNS, JobRow, build_fleet
from slurmpod.report.sacct import parse_exit_codes, parse_sacct_jobs, with_exit_codes
from slurmpod.report.text import fleet_text
from tests.helpers import DATA_DIR

DATA = DATA_DIR / "report"
FLAGS = ("mfu-over-100", "goodput-over-100")


def flagged(r, reasons: tuple[str, ...]):
    # Every report starts plausible here: these tests are about the fleet, not the rules.
    return dataclasses.replace(r, implausible=reasons)


@pytest.fixture(scope="module")
def fleet():
    jobs = with_exit_codes(parse_sacct_jobs((DATA / "sacct-handmade-22.05.json").read_text()),
                           parse_exit_codes((DATA / "exit-codes-handmade.txt").read_text()))
    reports = [build_job_report(sj, with_series=False) for sj in jobs]
    reports = [flagged(r, FLAGS if r.job.job_id == "101" else ()) for r in reports]
    return build_fleet(reports, window="7d")


def test_implausible_job_is_in_no_aggregate(fleet) -> None:
    t = fleet.total
    assert t.jobs == 3 and fleet.n_running == 1
    assert t.gpu_hours == pytest.approx(8 + 4 + 60 * 8 / 3600)
    assert t.mfu == pytest.approx((0.1 * 8 + 0.3 * 4) / 12)
    assert t.goodput == pytest.approx((4 + 2) / 12)
    users = {g.key: g for g in fleet.by_user}
    assert users["alice"].jobs == 2 and users["alice"].mfu == pytest.approx(0.3)
    assert {g.key: g.jobs for g in fleet.by_account} == {"infra": 1, "ml": 2}
    assert [r.job_id for r in fleet.top_lost] == ["102", "103"]
    assert {lo: n for lo, n, _ in fleet.mfu_hist if n} == {0.1: 1, 0.3: 1}
    # weighted median of (0.1, 8), (0.3, 4): half of 12 is reached at 0.1 (0.4 is left out)
    assert fleet.typical_mfu == {"<1B": 0.1}
    lost_total = sum(sum(c.values()) for _, c in fleet.lost_over_time)
    assert lost_total == pytest.approx(t.lost_gpu_hours)


def test_implausible_job_is_listed_with_reasons(fleet) -> None:
    assert [r.job_id for r in fleet.implausible] == ["101"]
    doc = json.loads(json.dumps(fleet.to_json(jobs=True)))
    assert doc["jobs"] == 3 and doc["jobs_with_mfu"] == 2
    assert doc["implausible_jobs"] == [{"job_id": "101", "user": "alice", "name": "train-big",
                                        "state": "COMPLETED", "gpu_hours": 32.0, "mfu": 0.4,
                                        "reasons": list(FLAGS)}]
    rows = {r["job_id"]: r for r in doc["job_rows"]}
    assert rows["101"]["implausible"] == list(FLAGS) and rows["102"]["implausible"] == []
    text = fleet_text(fleet)
    assert "implausible 1 (in no figure below)" in text
    line = next(ln for ln in text.splitlines() if ln.strip().startswith("101"))
    assert "mfu-over-100, goodput-over-100" in line


def test_csv_has_the_reasons_column(fleet) -> None:
    assert CSV_COLUMNS[-1] == "implausible"
    rows = {r["job_id"]: r for r in csv.DictReader(io.StringIO(fleet.to_csv()))}
    assert set(rows) == {"101", "102", "103", "104"}  # the implausible job keeps its row
    assert rows["101"]["implausible"] == "mfu-over-100;goodput-over-100"
    assert rows["102"]["implausible"] == ""


def test_report_without_the_field_reads_as_plausible(fleet) -> None:
    row = fleet.rows[1]
    fake = SimpleNamespace(
        job=SimpleNamespace(job_id="9", name="n", user="u", account="a", partition="p",
                            state="COMPLETED", exit_code=0, n_nodes=1, start_time=None,
                            end_time=None, elapsed_s=10, restarts=0),
        figures=SimpleNamespace(mfu=None, tflops=None, tokens_per_s=None, source="none"),
        loss=SimpleNamespace(allocated_gpu_s=80.0, productive_gpu_s=None, by_cause_gpu_s={}),
        attempts=(), gpus=8, params_b=None)
    assert JobRow.of(fake).implausible == () and row.implausible == ()
