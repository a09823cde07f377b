"""The spool: durable records, pending updates, flush against a failing then working Slurm."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from slurmpod.accounting.spool import DeliveryError, Spool, safe_job_id


class FlakySlurm:
    """Refuses every delivery while `down`; records what it took."""

    def __init__(self) -> None:
        self.down = True
        self.got: list[tuple[str, str, str]] = []

    def __call__(self, job_id: str, kind: str, value: str) -> None:
        if self.down:
            raise DeliveryError("slurmdbd: Connection refused")
        self.got.append((job_id, kind, value))


def test_flush_keeps_then_delivers(tmp_path: Path) -> None:
    spool = Spool(tmp_path / "spool")
    spool.put("12", "admin_comment", '{"v":1,"mfu":0.41}')
    spool.put("13", "admin_comment", '{"v":1,"mfu":0.38}')
    slurm = FlakySlurm()
    first = spool.flush(slurm)
    assert first.delivered == [] and sorted(first.failed) == ["12.admin_comment",
                                                              "13.admin_comment"]
    assert "Connection refused" in first.errors["12.admin_comment"]
    left = {d["job_id"]: d for d in spool.list_pending()}
    assert set(left) == {"12", "13"} and left["12"]["attempts"] == 1
    assert "Connection refused" in left["12"]["last_error"]
    slurm.down = False
    second = spool.flush(slurm)
    assert sorted(second.delivered) == ["12.admin_comment", "13.admin_comment"]
    assert sorted(slurm.got) == [("12", "admin_comment", '{"v":1,"mfu":0.41}'),
                                 ("13", "admin_comment", '{"v":1,"mfu":0.38}')]
    assert spool.list_pending() == []
    assert spool.flush(slurm).delivered == []  # nothing delivered twice
    assert len(slurm.got) == 2


def test_newer_put_replaces_older(tmp_path: Path) -> None:
    spool = Spool(tmp_path)
    spool.put("5", "admin_comment", "old")
    spool.put("5", "admin_comment", "new")
    docs = spool.list_pending()
    assert [d["value"] for d in docs] == ["new"]


def test_put_during_delivery_is_not_lost(tmp_path: Path) -> None:
    spool = Spool(tmp_path)
    spool.put("5", "admin_comment", "first")
    seen: list[str] = []

    def deliver(job_id: str, kind: str, value: str) -> None:
        seen.append(value)
        if value == "first":  # an epilog of a requeued run queues a newer summary meanwhile
            spool.put("5", "admin_comment", "second")

    assert spool.flush(deliver).delivered == ["5.admin_comment"]
    assert [d["value"] for d in spool.list_pending()] == ["second"]
    spool.flush(deliver)
    assert seen == ["first", "second"] and spool.list_pending() == []


def test_failed_delivery_does_not_overwrite_newer(tmp_path: Path) -> None:
    spool = Spool(tmp_path)
    spool.put("5", "admin_comment", "first")

    def deliver(job_id: str, kind: str, value: str) -> None:
        spool.put("5", "admin_comment", "second")
        raise DeliveryError("down")

    spool.flush(deliver)
    assert [d["value"] for d in spool.list_pending()] == ["second"]


def test_crash_mid_flush_is_recovered(tmp_path: Path) -> None:
    spool = Spool(tmp_path)
    path = spool.put("9", "admin_comment", "v")
    os.rename(path, path.with_name(path.name + ".inflight"))  # as if flush died while delivering
    got: list[str] = []
    result = spool.flush(lambda j, k, v: got.append(v))
    assert result.delivered == ["9.admin_comment"] and got == ["v"]
    assert not list(spool.pending.iterdir())


def test_malformed_pending_file_is_kept_and_reported(tmp_path: Path) -> None:
    spool = Spool(tmp_path)
    (spool.pending / "77.admin_comment.json").write_text("{not json")
    result = spool.flush(lambda j, k, v: None)
    assert result.failed == ["77.admin_comment.json"]
    assert (spool.pending / "77.admin_comment.json").exists()


def test_concurrent_flush_skips(tmp_path: Path) -> None:
    spool = Spool(tmp_path)
    spool.put("1", "admin_comment", "x")
    with spool.locked() as got:
        assert got
        # a second flush (another epilog) does not wait and does not deliver
        result = spool.flush(lambda j, k, v: pytest.fail("delivered under a held lock"),
                             blocking=False)
        assert result.delivered == [] and result.failed == []
    assert len(spool.list_pending()) == 1


def test_record_written_atomically_and_readable(tmp_path: Path) -> None:
    spool = Spool(tmp_path)
    rec = {"v": 1, "job_id": "3", "summary": {"mfu": 0.4}, "series": {"iter": [1, 2]}}
    path = spool.write_record("3", 0, rec)
    assert path.name == "3.0.json"
    assert json.loads(path.read_text()) == rec
    assert spool.read_record("3") == rec
    assert [p.name for p in spool.records.iterdir()] == ["3.0.json"]  # no temp file left


@pytest.mark.parametrize("bad", ["../x", "1/2", "", "12a", "1.0", "-1"])
def test_job_id_is_checked_before_use_as_file_name(bad: str) -> None:
    with pytest.raises(ValueError):
        safe_job_id(bad)


@pytest.mark.parametrize("ok", ["1", "123_4", "77+1"])
def test_job_id_shapes_allowed(ok: str) -> None:
    assert safe_job_id(ok) == ok
