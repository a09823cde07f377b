"""The performance model: each term moves the way the hardware says it must."""

from __future__ import annotations

import dataclasses

import pytest

from slurmpod.megatron.memory import layer_activation_bytes, weight_and_optimizer_bytes
from slurmpod.megatron.runspec import ModelConfig, load_run, preset_path
from slurmpod.perf.fitted import FITTED, MOE_FP8_HOST_FORWARD_S
from slurmpod.perf.hardware import Hardware
from slurmpod.perf.micro import GRAPHED_KERNEL_GAP_S, HBM_EFFICIENCY, KERNEL_GAP_S, layer_costs
from slurmpod.perf.model import (
    CPU_ADAM_BYTES_PER_PARAM,
    HOST_LINK_EFFICIENCY,
    HOST_MEMORY_EFFICIENCY,
    OPTIMIZER_BYTES_PER_PARAM,
    Prediction,
    predict,
)
from slurmpod.perf.moe import TE_COMPUTE_STREAMS
from slurmpod.perf.options import RunOptions

H100 = Hardware(gpu_model="h100", generation="hopper", peak_bf16=989, peak_fp8=1979,
                hbm_tb_s=3.35, nvlink_gb_s=450, domain_gpus=8, gpus_per_node=8, nic_gb_s=50)


def cfg(preset: str, **kw: object) -> ModelConfig:
    c = ModelConfig.from_args(load_run(preset_path(preset)).megatron)
    return dataclasses.replace(c, **kw)


def on_config(c: ModelConfig, opts: dict[str, object]) -> ModelConfig:
    """`fp8=True` / `grad_reduce_bytes=2` among a test's options: they belong to the config
    (ModelConfig.fp8, grad_bytes), which memory and the model both read."""
    if opts.pop("fp8", False):
        c = dataclasses.replace(c, fp8="hybrid")
    grad = opts.pop("grad_reduce_bytes", None)
    return c if grad is None else dataclasses.replace(c, grad_bytes=grad)


def step(c: ModelConfig, world: int, hw: Hardware = H100, **opts: object) -> float:
    c = on_config(c, opts)
    p = predict(c, world, hw, FITTED["hopper"], RunOptions(**opts))  # type: ignore[arg-type]
    assert p is not None
    return p.step_time_s


def test_prediction_fields_add_up() -> None:
    c = cfg("llama3-70b")
    p = predict(c, 128, H100)
    assert p is not None
    b = p.breakdown_s
    parts = b["compute"] + b["host"] + b["offload"] + b["tp"] + b["cp"] + b["pp_bubble"] + \
        b["pp_p2p"] + b["dp"] + b["ep"] + b["optimizer"]
    assert parts == pytest.approx(p.step_time_s, rel=1e-9)
    assert b["exposed_communication"] == pytest.approx(
        b["tp"] + b["cp"] + b["ep"] + b["dp"] + b["pp_p2p"])
    assert 0 < p.mfu < 1
    tokens = c.global_batch_size * c.seq_length  # type: ignore[operator]
    assert p.tokens_per_s_per_gpu == pytest.approx(tokens / (p.step_time_s * 128))


def test_no_batch_or_indivisible_world_gives_none() -> None:
    assert predict(cfg("llama3-8b", global_batch_size=None), 8, H100) is None
    assert predict(cfg("llama3-70b"), 100, H100) is None


def test_full_recompute_costs_time_and_fp8_saves_it() -> None:
    base = cfg("llama3-70b", recompute_granularity="selective")
    full = dataclasses.replace(base, recompute_granularity="full", recompute_method="uniform",
                               recompute_num_layers=1)
    assert step(full, 128) > 1.2 * step(base, 128)
    assert step(base, 128, fp8=True) < 0.8 * step(base, 128)


def test_more_microbatches_shrink_the_bubble_and_vpp_shrinks_it_more() -> None:
    c = cfg("llama3-70b", cp=1, vpp=None)
    small = predict(dataclasses.replace(c, global_batch_size=64), 128, H100)
    big = predict(dataclasses.replace(c, global_batch_size=512), 128, H100)
    assert small and big
    assert small.breakdown_s["pp_bubble"] / small.step_time_s > \
        big.breakdown_s["pp_bubble"] / big.step_time_s
    inter = predict(dataclasses.replace(c, global_batch_size=64, vpp=5), 128, H100)
    assert inter and inter.breakdown_s["pp_bubble"] == pytest.approx(
        small.breakdown_s["pp_bubble"] / 5, rel=0.05)


def test_tp_across_the_nvlink_domain_is_slower() -> None:
    c = cfg("llama3-70b", tp=8, cp=1)
    one_domain = step(c, 128)
    four_gpu_domains = step(c, 128, dataclasses.replace(H100, domain_gpus=4))
    assert four_gpu_domains > one_domain


def test_overlap_flags_hide_communication() -> None:
    c = cfg("llama3-70b")
    plain = predict(c, 128, H100)
    hidden = predict(c, 128, H100, None, RunOptions(tp_comm_overlap=True,
                                                    overlap_grad_reduce=True,
                                                    overlap_param_gather=True))
    assert plain and hidden
    assert hidden.breakdown_s["tp"] < plain.breakdown_s["tp"]
    assert hidden.breakdown_s["dp"] < plain.breakdown_s["dp"]


