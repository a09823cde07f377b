"""Layout validation: table of violations with their fixes, and properties: every accepted layout
satisfies Megatron's equations, every layout satisfying them is accepted, every fix is valid."""

import re
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slurmpod.megatron.runspec import ModelConfig
from slurmpod.megatron.validate import (
    EP_OVERLAP,
    LAYOUT_KEYS,
    SiteShape,
    ep_overlap_conflicts,
    layout_errors,
    layout_warnings,
    memory_bytes,
    specific_fix,
    suggest_layout,
    switch_errors,
)

DGX = SiteShape("dgx-h100", 8, 8, 72 * 1024**3, 128)
NVL72 = SiteShape("gb200-nvl72", 4, 72, 170 * 1024**3, 1152)

BASE = dict(num_layers=32, hidden_size=4096, num_attention_heads=32, group_query_attention=True,
            num_query_groups=8, ffn_hidden_size=14336, swiglu=True, seq_length=4096,
            vocab_size=32000, global_batch_size=64, micro_batch_size=1,
            sequence_parallel=True, use_distributed_optimizer=True)


def c(**over) -> ModelConfig:
    return ModelConfig.from_args(BASE | over)


VIOLATIONS = [
    (dict(tensor_model_parallel_size=16), 16, "tensor_model_parallel_size", "exceeds the 8-GPU"),
    (dict(tensor_model_parallel_size=3, num_attention_heads=48, num_query_groups=6), 24,
     "tensor_model_parallel_size", "does not divide the 8-GPU"),
    (dict(pipeline_model_parallel_size=3), 16, "tensor_model_parallel_size", "does not divide"),
    (dict(num_attention_heads=20, num_query_groups=4, tensor_model_parallel_size=8,
          kv_channels=128), 16, "num_attention_heads", "not divisible by TP=8"),
    (dict(tensor_model_parallel_size=8, num_query_groups=4), 16, "num_query_groups",
     "not divisible by TP=8"),
    (dict(pipeline_model_parallel_size=5, num_layers=32), 40, "num_layers", "PP=5"),
    (dict(pipeline_model_parallel_size=4, virtual_pipeline_model_parallel_size=3), 32,
     "num_layers", "PP×VPP"),
    (dict(virtual_pipeline_model_parallel_size=2), 8, "virtual_pipeline_model_parallel_size",
     "PP > 1"),
    (dict(global_batch_size=60), 16, "global_batch_size", "micro_batch_size×DP"),
    (dict(context_parallel_size=4, seq_length=4100), 16, "context_parallel_size", "2×CP"),
    (dict(num_experts=6, expert_model_parallel_size=4), 16, "expert_model_parallel_size",
     "num_experts=6"),
    (dict(num_experts=8, expert_model_parallel_size=8, pipeline_model_parallel_size=2,
          tensor_model_parallel_size=2, expert_tensor_parallel_size=2), 24,
     "expert_model_parallel_size", "parallel folding"),
    (dict(num_experts=8, tensor_model_parallel_size=2, sequence_parallel=False), 16,
     "sequence_parallel", "requires sequence_parallel"),
    (dict(expert_model_parallel_size=2), 16, "expert_model_parallel_size", "needs num_experts"),
    (dict(recompute_granularity="full"), 16, "recompute_method", "recompute_method"),
    (dict(global_batch_size=None), 16, "global_batch_size", "required"),
    # The interleaved schedule's microbatches: 10 at PP=4 leave a last group of 2 (schedules.py,
    # core 0.10 to main); a group Megatron's range refuses.
    (dict(pipeline_model_parallel_size=4, virtual_pipeline_model_parallel_size=2,
          global_batch_size=60), 24, "microbatch_group_size_per_vp_stage",
     "10 microbatches leave a last group of 2, fewer than PP=4"),
    (dict(pipeline_model_parallel_size=4, virtual_pipeline_model_parallel_size=2,
          global_batch_size=60, microbatch_group_size_per_vp_stage=3), 24,
     "microbatch_group_size_per_vp_stage", "needs PP=4 <= microbatch group N=3 <= microbatches"),
    # Megatron's TransformerConfig refuses activation offload beside these (core 0.12 to main).
    (dict(cpu_offloading_num_layers=32), 16, "cpu_offloading_num_layers",
     "fewer layers than num_layers=32"),
    (dict(cpu_offloading_num_layers=8, pipeline_model_parallel_size=2), 16,
     "cpu_offloading_num_layers", "needs PP=1"),
    (dict(cpu_offloading_num_layers=8, recompute_granularity="selective"), 16,
     "cpu_offloading_num_layers", "excludes recompute"),
]


