"""Analytical step-time model of a Megatron-LM training iteration (pure; docs/perf-model.md).

One iteration = the slowest pipeline stage running `m` microbatches (1F1B, or interleaved with
VPP chunks), plus the pipeline bubble, exposed p2p, the data-parallel gradient reduce-scatter
and parameter all-gather the distributed optimizer needs once per step, or Megatron-FSDP every
microbatch (what Megatron's overlap flags do not hide), and the optimizer step. Per
microbatch and layer it counts, on one GPU:

- GEMMs (projections, MLP, routed and shared experts, logits) at a size-dependent share of the
  dense tensor-core peak (BF16, or FP8 for the GEMMs Transformer Engine runs in FP8);
- core attention (flash/fused: forward 2, backward 5 matmuls; causal half; GQA/MLA widths);
- memory-bound element-wise work (norms, activations, residuals, MoE permutation, FP8 casts)
  at HBM bandwidth;
- TP all-gather/reduce-scatter (sequence parallel) on NVLink, CP ring K/V exchange (overlapped
  with attention), EP all-to-all on NVLink inside the domain and on the rails outside it;
- recompute: full recompute repeats the forward (GEMMs, element-wise work, TP and EP traffic);
  selective recompute repeats the forward of the modules it names (`mlp`, `moe`, `mla_up_proj`,
  ...), and `core_attn` costs nothing with flash attention (it already recomputes scores);
- kernel gaps between dependent kernels, each local expert's GEMM among them;
- the host: without CUDA graphs an FP8 MoE layer's forward waits on its kernel launches, for
  MOE_FP8_HOST_FORWARD_S per four Transformer Engine modules it launches (breakdown `host`);
- offload: activation copies to and from host memory beyond the compute they run under
  (breakdown `offload`), and the optimizer's offloaded share stepped on the host.

Every chosen coefficient is named below; the fitted ones (two per GPU generation at most, each
with the published point it was fitted on) live in `slurmpod.perf.fitted`. What the model reads
from the site is `slurmpod.perf.hardware.Hardware`; from the run's switches,
`slurmpod.perf.options.RunOptions`.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

from slurmpod.megatron.flops import attention_fmas_per_token, flops_per_token, mlp_fmas_per_token
from slurmpod.megatron.memory import (
    WeightMemory,
    layer_activation_bytes,
    weight_and_optimizer_bytes,
)
from slurmpod.megatron.runspec import FP32_ADAM_STATE_BYTES, ModelConfig
from slurmpod.perf.fitted import DEFAULT_EFFICIENCY, FITTED, Efficiency
from slurmpod.perf.hardware import Hardware
from slurmpod.perf.options import RunOptions

# --- chosen constants (not fitted) ---------------------------------------------------------------
# A GEMM whose smallest per-GPU dimension is d runs at d / (d + GEMM_HALF_DIM) of the large-GEMM
# efficiency: at 128 (one 128x128 tensor-core tile) tile quantisation and the epilogue cost
# about as much as the math.
GEMM_HALF_DIM = 128.0
# Grouped expert GEMMs (TE/cutlass grouped GEMM) against one GEMM of the same total size.
GROUPED_GEMM_FACTOR = 0.85
# Transformer Engine runs a grouped expert GEMM (GroupedLinear, Megatron's TEGroupedMLP) as one
# cuBLAS GEMM per local expert, round-robin over this many compute streams
# (`multi_stream_cublas_gemm`, `num_compute_streams = 4` in common/util/multi_stream.cpp; the
# default of `nvte_multi_tensor_gemm` unless NVTE_USE_CUTLASS_GROUPED_GEMM=1): each stream runs
# its share of the experts one after the other, a kernel gap apiece (_expert_gemm_gaps).
TE_COMPUTE_STREAMS = 4
# Flash/fused attention against a plain GEMM of the same FLOPs (softmax, masking, causal tiles).
ATTENTION_FACTOR = 0.7
# Share of HBM bandwidth element-wise kernels reach.
HBM_EFFICIENCY = 0.7
# Bytes moved per element by element-wise work of one layer, forward + backward (bf16): hidden-
# sized tensors (2 norms, 2 bias-dropout-add, RoPE on q/k) and FFN-sized ones (activation).
ELEMENTWISE_BYTES_HIDDEN = 56.0
ELEMENTWISE_BYTES_FFN = 16.0
# MoE token permutation and un-permutation with the router probabilities (gather, scatter-add,
# forward + backward), bytes per routed token x hidden.
MOE_PERMUTE_BYTES = 32.0
# FP8 (Transformer Engine): every FP8 GEMM quantizes its input in the forward and its output's
# gradient in the backward; per element, an amax pass (read bf16, 2 bytes; current scaling) and
# a fused cast-transpose (read 2, write the FP8 copy and its transpose for wgrad, 1 + 1).
FP8_CAST_BYTES = 6.0
# Achieved share of NVLink / NIC bandwidth by NCCL collectives (nccl-tests bus bandwidth is
# ~360 of 450 GB/s on H100 NVLink and ~45 of 50 GB/s per 400G NIC).
NVLINK_EFFICIENCY = 0.8
NIC_EFFICIENCY = 0.85
# All-to-all reaches less than a ring collective (many small messages, incast).
ALLTOALL_EFFICIENCY = 0.6
# SHARP in-network reduction: all-reduce bus bandwidth gain (NCCL CollNet/NVLS, ~1.7x).
SHARP_ALLREDUCE_GAIN = 1.7
# Share of TP communication Transformer Engine's userbuffer overlap (tp_comm_overlap) hides.
TP_OVERLAP_HIDDEN = 0.8
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
# Share of the DP communication left exposed even with overlap (the last bucket).
DP_EXPOSED_TAIL = 0.1
# Adam step with fp32 master weights: read param, grad, m, v; write param, m, v; bf16 copy.
# The precision-aware optimizer's narrower state reads and writes fewer bytes (_optimizer_time).
OPTIMIZER_BYTES_PER_PARAM = 32.0
# Offload (activations: `cpu_offloading`; the optimizer: `optimizer_cpu_offload`). Share of the
# GPU's host link that pinned-memory copies reach (cudaMemcpyAsync: ~52 of 64 GB/s on PCIe Gen5
# x16, as NCCL's share of its links).
HOST_LINK_EFFICIENCY = 0.8
# The CPU's Adam (Megatron's HybridDeviceOptimizer: torch.optim.AdamW, fused=True, on the fp32
# shard): read param, grad, m, v; write param, m, v; 4 bytes each.
CPU_ADAM_BYTES_PER_PARAM = 28.0
# Share of the host's memory bandwidth (per GPU) that CPU Adam reaches: one process per GPU,
# each stepping its own shard on the socket's cores (STREAM-like kernels reach ~70 %; the
# optimizer's per-tensor work and NUMA-remote pages, less).
HOST_MEMORY_EFFICIENCY = 0.5
# Fixed cost per kernel: the GPU idles between dependent kernels (launch latency, the ramp-up
# and tail of each kernel's last wave), ~4 us on Hopper/Blackwell with the host running ahead.
# Counts per layer, forward + backward (+ the recomputed forward): a Transformer Engine dense
# layer launches ~70 kernels (norms, GEMMs, flash attention, RoPE, bias-dropout-add, SP
# gathers); a MoE layer ~60 more (router, top-k, permute, dispatch/combine, grouped GEMM
# setup); each context-parallel ring step ~8 (attention block, softmax correction, send/recv).
# It is why a recipe prefers fewer, larger kernels: a larger micro-batch, fewer virtual stages,
# no needless CP.
KERNEL_GAP_S = 4e-6
# With the whole iteration captured as one CUDA graph (Megatron main `--cuda-graph-impl
# full_iteration`, 2026) the host launches nothing per kernel; what stays is the boundary on the
# GPU (the last wave's tail, the next kernel's ramp), taken as a quarter of the gap.
GRAPHED_KERNEL_GAP_S = 1e-6
DENSE_LAYER_KERNELS = 70
# Of those, the attention block's (input norm, QKV GEMM and its cast, RoPE, the fused attention,
# output projection and its cast, bias-dropout-add; forward and backward, dgrad and wgrad):
# what a CUDA graph of the attention (`cuda_graph_scope` attn) replays, with each CP ring step.
ATTENTION_LAYER_KERNELS = 28
MOE_LAYER_KERNELS = 60
CP_STEP_KERNELS = 8


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
# A predicted step that waits on the host (breakdown `host`) at least this share of it is
# host-bound: `plan` says so, and `slurmpod calibrate` fits the host's figure on such jobs.
HOST_BOUND_SHARE = 0.10


BREAKDOWN_KEYS = ("compute", "host", "offload", "tp", "cp", "pp_bubble", "pp_p2p", "dp", "ep",
                  "optimizer", "exposed_communication")


@dataclass(frozen=True, slots=True)
class Prediction:
    step_time_s: float
    tokens_per_s_per_gpu: float
    model_tflops_per_gpu: float
    mfu: float
    breakdown_s: dict[str, float]
    generation: str = ""
    efficiency_source: str = ""

    @property
    def host_bound(self) -> bool:
        """At least HOST_BOUND_SHARE of the step waits on the host's kernel launches."""
        return self.breakdown_s.get("host", 0.0) >= HOST_BOUND_SHARE * self.step_time_s

    def to_json(self) -> dict[str, Any]:
        return {"step_time_s": self.step_time_s,
                "tokens_per_s_per_gpu": self.tokens_per_s_per_gpu,
                "model_tflops_per_gpu": self.model_tflops_per_gpu, "mfu": self.mfu,
                "breakdown_s": dict(self.breakdown_s),
                "efficiency": {"generation": self.generation, "fitted_on": self.efficiency_source}}