def test_expert_parallel_over_the_fabric_costs_more_than_inside_a_node() -> None:
    c = cfg("qwen3-30b-a3b", global_batch_size=256)
    inside = predict(dataclasses.replace(c, ep=8), 64, H100)
    across = predict(dataclasses.replace(c, ep=32), 64, H100)
    assert inside and across
    assert across.breakdown_s["ep"] > inside.breakdown_s["ep"]
    assert inside.breakdown_s["ep"] > 0


def test_a_moe_mlp_moves_its_tokens_over_the_expert_tensor_group_not_tp() -> None:
    """With ETP 1 each TP rank routes its own sequence shard: a MoE layer keeps only the
    attention's TP collectives, half a dense layer's. With ETP > 1 the dispatcher all-gathers
    the routed copies (top-k per token) and reduce-scatters the partial outputs over the
    expert-tensor group: per pass top-k x (etp - 1) / ((tp - 1) / tp) times an attention
    collective, 8x for Qwen3 at TP = ETP = 2."""
    moe = cfg("qwen3-30b-a3b", tp=2, pp=1, vpp=None, cp=1, ep=4, etp=1,
              global_batch_size=64, micro_batch_size=1)
    dense = cfg("llama3-8b", tp=2, pp=1, vpp=None, cp=1, global_batch_size=64)
    one, two = predict(moe, 8, H100), predict(dataclasses.replace(moe, etp=2), 8, H100)
    assert one is not None and two is not None
    assert one.breakdown_s["tp"] == pytest.approx(two.breakdown_s["tp"], rel=1e-9)
    assert two.breakdown_s["ep"] - one.breakdown_s["ep"] == pytest.approx(
        moe.moe_router_topk * one.breakdown_s["tp"], rel=1e-6)
    # The attention's half: per layer and token, a MoE layer's TP traffic is half a dense one's.
    d = predict(dense, 8, H100)
    assert d is not None
    per_layer_token = [p.breakdown_s["tp"] / (c.num_layers * c.seq_length * c.hidden_size)
                       for p, c in ((one, moe), (d, dense))]
    assert per_layer_token[0] == pytest.approx(per_layer_token[1] / 2, rel=1e-6)


def test_context_parallel_ring_is_hidden_behind_attention_on_nvlink() -> None:
    c = cfg("llama3-8b", seq_length=65536, global_batch_size=16, cp=8, tp=1)
    p = predict(c, 64, H100)
    assert p is not None and p.breakdown_s["cp"] == 0.0
    slow_net = dataclasses.replace(H100, nvlink_gb_s=5, nic_gb_s=1)
    q = predict(c, 64, slow_net)
    assert q is not None and q.breakdown_s["cp"] > 0


def test_options_read_megatron_argument_names() -> None:
    o = RunOptions.from_args({"fp8": "hybrid", "tp_comm_overlap": True,
                              "overlap_grad_reduce": True, "grad_reduce_in_bf16": True})
    assert o.tp_comm_overlap and o.overlap_grad_reduce and not o.overlap_param_gather


def _ep_time_on(c: ModelConfig, hw: Hardware, world: int = 1024, **opts: object) -> float:
    c = on_config(c, opts)
    p = predict(c, world, hw, FITTED[hw.generation], RunOptions(**opts))  # type: ignore[arg-type]
    assert p is not None
    return p.breakdown_s["ep"]


def _ep_time(c: ModelConfig, world: int, **opts: object) -> float:
    return _ep_time_on(c, H100, world, **opts)


def test_flex_dispatcher_crosses_the_fabric_once_per_remote_domain() -> None:
    """DeepSeek-V3 at EP64 over 8 nodes: the flex dispatcher sends a token once per remote
    node holding one of its experts; node-limited routing (4 of 8 groups) caps those nodes."""
    c = cfg("deepseek-v3", tp=2, pp=8, ep=64, etp=1, sequence_parallel=True,
            global_batch_size=1024, pipeline_layout=None, vpp=None)
    plain = _ep_time(c, 1024)
    flex = _ep_time(c, 1024, moe_flex=True)
    limited = _ep_time(c, 1024, moe_flex=True, moe_num_groups=8, moe_group_topk=4)
    assert limited < flex < plain
    # 8 top-k picks over 8 nodes reach ~5.3 of them, 4 groups exactly 4: 7/8 of those remote.
    assert flex / limited == pytest.approx((8 * (1 - (7 / 8) ** 8)) / 4, rel=0.02)



