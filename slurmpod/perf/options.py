"""The Megatron switches that change a run's speed but not its FLOPs or layout, as the
performance model reads them from a run's arguments (a run spec's `[megatron]` values, or a
log's dump of them)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from slurmpod.megatron.runspec import (
    cuda_graph_scopes,
    flex_dispatcher_needs_peers,
    megatron_flag,
    optional_int,
    per_layer_cuda_graphs,
)

if TYPE_CHECKING:
    from slurmpod.megatron.runspec import ModelConfig

# MoE load imbalance: busiest expert's tokens / mean. 1.0 = force-balanced routing (how NVIDIA's
# published MoE benchmarks run); real aux-loss-balanced runs sit above it.
MOE_IMBALANCE = 1.0


def _graphs(args: Mapping[str, Any]) -> tuple[bool, bool]:
    """(whether the iteration replays as one CUDA graph; whether each layer's attention does).

    The whole iteration, in each release's spelling: main's `--cuda-graph-impl full_iteration`;
    core 0.15's `--cuda-graph-impl local` and core 0.13-0.14's `--enable-cuda-graph`, each with
    `--cuda-graph-scope full_iteration` (what Megatron-Bridge 25.11's Llama 3 8B presets set).
    The attention: impl transformer_engine or local with `attn` in the scope."""
    impl = str(args.get("cuda_graph_impl") or "").strip().lower()
    if impl == "full_iteration":
        return True, False
    legacy = megatron_flag(args.get("enable_cuda_graph"))
    if impl not in ("transformer_engine", "local") and not legacy:
        return False, False
    scopes = cuda_graph_scopes(args)
    return (impl == "local" or legacy) and "full_iteration" in scopes, "attn" in scopes


@dataclass(frozen=True, slots=True)
class RunOptions:
    """Megatron switches that change speed but not FLOPs or layout (read from `[megatron]`).
    The precision (`fp8`) and the gradient-reduce bytes live in `ModelConfig` (`fp8`,
    `grad_bytes`), which memory reads too: one reading for both."""

    tp_comm_overlap: bool = False
    overlap_grad_reduce: bool = False
    overlap_param_gather: bool = False
    ep_overlap: bool = False
    moe_imbalance: float = MOE_IMBALANCE
    moe_flex: bool = False  # moe_token_dispatcher_type = "flex" (DeepEP / HybridEP)
    # the flex dispatcher's backend that needs expert-parallel peers (DeepEP, Megatron's
    # default; NCCL EP), not HybridEP: slurmpod.megatron.validate.FLEX_DISPATCHER
    moe_flex_needs_peers: bool = False
    # CUDA graphs captured per layer (cuda_graph_impl transformer_engine or local), whatever
    # their scope: slurmpod.megatron.validate.LAYER_GRAPHS
    per_layer_graphs: bool = False
    # Node-limited routing (moe_router_num_groups with moe_router_group_topk): a token's experts
    # sit in at most this many expert groups (DeepSeek-V3: 4 of 8).
    moe_group_topk: int | None = None
    moe_num_groups: int | None = None
    # `--cuda-graph-impl full_iteration`: the iteration replays as one CUDA graph
    graphed_iteration: bool = False
    # `cuda_graph_scope` attn (with cuda_graph_impl transformer_engine or local): each layer's
    # attention replays as a CUDA graph
    graphed_attention: bool = False
    # `fp8_dot_product_attention` (TransformerConfig): the core attention runs in FP8
    fp8_attention: bool = False
    # `use_transformer_engine_op_fuser` (TransformerConfig): the experts' fc1, activation and fc2
    # run as one fused grouped MLP (Transformer Engine's op fuser; its CuTe DSL kernel with
    # NVTE_CUTEDSL_FUSED_GROUPED_MLP=1), so the FFN-sized activation and its FP8 casts never
    # reach HBM
    fused_expert_mlp: bool = False
    # `overlap_cpu_optimizer_d2h_h2d`: the CPU optimizer's gradient copies to the host, its
    # step and the parameter copies back run as a pipeline over its parameters
    overlap_cpu_optimizer: bool = False

    @classmethod
    def from_args(cls, args: Mapping[str, Any]) -> RunOptions:
        # Read as ModelConfig.from_args reads them (a run spec's values, a dump's strings).
        iteration, attention = _graphs(args)
        return cls(
            tp_comm_overlap=megatron_flag(args.get("tp_comm_overlap")),
            overlap_grad_reduce=megatron_flag(args.get("overlap_grad_reduce")),
            overlap_param_gather=megatron_flag(args.get("overlap_param_gather")),
            ep_overlap=megatron_flag(args.get("overlap_moe_expert_parallel_comm")),
            moe_imbalance=float(args.get("moe_imbalance", MOE_IMBALANCE) or MOE_IMBALANCE),
            moe_flex=str(args.get("moe_token_dispatcher_type", "")).lower() == "flex",
            moe_flex_needs_peers=flex_dispatcher_needs_peers(args),
            per_layer_graphs=per_layer_cuda_graphs(args),
            moe_group_topk=optional_int(args.get("moe_router_group_topk")),
            moe_num_groups=optional_int(args.get("moe_router_num_groups")),
            graphed_iteration=iteration,
            graphed_attention=attention,
            fp8_attention=megatron_flag(args.get("fp8_dot_product_attention")),
            fused_expert_mlp=megatron_flag(args.get("use_transformer_engine_op_fuser")),
            overlap_cpu_optimizer=megatron_flag(args.get("overlap_cpu_optimizer_d2h_h2d")),
        )

    def switches(self, config: ModelConfig) -> list[str]:
        """The Megatron settings of a run (these and its `config`'s precision, gradient bytes
        and Megatron-FSDP sharding) that change the prediction, by Megatron's names (empty:
        Megatron's defaults: no overlap, no CUDA graphs, a MoE dispatcher timed as alltoall)."""
        on = [name for name, set_ in (
            ("fp8", config.fp8 is not None), ("tp_comm_overlap", self.tp_comm_overlap),
            ("overlap_grad_reduce", self.overlap_grad_reduce),
            ("overlap_param_gather", self.overlap_param_gather),
            ("grad_reduce_in_bf16", config.grad_bytes == 2),
            ("overlap_moe_expert_parallel_comm", self.ep_overlap),
            ("moe_token_dispatcher_type=flex", self.moe_flex),
            ("cuda_graph_impl=full_iteration", self.graphed_iteration),
            ("cuda_graph_scope=attn", self.graphed_attention and not self.graphed_iteration),
            ("fp8_dot_product_attention", self.fp8_attention),
            ("use_transformer_engine_op_fuser", self.fused_expert_mlp),
            ("optimizer_cpu_offload", config.optimizer_offload_fraction > 0),
            ("overlap_cpu_optimizer_d2h_h2d",
             self.overlap_cpu_optimizer and config.optimizer_offload_fraction > 0),
            ("cpu_offloading", config.cpu_offloading_num_layers > 0)) if set_]
        if self.moe_group_topk and self.moe_num_groups:
            on.append(f"moe_router_group_topk={self.moe_group_topk} of {self.moe_num_groups}")
        if self.moe_imbalance != MOE_IMBALANCE:
            on.append(f"moe_imbalance={self.moe_imbalance:g}")
        if config.megatron_fsdp:
            on.append(f"use_megatron_fsdp={config.fsdp_sharding}")
        return on