@dataclass(frozen=True, slots=True)
class _Costs:
    """Per-token multiply-adds of one layer of each kind, independent of the layout."""

    attn_linear: float
    attn_core: float
    mla_up: float  # MLA's Q and KV up-projections (recompute module `mla_up_proj`)
    q_width: int
    kv_width: int  # K+V width one token sends in the CP ring
    mlp_dense: float
    moe_routed: float  # top-k experts
    moe_shared: float
    router: float
    logits: float
    flops_per_token: float
    n_dense: int
    n_moe: int


_COSTS: dict[tuple[Any, ...], _Costs] = {}
_LAYOUT_DEFAULTS = {"tp": 1, "pp": 1, "vpp": None, "cp": 1, "ep": 1, "etp": 1,
                    "sequence_parallel": False, "use_distributed_optimizer": False,
                    "recompute_granularity": None, "recompute_method": None,
                    "recompute_num_layers": None, "global_batch_size": None,
                    "micro_batch_size": 1, "first_stage_layers": None,
                    "last_stage_layers": None}
_RUN_FIELDS = {"account_for_embedding", "account_for_loss", "pipeline_layout", "vpp_given",
               "microbatch_group",
               "fp8", "fp8_param_gather", "grad_bytes", "hidden_dropout", "recompute_modules",
               "megatron_fsdp", "fsdp_sharding", "optimizer_offload_fraction",
               "cpu_offloading_num_layers"}