def test_flex_dispatcher_sends_a_token_once_to_each_gpu_holding_its_experts() -> None:
    """Inside one NVLink domain (EP8, 32 of DeepSeek-V3's 256 experts per GPU) the alltoall
    dispatcher sends each of a token's 8 routed copies; the flex one sends the token once to
    each other GPU holding one of its experts, at DeepEP's share of NVLink (0.9, not 0.6)."""
    from math import comb

    c = cfg("deepseek-v3", tp=2, pp=8, ep=8, etp=1, sequence_parallel=True,
            global_batch_size=1024, pipeline_layout=None, vpp=None)
    plain, flex = _ep_time(c, 1024), _ep_time(c, 1024, moe_flex=True)
    gpus_hit = 8 * (1 - comb(256 - 32, 8) / comb(256, 8))  # ~5.5 of 8 GPUs
    assert flex / plain == pytest.approx(gpus_hit / 8 * 0.6 / 0.9, rel=1e-9)
    # One expert per GPU: every routed copy goes to its own GPU, nothing to merge.
    one = dataclasses.replace(c, num_experts=8)
    assert _ep_time(one, 1024, moe_flex=True) / _ep_time(one, 1024) == pytest.approx(0.6 / 0.9)
    # DeepSeek-V3's node-limited routing, 4 of 8 groups of 32 experts: at EP8 a group is one
    # GPU, so a token reaches exactly 4 GPUs; at EP32 a group spans 4 GPUs, and its 8 picks fall
    # on the 16 GPUs of the 4 chosen groups (128 experts, 8 each).
    limited = _ep_time(c, 1024, moe_flex=True, moe_num_groups=8, moe_group_topk=4)
    assert limited / flex == pytest.approx(4 / gpus_hit, rel=1e-9)
    c32 = dataclasses.replace(c, ep=32)
    hit32 = 32 * (1 - comb(256 - 8, 8) / comb(256, 8))
    limited32 = 16 * (1 - comb(128 - 8, 8) / comb(128, 8))
    assert _ep_time_on(c32, GB200, moe_flex=True, moe_num_groups=8, moe_group_topk=4) / \
        _ep_time_on(c32, GB200, moe_flex=True) == pytest.approx(limited32 / hit32, rel=1e-9)


def test_selective_recompute_of_the_mlp_costs_its_forward() -> None:
    c = cfg("llama3-70b", tp=8, pp=4, vpp=None, recompute_granularity="selective")
    base = step(dataclasses.replace(c, recompute_modules=("core_attn",)), 128)
    mlp = step(dataclasses.replace(c, recompute_modules=("core_attn", "mlp")), 128)
    full = step(dataclasses.replace(c, recompute_granularity="full",
                                    recompute_method="uniform", recompute_num_layers=1), 128)
    assert base < mlp < full


def test_selective_recompute_of_mla_up_projections_costs_their_forward() -> None:
    """`mla_up_proj` runs MLA's Q and KV up-projection GEMMs forward again: a cost for
    DeepSeek-V3, bounded by those GEMMs' own forward; a model without MLA has none to redo."""

    c = cfg("deepseek-v3", tp=1, pp=4, vpp=None, ep=8, etp=1, global_batch_size=256,
            pipeline_layout=None, recompute_granularity="selective",
            recompute_modules=("core_attn",))
    up = dataclasses.replace(c, recompute_modules=("core_attn", "mla_up_proj"))
    extra = step(up, 256) - step(c, 256)
    k = layer_costs(c)
    assert k.mla_up == 1536 * 128 * (128 + 64) + 512 * 128 * (128 + 128)
    ceiling = 2 * c.seq_length * k.mla_up / (989e12 * FITTED["hopper"].gemm * 0.5)
    m = 256 // (256 // 4)  # microbatches; with the bubble, PP - 1 more microbatch-times
    layers = c.stage_layers()[1]
    assert 0 < extra < ceiling * (m + 3) * layers
    dense = cfg("llama3-8b", tp=1, pp=1, vpp=None, cp=1, global_batch_size=256,
                recompute_granularity="selective")
    assert step(dataclasses.replace(dense, recompute_modules=("core_attn", "mla_up_proj")),
                8) == step(dense, 8)


def test_kernel_gaps_favour_fewer_larger_kernels() -> None:
    """The same tokens in twice-larger microbatches launch half the kernels per token."""
    from slurmpod.perf import model

    c = cfg("llama3-8b", tp=1, pp=1, vpp=None, cp=1, global_batch_size=256)
    one = predict(c, 8, H100)
    two = predict(dataclasses.replace(c, micro_batch_size=2), 8, H100)
    assert one is not None and two is not None
    assert two.breakdown_s["compute"] < one.breakdown_s["compute"]
    gaps = KERNEL_GAP_S * model.DENSE_LAYER_KERNELS * 32 * 32  # layers x microbatches
    assert one.breakdown_s["compute"] - two.breakdown_s["compute"] == pytest.approx(
        gaps / 2, rel=0.05)


def test_options_read_the_switches_of_newer_recipes() -> None:
    """Megatron main's names, as a run spec's [megatron] or an arguments dump gives them."""
    o = RunOptions.from_args({"cuda_graph_impl": "full_iteration",
                              "fp8_dot_product_attention": True,
                              "use_transformer_engine_op_fuser": "True"})
    assert o.graphed_iteration and o.fp8_attention and o.fused_expert_mlp
    o = RunOptions.from_args({"cuda_graph_impl": "transformer_engine",
                              "fp8_dot_product_attention": "False",
                              "use_transformer_engine_op_fuser": None})
    assert not (o.graphed_iteration or o.fp8_attention or o.fused_expert_mlp)


@pytest.mark.parametrize(("args", "graphed"), [
    ({"cuda_graph_impl": "full_iteration"}, True),  # main
    ({"cuda_graph_impl": "local", "cuda_graph_scope": "full_iteration"}, True),  # core 0.15
    ({"enable_cuda_graph": True, "cuda_graph_scope": "full_iteration"}, True),  # core 0.13-0.14
    ({"enable_cuda_graph": "True", "cuda_graph_scope": "full_iteration"}, True),  # a dump
    ({"cuda_graph_impl": "local", "cuda_graph_scope": "full"}, False),  # per-layer graphs
    ({"cuda_graph_impl": "transformer_engine", "cuda_graph_scope": ["attn"]}, False),
    ({"cuda_graph_scope": "full_iteration"}, False),  # a scope without graphs on
    ({"cuda_graph_impl": "none"}, False),
])
def test_the_full_iteration_graph_in_every_releases_spelling(args: dict, graphed: bool) -> None:
    assert RunOptions.from_args(args).graphed_iteration is graphed


