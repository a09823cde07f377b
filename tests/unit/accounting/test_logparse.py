"""Parser tests over the real Mixtral sample (NVIDIA/Megatron-LM issue 756) and its variants."""

from __future__ import annotations

import io

import numpy as np
import pytest

from slurmpod.accounting.logparse import LogParser, parse_log, parse_timestamp
from tests.helpers import DATA_DIR

DATA = DATA_DIR / "megatron"
MIXTRAL = DATA / "mixtral-8x7b-h100x16.log"


def _lines() -> list[bytes]:
    return MIXTRAL.read_bytes().splitlines(keepends=True)


def test_real_sample_every_field() -> None:
    s = parse_log(MIXTRAL.open("rb"))
    it = s.iterations
    assert it.iteration.tolist() == [71, 72, 73]
    assert it.train_iters.tolist() == [100, 100, 100]
    assert it.consumed_samples.tolist() == [9088, 9216, 9344]
    assert it.elapsed_ms.tolist() == [5361.6, 5470.7, 5829.9]
    assert it.tflops_reported.tolist() == [243.6, 238.7, 224.0]
    assert it.global_batch_size.tolist() == [128, 128, 128]
    assert it.lm_loss.tolist() == [1.818812, 1.820313, 1.798953]
    assert it.grad_norm.tolist() == [1.300, 1.305, 1.539]
    assert it.loss_scale.tolist() == [1.0, 1.0, 1.0]
    assert it.skipped_iters.tolist() == [0, 0, 0] and it.nan_iters.tolist() == [0, 0, 0]
    # 2024-04-06 03:02:12 read as UTC: days since 1970 from the calendar, not from a library.
    days = (2024 - 1970) * 365 + sum(1 for y in range(1970, 2024) if y % 4 == 0) + 31 + 29 + 31 + 5
    assert it.time_s[0] == days * 86400 + 3 * 3600 + 2 * 60 + 12
    assert np.diff(it.time_s).tolist() == [6.0, 6.0]
    assert s.n_rejected == 0 and s.restarts == 0 and s.args is None
    assert it.offset.tolist() == [0, len(_lines()[0]), len(_lines()[0]) + len(_lines()[1])]


@pytest.mark.parametrize("chunk", [1, 7, 100, 4096])
def test_any_chunking_gives_the_same_records(chunk: int) -> None:
    data = MIXTRAL.read_bytes()
    p = LogParser()
    for k in range(0, len(data), chunk):
        p.feed(data[k:k + chunk])
    s = p.close()
    ref = parse_log(io.BytesIO(data))
    for col in ("iteration", "elapsed_ms", "time_s", "tflops_reported", "offset"):
        assert getattr(s.iterations, col).tolist() == getattr(ref.iterations, col).tolist()


def test_str_lines_without_newlines() -> None:
    text = MIXTRAL.read_text()
    s = parse_log(text.splitlines())
    assert s.iterations.iteration.tolist() == [71, 72, 73]


def test_summary_while_tailing_leaves_out_the_unfinished_line() -> None:
    lines = _lines()
    p = LogParser()
    p.feed(lines[0] + lines[1][:50])
    assert p.summary().iterations.iteration.tolist() == [71]
    p.feed(lines[1][50:])
    assert p.summary().iterations.iteration.tolist() == [71, 72]
    p.feed(lines[2].rstrip(b"\n"))  # no newline yet: only close() may take it
    assert len(p.summary().iterations) == 2
    assert p.close().iterations.iteration.tolist() == [71, 72, 73]


def test_srun_label_prefix_and_crlf() -> None:
    data = b"".join(b"15: " + ln.rstrip(b"\n") + b"\r\n" for ln in _lines())
    s = parse_log(io.BytesIO(data))
    assert s.iterations.iteration.tolist() == [71, 72, 73]
    assert s.iterations.tflops_reported.tolist() == [243.6, 238.7, 224.0]


def test_timestamp_shapes() -> None:
    base = parse_timestamp(b"2024-04-06 03:02:12")
    assert base is not None
    assert parse_timestamp(b"2024-04-06 03:02:12.250000") == base + 0.25
    assert parse_timestamp(b"2024-04-06T03:02:12") == base
    for bad in (b"2024-13-06 03:02:12", b"2024-04-06 25:02:12", b"2024-04-06 03:02",
                b"2024/04/06 03:02:12", b"2024-04-06 03:02:12,5", b"2024-02-30 03:02:12",
                b"2024-04-06 03:-1:12", b"2024-04-06  3:02:12", b"2024-04-06 03:02:61",
                b"+024-04-06 03:02:12", b"2024-04-06 03:02:12.", b"2024-04-06 03:02:12.5x"):
        assert parse_timestamp(bad) is None, bad
