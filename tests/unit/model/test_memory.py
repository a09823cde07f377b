"""A job record's GPU memory read back (model/memory.py): what a forged record gives every
reader. The round trip from a parsed log is in tests/unit/accounting/test_memreport.py."""

from __future__ import annotations

import pytest

from slurmpod.model.memory import RecordedMemory

GOOD_RECORD = {"ranks": 8, "rank": 5, "max_allocated_mib": 61440.0,
               "max_reserved_mib": 64512.0, "device_used_mib": None, "alloc_retries": 2}


@pytest.mark.parametrize("change", [
    {"max_allocated_mib": 70000.0},  # allocated above reserved
    {"max_reserved_mib": float("inf")},
    {"max_reserved_mib": "64512"},
    {"max_allocated_mib": -1.0},
    {"max_allocated_mib": True},
    {"device_used_mib": float("nan")},
    {"device_used_mib": 90000.0},  # above the 80 GiB GPU
    {"rank": -3},
    {"rank": 2.0},
    {"rank": None},
])
def test_a_forged_record_reads_as_nothing(change: dict[str, object]) -> None:
    assert RecordedMemory.from_record(GOOD_RECORD, 80.0) is not None
    assert RecordedMemory.from_record(GOOD_RECORD | change, 80.0) is None


def test_optional_counts_that_are_not_counts_are_dropped() -> None:
    got = RecordedMemory.from_record(GOOD_RECORD | {"alloc_retries": -1, "ranks": "8"}, 80.0)
    assert got is not None and got.alloc_retries is None and got.ranks is None