def test_switches_name_what_the_prediction_counts_in_megatrons_words() -> None:
    plain = cfg("llama3-8b", fp8=None, grad_bytes=4)
    assert RunOptions().switches(plain) == []
    args = {"fp8": "hybrid", "overlap_grad_reduce": True, "grad_reduce_in_bf16": True,
            "moe_token_dispatcher_type": "flex", "moe_router_num_groups": 8,
            "moe_router_group_topk": 4, "moe_imbalance": 1.25}
    # The precision and the gradient bytes are the config's (memory reads them too).
    config = ModelConfig.from_args(load_run(preset_path("llama3-8b")).megatron.values() | args)
    assert RunOptions.from_args(args).switches(config) == [
        "fp8", "overlap_grad_reduce", "grad_reduce_in_bf16", "moe_token_dispatcher_type=flex",
        "moe_router_group_topk=4 of 8", "moe_imbalance=1.25"]
    offload = {"optimizer_cpu_offload": True, "overlap_cpu_optimizer_d2h_h2d": True,
               "cpu_offloading": True, "cpu_offloading_num_layers": 4}
    config = ModelConfig.from_args(load_run(preset_path("llama3-8b")).megatron.values() | offload)
    assert RunOptions.from_args(offload).switches(config)[-3:] == [
        "optimizer_cpu_offload", "overlap_cpu_optimizer_d2h_h2d", "cpu_offloading"]
    # The overlap means nothing without the optimizer on the host.
    assert "overlap_cpu_optimizer_d2h_h2d" not in RunOptions(overlap_cpu_optimizer=True).switches(
        plain)


def _graphed_saving(**opts: bool) -> tuple[float, float]:
    """(compute seconds a CUDA graph option saves on Llama 3 8B on 8 H100, 32 layers x 32
    microbatches; its predicted step)."""
    c = cfg("llama3-8b", tp=1, pp=1, vpp=None, cp=1, global_batch_size=256)
    plain, graphed = predict(c, 8, H100), predict(
        c, 8, H100, FITTED["hopper"], RunOptions(**opts))
    assert plain is not None and graphed is not None
    return plain.breakdown_s["compute"] - graphed.breakdown_s["compute"], graphed.step_time_s


def test_a_graphed_iteration_leaves_a_quarter_of_each_kernel_gap() -> None:
    from slurmpod.perf import model

    saved, _ = _graphed_saving(graphed_iteration=True)
    gaps = (KERNEL_GAP_S - GRAPHED_KERNEL_GAP_S) * model.DENSE_LAYER_KERNELS \
        * 32 * 32  # layers x microbatches
    assert saved == pytest.approx(gaps, rel=1e-6)


def test_an_attention_graph_replays_the_attentions_kernels_at_the_graphed_gap() -> None:
    """`cuda_graph_scope` attn: the attention block's kernels (and its CP ring steps) leave the
    graphed gap; the rest of the layer keeps the launched one."""
    from slurmpod.perf import model

    saved, step = _graphed_saving(graphed_attention=True)
    gaps = (KERNEL_GAP_S - GRAPHED_KERNEL_GAP_S) * model.ATTENTION_LAYER_KERNELS \
        * 32 * 32  # layers x microbatches
    assert saved == pytest.approx(gaps, rel=1e-6)
    assert _graphed_saving(graphed_iteration=True)[1] < step


def test_an_fp8_moe_forward_waits_on_the_host_unless_graphed_or_bf16() -> None:
    """MOE_FP8_HOST_FORWARD_S floors each MoE layer's forward per microbatch: BF16, a CUDA-
    graphed iteration and dense layers never wait; a larger micro-batch hides it (the same host
    work, more GPU work); what waits is counted under `host`, apart from compute."""

    moe = cfg("qwen3-30b-a3b", tp=1, pp=1, vpp=None, cp=1, ep=8, etp=1, global_batch_size=256,
              micro_batch_size=1)

    def host(c: ModelConfig, **opts: object) -> float:
        c = on_config(c, opts)
        p = predict(c, 8, H100, FITTED["hopper"], RunOptions(**opts))  # type: ignore[arg-type]
        assert p is not None
        return p.breakdown_s["host"]

    waits = host(moe, fp8=True)
    assert waits > 0
    # At most the floor itself per MoE layer and microbatch (the GPU's own forward counts).
    assert waits < MOE_FP8_HOST_FORWARD_S * moe.num_moe_layers * 32
    assert host(moe) == 0.0  # BF16
    assert host(moe, fp8=True, graphed_iteration=True) == 0.0
    assert host(cfg("llama3-8b", tp=1, pp=1, vpp=None, cp=1, global_batch_size=256),
                fp8=True) == 0.0  # no MoE layer: no per-layer sync
    bigger = dataclasses.replace(moe, micro_batch_size=4)
    assert host(bigger, fp8=True) < waits
    # A host twice as slow waits longer: the floor, not a share of compute.
    slow = dataclasses.replace(FITTED["hopper"],
                               moe_fp8_host_forward_s=2 * MOE_FP8_HOST_FORWARD_S)
    p = predict(dataclasses.replace(moe, fp8="hybrid"), 8, H100, slow)
    assert p is not None and p.breakdown_s["host"] > 2 * waits


