"""Slurm time values (model/slurm_time.py): every form sbatch accepts and sacct prints."""

from __future__ import annotations

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from slurmpod.model.slurm_time import (
    TIME_PATTERN,
    duration_s,
    elapsed_s,
    format_minutes,
    format_seconds,
    limit_minutes,
    time_limit_raw_s,
)


@pytest.mark.parametrize(("text", "seconds"), [
    ("30", 1800),  # MM
    ("1:30", 90),  # MM:SS
    ("02:00:00", 7200),  # HH:MM:SS
    ("2-12", 2 * 86400 + 12 * 3600),  # D-HH
    ("1-02:03", 86400 + 2 * 3600 + 3 * 60),  # D-HH:MM
    ("1-00:00:00", 86400),  # D-HH:MM:SS
    ("0", 0), (" 45 ", 2700),
    ("UNLIMITED", None), ("INFINITE", None), ("unlimited", None), ("Partition_Limit", None)])
def test_every_limit_form(text: str, seconds: int | None) -> None:
    assert duration_s(text) == seconds


@pytest.mark.parametrize("text", ["", "abc", "2-", "-5", "1:2:3:4", "1-2:3:4:5", "1.5",
                                  "00:03.706"])
def test_what_is_not_a_limit_is_refused(text: str) -> None:
    with pytest.raises(ValueError, match="not a Slurm time"):
        duration_s(text)


@pytest.mark.parametrize(("text", "minutes"), [
    ("30", 30), ("1:30", 2), ("1:00", 1), ("02:00:00", 120), ("00:30:01", 31),
    ("1-00:00:00", 1440), ("2-12", 3600), ("INFINITE", None)])
def test_limit_minutes_rounds_seconds_up_as_slurm_does(text: str, minutes: int | None) -> None:
    # sbatch(1) --time: "seconds values are rounded up to the next minute".
    assert limit_minutes(text) == minutes


@pytest.mark.parametrize(("text", "want"), [
    ("00:03.706", 3.706), ("00:00:00", 0.0), ("59:59.999", 3599.999), ("01:02:03", 3723.0),
    ("2-03:04:05", 2 * 86400 + 3 * 3600 + 4 * 60 + 5), ("", None), ("1-02:03", None),
    ("abc", None), ("00:03.7x", None), ("5", None)])
def test_sacct_printed_durations(text: str, want: float | None) -> None:
    """TotalCPU/UserCPU keep milliseconds under an hour (sacct's _elapsed_time)."""
    got = elapsed_s(text)
    assert got == (pytest.approx(want) if want is not None else None)


@pytest.mark.parametrize(("text", "want"), [
    ("10", 600), ("60", 3600), ("UNLIMITED", None), ("Partition_Limit", None), ("", None),
    ("-1", None)])
def test_time_limit_raw(text: str, want: int | None) -> None:
    assert time_limit_raw_s(text) == want


def test_format_as_slurm_prints() -> None:
    assert format_minutes(120) == "02:00:00"
    assert format_minutes(1440) == "1-00:00:00"
    assert format_minutes(2 * 1440 + 61) == "2-01:01:00"
    assert format_minutes(None) == "UNLIMITED"
    assert format_seconds(3723) == "01:02:03"


@given(st.integers(0, 400 * 86400))
def test_format_parse_round_trip(seconds: int) -> None:
    text = format_seconds(seconds)
    assert re.fullmatch(TIME_PATTERN, text)
    assert duration_s(text) == seconds
    assert elapsed_s(text) == seconds
