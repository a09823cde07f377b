"""One microbatch on one GPU, as every term of the performance model reads it: the per-token
multiply-adds of the model's layers, the GPU's achieved speeds (GEMMs, HBM, NVLink, NIC) and the
share of each part's forward that recompute runs twice (docs/perf-model.md).

Its coefficients are chosen from hardware behaviour, not fitted; the GEMM efficiency it scales
comes from `slurmpod.perf.fitted`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from slurmpod.megatron.flops import attention_fmas_per_token, flops_per_token, mlp_fmas_per_token
from slurmpod.megatron.runspec import ModelConfig
from slurmpod.perf.fitted import Efficiency
from slurmpod.perf.hardware import Hardware
from slurmpod.perf.options import RunOptions

# A GEMM whose smallest per-GPU dimension is d runs at d / (d + GEMM_HALF_DIM) of the large-GEMM
# efficiency: at 128 (one 128x128 tensor-core tile) tile quantisation and the epilogue cost
# about as much as the math.
GEMM_HALF_DIM = 128.0
# Share of HBM bandwidth element-wise kernels reach.
HBM_EFFICIENCY = 0.7
# Bytes moved per element by element-wise work of one layer, forward + backward (bf16): hidden-
# sized tensors (2 norms, 2 bias-dropout-add, RoPE on q/k) and FFN-sized ones (activation).
ELEMENTWISE_BYTES_HIDDEN = 56.0
ELEMENTWISE_BYTES_FFN = 16.0
# FP8 (Transformer Engine): every FP8 GEMM quantizes its input in the forward and its output's
# gradient in the backward; per element, an amax pass (read bf16, 2 bytes; current scaling) and
# a fused cast-transpose (read 2, write the FP8 copy and its transpose for wgrad, 1 + 1).
FP8_CAST_BYTES = 6.0
# Achieved share of NVLink / NIC bandwidth by NCCL collectives (nccl-tests bus bandwidth is
# ~360 of 450 GB/s on H100 NVLink and ~45 of 50 GB/s per 400G NIC).
NVLINK_EFFICIENCY = 0.8
NIC_EFFICIENCY = 0.85
# Fixed cost per kernel: the GPU idles between dependent kernels (launch latency, the ramp-up
# and tail of each kernel's last wave), ~4 us on Hopper/Blackwell with the host running ahead.
# It is why a recipe prefers fewer, larger kernels: a larger micro-batch, fewer virtual stages,
# no needless CP (the kernels per layer: slurmpod.perf.model, DENSE_LAYER_KERNELS).
KERNEL_GAP_S = 4e-6
# With the whole iteration captured as one CUDA graph (Megatron main `--cuda-graph-impl
# full_iteration`, 2026) the host launches nothing per kernel; what stays is the boundary on the
# GPU (the last wave's tail, the next kernel's ramp), taken as a quarter of the gap.
GRAPHED_KERNEL_GAP_S = 1e-6


@dataclass(frozen=True, slots=True)
class Costs:
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


_COSTS: dict[tuple[Any, ...], Costs] = {}
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
# The fields layer_costs reads: the model's shape, not its layout or run settings.
_SHAPE_FIELDS = tuple(f.name for f in dataclasses.fields(ModelConfig)
                      if f.name not in _LAYOUT_DEFAULTS and f.name not in _RUN_FIELDS)


def layer_costs(c: ModelConfig) -> Costs:
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
    out = Costs(
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


def gemm_eff(d: float) -> float:
    """Share of the large-GEMM efficiency a GEMM whose smallest per-GPU dimension is `d`
    reaches (GEMM_HALF_DIM)."""
    return d / (d + GEMM_HALF_DIM)


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
class Micro:
    """One microbatch on one GPU: what every per-layer term reads. Not frozen: `predict` builds
    one per call, thousands of times a search, and a frozen dataclass's __init__ costs several
    times a plain one's."""

    c: ModelConfig
    k: Costs
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


def micro(c: ModelConfig, world: int, hw: Hardware, eff: Efficiency, opts: RunOptions
           ) -> Micro:
    """The per-token costs, speeds and recompute shares every term reads, computed once."""
    return Micro(c, layer_costs(c), hw, opts, *_rates(hw, eff, c.fp8 is not None, world),
                  *_recompute(c), c.micro_batch_size * c.seq_length / c.cp,
                  c.sequence_parallel and c.tp > 1, eff.moe_fp8_host_forward_s)


def kernel_gap(u: Micro) -> float:
    return GRAPHED_KERNEL_GAP_S if u.opts.graphed_iteration else KERNEL_GAP_S


def mlp_cast_bytes(u: Micro, tokens: float, ffn: float, h_shards: int = 1) -> float:
    """FP8 casts of an MLP's two GEMMs for `tokens` rows of FFN width `ffn` (per GPU): fc1's
    input (h) and output gradient (2 ffn gated, else ffn), fc2's input (ffn) and output
    gradient (h); the h-sized ones quantized on `h_shards` sequence shards (SP: TP)."""
    if not u.fp8:
        return 0.0
    fc1_out = (2.0 if u.c.swiglu else 1.0) * ffn
    return FP8_CAST_BYTES * tokens * (2 * u.c.hidden_size / h_shards + fc1_out + ffn)
