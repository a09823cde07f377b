"""Parameter counts and per-GPU memory: weights + gradients + optimizer, and activations.

Parameters follow Megatron-LM main's `compute_weight_and_optimizer_memory`
(megatron/training/theoretical_memory_usage.py, tags core_v0.18.0 - core_v0.19.0): bias-free
linear layers, norms of 1 (RMSNorm) or 2 (LayerNorm) vectors of h, routers, latent projections
and shared-expert gates; norms and routers replicated over TP, routed experts sharded over
ETP x EP with their optimizer over expert-DP. `megatron_weight_and_optimizer_bytes` is that
estimate exactly; slurmpod's own counts each pipeline rank from the real split (uneven stages,
embedding/loss slots, explicit layouts), shards the distributed optimizer over DP x CP as
megatron-core does, and knows the precision (FP8 weights and inputs, bf16 gradients),
Megatron-FSDP and optimizer offload. Activations follow Korthikanti et al. 2022 tensor by tensor
as Transformer Engine saves them, per rank over the schedule's in-flight chunks; see
docs/formulas.md.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from slurmpod.megatron.runspec import ModelConfig

GIB = 1024**3


@dataclass(frozen=True, slots=True)
class ParamCounts:
    dense_layer: float  # one transformer layer with a dense MLP
    moe_layer_nonexpert: float  # attention + norms + shared expert + router of one MoE layer
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
    # Held whole on every rank of a stage (Megatron main): norms, and per MoE layer the router,
    # the latent projections and the shared-expert gate.
    dense_layer_replicated: float = 0.0
    moe_layer_replicated: float = 0.0
    router: float = 0.0  # one MoE layer's router (h x E, + E with add_bias_linear)


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
    """Megatron-LM main's parameter count (theoretical_memory_usage.py, identical in
    core_v0.18.0 - core_v0.19.0): routers, latent projections and shared-expert gates counted;
    `active` holds the top-k routed experts of the block and the whole MTP block."""
    h = c.hidden_size
    norm = 1 if c.normalization == "RMSNorm" else 2
    glu = 1.5 if c.swiglu else 1.0  # per h x ffn pair: (2 or 3) matrices / 2
    attn = _attention_params(c, norm)
    norms = 2 * h * norm
    dense_layer = 2 * h * c.ffn_hidden_size * glu + norms + attn
    n_exp = c.num_experts or 0
    # Latent MoE: routed experts run at the latent width, between a down and an up projection.
    routed_h = c.moe_latent_size if c.moe_latent_size is not None else h
    expert = 2 * routed_h * c.moe_ffn_hidden_size * glu  # one routed expert
    shared = 2 * h * c.moe_shared_expert_intermediate_size * glu
    latent = 2 * h * c.moe_latent_size if (n_exp and c.moe_latent_size is not None) else 0
    router = h * n_exp + (n_exp if c.add_bias_linear else 0) if n_exp else 0
    gate = h if (c.moe_shared_expert_intermediate_size and c.moe_shared_expert_gate) else 0
    moe_replicated = norms + router + latent + gate
    moe_nonexpert = attn + shared + moe_replicated
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
    # Megatron main counts the MTP block whole in the active parameters (all its experts).
    active = block_ne + n_moe * moe_active + mtp_ne + mtp_e + emb_total
    return ParamCounts(dense_layer, moe_nonexpert, moe_expert, moe_active, embedding, final_norm,
                       total, active, block_ne, block_e, mtp_ne, mtp_e,
                       dense_layer_replicated=norms, moe_layer_replicated=moe_replicated,
                       router=router)


def bytes_per_param(distributed_optimizer: bool, shards: int) -> float:
    """bf16 weight (2) + fp32 grad (4) + fp32 master, Adam m and v (12); the distributed
    optimizer spreads the 12 bytes of optimizer state over `shards` ranks."""
    return 6 + 12 / shards if distributed_optimizer else 18


def _linear_weight_bytes(c: ModelConfig) -> float:
    """Bytes a GEMM weight occupies: bf16 (2); under FP8 Transformer Engine also keeps the
    quantized weight and its transpose for the next GEMMs (+2), unless the parameters
    themselves are FP8 (`fp8_param_gather`: 1 + 1 transpose, no bf16 copy)."""
    if c.fp8 is None:
        return 2.0
    return 2.0 if c.fp8_param_gather else 4.0


@dataclass(frozen=True, slots=True)
class WeightMemory:
    nonexpert_params_per_gpu: float
    expert_params_per_gpu: float
    bytes_per_gpu: float


@dataclass(frozen=True, slots=True)
class _RankParams:
    linear: float  # TP-sharded GEMM weights (attention, dense MLP, shared experts)
    replicated: float  # norms, routers, latent projections, gates
    embedding: float  # embedding and output-layer matrices (h x V each, whole)
    expert: float  # routed experts, whole (divide by ETP x EP)
    largest_layer: float  # the largest layer's parameters, whole (Megatron-FSDP's gather)


@lru_cache(maxsize=256)
def _moe_prefix(pattern: tuple[int, ...]) -> tuple[int, ...]:
    """Running count of MoE layers: layers i .. j-1 hold prefix[j] - prefix[i]."""
    return (0, *itertools.accumulate(pattern))


def _moe_between(c: ModelConfig, first: int, n: int) -> int:
    if not c.is_moe:
        return 0
    pre = _moe_prefix(c.moe_pattern)
    hi = min(first + n, len(pre) - 1)
    return pre[hi] - pre[min(first, hi)]


_MIX: dict[tuple[Any, ...], tuple[Any, tuple[tuple[tuple[int, int], ...], ...]]] = {}


def _chunk_mix(c: ModelConfig) -> tuple[tuple[tuple[int, int], ...], ...]:
    """(dense, MoE) layers of every chunk, [rank][virtual stage]; computed once per split and
    MoE pattern (the layout search evaluates thousands of layouts over a few splits)."""
    sp = c.pipeline_split()
    key = (id(sp), c.moe_pattern if c.is_moe else None)
    hit = _MIX.get(key)
    if hit is not None and hit[0] is sp:
        return hit[1]
    if len(_MIX) > 4096:
        _MIX.clear()
    mix = tuple(tuple((ch.decoder - (m := _moe_between(c, ch.first_layer, ch.decoder)), m)
                      for ch in row) for row in sp.chunks)
    _MIX[key] = (sp, mix)
    return mix


def _rank_params(c: ModelConfig, p: ParamCounts, rank: int) -> _RankParams:
    sp = c.pipeline_split()
    chunks = sp.chunks[rank]
    n_dense = sum(d for d, _ in _chunk_mix(c)[rank])
    n_moe = sum(m for _, m in _chunk_mix(c)[rank])
    mtp = sum(ch.mtp for ch in chunks)
    mtp_moe = mtp * (c.moe_pattern[-1] if c.is_moe else 0)
    n_dense += mtp - mtp_moe
    n_moe += mtp_moe
    has_e = any(ch.embedding for ch in chunks)
    has_l = any(ch.loss for ch in chunks)
    dense_lin = p.dense_layer - p.dense_layer_replicated
    moe_lin = p.moe_layer_nonexpert - p.moe_layer_replicated
    # The embedding is built on the first stage and on the stage holding MTP (core's
    # GPTModel: pre_process or mtp_process); the output layer on the loss stage (a copy of
    # the tied embedding when that is another stage).
    mats = int(has_e or mtp > 0)
    if has_l and (c.untie_embeddings_and_output_weights or not mats):
        mats += 1
    return _RankParams(
        linear=n_dense * dense_lin + n_moe * moe_lin,
        replicated=(n_dense * p.dense_layer_replicated + n_moe * p.moe_layer_replicated
                    + (p.final_norm if has_l else 0.0)),
        embedding=mats * p.embedding, expert=n_moe * p.moe_layer_expert,
        largest_layer=max(p.dense_layer if n_dense or not n_moe else 0.0,
                          p.moe_layer_nonexpert + p.moe_layer_expert if n_moe else 0.0))


def _rank_weight_bytes(c: ModelConfig, p: ParamCounts, rank: int,
                       world: int) -> WeightMemory:
    rp = _rank_params(c, p, rank)
    dp = max(1, world // (c.tp * c.pp * c.cp))
    edp = max(1, world // (c.etp * c.ep * c.pp))
    nonexpert = (rp.linear + rp.embedding) / c.tp + rp.replicated
    expert = rp.expert / (c.etp * c.ep)
    w_lin = _linear_weight_bytes(c)
    # fp32 master, Adam m and v (or the precision-aware optimizer's dtypes), less the share
    # offloaded to the host.
    opt = c.optimizer_state_bytes * (1.0 - c.optimizer_offload_fraction)
    # Sharding of (weights, grads, optimizer) over the data-parallel ranks: the distributed
    # optimizer shards the optimizer over DP x CP (megatron-core's data-parallel group with
    # context parallel); Megatron-FSDP also shards grads and/or weights.
    strategy = c.dp_sharding
    w_div, g_div, o_div = {"no_shard": (1, 1, 1), "optim": (1, 1, None),
                           "optim_grads": (1, None, None),
                           "optim_grads_params": (None, None, None)}[strategy]

    def per_param(weight_bytes: float, shards: int) -> float:
        return (weight_bytes / (w_div or shards) + c.grad_bytes / (g_div or shards)
                + opt / (o_div or shards))

    lin_ne = rp.linear / c.tp
    rest_ne = rp.embedding / c.tp + rp.replicated
    total = (lin_ne * per_param(w_lin, dp * c.cp) + rest_ne * per_param(2.0, dp * c.cp)
             + expert * per_param(w_lin, edp))
    if c.megatron_fsdp and strategy == "optim_grads_params":
        # Unsharded working set: the layer being computed and the one prefetched (weights),
        # and one layer's full gradient before its reduce-scatter.
        total += rp.largest_layer / c.tp * (2 * w_lin + c.grad_bytes)
    return WeightMemory(nonexpert, expert, total)


def rank_weight_bytes(c: ModelConfig, world_size: int) -> list[WeightMemory]:
    """Weights + grads + optimizer state on each pipeline rank (one GPU of it)."""
    p = param_counts(c)
    rows = c.pipeline_split().chunks
    mix = _chunk_mix(c)
    seen: dict[tuple[object, ...], WeightMemory] = {}
    out = []
    for r in range(c.pp):
        # Ranks with the same chunk shapes (all middle ranks of an even split) weigh the same
        # unless the MoE pattern differs between them.
        key = (tuple((ch.embedding, ch.loss, ch.mtp) for ch in rows[r]), mix[r])
        if key not in seen:
            seen[key] = _rank_weight_bytes(c, p, r, world_size)
        out.append(seen[key])
    return out


def weight_and_optimizer_bytes(c: ModelConfig, world_size: int) -> WeightMemory:
    """Weights + grads + optimizer state on the GPU of the most loaded pipeline rank."""
    return max(rank_weight_bytes(c, world_size), key=lambda w: w.bytes_per_gpu)


def megatron_weight_and_optimizer_bytes(c: ModelConfig, world_size: int) -> float:
    """Megatron-LM main's own `compute_weight_and_optimizer_memory` (core_v0.18.0+): GEMM
    weights / TP, norms, routers and gates replicated, routed experts / (ETP x EP) with their
    optimizer over expert-DP; 1/PP of the block plus the MTP block and one embedding on the
    most loaded shard; optimizer over DP = world / (TP x PP x CP); bf16 + fp32 grads."""
    p = param_counts(c)
    dp = max(1, world_size // (c.tp * c.pp * c.cp))
    edp = max(1, world_size // (c.etp * c.ep * c.pp))
    n_moe = c.num_moe_layers
    n_dense = c.num_layers - n_moe
    mtp_moe = (c.moe_pattern[-1] if c.is_moe else 0) * c.mtp_num_layers
    mtp_dense = c.mtp_num_layers - mtp_moe
    dense_lin = p.dense_layer - p.dense_layer_replicated
    moe_lin = p.moe_layer_nonexpert - p.moe_layer_replicated
    tp_block = n_dense * dense_lin + n_moe * moe_lin
    tp_mtp = mtp_dense * dense_lin + mtp_moe * moe_lin
    rep_block = n_dense * p.dense_layer_replicated + n_moe * p.moe_layer_replicated + p.final_norm
    rep_mtp = mtp_dense * p.dense_layer_replicated + mtp_moe * p.moe_layer_replicated
    tp_shard = (tp_block / c.pp + tp_mtp + p.embedding) / c.tp
    if c.untie_embeddings_and_output_weights and c.pp == 1:
        tp_shard += p.embedding / c.tp
    rep = rep_block / c.pp + rep_mtp
    expert = (n_moe * p.moe_layer_expert / c.pp + mtp_moe * p.moe_layer_expert) / (c.etp * c.ep)
    return ((tp_shard + rep) * bytes_per_param(c.use_distributed_optimizer, dp)
            + expert * bytes_per_param(c.use_distributed_optimizer, edp))


def num_microbatches(c: ModelConfig, world_size: int) -> int | None:
    dp = world_size // (c.tp * c.pp * c.cp)
    if not c.global_batch_size or dp < 1:
        return None
    return max(1, c.global_batch_size // (c.micro_batch_size * dp))


def layer_activation_bytes(c: ModelConfig, moe: bool) -> float:
    """Bytes one transformer layer keeps for backward, per microbatch, on one GPU.

    Korthikanti et al. 2022 §4 counted tensor by tensor, as megatron-core with Transformer
    Engine saves them: the two norm inputs (bf16), the inputs of the QKV and FC1 GEMMs (bf16,
    or 1 byte under FP8: TE saves the quantized input for the weight gradient), two dropout
    masks of 1 byte (none when hidden_dropout = 0: PyTorch's dropout with p = 0 returns its
    input), Q, K, V and the attention output (flash attention saves them; under FP8 the output
    projection also saves its FP8 copy), the query and key norms' inputs (bf16, `qk_layernorm`),
    the activation-function input (bf16) and the FC2 input
    (bf16, or FP8). Outside the TP regions everything is divided by TP only with sequence
    parallel. Core-attention scores are never kept (fused/flash attention, Megatron's
    default). Selective `recompute_modules` drop what their module recomputes.
    """
    s = c.seq_length / c.cp  # context parallel splits the sequence
    b = c.micro_batch_size
    h = c.hidden_size
    sp_div = c.tp if c.sequence_parallel else 1
    lin = 1.0 if c.fp8 is not None else 2.0  # bytes of a saved GEMM input
    mask = 1.0 if c.hidden_dropout > 0 else 0.0
    selective = c.recompute_granularity == "selective"
    mods = set(c.recompute_modules) if selective else set()
    replicated = s * b * h * (4 + 2 * lin + 2 * mask) / sp_div
    a = c.num_attention_heads
    if c.multi_latent_attention:
        qk = c.qk_head_dim + c.qk_pos_emb_head_dim
        latents = (c.q_lora_rank or 0) + c.kv_lora_rank
        # The compressed latents: their norm input (bf16) and the up-projections' inputs.
        attn = s * b * latents * (2 + lin)
        if "mla_up_proj" not in mods:
            attn += 2 * s * b * (2 * a * qk + a * c.v_head_dim)  # Q, K, V (up-projected)
        attn += 2 * s * b * a * c.v_head_dim  # attention output, saved by flash attention
        attn += s * b * a * c.v_head_dim if c.fp8 is not None else 0.0  # its FP8 copy
    else:
        q = a * c.kv_channels
        kv = c.num_query_groups * c.kv_channels
        attn = 2 * s * b * (q + 2 * kv) + 2 * s * b * q  # Q, K, V and the attention output
        attn += s * b * q if c.fp8 is not None else 0.0  # the output projection's FP8 input
        if c.qk_layernorm:
            # The per-head query and key norms keep their bf16 inputs (the QKV GEMM's output,
            # before RoPE) for backward; no recompute module covers them (core 0.13-main
            # `SelfAttention.get_query_key_value_tensors`).
            attn += 2 * s * b * (q + kv)
    act_in = 2 if c.swiglu else 1  # the activation reads the (gate, up) output: 2 x ffn wide

    def mlp_bytes(tokens: float, width: int, act_recompute: bool) -> float:
        return tokens * width * (2 * act_in + (0.0 if act_recompute else lin))

    if moe:
        # Balanced routing: each GPU processes top-k copies of its own tokens on average.
        routed = 0.0
        if "moe" not in mods:
            width = c.moe_latent_size or h
            routed = c.moe_router_topk * (
                s * b * width * lin + mlp_bytes(s * b, c.moe_ffn_hidden_size, "moe_act" in mods))
        shared = (0.0 if "shared_experts" in mods or "moe" in mods
                  else mlp_bytes(s * b, c.moe_shared_expert_intermediate_size, False))
        router = 4 * s * b * (c.num_experts or 0)  # fp32 router logits
        mlp = routed + shared + router
    else:
        mlp = 0.0 if "mlp" in mods else mlp_bytes(s * b, c.ffn_hidden_size, False)
    return replicated + (attn + mlp) / c.tp


@dataclass(frozen=True, slots=True)
class ActivationMemory:
    per_layer_bytes: float  # largest layer, one microbatch
    in_flight_microbatches: float
    bytes_per_gpu: float


def _in_flight_chunks(c: ModelConfig, rank: int, nmb: int | None) -> list[int]:
    """Virtual stage of every model chunk whose activations `rank` holds at the end of its
    warm-up (the peak): megatron-core's schedules (pipeline_parallel/schedules.py), 1F1B
    warms up PP - rank - 1 microbatches, the interleaved schedule 2(PP - rank - 1) +
    (VPP - 1) PP chunks, forwarding PP microbatches per virtual stage in turn; plus the one
    forward of the first steady step."""
    pp, v = c.pp, c.vpp or 1
    if pp == 1:
        return [0]
    total = (nmb if nmb is not None else pp) * v
    if v == 1:
        return [0] * min(pp - rank, total)
    warm = min(2 * (pp - rank - 1) + (v - 1) * pp, total)
    return [(k // pp) % v for k in range(min(warm + 1, total))]


def _in_flight_counts(c: ModelConfig, rank: int, nmb: int | None) -> list[int]:
    """How many of `_in_flight_chunks` sit on each virtual stage, counted without the list
    (the layout search asks for this thousands of times)."""
    pp, v = c.pp, c.vpp or 1
    if pp == 1:
        return [1]
    total = (nmb if nmb is not None else pp) * v
    if v == 1:
        return [min(pp - rank, total)]
    n = min(min(2 * (pp - rank - 1) + (v - 1) * pp, total) + 1, total)
    # Chunk k sits on virtual stage (k // pp) % v: whole rounds of pp * v, then a remainder.
    rounds, rest = divmod(n, pp * v)
    counts = [rounds * pp] * v
    full, part = divmod(rest, pp)
    for vs in range(full):
        counts[vs] += pp
    if part:
        counts[full] += part
    return counts


def rank_activation_bytes(c: ModelConfig, world_size: int) -> list[ActivationMemory]:
    """Activation bytes at peak on each pipeline rank."""
    s = c.seq_length / c.cp
    b, h = c.micro_batch_size, c.hidden_size
    sp_div = c.tp if c.sequence_parallel else 1
    dense_act = layer_activation_bytes(c, False)
    moe_act = layer_activation_bytes(c, True) if c.is_moe else 0.0
    layer_input = 2 * s * b * h / sp_div
    nmb = num_microbatches(c, world_size)
    mask = 1.0 if c.hidden_dropout > 0 else 0.0
    out: list[ActivationMemory] = []
    split = c.pipeline_split()
    mtp_kind_moe = bool(c.is_moe and c.moe_pattern[-1])
    mix = _chunk_mix(c)
    for rank, chunks in enumerate(split.chunks):
        per_chunk: list[float] = []
        working = 0.0
        for ch, (nd, nm) in zip(chunks, mix[rank], strict=True):
            mtp_full = ch.mtp * (moe_act if mtp_kind_moe else dense_act)
            n = ch.decoder
            full = nd * dense_act + nm * moe_act
            avg = full / n if n else 0.0
            if c.recompute_granularity == "full" and n:
                k = c.recompute_num_layers or 1
                if c.recompute_method == "block":
                    kept = min(k, n) * layer_input + max(0, n - k) * avg
                    working = max(working, avg)
                else:  # uniform: the input of every group of k layers
                    kept = math.ceil(n / k) * layer_input
                    working = max(working, min(k, n) * avg)
            else:
                kept = full
            if c.cpu_offloading_num_layers and n:
                # Megatron's activation offloading moves that many layers' activations to
                # the host (the layer being computed stays).
                kept -= min(c.cpu_offloading_num_layers, n - 1) * avg
            kept += mtp_full
            if ch.embedding:
                # Token ids (int64) and the embedding's dropout mask, as Megatron counts them.
                kept += (8 * s * b + mask * s * b * h) / sp_div
            per_chunk.append(kept)
        counts = _in_flight_counts(c, rank, nmb)
        total = sum(k * per_chunk[v] for v, k in enumerate(counts) if k) + working
        if any(ch.loss for ch in chunks):
            # Output layer: the final norm output and the fp32 logits of one microbatch (and
            # one more set per MTP layer on that stage).
            logits = 4 * s * b * h / sp_div + 4 * s * b * c.padded_vocab_size / c.tp
            total += logits * (1 + sum(ch.mtp for ch in chunks))
        out.append(ActivationMemory(max(dense_act, moe_act),
                                    sum(counts) / max(1, len(chunks)), total))
    return out


def activation_bytes(c: ModelConfig, world_size: int) -> ActivationMemory:
    """Activation bytes at peak on the most loaded pipeline rank."""
    return max(rank_activation_bytes(c, world_size), key=lambda a: a.bytes_per_gpu)


@dataclass(frozen=True, slots=True)
class RankMemory:
    rank: int  # pipeline rank
    weights: WeightMemory
    activations: ActivationMemory

    @property
    def bytes_per_gpu(self) -> float:
        return self.weights.bytes_per_gpu + self.activations.bytes_per_gpu


# How far below a run's measured peak the estimate may fall: on the published peaks of
# tests/data/perf/memory.toml it is low on all eleven, by up to 5.8 % (docs/perf-model.md,
# "Memory against published peaks"). A plan that fits by less than this may still run out.
ESTIMATE_LOW_BY = 0.06


def fits_tightly(need_bytes: float, usable_bytes: float) -> bool:
    """Fits, but by less than ESTIMATE_LOW_BY of the estimate: it may still run out of memory
    (`plan` warns, `plan --search` marks the candidate)."""
    return need_bytes <= usable_bytes < need_bytes * (1 + ESTIMATE_LOW_BY)


def peak_memory(c: ModelConfig, world_size: int) -> RankMemory:
    """The pipeline rank whose GPUs need the most memory, with its weights and activations."""
    ws = rank_weight_bytes(c, world_size)
    acts = rank_activation_bytes(c, world_size)
    return max((RankMemory(r, ws[r], acts[r]) for r in range(c.pp)),
               key=lambda m: m.bytes_per_gpu)


# --- What HBM the estimate above does not see: the runtime's reserve (docs/formulas.md, "Fit").
# Each figure is a documented default or a published measurement; none is fitted to the recipes.
MIB = 1024**2
# HBM the driver keeps (ECC, its own structures): PyTorch reports an H100 80 GB's "total
# capacity" as 79.18 GiB (OOM message quoted in vllm-project/compressed-tensors PR #587), so
# ~1.0 % of the nominal HBM is never seen by CUDA.
NOT_VISIBLE_FRACTION = 1 - 79.18 / 80
# CUDA context with the kernels a process loads lazily (CUDA >= 12.2 loads modules lazily by
# default on Linux, CUDA Programming Guide "Lazy Loading"): the same PR's H100 process held
# 78.09 GiB of which 75.31 allocated and 1.83 cached by PyTorch, so 0.95 GiB outside PyTorch
# (context, cuBLAS handle and workspace); rounded up for cuDNN and Transformer Engine's kernels.
CUDA_CONTEXT_GIB = 1.0
# cuBLAS/cuBLASLt workspace per stream: 32 MiB from Hopper on, 4 MiB before (cuBLAS docs,
# cublasSetWorkspace). Megatron with Transformer Engine runs GEMMs on the compute stream,
# TE's own, and with --tp-comm-overlap on its overlap streams: 4 streams counted.
CUBLAS_WORKSPACE_MIB = {True: 32, False: 4}
CUBLAS_STREAMS = 4
# NCCL's per-connection buffers (nccl src/init.cc, 2.18-2.27): Simple NCCL_BUFFSIZE 4 MiB
# (1 << 22), LL128 120 x 640 x 8 steps x 8 B = 4,915,200 B, LL 8 x 512 x 8 x 16 B = 512 KiB:
# 9.19 MiB per ring connection and channel (the figure NCCL-heavy deployments measure, e.g.
# tonyd2wild/DeepSeek-V4.1-Flash-vLLM-DGX-Spark issue #8).
NCCL_CONNECTION_BYTES = (1 << 22) + 120 * 640 * 8 * 8 + 8 * 512 * 8 * 16
# Channels a collective communicator opens at most (NCCL_MAX_NCHANNELS' default, MAXCHANNELS
# 32): an upper bound, NCCL opens fewer on smaller groups.
NCCL_MAX_CHANNELS = 32
# Point-to-point (PP sends, CP ring, EP all-to-all): NCCL_NCHANNELS_PER_NET_PEER / per-peer
# channels default 2, each with a Simple buffer of NCCL_BUFFSIZE.
NCCL_P2P_CHANNELS_PER_PEER = 2
NCCL_BUFFSIZE = 1 << 22
# NVLink SHARP (NVLS, Hopper and later NVSwitch systems, on by default for groups of > 2 GPUs
# of one NVLink domain): "nvlsPerRankSize 301989888" (288 MiB) per rank of an 8 x H100
# communicator (NCCL INFO line quoted in vllm-project/vllm issue #9699).
NCCL_NVLS_BYTES = 301989888
# PyTorch's caching allocator holds memory it cannot hand out (segments split by earlier
# blocks): 1.83 GiB of 77.14 GiB reserved on the H100 above (2.4 %), 1.15 GiB of 29.97 GiB
# on a V100 Megatron-LM run (NVIDIA/Megatron-LM issue #525, 3.8 %). The larger share, of the
# pool the allocator manages at the fit limit (HBM less the fixed parts above).
FRAGMENTATION_FRACTION = 0.04


@dataclass(frozen=True, slots=True)
class MeasuredReserve:
    """The reserve as a site's own Megatron jobs measured it on one GPU model (`slurmpod
    calibrate`, perf/reserve.py), GiB per GPU: PyTorch's cache and fragmentation (max reserved
    - max allocated) and, where the jobs logged `--log-device-memory-used`, what the process
    held outside PyTorch (device memory used - reserved: CUDA context, NCCL, workspaces)."""

    gpu_model: str
    hbm_gib: float
    cached_gib: float
    outside_torch_gib: float | None
    jobs: int  # jobs the cache figure comes from
    jobs_outside: int  # jobs the outside-PyTorch figure comes from

    def applies_to(self, hbm_gib: float) -> bool:
        return abs(self.hbm_gib - hbm_gib) < 0.5


@dataclass(frozen=True, slots=True)
class RuntimeReserve:
    """HBM per GPU a training process needs beyond weights, optimizer and activations (GiB)."""

    not_visible_gib: float
    cuda_context_gib: float
    workspaces_gib: float
    nccl_gib: float
    fragmentation_gib: float
    # "" when every part is a published figure; else which parts this site measured
    measured: str = ""

    @property
    def total_gib(self) -> float:
        return (self.not_visible_gib + self.cuda_context_gib + self.workspaces_gib
                + self.nccl_gib + self.fragmentation_gib)

    def breakdown(self) -> dict[str, float]:
        return {"not_visible": self.not_visible_gib, "cuda_context": self.cuda_context_gib,
                "workspaces": self.workspaces_gib, "nccl": self.nccl_gib,
                "fragmentation": self.fragmentation_gib, "total": self.total_gib}


def _communicators(c: ModelConfig, world: int,
                   gpus_per_node: int) -> list[tuple[str, int, int]]:
    """Megatron's process groups that carry traffic, each (kind, ranks, ranks on one node),
    in megatron-core's rank order tp-cp-ep-dp-pp (parallel_state.py): TP and CP ranks
    adjacent, DP strided by TP x CP."""
    dense = c.tp * c.cp * c.pp
    dp = max(1, world // dense)
    edp = max(1, world // (c.etp * c.ep * c.pp))
    local_dp = max(1, min(dp * c.cp, gpus_per_node // max(1, c.tp)))
    groups = [("ring", c.tp, min(c.tp, gpus_per_node)),
              ("p2p", c.cp, min(c.cp, max(1, gpus_per_node // c.tp))),
              ("ring", dp * c.cp, local_dp),  # gradients: the DP x CP group
              ("p2p", min(c.pp, 3), 1)]  # a stage sends to the next and receives from the last
    if c.is_moe:
        groups += [("a2a", c.ep, min(c.ep, gpus_per_node)), ("ring", edp, 1)]
    return [g for g in groups if g[1] > 1]


def nccl_reserve_bytes(c: ModelConfig, world: int, gpus_per_node: int, *,
                       nvls: bool = True) -> float:
    """NCCL buffers per GPU over the communicators Megatron uses (module constants)."""
    total = 0.0
    for kind, ranks, local in _communicators(c, world, gpus_per_node):
        if kind == "ring":
            total += NCCL_MAX_CHANNELS * NCCL_CONNECTION_BYTES
            if nvls and local > 2:
                total += NCCL_NVLS_BYTES
        else:  # p2p: both neighbours of a ring or pipeline; every peer of an all-to-all
            peers = ranks - 1 if kind == "a2a" else min(2, ranks - 1)
            total += peers * NCCL_P2P_CHANNELS_PER_PEER * NCCL_BUFFSIZE
    return total


def runtime_reserve(c: ModelConfig, world: int, hbm_gib: float, *, gpus_per_node: int,
                    hopper_or_later: bool = True, measured: MeasuredReserve | None = None
                    ) -> RuntimeReserve:
    """The HBM per GPU kept free for the runtime, each part from a cited figure (module
    constants above): usable = HBM - total_gib. A site's own measurement of this GPU
    (`measured`) replaces the parts it covers: its cache figure the fragmentation share, its
    outside-PyTorch figure the context, workspaces and NCCL buffers (of its jobs' layouts)."""
    not_visible = NOT_VISIBLE_FRACTION * hbm_gib
    work = CUBLAS_STREAMS * CUBLAS_WORKSPACE_MIB[hopper_or_later] * MIB / GIB
    nccl = nccl_reserve_bytes(c, world, gpus_per_node, nvls=hopper_or_later) / GIB
    fixed = not_visible + CUDA_CONTEXT_GIB + work + nccl
    frag = FRAGMENTATION_FRACTION * max(0.0, hbm_gib - fixed)
    if measured is None or not measured.applies_to(hbm_gib):
        return RuntimeReserve(not_visible, CUDA_CONTEXT_GIB, work, nccl, frag)
    if measured.outside_torch_gib is None:
        return RuntimeReserve(not_visible, CUDA_CONTEXT_GIB, work, nccl, measured.cached_gib,
                              f"cache measured on {measured.jobs} job(s)")
    return RuntimeReserve(not_visible, measured.outside_torch_gib, 0.0, 0.0,
                          measured.cached_gib,
                          f"measured on {measured.jobs} job(s)")
