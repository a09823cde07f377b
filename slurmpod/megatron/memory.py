"""Parameter counts and per-GPU memory: weights + gradients + optimizer, and activations.

Parameters follow Megatron-LM's `compute_weight_and_optimizer_memory`
(megatron/training/theoretical_memory_usage.py, megatron-core 0.14): bias-free linear layers,
norms of 1 (RMSNorm) or 2 (LayerNorm) vectors of h, no router weights. Per-GPU bytes are taken
on the most loaded pipeline stage (1/PP of the layers + the embedding + the MTP block).
slurmpod extends Megatron in two places, both exact for dense models without CP:
- expert weights are sharded over ETP x EP and their distributed-optimizer state over
  expert-DP = world / (ETP x EP x PP) (megatron-core's parallel folding), while Megatron's
  estimate divides every parameter by TP only;
- the distributed optimizer shards over DP x CP (megatron-core shards over the
  data-parallel-with-context-parallel group), where Megatron's estimate uses DP.
Activations follow Korthikanti et al. 2022 (Table 2) made MoE-, GQA-, SwiGLU- and CP-aware; see
docs/formulas.md.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from slurmpod.megatron.runspec import ModelConfig

GIB = 1024**3


@dataclass(frozen=True, slots=True)
class ParamCounts:
    dense_layer: float  # one transformer layer with a dense MLP
    moe_layer_nonexpert: float  # attention + norms + shared expert of one MoE layer
    moe_layer_expert: float  # the routed experts of one MoE layer (all of them)
    moe_layer_active_expert: float  # the top-k routed experts one token uses
    embedding: float  # one embedding matrix (h x padded vocab)
    final_norm: float
    total: float
    active: float
    block_nonexpert: float  # transformer block (layers + final norm), non-expert part
    block_expert: float
    mtp_nonexpert: float
    mtp_expert: float


def _attention_params(c: ModelConfig, norm: int) -> float:
    h, a = c.hidden_size, c.num_attention_heads
    if c.multi_latent_attention:
        qk = c.qk_head_dim + c.qk_pos_emb_head_dim
        q = h * a * qk if c.q_lora_rank is None else c.q_lora_rank * (h + a * qk + norm)
        return (q + c.kv_lora_rank * (h + a * (c.qk_head_dim + c.v_head_dim) + norm)
                + h * c.qk_pos_emb_head_dim + a * c.v_head_dim * h)
    q = c.kv_channels * a
    # Q and O projections are h x q; K and V are h x (kv_channels x groups).
    return 2 * h * q * (1 + c.num_query_groups / a)


def param_counts(c: ModelConfig) -> ParamCounts:
    h = c.hidden_size
    norm = 1 if c.normalization == "RMSNorm" else 2
    glu = 1.5 if c.swiglu else 1.0  # per h x ffn pair: (2 or 3) matrices / 2
    attn = _attention_params(c, norm)
    norms = 2 * h * norm
    dense_layer = 2 * h * c.ffn_hidden_size * glu + norms + attn
    n_exp = c.num_experts or 0
    expert = 2 * h * c.moe_ffn_hidden_size * glu  # one routed expert
    shared = 2 * h * c.moe_shared_expert_intermediate_size * glu
    moe_nonexpert = attn + norms + shared
    moe_expert = n_exp * expert
    moe_active = min(c.moe_router_topk, n_exp) * expert
    n_moe = c.num_moe_layers
    n_dense = c.num_layers - n_moe
    final_norm = norm * h
    embedding = h * c.padded_vocab_size
    emb_total = embedding * (2 if c.untie_embeddings_and_output_weights else 1)
    mtp_moe = (c.moe_pattern[-1] if c.is_moe else 0) * c.mtp_num_layers
    mtp_dense = c.mtp_num_layers - mtp_moe
    block_ne = n_dense * dense_layer + n_moe * moe_nonexpert + final_norm
    block_e = n_moe * moe_expert
    mtp_ne = mtp_dense * dense_layer + mtp_moe * moe_nonexpert
    mtp_e = mtp_moe * moe_expert
    total = block_ne + block_e + mtp_ne + mtp_e + emb_total
    active = block_ne + n_moe * moe_active + mtp_ne + mtp_moe * moe_active + emb_total
    return ParamCounts(dense_layer, moe_nonexpert, moe_expert, moe_active, embedding, final_norm,
                       total, active, block_ne, block_e, mtp_ne, mtp_e)


def bytes_per_param(distributed_optimizer: bool, shards: int) -> float:
    """bf16 weight (2) + fp32 grad (4) + fp32 master, Adam m and v (12); the distributed
    optimizer spreads the 12 bytes of optimizer state over `shards` ranks."""
    return 6 + 12 / shards if distributed_optimizer else 18


@dataclass(frozen=True, slots=True)
class WeightMemory:
    nonexpert_params_per_gpu: float
    expert_params_per_gpu: float
    bytes_per_gpu: float


def weight_and_optimizer_bytes(c: ModelConfig, world_size: int) -> WeightMemory:
    """Weights + grads + optimizer state on the most loaded GPU (slurmpod's MoE-aware form)."""
    p = param_counts(c)
    dp = max(1, world_size // (c.tp * c.pp * c.cp))
    edp = max(1, world_size // (c.etp * c.ep * c.pp))
    # Share of the block on the most loaded stage: 1/PP, or the largest uneven stage.
    share = c.stage_layers()[1] / c.num_layers
    nonexpert = (p.block_nonexpert * share + p.mtp_nonexpert + p.embedding) / c.tp
    if c.untie_embeddings_and_output_weights and c.pp == 1:
        nonexpert += p.embedding / c.tp  # first stage is also the last: holds the output layer
    expert = (p.block_expert * share + p.mtp_expert) / (c.etp * c.ep)
    total = (nonexpert * bytes_per_param(c.use_distributed_optimizer, dp * c.cp)
             + expert * bytes_per_param(c.use_distributed_optimizer, edp))
    return WeightMemory(nonexpert, expert, total)


def megatron_weight_and_optimizer_bytes(c: ModelConfig, world_size: int) -> float:
    """Megatron's own estimate (every parameter / TP; optimizer / DP), for comparison."""
    p = param_counts(c)
    dp = max(1, world_size // (c.tp * c.pp * c.cp))
    block = p.block_nonexpert + p.block_expert
    mtp = p.mtp_nonexpert + p.mtp_expert
    shard = (block / c.pp + mtp + p.embedding) / c.tp
    if c.untie_embeddings_and_output_weights and c.pp == 1:
        shard += p.embedding / c.tp
    return shard * bytes_per_param(c.use_distributed_optimizer, dp)


def num_microbatches(c: ModelConfig, world_size: int) -> int | None:
    dp = world_size // (c.tp * c.pp * c.cp)
    if not c.global_batch_size or dp < 1:
        return None
    return max(1, c.global_batch_size // (c.micro_batch_size * dp))


def layer_activation_bytes(c: ModelConfig, moe: bool) -> float:
    """Bytes one transformer layer keeps for backward, per microbatch, on one GPU.

    Korthikanti et al. 2022 §4: 10sbh outside the TP regions (two norm inputs 4, attention and
    MLP inputs 2 + 2, two dropout masks 1 + 1; divided by TP only with sequence parallel) and
    the TP-sharded projections. Core-attention scores are not kept (flash/fused attention via
    Transformer Engine, the Megatron default), which is exactly what selective recompute gives.
    """
    s = c.seq_length / c.cp  # context parallel splits the sequence
    b = c.micro_batch_size
    h = c.hidden_size
    sp_div = c.tp if c.sequence_parallel else 1
    replicated = 10 * s * b * h / sp_div
    if c.multi_latent_attention:
        qk = c.qk_head_dim + c.qk_pos_emb_head_dim
        a = c.num_attention_heads
        attn = 2 * s * b * (2 * a * qk + 2 * a * c.v_head_dim)  # Q, K, V, out-proj input
    else:
        q = c.num_attention_heads * c.kv_channels
        kv = c.num_query_groups * c.kv_channels
        attn = 2 * s * b * (2 * q + 2 * kv)  # Q, K, V and the output-projection input
    act_in = 2 if c.swiglu else 1  # the activation reads the (gate, up) output: 2 x ffn wide
    if moe:
        per_expert = 2 * s * b * (h + c.moe_ffn_hidden_size * (act_in + 1))
        shared = 2 * s * b * c.moe_shared_expert_intermediate_size * (act_in + 1)
        # Balanced routing: each GPU processes top-k copies of its own tokens on average.
        mlp = c.moe_router_topk * per_expert + shared
    else:
        mlp = 2 * s * b * c.ffn_hidden_size * (act_in + 1)
    return replicated + (attn + mlp) / c.tp


@dataclass(frozen=True, slots=True)
class ActivationMemory:
    per_layer_bytes: float  # largest layer, one microbatch
    in_flight_microbatches: float
    bytes_per_gpu: float


def activation_bytes(c: ModelConfig, world_size: int) -> ActivationMemory:
    """Activation bytes on the first pipeline stage (the most loaded one) at peak."""
    s = c.seq_length / c.cp
    b, h = c.micro_batch_size, c.hidden_size
    sp_div = c.tp if c.sequence_parallel else 1
    stage_layers = c.stage_layers()[0]
    # Layer kinds on the first stage (MoE patterns usually start dense, e.g. DeepSeek-V3).
    first = c.moe_pattern[: max(1, math.ceil(stage_layers))]
    moe_frac = sum(first) / len(first) if c.is_moe else 0.0
    dense_act = layer_activation_bytes(c, False)
    moe_act = layer_activation_bytes(c, True) if c.is_moe else 0.0
    full_layer = (1 - moe_frac) * dense_act + moe_frac * moe_act
    layer_input = 2 * s * b * h / sp_div
    if c.recompute_granularity == "full":
        n = c.recompute_num_layers or 1
        if c.recompute_method == "block":
            kept = min(n, stage_layers) * layer_input + max(0.0, stage_layers - n) * full_layer
            working = full_layer
        else:  # uniform: checkpoint the input of every group of n layers
            kept = math.ceil(stage_layers / n) * layer_input
            working = n * full_layer
        per_mb_stage = kept
    else:
        per_mb_stage = stage_layers * full_layer
        working = 0.0
    per_mb_stage += (8 * s * b + s * b * h) / sp_div  # token ids (int64) + embedding dropout mask
    if c.pp == 1:
        in_flight = 1.0
    elif c.vpp:
        in_flight = c.pp * (1 + (c.pp - 1) / (c.pp * c.vpp))
    else:
        nmb = num_microbatches(c, world_size)
        in_flight = float(min(c.pp, nmb) if nmb is not None else c.pp)
    total = per_mb_stage * in_flight + working
    if c.pp == 1:
        # Output layer on the same stage: final-norm output and fp32 logits for the loss.
        total += 4 * s * b * h / sp_div + 4 * s * b * c.padded_vocab_size / c.tp
    return ActivationMemory(max(dense_act, moe_act), in_flight, total)
