"""Check a Megatron layout against the model and the site; every violation comes with a fix.

The constraints are Megatron-LM's own (megatron/training/arguments.py `validate_args` and
megatron-core `parallel_state.initialize_model_parallel`, core 0.14), checked on the login node
before a job waits in the queue, plus the site rule that a TP group stays inside one NVLink
domain. `suggest_layout` searches nearby (TP, PP) layouts that satisfy every equation and fit in
memory, so a message can say "use TP=8, PP=2" rather than just "wrong".
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from slurmpod.megatron.memory import peak_memory
from slurmpod.megatron.pipeline import balanced_layout
from slurmpod.megatron.runspec import (
    FSDP_SHARDING,
    OPTIMIZER_STATE_CHOICES,
    ModelConfig,
    bad_optimizer_state_dtype,
    cuda_graph_scopes,
    flex_dispatcher_needs_peers,
    megatron_flag,
    per_layer_cuda_graphs,
)
from slurmpod.model.explain import short_value


@dataclass(frozen=True, slots=True)
class SiteShape:
    """What validation needs from the site: GPUs per node and per NVLink domain, usable HBM."""

    node_type: str
    gpus_per_node: int
    domain_gpus: int
    usable_hbm_bytes: float
    max_nodes: int


# Errors a different (TP, PP) can cure; the others get a fix of their own.
LAYOUT_KEYS = frozenset({"tensor_model_parallel_size", "num_attention_heads", "num_query_groups",
                         "num_layers", "global_batch_size", "ffn_hidden_size",
                         "pipeline_model_parallel_layout"})


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def layout_errors(c: ModelConfig, world: int, shape: SiteShape) -> list[tuple[str, str]]:
    """Structural violations as (key, message) without fixes; empty when the layout is valid."""
    errs: list[tuple[str, str]] = []
    tp, pp, cp, ep, etp = c.tp, c.pp, c.cp, c.ep, c.etp
    if tp > shape.domain_gpus:
        errs.append(("tensor_model_parallel_size",
                     f"TP={tp} exceeds the {shape.domain_gpus}-GPU NVLink domain of "
                     f"{shape.node_type}"))
    elif shape.domain_gpus % tp:
        errs.append(("tensor_model_parallel_size",
                     f"TP={tp} does not divide the {shape.domain_gpus}-GPU NVLink domain of "
                     f"{shape.node_type}, so TP groups would straddle domains"))
    if world % (tp * cp * pp):
        errs.append(("tensor_model_parallel_size",
                     f"TP×CP×PP = {tp}×{cp}×{pp} = {tp * cp * pp} does not divide the world of "
                     f"{world} GPUs"))
    if c.num_attention_heads % tp:
        errs.append(("num_attention_heads",
                     f"num_attention_heads={c.num_attention_heads} is not divisible by TP={tp}"))
    if not c.multi_latent_attention and c.num_query_groups % tp:
        errs.append(("num_query_groups",
                     f"num_query_groups={c.num_query_groups} is not divisible by TP={tp}"))
    # ColumnParallelLinear splits the MLP's output over TP with megatron.core.utils.divide,
    # which asserts divisibility (core 0.12-0.14): only at model build time, on the nodes.
    if c.num_moe_layers < c.num_layers and c.ffn_hidden_size % tp:
        errs.append(("ffn_hidden_size",
                     f"ffn_hidden_size={c.ffn_hidden_size} is not divisible by TP={tp}"))
    if c.vpp and pp == 1:
        errs.append(("virtual_pipeline_model_parallel_size",
                     f"VPP={c.vpp} needs pipeline parallelism (PP > 1)"))
    else:
        # Even, uneven first/last, embedding/loss slots or an explicit layout: Megatron's rules.
        errs.extend(c.pipeline_split().errors)
    if c.seq_length % (2 * cp):
        errs.append(("context_parallel_size",
                     f"seq_length={c.seq_length} is not divisible by 2×CP = {2 * cp} "
                     "(Megatron splits each sequence into 2·CP chunks for load balance)"))
    if c.num_experts is not None:
        if c.num_experts % ep:
            errs.append(("expert_model_parallel_size",
                         f"num_experts={c.num_experts} is not divisible by EP={ep}"))
        if world % (etp * ep * pp):
            errs.append(("expert_model_parallel_size",
                         f"ETP×EP×PP = {etp}×{ep}×{pp} = {etp * ep * pp} does not divide the "
                         f"world of {world} GPUs (MoE parallel folding)"))
        if tp > 1 and not c.sequence_parallel:
            errs.append(("sequence_parallel", "MoE with TP > 1 requires sequence_parallel = true"))
        if c.moe_router_topk > c.num_experts:
            errs.append(("moe_router_topk", f"top-k={c.moe_router_topk} exceeds "
                                            f"num_experts={c.num_experts}"))
        if len(c.moe_pattern) != c.num_layers:
            errs.append(("moe_layer_freq", f"pattern has {len(c.moe_pattern)} entries but "
                                           f"num_layers={c.num_layers}"))
    elif ep > 1:
        errs.append(("expert_model_parallel_size", f"EP={ep} needs num_experts"))
    if c.multi_latent_attention and c.group_query_attention:
        errs.append(("group_query_attention", "multi_latent_attention excludes "
                                              "group_query_attention; remove one"))
    if c.recompute_granularity == "full" and c.recompute_method is None:
        errs.append(("recompute_method", "full recompute needs recompute_method "
                                         "('uniform' or 'block') and recompute_num_layers"))
    if c.cpu_offloading_num_layers:
        # TransformerConfig.__post_init__ refuses these at start-up (core 0.12 to main).
        if c.cpu_offloading_num_layers >= c.num_layers:
            errs.append(("cpu_offloading_num_layers",
                         f"cpu_offloading_num_layers={c.cpu_offloading_num_layers}: Megatron "
                         f"offloads fewer layers than num_layers={c.num_layers}"))
        if pp > 1:
            errs.append(("cpu_offloading_num_layers", f"activation offload needs PP=1 (PP={pp}): "
                         "Megatron has no pipeline parallelism with CPU offloading"))
        if c.recompute_granularity is not None:
            errs.append(("cpu_offloading_num_layers", "activation offload excludes recompute "
                         f"(recompute_granularity={c.recompute_granularity!r})"))
    if c.global_batch_size is None:
        errs.append(("global_batch_size", "global_batch_size is required"))
    elif world % (tp * cp * pp) == 0:
        dp = world // (tp * cp * pp)
        if c.global_batch_size % (c.micro_batch_size * dp):
            errs.append(("global_batch_size",
                         f"global_batch_size={c.global_batch_size} is not divisible by "
                         f"micro_batch_size×DP = {c.micro_batch_size}×{dp}"))
        elif c.vpp:
            why = interleave_error(c, c.global_batch_size // (c.micro_batch_size * dp))
            if why:
                errs.append((MICROBATCH_GROUP, why))
    return errs


# The interleaved (VPP) schedule runs the microbatches in groups of N per virtual stage
# (`microbatch_group_size_per_vp_stage`, default PP): it raises at the first step unless
# PP <= N <= M and the last group is whole or holds at least PP (schedules.py
# `forward_backward_pipelining_with_interleaving`, core 0.10 to main; core 0.9: M divisible by
# PP). With the default that is: M a multiple of PP.
MICROBATCH_GROUP = "microbatch_group_size_per_vp_stage"


def interleave_error(c: ModelConfig, m: int) -> str | None:
    """Why Megatron's interleaved schedule refuses `m` microbatches of `c`, or None."""
    pp = c.pp
    n = c.microbatch_group or pp
    if not pp <= n <= m:
        return (f"the interleaved schedule needs PP={pp} <= microbatch group N={n} <= "
                f"microbatches M={m}")
    rest = m % n
    if 0 < rest < pp:
        return (f"the interleaved schedule runs microbatches in groups of {n} "
                f"({MICROBATCH_GROUP}, default PP): {m} microbatches leave a last group of "
                f"{rest}, fewer than PP={pp}")
    return None


