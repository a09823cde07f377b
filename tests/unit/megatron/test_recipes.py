"""Published recipes that ran plan as valid and fitting; Megatron's pipeline splits (embedding
and loss slots, explicit layouts, uneven first/last stages) are accepted exactly where
Megatron accepts them; FP8 in the run spec renders as Megatron's flag."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from slurmpod.config import builtin_site_path, load_site
from slurmpod.errors import ConfigError
from slurmpod.megatron.memory import (
    ESTIMATE_LOW_BY,
    GIB,
    MeasuredReserve,
    activation_bytes,
    layer_activation_bytes,
    peak_memory,
    rank_activation_bytes,
    rank_weight_bytes,
)
from slurmpod.megatron.pipeline import LayoutError, balanced_layout, parse_layout
from slurmpod.megatron.plan import HBM_HEADROOM_FRACTION, make_plan
from slurmpod.megatron.runspec import ModelConfig, load_run, preset_path, run_from_dict
from slurmpod.render.sbatch import PlanFacts, RenderOptions, build_context, render_script
from tests.helpers import DATA_DIR

RECIPES = DATA_DIR / "recipes"
RECIPE_FILES = sorted(RECIPES.glob("*.toml"))


def _site(recipe: Path) -> str:
    return "gb200-nvl72" if "gb200" in recipe.name else "dgx-h100-superpod"


def test_the_recipes_are_there() -> None:
    names = {p.stem for p in RECIPE_FILES}
    assert {"llama3-70b-h100-fp8cs-64gpu", "llama3-70b-h100-fp8cs-64gpu-v1",
            "llama31-405b-h100-fp8cs-1024gpu", "deepseek-v3-gb200-bf16-256gpu",
            "deepseek-v3-h100-fp8cs-1024gpu"} <= names
    for p in RECIPE_FILES:
        assert "github.com/NVIDIA-NeMo/Megatron-Bridge" in p.read_text() or \
            "Megatron-Bridge" in p.read_text()  # every recipe names its source


@pytest.mark.parametrize("recipe", RECIPE_FILES, ids=lambda p: p.stem)
def test_published_recipe_plans_valid_and_fitting(recipe: Path) -> None:
    site = load_site(builtin_site_path(_site(recipe)))
    plan = make_plan(load_run(recipe), site, placement=False)
    assert plan.errors == () and plan.fits, (plan.errors, plan.total_bytes_per_gpu / GIB)
    assert plan.ok


def test_headroom_is_within_what_the_recipes_left() -> None:
    """The recipes ran, so HBM minus the estimate is at least what the runtime needed beyond
    the model: the headroom slurmpod keeps may not exceed the smallest of those margins."""
    margins = []
    for recipe in RECIPE_FILES:
        site = load_site(builtin_site_path(_site(recipe)))
        plan = make_plan(load_run(recipe), site, placement=False)
        margins.append(1 - plan.total_bytes_per_gpu / plan.hbm_bytes_per_gpu)
    assert min(margins) >= HBM_HEADROOM_FRACTION


def _cfg(recipe: str, **over: object) -> ModelConfig:
    args = load_run(RECIPES / f"{recipe}.toml").megatron.values() | over
    return ModelConfig.from_args(args)


def test_llama31_405b_embedding_and_loss_slots() -> None:
    """126 layers + embedding + loss = 128 slots at PP=8 x VPP=8: 2 per chunk, one fewer layer
    in the first chunk of rank 0 and the last chunk of rank 7 (transformer_block.py)."""
    c = _cfg("llama31-405b-h100-fp8cs-1024gpu")
    assert c.vpp == 8
    sp = c.pipeline_split()
    assert sp.errors == ()
    grid = [[ch.decoder for ch in row] for row in sp.chunks]
    assert grid[0] == [1] + [2] * 7 and grid[7] == [2] * 7 + [1]
    assert all(row == [2] * 8 for row in grid[1:7])
    assert sum(map(sum, grid)) == 126
    assert sp.chunks[0][0].embedding and sp.chunks[7][7].loss
    # Layer ids run chunk-major as megatron-core numbers them: rank 1's first chunk follows
    # rank 0's single layer.
    assert sp.chunks[1][0].first_layer == 1 and sp.chunks[0][1].first_layer == 1 + 2 * 7
    # Without the slots Megatron refuses the layout: 126 is not divisible by PP x VPP.
    bare = replace(c, account_for_embedding=False, account_for_loss=False)
    assert [k for k, _ in bare.pipeline_split().errors] == ["num_layers"]


def test_num_layers_per_virtual_stage_counts_the_slots() -> None:
    c = _cfg("llama31-405b-h100-fp8cs-1024gpu", num_virtual_stages_per_pipeline_rank=None,
             num_layers_per_virtual_pipeline_stage=2)
    assert c.vpp == 8  # (126 + 2) / 8 / 2, as arguments.py derives it


def test_deepseek_v3_layout_at_pp4_vpp4() -> None:
    c = _cfg("deepseek-v3-gb200-bf16-256gpu")
    assert c.vpp == 4  # 16 chunks / PP 4
    sp = c.pipeline_split()
    assert sp.errors == ()
    # Chunk i sits on rank i % 4, virtual stage i // 4.
    assert [ch.decoder for ch in sp.chunks[0]] == [4, 4, 4, 4]
    assert [ch.decoder for ch in sp.chunks[3]] == [4, 4, 4, 1]
    last = sp.chunks[3][3]
    assert last.loss and last.mtp == 1 and last.first_layer == 60
    assert sp.chunks[0][0].embedding and sp.chunks[0][0].first_layer == 0
    assert sum(ch.decoder for row in sp.chunks for ch in row) == 61
    # The plain split Megatron refuses: 61 is not divisible by 16.
    even = replace(c, pipeline_layout=None)
    assert any(k == "num_layers" for k, _ in even.pipeline_split().errors)


def test_layout_string_grammar() -> None:
    assert parse_layout("Et*3|(tt|)*2,m|L") == ("Ettt", "tt", "tt", "m", "L")
    assert parse_layout("E|(t|)*3L") == ("E", "t", "t", "t", "L")
    with pytest.raises(LayoutError, match="unknown layer letter"):
        parse_layout("Ex|L")
    with pytest.raises(LayoutError, match="unrolls"):
        parse_layout("(t*99999)*99999")


@pytest.mark.parametrize(("layout", "needle"), [
    ("Et*30|t*30mL", "not a multiple of PP=4"),
    ("Et*4|(t*4|)*14,ttmL", "62 transformer layers"),
    ("Et*4|(t*4|)*14,tL", "0 MTP layers"),
    ("t*4|E(t*4|)*14,tmL", "start with E"),
    ("Et*4|(t*4|)*13,tm|ttttL", "transformer layers (t) must come before"),
])
def test_layout_refused_where_megatron_refuses(layout: str, needle: str) -> None:
    c = _cfg("deepseek-v3-gb200-bf16-256gpu", pipeline_model_parallel_layout=layout)
    msgs = [m for _, m in c.pipeline_split().errors]
    assert any(needle in m for m in msgs), msgs


def test_layout_conflicts_with_stated_vpp_and_other_split_arguments() -> None:
    c = _cfg("deepseek-v3-gb200-bf16-256gpu", num_virtual_stages_per_pipeline_rank=2)
    assert any("but VPP=2" in m for _, m in c.pipeline_split().errors)
    c = _cfg("deepseek-v3-gb200-bf16-256gpu", account_for_loss_in_pipeline_split=True)
    assert any("excludes" in m for _, m in c.pipeline_split().errors)


def test_uneven_first_last_stages_follow_megatron() -> None:
    base = load_run(preset_path("deepseek-v3")).megatron.values()
    c = ModelConfig.from_args(base)  # first stage 5 layers, 56 over the other 7
    sp = c.pipeline_split()
    assert sp.errors == () and [sp.rank_layers(r) for r in range(8)] == [5] + [8] * 7
    assert c.stage_layers() == (5.0, 8.0)
    # With VPP the fixed stages must divide by it (transformer_config.py).
    bad = ModelConfig.from_args(base | {"num_virtual_stages_per_pipeline_rank": 2})
    assert any("not divisible by VPP=2" in m for _, m in bad.pipeline_split().errors)
    both = ModelConfig.from_args(base | {"account_for_embedding_in_pipeline_split": True})
    assert any("exclude" in m for _, m in both.pipeline_split().errors)


def test_plan_refuses_a_split_megatron_refuses_with_a_fix() -> None:
    site = load_site(builtin_site_path("dgx-h100-superpod"))
    data = {"job": {"nodes": 128}, "megatron": load_run(
        RECIPES / "llama31-405b-h100-fp8cs-1024gpu.toml").megatron.explicit()}
    data["megatron"]["account_for_loss_in_pipeline_split"] = False
    plan = make_plan(run_from_dict(data, "x.toml"), site, placement=False)
    assert plan.errors == ("megatron.num_layers: num_layers + 1 (account_for_embedding/loss_in_"
                           "pipeline_split) = 127 is not divisible by PP=8: use account_for_"
                           "embedding_in_pipeline_split = true and account_for_loss_in_pipeline"
                           "_split = true",)


def test_a_split_no_flag_cures_gets_a_balanced_layout_megatron_accepts() -> None:
    site = load_site(builtin_site_path("gb200-nvl72"))
    args = load_run(RECIPES / "deepseek-v3-gb200-bf16-256gpu.toml").megatron.explicit()
    del args["pipeline_model_parallel_layout"]
    args["num_virtual_stages_per_pipeline_rank"] = 4
    plan = make_plan(run_from_dict({"job": {"nodes": 64}, "megatron": args}, "x.toml"), site,
                     placement=False)
    assert len(plan.errors) == 1 and plan.errors[0].endswith(
        'use pipeline_model_parallel_layout = "Et*3|(t*4|)*14ttmL"')
    del args["num_virtual_stages_per_pipeline_rank"]
    args["pipeline_model_parallel_layout"] = "Et*3|(t*4|)*14ttmL"
    fixed = make_plan(run_from_dict({"job": {"nodes": 64}, "megatron": args}, "x.toml"), site,
                      placement=False)
    assert fixed.ok


@pytest.mark.parametrize(("layers", "pp", "vpp", "mtp"),
                         [(61, 8, 4, 1), (126, 8, 8, 0), (80, 8, 5, 0), (7, 2, 2, 0)])
def test_balanced_layout_is_valid(layers: int, pp: int, vpp: int, mtp: int) -> None:
    layout = balanced_layout(layers, pp, vpp, mtp)
    assert layout is not None
    stages = parse_layout(layout)
    flat = "".join(stages)
    assert len(stages) == pp * vpp and flat.count("t") == layers and flat.count("m") == mtp
    sizes = [len(st) for st in stages]
    assert max(sizes) - min(sizes) <= 1  # embedding, loss and MTP count as a slot each
    if (layers, pp, vpp, mtp) == (61, 8, 4, 1):
        assert layout == "Et|(tt|)*30mL"  # the layout NVIDIA's DeepSeek-V3 H100 recipe uses


def test_memory_is_per_pipeline_rank() -> None:
    """The first rank holds the most activations in flight, the last the logits; plan takes
    the rank that needs the most."""
    c = _cfg("llama3-70b-h100-fp8cs-64gpu-v1")
    world = 64
    acts = rank_activation_bytes(c, world)
    ws = rank_weight_bytes(c, world)
    assert acts[0].bytes_per_gpu > acts[3].bytes_per_gpu
    # Interleaved warm-up at PP=8, VPP=5: 2*7 + 4*8 + 1 = 47 chunks of 2 layers in flight.
    per_layer = layer_activation_bytes(c, False)
    s, t = 8192, 4
    ids = 8 * s / t  # token ids; no embedding dropout mask with hidden_dropout = 0
    first_chunk_forwards = 8 + 7  # the first round of 8 microbatches, then 7 of the next
    assert acts[0].bytes_per_gpu == pytest.approx(47 * 2 * per_layer + first_chunk_forwards * ids)
    peak = peak_memory(c, world)
    assert peak.bytes_per_gpu == max(a.bytes_per_gpu + w.bytes_per_gpu
                                     for a, w in zip(acts, ws, strict=True))
    assert activation_bytes(c, world).bytes_per_gpu == acts[0].bytes_per_gpu


def test_precision_terms_of_the_70b_fp8_recipe() -> None:
    """Per layer and token (/TP with SP), in bytes: BF16 with dropout 34h for f = 4h becomes,
    for Llama 3 70B (q = h, kv = h/8, f = 3.5h, SwiGLU):
    BF16, dropout 0.1: 4h + 4h + 2h + 2(q + 2kv) + 2q + 2*2f + 2f
    FP8, dropout 0:    4h + 2h      + 2(q + 2kv) + 2q + q + 2*2f + f."""
    s, h, t, f = 8192, 8192, 4, 28672
    q, kv = 8192, 1024
    fp8 = _cfg("llama3-70b-h100-fp8cs-64gpu-v1")
    bf16 = replace(fp8, fp8=None, hidden_dropout=0.1)
    want_bf16 = s * (10 * h + 2 * (q + 2 * kv) + 2 * q + 6 * f) / t
    want_fp8 = s * (6 * h + 2 * (q + 2 * kv) + 3 * q + 5 * f) / t
    assert layer_activation_bytes(bf16, False) == pytest.approx(want_bf16)
    assert layer_activation_bytes(fp8, False) == pytest.approx(want_fp8)
    # Weights: FP8 parameters (1 + 1 transpose) and bf16 gradients: 2 + 2 + 12/DP per GEMM
    # weight, against bf16 weights + FP8 copies (4) and fp32 gradients (4).
    dp = 2
    w_fp8 = rank_weight_bytes(fp8, 64)[1]
    w_plain = rank_weight_bytes(replace(fp8, fp8_param_gather=False, grad_bytes=4), 64)[1]
    n = w_fp8.nonexpert_params_per_gpu
    assert w_fp8.bytes_per_gpu == pytest.approx(n * (2 + 2 + 12 / dp), rel=1e-6)
    norms = 10 * 2 * h  # rank 1's 10 layers, two RMSNorms each: bf16, never FP8
    assert w_plain.bytes_per_gpu == pytest.approx(
        (n - norms) * (4 + 4 + 12 / dp) + norms * (2 + 4 + 12 / dp), rel=1e-12)


def test_selective_recompute_modules_drop_what_they_recompute() -> None:
    c = _cfg("deepseek-v3-h100-fp8cs-1024gpu")
    none = replace(c, recompute_modules=("core_attn",))
    mlp_only = replace(c, recompute_modules=("core_attn", "mlp"))
    # mla_up_proj drops Q, K, V of every layer; mlp drops the dense layers' MLP tensors.
    assert layer_activation_bytes(c, True) < layer_activation_bytes(none, True)
    assert layer_activation_bytes(mlp_only, False) < layer_activation_bytes(none, False)
    assert layer_activation_bytes(mlp_only, True) == layer_activation_bytes(none, True)
    moe = replace(c, recompute_modules=("moe",))
    assert layer_activation_bytes(moe, True) < layer_activation_bytes(none, True)


def test_megatron_fsdp_and_optimizer_offload_shrink_weights() -> None:
    c = _cfg("llama3-70b-h100-fp8cs-64gpu-v1")
    base = max(w.bytes_per_gpu for w in rank_weight_bytes(c, 64))
    fsdp = replace(c, megatron_fsdp=True, fsdp_sharding="optim_grads_params")
    off = replace(c, optimizer_offload_fraction=1.0)
    assert max(w.bytes_per_gpu for w in rank_weight_bytes(fsdp, 64)) < base
    assert max(w.bytes_per_gpu for w in rank_weight_bytes(off, 64)) < base
    offload = replace(c, cpu_offloading_num_layers=4, pp=1, vpp=None, pipeline_layout=None)
    plain = replace(offload, cpu_offloading_num_layers=0)
    assert activation_bytes(offload, 64).bytes_per_gpu < activation_bytes(plain, 64).bytes_per_gpu


def test_fp8_in_the_run_spec_renders_megatrons_flag() -> None:
    recipe = RECIPES / "llama3-70b-h100-fp8cs-64gpu.toml"
    run = load_run(recipe)
    assert run.megatron.fp8 == "hybrid"
    site = load_site(builtin_site_path("dgx-h100-superpod"))
    facts = PlanFacts.of(make_plan(run, site))
    text = render_script(build_context(run, site, facts, RenderOptions(run_dir="/r/x")))
    assert "--fp8-format hybrid" in text and "--fp8 " not in text
    assert "--fp8-param-gather" in text and "--grad-reduce-in-bf16" in text
    assert "--pipeline-model-parallel-layout 'Et*2|(t*2|)*34,t*3|(t*2|)*3,tL'" in text


def test_fp8_spelling_mistakes_are_one_line() -> None:
    data = {"megatron": {"num_layers": 2, "hidden_size": 64, "num_attention_heads": 4,
                         "seq_length": 128, "vocab_size": 1000}}
    with pytest.raises(ConfigError, match="fp8"):
        run_from_dict({"megatron": data["megatron"] | {"fp8": "hybird"}}, "x.toml")
    with pytest.raises(ConfigError, match='dest `fp8`'):
        run_from_dict({"megatron": data["megatron"] | {"fp8_format": "hybrid"}}, "x.toml")
    # A log's dump prints "None" when FP8 is off.
    assert ModelConfig.from_args(data["megatron"] | {"fp8": "None"}).fp8 is None


def test_split_arguments_leave_flops_and_placement_alone() -> None:
    """Where the layers sit changes memory, not the model's FLOPs or the rank groups."""
    from slurmpod.megatron.flops import flops_per_token

    c = _cfg("llama31-405b-h100-fp8cs-1024gpu")
    even = replace(c, account_for_embedding=False, account_for_loss=False, vpp=None)
    assert flops_per_token(c) == flops_per_token(even)
    site = load_site(builtin_site_path("dgx-h100-superpod"))
    plan = make_plan(load_run(RECIPES / "llama31-405b-h100-fp8cs-1024gpu.toml"), site)
    assert plan.placement is not None and plan.placement.groups["pp"].size == 8
    assert plan.vpp == 8


