"""Garbage in: the parser never crashes and never invents an iteration.

Every record it returns must be one of the real lines' records: the same iteration, elapsed
time and batch size, and every other field it has equal to the real one (a field whose key was
damaged is left out, never guessed).
"""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from slurmpod.accounting.logparse import LogParser, parse_log
from tests.helpers import DATA_DIR

DATA = DATA_DIR / "megatron"
REAL = (DATA / "mixtral-8x7b-h100x16.log").read_bytes().splitlines(keepends=True)
SAMPLES = b"".join((DATA / n).read_bytes() for n in (
    "mixtral-8x7b-h100x16.log", "megatron-2023-no-timestamp.log", "megatron-2024-restart.log",
    "megatron-2026-microseconds.log", "megatron-deepspeed.log", "progress.txt"))
COLS = ("iteration", "train_iters", "elapsed_ms", "consumed_samples", "global_batch_size",
        "tflops_reported", "skipped_iters", "nan_iters")


def _rows(s) -> list[tuple]:
    it = s.iterations
    return [tuple(repr(getattr(it, c)[i].item()) for c in COLS) for i in range(len(it))]


def _missing(v: str) -> bool:
    return v in ("-1", "nan")


def _genuine(rows: list[tuple], truth: list[tuple]) -> bool:
    """Each row equals a true row on the first three columns, elapsed time and batch size,
    and on every other column it has."""
    for row in rows:
        if _missing(row[4]) or not any(
                row[:3] == t[:3] and all(_missing(a) or a == b for a, b in zip(row, t, strict=True))
                for t in truth):
            return False
    return True


TRUTH = _rows(parse_log(REAL))
CLEAN = _rows(parse_log([SAMPLES]))
FUZZ = settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@FUZZ
@given(st.binary(max_size=4096), st.integers(min_value=1, max_value=997))
def test_random_bytes_never_crash_and_make_no_iterations(data: bytes, chunk: int) -> None:
    p = LogParser()
    for k in range(0, len(data), chunk):
        p.feed(data[k:k + chunk])
    s = p.close()
    assert len(s.iterations) == 0


@FUZZ
@given(st.lists(st.tuples(st.integers(0, len(REAL) - 1), st.integers(0, 500), st.binary(
    max_size=40)), max_size=12))
def test_truncated_and_glued_real_lines_never_give_bogus_records(cuts: list) -> None:
    """Lines cut anywhere and glued to garbage or to each other (interleaved ranks)."""
    pieces = []
    for idx, cut, junk in cuts:
        pieces.append(REAL[idx][:cut] + junk)
    s = parse_log(pieces)
    assert _genuine(_rows(s), TRUTH)


@FUZZ
@given(st.integers(0, len(SAMPLES) - 1), st.binary(min_size=1, max_size=64),
       st.integers(min_value=1, max_value=4096))
def test_real_samples_with_junk_spliced_in_never_crash(pos: int, junk: bytes, chunk: int) -> None:
    data = SAMPLES[:pos] + junk + SAMPLES[pos:]
    p = LogParser()
    for k in range(0, len(data), chunk):
        p.feed(data[k:k + chunk])
    s = p.close()
    # Junk can break at most the line it lands in (and glue two lines into one).
    assert len(CLEAN) - 2 <= len(s.iterations) <= len(CLEAN)
    rows = _rows(s)
    if junk.strip(b"0123456789."):
        assert _genuine(rows, CLEAN)
    else:
        # Digits spliced into a number ("9088" -> "90088") make another valid number: no parser
        # can tell. Only the one line they land in may differ from the real records.
        assert sum(not _genuine([r], CLEAN) for r in rows) <= 1


@FUZZ
@given(st.sampled_from(REAL), st.integers(0, 420), st.sampled_from(
    [b"x", b"|", b" ", b"9", b".", b":", b"\x00", b"\xff", b"[", b"]"]))
def test_a_corrupted_real_line_is_either_exact_or_rejected(line: bytes, pos: int, byte: bytes,
                                                          ) -> None:
    bad = line[:pos] + byte + line[pos + 1:]
    s = parse_log([bad])
    rows = _rows(s)
    assert len(rows) <= 1
    # A number changed into another well-formed number (a digit or its dot replaced by a digit,
    # a dot or a space) cannot be told from the truth; everything else must be.
    numeric = line[pos:pos + 1] in b"0123456789. " and byte in b"9. "
    if rows and not numeric:
        assert _genuine(rows, TRUTH)
