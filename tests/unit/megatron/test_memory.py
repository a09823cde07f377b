"""Parameter counts vs published figures; weight/optimizer bytes vs Megatron's
theoretical_memory_usage arithmetic (re-derived here); activations vs Korthikanti et al. 2022."""

import pytest

from slurmpod.megatron.memory import (
    activation_bytes,
    layer_activation_bytes,
    megatron_weight_and_optimizer_bytes,
    param_counts,
    weight_and_optimizer_bytes,
)
from slurmpod.megatron.runspec import ModelConfig, load_run, padded_vocab_size, preset_path


def cfg(name: str, **over) -> ModelConfig:
    args = load_run(preset_path(name)).megatron.values()
    args.update(over)
    return ModelConfig.from_args(args)


# (preset, published total, published active, tolerance). Padded vocab at TP=1.
PUBLISHED = [
    ("llama3-8b", 8.03e9, 8.03e9, 0.003),
    ("llama3-70b", 70.6e9, 70.6e9, 0.003),
    ("llama3-405b", 405.9e9, 405.9e9, 0.003),
    ("mixtral-8x7b", 46.7e9, 12.9e9, 0.005),
    ("qwen3-30b-a3b", 30.5e9, 3.3e9, 0.02),  # published to 2-3 significant digits
    ("gpt3-175b", 175e9, 175e9, 0.005),
]


@pytest.mark.parametrize(("name", "total", "active", "tol"), PUBLISHED)
def test_param_counts_match_published(name, total, active, tol):
    p = param_counts(cfg(name, tensor_model_parallel_size=1))
    assert abs(p.total - total) / total <= tol
    assert abs(p.active - active) / active <= tol


def test_deepseek_v3_main_model_counts():
    """DeepSeek-V3 reports 671B total / 37B activated for the main model (the 14B MTP module is
    counted apart); Megatron main counts router weights and the MTP block whole as active."""
    p = param_counts(cfg("deepseek-v3", tensor_model_parallel_size=1))
    mtp_total = p.mtp_nonexpert + p.mtp_expert
    main_total = p.total - mtp_total
    assert abs(main_total - 671e9) / 671e9 < 0.01
    assert abs((p.active - mtp_total) - 37e9) / 37e9 < 0.02
    assert 9e9 < mtp_total < 14e9  # one MTP MoE layer (+ its projection, not counted)


def test_llama3_8b_exact_count():
    # 32 x (attention 2h^2(1 + 8/32) + MLP 3 h ffn + 2 RMSNorms) + final norm + 2 embeddings
    h, f, V = 4096, 14336, 128256
    per_layer = 2 * h * h * (1 + 8 / 32) + 3 * h * f + 2 * h
    want = 32 * per_layer + h + 2 * h * V
    assert param_counts(cfg("llama3-8b", tensor_model_parallel_size=1)).total == want == 8030261248


def megatron_reference_weight_bytes(a: dict, world: int) -> float:
    """Megatron's compute_weight_and_optimizer_memory, re-derived component by component."""
    h, heads, L = a["hidden_size"], a["num_attention_heads"], a["num_layers"]
    tp, pp, cp = (a.get("tensor_model_parallel_size", 1), a.get("pipeline_model_parallel_size", 1),
                  a.get("context_parallel_size", 1))
    d = a.get("kv_channels") or h // heads
    groups = a["num_query_groups"] if a.get("group_query_attention") else heads
    ffn = a.get("ffn_hidden_size") or 4 * h
    mult = 1.5 if a.get("swiglu") else 1.0
    norm = 1 if a.get("normalization") == "RMSNorm" else 2
    q_weights = h * heads * d  # Q
    o_weights = heads * d * h  # O
    kv_weights = 2 * h * groups * d
    attention = q_weights + o_weights + kv_weights
    layer = attention + 2 * h * ffn * mult
    V = padded_vocab_size(a["vocab_size"], 128, tp)
    on_stage = L * layer / pp + h * V
    if a.get("untie_embeddings_and_output_weights") and pp == 1:
        on_stage += h * V
    norms = (L * 2 * norm * h + norm * h) / pp  # replicated over TP (Megatron main)
    dp = world // (tp * pp * cp)
    per_param = 6 + 12 / dp if a.get("use_distributed_optimizer") else 18
    return (on_stage / tp + norms) * per_param


DENSE_LAYOUTS = [
    ("llama3-8b", dict(tensor_model_parallel_size=1, use_distributed_optimizer=True), 16),
    ("llama3-8b", dict(tensor_model_parallel_size=2, use_distributed_optimizer=False), 16),
    ("llama3-70b", dict(context_parallel_size=1), 128),
    ("llama3-70b", dict(pipeline_model_parallel_size=1, tensor_model_parallel_size=8,
                        virtual_pipeline_model_parallel_size=None, context_parallel_size=1), 64),
    ("gpt3-175b", {}, 512),
    ("llama3-405b", dict(context_parallel_size=1), 1792),
]


