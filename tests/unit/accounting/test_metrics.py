"""Job metrics against hand derivations (round numbers chosen so the arithmetic is visible)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from slurmpod.accounting.logparse import parse_log, parse_timestamp
from slurmpod.accounting.metrics import job_metrics
from tests.helpers import DATA_DIR

DATA = DATA_DIR / "megatron"

DUMP = [
    "------------------------ arguments ------------------------",
    "  global_batch_size ............................... 64",
    "  log_interval .................................... 5",
    "-------------------- end of arguments ---------------------",
]


def _line(i: int, ms: float, t: str | None = None, gbs: int = 64, n: int = 40) -> str:
    ts = f" [{t}]" if t else ""
    return (f"{ts} iteration {i:8d}/{n:8d} | consumed samples: {i * gbs:12d} | elapsed time per "
            f"iteration (ms): {ms:.1f} | learning rate: 1.000000E-04 | global batch size: "
            f"{gbs:5d} | lm loss: 2.000000E+00 | loss scale: 1.0 | number of skipped iterations: "
            "  0 | number of nan iterations:   0 |")


def _flops(gbs: int) -> float:
    return gbs * 2e13  # 64 sequences -> 1.28e15 FLOPs per iteration


def test_per_record_numbers() -> None:
    # 64 x 1024 tokens in 1.6 s = 40960 tokens/s; 1.28e15 FLOPs / (1.6 s x 8 GPUs) = 100 TFLOP/s
    # per GPU; against a 400 TFLOP/s peak that is 25 % MFU.
    s = parse_log([*DUMP, _line(5, 3200.0), _line(10, 1600.0), _line(15, 1600.0)])
    m = job_metrics(s, _flops, 400.0, 8, seq_length=1024)
    sr = m.series
    assert sr.tokens_per_s[1] == pytest.approx(40960.0)
    assert sr.tflops_per_gpu[1] == pytest.approx(100.0)
    assert sr.mfu[1] == pytest.approx(0.25)
    assert sr.tflops_per_gpu[0] == pytest.approx(50.0)
    assert m.flops_per_iteration == pytest.approx(1.28e15)
    assert m.peak_tflops == 400.0 and m.flops_formula == "injected"
    assert sr.iters_covered.tolist() == [5, 5, 5]  # 0 -> 5 -> 10 -> 15 (a fresh first launch)


def test_warm_up_rule_and_steady_statistics() -> None:
    # Launch seen (dump): records covering iterations 1..10 (warmup_iters=10) are left out,
    # i.e. iterations 5 and 10; 15..40 are steady.
    times = [3000.0, 2000.0, 1000.0, 1100.0, 1200.0, 1300.0, 1400.0, 1500.0]
    s = parse_log([*DUMP, *(_line(5 * (k + 1), ms) for k, ms in enumerate(times))])
    m = job_metrics(s, _flops, 400.0, 8, seq_length=1024)
    assert m.series.steady.tolist() == [False, False] + [True] * 6
    st = m.iter_time_ms
    assert st is not None and st.n == 6
    assert st.median == pytest.approx(1250.0)  # (1200 + 1300) / 2
    # p10 with linear interpolation over 6 sorted values: position 0.5 -> 1050; p90: 4.5 -> 1450.
    assert st.p10 == pytest.approx(1050.0) and st.p90 == pytest.approx(1450.0)
    assert m.mfu is not None and m.mfu.median == pytest.approx(np.median(
        [1.28e15 / (t / 1000 * 8) / 1e12 / 400 for t in times[2:]]))
    assert not m.steady_fallback


def test_warm_up_falls_back_to_all_records_when_nothing_is_left() -> None:
    s = parse_log([*DUMP, _line(5, 3000.0), _line(10, 2000.0)])
    m = job_metrics(s, _flops, 400.0, 8, seq_length=1024)
    assert m.steady_fallback and m.iter_time_ms is not None and m.iter_time_ms.n == 2


def test_log_fragment_has_no_warm_up_to_drop() -> None:
    s = parse_log((DATA / "mixtral-8x7b-h100x16.log").open("rb"))
    m = job_metrics(s, None, 989.0, 16, seq_length=2048)
    assert m.series.steady.all()
    assert m.iter_time_ms is not None and m.iter_time_ms.median == 5470.7
    assert m.tflops_reported is not None and m.tflops_reported.median == 238.7
    assert m.mfu is None and m.reported_ratio is None  # no FLOPs model given


def test_restart_lost_work_goodput_and_stalls() -> None:
    """megatron-2024-restart.log, derived by hand from its lines:

    launch 1 (from scratch, log interval 2): iteration 2 at 2500 ms/iter, 4..24 at 1500 ms;
    saves at 10 and 20 (timer 3 s each); killed after 24. Launch 2 loads 20: iterations 21..24
    are redone, so records 22 and 24 of launch 1 (2 iterations each) are lost: 4 x 1.5 s = 6 s.
    Productive: launch 1: 2 x 2.5 + 11 x 2 x 1.5 - 6 = 32 s; launch 2: (22 - 20) x 2.5 +
    9 x 2 x 1.5 = 32 s; 64 s in all. Wall: launch 1 starts at 08:00:20 - 20 s (time to
    initialize) = 08:00:00, the log ends at 08:04:03: 243 s.
    """
    s = parse_log((DATA / "megatron-2024-restart.log").open("rb"))
    m = job_metrics(s, _flops, 400.0, 8, seq_length=2048)
    assert m.restarts == 1
    assert m.series.lost_iters.tolist() == [0] * 10 + [2, 2] + [0] * 10
    assert m.lost_iters == 4 and m.lost_s == pytest.approx(6.0)
    assert m.productive_s == pytest.approx(64.0)
    assert m.wall_s == pytest.approx(243.0)
    assert m.allocated_gpu_s == pytest.approx(243.0 * 8)
    assert m.goodput == pytest.approx(64.0 / 243.0)
    assert [(c.iteration, c.duration_s, c.source) for c in m.checkpoint_stalls] == [
        (10, 3.0, "timer"), (20, 3.0, "timer"), (30, 3.0, "timer"), (40, 3.0, "timer")]
    assert m.checkpoint_stall_s == pytest.approx(12.0)
    # First iteration line at 08:00:35, 35 s after Megatron's process start.
    assert m.time_to_first_iteration_s == pytest.approx(35.0)
    assert m.time_to_first_iteration_ref == "megatron_launch"
    seg = {s.index: (s.resumed_from, s.lost_iters) for s in m.segments}
    assert seg == {0: (0, 4), 1: (20, 0)}


def test_goodput_with_slurm_allocation() -> None:
    s = parse_log((DATA / "megatron-2024-restart.log").open("rb"))
    start = parse_timestamp(b"2024-05-10 07:59:00")
    assert start is not None
    m = job_metrics(s, _flops, 400.0, 8, seq_length=2048, job_start_s=start,
                    allocated_gpu_s=8 * 400.0)
    assert m.goodput == pytest.approx(64.0 * 8 / (8 * 400.0))
    assert m.time_to_first_iteration_s == pytest.approx(95.0)  # 07:59:00 -> 08:00:35
    assert m.time_to_first_iteration_ref == "job_start"


def test_checkpoint_stall_from_the_gap_between_timestamped_lines() -> None:
    # 2024 layout: save lines carry no time, no timer line. Iteration 20 is logged 15 s after
    # iteration 15 although 5 iterations take 5 x 1 s: the save held training up 10 s.
    lines = [
        *DUMP,
        _line(15, 1000.0, "2024-05-10 08:00:00"),
        "saving checkpoint at iteration      15 to /ckpt in torch format",
        "  successfully saved checkpoint at iteration      15 to /ckpt",
        _line(20, 1000.0, "2024-05-10 08:00:15"),
    ]
    m = job_metrics(parse_log(lines), _flops, 400.0, 8, seq_length=1024)
    assert [(c.iteration, c.duration_s, c.source) for c in m.checkpoint_stalls] == [
        (15, 10.0, "gap")]


def test_batch_size_ramp_up_uses_each_records_batch() -> None:
    s = parse_log([*DUMP, _line(5, 1000.0, gbs=32), _line(10, 1000.0, gbs=64)])
    m = job_metrics(s, _flops, 400.0, 8, seq_length=1024)
    assert m.series.tflops_per_gpu.tolist() == pytest.approx([80.0, 160.0])
    assert m.series.tokens_per_s.tolist() == pytest.approx([32768.0, 65536.0])


def test_json_has_no_nan_and_headline_is_small() -> None:
    s = parse_log((DATA / "megatron-2023-no-timestamp.log").open("rb"))
    m = job_metrics(s, _flops, 400.0, 16, seq_length=4096)
    doc = m.to_json(series=True)
    text = json.dumps(doc, allow_nan=False)
    assert doc["series"]["iteration"] == [10, 20, 30, 40, 50]
    assert doc["series"]["time_s"] == [None] * 5  # the 2023 layout has no timestamps
    assert doc["tflops_reported"] is None and doc["schema"] == "slurmpod.mfu/1"
    head = m.headline()
    assert set(head) == {"v", "mfu", "tflops", "iter", "tokens_per_s", "peak", "formula",
                         "goodput"}
    assert len(json.dumps(head)) < 200 and len(text) > len(json.dumps(head))
    assert head["iter"] == 50 and not math.isnan(head["mfu"])


def test_bad_arguments() -> None:
    s = parse_log(DUMP)
    with pytest.raises(ValueError):
        job_metrics(s, _flops, 400.0, 0, seq_length=1024)
    with pytest.raises(ValueError):
        job_metrics(s, _flops, 0.0, 8, seq_length=1024)
    empty = job_metrics(s, _flops, 400.0, 8, seq_length=1024)
    assert empty.n_records == 0 and empty.mfu is None and empty.goodput is None
