"""Fleet aggregation, CSV and Prometheus exposition over the hand-made 22.05-shape jobs
(tests/data/report/); expected numbers are worked out by hand from the per-job figures that
tests/unit/report/test_report.py checks (101: 32 GPU-h at MFU 0.4, productive 28.8; 102: 8 GPU-h at
0.1, productive 4; 103: 4 GPU-h at 0.3, productive 2; 104: 60 s × 8 GPUs, no figures;
105 running)."""

from __future__ import annotations

import csv
import io
import re

import pytest

from slurmpod.report.build import build_job_report
from slurmpod.report.fleet import CSV_COLUMNS, build_fleet, weighted_median
from slurmpod.report.prom import escape_label, fleet_exposition, job_exposition
from slurmpod.report.sacct import parse_exit_codes, parse_sacct_jobs, with_exit_codes
from tests.helpers import DATA_DIR, promtool_check

DATA = DATA_DIR / "report"


@pytest.fixture(scope="module")
def reports() -> list:
    jobs = with_exit_codes(parse_sacct_jobs((DATA / "sacct-handmade-22.05.json").read_text()),
                           parse_exit_codes((DATA / "exit-codes-handmade.txt").read_text()))
    return [build_job_report(sj, with_series=False) for sj in jobs]


@pytest.fixture(scope="module")
def fleet(reports: list):
    return build_fleet(reports, window="7d", filters={"user": None})


def test_totals_hand_checked(fleet) -> None:
    t = fleet.total
    assert t.jobs == 4 and fleet.n_running == 1
    assert t.gpu_hours == pytest.approx(32 + 8 + 4 + 60 * 8 / 3600)
    # (0.4·32 + 0.1·8 + 0.3·4) / (32 + 8 + 4) = 14.8 / 44
    assert t.mfu == pytest.approx(14.8 / 44)
    assert t.mfu_gpu_hours == pytest.approx(44)
    # (28.8 + 4 + 2) / 44: job 104 has no productive figure and is left out
    assert t.goodput == pytest.approx(34.8 / 44)
    assert t.lost == pytest.approx({
        "startup": 1.6 + 600 * 16 / 3600, "checkpoint": 60 * 32 / 3600 + 30 * 8 / 3600,
        "restarts": 870 * 8 / 3600, "other": 120 * 32 / 3600 + 300 * 16 / 3600})


def test_top_jobs_and_groups(fleet) -> None:
    # lost GPU-h: 102 → 4, 101 → 3.2, 103 → 2
    assert [r.job_id for r in fleet.top_lost] == ["102", "101", "103"]
    assert fleet.top_lost[0].lost_gpu_hours == pytest.approx(4.0)
    users = {g.key: g for g in fleet.by_user}
    assert [g.key for g in fleet.by_user] == ["alice", "bob"]
    assert users["alice"].jobs == 3 and users["alice"].gpu_hours == pytest.approx(
        36 + 60 * 8 / 3600)
    assert users["alice"].mfu == pytest.approx((0.4 * 32 + 0.3 * 4) / 36)
    assert users["bob"].goodput == pytest.approx(0.5)
    assert {g.key for g in fleet.by_account} == {"ml", "infra"}


def test_mfu_distribution_and_typical(fleet) -> None:
    bins = {lo: (n, h) for lo, n, h in fleet.mfu_hist if n}
    assert bins == {0.1: (1, 8.0), 0.3: (1, 4.0), 0.4: (1, 32.0)}
    assert len(fleet.mfu_hist) == 20
    # weighted median of (0.1, 8), (0.3, 4), (0.4, 32): half of 44 is reached at 0.4
    assert fleet.typical_mfu == {"<1B": 0.4}
    assert weighted_median([(1.0, 1.0), (2.0, 1.0), (3.0, 1.0)]) == 2.0
    assert weighted_median([]) is None


def test_lost_over_time_buckets(fleet) -> None:
    # all jobs end within two hours of each other: hourly buckets
    assert fleet.bucket == "hour"
    total = {c: sum(s[c] for _, s in fleet.lost_over_time) for c in fleet.total.lost}
    assert total == pytest.approx(fleet.total.lost)


def test_json_and_csv_agree(fleet) -> None:
    doc = fleet.to_json(jobs=True)
    assert doc["jobs"] == 4 and doc["running_jobs"] == 1 and doc["jobs_with_mfu"] == 3
    rows = list(csv.DictReader(io.StringIO(fleet.to_csv())))
    assert tuple(rows[0]) == CSV_COLUMNS
    assert [r["job_id"] for r in rows] == [r["job_id"] for r in doc["job_rows"]]
    by = {r["job_id"]: r for r in rows}
    assert float(by["101"]["gpu_hours"]) == pytest.approx(32.0)
    assert by["104"]["mfu"] == "" and by["102"]["exit_code"] == "3"
    assert float(by["103"]["lost_restarts_gpu_hours"]) == pytest.approx(870 * 8 / 3600)


def test_prometheus_escaping_and_shape(reports, fleet) -> None:
    assert escape_label('a"b\\c\nd') == 'a\\"b\\\\c\\nd'
    text = job_exposition(reports)
    for name in ("slurmpod_job_mfu_ratio", "slurmpod_job_lost_gpu_seconds",
                 "slurmpod_job_allocated_gpu_seconds"):
        assert f"# HELP {name} " in text and f"# TYPE {name} gauge" in text
    assert ('slurmpod_job_allocated_gpu_seconds{job_id="101",name="train-big",user="alice",'
            'account="ml",partition="batch",state="COMPLETED"} 115200') in text
    sample = re.compile(r'^[a-z_]+\{([a-z_]+="(?:[^"\\\n]|\\.)*",?)*\} [-+0-9.eInfNa]+$')
    for line in text.splitlines():
        assert line.startswith("# ") or sample.match(line), line
    ftext = fleet_exposition(fleet)
    assert 'slurmpod_fleet_allocated_gpu_seconds{window="7d"} ' in ftext
    assert 'slurmpod_user_mfu_ratio{window="7d",user="bob"} 0.1' in ftext


def test_prometheus_label_values_with_quotes(reports) -> None:
    import dataclasses

    r = reports[0]
    odd = dataclasses.replace(r, job=dataclasses.replace(r.job, name='we"ird\\ name\nx'))
    text = job_exposition([odd])
    assert 'name="we\\"ird\\\\ name\\nx"' in text
    promtool_check(text)


@pytest.mark.parametrize(("value", "cell"), [
    ("=HYPERLINK(\"http://x\")", "'=HYPERLINK(\"http://x\")"), ("+1", "'+1"), ("-2", "'-2"),
    ("@SUM(A1)", "'@SUM(A1)"), ("\tx", "'\tx"), ("train-a", "train-a"), (-1.5, -1.5),
    (None, ""), (0, 0),
])
def test_csv_cells_never_run_as_formulas(value: object, cell: object) -> None:
    from slurmpod.report.fleet import csv_cell

    assert csv_cell(value) == cell


def test_csv_of_a_job_named_like_a_formula(reports: list) -> None:
    from dataclasses import replace

    r = reports[0]
    hostile = replace(r, job=replace(r.job, name="=cmd|' /C calc'!A0"))
    rows = list(csv.reader(io.StringIO(build_fleet([hostile], window="1d").to_csv())))
    assert rows[1][CSV_COLUMNS.index("name")] == "'=cmd|' /C calc'!A0"
