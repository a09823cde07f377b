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

The step's own terms are here (attention, TP, CP, the dense MLP, the average layer, logits,
the pipeline, DP, the optimizer, offload); a MoE layer's are in `slurmpod.perf.moe`, and what
every term reads of one microbatch on one GPU (per-token costs, achieved speeds, recompute
shares) in `slurmpod.perf.micro`. Every chosen coefficient is named in the module that uses it;
the fitted ones (two per GPU generation at most, each with the published point it was fitted
on) live in `slurmpod.perf.fitted`. What the model reads from the site is
`slurmpod.perf.hardware.Hardware`; from the run's switches, `slurmpod.perf.options.RunOptions`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from slurmpod.megatron.memory import (
    WeightMemory,
    layer_activation_bytes,
    weight_and_optimizer_bytes,
)
from slurmpod.megatron.runspec import FP32_ADAM_STATE_BYTES, ModelConfig
from slurmpod.perf.fitted import DEFAULT_EFFICIENCY, FITTED, Efficiency
from slurmpod.perf.hardware import Hardware
from slurmpod.perf.micro import (
    ELEMENTWISE_BYTES_FFN,
    ELEMENTWISE_BYTES_HIDDEN,
    FP8_CAST_BYTES,
    GRAPHED_KERNEL_GAP_S,
    Micro,
    gemm_eff,
    kernel_gap,
    micro,
    mlp_cast_bytes,
)
from slurmpod.perf.moe import ep_time, host_wait, moe_mlp
from slurmpod.perf.options import RunOptions

# --- chosen constants (not fitted) ---------------------------------------------------------------
# Flash/fused attention against a plain GEMM of the same FLOPs (softmax, masking, causal tiles).
ATTENTION_FACTOR = 0.7
# FP8 attention (`fp8_dot_product_attention`, cuDNN's fused FP8 SDPA) against BF16 attention,
# forward and backward together (weighted 2:5 by FLOPs), causal at sequence 4096: not the FP8
# GEMM peak, as the softmax and the backward gain little. cuDNN-frontend's training SDPA
# benchmark (benchmark/sdpa_benchmark_training/results, cuDNN 9.22, 2026-04): head dim 128
# (Llama 3.1) MXFP8 0.97x on GB200, 0.99x on GB300 (per-tensor FP8 1.08x, 1.19x; H200, cuDNN
# 9.19: 1.08x); head dim 192 (DeepSeek-V3's MLA) MXFP8 1.31x, 1.38x (per-tensor 1.57x, 1.74x).
# The MXFP8 figures: every published run with FP8 attention is a Blackwell MXFP8 recipe.
FP8_ATTENTION_GAIN = {128: 1.0, 192: 1.35}
# SHARP in-network reduction: all-reduce bus bandwidth gain (NCCL CollNet/NVLS, ~1.7x).
SHARP_ALLREDUCE_GAIN = 1.7
# Share of TP communication Transformer Engine's userbuffer overlap (tp_comm_overlap) hides.
TP_OVERLAP_HIDDEN = 0.8
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
# Kernels per layer, forward + backward (+ the recomputed forward), each costing a kernel gap
# (slurmpod.perf.micro.KERNEL_GAP_S): a Transformer Engine dense layer launches ~70 kernels
# (norms, GEMMs, flash attention, RoPE, bias-dropout-add, SP gathers); a MoE layer ~60 more
# (router, top-k, permute, dispatch/combine, grouped GEMM setup); each context-parallel ring
# step ~8 (attention block, softmax correction, send/recv).
DENSE_LAYER_KERNELS = 70
# Of those, the attention block's (input norm, QKV GEMM and its cast, RoPE, the fused attention,
# output projection and its cast, bias-dropout-add; forward and backward, dgrad and wgrad):
# what a CUDA graph of the attention (`cuda_graph_scope` attn) replays, with each CP ring step.
ATTENTION_LAYER_KERNELS = 28
MOE_LAYER_KERNELS = 60
CP_STEP_KERNELS = 8
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


