"""The performance model against published iteration times (tests/data/perf/published.toml).

The table is the test: every point names its source, config and any assumption. Calibration
rows refit to the constants in slurmpod.perf.fitted.FITTED; the validation rows' errors are the
model's accuracy, and tests/data/perf/validation.md (written by benchmarks/plan_search.py
--write) must show the current figures.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from pathlib import Path

import pytest

from slurmpod.megatron.memory import peak_memory
from slurmpod.megatron.validate import SiteShape, layout_errors
from slurmpod.perf.calibrate import (
    error_stats,
    evaluate,
    fit_generation,
    fit_host_forward,
    load_published,
    markdown_table,
    track_runs,
    usable_bytes,
)
from slurmpod.perf.fitted import FITTED, HOST_FORWARD_FITTED_ON, MOE_FP8_HOST_FORWARD_S
from slurmpod.perf.track import TRACK_PATH, dumps

DATA = Path(__file__).resolve().parents[2] / "data" / "perf"
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


def test_the_readme_rows_convert_by_the_formula_their_release_printed() -> None:
    """Megatron-LM's README table (core r0.8.0) prints per-GPU TFLOP/s of
    num_floating_point_operations at that release: 12 B s l h^2 ((1 + groups/heads + s/h)
    + ffn/h + V/(2 l h)). 1.7B: 24 layers, h 2048, 16 heads, GBS 192, 48 GPUs at 408.8; the
    table's own aggregate, 19.6 PFLOP/s, gives the same iteration within its rounding."""
    from slurmpod.perf.calibrate import published_seconds

    p = next(x for x in POINTS if x.id == "megatron-readme-1_7b")
    flops = 12 * 192 * 4096 * 24 * 2048**2 * ((1 + 1 + 4096 / 2048) + 4 + 131072 / (2 * 24 * 2048))
    assert p.published_s == pytest.approx(flops / (408.8e12 * 48), rel=1e-9)
    assert p.published_s == pytest.approx(flops / 19.6e15, rel=5e-3)
    # The table's MFU (41 %) is against the catalog's dense BF16 peak: a BF16 run.
    assert p.hardware is not None and p.precision == "bf16"
    assert 408.8 / p.hardware.peak_bf16 == pytest.approx(0.41, abs=0.005)
    assert p.config is not None
    with pytest.raises(ValueError, match="tflops_formula"):
        published_seconds(dict(p.raw) | {"tflops_formula": "other"}, p.config)


def test_at_most_two_calibration_points_per_generation() -> None:
    per = Counter(p.generation for p in POINTS if p.role == "calibration")
    assert per and max(per.values()) <= 2


@pytest.mark.parametrize("generation", ["ampere", "hopper", "blackwell", "gb300"])
def test_fitted_factors_are_what_the_calibration_rows_give(generation: str) -> None:
    got = fit_generation(POINTS, generation)
    assert got.gemm == pytest.approx(FITTED[generation].gemm, abs=2e-3)
    assert got.fp8 == pytest.approx(FITTED[generation].fp8, abs=2e-3)


def test_the_host_forward_is_what_its_calibration_row_gives() -> None:
    """Fitted on Hopper's second calibration row (an FP8 MoE row without CUDA graphs) after
    Hopper's factor, which its dense row fixes; the B200 and GB200 rows validate it."""
    seconds, row = fit_host_forward(POINTS)
    assert row == HOST_FORWARD_FITTED_ON
    assert seconds == pytest.approx(MOE_FP8_HOST_FORWARD_S, rel=1e-3)
    assert fit_generation(POINTS, "hopper").fitted_on == FITTED["hopper"].fitted_on


def test_the_modelzoo_rows_are_the_step_times_it_prints() -> None:
    """Megatron-MoE-ModelZoo prints step time and per-GPU TFLOP/s: 19.7 s at 245 and, with
    the EP overlap, 17.6 s at 276. The step time is the row's time; the two TFLOP/s agree on
    one iteration's work within their rounding, so both rows were read from the same table."""
    plain = next(x for x in POINTS if x.id == "modelzoo-h100-qwen3-235b-ep32")
    overlap = next(x for x in POINTS if x.id == "modelzoo-h100-qwen3-235b-ep32-overlap")
    assert (plain.published_s, overlap.published_s) == (19.7, 17.6)
    assert 245 * plain.published_s == pytest.approx(276 * overlap.published_s, rel=0.01)


def test_dense_rows_meet_the_accuracy_target() -> None:
    assert STATS["dense_n"] >= 20
    assert STATS["dense_median"] <= 0.10
    assert STATS["dense_max"] <= 0.25