# The fields _costs reads: the model's shape, not its layout or run settings.
_SHAPE_FIELDS = tuple(f.name for f in dataclasses.fields(ModelConfig)
                      if f.name not in _LAYOUT_DEFAULTS and f.name not in _RUN_FIELDS)


def _costs(c: ModelConfig) -> _Costs:
    key = tuple([getattr(c, n) for n in _SHAPE_FIELDS])
    hit = _COSTS.get(key)
    if hit is not None:
        return hit
    h, a, s = c.hidden_size, c.num_attention_heads, c.seq_length
    attn_total = attention_fmas_per_token(c)
    mla_up = 0.0
    if c.multi_latent_attention:
        qk = c.qk_head_dim + c.qk_pos_emb_head_dim
        core = s * a * qk / 2 + s * a * c.v_head_dim / 2
        mla_up = ((c.q_lora_rank or 0) * a * qk
                  + c.kv_lora_rank * a * (c.qk_head_dim + c.v_head_dim))
        q_width = a * c.v_head_dim
        kv_width = a * (qk + c.v_head_dim)
    else:
        core = c.kv_channels * a * s  # QK^T and PV, causal half each
        q_width = c.kv_channels * a
        kv_width = 2 * c.kv_channels * c.num_query_groups
    n_moe = c.num_moe_layers
    moe_routed = moe_shared = router = 0.0
    if c.is_moe:
        f = 3 if c.swiglu else 2
        moe_shared = h * c.moe_shared_expert_intermediate_size * f
        moe_routed = mlp_fmas_per_token(c, True) - moe_shared
        router = h * (c.num_experts or 0)
    out = _Costs(
        attn_linear=attn_total - core, attn_core=core, mla_up=mla_up, q_width=q_width,
        kv_width=kv_width,
        mlp_dense=mlp_fmas_per_token(c, False), moe_routed=moe_routed, moe_shared=moe_shared,
        router=router, logits=h * c.padded_vocab_size, flops_per_token=flops_per_token(c),
        n_dense=c.num_layers - n_moe, n_moe=n_moe,
    )
    if len(_COSTS) > 512:
        _COSTS.clear()
    _COSTS[key] = out
    return out


def _eff(d: float) -> float:
    return d / (d + GEMM_HALF_DIM)


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


def _stage_work(c: ModelConfig, t_logits: float) -> list[tuple[float, float]]:
    """(transformer + MTP layers, logits time) of each pipeline rank, from the split Megatron
    builds: the rank holding the loss chunk also runs the output layer and cross-entropy, so a
    split that gives the loss a layer slot (`account_for_loss_in_pipeline_split`, a
    `pipeline_model_parallel_layout` ending in `tL`) evens the slowest stage out, which is why
    NVIDIA pins such a layout for Llama 3 70B at PP8 x VPP5 (Megatron-Bridge's H100 recipe)."""
    mtp = c.mtp_num_layers
    if c.pp == 1:
        return [(float(c.num_layers + mtp), t_logits)]
    sp = c.pipeline_split()
    if sp.errors or len(sp.chunks) != c.pp:
        first, most = c.stage_layers()
        last = (c.num_layers - first) / max(1, c.pp - 1)
        return [(first, 0.0), (most, 0.0), (last + mtp, t_logits)]
    hit = _RANK_WORK.get(id(sp))
    if hit is None or hit[0] is not sp:
        if len(_RANK_WORK) > 4096:
            _RANK_WORK.clear()
        hit = (sp, tuple((float(sum(ch.decoder + ch.mtp for ch in chunks)),
                          any(ch.loss for ch in chunks)) for chunks in sp.chunks))
        _RANK_WORK[id(sp)] = hit
    return [(n, t_logits if loss else 0.0) for n, loss in hit[1]]


# Per pipeline split (by identity; ModelConfig caches its splits): each rank's layers and
# whether it holds the loss. The search predicts thousands of candidates per split.
_RANK_WORK: dict[int, tuple[Any, tuple[tuple[float, bool], ...]]] = {}


# --- the step, term by term -----------------------------------------------------------------
# `predict` is the sequence of these steps; each returns seconds on one GPU (per microbatch and
# layer unless it says otherwise). Their float expressions are the model's: reordering a sum
# changes the last bits of a prediction, which the search's ranking and the validation table see.
# The records below are not frozen: `predict` builds them per call, thousands of times a search,
# and a frozen dataclass's __init__ costs several times a plain one's.


