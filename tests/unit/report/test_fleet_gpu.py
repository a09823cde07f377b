"""Fleet rows carry GPU utilisation and energy from the records' summary.gpu, checked by the
fleet's fast path (schema.read_gpu_util_energy) as the full check would."""

from __future__ import annotations

import csv
import io
import json
from dataclasses import replace
from typing import Any

import pytest

from slurmpod.report.build import build_job_report
from slurmpod.report.fleet import build_fleet
from slurmpod.report.sacct import SacctJob
from slurmpod.telemetry.schema import clean_gpu_summary, read_gpu_util_energy
from tests.unit.report.test_html import record, sacct_job

GPU = {"v": 1, "src": "dcgm", "trust": "site", "n": 8, "span_s": 3600.0, "util": 87.5,
       "energy_j": 14745600}


def rec_with(gpu: Any, gpus: int = 8) -> dict[str, Any]:
    return {"summary": {"gpus": gpus, "gpu": gpu}}


@pytest.mark.parametrize(("gpu", "want"), [
    (GPU, (87.5, 14745600.0)),
    ({**GPU, "util": 100.5}, (None, 14745600.0)),  # out of range: dropped, not clamped
    ({**GPU, "util": float("nan")}, (None, 14745600.0)),
    ({**GPU, "util": "87"}, (None, 14745600.0)),
    ({**GPU, "energy_j": -1}, (87.5, None)),
    ({**GPU, "energy_j": 1500 * 1.1 * 8 * 3600 * 1.02}, (87.5, None)),  # beyond any GPU
    ({**GPU, "n": 16}, (87.5, 14745600.0)),  # more GPUs than allocated: 8 bound the energy
    ({**GPU, "n": 16, "energy_j": 1650 * 12 * 3600}, (87.5, None)),
    ({**GPU, "v": 2}, (None, None)),
    ("garbage", (None, None)),
])
def test_fast_check_agrees_with_the_full_one(gpu: Any, want: tuple[Any, Any]) -> None:
    assert read_gpu_util_energy(rec_with(gpu)) == want
    full = clean_gpu_summary(gpu, max_gpus=8) or {}
    assert (full.get("util"), full.get("energy_j")) == want


def test_rows_csv_and_json_carry_gpu_util_and_energy() -> None:
    sj = sacct_job()
    reports = []
    for k, gpu in enumerate((GPU, None)):
        spool = record()
        spool["summary"] = dict(spool["summary"])
        if gpu is None:
            spool["summary"].pop("gpu", None)
        else:
            spool["summary"]["gpu"] = gpu
        rec = replace(sj.record, job_id=str(500 + k))
        reports.append(build_job_report(SacctJob(rec, sj.attempts), spool_record=spool,
                                        with_series=False, with_notes=False))
    fl = build_fleet(reports, window="7d")
    rows = {r["job_id"]: r for r in fl.to_json(jobs=True)["job_rows"]}
    assert rows["500"]["gpu_util"] == 87.5 and rows["500"]["energy_j"] == 14745600
    assert rows["501"]["gpu_util"] is None and rows["501"]["energy_j"] is None
    table = {r["job_id"]: r for r in csv.DictReader(io.StringIO(fl.to_csv()))}
    assert float(table["500"]["energy_j"]) == 14745600 and table["501"]["gpu_util"] == ""
    json.dumps(fl.to_json(jobs=True))
