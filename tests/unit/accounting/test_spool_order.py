"""The spool's per-attempt records, their compact summaries, and the ordering of AdminComment
updates by (attempt, seq): a slow epilog of an earlier attempt never overwrites a later one."""

from __future__ import annotations

import dataclasses
import json
import logging
from pathlib import Path

import pytest

from slurmpod.accounting import spool as spool_mod
from slurmpod.accounting.spool import DeliveryError, Spool, compact_record
from slurmpod.report.model import figures_from_spool
from tests.helpers import DATA_DIR

RECORDED = DATA_DIR / "report" / "sandbox-22.05" / "records"


def recorded(name: str) -> dict:
    """A record the real hook wrote on the sandbox (Slurm 22.05.8)."""
    return json.loads((RECORDED / name).read_text())


def test_each_attempt_has_its_record_and_summary(tmp_path: Path) -> None:
    spool = Spool(tmp_path)
    first, second = recorded("3.1.json"), recorded("3.1.json")
    spool.write_record("3", 0, first)
    spool.write_record("3", 1, second)
    assert sorted(p.name for p in spool.records.iterdir()) == ["3.0.json", "3.1.json"]
    assert sorted(p.name for p in spool.summaries.iterdir()) == ["3.0.json", "3.1.json"]
    assert first["attempt"] == 0 and second["attempt"] == 1  # set in the caller's dict too
    assert spool.read_record("3", 1)["seq"] == second["seq"]
    assert spool.read_summary("3", 1)["seq"] == second["seq"]
    assert spool.newest("3") == (1, second["seq"])
    assert spool.newest("4") is None