# `overlap_moe_expert_parallel_comm` hides the EP all-to-all under the combined 1F1B schedule.
# TransformerConfig.__post_init__ refuses it with these layouts and recompute settings at
# start-up, on the nodes (core 0.14 to main; 'moe' in recompute_modules from core 0.17; a VPP
# of 1 is no virtual pipeline, arguments.py).
EP_OVERLAP = "overlap_moe_expert_parallel_comm"
# `tp_comm_overlap` (Transformer Engine's userbuffer overlap of the TP collectives) needs
# sequence parallelism, which `validate_args` turns off with TP 1 (arguments.py, core 0.14 to
# main: "Tensor parallel communication/GEMM overlap can happen only when sequence parallelism
# is enabled").
TP_COMM_OVERLAP = "tp_comm_overlap"
# The flex dispatcher asserts expert-parallel peers to send to, "Flex token dispatcher requires
# TPxEP > 1" over the expert-tensor and expert groups (token_dispatcher.py, core 0.12 to 0.15;
# main: its deepep and ncclep backends, deepep the default, not hybridep).
FLEX_DISPATCHER = "moe_token_dispatcher_type=flex"
# CUDA graphs per layer (`cuda_graph_impl` transformer_engine or local) exclude full recompute:
# "full recompute is only supported with full iteration CUDA graph" (TransformerConfig, core
# 0.16 to main; core 0.12-0.14 have no cuda_graph_impl).
LAYER_GRAPHS = "cuda_graph_impl"