def test_activation_offload_with_pp1_and_no_recompute_is_valid():
    assert layout_errors(c(cpu_offloading_num_layers=31), 16, DGX) == []


def test_each_activation_offload_error_has_its_own_fix():
    bad = c(cpu_offloading_num_layers=32, pipeline_model_parallel_size=2,
            recompute_granularity="selective")
    fixes = [specific_fix(k, m, bad, 16) for k, m in layout_errors(bad, 16, DGX)
             if k == "cpu_offloading_num_layers"]
    assert fixes == ["cpu_offloading_num_layers <= 31", "PP=1, or no cpu_offloading_num_layers",
                     "no recompute_granularity, or no cpu_offloading_num_layers"]


MOE = dict(num_experts=64, moe_router_topk=8, moe_ffn_hidden_size=1408,
           expert_model_parallel_size=8)
OVERLAP = {"overlap_moe_expert_parallel_comm": True, "moe_token_dispatcher_type": "alltoall"}


def test_the_ep_overlap_is_accepted_where_megatron_accepts_it():
    """EP > 1, a virtual pipeline with PP > 1, selective recompute without 'moe', one MTP
    layer at most (TransformerConfig, core 0.14 to main)."""
    for over in (dict(), dict(pipeline_model_parallel_size=2,
                              virtual_pipeline_model_parallel_size=4),
                 dict(recompute_granularity="selective", recompute_modules=["moe_act"]),
                 dict(mtp_num_layers=1)):
        cfg = c(**MOE, **over)
        assert ep_overlap_conflicts(cfg) == []
        assert switch_errors(cfg, OVERLAP) == []


@pytest.mark.parametrize(("over", "key", "text"), [
    (dict(expert_model_parallel_size=1), "expert_model_parallel_size",
     "needs expert parallelism (EP=1)"),
    (dict(pipeline_model_parallel_size=2), "virtual_pipeline_model_parallel_size",
     "with PP=2 needs a virtual pipeline"),
    # Megatron's VPP of 1 is no virtual pipeline (arguments.py).
    (dict(pipeline_model_parallel_size=2, virtual_pipeline_model_parallel_size=1),
     "virtual_pipeline_model_parallel_size", "needs a virtual pipeline"),
    (dict(recompute_granularity="full", recompute_method="uniform", recompute_num_layers=1),
     "recompute_granularity", "excludes full recompute"),
    (dict(recompute_granularity="selective", recompute_modules=["moe"]), "recompute_modules",
     "excludes 'moe'"),
    (dict(mtp_num_layers=2), "mtp_num_layers", "at most one MTP layer"),
])
def test_megatron_refuses_the_ep_overlap_here_and_plan_says_how_to_fix_it(over, key, text):
    cfg = c(**(MOE | over))
    assert [k for k, _, _ in ep_overlap_conflicts(cfg)] == [key]
    (line,) = switch_errors(cfg, OVERLAP)
    assert line.startswith(f"megatron.{key}: ") and text in line
    assert line.endswith("or overlap_moe_expert_parallel_comm = false")
    # Without the overlap the same layout is Megatron's to run.
    assert switch_errors(cfg, {**OVERLAP, "overlap_moe_expert_parallel_comm": False}) == []


def test_the_ep_overlap_needs_its_dispatcher_and_no_shared_expert_overlap():
    cfg = c(**MOE)
    # Megatron's default dispatcher is allgather; a log's dump gives the flag as "True".
    (line,) = switch_errors(cfg, {"overlap_moe_expert_parallel_comm": "True"})
    assert line.startswith("megatron.moe_token_dispatcher_type: ") and "'allgather'" in line
    assert switch_errors(cfg, {**OVERLAP, "moe_token_dispatcher_type": "flex"}) == []
    (line,) = switch_errors(cfg, {**OVERLAP, "moe_shared_expert_overlap": True})
    assert line.startswith("megatron.moe_shared_expert_overlap: ")
    (line,) = switch_errors(cfg, {"delay_wgrad_compute": True})
    assert line.startswith("megatron.delay_wgrad_compute: needs overlap_moe_expert_parallel_comm")
    # A hostile dispatcher value is escaped and cut short, never echoed raw.
    hostile = {**OVERLAP, "moe_token_dispatcher_type": "\x1b[2J" + "x" * 500}
    (line,) = switch_errors(cfg, hostile)
    assert "\x1b" not in line and "\\x1b" in line and len(line) < 400