@pytest.mark.parametrize(("args", "attention"), [
    ({"cuda_graph_impl": "transformer_engine",
      "cuda_graph_scope": ["attn", "moe_router", "moe_preprocess"]}, True),  # a run spec, 0.16
    ({"cuda_graph_impl": "transformer_engine",
      "cuda_graph_scope": "[<CudaGraphScope.attn: 1>, <CudaGraphScope.moe_router: 5>]"},
     True),  # core 0.16's arguments dump
    ({"cuda_graph_impl": "transformer_engine", "cuda_graph_modules": "['attn']"}, True),  # main
    ({"cuda_graph_impl": "local", "cuda_graph_scope": "attn"}, True),
    ({"cuda_graph_impl": "transformer_engine",
      "cuda_graph_scope": ["moe_router", "moe_preprocess"]}, False),  # no attention graph
    ({"cuda_graph_impl": "none", "cuda_graph_scope": ["attn"]}, False),  # graphs off
    ({"cuda_graph_scope": "attn"}, False),
])
def test_the_attention_graph_in_every_releases_spelling(args: dict, attention: bool) -> None:
    assert RunOptions.from_args(args).graphed_attention is attention


def test_an_attention_graph_leaves_the_host_the_experts_share_of_the_layer() -> None:
    """With the attention replayed as a CUDA graph the host launches the experts' FP8 modules
    by hand (2 of the layer's 4; with shared experts 4 of 6), against the GPU time of the
    layer's MoE part: the wait shrinks but stays, and BF16 still never waits."""

    moe = cfg("qwen3-30b-a3b", tp=1, pp=1, vpp=None, cp=1, ep=8, etp=1, global_batch_size=256,
              micro_batch_size=1, fp8="hybrid")

    def host(c: ModelConfig, **opts: object) -> float:
        p = predict(c, 8, H100, FITTED["hopper"], RunOptions(**opts))  # type: ignore[arg-type]
        assert p is not None
        return p.breakdown_s["host"]

    plain, graphed = host(moe), host(moe, graphed_attention=True)
    assert 0 < graphed < plain
    # The floor halves (no shared experts): at most half the floor per layer and microbatch.
    assert graphed < MOE_FP8_HOST_FORWARD_S / 2 * moe.num_moe_layers * 32
    assert host(moe, graphed_attention=True, graphed_iteration=True) == 0.0
    assert host(dataclasses.replace(moe, fp8=None), graphed_attention=True) == 0.0
    # A slower host shows the share: the wait grows by half the extra floor per layer.
    slow = dataclasses.replace(FITTED["hopper"],
                               moe_fp8_host_forward_s=10 * MOE_FP8_HOST_FORWARD_S)
    fast = dataclasses.replace(FITTED["hopper"],
                               moe_fp8_host_forward_s=5 * MOE_FP8_HOST_FORWARD_S)
    waits = [predict(moe, 8, H100, e, RunOptions(graphed_attention=True)) for e in (fast, slow)]
    assert waits[0] is not None and waits[1] is not None
    assert waits[1].breakdown_s["host"] - waits[0].breakdown_s["host"] == pytest.approx(
        5 * MOE_FP8_HOST_FORWARD_S / 2 * moe.num_moe_layers * 32, rel=1e-6)
    assert "cuda_graph_scope=attn" in RunOptions(graphed_attention=True).switches(moe)


def _host_floor_share(c: ModelConfig, world: int, **opts: object) -> float:
    """The host floor of `c`'s MoE layer against MOE_FP8_HOST_FORWARD_S, read off the model:
    with a host slow enough that every layer waits, 5 more floors per layer and microbatch add
    5 x share of them to `host`."""
    from slurmpod.perf import model

    def wait(times: float) -> float:
        e = dataclasses.replace(FITTED["hopper"],
                                moe_fp8_host_forward_s=times * MOE_FP8_HOST_FORWARD_S)
        p = predict(c, world, H100, e, RunOptions(**opts))  # type: ignore[arg-type]
        assert p is not None
        return p.breakdown_s["host"]

    layers = model._stage_work(c, 0.0)[0][0] * c.num_moe_layers / c.num_layers
    microbatches = c.global_batch_size // (world // (c.tp * c.pp * c.cp)) // c.micro_batch_size
    return (wait(40) - wait(35)) / (5 * MOE_FP8_HOST_FORWARD_S * layers * microbatches)


def test_the_host_floor_counts_the_fp8_modules_the_host_launches() -> None:
    """MOE_FP8_HOST_FORWARD_S is the host's forward of a layer of standard attention (QKV,
    output projection) and routed experts (fc1, fc2): 4 Transformer Engine modules at one cost
    each. DeepSeek-V3's layer launches 9: MLA's five projections, the routed and the shared
    experts' two each; 8 without `q_lora_rank` (one Q projection). With the attention graphed
    only the experts' four stay."""
    qwen = cfg("qwen3-30b-a3b", tp=1, pp=1, vpp=None, cp=1, ep=8, etp=1, global_batch_size=64,
               micro_batch_size=1, fp8="hybrid")
    assert _host_floor_share(qwen, 8) == pytest.approx(1.0, rel=1e-6)
    assert _host_floor_share(qwen, 8, graphed_attention=True) == pytest.approx(0.5, rel=1e-6)
    dsv3 = cfg("deepseek-v3", tp=1, pp=1, vpp=None, cp=1, ep=8, etp=1, global_batch_size=64,
               micro_batch_size=1, fp8="hybrid")
    assert _host_floor_share(dsv3, 64) == pytest.approx(9 / 4, rel=1e-6)
    assert _host_floor_share(dsv3, 64, graphed_attention=True) == pytest.approx(1.0, rel=1e-6)
    no_q_lora = dataclasses.replace(dsv3, q_lora_rank=None)
    assert _host_floor_share(no_q_lora, 64) == pytest.approx(8 / 4, rel=1e-6)