def layer_graphs_conflicts(c: ModelConfig) -> list[tuple[str, str, str]]:
    """(key, why, fix) when Megatron refuses per-layer CUDA graphs with `c`'s recompute."""
    if c.recompute_granularity == "full":
        return [("recompute_granularity",
                 "CUDA graphs per layer (cuda_graph_impl transformer_engine or local) exclude "
                 "full recompute", "recompute_granularity = 'selective' or none, or "
                 "cuda_graph_impl = 'full_iteration' or 'none'")]
    return []


def flex_dispatcher_conflicts(c: ModelConfig) -> list[tuple[str, str, str]]:
    """(key, why, fix) when Megatron's flex dispatcher has no expert-parallel peer in `c`."""
    if c.is_moe and c.ep * c.etp <= 1:
        return [("expert_model_parallel_size",
                 "the flex dispatcher (DeepEP) needs expert parallelism (EP×ETP = 1)",
                 "EP > 1, or moe_token_dispatcher_type = 'alltoall'")]
    return []


def tp_comm_overlap_conflicts(c: ModelConfig) -> list[tuple[str, str, str]]:
    """(key, why, fix) when Megatron refuses the TP communication overlap with `c`'s layout."""
    off = f"or {TP_COMM_OVERLAP} = false"
    if c.tp == 1:
        return [("tensor_model_parallel_size",
                 f"{TP_COMM_OVERLAP} needs sequence parallelism, which Megatron turns off "
                 "with TP=1", f"TP > 1 with sequence_parallel = true, {off}")]
    if not c.sequence_parallel:
        return [("sequence_parallel", f"{TP_COMM_OVERLAP} needs sequence parallelism",
                 f"sequence_parallel = true, {off}")]
    return []


def ep_overlap_conflicts(c: ModelConfig) -> list[tuple[str, str, str]]:
    """(key, why, fix) for each reason Megatron refuses the EP overlap with `c`'s layout and
    recompute; empty when it accepts it."""
    off = f"or {EP_OVERLAP} = false"
    out: list[tuple[str, str, str]] = []
    if c.ep <= 1:
        out.append(("expert_model_parallel_size",
                    f"{EP_OVERLAP} needs expert parallelism (EP={c.ep})",
                    f"EP > 1, {off}"))
    if c.pp > 1 and c.vpp is None:
        out.append(("virtual_pipeline_model_parallel_size",
                    f"{EP_OVERLAP} with PP={c.pp} needs a virtual pipeline",
                    f"virtual_pipeline_model_parallel_size > 1, {off}"))
    if c.recompute_granularity == "full":
        out.append(("recompute_granularity", f"{EP_OVERLAP} excludes full recompute",
                    f"recompute_granularity = 'selective' or none, {off}"))
    elif c.recompute_granularity == "selective" and "moe" in c.recompute_modules:
        out.append(("recompute_modules", f"{EP_OVERLAP} excludes 'moe' in recompute_modules",
                    f"recompute_modules without 'moe' (e.g. ['moe_act']), {off}"))
    if c.mtp_num_layers > 1:
        out.append(("mtp_num_layers", f"{EP_OVERLAP} allows at most one MTP layer "
                                      f"(mtp_num_layers={c.mtp_num_layers})",
                    f"mtp_num_layers = 1, {off}"))
    return out