def _rates(hw: Hardware, eff: Efficiency, fp8_run: bool, world: int
           ) -> tuple[float, float, bool, float, float, float]:
    """Achieved speeds of one GPU: GEMM FLOP/s (BF16, and the precision the GEMMs run in),
    whether they run in FP8, HBM, NVLink and NIC bytes/s."""
    peak16 = hw.peak_bf16 * 1e12 * eff.gemm
    fp8 = fp8_run and hw.peak_fp8 is not None
    peak_mm = (hw.peak_fp8 or 0.0) * 1e12 * eff.fp8 if fp8 else peak16
    hbm = hw.hbm_tb_s * 1e12 * HBM_EFFICIENCY
    nvl = hw.nvlink_gb_s * 1e9 * NVLINK_EFFICIENCY
    nic = hw.nic_gb_s * 1e9 * NIC_EFFICIENCY
    nodes = world / hw.gpus_per_node
    if nodes > hw.nodes_per_su:
        nic /= hw.oversubscription  # the job leaves its scalable unit
    return peak16, peak_mm, fp8, hbm, nvl, nic


def _recompute(c: ModelConfig) -> tuple[float, float, float, float, float]:
    """Share of each part's forward that runs twice: (layers, under full recompute; the MLP,
    the routed experts, the shared experts, MLA's up-projections: the same, or 1.0 where
    selective recompute names the module)."""
    rec = 0.0
    if c.recompute_granularity == "full":
        stage_layers = c.stage_layers()[1]
        n = c.recompute_num_layers or stage_layers
        rec = min(1.0, n * (c.vpp or 1) / stage_layers) if c.recompute_method == "block" else 1.0
    # Selective recompute of whole modules runs their forward again (flash attention already
    # recomputes the core attention, so `core_attn` costs nothing here).
    mods = (set(c.recompute_modules) if c.recompute_granularity == "selective" else set())
    return (rec, 1.0 if "mlp" in mods else rec, 1.0 if "moe" in mods else rec,
            1.0 if "moe" in mods or "shared_experts" in mods else rec,
            1.0 if "mla_up_proj" in mods else rec)


@dataclass(slots=True)
class _Micro:
    """One microbatch on one GPU: what every per-layer term reads."""

    c: ModelConfig
    k: _Costs
    hw: Hardware
    opts: RunOptions
    peak16: float  # achieved FLOP/s of BF16 GEMMs
    peak_mm: float  # ... of the GEMMs Transformer Engine runs (FP8 or BF16)
    fp8: bool
    hbm: float  # achieved bytes/s
    nvl: float
    nic: float
    rec: float  # full recompute: share of layers whose forward runs twice
    rec_mlp: float  # ... of the MLP, the routed experts, the shared experts (selective too)
    rec_moe: float
    rec_shared: float
    rec_mla_up: float
    tok: float  # tokens of one microbatch on one CP rank
    sp: bool  # sequence parallel in effect (TP > 1)
    host_forward: float  # MOE_FP8_HOST_FORWARD_S, as fitted


def _micro(c: ModelConfig, world: int, hw: Hardware, eff: Efficiency, opts: RunOptions
           ) -> _Micro:
    """The per-token costs, speeds and recompute shares every term reads, computed once."""
    return _Micro(c, _costs(c), hw, opts, *_rates(hw, eff, c.fp8 is not None, world),
                  *_recompute(c), c.micro_batch_size * c.seq_length / c.cp,
                  c.sequence_parallel and c.tp > 1, eff.moe_fp8_host_forward_s)


def _attention_compute(u: _Micro) -> tuple[float, float]:
    """(the layer's compute shared by dense and MoE layers: attention GEMMs, core attention,
    element-wise work and kernel gaps; the core attention alone, which hides the CP ring)."""
    c, k, tok, tp = u.c, u.k, u.tok, u.c.tp
    h = c.hidden_size
    rec = u.rec
    gemm_passes = 6.0 + 2.0 * rec  # FLOPs per FMA over fwd + dgrad + wgrad (+ recomputed fwd)
    mem_passes = 1.0 + rec / 3
    t_attn = gemm_passes * tok * k.attn_linear / tp / (u.peak_mm * _eff(min(h, k.q_width / tp)))
    if u.rec_mla_up > rec:  # selective `mla_up_proj`: the up-projections' forward again
        t_attn += 2.0 * (u.rec_mla_up - rec) * tok * k.mla_up / tp / (
            u.peak_mm * _eff(min(c.kv_lora_rank, k.q_width / tp)))
    t_core = 7.0 * tok * k.attn_core / tp / (
        (u.peak_mm if u.fp8 and u.opts.fp8_attention else u.peak16) * ATTENTION_FACTOR)
    hid = tok * h / (tp if u.sp else 1)
    mem_common = ELEMENTWISE_BYTES_HIDDEN * hid
    # QKV and output projection: inputs (tok x h, tok x q_width / tp) and output gradients
    # (tok x (q + k + v) / tp, tok x h). Under SP an h-sized tensor is quantized on its shard,
    # before the all-gather (TE gathers FP8), so `hid` elements.
    cast_common = (FP8_CAST_BYTES * (2 * hid + tok * (2 * k.q_width + k.kv_width) / tp)
                   if u.fp8 else 0.0)
    attention_kernels = ATTENTION_LAYER_KERNELS + CP_STEP_KERNELS * (c.cp - 1)
    gap = _kernel_gap(u)
    gaps = (1 + rec / 3) * (gap * (DENSE_LAYER_KERNELS - ATTENTION_LAYER_KERNELS)
                            + (GRAPHED_KERNEL_GAP_S if u.opts.graphed_attention else gap)
                            * attention_kernels)
    return t_attn + t_core + (mem_common + cast_common) * mem_passes / u.hbm + gaps, t_core