def test_a_plan_that_fits_by_less_than_the_estimates_shortfall_is_warned() -> None:
    """The estimate fell short of published peaks by up to ESTIMATE_LOW_BY: a plan that fits
    by less still plans (a published recipe that ran must), with a warning that says so."""
    site = load_site(builtin_site_path("dgx-h100-superpod"))
    run = load_run(RECIPES / "llama3-70b-h100-fp8cs-64gpu.toml")
    roomy = make_plan(run, site, placement=False)
    assert roomy.ok and roomy.total_bytes_per_gpu * (1 + ESTIMATE_LOW_BY) \
        < roomy.usable_bytes_per_gpu
    assert not [w for w in roomy.warnings if w.startswith("memory:")]
    # This site's jobs measured a larger PyTorch cache: 3 % is left above the estimate.
    visible_gib = 80.0 - 0.82 - 1.0
    cached = visible_gib - roomy.total_bytes_per_gpu * 1.03 / GIB
    tight = make_plan(run, site, placement=False,
                      measured_reserve=MeasuredReserve("h100", 80.0, cached, 1.0, 3, 3))
    assert tight.ok and tight.fits
    [warning] = [w for w in tight.warnings if w.startswith("memory:")]
    assert "may run out of memory" in warning and "65.0 GiB" in warning
    # Over the usable HBM it is the refusal, not the warning.
    over = make_plan(run, site, placement=False, measured_reserve=MeasuredReserve(
        "h100", 80.0, visible_gib - roomy.total_bytes_per_gpu * 0.99 / GIB, 1.0, 3, 3))
    assert not over.fits and not [w for w in over.warnings if w.startswith("memory:")]
