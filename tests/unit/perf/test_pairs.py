"""slurmpod.perf.pairs: which pairs of published runs are compared, and how."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from slurmpod.perf.calibrate import Point, Result, load_published
from slurmpod.perf.pairs import layout_pairs

DATA = Path(__file__).resolve().parents[2] / "data" / "perf"
POINTS = {p.id: p for p in load_published(DATA / "published.toml")}
# Qwen3-30B-A3B MXFP8 on 8 B200: 26.02's preset at MBS 1 (27.05 s), 26.04.01's at MBS 4 (9.66 s).
SLOW, FAST = POINTS["bridge2602-b200-qwen3-30b-mxfp8"], POINTS["bridge2604-b200-qwen3-30b-mxfp8"]


def _result(p: Point, predicted_s: float) -> Result:
    assert p.published_s is not None
    return Result(p, predicted_s, predicted_s / p.published_s - 1)


def test_the_faster_run_comes_first_and_the_model_is_asked_its_order() -> None:
    [pair] = layout_pairs([_result(SLOW, 20.0), _result(FAST, 10.0)])
    assert (pair.faster.id, pair.slower.id) == (FAST.id, SLOW.id)
    assert pair.published_ratio > 2.5 and pair.predicted_ratio == 2.0 and pair.agrees
    [wrong] = layout_pairs([_result(SLOW, 10.0), _result(FAST, 20.0)])
    assert not wrong.agrees and wrong.predicted_ratio == 0.5


def test_ties_the_same_layout_and_other_kinds_are_not_pairs() -> None:
    assert SLOW.published_s is not None and SLOW.config is not None
    tie = dataclasses.replace(FAST, published_s=SLOW.published_s * 1.04)
    assert layout_pairs([_result(SLOW, 20.0), _result(tie, 10.0)]) == []
    same = dataclasses.replace(FAST, config=SLOW.config)
    assert layout_pairs([_result(SLOW, 20.0), _result(same, 10.0)]) == []
    other_gpu = dataclasses.replace(FAST, gpus=16)
    assert layout_pairs([_result(SLOW, 20.0), _result(other_gpu, 10.0)]) == []
    fp8_cs = dataclasses.replace(FAST, id="bridge2604-b200-qwen3-30b-fp8")
    assert layout_pairs([_result(SLOW, 20.0), _result(fp8_cs, 10.0)]) == []
    # A row of another series (MLPerf's harness) pairs only within it.
    mlperf = dataclasses.replace(FAST, raw={**FAST.raw, "series": "mlperf"})
    assert layout_pairs([_result(SLOW, 20.0), _result(mlperf, 10.0)]) == []
    both = dataclasses.replace(SLOW, raw={**SLOW.raw, "series": "mlperf"})
    assert len(layout_pairs([_result(both, 20.0), _result(mlperf, 10.0)])) == 1


def test_time_is_compared_per_token() -> None:
    """Two runs of different global batches: per token, not per step."""
    assert FAST.config is not None and FAST.published_s is not None
    double = dataclasses.replace(
        FAST, config=dataclasses.replace(FAST.config, global_batch_size=2 *
                                         (FAST.config.global_batch_size or 1)),
        published_s=2 * FAST.published_s)
    [pair] = layout_pairs([_result(SLOW, 20.0), _result(double, 20.0)])
    assert pair.faster.id == FAST.id and pair.predicted_ratio == 2.0