def _kernel_gap(u: _Micro) -> float:
    return GRAPHED_KERNEL_GAP_S if u.opts.graphed_iteration else KERNEL_GAP_S


def _tp_time(u: _Micro) -> float:
    """TP: 4 all-gathers/reduce-scatters forward, 4 backward (+4 recomputed), each of the full
    activation; a ring moves (tp-1)/tp of it per GPU. Half of them are the MLP's: a MoE layer
    has the attention's half only, and its experts' own (_ep_time)."""
    tp = u.c.tp
    if tp <= 1:
        return 0.0
    bw = u.nvl if tp <= u.hw.domain_gpus else u.nic
    t_tp = (8 + 4 * u.rec) * u.tok * u.c.hidden_size * 2 * (tp - 1) / tp / bw
    if u.opts.tp_comm_overlap:
        t_tp *= 1 - TP_OVERLAP_HIDDEN
    return t_tp


def _cp_time(u: _Micro, t_core: float) -> float:
    """CP: ring exchange of K/V forward, K/V and dK/dV backward, hidden behind core attention."""
    tp, cp = u.c.tp, u.c.cp
    if cp <= 1:
        return 0.0
    bw = u.nvl if tp * cp <= u.hw.domain_gpus else u.nic
    return max(0.0, 3 * (cp - 1) * u.tok * u.k.kv_width / tp * 2 / bw - t_core)


def _dense_mlp(u: _Micro) -> tuple[float, float]:
    """A dense MLP: (GEMM seconds, element-wise and FP8-cast bytes)."""
    c, tok, tp = u.c, u.tok, u.c.tp
    ffn = c.ffn_hidden_size
    t_gemm = (6.0 + 2.0 * u.rec_mlp) * tok * u.k.mlp_dense / tp / (
        u.peak_mm * _eff(min(c.hidden_size, ffn / tp)))
    mem = ELEMENTWISE_BYTES_FFN * tok * ffn / tp
    cast = _mlp_cast_bytes(u, tok, ffn / tp, tp if u.sp else 1)
    return t_gemm, mem + cast


def _mlp_cast_bytes(u: _Micro, tokens: float, ffn: float, h_shards: int = 1) -> float:
    """FP8 casts of an MLP's two GEMMs for `tokens` rows of FFN width `ffn` (per GPU): fc1's
    input (h) and output gradient (2 ffn gated, else ffn), fc2's input (ffn) and output
    gradient (h); the h-sized ones quantized on `h_shards` sequence shards (SP: TP)."""
    if not u.fp8:
        return 0.0
    fc1_out = (2.0 if u.c.swiglu else 1.0) * ffn
    return FP8_CAST_BYTES * tokens * (2 * u.c.hidden_size / h_shards + fc1_out + ffn)


def _routed_tokens(u: _Micro) -> float:
    """Routed token copies one GPU handles per microbatch (top-k, busiest expert's share)."""
    return u.tok * u.c.moe_router_topk * u.opts.moe_imbalance / u.c.tp


def _moe_mlp(u: _Micro) -> tuple[float, float]:
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
        u.peak_mm * _eff(d_exp) * GROUPED_GEMM_FACTOR)
    if k.moe_shared:
        t_gemm += (6.0 + 2.0 * u.rec_shared) * tok * k.moe_shared / tp / (
            u.peak_mm * _eff(min(h, c.moe_shared_expert_intermediate_size / tp)))
    t_gemm += 6.0 * tok * k.router / tp / u.peak16 + _expert_gemm_gaps(u)
    routed = _routed_tokens(u)
    # The fused grouped MLP keeps the experts' activation on chip: neither its element-wise
    # pass nor the FP8 casts of fc1's output gradient and fc2's input touch HBM.
    fused = u.opts.fused_expert_mlp
    mem = ((0.0 if fused else ELEMENTWISE_BYTES_FFN * routed * c.moe_ffn_hidden_size / etp)
           + ELEMENTWISE_BYTES_FFN * tok * c.moe_shared_expert_intermediate_size / tp
           + MOE_PERMUTE_BYTES * routed * h)
    cast = _mlp_cast_bytes(u, routed, 0.0 if fused else c.moe_ffn_hidden_size / etp)
    if c.moe_shared_expert_intermediate_size:
        cast += _mlp_cast_bytes(u, tok, c.moe_shared_expert_intermediate_size / tp,
                                tp if u.sp else 1)
    return t_gemm, mem + cast


