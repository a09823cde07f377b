"""The fleet reliability report (slurmpod.resilience.reliability) on recorded-shape inputs:
tests/data/report/reliability/phases.txt is the phases query's output (`sacct --parsable2
--duplicates --allocations --format=JobID,Start,End,ElapsedRaw,State,NodeList,AllocTRES`), one
row per attempt or resize phase; attempts-101.jsonl is a job script's attempts record
(docs/runs.md, format v1). Expected figures are worked out by hand in the comments."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from slurmpod.backends.parse import _merge_attempts
from slurmpod.model.jobs import JobRecord, JobState
from slurmpod.report.sacct import Attempt, SacctJob
from slurmpod.resilience.reliability import (
    build_reliability,
    failure_kind,
    parse_phases,
    phases_argv,
    reliability_text,
)
from slurmpod.runs.attempts import parse_attempts
from tests.helpers import DATA_DIR

DATA = DATA_DIR / "report" / "reliability"


def _job(jid: str, n_nodes: int, gpus: int, states: list[str]) -> SacctJob:
    """A job whose sacct attempts are its rows of phases.txt (the fleet path's attempts)."""
    rows = parse_phases((DATA / "phases.txt").read_text())[jid]
    assert [p.state for p in rows] == states
    rec = JobRecord(job_id=jid, name="train", user="alice", account="ml", partition="gpu",
                    state=JobState.parse(states[-1]), exit_code=0, signal=0, submit_time=None,
                    start_time=None, end_time=None, elapsed_s=0, nodes="", n_nodes=n_nodes,
                    n_gpus=gpus)
    return SacctJob(rec, tuple(Attempt(None, p.start_s, p.end_s, p.elapsed_s, p.state)
                               for p in rows))


@pytest.fixture
def phases() -> dict:
    return parse_phases((DATA / "phases.txt").read_text())


@pytest.fixture
def jobs() -> list[SacctJob]:
    return [_job("101", 4, 32, ["REQUEUED", "COMPLETED"]),
            _job("102", 1, 8, ["NODE_FAIL", "COMPLETED"]),
            _job("103", 3, 24, ["RESIZING", "COMPLETED"]),
            _job("104", 1, 8, ["FAILED"]), _job("105", 2, 16, ["TIMEOUT"])]


@pytest.fixture
def records() -> dict:
    log = parse_attempts((DATA / "attempts-101.jsonl").read_bytes())
    return {"101": log.of_job("101")}


def test_phases_parse_nodes_and_gpus(phases) -> None:
    assert [p.state for p in phases["103"]] == ["RESIZING", "COMPLETED"]
    assert phases["103"][0].nodes == ("gpu009", "gpu010", "gpu011", "gpu012")
    assert (phases["103"][0].gpus, phases["103"][1].gpus) == (32, 24)
    assert phases["102"][0].nodes == ("gpu007",)


def test_phases_skip_rows_not_as_slurm_prints_them() -> None:
    text = ("7|1|2|x|FAILED|gpu1|gres/gpu=8\n8|1|2|5|failed|gpu1|gres/gpu=8\n"
            "9.batch|1|2|5|FAILED|gpu1|\n10|1|2|5|FAILED|gpu[1-|gres/gpu=8\n"
            "11|1700000000|1700000005|5|FAILED|gpu1|cpu=4\n")
    got = parse_phases(text)
    assert list(got) == ["11"] and got["11"][0].gpus is None


def test_argv_has_no_free_text_fields() -> None:
    argv = phases_argv(["--starttime=now-7days"], "|")
    fmt = next(a for a in argv if a.startswith("--format="))
    assert "Comment" not in fmt and "JobName" not in fmt and "--duplicates" in argv


@pytest.mark.parametrize(("end", "evidence", "kind"), [
    ("failure", ["NVRM: Xid (PCI:0000:18:00): 79"], "failure:xid"),
    ("failure", ["NCCL WARN NET/IB : Got completion with error"], "failure:nccl"),
    ("failure", [None, "srun: task 3 Killed"], "failure:other"),
    ("hang", [], "hang"), ("preempted", [], "preemption"), ("completed", [], None),
    ("cancelled", [], None)])
def test_failure_kind(end, evidence, kind) -> None:
    assert failure_kind(end, evidence) == kind


def test_kinds_counted_once_per_job_source(jobs, phases, records) -> None:
    r = build_reliability(jobs, window="7d", phases=phases, records=records)
    # 101 from its record (hang, XID failure; its sacct REQUEUED row not counted again);
    # 102 NODE_FAIL, 104 FAILED and 105 TIMEOUT from sacct; 103's RESIZING is no failure.
    assert r.by_kind == {"hang": 1, "failure:xid": 1, "node_fail": 1, "failure:other": 1,
                         "timelimit": 1}
    assert r.records_read == 1 and not r.records_capped


def test_suspects_ranked_with_evidence(jobs, phases, records) -> None:
    r = build_reliability(jobs, window="7d", phases=phases, records=records)
    names = [s.name for s in r.suspects]
    # the hang named no node excluded: 1/4 to each of its 4 nodes; gpu003 also 0.5 for its
    # not_excluded entry and 1.0 excluded with the XID = 1.75; gpu004: 0.25 + excluded 1.0 +
    # health gate failed 1.0 = 2.25; gpu007: single-node NODE_FAIL 1.0; gpu001 only 0.25
    assert names[:3] == ["gpu004", "gpu003", "gpu007"]
    g3 = next(s for s in r.suspects if s.name == "gpu003")
    assert g3.score == pytest.approx(1.75)
    assert any("Xid" in e for e in g3.evidence)
    assert g3.blamed == {"failure:xid": 1}
    # gpu007 ran 2 h and failed once: MTBF 2 h
    g7 = next(s for s in r.suspects if s.name == "gpu007")
    assert g7.mtbf_hours == pytest.approx(2.0)
    assert "gpu011" not in names  # removed by the resize, but no failure evidence in sacct


def test_mtbf_reuses_history(jobs, phases, records) -> None:
    r = build_reliability(jobs, window="7d", phases=phases, records=records)
    h = r.history
    # record 101: 4 nodes × 1800 s + 4 × 1740 s + 4 × 7170 s = 10,710 s ×4 / 3600 = 11.9 h
    # sacct (the others, NNodes × elapsed): 102 1×(7200+1800), 103 3×(3600+7200),
    # 104 1×300, 105 2×10000 = 9000+32400+300+20000 = 61,700 s = 17.139 h
    assert h.node_hours == pytest.approx(11.9 + 61700 / 3600)
    # failures: hang + failure (101); NODE_FAIL (102); 104 FAILED after 300 s is a startup
    # failure, left out of the rate
    assert (h.failures, h.startup_failures) == (3, 1)
    assert r.job_scale[0] == (4, pytest.approx(h.node_hours / 3 / 4))


def test_lost_per_cause(jobs, phases, records) -> None:
    r = build_reliability(jobs, window="7d", phases=phases, records=records,
                          loss_gpu_hours={"checkpoint": 1.25})
    # hang: iterations 1180 - 1000 = 180 × 3 s = 540 s × 32 GPUs = 4.8 GPU-h
    assert r.lost["recomputed"] == pytest.approx(4.8)
    # attempt 1 -> 2 in the same allocation (restart 0): 60 s × 32 GPUs
    assert r.lost["restart_latency"] == pytest.approx(60 * 32 / 3600)
    assert r.lost["checkpoint"] == 1.25
    # queue: 101 attempt 2 -> 3 requeued 630 s (record); 102 600 s (sacct); 103's resize none
    assert r.queue_wait_hours == pytest.approx((630 + 600) / 3600)
    assert r.lost["queue_wait"] == pytest.approx((630 * 32 + 600 * 8) / 3600)


def test_resize_is_not_a_restart(jobs, phases) -> None:
    r = build_reliability(jobs, window="7d", phases=phases)
    (z,) = r.resizes
    assert (z.job_id, z.gpus_before, z.gpus_after) == ("103", 32, 24)
    assert z.to_json()["removed"] == ["gpu011"]
    assert r.history.failures == 1  # 102's NODE_FAIL only: the resize is no interruption
    assert "32 -> 24 GPUs, removed gpu011" in reliability_text(r)
    rec = jobs[2].record
    old = rec.__class__(**{**rec.__dict__, "state": JobState.RESIZING})
    assert _merge_attempts([old, rec]).restarts == 0
    assert _merge_attempts([rec, rec]).restarts == 1


def test_without_records_lost_is_unknown_not_zero(jobs, phases) -> None:
    r = build_reliability(jobs, window="7d", phases=phases)
    assert r.lost["recomputed"] is None and r.lost["restart_latency"] is None
    assert r.by_kind["requeued"] == 1  # 101's REQUEUED: cause unknown without the record
    doc = json.loads(json.dumps(r.to_json()))
    assert doc["schema"] == "slurmpod.report.reliability/1"
    assert "not in the data" in reliability_text(r)


def test_cli_rejects_reliability_for_a_job() -> None:
    from slurmpod.cli.report import report

    res = CliRunner().invoke(report, ["1234", "--reliability"])
    assert res.exit_code != 0 and "--reliability" in str(res.exception)
    res = CliRunner().invoke(report, ["--since", "7d", "--reliability", "--csv"])
    assert res.exit_code != 0 and "--reliability" in str(res.exception)