def test_seq_increases_even_when_the_clock_goes_back(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    spool = Spool(tmp_path)
    monkeypatch.setattr(spool_mod.time, "time_ns", lambda: 2_000)
    a = {"v": 1, "summary": {}}
    spool.write_record("8", 0, a)
    monkeypatch.setattr(spool_mod.time, "time_ns", lambda: 1_000)  # NTP stepped back
    b = {"v": 1, "summary": {}}
    spool.write_record("8", 0, b)  # the epilog rerun for the same attempt
    assert (a["seq"], b["seq"]) == (2_000, 2_001)
    assert spool.newest("8") == (0, 2_001)


def test_summary_is_small_and_gives_the_same_figures() -> None:
    for name in ("1.0.json", "2.0.json", "3.1.json", "4.0.json"):
        rec = recorded(name)
        small = compact_record(rec)
        assert "series" not in rec or len(small["series"].get("iter", [])) <= 2
        assert "admin_comment" not in small and "comment" not in small
        full_fig, small_fig = figures_from_spool(rec), figures_from_spool(small)
        # The list of checkpoint stalls (a plot of the per-job report) is the one thing left out.
        assert dataclasses.replace(full_fig, checkpoints=()) == small_fig, name
        assert len(json.dumps(small, separators=(",", ":"))) < 1300, name
    # The summary does not grow with the series (512 points in a long job's record).
    rec = recorded("1.0.json")
    small = len(json.dumps(compact_record(rec)))
    rec["series"] = {k: (v * 512)[:512] for k, v in rec["series"].items()}
    assert len(json.dumps(rec)) > 20 * small
    assert len(json.dumps(compact_record(rec))) == small
    assert set(compact_record(rec)["summary"]["metrics"]) <= set(spool_mod.COMPACT_METRICS)


def test_a_legacy_record_without_summary_is_read_whole(tmp_path: Path) -> None:
    spool = Spool(tmp_path)
    (spool.records / "1.0.json").write_text((RECORDED / "1.0.json").read_text())
    assert spool.read_summary("1") == recorded("1.0.json")
    written = recorded("1.0.json")["written"]
    assert spool.newest("1") == (0, written * 1_000_000_000)  # seq from `written`


def test_put_keeps_the_newer_pending_update(tmp_path: Path) -> None:
    spool = Spool(tmp_path)
    spool.put("5", "admin_comment", "attempt-1", attempt=1, seq=10)
    spool.put("5", "admin_comment", "attempt-0", attempt=0, seq=99)  # late epilog of attempt 0
    spool.put("5", "admin_comment", "attempt-1-older", attempt=1, seq=9)
    assert [(d["value"], d["attempt"], d["seq"]) for d in spool.list_pending()] == [
        ("attempt-1", 1, 10)]
    spool.put("5", "admin_comment", "attempt-2", attempt=2, seq=1)
    assert [d["value"] for d in spool.list_pending()] == ["attempt-2"]


def test_put_during_delivery_of_a_newer_one_is_not_queued(tmp_path: Path) -> None:
    spool = Spool(tmp_path)
    spool.put("5", "admin_comment", "new", attempt=1, seq=20)
    seen: list[str] = []

    def deliver(job_id: str, kind: str, value: str) -> None:
        seen.append(value)
        spool.put("5", "admin_comment", "old", attempt=0, seq=30)  # attempt 0's slow epilog

    assert spool.flush(deliver).delivered == ["5.admin_comment"]
    assert seen == ["new"] and spool.list_pending() == []


def test_failed_delivery_replaces_an_older_update_queued_meanwhile(tmp_path: Path) -> None:
    spool = Spool(tmp_path)
    spool.put("5", "admin_comment", "new", attempt=1, seq=20)

    def deliver(job_id: str, kind: str, value: str) -> None:
        # an older update written straight into pending/ (a put from before this version)
        (spool.pending / "5.admin_comment.json").write_text(json.dumps(
            {"v": 1, "job_id": "5", "kind": "admin_comment", "value": "old", "attempt": 0,
             "seq": 5}))
        raise DeliveryError("slurmdbd: Connection refused")

    spool.flush(deliver)
    assert [d["value"] for d in spool.list_pending()] == ["new"]
    assert not list(spool.pending.glob("*.inflight"))


def test_flush_drops_an_update_older_than_the_newest_record(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    spool = Spool(tmp_path)
    rec0 = {"v": 1, "summary": {"mfu": 0.1}}
    spool.write_record("7", 0, rec0)
    spool.put("7", "admin_comment", "from-attempt-0", attempt=0, seq=rec0["seq"])
    rec1 = {"v": 1, "summary": {"mfu": 0.4}}
    spool.write_record("7", 1, rec1)  # attempt 1's epilog delivered its own directly
    spool.put("9", "admin_comment", "job-9", attempt=0)  # no record: nothing to compare
    got: list[tuple[str, str]] = []
    with caplog.at_level(logging.WARNING, logger="slurmpod.hook"):
        res = spool.flush(lambda j, k, v: got.append((j, v)))
    assert got == [("9", "job-9")]
    assert res.dropped == ["7.admin_comment"] and res.delivered == ["9.admin_comment"]
    assert res.to_json()["dropped"] == ["7.admin_comment"]
    assert spool.list_pending() == [] and not list(spool.pending.iterdir())
    assert "pending admin_comment of attempt 0 dropped" in caplog.text


def test_flush_delivers_the_update_of_the_newest_record(tmp_path: Path) -> None:
    spool = Spool(tmp_path)
    rec = {"v": 1, "summary": {}}
    spool.write_record("7", 2, rec)
    spool.put("7", "admin_comment", "same-record", attempt=2, seq=rec["seq"])
    spool.put("8", "admin_comment", "now", attempt=0)  # seq None: the time of the put
    got: list[str] = []
    res = spool.flush(lambda j, k, v: got.append(v))
    assert got == ["same-record", "now"] and res.dropped == []


def test_legacy_pending_file_is_still_delivered(tmp_path: Path) -> None:
    spool = Spool(tmp_path)
    (spool.pending / "4.admin_comment.json").write_text(json.dumps(
        {"v": 1, "job_id": "4", "kind": "admin_comment", "value": "x", "queued": 1795000000,
         "attempts": 2, "last_error": ""}))
    got: list[str] = []
    assert spool.flush(lambda j, k, v: got.append(v)).delivered == ["4.admin_comment"]
    assert got == ["x"]


def test_crash_between_record_and_summary_leaves_no_stale_summary(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    spool = Spool(tmp_path)
    spool.write_record("6", 0, {"v": 1, "summary": {"mfu": 0.1}})
    real = spool_mod.write_durable

    def crash_on_summary(path: Path, text: str, mode: int = 0o640) -> None:
        if path.parent == spool.summaries:
            raise OSError("power cut")
        real(path, text, mode)

    monkeypatch.setattr(spool_mod, "write_durable", crash_on_summary)
    rerun = {"v": 1, "summary": {"mfu": 0.4}}
    with pytest.raises(OSError):
        spool.write_record("6", 0, rerun)  # the epilog rerun for the same attempt
    assert not spool.summary_path("6", 0).exists()
    assert spool.read_summary("6")["summary"]["mfu"] == 0.4  # the new record, read whole
    assert spool.newest("6") == (0, rerun["seq"])