def _expert_gemm_gaps(u: _Micro) -> float:
    """Kernel gaps of the routed experts' grouped GEMMs beyond the one each counts among a MoE
    layer's kernels: fc1 and fc2 forward, their dgrad and wgrad (+ the recomputed forward),
    each one GEMM per local expert, TE_COMPUTE_STREAMS at a time. Why a layout with many local
    experts (little or no expert parallelism) launches slower than its FLOPs say. None with the
    op fuser's grouped MLP (one kernel for every expert)."""
    if u.opts.fused_expert_mlp:
        return 0.0
    local = (u.c.num_experts or 1) // u.c.ep
    serial = math.ceil(local / TE_COMPUTE_STREAMS) - 1
    return (6.0 + 2.0 * u.rec_moe) * serial * _kernel_gap(u)


def _ep_time(u: _Micro) -> float:
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


def _host_wait(u: _Micro, moe_compute: float, attention: float, t_ep: float) -> float:
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


@dataclass(slots=True)
class _Layer:
    """One layer, averaged over the model's dense and MoE layers."""

    compute: float
    comm: float  # exposed: TP + CP, and EP on the MoE share
    tp: float
    cp: float
    ep: float  # per MoE layer: the all-to-alls and the expert-tensor collectives
    moe_share: float
    host: float  # per MoE layer: the forward's wait on the host (_host_wait)


def _layer(u: _Micro) -> _Layer:
    """Compute and exposed communication of the average layer."""
    common, t_core = _attention_compute(u)
    t_tp = _tp_time(u)
    t_cp = _cp_time(u, t_core)
    t_dense_mlp, b_dense = _dense_mlp(u)
    t_moe_mlp, b_moe = _moe_mlp(u)
    t_ep = _ep_time(u)
    rec = u.rec
    mem_passes = 1.0 + rec / 3
    hbm = u.hbm
    dense_compute = common + t_dense_mlp + b_dense * mem_passes / hbm
    moe_compute = (common + t_moe_mlp + b_moe * mem_passes / hbm
                   + _kernel_gap(u) * (1 + rec / 3) * MOE_LAYER_KERNELS)
    moe_share = u.k.n_moe / u.c.num_layers
    layer_compute = (1 - moe_share) * dense_compute + moe_share * moe_compute
    t_tp *= 1 - moe_share / 2  # a MoE layer's MLP moves its tokens in t_ep (_ep_time)
    layer_comm = t_tp + t_cp + moe_share * t_ep
    host = _host_wait(u, moe_compute, common, t_ep) if moe_share else 0.0
    return _Layer(layer_compute, layer_comm, t_tp, t_cp, t_ep, moe_share, host)


def _logits_time(u: _Micro) -> float:
    """Logits on the rank holding the loss: BF16 output layer (Megatron's, not TE's) and fp32
    cross-entropy, once per output head (+ MTP)."""
    c, tok, tp = u.c, u.tok, u.c.tp
    v_local = c.padded_vocab_size / tp
    heads = 1 + c.mtp_num_layers
    return heads * (6.0 * tok * u.k.logits / tp / (u.peak16 * _eff(min(c.hidden_size, v_local)))
                    + 4 * 4 * tok * v_local / u.hbm)


@dataclass(slots=True)
class _Stage:
    """The slowest pipeline rank, per microbatch: its compute, its wait on the host, what its
    activation offload leaves exposed and its exposed communication, and the TP, CP and EP
    parts of that communication."""

    compute: float
    host: float
    offload: float
    comm: float
    tp: float
    cp: float
    ep: float
    microbatch: float  # compute + host + offload + comm


def _slowest_stage(u: _Micro, layer: _Layer, t_logits: float) -> _Stage:
    """The rank whose layers (and output layer, on the loss rank) take longest (_stage_work)."""
    busy = layer.comm + layer.moe_share * layer.host
    compute, other, n = max(
        ((n * layer.compute + extra, n * busy, n) for n, extra in _stage_work(u.c, t_logits)),
        key=lambda x: x[0] + x[1])
    host = n * layer.moe_share * layer.host
    offload = _offload_exposed(u, layer, n) if u.c.cpu_offloading_num_layers else 0.0
    return _Stage(compute, host, offload, n * layer.comm, n * layer.tp, n * layer.cp,
                  n * layer.moe_share * layer.ep, compute + other + offload)


def _pipeline(u: _Micro, world: int, m: int, t_mb: float) -> tuple[float, float]:
    """(bubble, exposed p2p) of the whole step: `(PP-1)/VPP` microbatch-times idle, and the
    activation sends between stages."""
    c, pp = u.c, u.c.pp
    if pp <= 1:
        return 0.0, 0.0
    bubble = (pp - 1) / (c.vpp or 1) * t_mb
    msg = u.tok * c.hidden_size * 2 / (c.tp if u.sp else 1)
    # Adjacent stages are world / PP ranks apart: NVLink while that stays inside the NVLink
    # domain (a node of DGX/HGX; 18 nodes of GB200 NVL72, where NCCL runs over multi-node NVLink).
    bw = u.nic if world // pp >= u.hw.domain_gpus else u.nvl
    # 1F1B steady state blocks on its sends; the interleaved schedule overlaps them
    # (overlap_p2p_comm) except in warm-up and cool-down.
    n_p2p = (pp - 1) * 2 * c.vpp if c.vpp else 2 * m
    return bubble, n_p2p * msg / bw