@pytest.mark.parametrize(("name", "over", "world"), DENSE_LAYOUTS)
def test_weight_bytes_match_megatron(name, over, world):
    args = load_run(preset_path(name)).megatron.values() | over
    c = ModelConfig.from_args(args)
    want = megatron_reference_weight_bytes(args, world)
    got = weight_and_optimizer_bytes(c, world).bytes_per_gpu
    assert abs(got - want) / want <= 1e-3  # the bound; in fact exact
    assert abs(megatron_weight_and_optimizer_bytes(c, world) - want) / want <= 1e-12


def test_moe_without_ep_equals_megatron():
    """With EP=1 and ETP=TP (and CP=1) the per-rank count is Megatron main's, except that the
    final norm sits whole on the last rank where Megatron spreads it over PP (a few KiB)."""
    c = cfg("mixtral-8x7b", expert_model_parallel_size=1, pipeline_model_parallel_size=2)
    world = 64
    got = weight_and_optimizer_bytes(c, world).bytes_per_gpu
    final_norm_share = 4096 * (1 - 1 / 2) * (6 + 12 / 32)
    assert got - megatron_weight_and_optimizer_bytes(c, world) == pytest.approx(final_norm_share)


def test_expert_sharding_over_ep_and_expert_dp():
    c = cfg("mixtral-8x7b")  # TP=1, PP=4, EP=8 on 64 GPUs: expert-DP = 64 / (1*8*4) = 2
    p = param_counts(c)
    world = 64
    w = weight_and_optimizer_bytes(c, world)
    expert_per_gpu = 32 * 8 * (3 * 4096 * 14336) / 4 / 8  # layers x experts x params / PP / EP
    assert w.expert_params_per_gpu == pytest.approx(expert_per_gpu, rel=1e-12)
    dense_dp = world // 4
    want = (w.nonexpert_params_per_gpu * (6 + 12 / dense_dp)
            + expert_per_gpu * (6 + 12 / 2))
    assert w.bytes_per_gpu == pytest.approx(want, rel=1e-12)
    assert p.block_expert == 32 * 8 * 3 * 4096 * 14336


def megatron_reference_activation_sp(a: dict, nmb: int | None) -> float:
    """Megatron's compute_activation_memory (SP + selective recompute), re-derived."""
    s, b, h = a["seq_length"], a.get("micro_batch_size", 1), a["hidden_size"]
    L, tp = a["num_layers"], a.get("tensor_model_parallel_size", 1)
    pp = a.get("pipeline_model_parallel_size", 1)
    vpp = a.get("virtual_pipeline_model_parallel_size")
    ffn = a.get("ffn_hidden_size") or 4 * h
    V = padded_vocab_size(a["vocab_size"], 128, tp)
    per_layer = s * b * h * 18 + s * b * ffn * 4
    embed = 8 * s * b * pp + s * b * h * pp
    mem = per_layer * L + embed
    if vpp:
        mem *= 1 + (pp - 1) / (pp * vpp)
    elif pp > 1 and nmb is not None:
        mem *= min(1, nmb / pp)
    if pp == 1:
        mem += 4 * s * b * h + 4 * s * b * V
    return mem / tp


GPT_MHA = dict(num_layers=24, hidden_size=2048, num_attention_heads=16, seq_length=2048,
               vocab_size=50257, sequence_parallel=True, recompute_granularity="selective",
               global_batch_size=64, micro_batch_size=2)


@pytest.mark.parametrize(("tp", "pp", "vpp", "world"), [
    (1, 1, None, 8), (2, 1, None, 8), (4, 2, None, 16), (2, 4, 3, 32), (8, 4, None, 32),
    (2, 8, None, 128),  # 4 microbatches for PP=8: the 1F1B discount
])
def test_activation_matches_megatron_sp_selective(tp, pp, vpp, world):
    a = dict(GPT_MHA, tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp,
             virtual_pipeline_model_parallel_size=vpp)
    c = ModelConfig.from_args(a)
    dp = world // (tp * pp)
    nmb = a["global_batch_size"] // (a["micro_batch_size"] * dp)
    want = megatron_reference_activation_sp(a, nmb)
    if vpp:
        # Megatron scales the embedding's ids and mask by the interleaving penalty (5
        # microbatches here); the schedule holds the first chunk's for 7: 4 of the first round
        # of PP microbatches and 3 of the next before its first backward.
        s, b, h = a["seq_length"], a["micro_batch_size"], a["hidden_size"]
        want += (7 - pp * (1 + (pp - 1) / (pp * vpp))) * (8 * s * b + s * b * h) / tp
    assert activation_bytes(c, world).bytes_per_gpu == pytest.approx(want, rel=1e-12)