def _attention_compute(u: Micro) -> tuple[float, float]:
    """(the layer's compute shared by dense and MoE layers: attention GEMMs, core attention,
    element-wise work and kernel gaps; the core attention alone, which hides the CP ring)."""
    c, k, tok, tp = u.c, u.k, u.tok, u.c.tp
    h = c.hidden_size
    rec = u.rec
    gemm_passes = 6.0 + 2.0 * rec  # FLOPs per FMA over fwd + dgrad + wgrad (+ recomputed fwd)
    mem_passes = 1.0 + rec / 3
    t_attn = gemm_passes * tok * k.attn_linear / tp / (u.peak_mm * gemm_eff(min(h, k.q_width / tp)))
    if u.rec_mla_up > rec:  # selective `mla_up_proj`: the up-projections' forward again
        t_attn += 2.0 * (u.rec_mla_up - rec) * tok * k.mla_up / tp / (
            u.peak_mm * gemm_eff(min(c.kv_lora_rank, k.q_width / tp)))
    gain = fp8_attention_gain(c) if u.fp8 and u.opts.fp8_attention else 1.0
    t_core = 7.0 * tok * k.attn_core / tp / (u.peak16 * ATTENTION_FACTOR * gain)
    hid = tok * h / (tp if u.sp else 1)
    mem_common = ELEMENTWISE_BYTES_HIDDEN * hid
    # QKV and output projection: inputs (tok x h, tok x q_width / tp) and output gradients
    # (tok x (q + k + v) / tp, tok x h). Under SP an h-sized tensor is quantized on its shard,
    # before the all-gather (TE gathers FP8), so `hid` elements.
    cast_common = (FP8_CAST_BYTES * (2 * hid + tok * (2 * k.q_width + k.kv_width) / tp)
                   if u.fp8 else 0.0)
    attention_kernels = ATTENTION_LAYER_KERNELS + CP_STEP_KERNELS * (c.cp - 1)
    gap = kernel_gap(u)
    gaps = (1 + rec / 3) * (gap * (DENSE_LAYER_KERNELS - ATTENTION_LAYER_KERNELS)
                            + (GRAPHED_KERNEL_GAP_S if u.opts.graphed_attention else gap)
                            * attention_kernels)
    return t_attn + t_core + (mem_common + cast_common) * mem_passes / u.hbm + gaps, t_core


def fp8_attention_gain(c: ModelConfig) -> float:
    """FP8 attention's speed over BF16 attention for `c`'s query-key head dimension
    (FP8_ATTENTION_GAIN: up to 128, or larger as MLA's 192)."""
    head = c.qk_head_dim + c.qk_pos_emb_head_dim if c.multi_latent_attention else c.kv_channels
    return FP8_ATTENTION_GAIN[128 if head <= 128 else 192]


def _tp_time(u: Micro) -> float:
    """TP: 4 all-gathers/reduce-scatters forward, 4 backward (+4 recomputed), each of the full
    activation; a ring moves (tp-1)/tp of it per GPU. Half of them are the MLP's: a MoE layer
    has the attention's half only, and its experts' own (ep_time)."""
    tp = u.c.tp
    if tp <= 1:
        return 0.0
    bw = u.nvl if tp <= u.hw.domain_gpus else u.nic
    t_tp = (8 + 4 * u.rec) * u.tok * u.c.hidden_size * 2 * (tp - 1) / tp / bw
    if u.opts.tp_comm_overlap:
        t_tp *= 1 - TP_OVERLAP_HIDDEN
    return t_tp


def _cp_time(u: Micro, t_core: float) -> float:
    """CP: ring exchange of K/V forward, K/V and dK/dV backward, hidden behind core attention."""
    tp, cp = u.c.tp, u.c.cp
    if cp <= 1:
        return 0.0
    bw = u.nvl if tp * cp <= u.hw.domain_gpus else u.nic
    return max(0.0, 3 * (cp - 1) * u.tok * u.k.kv_width / tp * 2 / bw - t_core)


def _dense_mlp(u: Micro) -> tuple[float, float]:
    """A dense MLP: (GEMM seconds, element-wise and FP8-cast bytes)."""
    c, tok, tp = u.c, u.tok, u.c.tp
    ffn = c.ffn_hidden_size
    t_gemm = (6.0 + 2.0 * u.rec_mlp) * tok * u.k.mlp_dense / tp / (
        u.peak_mm * gemm_eff(min(c.hidden_size, ffn / tp)))
    mem = ELEMENTWISE_BYTES_FFN * tok * ffn / tp
    cast = mlp_cast_bytes(u, tok, ffn / tp, tp if u.sp else 1)
    return t_gemm, mem + cast