def _dp_bandwidth(u: _Micro, block: int, size: int) -> float:
    """A DP group of `size` ranks `block` GPUs apart: NVLink while it stays in one NVLink domain
    (as for TP, CP and EP: a GB200 NVL72 rack's 72 GPUs reduce over multi-node NVLink)."""
    if size <= 1:
        return float("inf")
    return u.nvl if block * size <= u.hw.domain_gpus else u.nic


def _dp_traffic(u: _Micro, w: WeightMemory, d_ne: int, d_e: int) -> tuple[float, float]:
    """(gradient reduce-scatter, parameter all-gather) of every local parameter once, before
    overlap: the sharded optimizer's pair (the distributed optimizer, Megatron-FSDP) over
    DP x CP (experts: expert-DP), or unsharded one all-reduce (SHARP-accelerated on the fabric)
    counted as the reduce."""
    c, hw = u.c, u.hw
    gb = c.grad_bytes
    # FP8 parameters (`fp8_param_gather`) are gathered as FP8, one byte each.
    pb = 1 if u.fp8 and c.fp8_param_gather else 2
    t_rs = t_ag = 0.0
    for params, d, block in ((w.nonexpert_params_per_gpu, d_ne, c.tp),
                             (w.expert_params_per_gpu, d_e, c.etp * c.ep)):
        if d <= 1 or params <= 0:
            continue
        bw = _dp_bandwidth(u, block, d)
        ring = (d - 1) / d
        if c.dp_sharding != "no_shard":
            t_rs += params * gb * ring / bw
            t_ag += params * pb * ring / bw
        else:
            gain = SHARP_ALLREDUCE_GAIN if hw.sharp and bw == u.nic else 1.0
            t_rs += 2 * params * gb * ring / (bw * gain)
    return t_rs, t_ag


def _fsdp_exposed(c: ModelConfig, opts: RunOptions, t_rs: float, t_ag: float, t_mb: float,
                  m: int) -> float:
    """Megatron-FSDP's DP traffic left exposed over the step. Sharded gradients
    (`optim_grads`, `optim_grads_params`) are reduce-scattered every microbatch, and sharded
    parameters (`optim_grads_params`) gathered every microbatch for its forward and again for
    its backward; each FSDP unit's collectives run under the neighbouring units' compute
    (`overlap_grad_reduce` / `overlap_param_gather`), so a microbatch exposes what exceeds its
    own compute, and at least the DP_EXPOSED_TAIL share the distributed optimizer leaves.
    Unsharded parameters are gathered once per step, after the optimizer, as there."""
    per_step_ag = t_ag if c.dp_sharding == "optim_grads" else 0.0
    gathers = 2 * t_ag if c.dp_sharding == "optim_grads_params" else 0.0
    hidden = ((t_rs if opts.overlap_grad_reduce else 0.0)
              + (gathers if opts.overlap_param_gather else 0.0))
    fixed = t_rs + gathers - hidden
    per_mb = fixed + max(DP_EXPOSED_TAIL * hidden, hidden - t_mb)
    return m * per_mb + _dp_exposed(c, opts, 0.0, per_step_ag, t_mb)


def _dp_exposed(c: ModelConfig, opts: RunOptions, t_rs: float, t_ag: float, t_mb: float
                ) -> float:
    """The DP traffic left exposed by `overlap_grad_reduce` / `overlap_param_gather`.

    What the overlap hides behind (Megatron's DDP bucket hooks): a model chunk's gradients
    are reduced once its last microbatch's backward is done, its parameters gathered as its
    first microbatch's forward reaches them. With one chunk (1F1B) that is one microbatch's
    backward / forward; with VPP chunks the interleaved schedule runs (VPP-1) x PP chunk
    steps of other chunks' backward (cool-down) / forward (warm-up) after the first chunk's
    gradients are ready / before the last chunk's first forward, so the window grows to
    (1 + (VPP-1) x PP) / VPP microbatch-times."""
    vpp, pp = c.vpp or 1, c.pp
    chunk_steps = (1 + (vpp - 1) * pp) / vpp
    if opts.overlap_grad_reduce:
        t_rs = max(DP_EXPOSED_TAIL * t_rs, t_rs - 2 / 3 * t_mb * chunk_steps)
    if opts.overlap_param_gather:
        t_ag = max(DP_EXPOSED_TAIL * t_ag, t_ag - 1 / 3 * t_mb * chunk_steps)
    return t_rs + t_ag


def _optimizer_time(u: _Micro, w: WeightMemory, d_ne: int, d_e: int) -> float:
    """Adam on the local shard (all local parameters without the distributed optimizer), plus
    reading every local gradient, at HBM speed; the share `optimizer_cpu_offload` moves to
    the host steps there (_cpu_optimizer_time)."""
    c = u.c
    p_gpu = w.nonexpert_params_per_gpu + w.expert_params_per_gpu
    shard = (w.nonexpert_params_per_gpu / d_ne + w.expert_params_per_gpu / d_e
             if c.dp_sharding != "no_shard" else p_gpu)
    on_host = shard * c.optimizer_offload_fraction
    # The state is read and written once: a narrower one (`--use-precision-aware-optimizer`)
    # moves 2 x its saving less.
    step_bytes = OPTIMIZER_BYTES_PER_PARAM - 2 * (FP32_ADAM_STATE_BYTES - c.optimizer_state_bytes)
    return ((p_gpu * 4 + (shard - on_host) * step_bytes) / u.hbm
            + _cpu_optimizer_time(u, on_host))