@pytest.mark.xfail(strict=True, reason="MoE rows miss the max target (median 8.1 %, max 57.7 % "
                   "over 85 rows): the Qwen3-30B-A3B rows of 25.11 and 26.02 are decided by their "
                   "presets' dropless alltoall dispatcher on x86 hosts (Megatron-Bridge issue "
                   "1998) and the GPT-OSS rows by what the model does not count, attention "
                   "alone unlikely (config_gap in the table); see docs/perf-model.md")
def test_moe_rows_meet_the_accuracy_target() -> None:
    assert STATS["moe_median"] <= 0.10 and STATS["moe_max"] <= 0.25


def test_the_error_does_not_grow_with_the_job_on_mlperf_gpt3() -> None:
    """MLPerf v3.1's GPT-3 175B, one software release on 512 to 10,752 H100 (128 down to 8
    micro-batches per data-parallel rank, data parallelism from 16 to 336): the error is the
    same at every size within 2 points, so what grows with the job (the interleaved bubble,
    the data-parallel collectives and their overlap) is counted as it ran; the offset is the
    release's, per GPU (docs/perf-model.md)."""
    errors = {r.point.gpus: r.error for r in RESULTS if r.point.source == "mlperf31"}
    assert sorted(errors) == [512, 768, 4096, 6144, 8192, 10240, 10752]
    assert max(errors.values()) - min(errors.values()) <= 0.02
    assert all(-0.16 < e < -0.12 for e in errors.values())


def test_all_moe_rows_meet_the_median_target() -> None:
    """8.1 % over 85 rows (8.4 % over the 47 before the Blackwell Ultra rows) since the flex
    dispatcher sends a token once to each GPU holding its experts inside an NVLink domain
    (10.2 % before, with Megatron-MoE-ModelZoo's three intra-node config_gap rows at -41, -22
    and +35 %)."""
    assert STATS["moe_n"] >= 84
    assert STATS["moe_median"] <= 0.10


def test_moe_rows_with_published_configuration_meet_the_accuracy_target() -> None:
    """Without the config_gap rows: 3.5 / 14.3 % over 56 rows (max Qwen3-30B-A3B on 8 GB200,
    25.11; Megatron-MoE-ModelZoo's two cross-node Qwen3-235B H100 rows +4.3 and -10.2 %; the
    26.08 GB200 rows -7.3 to +1.6 %; the 23 GB300/B300 rows -12.9 to +9.9 %; Megatron-Bridge
    PR 1760's two B200 Qwen3-235B runs without moe_a2a_overlap +1.7 and -2.9 %).
    The max was 17.4 % (Qwen3-235B on 64 B200, 25.11) until PR 1760 showed that row's time
    was its preset's moe_a2a_overlap host overhead (config_gap now); the fixed run is +1.7 %.
    The max was 32.2 % (DeepSeek-V3 on 256 B200, 25.11) while the host's FP8 floor was one
    figure per MoE layer whatever the layer launched; counting the Transformer Engine
    modules the host launches (MLA's five projections and the shared experts' two: 9 against
    Qwen3's 4) took that row to -14.9 % and DeepSeek-V3 on 1,024 H100 from -17.2 % to +0.3 %.
    The 25.11 rows stood at 23.6 % while they lacked their presets' pipeline splits,
    dispatchers and recompute; before the FP8 MoE forward's wait on the host was counted the
    rows stood at 10.8 / 32.9 %; DeepSeek-V3 on 1,024 H100 was +113 % before the flex
    dispatcher, the 26.06 GB200 rows +27-53 % before CUDA-graphed iterations, the fused expert
    MLP and FP8 attention were counted (docs/perf-model.md). None may slide back."""
    assert STATS["moe_published_n"] >= 56
    assert STATS["moe_published_median"] <= 0.10
    assert STATS["moe_published_max"] <= 0.25


def test_the_ep_overlap_saves_what_the_matched_runs_saved() -> None:
    """Megatron-Bridge PR #5094 ran one recipe with overlap_moe_expert_parallel_comm off and on
    (24.71 -> 20.99 s): the share of the dispatch the model counts as hidden
    (moe.EP_OVERLAP_HIDDEN, chosen, not fitted) gives that saving within 10 %."""
    by_id = {r.point.id: r for r in RESULTS}
    off = by_id["bridge-ep-overlap-h100-qwen3-30b-bf16-off"]
    on = by_id["bridge-ep-overlap-h100-qwen3-30b-bf16-on"]
    assert off.point.published_s is not None and on.point.published_s is not None
    measured = off.point.published_s - on.point.published_s
    assert off.predicted_s - on.predicted_s == pytest.approx(measured, rel=0.10)


