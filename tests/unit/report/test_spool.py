"""Which spool file each report reads: the fleet the compact summary of a job's newest attempt,
the per-job report the full record (series and all)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from slurmpod.accounting.spool import Spool
from slurmpod.cli.report import read_spool_record, spool_index
from tests.helpers import DATA_DIR
from tests.unit.cli.conftest import fake_sacct  # noqa: F401 (fixture)
from tests.unit.cli.test_report import run

RECORDED = DATA_DIR / "report" / "sandbox-22.05" / "records"


def test_compact_index_prefers_the_summary_of_the_newest_attempt(tmp_path: Path) -> None:
    spool = Spool(tmp_path)
    rec = json.loads((RECORDED / "1.0.json").read_text())
    spool.write_record("7", 0, dict(rec))
    spool.write_record("7", 2, dict(rec))
    (spool.records / "8.0.json").write_text(json.dumps(rec))  # written before summaries
    (spool.summaries / "7.9.json").write_text("{}")  # a summary without its record: ignored
    idx = spool_index(tmp_path, compact=True)
    assert {k: (p.parent.name, p.name) for k, p in idx.items()} == {
        "7": ("summaries", "7.2.json"), "8": ("records", "8.0.json")}
    assert {k: p.parent.name for k, p in spool_index(tmp_path).items()} == {
        "7": "records", "8": "records"}
    assert len(read_spool_record(idx["7"])["series"]["iter"]) <= 2
    assert read_spool_record(idx["8"])["series"] == rec["series"]
    assert read_spool_record(tmp_path / "nothing.json") is None
    (tmp_path / "bad.json").write_text("[1]")
    assert read_spool_record(tmp_path / "bad.json") is None


def test_fleet_reads_summaries_and_job_report_reads_records(fake_sacct: Path,  # noqa: F811
                                                            tmp_path: Path) -> None:
    spool = Spool(tmp_path / "spool")  # the fixture's $SLURMPOD_SPOOL
    rec = json.loads((RECORDED / "1.0.json").read_text())  # MFU 0.52 %, not 101's 40 %
    spool.write_record("101", 0, rec)
    mfu = rec["summary"]["mfu"]
    full = json.loads(run("101", "--json", "--series").output)
    assert full["figures"]["source"] == "spool" and full["figures"]["mfu"]["median"] == mfu
    assert len(full["series"]["iter"]) == len(rec["series"]["iter"])
    # A damaged full record: the fleet never opens it, the job report falls back to sacct.
    spool.record_path("101", 0).write_text("{\"v\":1,")
    doc = json.loads(run("--since", "7d", "--json", "--jobs").output)
    row = next(r for r in doc["job_rows"] if r["job_id"] == "101")
    assert row["source"] == "spool" and row["mfu"] == mfu
    job = json.loads(run("101", "--json").output)
    assert job["figures"]["source"] == "admin_comment"


def _fleet_jobs(tmp_path: Path, n: int) -> tuple[list, Path]:
    """n copies of the hand-made 22.05 jobs under new ids, each finished one with a record."""
    import dataclasses

    from slurmpod.report.sacct import parse_exit_codes, parse_sacct_jobs, with_exit_codes

    data = DATA_DIR / "report"
    base = with_exit_codes(parse_sacct_jobs((data / "sacct-handmade-22.05.json").read_text()),
                           parse_exit_codes((data / "exit-codes-handmade.txt").read_text()))
    spool = Spool(tmp_path / "spool")
    rec = json.loads((RECORDED / "1.0.json").read_text())
    jobs = []
    for k in range(n):
        sj = base[k % len(base)]
        jid = str(1000 + k)
        jobs.append(dataclasses.replace(sj, record=dataclasses.replace(sj.record, job_id=jid)))
        if k % 3 == 0:
            spool.write_record(jid, 0, dict(rec))
    return jobs, spool.root


def test_fleet_in_two_processes_equals_one(tmp_path: Path,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    from slurmpod.cli import report as cli_report

    jobs, root = _fleet_jobs(tmp_path, 41)
    one = cli_report.fleet_of(jobs, root, window="7d").to_json(jobs=True)
    monkeypatch.setattr(cli_report, "PARALLEL_MIN_JOBS", 2)
    monkeypatch.setattr(cli_report, "_cpus", lambda: 2)
    forks: list[int] = []
    real_fork = os.fork

    def fork() -> int:
        pid = real_fork()
        if pid:
            forks.append(pid)
        return pid

    monkeypatch.setattr(cli_report.os, "fork", fork)
    two = cli_report.fleet_of(jobs, root, window="7d").to_json(jobs=True)
    assert len(forks) == 1 and two == one
    # every third job has a record; 3 of those 14 are copies of the running job 105 (no row)
    assert sum(1 for r in two["job_rows"] if r["source"] == "spool") == 11


def test_fleet_child_failure_falls_back_to_this_process(tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    from slurmpod.cli import report as cli_report

    jobs, root = _fleet_jobs(tmp_path, 20)
    one = cli_report.fleet_of(jobs, root, window="7d").to_json(jobs=True)
    monkeypatch.setattr(cli_report, "PARALLEL_MIN_JOBS", 2)
    monkeypatch.setattr(cli_report, "_cpus", lambda: 2)
    parent, real = os.getpid(), cli_report._fleet_rows

    def rows(*args: object, **kw: object):
        if os.getpid() != parent:
            raise MemoryError("the child ran out of memory")
        return real(*args, **kw)

    monkeypatch.setattr(cli_report, "_fleet_rows", rows)
    assert cli_report.fleet_of(jobs, root, window="7d").to_json(jobs=True) == one
