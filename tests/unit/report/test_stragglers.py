"""Stragglers from Megatron's per-rank timers (slurmpod/report/stragglers.py).

The timers are built directly as `RankTimers`, in the shape the log parser gives for Megatron's
blocks (megatron/core/timers.py): `--timing-log-option all` -> per_rank {timer: {rank: ms}},
`minmax`/`max` -> min_max {timer: (min or None, max)}. Layouts follow Megatron's rank orders:
'tp-cp-ep-dp-pp' (pp outermost, the default) and 'tp-pp-dp' (--use-tp-pp-dp-mapping)."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest

from slurmpod.accounting.logrecords import RankTimers
from slurmpod.report.stragglers import (
    MIN_STAGE_RANKS,
    STRAGGLER_CAP,
    STRAGGLER_RATIO,
    find_stragglers,
)

FWD, BWD = 100.0, 200.0  # a healthy rank's mean ms per iteration


def all_ranks(compute: dict[int, float], *, extra: dict[str, dict[int, float]] | None = None
              ) -> RankTimers:
    """`--timing-log-level 2 --timing-log-option all`: each rank's compute split 1:2 between
    forward and backward, as a real step roughly is, plus forward-backward (the whole step,
    waits included: equal on every rank, which is what makes it useless here)."""
    step = max(compute.values()) * 1.2
    per_rank: dict[str, dict[int, float]] = {
        "forward-backward": {r: step for r in compute},
        "forward-compute": {r: c / 3 for r, c in compute.items()},
        "backward-compute": {r: 2 * c / 3 for r, c in compute.items()},
        "all-grads-sync": {r: 5.0 for r in compute},
        "optimizer": {r: 4.0 for r in compute},
    }
    per_rank.update(extra or {})
    return RankTimers("all", 9, per_rank, {})


def healthy(world: int) -> dict[int, float]:
    # a few per cent of jitter, as healthy GPUs of one stage show
    return {r: (FWD + BWD) * (1 + 0.01 * (r % 5)) for r in range(world)}


def ranks_of(finding) -> list[int]:
    return sorted(s.rank for s in finding.stragglers)


NODES4 = ["gpu-001", "gpu-002", "gpu-003", "gpu-004"]


# -- pipeline stages ---------------------------------------------------------------------------

def test_default_order_slow_only_against_its_own_stage_and_loss_stage_not_flagged() -> None:
    # world 32, TP 2, PP 2, DP 8, default order: stage = rank // 16. The last stage holds the
    # loss and is uniformly 30 % slower; ranks 4-5 (one TP group of stage 0) run 25 % slow.
    compute = healthy(32)
    for r in range(16, 32):
        compute[r] *= 1.30
    compute[4] *= 1.22
    compute[5] *= 1.22
    # Against all ranks the slow TP group would not stand out: the loss stage is slower still.
    assert compute[4] < min(compute[r] for r in range(16, 32))
    f = find_stragglers(all_ranks(compute), {"tensor_model_parallel_size": 2,
                                             "pipeline_model_parallel_size": 2}, world=32)
    assert f is not None
    assert ranks_of(f) == [4, 5]
    assert {s.stage for s in f.stragglers} == {0}
    assert f.ranks_judged == 32
    assert f.pipeline_stages == 2
    assert f.timer == "forward-compute + backward-compute"
    assert all(s.ratio >= STRAGGLER_RATIO for s in f.stragglers)
    assert f.max_ratio == pytest.approx(max(s.ratio for s in f.stragglers))


def test_uniformly_slower_last_stage_alone_is_no_finding() -> None:
    compute = healthy(32)
    for r in range(16, 32):
        compute[r] *= 1.40
    assert find_stragglers(all_ranks(compute), {"pipeline_model_parallel_size": 2},
                           world=32) is None


def test_tp_pp_dp_order_groups_by_rank_over_tp_mod_pp() -> None:
    # world 16, TP 2, PP 2, DP 4 with --use-tp-pp-dp-mapping: stage = (rank // 2) % 2, so
    # stage 1 is ranks 2, 3, 6, 7, 10, 11, 14, 15 (the loss stage, here 60 % slower).
    compute = healthy(16)
    stage1 = [2, 3, 6, 7, 10, 11, 14, 15]
    for r in stage1:
        compute[r] *= 1.60
    compute[6] *= 1.25
    args = {"tensor_model_parallel_size": 2, "pipeline_model_parallel_size": 2,
            "use_tp_pp_dp_mapping": True}
    f = find_stragglers(all_ranks(compute), args, world=16)
    assert f is not None
    assert ranks_of(f) == [6]
    assert f.stragglers[0].stage == 1
    # Read in the default order, the same timers mix the two stages and blame the loss stage.
    g = find_stragglers(all_ranks(compute), {**args, "use_tp_pp_dp_mapping": False}, world=16)
    assert g is not None
    assert {2, 3, 7} <= set(ranks_of(g))


def test_stage_with_too_few_ranks_is_not_judged() -> None:
    # world 8, PP 4: two ranks per stage, no majority to say what normal is.
    compute = healthy(8)
    compute[3] *= 2.0
    assert MIN_STAGE_RANKS > 2
    assert find_stragglers(all_ranks(compute), {"pipeline_model_parallel_size": 4},
                           world=8) is None


def test_no_straggler_below_the_ratio() -> None:
    compute = healthy(16)
    compute[9] *= 1.10
    assert find_stragglers(all_ranks(compute), {}, world=16) is None
    # the same rank is one at a lower threshold
    f = find_stragglers(all_ranks(compute), {}, world=16, ratio=1.05)
    assert f is not None and ranks_of(f) == [9]
    assert f.threshold == 1.05


# -- nodes and the phrase ----------------------------------------------------------------------

def test_node_mapping_and_range_phrase() -> None:
    compute = {r: FWD + BWD for r in range(32)}
    for r in range(16, 24):
        compute[r] *= 1.32
    f = find_stragglers(all_ranks(compute), {"tensor_model_parallel_size": 8}, world=32,
                        nodes=NODES4, tasks_per_node=8)
    assert f is not None
    assert {s.node for s in f.stragglers} == {"gpu-003"}
    assert sorted(s.local_rank or 0 for s in f.stragglers) == list(range(8))
    assert all(s.local_rank is not None for s in f.stragglers)
    assert f.phrase() == ("node gpu-003 (ranks 16-23) ran forward + backward compute at 1.32x "
                          "the median rank's")


def test_phrase_with_pipeline_stages_and_several_nodes_worst_first() -> None:
    compute = healthy(32)
    for r in (8, 9, 10, 11, 13):  # gpu-002: ranks 8-11 and 13
        compute[r] *= 1.20
    compute[30] *= 1.50  # gpu-004, stage 1
    f = find_stragglers(all_ranks(compute), {"pipeline_model_parallel_size": 2}, world=32,
                        nodes=NODES4)
    assert f is not None
    text = f.phrase()
    assert text.startswith("node gpu-004 (rank 30) ran forward + backward compute at ")
    assert "x its pipeline stage's median, node gpu-002 (ranks 8-11, 13) at 1.2" in text
    assert f.stragglers[0].rank == 30


def test_nodes_that_do_not_cover_the_world_name_no_node() -> None:
    compute = healthy(32)
    for r in (16, 17, 18):
        compute[r] *= 1.5
    f = find_stragglers(all_ranks(compute), {}, world=32, nodes=NODES4[:3], tasks_per_node=8)
    assert f is not None
    assert all(s.node is None and s.local_rank is None for s in f.stragglers)
    assert f.phrase().startswith("ranks 16-18 ran forward + backward compute at 1.")
    # a bare string is not a node list, nor is a non-positive task count
    for nodes, tpn in (("gpu-001gpu-002gpu-003gpu-004", 8), (NODES4, 0), (NODES4, True)):
        g = find_stragglers(all_ranks(compute), {}, world=32, nodes=nodes, tasks_per_node=tpn)
        assert g is not None and all(s.node is None for s in g.stragglers)


def test_list_is_capped_worst_first_and_counted() -> None:
    world = 128
    compute = healthy(world)
    slow = list(range(40, 80))
    for k, r in enumerate(slow):
        compute[r] *= 1.2 + 0.01 * k  # rank 79 the worst
    f = find_stragglers(all_ranks(compute), {}, world=world,
                        nodes=[f"n{i:02d}" for i in range(16)])
    assert f is not None
    assert f.count == len(slow)
    assert len(f.stragglers) == STRAGGLER_CAP
    ratios = [s.ratio for s in f.stragglers]
    assert ratios == sorted(ratios, reverse=True)
    assert f.stragglers[0].rank == 79
    assert f.phrase().endswith(f"{len(slow) - 16} more ranks above {STRAGGLER_RATIO:.2f}x")
    doc = json.loads(json.dumps(f.to_json()))
    assert doc["count"] == 40 and len(doc["stragglers"]) == STRAGGLER_CAP
    assert doc["stragglers"][0]["rank"] == 79 and doc["stragglers"][0]["node"] == "n09"


# -- min/max blocks ----------------------------------------------------------------------------

def minmax(fwd: tuple[float | None, float], bwd: tuple[float | None, float],
           option: str = "minmax") -> RankTimers:
    return RankTimers(option, 9, {}, {"forward-backward": (320.0, 330.0),
                                      "forward-compute": fwd, "backward-compute": bwd})


def test_minmax_spread_with_one_stage() -> None:
    f = find_stragglers(minmax((100.0, 104.0), (200.0, 282.0)), {}, world=64)
    assert f is not None
    assert f.stragglers == () and f.ranks_judged == 0
    assert f.timer == "backward-compute"
    assert f.max_ratio == pytest.approx(1.41)
    assert f.phrase() == ("the slowest rank's backward compute ran 1.41x the fastest's "
                          "(rerun with --timing-log-option all to name it)")
    assert json.loads(json.dumps(f.to_json()))["stragglers"] == []


def test_minmax_none_with_pipeline_stages_small_spread_or_max_only() -> None:
    wide = minmax((100.0, 104.0), (200.0, 282.0))
    assert find_stragglers(wide, {"pipeline_model_parallel_size": 2}, world=64) is None
    assert find_stragglers(minmax((100.0, 104.0), (200.0, 210.0)), {}, world=64) is None
    assert find_stragglers(minmax((None, 104.0), (None, 282.0), "max"), {}, world=64) is None


# -- level 1 and hostile input ------------------------------------------------------------------

def test_level_one_timers_name_nobody() -> None:
    # `--timing-log-level 1`: forward-backward (waits included), grads sync, optimizer only.
    per_rank = {"forward-backward": {r: 300.0 for r in range(16)},
                "all-grads-sync": {r: 5.0 for r in range(16)},
                "params-all-gather": {r: 3.0 for r in range(16)},
                "optimizer": {r: 4.0 for r in range(16)}}
    per_rank["forward-backward"][5] = 600.0
    assert find_stragglers(RankTimers("all", 9, per_rank, {}), {}, world=16) is None
    mm = RankTimers("minmax", 9, {}, {"forward-backward": (300.0, 600.0)})
    assert find_stragglers(mm, {}, world=16) is None


def test_hostile_values_are_ignored() -> None:
    compute = healthy(16)
    compute[3] *= 1.3  # the one real straggler
    # (a bool key cannot be told from 1 in a dict, so bools are tried as values below)
    bad: dict = {10**9: 1e9, -1: 1e9, "7": 1e9, 16: 1e9, 2.5: 1e9, None: 1e9}
    t = all_ranks(compute)
    fwd = dict(t.per_rank["forward-compute"]) | bad
    bwd = dict(t.per_rank["backward-compute"]) | bad
    fwd[5], bwd[5] = math.nan, 1e9
    fwd[6], bwd[6] = -50.0, 1e9
    fwd[7], bwd[7] = math.inf, 1e9
    fwd[8], bwd[8] = "900", 1e9
    fwd[9], bwd[9] = False, 1e9
    fwd[10], bwd[10] = 0.0, 1e9
    del bwd[11]  # a rank with forward only
    fwd[11] = 1e9
    hostile = RankTimers("all", 9, {"forward-compute": fwd, "backward-compute": bwd}, {})
    f = find_stragglers(hostile, {}, world=16)
    assert f is not None
    assert ranks_of(f) == [3]
    assert f.ranks_judged == 16 - 7  # ranks 5-11 dropped
    # only hostile values slow: nothing to find
    compute[3] /= 1.3
    t2 = all_ranks(compute)
    only_bad = RankTimers("all", 9, {
        "forward-compute": {**t2.per_rank["forward-compute"], 5: math.nan, 10**9: 1e9},
        "backward-compute": {**t2.per_rank["backward-compute"], 5: 1e9, 10**9: 1e9}}, {})
    assert find_stragglers(only_bad, {}, world=16) is None


@pytest.mark.parametrize("args", [
    {"tensor_model_parallel_size": "2"},
    {"pipeline_model_parallel_size": True},
    {"pipeline_model_parallel_size": 0},
    {"pipeline_model_parallel_size": 2.0},
    {"use_tp_pp_dp_mapping": "yes"},
    {"tensor_model_parallel_size": 3},  # does not divide 16
    None,
    ["tensor_model_parallel_size", 2],
])
def test_bad_args_give_none(args) -> None:
    compute = healthy(16)
    compute[3] *= 1.5
    assert find_stragglers(all_ranks(compute), args, world=16) is None


@pytest.mark.parametrize("world", [0, -8, True, 16.0, "16"])
def test_bad_world_gives_none(world) -> None:
    compute = healthy(16)
    compute[3] *= 1.5
    assert find_stragglers(all_ranks(compute), {}, world=world) is None


def test_bad_containers_and_ratio_give_none() -> None:
    compute = healthy(16)
    compute[3] *= 1.5
    assert find_stragglers(None, {}, world=16) is None
    for ratio in (math.nan, math.inf, 1.0, 0.5, True):
        assert find_stragglers(all_ranks(compute), {}, world=16, ratio=ratio) is None
    # shapes the parser would never give, as a forged spool record or a later bug might
    a_list: Any = [1, 2]
    a_str: Any = "forward-compute"
    pairs: Any = {"forward-compute": "(1, 2)", "backward-compute": (1.0, 2.0, 3.0)}
    odd = [RankTimers("all", 9, {"forward-compute": a_list, "backward-compute": {}}, {}),
           RankTimers("all", 9, a_str, {}),
           RankTimers("bogus", 9, all_ranks(compute).per_rank, {}),
           RankTimers("minmax", 9, {}, pairs),
           RankTimers("minmax", 9, {}, {"forward-compute": (0.0, 500.0),
                                        "backward-compute": (-1.0, math.nan)})]
    for t in odd:
        assert find_stragglers(t, {}, world=16) is None