def _host_copy_rate(hw: Hardware) -> float:
    """Bytes/s one GPU copies to or from host memory: its link, at HOST_LINK_EFFICIENCY, or its
    share of the host's memory bandwidth, whichever is less."""
    return min(hw.host_link_gb_s * HOST_LINK_EFFICIENCY, hw.host_memory_gb_s) * 1e9


def _cpu_optimizer_time(u: _Micro, params: float) -> float:
    """Megatron's HybridDeviceOptimizer on `params` of the shard (core 0.12 to main,
    `--optimizer-cpu-offload`): their fp32 gradients copied to the host, the CPU's Adam, the
    fp32 parameters copied back (`param_update_in_fp32`). One after the other; with
    `--overlap-cpu-optimizer-d2h-h2d` a pipeline over the parameters, as long as its slowest
    stage."""
    if params <= 0:
        return 0.0
    copy = params * 4 / _host_copy_rate(u.hw)
    step = params * CPU_ADAM_BYTES_PER_PARAM / (
        u.hw.host_memory_gb_s * 1e9 * HOST_MEMORY_EFFICIENCY)
    return max(copy, step) if u.opts.overlap_cpu_optimizer else 2 * copy + step


def _offload_exposed(u: _Micro, layer: _Layer, stage_layers: float) -> float:
    """Per microbatch, what activation offloading (TransformerConfig `cpu_offloading`, core
    0.12 to main; Transformer Engine's offload handler) leaves exposed: each offloaded layer's
    activations go to the host while the next layer runs its forward, and come back while the
    layer after it in the backward runs its backward; a copy longer than that compute shows.
    Megatron allows it with PP 1 and no recompute only, and offloads at most all layers but
    the last."""
    n = min(float(u.c.cpu_offloading_num_layers), stage_layers - 1)
    if n <= 0:
        return 0.0
    moe = layer.moe_share
    act = ((1 - moe) * layer_activation_bytes(u.c, False)
           + (moe * layer_activation_bytes(u.c, True) if moe else 0.0))
    copy = act / _host_copy_rate(u.hw)
    forward, backward = layer.compute / 3, 2 * layer.compute / 3
    return n * (max(0.0, copy - forward) + max(0.0, copy - backward))


def _assemble(m: int, stage: _Stage, bubble: float, p2p: float, t_dp: float, t_opt: float
              ) -> tuple[float, dict[str, float]]:
    """(step seconds, breakdown): `m` microbatches of the slowest stage, then the bubble, p2p,
    DP and optimizer; exposed communication is the stage's TP/CP/EP, p2p and DP."""
    step = m * stage.microbatch + bubble + p2p + t_dp + t_opt
    comm = m * stage.comm + p2p + t_dp
    return step, {
        "compute": m * stage.compute, "host": m * stage.host, "offload": m * stage.offload,
        "tp": m * stage.tp, "cp": m * stage.cp,
        "pp_bubble": bubble, "pp_p2p": p2p, "dp": t_dp, "ep": m * stage.ep,
        "optimizer": t_opt, "exposed_communication": comm,
    }


def predict(c: ModelConfig, world: int, hw: Hardware, eff: Efficiency | None = None,
            opts: RunOptions | None = None, *, weights: WeightMemory | None = None
            ) -> Prediction | None:
    """Predicted iteration of `c` (its layout included) on `world` GPUs; None without a global
    batch size or when the layout does not divide the world. `weights`: the most loaded
    rank's weight memory when the caller has it (the search computes it once per layout)."""
    eff = eff or FITTED.get(hw.generation, DEFAULT_EFFICIENCY)
    opts = opts or RunOptions()
    gbs = c.global_batch_size
    mp = c.tp * c.cp * c.pp
    if not gbs or world % mp:
        return None
    dp = world // mp
    m = max(1, gbs // (c.micro_batch_size * dp))  # microbatches per step
    u = _micro(c, world, hw, eff, opts)

    stage = _slowest_stage(u, _layer(u), _logits_time(u))
    bubble, p2p = _pipeline(u, world, m, stage.microbatch)

    w = weights if weights is not None else weight_and_optimizer_bytes(c, world)
    d_ne = dp * c.cp  # non-expert gradients reduce over DP x CP
    d_e = max(1, world // (c.etp * c.ep * c.pp))  # expert-DP
    t_rs, t_ag = _dp_traffic(u, w, d_ne, d_e)
    if c.dp_sharding in ("optim_grads", "optim_grads_params"):
        t_dp = _fsdp_exposed(c, opts, t_rs, t_ag, stage.microbatch, m)
    else:
        t_dp = _dp_exposed(c, opts, t_rs, t_ag, stage.microbatch)
    t_opt = _optimizer_time(u, w, d_ne, d_e)

    step, breakdown = _assemble(m, stage, bubble, p2p, t_dp, t_opt)
    tokens = gbs * c.seq_length
    tflops = u.k.flops_per_token * tokens / (step * world) / 1e12
    return Prediction(step, tokens / (step * world), tflops, tflops / hw.peak_bf16, breakdown,
                      hw.generation, eff.fitted_on)