def test_the_model_names_the_faster_of_two_published_layouts() -> None:
    """Pairs of published runs of one model on the same GPUs whose layouts differ (most a
    recipe NVIDIA changed between releases; slurmpod.perf.pairs): with a published
    configuration the model names the faster in 22 of 23 (the miss: Llama 3 70B on 64 H100,
    NeMo 24.07 against Megatron-Bridge 26.04.01, 9 % apart, two years of releases between
    them). Among pairs with a config_gap row, 7 of 17."""
    from slurmpod.perf.pairs import layout_pairs

    pairs = layout_pairs(RESULTS)
    published = [x for x in pairs if not x.config_gap]
    assert len(published) >= 23
    assert sum(x.agrees for x in published) >= len(published) - 1
    for x in pairs:  # faster first, beyond a tie, in both orders the model is asked
        assert x.published_ratio > 1.05 and x.faster.id != x.slower.id


# Dense recipes whose published layout the search ranks in its top 5 today (34 of 65; the
# rest, and why, in docs/perf-model.md); a model change that pushes one out must say why. The
# three GB200 Llama 3 70B FP8 rows left with the offload's time (docs/perf-model.md).
TOP5 = ["nemo2407-h100-gpt3-175b-128", "nemo2407-h100-gpt3-175b-512", "nemo2407-h100-llama2-7b",
        "nemo2407-h100-llama2-70b", "nemo2407-h100-nemotron4-340b", "nemo2407-h100-llama3-8b",
        "nemo2407-h100-llama3-70b", "bridge2511-h100-llama31-405b-fp8",
        "bridge2511-b200-llama3-8b-fp8", "bridge2511-gb200-llama3-8b-fp8",
        "bridge2511-b200-llama31-405b-fp8", "bridge2511-gb200-llama31-405b-fp8",
        "bridge2602-gb200-llama31-405b-mxfp8",
        "bridge2602-gb200-llama31-405b-fp8",
        "bridge2604-gb200-llama31-405b-fp8", "bridge2604-gb200-llama31-405b-mxfp8",
        "bridge2606-gb200-llama31-405b-fp8", "bridge2606-gb200-llama31-405b-mxfp8",
        "bridge2511-h100-llama3-8b-fp8",
        "bridge2511-gb300-llama3-8b-fp8", "bridge2511-gb300-llama31-405b-fp8",
        "bridge2602-gb300-llama31-405b-mxfp8", "bridge2604-gb300-llama31-405b-mxfp8",
        "bridge2606-gb300-llama31-405b-mxfp8",
        "megatron-readme-1_7b", "megatron-readme-7_1b", "megatron-readme-16b",
        "megatron-readme-32b", "mlperf50-h100-llama31-405b-n256",
        "mlperf50-h100-llama31-405b-n304", "mlperf50-h100-llama31-405b-n320",
        "mlperf50-h100-llama31-405b-n1024", "mlperf41-h100-gpt3-175b-n32",
        "mlperf41-h100-gpt3-175b-n64"]


@pytest.mark.parametrize("point_id", TOP5)
def test_the_search_ranks_the_published_layout_in_its_top_5(point_id: str) -> None:
    from slurmpod.perf.calibrate import recipe_rank

    p = next(x for x in POINTS if x.id == point_id)
    r = recipe_rank(p)
    assert r.rank is not None and r.rank <= 5, r.why or r.rank


def test_the_written_table_is_current() -> None:
    text = (DATA / "validation.md").read_text(encoding="utf-8")
    assert markdown_table(POINTS, RESULTS) in text


# Published runs whose layout the memory estimate puts above the HBM `plan` counts as usable,
# each with why. The list is exact: a row that fits again leaves it.
OVER_USABLE = {
    "bridge2511-b200-gptoss120b-bf16": (
        "the page's layout (PP1 EP8, MBS 4, no recompute) is not its commit's preset "
        "(GPT_OSS_120B_PRETRAIN_CONFIG_B200_BF16_BASE_CONFIG at 00b7660: EP64); at EP8 the "
        "estimate is 1.2 % over usable, inside its error on published peaks (up to 5.8 %, "
        "tests/data/perf/memory.toml)"),
}