def test_fp8_attention_gains_what_cudnn_measured_by_head_dimension() -> None:
    """FP8 attention runs the core at the BF16 attention rate times FP8_ATTENTION_GAIN (cuDNN's
    published SDPA benchmark), not at the FP8 GEMM peak: no gain at head dim 128 (Llama),
    1.35x at MLA's 192 (DeepSeek-V3); nothing moves in a BF16 run."""
    from slurmpod.perf import model

    c = cfg("llama3-8b", tp=1, pp=1, vpp=None, cp=1, global_batch_size=256, seq_length=16384)
    assert step(c, 8, fp8_attention=True) == step(c, 8)  # BF16 run: the switch does nothing
    assert step(c, 8, fp8=True, fp8_attention=True) == step(c, 8, fp8=True)  # head dim 128
    assert model.fp8_attention_gain(c) == 1.0
    d = cfg("deepseek-v3", tp=1, pp=1, vpp=None, cp=1, ep=8, etp=1, global_batch_size=64,
            micro_batch_size=1, seq_length=16384)
    assert d.multi_latent_attention and d.qk_head_dim + d.qk_pos_emb_head_dim == 192
    assert model.fp8_attention_gain(d) == 1.35
    assert step(d, 64, fp8=True, fp8_attention=True) < step(d, 64, fp8=True)
    # Only the core attention moves: it takes 1 / 1.35 of its BF16-rate time.
    k = layer_costs(d)
    core = 7.0 * 16384 * k.attn_core / (H100.peak_bf16 * 1e12 * FITTED["hopper"].gemm
                                       * model.ATTENTION_FACTOR)
    saved = step(d, 64, fp8=True) - step(d, 64, fp8=True, fp8_attention=True)
    layers = d.num_layers + d.mtp_num_layers
    microbatches = 64 // 64
    assert saved == pytest.approx(core * (1 - 1 / 1.35) * layers * microbatches, rel=1e-6)


def test_the_fused_expert_mlp_keeps_the_activation_off_hbm() -> None:
    c = cfg("qwen3-30b-a3b", tp=1, pp=1, vpp=None, cp=1, ep=8, etp=1, global_batch_size=512)
    for fp8 in (False, True):
        assert step(c, 8, fp8=fp8, fused_expert_mlp=True) < step(c, 8, fp8=fp8)
    dense = cfg("llama3-8b", tp=1, pp=1, vpp=None, cp=1, global_batch_size=256)
    assert step(dense, 8, fused_expert_mlp=True) == step(dense, 8)  # no experts: no change


def test_interleaving_widens_the_window_the_dp_overlap_hides_behind() -> None:
    """GPT-3 175B at TP4 PP8 on 128 GPUs: with one chunk the reduce-scatter hides behind one
    microbatch's backward; with VPP6 behind the cool-down's other chunks too."""
    c = cfg("gpt3-175b", tp=4, pp=8, cp=1, global_batch_size=256, micro_batch_size=1,
            sequence_parallel=True, use_distributed_optimizer=True)
    c = dataclasses.replace(c, fp8="hybrid")
    opts = RunOptions(overlap_grad_reduce=True, overlap_param_gather=True)
    one = predict(dataclasses.replace(c, vpp=None), 128, H100, None, opts)
    six = predict(dataclasses.replace(c, vpp=6), 128, H100, None, opts)
    plain = predict(dataclasses.replace(c, vpp=6), 128, H100, None, RunOptions())
    assert one and six and plain
    assert six.breakdown_s["dp"] < one.breakdown_s["dp"] < plain.breakdown_s["dp"]


def test_the_rank_holding_the_loss_runs_the_output_layer() -> None:
    """Llama 3 70B at PP8 x VPP5: an even split leaves 10 layers and the output layer on the
    last rank; the layout that gives the loss (and embedding) a slot is faster."""
    c = cfg("llama3-70b", tp=4, pp=8, vpp=5, cp=1, global_batch_size=128,
            micro_batch_size=1, sequence_parallel=True)
    even = step(c, 64, fp8=True)
    slots = step(dataclasses.replace(
        c, pipeline_layout="Et*2|(t*2|)*34,t*3|(t*2|)*3,tL"), 64, fp8=True)
    assert slots < even


GB200 = Hardware(gpu_model="gb200", generation="blackwell", peak_bf16=2500, peak_fp8=5000,
                 hbm_tb_s=8.0, nvlink_gb_s=900, domain_gpus=72, gpus_per_node=4, nic_gb_s=50)


def _dp(c: ModelConfig, world: int, hw: Hardware = H100, **opts: object) -> float:
    c = on_config(c, opts)
    p = predict(c, world, hw, FITTED[hw.generation], RunOptions(**opts))  # type: ignore[arg-type]
    assert p is not None
    return p.breakdown_s["dp"]


