"""The terms of a MoE layer in the performance model: the routed and shared experts' GEMMs and
element-wise work, the token dispatcher's traffic (alltoall, or flex: DeepEP / HybridEP) and the
host's wait on an FP8 forward's kernel launches, per microbatch on one GPU (docs/perf-model.md).

Its coefficients are chosen from hardware and software behaviour, not fitted; the host's FP8
forward is fitted (`slurmpod.perf.fitted.MOE_FP8_HOST_FORWARD_S`).
"""

from __future__ import annotations

import math

from slurmpod.megatron.runspec import ModelConfig
from slurmpod.perf.micro import (
    ELEMENTWISE_BYTES_FFN,
    Micro,
    gemm_eff,
    kernel_gap,
    mlp_cast_bytes,
)
from slurmpod.perf.options import RunOptions

# Grouped expert GEMMs (TE/cutlass grouped GEMM) against one GEMM of the same total size.
GROUPED_GEMM_FACTOR = 0.85
# Transformer Engine runs a grouped expert GEMM (GroupedLinear, Megatron's TEGroupedMLP) as one
# cuBLAS GEMM per local expert, round-robin over this many compute streams
# (`multi_stream_cublas_gemm`, `num_compute_streams = 4` in common/util/multi_stream.cpp; the
# default of `nvte_multi_tensor_gemm` unless NVTE_USE_CUTLASS_GROUPED_GEMM=1): each stream runs
# its share of the experts one after the other, a kernel gap apiece (_expert_gemm_gaps).
TE_COMPUTE_STREAMS = 4
# MoE token permutation and un-permutation with the router probabilities (gather, scatter-add,
# forward + backward), bytes per routed token x hidden.
MOE_PERMUTE_BYTES = 32.0
# All-to-all reaches less than a ring collective (many small messages, incast).
ALLTOALL_EFFICIENCY = 0.6
# Share of EP all-to-all hidden by overlap_moe_expert_parallel_comm (Megatron main, 2025).
EP_OVERLAP_HIDDEN = 0.7
# The flex dispatcher (moe_token_dispatcher_type = "flex": DeepEP / HybridEP) sends a token once
# to each remote NVLink domain holding one of its experts and fans it out inside the domain
# over NVLink, once to each GPU holding one of its experts (DeepEP's dispatch layout,
# `is_token_in_rank`; the combine sums a GPU's experts before sending back). DeepEP README:
# normal kernels reach 43-47 GB/s of a 50 GB/s 400G NIC and 153-158 GB/s of H800's ~160 GB/s
# NVLink, ~0.9 of what a link gives a ring collective: this figure, on the NIC's or NVLink's own
# efficiency.
FLEX_EFFICIENCY = 0.9
# The host's forward is taken per FP8 Transformer Engine module it launches, each at the same
# cost (TransformerEngine issue 761 puts the FP8 overhead per module): the attention's QKV and
# output projection, or MLA's five (Q down and up, KV down and up, output; core 0.15
# `MLASelfAttention`), and the routed experts' fc1 and fc2 (and the shared experts' two). A
# DeepSeek-V3 layer launches 9 to Qwen3's 4. With the attention captured as a CUDA graph
# (`cuda_graph_scope` attn; Megatron's MoE guide gives `attn moe_router moe_preprocess` as the
# fix for a launch-bound MoE run) the host replays it at once and launches only the experts.
ATTENTION_FP8_MODULES = 2
MLA_FP8_MODULES = 5
EXPERT_FP8_MODULES = 2
# The most routed experts one GPU holds in any published run the model is checked on
# (tests/data/perf/published.toml: DeepSeek-V3's 256 at EP8; test_validation holds the figure to
# the table). Beyond it the terms for many small expert GEMMs (_expert_gemm_gaps, and a host
# forward counted per module, not per GEMM) are unchecked: `plan` and its search say so.
CHECKED_EXPERTS_PER_GPU = 32


def unchecked_experts(c: ModelConfig) -> int | None:
    """The routed experts one GPU of `c` holds when more than any published run the model is
    checked on (CHECKED_EXPERTS_PER_GPU), else None."""
    return local_experts_beyond_checked(c.num_experts, c.ep)


def local_experts_beyond_checked(experts: int | None, ep: int) -> int | None:
    """`experts` routed experts over `ep` GPUs, per GPU, when beyond CHECKED_EXPERTS_PER_GPU."""
    local = (experts or 0) // max(1, ep)
    return local if local > CHECKED_EXPERTS_PER_GPU else None