def test_the_flex_dispatcher_needs_expert_parallel_peers_unless_hybridep():
    """token_dispatcher.py asserts TP×EP > 1 over the expert groups (core 0.12 to main; on
    main for its DeepEP, the default, and NCCL EP backends)."""
    flex = {"moe_token_dispatcher_type": "flex"}
    (line,) = switch_errors(c(**(MOE | dict(expert_model_parallel_size=1))), flex)
    assert line == ("megatron.expert_model_parallel_size: the flex dispatcher (DeepEP) needs "
                    "expert parallelism (EP×ETP = 1): use EP > 1, or moe_token_dispatcher_type "
                    "= 'alltoall'")
    assert switch_errors(c(**MOE), flex) == []
    assert switch_errors(c(**(MOE | dict(expert_model_parallel_size=1))),
                         flex | {"moe_flex_dispatcher_backend": "hybridep"}) == []
    assert switch_errors(c(), flex) == []  # no experts, no dispatcher


def test_cuda_graphs_per_layer_exclude_full_recompute():
    """TransformerConfig (core 0.16 to main): full recompute only with the whole iteration
    captured; core 0.15's spelling of that (impl local, scope full_iteration) counts too."""
    full = c(recompute_granularity="full", recompute_method="uniform", recompute_num_layers=1)
    for graphs in ({"cuda_graph_impl": "transformer_engine", "cuda_graph_scope": "attn"},
                   {"cuda_graph_impl": "local", "cuda_graph_modules": ["mlp"]}):
        (line,) = switch_errors(full, graphs)
        assert line.startswith("megatron.recompute_granularity: CUDA graphs per layer ")
        assert line.endswith("or cuda_graph_impl = 'full_iteration' or 'none'")
        assert switch_errors(c(recompute_granularity="selective"), graphs) == []
    for whole in ({"cuda_graph_impl": "full_iteration"},
                  {"cuda_graph_impl": "local", "cuda_graph_scope": "full_iteration"},
                  {"cuda_graph_impl": "none"}, {}):
        assert switch_errors(full, whole) == []


def test_the_ep_overlap_excludes_transformer_engine_graphs_of_the_experts():
    cfg = c(**MOE)
    for scope in (["moe"], "mlp", ["attn", "moe_router", "moe"]):
        te = {"cuda_graph_impl": "transformer_engine", "cuda_graph_scope": scope}
        (line,) = switch_errors(cfg, OVERLAP | te)
        assert line.startswith("megatron.cuda_graph_scope: overlap_moe_expert_parallel_comm ")
        assert switch_errors(cfg, te) == []  # without the overlap
    ok = {"cuda_graph_impl": "transformer_engine", "cuda_graph_scope": ["attn", "moe_router"]}
    assert switch_errors(cfg, OVERLAP | ok) == []


def test_a_fix_that_leaves_the_ep_overlap_refused_turns_it_off():
    """PP=3 does not divide 16 GPUs: the fix PP=2 has no virtual pipeline, with which Megatron
    runs no EP overlap, so a run that asks for it is told to turn it off."""
    cfg = c(**MOE, pipeline_model_parallel_size=3)
    assert suggest_layout(cfg, 16, DGX) == "TP=1, PP=2"
    assert suggest_layout(cfg, 16, DGX, switches=(EP_OVERLAP,)) == (
        "TP=1, PP=2, overlap_moe_expert_parallel_comm = false")
    # A fix Megatron runs the overlap with adds nothing.
    pp2 = c(**MOE, pipeline_model_parallel_size=2, virtual_pipeline_model_parallel_size=2,
            tensor_model_parallel_size=16)
    fix = suggest_layout(pp2, 16, DGX, switches=(EP_OVERLAP,))
    assert fix is not None and "overlap" not in fix


def test_tp_comm_overlap_needs_sequence_parallelism():
    """validate_args turns sequence parallelism off with TP 1 and then refuses the TP
    communication overlap (arguments.py, core 0.14 to main)."""
    on = {"tp_comm_overlap": True}
    assert switch_errors(c(tensor_model_parallel_size=2), on) == []
    (line,) = switch_errors(c(), on)
    assert line == ("megatron.tensor_model_parallel_size: tp_comm_overlap needs sequence "
                    "parallelism, which Megatron turns off with TP=1: use TP > 1 with "
                    "sequence_parallel = true, or tp_comm_overlap = false")
    (line,) = switch_errors(c(tensor_model_parallel_size=2, sequence_parallel=False), on)
    assert line.startswith("megatron.sequence_parallel: tp_comm_overlap needs sequence")
    assert switch_errors(c(), {"tp_comm_overlap": False}) == []
    # PP=3 does not divide 16 GPUs: a fix that stays at TP 1 turns it off, one at TP 2 not.
    tp1 = suggest_layout(c(pipeline_model_parallel_size=3), 16, DGX, switches=("tp_comm_overlap",))
    assert tp1 == "TP=1, PP=4, tp_comm_overlap = false"
    assert suggest_layout(c(tensor_model_parallel_size=2, pipeline_model_parallel_size=3), 16,
                          DGX, switches=("tp_comm_overlap",)) == "TP=2, PP=4"