@dataclass(slots=True)
class _Layer:
    """One layer, averaged over the model's dense and MoE layers."""

    compute: float
    comm: float  # exposed: TP + CP, and EP on the MoE share
    tp: float
    cp: float
    ep: float  # per MoE layer: the all-to-alls and the expert-tensor collectives
    moe_share: float
    host: float  # per MoE layer: the forward's wait on the host (host_wait)


def _layer(u: Micro) -> _Layer:
    """Compute and exposed communication of the average layer."""
    common, t_core = _attention_compute(u)
    t_tp = _tp_time(u)
    t_cp = _cp_time(u, t_core)
    t_dense_mlp, b_dense = _dense_mlp(u)
    t_moe_mlp, b_moe = moe_mlp(u)
    t_ep = ep_time(u)
    rec = u.rec
    mem_passes = 1.0 + rec / 3
    hbm = u.hbm
    dense_compute = common + t_dense_mlp + b_dense * mem_passes / hbm
    moe_compute = (common + t_moe_mlp + b_moe * mem_passes / hbm
                   + kernel_gap(u) * (1 + rec / 3) * MOE_LAYER_KERNELS)
    moe_share = u.k.n_moe / u.c.num_layers
    layer_compute = (1 - moe_share) * dense_compute + moe_share * moe_compute
    t_tp *= 1 - moe_share / 2  # a MoE layer's MLP moves its tokens in t_ep (ep_time)
    layer_comm = t_tp + t_cp + moe_share * t_ep
    host = host_wait(u, moe_compute, common, t_ep) if moe_share else 0.0
    return _Layer(layer_compute, layer_comm, t_tp, t_cp, t_ep, moe_share, host)


def _logits_time(u: Micro) -> float:
    """Logits on the rank holding the loss: BF16 output layer (Megatron's, not TE's) and fp32
    cross-entropy, once per output head (+ MTP)."""
    c, tok, tp = u.c, u.tok, u.c.tp
    v_local = c.padded_vocab_size / tp
    heads = 1 + c.mtp_num_layers
    return heads * (6.0 * tok * u.k.logits / tp / (u.peak16 * gemm_eff(min(c.hidden_size, v_local)))
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


def _slowest_stage(u: Micro, layer: _Layer, t_logits: float) -> _Stage:
    """The rank whose layers (and output layer, on the loss rank) take longest (_stage_work)."""
    busy = layer.comm + layer.moe_share * layer.host
    compute, other, n = max(
        ((n * layer.compute + extra, n * busy, n) for n, extra in _stage_work(u.c, t_logits)),
        key=lambda x: x[0] + x[1])
    host = n * layer.moe_share * layer.host
    offload = _offload_exposed(u, layer, n) if u.c.cpu_offloading_num_layers else 0.0
    return _Stage(compute, host, offload, n * layer.comm, n * layer.tp, n * layer.cp,
                  n * layer.moe_share * layer.ep, compute + other + offload)


def _pipeline(u: Micro, world: int, m: int, t_mb: float) -> tuple[float, float]:
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


def _dp_bandwidth(u: Micro, block: int, size: int) -> float:
    """A DP group of `size` ranks `block` GPUs apart: NVLink while it stays in one NVLink domain
    (as for TP, CP and EP: a GB200 NVL72 rack's 72 GPUs reduce over multi-node NVLink)."""
    if size <= 1:
        return float("inf")
    return u.nvl if block * size <= u.hw.domain_gpus else u.nic


def _dp_traffic(u: Micro, w: WeightMemory, d_ne: int, d_e: int) -> tuple[float, float]:
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


def _optimizer_time(u: Micro, w: WeightMemory, d_ne: int, d_e: int) -> float:
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


def _cpu_optimizer_time(u: Micro, params: float) -> float:
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


def _offload_exposed(u: Micro, layer: _Layer, stage_layers: float) -> float:
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
    u = micro(c, world, hw, eff, opts)

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