# The run's switches whose Megatron rules depend on the layout and recompute.
_SWITCH_CONFLICTS = {EP_OVERLAP: ep_overlap_conflicts, TP_COMM_OVERLAP: tp_comm_overlap_conflicts,
                     FLEX_DISPATCHER: flex_dispatcher_conflicts,
                     LAYER_GRAPHS: layer_graphs_conflicts}


def refused_switches(c: ModelConfig, on: tuple[str, ...]) -> tuple[str, ...]:
    """Of the switches `on` (EP_OVERLAP, TP_COMM_OVERLAP, FLEX_DISPATCHER, LAYER_GRAPHS), those
    Megatron refuses with `c`'s layout and recompute."""
    return tuple(s for s in on if _SWITCH_CONFLICTS[s](c))


def switches_on(args: Mapping[str, Any]) -> tuple[str, ...]:
    """The layout-bound switches (`refused_switches`) a run's arguments turn on."""
    on = [s for s in (EP_OVERLAP, TP_COMM_OVERLAP) if megatron_flag(args.get(s))]
    if flex_dispatcher_needs_peers(args):
        on.append(FLEX_DISPATCHER)
    if per_layer_cuda_graphs(args):
        on.append(LAYER_GRAPHS)
    return tuple(on)


def switch_errors(c: ModelConfig, args: Mapping[str, Any]) -> list[str]:
    """`plan`'s errors for a run whose EP overlap, TP communication overlap, flex dispatcher or
    per-layer CUDA graphs Megatron would refuse (the layout's and recompute's reasons; for the
    EP overlap also the dispatcher and the shared-expert overlap), or whose
    `delay_wgrad_compute` lacks the EP overlap: one line each, with the fix."""
    errors: list[str] = []
    if megatron_flag(args.get("delay_wgrad_compute")) and not megatron_flag(args.get(EP_OVERLAP)):
        errors.append(f"megatron.delay_wgrad_compute: needs {EP_OVERLAP}: use "
                      f"{EP_OVERLAP} = true, or delay_wgrad_compute = false")
    for switch in switches_on(args):
        for key, why, fix in _SWITCH_CONFLICTS[switch](c):
            errors.append(f"megatron.{key}: {why}: use {fix}")
    if not megatron_flag(args.get(EP_OVERLAP)):
        return errors
    # Megatron's default dispatcher is allgather (TransformerConfig, core 0.14 to main).
    dispatcher = str(args.get("moe_token_dispatcher_type") or "allgather")
    if dispatcher not in ("alltoall", "flex"):
        errors.append(f"megatron.moe_token_dispatcher_type: {EP_OVERLAP} needs the alltoall or "
                      f"flex dispatcher, not {short_value(dispatcher)}: use "
                      f"moe_token_dispatcher_type = 'alltoall', or {EP_OVERLAP} = false")
    if megatron_flag(args.get("moe_shared_expert_overlap")):
        errors.append(f"megatron.moe_shared_expert_overlap: {EP_OVERLAP} excludes it: use "
                      f"moe_shared_expert_overlap = false, or {EP_OVERLAP} = false")
    # Transformer Engine's graphs of the MLP or the experts (TransformerConfig, core 0.16 to
    # main).
    if (str(args.get("cuda_graph_impl") or "").strip().lower() == "transformer_engine"
            and cuda_graph_scopes(args) & {"moe", "mlp"}):
        errors.append(f"megatron.cuda_graph_scope: {EP_OVERLAP} excludes Transformer Engine's "
                      "CUDA graphs of 'moe' and 'mlp': use a scope without them (e.g. "
                      f"['attn']), or {EP_OVERLAP} = false")
    return errors