@pytest.mark.parametrize(("over", "world", "key", "text"), VIOLATIONS)
def test_violation_named(over, world, key, text):
    errs = layout_errors(c(**over), world, DGX)
    assert any(k == key and text in m for k, m in errs), errs


def test_the_interleaved_schedule_accepts_a_group_that_divides_the_microbatches():
    pp4 = dict(pipeline_model_parallel_size=4, virtual_pipeline_model_parallel_size=2)
    assert layout_errors(c(**pp4, global_batch_size=48), 24, DGX) == []  # 8 microbatches
    # 10 microbatches in groups of 5: whole groups.
    assert layout_errors(c(**pp4, global_batch_size=60, microbatch_group_size_per_vp_stage=5),
                         24, DGX) == []
    bad = c(**pp4, global_batch_size=60)
    ((key, msg),) = layout_errors(bad, 24, DGX)
    assert specific_fix(key, msg, bad, 24) == (
        "global_batch_size = 48 (8 microbatches, a multiple of PP=4), or no virtual pipeline")


def test_tp_beyond_domain_fix_keeps_model_parallel_size():
    cfg = c(tensor_model_parallel_size=16)
    fix = suggest_layout(cfg, 16, DGX)
    assert fix == "TP=8, PP=2"


def test_nvlink_domain_of_nvl72():
    """On NVL72 (4 GPUs per node, 72 per domain) TP=8 crosses nodes but not the domain;
    TP=16 does not divide 72, so some TP group would straddle two racks."""
    assert layout_errors(c(tensor_model_parallel_size=8, global_batch_size=144), 144, NVL72) == []
    errs = layout_errors(c(tensor_model_parallel_size=16, global_batch_size=144), 144, NVL72)
    assert any("does not divide the 72-GPU NVLink domain" in m for _, m in errs)


def test_warnings():
    w = layout_warnings(c(sequence_parallel=True), 8, DGX)
    assert any("no effect with TP=1" in x for x in w)
    w = layout_warnings(c(use_distributed_optimizer=False), 16, DGX)
    assert any("18 bytes/param" in x for x in w)
    # Megatron-FSDP shards the optimizer itself: no advice to turn on the distributed one.
    w = layout_warnings(c(use_distributed_optimizer=False, use_megatron_fsdp=True), 16, DGX)
    assert not any("18 bytes/param" in x for x in w)
    w = layout_warnings(c(pipeline_model_parallel_size=8, global_batch_size=4), 8, DGX)
    assert any("never fills" in x for x in w)


# --- properties --------------------------------------------------------------------------------

layouts = st.fixed_dictionaries({
    "tensor_model_parallel_size": st.sampled_from([1, 2, 3, 4, 8, 16]),
    "pipeline_model_parallel_size": st.sampled_from([1, 2, 3, 4, 6, 8]),
    "context_parallel_size": st.sampled_from([1, 2, 4]),
    "virtual_pipeline_model_parallel_size": st.sampled_from([None, 2, 4]),
    "num_layers": st.sampled_from([12, 24, 30, 32, 48]),
    "num_attention_heads": st.sampled_from([12, 16, 32, 48]),
    "num_query_groups": st.sampled_from([2, 4, 8]),
    "global_batch_size": st.sampled_from([16, 48, 64, 96, 256]),
    "micro_batch_size": st.sampled_from([1, 2]),
    "seq_length": st.sampled_from([2048, 4096, 4100]),
    "moe": st.booleans(),
    "num_experts": st.sampled_from([8, 16, 64]),
    "expert_model_parallel_size": st.sampled_from([1, 2, 4, 8]),
    "expert_tensor_parallel_size": st.sampled_from([1, 2]),
    "nodes": st.integers(1, 64),
})


def _cfg(d: dict) -> tuple[ModelConfig, int]:
    args = dict(BASE, hidden_size=128 * d["num_attention_heads"], kv_channels=128, vocab_size=1000)
    moe = d.pop("moe")
    n = d.pop("nodes")
    args.update(d)
    if not moe:
        args.pop("num_experts")
        args["expert_model_parallel_size"] = 1
        args.pop("expert_tensor_parallel_size")
    return ModelConfig.from_args(args), n * 8