@pytest.mark.parametrize("tp", [1, 2, 4, 8])
def test_korthikanti_table2_per_layer(tp):
    """Table 2 (ffn = 4h, flash attention so no 5as/h term): TP only sbh(10 + 24/t);
    TP + SP sbh(34/t); full recompute keeps only the layer input, 2sbh (/t with SP)."""
    base = dict(GPT_MHA, tensor_model_parallel_size=tp, recompute_granularity=None)
    s, b, h = 2048, 2, 2048
    no_sp = ModelConfig.from_args(dict(base, sequence_parallel=False))
    sp = ModelConfig.from_args(dict(base, sequence_parallel=True))
    assert layer_activation_bytes(no_sp, False) == pytest.approx(s * b * h * (10 + 24 / tp))
    assert layer_activation_bytes(sp, False) == pytest.approx(s * b * h * 34 / tp)
    full = ModelConfig.from_args(dict(base, sequence_parallel=True, recompute_granularity="full",
                                      recompute_method="uniform", recompute_num_layers=1))
    a_full = activation_bytes(full, 8).bytes_per_gpu
    a_sel = activation_bytes(sp, 8).bytes_per_gpu
    V = full.padded_vocab_size
    extras = (8 * s * b + s * b * h) / tp + 4 * s * b * h / tp + 4 * s * b * V / tp
    # 24 layer inputs + one layer's working set during its recompute
    assert a_full == pytest.approx(24 * 2 * s * b * h / tp + s * b * h * 34 / tp + extras)
    assert a_full < a_sel


def test_moe_activation_scales_with_topk_and_cp_splits_sequence():
    c1 = ModelConfig.from_args(dict(GPT_MHA, num_experts=8, moe_router_topk=1,
                                    moe_ffn_hidden_size=8192))
    c2 = ModelConfig.from_args(dict(GPT_MHA, num_experts=8, moe_router_topk=2,
                                    moe_ffn_hidden_size=8192))
    dense = ModelConfig.from_args(GPT_MHA)
    d1 = layer_activation_bytes(c1, True) - layer_activation_bytes(dense, False)
    d2 = layer_activation_bytes(c2, True) - layer_activation_bytes(dense, False)
    s, b, h = 2048, 2, 2048
    # top-1 with moe ffn = dense ffn: the dispatched copy of the input (2sbh) and the fp32
    # router logits (4sbE) are new
    assert d1 == pytest.approx(2 * s * b * h + 4 * s * b * 8)
    assert d2 - d1 == pytest.approx(2 * s * b * h + 2 * s * b * 8192 * 2)
    cp2 = ModelConfig.from_args(dict(GPT_MHA, context_parallel_size=2))
    assert layer_activation_bytes(cp2, False) == pytest.approx(
        layer_activation_bytes(dense, False) / 2)


@pytest.mark.parametrize(("tp", "sp"), [(1, False), (2, True), (4, True)])
def test_qk_layernorm_keeps_the_query_and_key_norm_inputs(tp, sp):
    """Qwen3's per-head query and key norms save their bf16 inputs: per layer 2 bytes x
    s x b x (heads + query groups) x head dim, split over TP with the heads; in FP8 too (the
    QKV GEMM's output is bf16). Qwen3-30B-A3B at MBS 1: 2 x 4096 x (32 + 4) x 128 = 37.7 MB."""
    for fp8 in (None, "hybrid"):
        over = dict(tensor_model_parallel_size=tp, sequence_parallel=sp, fp8=fp8)
        without = layer_activation_bytes(cfg("qwen3-30b-a3b", qk_layernorm=False, **over), True)
        with_norms = layer_activation_bytes(cfg("qwen3-30b-a3b", **over), True)
        assert with_norms - without == pytest.approx(2 * 4096 * 1 * (32 + 4) * 128 / tp)


def test_the_precision_aware_optimizer_keeps_the_dtypes_it_names() -> None:
    """With `--use-precision-aware-optimizer` the distributed optimizer's shard keeps fp32 main
    parameters (4) and bf16 moments (2 + 2): 4 bytes less per parameter of the shard than
    Adam's fp32 state, and nothing changes without the flag."""
    over = dict(tensor_model_parallel_size=1, pipeline_model_parallel_size=1,
                use_distributed_optimizer=True, exp_avg_dtype="bf16", exp_avg_sq_dtype="bf16")
    world = 8
    plain = weight_and_optimizer_bytes(cfg("llama3-8b", **over), world)
    aware = weight_and_optimizer_bytes(
        cfg("llama3-8b", use_precision_aware_optimizer=True, **over), world)
    assert plain.bytes_per_gpu - aware.bytes_per_gpu == pytest.approx(
        plain.nonexpert_params_per_gpu / world * 4)