def test_megatron_fsdp_moves_its_shards_every_microbatch() -> None:
    """ZeRO-3 (`optim_grads_params`) gathers the parameters twice and reduce-scatters the
    gradients once per microbatch, the distributed optimizer once per step: with nothing
    overlapped the exposed DP time is exactly (2 AG + RS) x microbatches against AG + RS."""
    c = cfg("llama3-8b", tp=1, pp=1, cp=1, vpp=None, micro_batch_size=1, global_batch_size=64,
            use_distributed_optimizer=True, grad_bytes=2)
    world, m = 16, 64 // 16  # two nodes: the DP group crosses the fabric
    do = _dp(c, world, grad_reduce_bytes=2)
    z3 = _dp(dataclasses.replace(c, megatron_fsdp=True, fsdp_sharding="optim_grads_params"),
             world, grad_reduce_bytes=2)
    z2 = _dp(dataclasses.replace(c, megatron_fsdp=True, fsdp_sharding="optim_grads"), world,
             grad_reduce_bytes=2)
    # bf16 parameters and bf16 gradients: AG and RS move the same bytes, each do / 2.
    assert z3 == pytest.approx(m * 3 * do / 2, rel=1e-9)
    assert z2 == pytest.approx(m * do / 2 + do / 2, rel=1e-9)
    # Overlapped, a microbatch hides what its compute covers: far less, never below the tail.
    hidden = _dp(dataclasses.replace(c, megatron_fsdp=True, fsdp_sharding="optim_grads_params"),
                 world, grad_reduce_bytes=2, overlap_grad_reduce=True, overlap_param_gather=True)
    assert hidden < z3 / 2 and hidden >= 0.1 * z3 - 1e-12


def test_megatron_fsdp_shards_the_optimizer_step_and_says_so_in_its_sharding() -> None:
    c = cfg("llama3-8b", tp=1, pp=1, cp=1, vpp=None, use_distributed_optimizer=False)
    assert c.dp_sharding == "no_shard"
    assert dataclasses.replace(c, use_distributed_optimizer=True).dp_sharding == "optim"
    z3 = dataclasses.replace(c, megatron_fsdp=True, fsdp_sharding="optim_grads_params")
    assert z3.dp_sharding == "optim_grads_params"
    plain, sharded = (predict(x, 64, H100) for x in (c, z3))
    assert plain and sharded
    assert sharded.breakdown_s["optimizer"] < plain.breakdown_s["optimizer"] / 4