def _equations_hold(cfg: ModelConfig, world: int) -> bool:
    mp = cfg.tp * cfg.cp * cfg.pp
    if world % mp:
        return False
    dp = world // mp
    ok = (cfg.tp <= 8 and 8 % cfg.tp == 0 and cfg.tp * cfg.cp * cfg.pp * dp == world
          and cfg.num_attention_heads % cfg.tp == 0 and cfg.num_query_groups % cfg.tp == 0
          and cfg.num_layers % (cfg.pp * (cfg.vpp or 1)) == 0 and (cfg.vpp is None or cfg.pp > 1)
          and cfg.global_batch_size % (cfg.micro_batch_size * dp) == 0
          and cfg.seq_length % (2 * cfg.cp) == 0)
    if ok and cfg.vpp:
        # The interleaved schedule's microbatches: a multiple of PP (its default group).
        ok = (cfg.global_batch_size // (cfg.micro_batch_size * dp)) % cfg.pp == 0
    if cfg.num_experts is not None:
        edp, rem = divmod(world, cfg.etp * cfg.ep * cfg.pp)
        ok = ok and rem == 0 and cfg.etp * cfg.ep * cfg.pp * edp == world
        ok = ok and cfg.num_experts % cfg.ep == 0 and (cfg.tp == 1 or cfg.sequence_parallel)
    else:
        ok = ok and cfg.ep == 1
    return ok


@settings(max_examples=400, deadline=None)
@given(layouts)
def test_accepted_iff_equations_hold(d):
    cfg, world = _cfg(d)
    errs = layout_errors(cfg, world, DGX)
    assert (errs == []) == _equations_hold(cfg, world), errs


@settings(max_examples=60, deadline=None)
@given(layouts)
def test_suggested_fix_is_valid_and_fits(d):
    cfg, world = _cfg(d)
    if cfg.num_experts is None and not layout_errors(cfg, world, DGX):
        return
    fix = suggest_layout(cfg, world, DGX)
    if fix is None or fix == "the current layout":
        return
    tp = re.search(r"TP=(\d+)", fix)
    pp = re.search(r"PP=(\d+)", fix)
    vpp = re.search(r"VPP=(\d+)", fix)
    gbs = re.search(r"global_batch_size=(\d+)", fix)
    new = replace(cfg, tp=int(tp.group(1)) if tp else cfg.tp,
                  pp=int(pp.group(1)) if pp else cfg.pp,
                  vpp=(int(vpp.group(1)) if vpp else None) if (tp or pp) else cfg.vpp,
                  global_batch_size=int(gbs.group(1)) if gbs else cfg.global_batch_size,
                  use_distributed_optimizer=cfg.use_distributed_optimizer
                  or "use_distributed_optimizer" in fix,
                  sequence_parallel=cfg.sequence_parallel or "sequence_parallel" in fix)
    if tp and cfg.etp == cfg.tp:
        new = replace(new, etp=new.tp)
    if "recompute_granularity" in fix:
        new = replace(new, recompute_granularity="full", recompute_method="uniform",
                      recompute_num_layers=1)
    # The layout fix cures everything TP/PP decide; other errors (CP vs sequence, EP vs
    # experts, ...) keep their own fixes.
    base_other = {k for k, m in layout_errors(cfg, world, DGX)
                  if k not in LAYOUT_KEYS and "folding" not in m}
    left = {k for k, _ in layout_errors(new, world, DGX)}
    assert left <= base_other, (fix, layout_errors(new, world, DGX))
    assert memory_bytes(new, world) <= DGX.usable_hbm_bytes


def test_a_moe_run_that_leaves_the_dispatcher_to_megatron_is_warned():
    """Megatron's default dispatcher is allgather; the prediction counts alltoall."""
    from slurmpod.megatron.validate import dispatcher_warnings

    (line,) = dispatcher_warnings(c(**MOE), {})
    assert line.startswith("moe_token_dispatcher_type is unset: Megatron's default, allgather")
    for dispatcher in ("alltoall", "flex", "allgather"):
        assert dispatcher_warnings(c(**MOE), {"moe_token_dispatcher_type": dispatcher}) == []
    assert dispatcher_warnings(c(**(MOE | dict(expert_model_parallel_size=1))), {}) == []
    assert dispatcher_warnings(c(), {}) == []  # dense