def layout_warnings(c: ModelConfig, world: int, shape: SiteShape) -> list[str]:
    out: list[str] = []
    if c.sequence_parallel and c.tp == 1:
        out.append("sequence_parallel has no effect with TP=1 (Megatron turns it off)")
    if c.tp > 1 and not c.sequence_parallel and not c.is_moe:
        out.append(f"sequence_parallel is off with TP={c.tp}: activations are replicated over "
                   "TP; set sequence_parallel = true")
    if c.vpp and c.pp == 2:
        out.append("interleaved pipeline with PP=2 needs overlap_p2p_comm in Megatron")
    if c.pp > 1 and c.global_batch_size and world % (c.tp * c.cp * c.pp) == 0:
        dp = world // (c.tp * c.cp * c.pp)
        nmb = c.global_batch_size // max(1, c.micro_batch_size * dp)
        if 0 < nmb < c.pp:
            out.append(f"only {nmb} microbatches for PP={c.pp}: the pipeline never fills; raise "
                       "global_batch_size")
        elif nmb and c.vpp is None and nmb < 4 * c.pp:
            bubble = (c.pp - 1) / nmb
            out.append(f"pipeline bubble ≈ {bubble:.0%} ((PP-1)/microbatches); more "
                       "microbatches or an interleaved schedule (VPP) would shrink it")
    if c.cp > 1 and c.seq_length // c.cp < 1024:
        out.append(f"CP={c.cp} leaves {c.seq_length // c.cp} tokens per rank; context "
                   "parallelism pays off for long sequences")
    if c.dp_sharding == "no_shard" and world // (c.tp * c.cp * c.pp or 1) > 1:
        out.append("use_distributed_optimizer is off: optimizer state is replicated over DP "
                   "(18 bytes/param instead of 6 + 12/DP)")
    return out


def dispatcher_warnings(c: ModelConfig, args: Mapping[str, Any]) -> list[str]:
    """A MoE run with expert parallelism that leaves `moe_token_dispatcher_type` to Megatron's
    default, allgather (TransformerConfig, core 0.12 to main), which gathers every token on
    every rank of the expert group; slurmpod times it as the alltoall dispatcher."""
    if not (c.is_moe and c.ep * c.etp > 1) or args.get("moe_token_dispatcher_type"):
        return []
    return ["moe_token_dispatcher_type is unset: Megatron's default, allgather, gathers every "
            "token on every expert-parallel rank, where the prediction counts alltoall's "
            "routed copies; set moe_token_dispatcher_type = 'alltoall' (or 'flex')"]


def memory_bytes(c: ModelConfig, world: int) -> float:
    """Bytes per GPU on the pipeline rank that needs the most."""
    return peak_memory(c, world).bytes_per_gpu