def test_data_parallel_stays_on_nvlink_inside_an_nvl72_rack() -> None:
    """GB200: 64 GPUs on 16 nodes of one NVLink domain reduce over NVLink (multi-node NVLink),
    not the 50 GB/s NIC; 144 GPUs span two domains and go to the fabric."""
    c = cfg("llama3-70b", tp=1, pp=1, cp=1, vpp=None, micro_batch_size=1,
            global_batch_size=144, use_distributed_optimizer=True, megatron_fsdp=True,
            fsdp_sharding="optim_grads_params")
    inside, across = _dp(c, 64, GB200), _dp(dataclasses.replace(c, global_batch_size=288), 144,
                                            GB200)
    # Per microbatch, not overlapped: the same bytes over 900 GB/s against 50 GB/s.
    assert across / (288 // 144) > 10 * inside / (144 // 64)


def _predict(c: ModelConfig, world: int, hw: Hardware, **opts: object) -> Prediction:
    p = predict(c, world, hw, FITTED[hw.generation], RunOptions(**opts))  # type: ignore[arg-type]
    assert p is not None
    return p


def test_activation_offload_shows_what_its_copies_take_beyond_the_compute_they_run_under() -> None:
    """Megatron-Bridge's GB200 Llama 3 70B preset: TP1 PP1, 40 of 80 layers' activations to the
    host. Each offloaded layer's copy out runs under the next forward, its copy back under a
    backward: on a host link fast enough nothing shows; on one slower than both each offloaded
    layer adds twice its copy less the layer's compute, so two slow links differ by exactly
    2 x layers x the copy-time difference, per microbatch."""
    c = cfg("llama3-70b", tp=1, pp=1, cp=1, vpp=None, micro_batch_size=2, global_batch_size=256,
            sequence_parallel=False, recompute_granularity=None, recompute_method=None,
            recompute_num_layers=None, pipeline_layout=None, account_for_embedding=False,
            account_for_loss=False, use_distributed_optimizer=True)
    world, m = 64, 256 // (64 * 2)
    off = dataclasses.replace(c, cpu_offloading_num_layers=40)
    plain = _predict(c, world, GB200)
    fast = dataclasses.replace(GB200, host_link_gb_s=1e5, host_memory_gb_s=1e5)
    assert _predict(off, world, fast).breakdown_s["offload"] == 0
    assert _predict(off, world, fast).step_time_s == pytest.approx(plain.step_time_s)

    act = layer_activation_bytes(off, False)
    slow = {gb: _predict(off, world, dataclasses.replace(GB200, host_link_gb_s=gb))
            for gb in (2.0, 4.0)}
    copy = {gb: act / (gb * 1e9 * HOST_LINK_EFFICIENCY) for gb in slow}
    assert slow[2.0].breakdown_s["offload"] - slow[4.0].breakdown_s["offload"] == pytest.approx(
        m * 40 * 2 * (copy[2.0] - copy[4.0]), rel=1e-9)
    assert slow[2.0].step_time_s - plain.step_time_s == pytest.approx(
        slow[2.0].breakdown_s["offload"], rel=1e-6)
    # Host memory slower than the link bounds the copies as the link would.
    mem_bound = dataclasses.replace(GB200, host_link_gb_s=1e5, host_memory_gb_s=2.0 * 0.8)
    assert _predict(off, world, mem_bound).breakdown_s["offload"] == pytest.approx(
        slow[2.0].breakdown_s["offload"], rel=1e-9)
    # Megatron offloads at most every layer but the last (TransformerConfig's check).
    everything = _predict(dataclasses.replace(c, cpu_offloading_num_layers=500), world,
                          dataclasses.replace(GB200, host_link_gb_s=2.0))
    assert everything.breakdown_s["offload"] == pytest.approx(
        slow[2.0].breakdown_s["offload"] * 79 / 40, rel=1e-9)


def test_optimizer_offload_steps_its_share_of_the_shard_on_the_host() -> None:
    """`optimizer_cpu_offload`: the offloaded share of the shard's fp32 gradients goes to the
    host, the CPU's Adam steps it (28 bytes of host memory per parameter), its fp32 parameters
    come back; one after the other, or overlapped as long as the slowest of the three. The
    GPU steps the rest at HBM speed."""
    c = cfg("llama3-8b", tp=1, pp=1, cp=1, vpp=None, use_distributed_optimizer=True)
    world = 8
    w = weight_and_optimizer_bytes(c, world)
    shard = w.nonexpert_params_per_gpu / world  # DP 8
    hbm = H100.hbm_tb_s * 1e12 * HBM_EFFICIENCY
    copy = shard * 4 / (H100.host_link_gb_s * 1e9 * HOST_LINK_EFFICIENCY)
    cpu = shard * CPU_ADAM_BYTES_PER_PARAM / (H100.host_memory_gb_s * 1e9 * HOST_MEMORY_EFFICIENCY)
    on_gpu = shard * OPTIMIZER_BYTES_PER_PARAM / hbm
    gpu_only = _predict(c, world, H100).breakdown_s["optimizer"]

    def opt(fraction: float, **opts: object) -> float:
        off = dataclasses.replace(c, optimizer_offload_fraction=fraction)
        return _predict(off, world, H100, **opts).breakdown_s["optimizer"]

    assert opt(1.0) == pytest.approx(gpu_only - on_gpu + 2 * copy + cpu, rel=1e-9)
    assert opt(1.0, overlap_cpu_optimizer=True) == pytest.approx(
        gpu_only - on_gpu + max(copy, cpu), rel=1e-9)
    assert opt(0.5) == pytest.approx(gpu_only - on_gpu / 2 + (2 * copy + cpu) / 2, rel=1e-9)
    # On a DGX H100 the host's Adam is far slower than the GPU's: offload costs time.
    assert opt(1.0) > 10 * gpu_only


def test_each_local_expert_is_its_own_gemm_launch_unless_the_mlp_is_fused() -> None:
    """Transformer Engine runs a grouped expert GEMM as one cuBLAS GEMM per local expert over
    4 compute streams. Qwen3-30B-A3B (128 experts, all 48 layers MoE) at MBS 4 gives every
    expert GEMM more tokens than its 768-wide FFN at EP 1 and EP 8 alike, so their math is the
    same; what differs is the launches: 6 grouped GEMMs per layer and microbatch (fc1, fc2:
    forward, dgrad, wgrad), each ceil(local / 4) - 1 kernel gaps beyond the one counted."""
    c = cfg("qwen3-30b-a3b", tp=1, pp=1, vpp=None, cp=1, micro_batch_size=4,
            global_batch_size=64, recompute_granularity=None, recompute_method=None,
            recompute_num_layers=None, fp8=None)
    world, m = 8, 64 // (4 * 8)

    def compute(ep: int, **opts: object) -> float:
        return _predict(dataclasses.replace(c, ep=ep), world, H100, **opts).breakdown_s["compute"]

    def gaps(local: int) -> float:
        return -(-local // TE_COMPUTE_STREAMS) - 1

    assert compute(1) - compute(8) == pytest.approx(
        m * 48 * 6 * (gaps(128) - gaps(16)) * KERNEL_GAP_S, rel=1e-6)
    # The op fuser's grouped MLP is one kernel for every expert: no per-expert launches.
    assert compute(1, fused_expert_mlp=True) == pytest.approx(
        compute(8, fused_expert_mlp=True), rel=1e-9)


def test_the_precision_aware_optimizer_steps_a_narrower_state() -> None:
    """`--use-precision-aware-optimizer` with bf16 moments keeps 8 bytes of state per
    parameter (fp32 main parameters 4, m 2, v 2) for Adam's 12: the step reads and writes it
    once, 2 x 4 bytes fewer per parameter of the shard, at HBM speed."""
    c = cfg("llama3-8b", tp=1, pp=1, cp=1, vpp=None, use_distributed_optimizer=True)
    world = 8
    shard = weight_and_optimizer_bytes(c, world).nonexpert_params_per_gpu / world  # DP 8
    hbm = H100.hbm_tb_s * 1e12 * HBM_EFFICIENCY
    narrow = dataclasses.replace(c, optimizer_state_bytes=8.0)
    full = _predict(c, world, H100).breakdown_s["optimizer"]
    assert _predict(narrow, world, H100).breakdown_s["optimizer"] == pytest.approx(
        full - shard * 2 * 4 / hbm, rel=1e-9)
