"""Run spec + site -> Plan: layout, FLOPs, memory per GPU, placement, errors with fixes.

`make_plan` is pure: the numbers are computed even for an invalid layout, so the user sees how
far off it is. The CLI prints the plan and exits 3 when `plan.ok` is false. numpy (placement)
is imported only when a placement is asked for: `slurmpod submit` needs the verdict, not the
group map, and numpy alone costs more start-up than the whole plan.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from slurmpod.megatron.flops import FLOPS_FORMULA_VERSION, flops_per_token
from slurmpod.megatron.memory import (
    ESTIMATE_LOW_BY,
    GIB,
    fits_tightly,
    megatron_weight_and_optimizer_bytes,
    param_counts,
    peak_memory,
    runtime_reserve,
)
from slurmpod.megatron.runspec import ModelConfig, RunSpec
from slurmpod.megatron.validate import (
    LAYOUT_KEYS,
    SiteShape,
    dispatcher_warnings,
    layout_errors,
    layout_warnings,
    min_nodes_that_fit,
    specific_fix,
    split_fix,
    suggest_layout,
    switch_errors,
    switches_on,
    with_fix,
)
from slurmpod.model.slurm_time import limit_minutes

if TYPE_CHECKING:
    from slurmpod.megatron.memory import MeasuredReserve
    from slurmpod.megatron.placement import Placement
    from slurmpod.model.site import Site

# A flat share of HBM for the search benchmark (benchmarks/plan_search.py); the plan's fit keeps
# megatron.memory.runtime_reserve free instead, each part of it cited (docs/formulas.md, "Fit").
HBM_HEADROOM_FRACTION = 0.10


@dataclass(frozen=True)
class _SiteArrays:
    node_type: str
    gpus_per_node: int
    domain_gpus: int
    hbm_gib: float
    peak_tflops_bf16: float
    gpu_model: str
    domain: tuple[int, ...]  # per site node, in inventory order
    rack: tuple[int, ...]
    su: tuple[int, ...]
    nodes_per_su: int
    nodes_per_rack: int
    nodes_per_domain: int
    block_nodes: int
    topology: str
    site_name: str


_SITE_CACHE: dict[int, tuple[Site, _SiteArrays]] = {}


def _site_arrays(site: Site) -> _SiteArrays:
    hit = _SITE_CACHE.get(id(site))
    if hit is not None and hit[0] is site:
        return hit[1]
    inv = site.inventory
    grp = site.su_groups[0]
    nt = site.node_types[grp.node_type]
    npd = max(1, nt.domain_gpus // nt.gpus)
    topo = site.topology_plugin
    arrays = _SiteArrays(
        node_type=grp.node_type, gpus_per_node=nt.gpus, domain_gpus=nt.domain_gpus,
        hbm_gib=nt.gpu.hbm_gib, peak_tflops_bf16=nt.gpu.peak_tflops_bf16, gpu_model=nt.gpu.model,
        domain=tuple(n.domain for n in inv.nodes), rack=tuple(n.rack for n in inv.nodes),
        su=tuple(n.su for n in inv.nodes),
        nodes_per_su=grp.nodes_per_su, nodes_per_rack=grp.nodes_per_rack, nodes_per_domain=npd,
        block_nodes=npd if topo == "block" else grp.nodes_per_su, topology=topo,
        site_name=site.site.name,
    )
    _SITE_CACHE[id(site)] = (site, arrays)
    return arrays


@dataclass(frozen=True)
class Plan:
    """One run's plan: what `slurmpod plan` prints, what `render` and `submit` consume (through
    `render.sbatch.PlanFacts.of`), and what `to_json` writes (the stable `plan --json` keys)."""

    run_name: str
    site: str
    nodes: int
    gpus_per_node: int
    world_size: int
    tp: int
    cp: int
    pp: int
    vpp: int | None
    ep: int
    etp: int
    data_parallel_size: int
    expert_data_parallel_size: int
    num_microbatches: int | None
    global_batch_size: int | None
    micro_batch_size: int
    seq_length: int
    padded_vocab_size: int
    tokens_per_iteration: int | None
    flops_per_token: float
    flops_per_iteration: float | None
    params_total: float
    params_active: float
    weight_and_optimizer_bytes_per_gpu: float
    megatron_weight_and_optimizer_bytes_per_gpu: float
    activation_bytes_per_gpu: float
    total_bytes_per_gpu: float
    hbm_bytes_per_gpu: float
    usable_bytes_per_gpu: float
    fits: bool
    gpu_model: str
    peak_tflops_per_gpu: float
    placement: Placement | None
    min_sus: int = 1
    min_blocks: int = 1
    is_moe: bool = False
    # how the runtime reserve was counted: "" published figures, else what this site measured
    reserve_measured: str = ""
    errors: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        return not self.errors and self.fits

    @property
    def flops_formula_version(self) -> str:
        """The FLOPs formula behind `flops_per_token` (megatron.flops), kept with the job."""
        return FLOPS_FORMULA_VERSION

    @property
    def peak_pflops_job(self) -> float:
        return self.world_size * self.peak_tflops_per_gpu / 1000

    @property
    def ideal_seconds_per_iteration(self) -> float | None:
        """Iteration time at 100 % MFU: the floor no real run reaches."""
        if self.flops_per_iteration is None:
            return None
        return self.flops_per_iteration / (self.world_size * self.peak_tflops_per_gpu * 1e12)

    def to_json(self) -> dict[str, Any]:
        """The `plan --json` document (its keys and order are stable: tests/golden)."""
        return {
            "ok": self.ok, "run": self.run_name, "site": self.site, "nodes": self.nodes,
            "gpus_per_node": self.gpus_per_node, "world_size": self.world_size,
            "is_moe": self.is_moe,
            "layout": {"tensor_model_parallel_size": self.tp, "context_parallel_size": self.cp,
                       "pipeline_model_parallel_size": self.pp,
                       "virtual_pipeline_model_parallel_size": self.vpp,
                       "expert_model_parallel_size": self.ep,
                       "expert_tensor_parallel_size": self.etp},
            "data_parallel_size": self.data_parallel_size,
            "expert_data_parallel_size": self.expert_data_parallel_size,
            "num_microbatches": self.num_microbatches,
            "global_batch_size": self.global_batch_size,
            "micro_batch_size": self.micro_batch_size, "seq_length": self.seq_length,
            "padded_vocab_size": self.padded_vocab_size,
            "tokens_per_iteration": self.tokens_per_iteration,
            "flops_per_token": self.flops_per_token,
            "flops_per_iteration": self.flops_per_iteration,
            "flops_formula_version": self.flops_formula_version,
            "params_total": self.params_total, "params_active": self.params_active,
            "weight_and_optimizer_bytes_per_gpu": self.weight_and_optimizer_bytes_per_gpu,
            "megatron_weight_and_optimizer_bytes_per_gpu":
                self.megatron_weight_and_optimizer_bytes_per_gpu,
            "activation_bytes_per_gpu": self.activation_bytes_per_gpu,
            "total_bytes_per_gpu": self.total_bytes_per_gpu,
            "hbm_bytes_per_gpu": self.hbm_bytes_per_gpu,
            "hbm_headroom_fraction": 1 - self.usable_bytes_per_gpu / self.hbm_bytes_per_gpu,
            "usable_bytes_per_gpu": self.usable_bytes_per_gpu, "fits": self.fits,
            "reserve_measured": self.reserve_measured or None,
            "gpu_model": self.gpu_model, "peak_tflops_per_gpu": self.peak_tflops_per_gpu,
            "peak_pflops_job": self.peak_pflops_job,
            "ideal_seconds_per_iteration": self.ideal_seconds_per_iteration,
            "min_sus": self.min_sus, "min_blocks": self.min_blocks,
            "placement": self.placement.to_json() if self.placement else None,
            "errors": list(self.errors), "warnings": list(self.warnings),
        }


def make_plan(run: RunSpec, site: Site, nodes: int | None = None, *,
              placement: bool = True, measured_reserve: MeasuredReserve | None = None) -> Plan:
    """Plan `run` on `site` (`nodes` overrides `[job] nodes`). With `placement=False` the plan
    has no group placement and none of its warnings; errors and fit are the same.
    `measured_reserve`: the runtime reserve this site's jobs measured on its GPU (`slurmpod
    calibrate`), replacing the published figures it covers."""
    sa = _site_arrays(site)
    n_nodes = nodes if nodes is not None else run.job.nodes
    c = ModelConfig.from_args(run.megatron)
    world = n_nodes * sa.gpus_per_node
    reserve = runtime_reserve(c, world, sa.hbm_gib, gpus_per_node=sa.gpus_per_node,
                              measured=measured_reserve)
    usable = (sa.hbm_gib - reserve.total_gib) * GIB
    shape = SiteShape(sa.node_type, sa.gpus_per_node, sa.domain_gpus, usable, len(sa.domain))
    dense_mp = c.tp * c.cp * c.pp
    dp = max(1, world // dense_mp)
    edp = max(1, world // (c.etp * c.ep * c.pp))
    nmb = (max(1, c.global_batch_size // (c.micro_batch_size * dp))
           if c.global_batch_size else None)
    params = param_counts(c)
    # The pipeline rank that needs the most (first stage: most activations in flight; last:
    # output layer and logits; an explicit layout may load any rank).
    peak = peak_memory(c, world)
    w, act = peak.weights, peak.activations
    total = peak.bytes_per_gpu
    fits = total <= usable
    fpt = flops_per_token(c)
    tokens = c.global_batch_size * c.seq_length if c.global_batch_size else None

    args = run.megatron.values()
    errors, fit_fix = _layout_errors(c, world, shape, sa, fits, switches_on(args))
    errors.extend(switch_errors(c, args))
    if n_nodes > len(sa.domain):
        errors.append(f"job.nodes: {n_nodes} nodes requested but site {sa.site_name} has "
                      f"{len(sa.domain)}: use at most {len(sa.domain)}")
    if not fits:
        errors.append(_memory_error(c, n_nodes, shape, sa, total, usable, fit_fix))
    part_errors, part_warnings = _partition_findings(run, n_nodes, site)
    errors.extend(part_errors)
    warnings = layout_warnings(c, world, shape)
    if fits_tightly(total, usable):
        warnings.append(_tight_memory_warning(total, usable))
    warnings.extend(dispatcher_warnings(c, args))
    warnings.extend(part_warnings)
    where: Placement | None = None
    if placement and world % dense_mp == 0 and world % (c.etp * c.ep * c.pp) == 0:
        where = _place(sa, c, n_nodes)
        warnings.extend(_placement_warnings(where, c))
    return Plan(
        run_name=run.job.name, site=sa.site_name, nodes=n_nodes, gpus_per_node=sa.gpus_per_node,
        world_size=world, tp=c.tp, cp=c.cp, pp=c.pp, vpp=c.vpp, ep=c.ep, etp=c.etp,
        data_parallel_size=dp, expert_data_parallel_size=edp, num_microbatches=nmb,
        global_batch_size=c.global_batch_size, micro_batch_size=c.micro_batch_size,
        seq_length=c.seq_length, padded_vocab_size=c.padded_vocab_size,
        tokens_per_iteration=tokens, flops_per_token=fpt,
        flops_per_iteration=fpt * tokens if tokens else None,
        params_total=params.total, params_active=params.active,
        weight_and_optimizer_bytes_per_gpu=w.bytes_per_gpu,
        megatron_weight_and_optimizer_bytes_per_gpu=megatron_weight_and_optimizer_bytes(c, world),
        activation_bytes_per_gpu=act.bytes_per_gpu, total_bytes_per_gpu=total,
        hbm_bytes_per_gpu=sa.hbm_gib * GIB, usable_bytes_per_gpu=usable, fits=fits,
        gpu_model=sa.gpu_model, peak_tflops_per_gpu=sa.peak_tflops_bf16, placement=where,
        is_moe=c.is_moe, reserve_measured=reserve.measured,
        min_sus=math.ceil(n_nodes / sa.nodes_per_su),
        min_blocks=math.ceil(n_nodes / sa.block_nodes),
        errors=tuple(errors), warnings=tuple(warnings),
    )


def _layout_errors(c: ModelConfig, world: int, shape: SiteShape, sa: _SiteArrays,
                   fits: bool, switches: tuple[str, ...]) -> tuple[list[str], str | None]:
    """The layout's structural errors, each with its fix; and the layout that fits, if any."""
    structural = layout_errors(c, world, shape)
    split_errs = set(c.pipeline_split().errors)
    errors: list[str] = []
    fit_fix: str | None = None
    if structural or not fits:
        fit_fix = suggest_layout(c, world, shape, switches=switches)
    # A valid layout that still does not fit beats no fix for a structural error.
    fix = fit_fix
    if structural and fix is None:
        fix = suggest_layout(c, world, shape, require_fit=False, switches=switches)
    for key, msg in structural:
        if "world" in msg:
            mp = math.lcm(c.tp * c.cp * c.pp, c.etp * c.ep * c.pp if c.is_moe else 1)
            step = math.lcm(mp, sa.gpus_per_node) // sa.gpus_per_node
            nodes_fix = f"a multiple of {step} nodes"
            errors.append(with_fix(f"megatron.{key}: {msg}",
                                   f"{fix} (or {nodes_fix})" if fix else nodes_fix, ""))
        else:
            own = specific_fix(key, msg, c, world)
            chosen = (fix or own) if key in LAYOUT_KEYS else (own or fix)
            if (key, msg) in split_errs:
                # Keep PP/VPP and make Megatron accept the split; else the layout search.
                chosen = split_fix(c) or fix
            generic = (f"use TP ≤ {sa.domain_gpus} dividing the heads and query groups, PP "
                       f"dividing num_layers, and TP×CP×PP dividing the {world} GPUs")
            errors.append(with_fix(f"megatron.{key}: {msg}", chosen, generic))
    return errors, fit_fix


def _memory_error(c: ModelConfig, n_nodes: int, shape: SiteShape, sa: _SiteArrays,
                  total: float, usable: float, fit_fix: str | None) -> str:
    """The error of a plan that does not fit in HBM, with the layout or node count that does."""
    need = total / GIB
    if fit_fix is None:
        more = min_nodes_that_fit(c, n_nodes, shape)
        if more is not None:
            fit_fix = f"at least {more} nodes" + (
                "" if c.use_distributed_optimizer else " with use_distributed_optimizer = true")
    return with_fix(
        f"memory: {need:.1f} GiB per GPU exceeds the {usable / GIB:.1f} GiB usable of "
        f"{sa.hbm_gib:g} GiB {sa.gpu_model} (less a {sa.hbm_gib - usable / GIB:.1f} GiB runtime "
        "reserve)",
        fit_fix, "use more nodes, the distributed optimizer or full recompute")


def _tight_memory_warning(total: float, usable: float) -> str:
    """A plan that fits by less than the estimate's shortfall on published peaks."""
    return (f"memory: {total / GIB:.1f} GiB per GPU leaves {(usable - total) / GIB:.1f} GiB "
            f"({usable / total - 1:.0%}) of the {usable / GIB:.1f} usable; the estimate has run "
            f"up to {ESTIMATE_LOW_BY:.0%} below published peaks, so this may run out of memory: "
            "a short trial run decides; selective recompute (recompute_modules) or more nodes "
            "leave room, and `plan --search --headroom` ranks the layouts that fit with room")


def _partition_findings(run: RunSpec, n_nodes: int, site: Site) -> tuple[list[str], list[str]]:
    """The partition's limits as errors, and as warnings where the time limit is the default."""
    part_errs = partition_errors(run.job.partition, run.job.time_limit, n_nodes, site)
    # The built-in default time limit is not the user's choice: warn, don't fail, on it.
    time_is_default = "time_limit" not in run.job.keys_given
    errors = [e for e in part_errs if not (time_is_default and e.startswith("job.time_limit"))]
    warnings = [f"{e} (the default [job] time_limit)" for e in part_errs
                if time_is_default and e.startswith("job.time_limit")]
    return errors, warnings


def _place(sa: _SiteArrays, c: ModelConfig, n_nodes: int) -> Placement:
    from slurmpod.megatron.placement import node_map_from_arrays, place  # lazy: start-up

    nm = node_map_from_arrays(sa.domain, sa.rack, sa.su, n_nodes, sa.nodes_per_su,
                              sa.nodes_per_rack, sa.nodes_per_domain)
    return place(tp=c.tp, cp=c.cp, pp=c.pp, ep=c.ep, etp=c.etp, nodes=n_nodes,
                 gpus_per_node=sa.gpus_per_node, node_map=nm, block_nodes=sa.block_nodes,
                 moe=c.is_moe)


def _minutes(limit: str) -> float:
    """A validated Slurm time (model.slurm_time.TIME_PATTERN) in minutes; no limit -> inf."""
    minutes = limit_minutes(limit)
    return math.inf if minutes is None else minutes


def partition_errors(partition: str | None, time_limit: str, nodes: int, site: Site) -> list[str]:
    """The job's partition exists, holds enough nodes and allows the time limit."""
    if not site.partitions:
        return []
    names = [p.name for p in site.partitions]
    part = next((p for p in site.partitions if p.name == partition), None)
    if partition is not None and part is None:
        return [f"job.partition: no partition {partition!r} on site {site.site.name}: use one of "
                f"{', '.join(names)}"]
    if part is None:
        part = next((p for p in site.partitions if p.default), None)
        if part is None:
            return []
    out: list[str] = []
    if part.sus != "all":
        sus = {s - 1 for s in part.sus}
        have = sum(1 for n in site.inventory.nodes if n.su in sus)
        if nodes > have:
            bigger = [p.name for p in site.partitions if p.sus == "all"]
            out.append(f"job.nodes: partition {part.name} has {have} nodes, {nodes} requested: "
                       f"use at most {have} nodes" + (f" or partition {bigger[0]}" if bigger
                                                      else ""))
    if _minutes(time_limit) > _minutes(part.max_time):
        out.append(f"job.time_limit: {time_limit} exceeds partition {part.name}'s MaxTime "
                   f"{part.max_time}: use time_limit = \"{part.max_time}\" or less")
    return out


def _placement_warnings(p: Placement, c: ModelConfig) -> list[str]:
    out: list[str] = []
    tp = p.groups["tp"]
    if tp.cross_domain:
        out.append(f"{tp.cross_domain} TP groups cross an NVLink domain")
    cp = p.groups["cp"]
    if cp.cross_domain and c.cp > 1:
        out.append(f"{cp.cross_domain} CP groups leave their NVLink domain: ring attention "
                   "runs over the fabric")
    dp = p.groups["dp"]
    if dp.cross_node and not dp.rail_aligned:
        out.append("DP groups are not rail-aligned (members on different local ranks): "
                   "gradient reduction crosses rails (PXN through NVLink)")
    if p.nodes > 1 and p.sus_spanned > p.min_sus:
        out.append(f"the job spans {p.sus_spanned} SUs but needs only {p.min_sus}")
    if c.is_moe:
        ep = p.groups["ep"]
        if ep.cross_su:
            out.append(f"{ep.cross_su} EP groups cross SUs: MoE all-to-all goes through the "
                       "spine")
    return out