def suggest_layout(c: ModelConfig, world: int, shape: SiteShape,
                   require_fit: bool = True, switches: tuple[str, ...] = ()) -> str | None:
    """The nearest (TP, PP) layout, with the same CP/EP, that satisfies every equation and fits;
    falls back to turning on the distributed optimizer, then full recompute. None if nothing.
    `switches`: the layout-bound switches the run turns on (`switches_on`); the fix turns off
    those Megatron refuses with the layout it proposes (`refused_switches`)."""
    base_tp, base_pp = c.tp, c.pp
    variants = [c]
    if not c.use_distributed_optimizer:
        variants.append(replace(c, use_distributed_optimizer=True))
    last = variants[-1]
    if last.recompute_granularity != "full":
        variants.append(replace(last, recompute_granularity="full", recompute_method="uniform",
                                recompute_num_layers=1))
    tps = [t for t in _divisors(shape.domain_gpus)
           if c.num_attention_heads % t == 0
           and (c.multi_latent_attention or c.num_query_groups % t == 0)
           and (c.num_moe_layers == c.num_layers or c.ffn_hidden_size % t == 0)]
    # Embedding/loss slots and explicit layouts let PP exceed a divisor of num_layers; the
    # pipeline split decides which PP (and VPP) Megatron accepts.
    pps = [p for p in _divisors(world) if p <= c.num_layers + 2]
    # Structurally valid candidates, best score first; memory is checked only in that order,
    # so a plan usually evaluates a handful of layouts, not all of them.
    ranked: list[tuple[tuple[float, ...], int, int, int, int | None, bool, str | None]] = []
    for tp in tps:
        for pp in pps:
            if world % (tp * c.cp * pp):
                continue
            etp = tp if c.etp == c.tp else c.etp
            # A layout string is written for one PP; other PPs fall back to an even split.
            layout = c.pipeline_layout if pp == c.pp else None
            vpp = c.vpp if pp > 1 else None
            cand = replace(c, tp=tp, pp=pp, etp=etp, vpp=vpp, pipeline_layout=layout,
                           vpp_given=None,
                           sequence_parallel=c.sequence_parallel or (tp > 1 and c.is_moe))
            if vpp and cand.pipeline_split().errors:
                vpp = None
                cand = replace(cand, vpp=None)
            # Only what TP/PP decide disqualifies a candidate; other errors get their own fix.
            if any((k in LAYOUT_KEYS and k != "global_batch_size") or "folding" in m
                   or k in ("virtual_pipeline_model_parallel_size", MICROBATCH_GROUP)
                   for k, m in layout_errors(cand, world, shape)):
                continue
            dp = world // (tp * c.cp * pp)
            gbs_ok = (c.global_batch_size or 0) % (c.micro_batch_size * dp) == 0
            # Keep the model-parallel size TP x PP (memory per GPU) first, then stay close.
            dist = (abs(math.log2(tp * pp / (base_tp * base_pp)))
                    + 0.5 * abs(math.log2(tp / base_tp)))
            ranked.append(((0.0 if gbs_ok else 1.0, dist, pp, -tp), tp, pp, etp, vpp, gbs_ok,
                           layout))
    ranked.sort()
    for v in variants:
        for _score, tp, pp, etp, vpp, gbs_ok, layout in ranked:
            dp = world // (tp * c.cp * pp)
            mult = c.micro_batch_size * dp
            # With VPP, microbatches the interleaved schedule accepts (a multiple of PP).
            step = mult * (pp if vpp else 1)
            gbs = (c.global_batch_size if gbs_ok
                   else max(step, round((c.global_batch_size or step) / step) * step))
            # Memory with the batch the fix proposes (micro batches in flight depend on it).
            cand = replace(v, tp=tp, pp=pp, etp=etp, vpp=vpp, global_batch_size=gbs,
                           pipeline_layout=layout, vpp_given=None,
                           sequence_parallel=v.sequence_parallel or (tp > 1 and v.is_moe))
            if require_fit and memory_bytes(cand, world) > shape.usable_hbm_bytes:
                continue
            changes = []
            if (tp, pp) != (base_tp, base_pp) or vpp != c.vpp:
                changes.append(f"TP={tp}, PP={pp}" + (f", VPP={vpp}" if vpp else ""))
            if not gbs_ok:
                changes.append(f"global_batch_size={gbs} (a multiple of micro_batch_size×DP"
                               + (f"×PP = {step})" if vpp else f" = {mult})"))
            if v.use_distributed_optimizer and not c.use_distributed_optimizer:
                changes.append("use_distributed_optimizer = true")
            if v.recompute_granularity == "full" and c.recompute_granularity != "full":
                changes.append("recompute_granularity = 'full' (uniform, 1 layer)")
            if cand.sequence_parallel and not c.sequence_parallel:
                changes.append("sequence_parallel = true")
            changes.extend(f"{s} = false" for s in refused_switches(cand, switches))
            return ", ".join(changes) or "the current layout"
    return None


def min_nodes_that_fit(c: ModelConfig, nodes: int, shape: SiteShape) -> int | None:
    """The smallest node count above `nodes` (same layout, distributed optimizer on) whose
    world the layout divides and whose memory fits; None if none up to 16x or the site size."""
    v = c if c.use_distributed_optimizer else replace(c, use_distributed_optimizer=True)
    mp = math.lcm(c.tp * c.cp * c.pp, c.etp * c.ep * c.pp)
    for n in range(nodes + 1, min(16 * nodes, max(shape.max_nodes, nodes + 1)) + 1):
        world = n * shape.gpus_per_node
        if world % mp:
            continue
        if memory_bytes(v, world) <= shape.usable_hbm_bytes:
            return n
    return None


