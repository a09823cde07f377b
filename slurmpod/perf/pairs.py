"""Does the model order published layouts as they ran? Pairs of published runs of one model on
the same GPUs and count, in the same precision, whose layouts differ (most often a recipe that
NVIDIA changed between releases): the model's verdict on which is faster against the published
one (docs/perf-model.md, "Ordering published layouts"). What the search needs of the model is
this order more than each row's error.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import combinations

from slurmpod.megatron.runspec import ModelConfig
from slurmpod.perf.calibrate import Point, Result

# Published runs whose time per token differs by less than this are a tie: the releases'
# other changes (kernels, libraries) move rows by as much.
TIE = 0.05


@dataclass(frozen=True, slots=True)
class Pair:
    faster: Point  # the one that ran faster
    slower: Point
    published_ratio: float  # slower / faster, seconds per token, published (> 1 + TIE)
    predicted_ratio: float  # the same order, predicted (> 1: the model agrees)

    @property
    def agrees(self) -> bool:
        return self.predicted_ratio > 1.0

    @property
    def config_gap(self) -> bool:
        """Either row's time is decided by what its source does not publish (`config_gap`)."""
        return bool(self.faster.raw.get("config_gap") or self.slower.raw.get("config_gap"))


def _layout(c: ModelConfig) -> tuple[object, ...]:
    """What the search chooses: the parallel layout, micro-batch and recompute."""
    return (c.tp, c.cp, c.pp, c.vpp, c.ep, c.etp, c.micro_batch_size, c.recompute_granularity,
            tuple(c.recompute_modules or ()), c.pipeline_layout)


def _run_kind(p: Point) -> tuple[object, ...]:
    """Runs comparable by layout: one model, system, GPU count and precision. The table marks
    MXFP8 rows by id only (precision `fp8`, both taken at the FP8 peak), so an MXFP8 row is not
    paired with an FP8 current-scaling row of the same layout, whose gap the model does not see.
    A row of a benchmark harness of its own (`series`: MLPerf's submissions, their own software
    branch and FP8 recipe) is paired only within that series."""
    return (p.raw["model"], p.system, p.gpus, p.precision, "mxfp8" in p.id,
            p.raw.get("series", ""))


def layout_pairs(results: Sequence[Result]) -> list[Pair]:
    """Every pair of timed rows of the same kind with different layouts whose published time
    per token differs by more than TIE, faster first."""
    groups: dict[tuple[object, ...], list[Result]] = defaultdict(list)
    for r in results:
        if r.point.config is not None and r.point.published_s:
            groups[_run_kind(r.point)].append(r)
    out: list[Pair] = []
    for rows in groups.values():
        for a, b in combinations(rows, 2):
            ca, cb = a.point.config, b.point.config
            assert ca is not None and cb is not None and a.point.published_s \
                and b.point.published_s
            if _layout(ca) == _layout(cb):
                continue
            per_a = (ca.global_batch_size or 1) * ca.seq_length  # every timed row sets it
            per_b = (cb.global_batch_size or 1) * cb.seq_length
            pub = (b.point.published_s / per_b) / (a.point.published_s / per_a)
            pred = (b.predicted_s / per_b) / (a.predicted_s / per_a)
            if abs(pub - 1) <= TIE:
                continue
            if pub > 1:
                out.append(Pair(a.point, b.point, pub, pred))
            else:
                out.append(Pair(b.point, a.point, 1 / pub, 1 / pred))
    return out
