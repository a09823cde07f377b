"""The performance model against published iteration times (tests/data/perf/published.toml).

The table is the test: every point names its source, config and any assumption. Calibration
rows refit to the constants in slurmpod.perf.model.FITTED; the validation rows' errors are the
model's accuracy, and tests/data/perf/validation.md (written by benchmarks/plan_search.py
--write) must show the current figures.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from slurmpod.perf.calibrate import (
    error_stats,
    evaluate,
    fit_generation,
    load_published,
    markdown_table,
)
from slurmpod.perf.model import FITTED

DATA = Path(__file__).resolve().parents[1] / "data" / "perf"
POINTS = load_published(DATA / "published.toml")
RESULTS = evaluate(POINTS)
STATS = error_stats(RESULTS)


def test_every_point_names_its_source_and_the_roles_are_valid() -> None:
    import tomllib

    table = tomllib.loads((DATA / "published.toml").read_text(encoding="utf-8"))
    for p in POINTS:
        assert p.source in table["sources"] and table["sources"][p.source]["url"]
        assert p.role in ("calibration", "validation", "excluded")
        if p.role == "excluded":
            assert p.raw["reason"]
        else:
            assert p.published_s and p.published_s > 0
    assert len({p.id for p in POINTS}) == len(POINTS)


def test_at_most_two_calibration_points_per_generation() -> None:
    per = Counter(p.generation for p in POINTS if p.role == "calibration")
    assert per and max(per.values()) <= 2


@pytest.mark.parametrize("generation", ["ampere", "hopper", "blackwell"])
def test_fitted_factors_are_what_the_calibration_rows_give(generation: str) -> None:
    got = fit_generation(POINTS, generation)
    assert got.gemm == pytest.approx(FITTED[generation].gemm, abs=2e-3)
    assert got.fp8 == pytest.approx(FITTED[generation].fp8, abs=2e-3)


def test_dense_rows_meet_the_accuracy_target() -> None:
    assert STATS["dense_n"] >= 20
    assert STATS["dense_median"] <= 0.10
    assert STATS["dense_max"] <= 0.25


@pytest.mark.xfail(strict=True, reason="MoE rows miss the target (median ~26 %, max ~113 %): "
                   "fine-grained experts (Qwen3-30B), GPT-OSS and EP all-to-all across nodes "
                   "(DeepSeek-V3 on H100) are not yet modelled well; see docs/perf-model.md")
def test_moe_rows_meet_the_accuracy_target() -> None:
    assert STATS["moe_median"] <= 0.10 and STATS["moe_max"] <= 0.25


def test_the_written_table_is_current() -> None:
    text = (DATA / "validation.md").read_text(encoding="utf-8")
    assert markdown_table(POINTS, RESULTS) in text