def split_fix(c: ModelConfig) -> str | None:
    """A fix for a pipeline split Megatron refuses, keeping PP and VPP: the embedding/loss
    slots if they make the layers divide, else a balanced pipeline_model_parallel_layout."""

    if c.pipeline_layout is None and c.first_stage_layers is None \
            and c.last_stage_layers is None:
        for emb, loss in ((True, True), (True, False), (False, True)):
            cand = replace(c, account_for_embedding=emb, account_for_loss=loss)
            if not cand.pipeline_split().errors:
                keys = [k for k, on in (("account_for_embedding_in_pipeline_split", emb),
                                        ("account_for_loss_in_pipeline_split", loss)) if on]
                return " and ".join(f"{k} = true" for k in keys)
    layout = balanced_layout(c.num_layers, c.pp, c.vpp or 1, c.mtp_num_layers)
    if layout is None:
        return None
    cand = replace(c, pipeline_layout=layout, first_stage_layers=None, last_stage_layers=None,
                   account_for_embedding=False, account_for_loss=False, vpp_given=None)
    if cand.pipeline_split().errors:
        return None
    extra = ("" if c.first_stage_layers is None and c.last_stage_layers is None
             and not c.account_for_embedding and not c.account_for_loss
             else " (instead of the other split arguments)")
    return f'pipeline_model_parallel_layout = "{layout}"{extra}'