def test_every_published_run_plans_as_fitting() -> None:
    """A published recipe that ran fits in the HBM `plan` counts as usable (the GPU's less the
    runtime reserve), as `plan` and the search judge it: no published row is refused for
    memory but those OVER_USABLE names, and those by no more than the estimate's error."""
    over = {}
    for p in POINTS:
        if p.role == "excluded":
            continue
        assert p.config is not None and p.hardware is not None
        need = peak_memory(p.config, p.gpus).bytes_per_gpu
        usable = usable_bytes(p.config, p.gpus, p.hardware)
        if need > usable:
            over[p.id] = need / usable
    assert set(over) == set(OVER_USABLE), over
    assert max(over.values(), default=1.0) <= 1.02, over


def test_every_published_layout_is_one_plan_accepts() -> None:
    """Each timed row ran, so its layout (uneven pipeline splits, layouts, VPP, EP folding)
    passes `plan`'s layout checks on its own GPUs (docs/plan.md)."""
    refused = {}
    for p in POINTS:
        if p.role == "excluded":
            continue
        assert p.config is not None and p.hardware is not None
        hw = p.hardware
        shape = SiteShape("published", hw.gpus_per_node, hw.domain_gpus,
                          usable_bytes(p.config, p.gpus, hw), p.gpus // hw.gpus_per_node)
        errors = layout_errors(p.config, p.gpus, shape)
        if errors:
            refused[p.id] = errors
    assert not refused, refused


def test_a_non_megatron_optimizer_state_is_the_rows() -> None:
    """NeMo 24.07's Nemotron-4 340B ran Apex's DistributedFusedAdam with bf16 state and no
    master copy (4 bytes per parameter); with Megatron's 12 its 128-GPU layout would not fit."""
    p = next(x for x in POINTS if x.id == "nemo2407-h100-nemotron4-340b")
    assert p.config is not None and p.hardware is not None
    assert p.config.optimizer_state_bytes == 4.0
    megatron = dataclasses.replace(p.config, optimizer_state_bytes=12.0)
    usable = usable_bytes(p.config, p.gpus, p.hardware)
    assert peak_memory(p.config, p.gpus).bytes_per_gpu <= usable
    assert peak_memory(megatron, p.gpus).bytes_per_gpu > usable


@pytest.mark.parametrize("point_id", [p.id for p in POINTS if p.role != "excluded"
                                      and not p.is_moe and p.source != "narayanan2021"])
def test_every_published_recipe_is_within_the_models_error_of_the_fastest(point_id: str) -> None:
    """Where the search ranks a recipe below its top 5, the layouts ahead of it are predicted
    at most WITHIN_MODEL_ERROR faster (today 0-5.5 %, docs/perf-model.md): near-ties the
    model's error cannot order, not a recipe it calls slow."""
    from slurmpod.perf.calibrate import recipe_rank
    from slurmpod.perf.search import WITHIN_MODEL_ERROR

    r = recipe_rank(next(x for x in POINTS if x.id == point_id))
    assert r.rank is not None and r.vs_fastest is not None, r.why
    assert r.vs_fastest <= 1 + WITHIN_MODEL_ERROR, (r.rank, r.vs_fastest)


def test_the_checked_experts_per_gpu_is_the_published_tables_most() -> None:
    """CHECKED_EXPERTS_PER_GPU, beyond which `plan` calls a layout unchecked, is the most
    routed experts one GPU holds in a timed published run."""
    from slurmpod.perf.moe import CHECKED_EXPERTS_PER_GPU

    local = [p.config.num_experts // p.config.ep for p in POINTS
             if p.config is not None and p.published_s and p.config.num_experts]
    assert max(local) == CHECKED_EXPERTS_PER_GPU


# MoE recipes (published configuration) whose layout the search ranks in its top 5 among the
# layouts within the published range (today 10 of 60; 4 among all candidates: the Qwen3-30B-A3B
# rows rank 12-25 behind layouts with 64 or 128 experts per GPU, which no published run checks).
MOE_CHECKED_TOP5 = ["bridge2511-gb200-qwen3-30b-fp8", "bridge2602-gb200-qwen3-30b-mxfp8",
                    "bridge2604-b200-qwen3-30b-mxfp8", "bridge2604-gb200-qwen3-30b-mxfp8",
                    "bridge2608-gb200-deepseek-v3-mxfp8", "bridge2608-gb300-deepseek-v3-mxfp8",
                    "bridge2602-b300-qwen3-30b-mxfp8", "bridge2604-b300-qwen3-30b-mxfp8",
                    "bridge2606-gb300-deepseek-v3-mxfp8",
                    "bridge2606-gb300-deepseek-v3-mxfp8-gbs15360"]


@pytest.mark.parametrize("point_id", MOE_CHECKED_TOP5)
def test_moe_recipes_in_the_top_5_of_the_checked_layouts(point_id: str) -> None:
    """`checked_rank` counts only the candidates within the published range, so it is at most
    the rank, and equal where nothing ahead has more experts per GPU than that range."""
    from slurmpod.perf.calibrate import recipe_rank
    from slurmpod.perf.moe import CHECKED_EXPERTS_PER_GPU
    from slurmpod.perf.search import search

    p = next(x for x in POINTS if x.id == point_id)
    r = recipe_rank(p)
    assert r.rank is not None and r.checked_rank is not None, r.why
    assert r.checked_rank <= min(5, r.rank)
    assert p.config is not None and p.hardware is not None
    cands, _ = search(p.config, p.gpus, p.hardware, usable_bytes(p.config, p.gpus, p.hardware),
                      FITTED[p.generation], p.opts, top=None)
    ahead = cands[:r.rank - 1]
    assert r.checked_rank == 1 + sum(
        1 for x in ahead if p.config.num_experts // x.config.ep <= CHECKED_EXPERTS_PER_GPU)


def test_the_track_record_is_current() -> None:
    """`plan`'s track record (slurmpod/perf/track_record.json) holds every validation row's
    current error: `benchmarks/plan_search.py --write` rewrites it."""
    assert TRACK_PATH.read_text(encoding="utf-8") == dumps(track_runs(RESULTS))
    runs = track_runs(RESULTS)
    assert len(runs) == sum(1 for r in RESULTS if r.point.role == "validation")
    assert {r.model for r in runs} >= {"gpt-oss-120b", "llama3-70b", "deepseek-v3"}


# MoE recipes whose parallel layout (TP, CP, PP, EP, ETP) the search's --distinct ranking puts
# in its top 5 among the layouts within the published range; the first six also among all.
MOE_DISTINCT_TOP5 = ["bridge2511-b200-deepseek-v3-fp8", "bridge2602-b200-deepseek-v3-mxfp8",
                     "bridge2608-gb200-deepseek-v3-mxfp8", "bridge2608-gb300-deepseek-v3-mxfp8",
                     "bridge2606-gb300-deepseek-v3-mxfp8",
                     "bridge2606-gb300-deepseek-v3-mxfp8-gbs15360"]
MOE_CHECKED_DISTINCT_TOP5 = [
    *MOE_DISTINCT_TOP5,
    "bridge2511-gb200-qwen3-30b-fp8", "bridge2602-gb200-qwen3-30b-mxfp8",
    "bridge2602-b200-qwen3-30b-mxfp8", "bridge2604-b200-qwen3-30b-mxfp8",
    "bridge2604-gb200-qwen3-30b-mxfp8", "bridge2608-gb300-qwen3-30b-mxfp8",
    "bridge2511-gb300-qwen3-30b-fp8", "bridge2602-gb300-qwen3-30b-mxfp8",
    "bridge2602-b300-qwen3-30b-mxfp8", "bridge2604-gb300-qwen3-30b-mxfp8",
    "bridge2604-b300-qwen3-30b-mxfp8", "bridge2606-gb300-qwen3-30b-mxfp8",
    "bridge2606-b300-qwen3-30b-mxfp8"]


@pytest.mark.parametrize("point_id", MOE_CHECKED_DISTINCT_TOP5)
def test_moe_recipes_whose_parallel_layout_is_in_the_distinct_top_5(point_id: str) -> None:
    """The distinct ranks, recounted here: one plus the parallel layouts whose fastest
    candidate comes before the recipe's layout's first one."""
    from slurmpod.perf.calibrate import recipe_rank
    from slurmpod.perf.search import search

    p = next(x for x in POINTS if x.id == point_id)
    assert p.config is not None and p.hardware is not None
    r = recipe_rank(p)
    cands, _ = search(p.config, p.gpus, p.hardware, usable_bytes(p.config, p.gpus, p.hardware),
                      FITTED[p.generation], p.opts, top=None)
    c = p.config
    want = (c.tp, c.cp, c.pp, c.ep, c.etp)

    def rank(checked_only: bool) -> int:
        ahead: set[tuple[int, ...]] = set()
        for x in cands:
            if checked_only and x.unchecked_experts is not None:
                continue
            k = (x.config.tp, x.config.cp, x.config.pp, x.config.ep, x.config.etp)
            if k == want:
                return len(ahead) + 1
            ahead.add(k)
        raise AssertionError("the recipe's layout is not a candidate")

    assert r.checked_distinct_rank == rank(True) <= 5
    assert r.distinct_rank == rank(False)
    assert (r.distinct_rank <= 5) is (point_id in MOE_DISTINCT_TOP5)
