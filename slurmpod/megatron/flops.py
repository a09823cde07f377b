"""Model FLOPs per training iteration, with the arithmetic of Megatron-LM's
`num_floating_point_operations` (megatron/training/training.py, main branch, megatron-core 0.14).

Model FLOPs count forward + backward (3 GEMM passes: fwd, dgrad, wgrad) at 2 FLOPs per
multiply-add, over the transformer layers (dense, MoE, MLA, GQA, SwiGLU), the MTP modules and the
logits. Core attention is causal-halved. Activation recomputation is *not* counted (that would be
hardware FLOPs). slurmpod computes this itself so that TFLOP/s and MFU do not depend on which
Megatron release a job ran; `FLOPS_FORMULA_VERSION` is stored next to every figure.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from slurmpod.errors import ConfigError
from slurmpod.megatron.runspec import MegatronArgs, ModelConfig

FLOPS_FORMULA_VERSION = "megatron-core-0.14-main"

# fwd + dgrad + wgrad, times 2 FLOPs per FMA.
_GEMM_PASSES = 3
_FLOPS_PER_FMA = 2


def _config(cfg: Mapping[str, Any] | MegatronArgs | ModelConfig) -> ModelConfig:
    return ModelConfig.from_args(cfg)


def attention_fmas_per_token(c: ModelConfig) -> float:
    """Multiply-adds per token in one self-attention block (projections + causal core)."""
    h, a, s = c.hidden_size, c.num_attention_heads, c.seq_length
    if c.multi_latent_attention:
        qk = c.qk_head_dim + c.qk_pos_emb_head_dim
        # With a q LoRA: down-projection, up-projection and the q norm (1 FMA per latent elt).
        q_proj = h * a * qk if c.q_lora_rank is None else c.q_lora_rank * (h + a * qk + 1)
        kv_proj = c.kv_lora_rank * (h + a * (c.qk_head_dim + c.v_head_dim) + 1)
        rope_k = h * c.qk_pos_emb_head_dim
        out_proj = a * c.v_head_dim * h
        # QK^T over the qk + rope dims, then scores x V, each over half the sequence (causal).
        core = s * a * qk / 2 + s * a * c.v_head_dim / 2
        return q_proj + kv_proj + rope_k + out_proj + core
    q = c.kv_channels * a
    kv = c.kv_channels * c.num_query_groups
    gate = q if c.attention_output_gate else 0
    projections = h * (q + 2 * kv + gate) + q * h
    core = 2 * q * s / 2  # QK^T and (QK^T)V, causal half
    return projections + core


def _ffn_factor(c: ModelConfig) -> int:
    # SwiGLU stacks two h->ffn GEMMs (gate, up) before ffn->h.
    return 3 if c.swiglu else 2


def mlp_fmas_per_token(c: ModelConfig, moe: bool) -> float:
    """Multiply-adds per token in one dense MLP or one MoE layer (routed top-k + shared)."""
    h, f = c.hidden_size, _ffn_factor(c)
    if not moe:
        return h * c.ffn_hidden_size * f
    if c.moe_latent_size is None:
        routed = h * c.moe_ffn_hidden_size * c.moe_router_topk * f
    else:
        # Routed experts run on the latent size, plus the up and down projections.
        lat = c.moe_latent_size
        routed = c.moe_ffn_hidden_size * c.moe_router_topk * f * lat + 2 * lat * h
    shared = h * c.moe_shared_expert_intermediate_size * f
    return routed + shared


def layer_counts(c: ModelConfig) -> tuple[int, int]:
    """(dense, MoE) MLP counts including the MTP layers, which copy the last layer's kind."""
    moe = c.num_moe_layers
    dense = c.num_layers - moe
    if c.mtp_num_layers:
        last_is_moe = c.moe_pattern[-1] if c.is_moe else 0
        moe += last_is_moe * c.mtp_num_layers
        dense += (1 - last_is_moe) * c.mtp_num_layers
    return dense, moe


def fmas_per_token(c: ModelConfig) -> float:
    """Forward multiply-adds per token of the whole model (transformer + MTP + logits)."""
    h = c.hidden_size
    dense, moe = layer_counts(c)
    attn_layers = c.num_layers + c.mtp_num_layers
    mlp = dense * mlp_fmas_per_token(c, False) + moe * mlp_fmas_per_token(c, True)
    attn = attn_layers * attention_fmas_per_token(c)
    # Each MTP module: two norms + final norm (3h) and the 2h -> h projection.
    mtp = c.mtp_num_layers * (3 * h + 2 * h * h)
    logits = h * c.padded_vocab_size * (1 + c.mtp_num_layers)
    return mlp + attn + mtp + logits


def flops_per_token(cfg: Mapping[str, Any] | MegatronArgs | ModelConfig) -> float:
    """Model FLOPs (fwd + bwd) per token at the configured sequence length."""
    return _GEMM_PASSES * _FLOPS_PER_FMA * fmas_per_token(_config(cfg))


def flops_per_iteration(cfg: Mapping[str, Any] | MegatronArgs | ModelConfig,
                        batch_size: int | None = None) -> float:
    """Model FLOPs of one iteration over `batch_size` sequences (default: global_batch_size)."""
    c = _config(cfg)
    batch = batch_size if batch_size is not None else c.global_batch_size
    if batch is None:
        raise ConfigError("global_batch_size is needed for FLOPs per iteration; set it",
                          key="global_batch_size")
    return batch * c.seq_length * flops_per_token(c)