def _flex_time(tokens: float, h: int, topk: float, gpus_hit: float, domains: int,
               opts: RunOptions, nvl: float, nic: float) -> float:
    """One dispatch or combine pass of the flex dispatcher over `domains` NVLink domains:
    each token crosses the fabric once per remote domain holding one of its experts, then
    fans out over NVLink inside that domain to the GPUs holding them (`gpus_hit` in all)."""
    groups = opts.moe_num_groups or 0
    if opts.moe_group_topk and groups >= domains and groups % domains == 0:
        # Node-limited routing: the experts lie in moe_group_topk of the groups, each group
        # inside one domain; expected distinct domains among those groups.
        per = groups // domains
        k = min(opts.moe_group_topk, groups)
        miss = math.comb(groups - per, k) / math.comb(groups, k)
        chosen = domains * (1 - miss)
    else:
        # Experts drawn uniformly: expected number of distinct domains among top-k picks.
        chosen = domains * (1 - (1 - 1 / domains) ** topk)
    remote = chosen * (1 - 1 / domains)
    fabric = tokens * remote * h * 2 / nic
    inside = tokens * gpus_hit * h * 2 / nvl
    return max(fabric, inside) / FLEX_EFFICIENCY


def _gpus_hit(experts: int, gpus: int, topk: int, opts: RunOptions) -> float:
    """Expected number of the `gpus` expert-parallel ranks (experts / gpus experts each) that hold
    one of a token's top-k experts, the experts drawn uniformly (force-balanced routing, as the
    published benchmarks run): what the flex dispatcher sends a token to, once each. Under
    node-limited routing (`moe_router_group_topk` of `moe_router_num_groups` groups, each group
    a contiguous block of experts, so of ranks) the picks lie in the chosen groups' ranks only."""
    groups, chosen = opts.moe_num_groups or 0, opts.moe_group_topk or 0
    if chosen and groups > chosen and experts % groups == 0 and (
            groups % gpus == 0 or gpus % groups == 0):
        if groups >= gpus:  # whole groups per rank: distinct ranks among the chosen groups
            per = groups // gpus
            return gpus * (1 - math.comb(groups - per, chosen) / math.comb(groups, chosen))
        gpus, experts = chosen * gpus // groups, chosen * experts // groups
    per = max(1, experts // gpus)
    if experts - per < topk:
        return float(gpus)
    return gpus * (1 - math.comb(experts - per, topk) / math.comb(experts, topk))


def _routed_tokens(u: Micro) -> float:
    """Routed token copies one GPU handles per microbatch (top-k, busiest expert's share)."""
    return u.tok * u.c.moe_router_topk * u.opts.moe_imbalance / u.c.tp


def moe_mlp(u: Micro) -> tuple[float, float]:
    """A MoE MLP: (GEMM seconds of the routed experts' grouped GEMMs, the shared experts and the
    router; element-wise, permutation and FP8-cast bytes). Zero for a model without experts."""
    c, k, tok, tp, etp = u.c, u.k, u.tok, u.c.tp, u.c.etp
    if not k.n_moe:
        return 0.0, 0.0
    h = c.hidden_size
    n_exp = c.num_experts or 1
    per_expert = tok * c.moe_router_topk * c.ep * etp / (tp * n_exp)  # tokens per expert GEMM
    d_exp = min(h, c.moe_ffn_hidden_size / etp, per_expert)
    t_gemm = (6.0 + 2.0 * u.rec_moe) * tok * k.moe_routed * u.opts.moe_imbalance / tp / (
        u.peak_mm * gemm_eff(d_exp) * GROUPED_GEMM_FACTOR)
    if k.moe_shared:
        t_gemm += (6.0 + 2.0 * u.rec_shared) * tok * k.moe_shared / tp / (
            u.peak_mm * gemm_eff(min(h, c.moe_shared_expert_intermediate_size / tp)))
    t_gemm += 6.0 * tok * k.router / tp / u.peak16 + _expert_gemm_gaps(u)
    routed = _routed_tokens(u)
    # The fused grouped MLP keeps the experts' activation on chip: neither its element-wise
    # pass nor the FP8 casts of fc1's output gradient and fc2's input touch HBM.
    fused = u.opts.fused_expert_mlp
    mem = ((0.0 if fused else ELEMENTWISE_BYTES_FFN * routed * c.moe_ffn_hidden_size / etp)
           + ELEMENTWISE_BYTES_FFN * tok * c.moe_shared_expert_intermediate_size / tp
           + MOE_PERMUTE_BYTES * routed * h)
    cast = mlp_cast_bytes(u, routed, 0.0 if fused else c.moe_ffn_hidden_size / etp)
    if c.moe_shared_expert_intermediate_size:
        cast += mlp_cast_bytes(u, tok, c.moe_shared_expert_intermediate_size / tp,
                                tp if u.sp else 1)
    return t_gemm, mem + cast


def _expert_gemm_gaps(u: Micro) -> float:
    """Kernel gaps of the routed experts' grouped GEMMs beyond the one each counts among a MoE
    layer's kernels: fc1 and fc2 forward, their dgrad and wgrad (+ the recomputed forward),
    each one GEMM per local expert, TE_COMPUTE_STREAMS at a time. Why a layout with many local
    experts (little or no expert parallelism) launches slower than its FLOPs say. None with the
    op fuser's grouped MLP (one kernel for every expert)."""
    if u.opts.fused_expert_mlp:
        return 0.0
    local = (u.c.num_experts or 1) // u.c.ep
    serial = math.ceil(local / TE_COMPUTE_STREAMS) - 1
    return (6.0 + 2.0 * u.rec_moe) * serial * kernel_gap(u)


def ep_time(u: Micro) -> float:
    """The MoE dispatcher's traffic, per MoE layer: 2 passes forward (dispatch, combine), 2
    backward (+2 recomputed), hidden in part by `overlap_moe_expert_parallel_comm`.

    EP: the all-to-alls, over NVLink inside the domain, the rails outside it; the flex
    dispatcher's one copy per remote domain, and inside a domain one per GPU holding the
    token's experts. ETP: after the all-to-all the dispatcher all-gathers the
    routed token copies over the expert-tensor group, and before the all-to-all back it
    reduce-scatters the experts' partial outputs (core 0.15 `MoEAlltoAllTokenDispatcher`
    dispatch_postprocess, combine_preprocess), each moving (etp - 1) times a GPU's routed
    copies. They replace a dense MLP's two sequence-parallel collectives: with etp 1 each TP
    rank routes its own sequence shard and the MoE MLP moves nothing over TP (_layer)."""
    c, hw, ep, etp = u.c, u.hw, u.c.ep, u.c.etp
    if not u.k.n_moe or (ep <= 1 and etp <= 1):
        return 0.0
    h = c.hidden_size
    passes = 4 + 2 * max(u.rec, u.rec_moe)
    span = ep * etp
    routed = _routed_tokens(u)
    t_ep = 0.0
    if ep > 1:
        copies = routed * h * 2 * (ep - 1) / ep  # bytes one pass sends, all peers
        if not u.opts.moe_flex and span <= hw.domain_gpus:
            t_ep = passes * copies / u.nvl / ALLTOALL_EFFICIENCY
        elif u.opts.moe_flex:
            hit = _gpus_hit(c.num_experts or 1, ep, c.moe_router_topk, u.opts) \
                * u.opts.moe_imbalance
            if span <= hw.domain_gpus:
                # One copy per other GPU holding one of the token's experts.
                t_ep = passes * (u.tok / c.tp) * hit * (ep - 1) / ep * h * 2 / u.nvl \
                    / FLEX_EFFICIENCY
            else:
                t_ep = passes * _flex_time(u.tok / c.tp, h,
                                           c.moe_router_topk * u.opts.moe_imbalance, hit,
                                           span // hw.domain_gpus, u.opts, u.nvl, u.nic)
        else:
            outside = 1 - hw.domain_gpus / span
            t_ep = passes * copies * max((1 - outside) / u.nvl, outside / u.nic) \
                / ALLTOALL_EFFICIENCY
    if etp > 1:
        bw = u.nvl if etp <= hw.domain_gpus else u.nic  # the expert-tensor group is innermost
        t_ep += passes * routed * h * 2 * (etp - 1) / bw
    if u.opts.ep_overlap:
        t_ep *= 1 - EP_OVERLAP_HIDDEN
    return t_ep


def host_wait(u: Micro, moe_compute: float, attention: float, t_ep: float) -> float:
    """Seconds the GPU waits on the host in one MoE layer's forward (and its recomputed
    forward), per microbatch: what the host's forward (MOE_FP8_HOST_FORWARD_S per the four
    modules of its calibration layer, for the modules this layer launches) exceeds of the
    forward's own GPU time (its share of the GEMM passes, 2 of 6 + 2 recomputed; of the
    all-to-alls, 2 of 4 + 2). Zero in BF16, or with the iteration captured as one CUDA graph
    (nothing is launched). With the attention graphed, the host launches only the experts'
    modules by hand, against the GPU time of the layer less its attention (the graph runs while
    the host waits at the next layer's token-count copy)."""
    if not u.fp8 or u.opts.graphed_iteration:
        return 0.0
    rec = max(u.rec, u.rec_moe)
    launched = EXPERT_FP8_MODULES * (2 if u.k.moe_shared else 1)
    if u.opts.graphed_attention:
        moe_compute -= attention
    else:
        launched += _attention_fp8_modules(u.c)
    host = u.host_forward * launched / (ATTENTION_FP8_MODULES + EXPERT_FP8_MODULES)
    forward = moe_compute * (1 + rec) / (3 + rec) + t_ep * (1 + rec) / (2 + rec)
    return max(0.0, (1 + rec) * host - forward)


def _attention_fp8_modules(c: ModelConfig) -> int:
    """Transformer Engine linear modules of one layer's attention: QKV and the output
    projection; MLA's down- and up-projections of Q (one projection without `q_lora_rank`) and
    of KV, and the output projection (core 0.15 `MLASelfAttention`)."""
    if not c.multi_latent_attention:
        return ATTENTION_FP8_MODULES
    return MLA_FP8_MODULES - (0 if c.q_lora_rank else 1)