def specific_fix(key: str, msg: str, c: ModelConfig, world: int) -> str | None:
    """A concrete fix for an error that is not about TP/PP."""
    dp = max(1, world // (c.tp * c.cp * c.pp))
    if key == "expert_model_parallel_size" and c.num_experts is None:
        return "expert_model_parallel_size = 1, or set num_experts"
    if key == "expert_model_parallel_size" and c.num_experts is not None:
        room = world // (c.etp * c.pp) if world % (c.etp * c.pp) == 0 else 0
        eps = [e for e in _divisors(c.num_experts) if room and room % e == 0]
        if eps:
            best = min(eps, key=lambda e: (abs(math.log2(e / c.ep)), -e))
            return f"EP={best} (divides num_experts={c.num_experts} and the world / (ETP×PP))"
        best = min(_divisors(c.num_experts), key=lambda e: (abs(math.log2(e / c.ep)), -e))
        return (f"EP={best} (divides num_experts={c.num_experts}) with ETP×EP×PP dividing the "
                f"world of {world} GPUs")
    if key == "context_parallel_size":
        cps = [k for k in (1, 2, 4, 8, 16, 32) if c.seq_length % (2 * k) == 0 and k <= c.cp]
        seq = -(-c.seq_length // (2 * c.cp)) * 2 * c.cp
        return (f"CP={max(cps)} or seq_length={seq}" if cps else f"seq_length={seq}")
    if key == "sequence_parallel":
        return "sequence_parallel = true"
    if key == "moe_router_topk" and c.num_experts is not None:
        return f"moe_router_topk <= {c.num_experts}"
    if key == "moe_layer_freq":
        return f"a list of {c.num_layers} entries (0 dense, 1 MoE) or an int"
    if key == "virtual_pipeline_model_parallel_size":
        return "no virtual_pipeline_model_parallel_size, or PP > 1"
    if key == "group_query_attention":
        return "group_query_attention = false"
    if key == "recompute_method":
        return "recompute_method = 'uniform' and recompute_num_layers = 1"
    if key == MICROBATCH_GROUP:
        mult = c.micro_batch_size * dp * c.pp
        gbs = max(mult, round((c.global_batch_size or mult) / mult) * mult)
        default = "" if c.microbatch_group is None else f" and no {MICROBATCH_GROUP}"
        return (f"global_batch_size = {gbs} ({gbs // (c.micro_batch_size * dp)} microbatches, "
                f"a multiple of PP={c.pp}){default}, or no virtual pipeline")
    if key == "global_batch_size":
        m = math.lcm(8, c.pp) if c.vpp else 8  # the interleaved schedule's: a multiple of PP
        return (f"global_batch_size = {c.micro_batch_size * dp * m} ({m} microbatches per DP "
                "rank)")
    if key == "cpu_offloading_num_layers":
        if "fewer layers" in msg:
            return f"cpu_offloading_num_layers <= {c.num_layers - 1}"
        if "PP=1" in msg:
            return "PP=1, or no cpu_offloading_num_layers"
        return "no recompute_granularity, or no cpu_offloading_num_layers"
    return None


def with_fix(message: str, fix: str | None, fallback: str) -> str:
    return f"{message}: use {fix}" if fix else f"{message}: {fallback}"


# Bounds for the arguments dump of a log (`check_dump_args`): far above any real model (the
# largest published dense models have ~128 layers, hidden 25,600, 128 heads; MoE up to a few
# hundred experts), low enough that a FLOPs or memory computation from them cannot blow up.
_DUMP_BOUNDS: dict[str, int] = {
    "num_layers": 10_000, "hidden_size": 1 << 20, "num_attention_heads": 1 << 16,
    "num_query_groups": 1 << 16, "kv_channels": 1 << 16, "ffn_hidden_size": 1 << 24,
    "moe_ffn_hidden_size": 1 << 24, "moe_shared_expert_intermediate_size": 1 << 24,
    "num_experts": 1 << 16, "moe_router_topk": 1 << 16, "seq_length": 1 << 24,
    "max_position_embeddings": 1 << 26, "padded_vocab_size": 1 << 24, "vocab_size": 1 << 24,
    "global_batch_size": 1 << 26, "micro_batch_size": 1 << 20, "world_size": 1 << 24,
    "tensor_model_parallel_size": 1 << 16, "pipeline_model_parallel_size": 1 << 16,
    "context_parallel_size": 1 << 16, "expert_model_parallel_size": 1 << 16,
    "virtual_pipeline_model_parallel_size": 1 << 16, "make_vocab_size_divisible_by": 1 << 20,
    "microbatch_group_size_per_vp_stage": 1 << 26,
    "log_interval": 1 << 40, "train_iters": 1 << 50,
}
# Present in every dump of a model that slurmpod can count FLOPs for.
_DUMP_REQUIRED_POSITIVE = ("num_layers", "hidden_size", "num_attention_heads", "seq_length")


def dump_world(args: Mapping[str, Any], gpus: int) -> int | None:
    """The GPUs a log's dump ran on (`world_size`, else Slurm's `gpus`); None when it claims
    more than the job held: the run cannot have used them, so the dump is another run's."""
    world = args.get("world_size")
    if not isinstance(world, int) or isinstance(world, bool) or world < 1:
        world = gpus
    if world < 1 or (gpus and world > gpus):
        return None
    return world


def check_dump_args(args: Mapping[str, Any]) -> str | None:
    """Sanity of a log's `arguments` dump before its numbers are used: sizes and counts must be
    whole numbers >= 1 and below generous bounds (`None`, Megatron's "not set", is allowed for
    the optional ones). Returns one line naming the first bad argument and why, else None."""
    for key, bound in _DUMP_BOUNDS.items():
        if key not in args:
            continue
        v = args[key]
        if v is None and key not in _DUMP_REQUIRED_POSITIVE:
            continue
        if isinstance(v, bool) or not isinstance(v, int):
            return f"{key} = {v!r}: not a whole number"
        if v < 1:
            return f"{key} = {v}: must be at least 1"
        if v > bound:
            return f"{key} = {v}: more than {bound:,}, which no real model or job has"
    heads, groups = args.get("num_attention_heads"), args.get("num_query_groups")
    if (isinstance(heads, int) and isinstance(groups, int) and not isinstance(groups, bool)
            and args.get("group_query_attention") and groups > heads):
        return (f"num_query_groups = {groups}: more than num_attention_heads = {heads}")
    experts, topk = args.get("num_experts"), args.get("moe_router_topk")
    if isinstance(experts, int) and isinstance(topk, int) and topk > experts:
        return f"moe_router_topk = {topk}: more than num_experts = {experts}"
    sharding = args.get("data_parallel_sharding_strategy")
    if sharding is not None and sharding not in FSDP_SHARDING:
        return (f"data_parallel_sharding_strategy = {short_value(sharding)}: not one of "
                f"{', '.join(FSDP_SHARDING)}")
    bad = bad_optimizer_state_dtype(args)
    if bad is not None:
        return (f"{bad} = {short_value(args.get(bad))}: not one of "
                f"{', '.join(OPTIMIZER_STATE_CHOICES[bad])}")
    return None

