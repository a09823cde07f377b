"""Run spec + site + plan -> one typed context object -> the sbatch script.

`build_context` is pure: it decides every `#SBATCH` directive (whole exclusive nodes, one task
per GPU, placement by topology, requeue and signal lead, the accounting comment), the NCCL
environment and the launch line. `render_script` fills the Jinja template (site template dirs
first, then the built-in `templates/sbatch/`). `sbatch_line` is the one place a value becomes an
`#SBATCH` line; shell lines get their values through the `shquote` filter.
"""

from __future__ import annotations

import math
import os
import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from slurmpod import __version__
from slurmpod.errors import ConfigError
from slurmpod.model.comment import prediction_keys, submit_comment
from slurmpod.model.site import NodeType, Site
from slurmpod.render import launch
from slurmpod.render.nccl_env import (
    EnvPlan,
    EnvVar,
    FabricFacts,
    RunFacts,
    build_env,
    debug_vars,
    parse_nccl_version,
)
from slurmpod.resilience.health import NODE_CHECK

if TYPE_CHECKING:
    from slurmpod.megatron.plan import Plan
    from slurmpod.megatron.runspec import JobSpec, RunSpec
    from slurmpod.perf.model import Prediction

DEFAULT_TEMPLATE = "sbatch/megatron.sbatch.j2"

# sbatch reads `#SBATCH` lines with its own tokenizer (src/sbatch/opt.c `_get_argument`, the same
# in 22.05 and 24.11): whitespace splits, '…' and "…" group, a backslash escapes the next
# character even inside quotes, an unquoted `#` starts a comment. Plain words need no quoting.
_SLURM_PLAIN = re.compile(r"^[A-Za-z0-9_.,:@/=+%^-]+$")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def slurm_quote(value: object, key: str = "value") -> str:
    """Quote one value for sbatch's `#SBATCH` tokenizer (not for bash: those lines are comments
    to bash). Control characters cannot be carried on one line and are refused."""
    text = str(value)
    if _CONTROL.search(text):
        raise ConfigError(f"--{key} {text!r} holds a newline, tab or control character, which "
                          "an #SBATCH line cannot carry; remove it")
    if _SLURM_PLAIN.match(text):
        return text
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def sbatch_line(key: str, value: object = True) -> str | None:
    """One `#SBATCH --key[=value]` line; True is a bare flag; None/False drop the line."""
    if value is None or value is False:
        return None
    if not re.fullmatch(r"[a-z][a-z0-9-]*", key):
        raise ValueError(f"not an sbatch long option: {key!r}")
    if value is True:
        return f"#SBATCH --{key}"
    return f"#SBATCH --{key}={slurm_quote(value, key)}"


@dataclass(frozen=True)
class PlanFacts:
    """What the script needs from the plan (`PlanFacts.of` a megatron.plan.Plan)."""

    nodes: int
    gpus_per_node: int
    min_sus: int
    min_blocks: int
    flops_per_iteration: float
    peak_tflops: float
    formula: str
    fits: bool = True
    errors: tuple[str, ...] = ()
    tokens_per_iteration: int | None = None
    params_total: float = 0.0
    # The performance model's prediction for the planned layout, as the Comment's `pred` key
    # (model.comment.prediction_keys) that the fleet report compares the finished job with;
    # None when the model made none.
    prediction: Mapping[str, Any] | None = None

    @classmethod
    def of(cls, plan: Plan, prediction: Prediction | None = None, arch: str = ""
           ) -> PlanFacts:
        return cls(
            nodes=plan.nodes, gpus_per_node=plan.gpus_per_node, min_sus=plan.min_sus or 1,
            min_blocks=plan.min_blocks or 1, flops_per_iteration=plan.flops_per_iteration or 0.0,
            peak_tflops=plan.peak_tflops_per_gpu, formula=plan.flops_formula_version,
            fits=plan.fits, errors=plan.errors,
            tokens_per_iteration=plan.tokens_per_iteration or None,
            params_total=plan.params_total,
            prediction=recorded_prediction(plan, prediction, arch),
        )


def layout_text(plan: Plan) -> str:
    """The plan's layout in the words the reports show ("TP8 PP2 DP4 MBS1 GBS64"; as
    report/predicted.py words a log's): plain letters, digits and spaces, so the report shows it
    (it shows only such words from a Comment, which the job's owner may rewrite)."""
    parts = [f"TP{plan.tp}", f"PP{plan.pp}"]
    if plan.vpp and plan.vpp > 1:
        parts.append(f"VPP{plan.vpp}")
    if plan.cp > 1:
        parts.append(f"CP{plan.cp}")
    if plan.ep > 1:
        parts.append(f"EP{plan.ep}")
    parts += [f"DP{plan.data_parallel_size}", f"MBS{plan.micro_batch_size}"]
    if plan.global_batch_size:
        parts.append(f"GBS{plan.global_batch_size}")
    return " ".join(parts)


def recorded_prediction(plan: Plan, pred: Prediction | None, arch: str = ""
                        ) -> dict[str, Any] | None:
    """The Comment's `pred` key for `pred` on `plan`'s layout and GPU (and the architecture id
    `arch`, where given); None without a prediction or with one the fleet report would refuse
    (a step that is not a positive finite time, an MFU outside (0, 1]: report/predicted.py
    `recorded_prediction`)."""
    if pred is None or not (math.isfinite(pred.step_time_s) and pred.step_time_s > 0
                            and 0 < pred.mfu <= 1):
        return None
    return prediction_keys(step_time_s=pred.step_time_s, mfu=pred.mfu,
                           tokens_per_s_per_gpu=pred.tokens_per_s_per_gpu,
                           breakdown_s=pred.breakdown_s, gpu=plan.gpu_model,
                           layout=layout_text(plan), arch=arch)


@dataclass(frozen=True)
class RenderOptions:
    """Choices made on the command line (or by `submit`) rather than in the run spec."""

    site_label: str = "sandbox"
    template: str = DEFAULT_TEMPLATE
    template_dirs: tuple[Path, ...] = ()
    run_dir: str | None = None
    nccl_debug: bool = False
    nccl_algo: str | None = None
    nccl_proto: str | None = None
    nccl_version: str | None = None
    site_env: Mapping[str, str | None] = field(default_factory=dict)
    run_env: Mapping[str, str | None] = field(default_factory=dict)
    topo_dir: str = "/etc/slurmpod/nccl-topo"
    max_restarts: int = 3
    signal_lead_s: int | None = None  # None: from the predicted checkpoint save time
    save_on_cancel: bool = False  # a cancelled run may finish a save (bounded by KillWait)
    switch_wait: str = "24:00:00"
    chain: int = 1
    spares: int = 0
    cpu_bind: str = "numactl"  # numactl | slurm | none
    master_port: int = 0  # 0: 20000 + job id mod 20000, so requeues and neighbours never clash
    monitor: bool = True
    token: str = ""
    python: str | None = None  # interpreter the script runs `slurmpod hook monitor` with
    # Resilience inside the job (docs/resilience-in-job.md); each may be overridden at submit
    # time by the job's environment (SLURMPOD_HANG_K, …), so it is tunable per run.
    hang_k: float = 10.0
    hang_floor_s: float = 300.0
    health_gate: bool = True
    health_check: str | None = None  # a site's extra per-node check (an executable path)
    shed_fraction: float = 0.02
    drain_bad_nodes: bool = False
    # The health gate's all-reduce between pairs of the job's nodes (resilience/allreduce.py;
    # SLURMPOD_HEALTH_ALLREDUCE=1 turns it on at submit time) and the bus bandwidth in GB/s a
    # pair must reach on nccl-tests (None: no threshold; SLURMPOD_ALLREDUCE_MIN_BUSBW).
    health_allreduce: bool = False
    allreduce_min_busbw: float | None = None
    # Megatron's --save-interval when [megatron] has none (submit: slurmpod.resilience.interval)
    save_interval: int | None = None


@dataclass(frozen=True)
class SbatchContext:
    """Everything the template reads. Values are raw; the template quotes them."""

    header: str
    directives: tuple[str, ...]
    run_name: str
    run_dir: str
    log_dir: str
    checkpoint_dir: str
    fabric: str
    env: tuple[EnvVar, ...]
    gated_out: tuple[str, ...]
    gpu_numa_map: str
    cpu_bind: str
    rank_wrapper: str
    srun: tuple[str, ...]
    command: tuple[str, ...]
    nodes: int
    spares: int
    tasks_per_node: int
    master_port: int
    max_restarts: int
    train_iters: int | None
    monitor: bool
    comment: str
    signal_lead_s: int = 300
    save_on_cancel: bool = False
    python: str | None = None
    imex: bool = False  # Slurm hands the job an IMEX channel (switch/nvidia_imex): check it
    # Container runs (pyxis): the rank wrapper creates and checks trainer_dirs where the trainer
    # runs; the template exports them as SLURMPOD_TRAINER_DIRS (trainer_dirs_env).
    container: bool = False
    trainer_dirs: tuple[str, ...] = ()
    hang_k: float = 10.0
    hang_floor_s: float = 300.0
    hang_setup_s: float = 1800.0
    health_gate: bool = True
    health_check: str | None = None
    shed_fraction: float = 0.02
    drain_bad_nodes: bool = False
    health_allreduce: bool = False
    allreduce_min_busbw: float | None = None
    allreduce_tool: str = "auto"  # loopback for emulated GPUs (the sandbox has no NCCL)
    gpus_expected: int = 8
    hcas_expected: str = ""  # compute HCAs the health gate checks (none for emulated GPUs)
    hca_rate: str = ""  # e.g. "400 Gb/sec", when the site states it
    checkpoint_free_bytes: int = 0
    dump_script: str = ""
    health_script: str = ""

    @property
    def trainer_dirs_env(self) -> str:
        """SLURMPOD_TRAINER_DIRS: one path per line (container paths hold no newline)."""
        return "\n".join(self.trainer_dirs)

    @property
    def command_groups(self) -> list[tuple[str, ...]]:
        """The command split before every `--flag`, one group per script line."""
        groups: list[list[str]] = []
        for word in self.command:
            if not groups or word.startswith("--"):
                groups.append([word])
            else:
                groups[-1].append(word)
        return [tuple(g) for g in groups]


def compact_comment(run_name: str, plan: PlanFacts, token: str) -> str:
    """The job's `--comment`: compact JSON the accounting hooks parse (sacct keeps it when
    AccountingStoreFlags=job_comment). Keys as slurmpod.model.comment reads them; the live
    monitor merges its figures in and keeps these."""
    return submit_comment(version=__version__, run=run_name,
                          flops_per_iter=plan.flops_per_iteration, peak_tflops=plan.peak_tflops,
                          gpus=plan.nodes * plan.gpus_per_node, formula=plan.formula,
                          tokens_per_iter=plan.tokens_per_iteration, token=token,
                          prediction=plan.prediction)


def segment_size(nodes: int, domain_nodes: int, unit: int = 1) -> int:
    """--segment for block topology: the largest divisor of the job's nodes that fits one NVLink
    domain, so every segment stays inside one block (Slurm needs nodes % segment == 0).

    `unit` is the nodes one tensor-parallel group spans (TP 8 on 4-GPU GB200 trays: 2): a
    segment that is a multiple of it keeps every rack's share of the job a whole number of TP
    groups, so no TP group straddles two NVLink domains. When no such divisor fits, the plain
    rule applies (the planner reports TP groups that cross a domain)."""
    if nodes <= domain_nodes:
        return nodes
    fits = [d for d in range(1, domain_nodes + 1) if nodes % d == 0]
    aligned = [d for d in fits if d % max(unit, 1) == 0]
    return max(aligned or fits)


def _node_type(site: Site) -> tuple[str, NodeType]:
    # The job runs on one node type; the first SU group's type is the site's default.
    name = site.su_groups[0].node_type
    return name, site.node_types[name]


def _check_time(value: str, key: str) -> None:
    if not re.fullmatch(r"(\d+-)?\d+(:\d{2}){0,2}", value):
        raise ConfigError(f"{value!r} is not a Slurm time ([D-]HH:MM:SS)", key=key)


def _command(entrypoint: str, python: str | None = None) -> list[str]:
    try:
        words = shlex.split(entrypoint)
    except ValueError as exc:
        raise ConfigError(f"cannot split entrypoint: {exc}", key="job.entrypoint") from None
    if not words:
        raise ConfigError("entrypoint is empty", key="job.entrypoint")
    if words[0].endswith(".py"):
        words = ["python", *words]
    if (python and words[0] in ("python", "python3") and len(words) > 2 and words[1] == "-m"
            and words[2].startswith("slurmpod.")):
        # slurmpod's own module (the sandbox's emulated trainer) runs with the interpreter that
        # has slurmpod, named absolutely: the script must not depend on an activated venv.
        words[0] = python
    return words


def default_run_dir(run_name: str) -> str:
    return f"slurmpod-runs/{run_name}"


class _Paths(NamedTuple):
    run_dir: str
    log_dir: str
    checkpoint_dir: str


class _Timing(NamedTuple):
    limit_min: int | None  # the job's time limit; None: no limit
    save_s: float  # predicted checkpoint save
    lead_s: int  # --signal lead before the time limit


class _Launch(NamedTuple):
    command: tuple[str, ...]
    srun: tuple[str, ...]
    checkpoint_dir: str  # inside the container for container runs
    container: bool
    trainer_dirs: tuple[str, ...]
    gpu_numa: list[int]


def build_context(run: RunSpec, site: Site, plan: PlanFacts, opts: RenderOptions) -> SbatchContext:
    """Decide the whole script. Raises ConfigError for combinations Slurm would refuse."""
    nt_name, nt = _node_type(site)
    _check_options(opts)
    paths = _paths(run.job, opts)
    timing = _timing(run.job, site, plan, opts)
    placement, imex = _placement_directives(run, site, nt, plan, opts)
    comment = compact_comment(run.job.name, plan, opts.token)
    pairs = [*_job_directives(run.job, plan, nt, opts, paths, timing), *placement,
             *_chain_directives(opts), ("comment", comment)]
    directives = tuple(line for k, v in pairs if (line := sbatch_line(k, v)) is not None)
    env_plan = _nccl_environment(site, nt_name, nt, run, opts)
    lc = _launch(run, nt, plan, opts, paths, timing)
    train_iters = run.megatron.explicit().get("train_iters")
    hcas = tuple(h.device for h in nt.compute_hcas)
    return SbatchContext(
        header=_header(run.job.name, site, nt_name, nt.gpus, plan, opts), directives=directives,
        run_name=run.job.name, run_dir=paths.run_dir, log_dir=paths.log_dir,
        checkpoint_dir=lc.checkpoint_dir,
        fabric=site.fabric.kind + ("+sharp" if site.fabric.sharp else ""),
        env=env_plan.variables, gated_out=env_plan.gated_out,
        gpu_numa_map=launch.gpu_numa_map(lc.gpu_numa), cpu_bind=opts.cpu_bind,
        rank_wrapper=launch.RANK_WRAPPER, srun=lc.srun, command=lc.command,
        nodes=plan.nodes, spares=opts.spares, tasks_per_node=nt.gpus,
        master_port=opts.master_port, max_restarts=opts.max_restarts,
        train_iters=int(train_iters) if isinstance(train_iters, int) else None,
        monitor=opts.monitor, comment=comment, signal_lead_s=timing.lead_s,
        save_on_cancel=opts.save_on_cancel, python=opts.python, imex=imex,
        container=lc.container, trainer_dirs=lc.trainer_dirs,
        hang_k=opts.hang_k, hang_floor_s=opts.hang_floor_s,
        hang_setup_s=float(launch.DISTRIBUTED_TIMEOUT_MIN * 60), health_gate=opts.health_gate,
        health_check=opts.health_check, shed_fraction=opts.shed_fraction,
        drain_bad_nodes=opts.drain_bad_nodes, health_allreduce=opts.health_allreduce,
        allreduce_min_busbw=opts.allreduce_min_busbw,
        allreduce_tool="loopback" if nt.gpu.emulated else "auto", gpus_expected=nt.gpus,
        hcas_expected="" if nt.gpu.emulated else ",".join(hcas),
        # two checkpoints' bytes: the one being written and the last good one
        checkpoint_free_bytes=int(2 * plan.params_total * launch.CHECKPOINT_BYTES_PER_PARAM),
        dump_script=launch.DUMP_SCRIPT, health_script=_health_script(),
    )


def _check_options(opts: RenderOptions) -> None:
    if opts.spares < 0 or opts.max_restarts < 0 or opts.chain < 1:
        raise ConfigError("spares and max_restarts must be >= 0 and chain >= 1")
    # The CLI's ranges (cli/submit.py), for callers that build RenderOptions themselves.
    if not (math.isfinite(opts.hang_k) and math.isfinite(opts.hang_floor_s)
            and opts.hang_k >= 1 and opts.hang_floor_s >= 1 and 0 <= opts.shed_fraction <= 1):
        raise ConfigError(f"hang_k {opts.hang_k:g} (>= 1), hang_floor_s {opts.hang_floor_s:g} "
                          f"(>= 1 s) or shed_fraction {opts.shed_fraction:g} (0 to 1) is out "
                          "of range")
    if opts.allreduce_min_busbw is not None and not (
            math.isfinite(opts.allreduce_min_busbw) and opts.allreduce_min_busbw > 0):
        raise ConfigError(f"allreduce_min_busbw {opts.allreduce_min_busbw:g} must be > 0 GB/s")
    _check_time(opts.switch_wait, "switch_wait")


def _paths(job: JobSpec, opts: RenderOptions) -> _Paths:
    run_dir = (opts.run_dir or job.work_dir or default_run_dir(job.name)).rstrip("/") or "/"
    return _Paths(run_dir, f"{run_dir}/logs", job.checkpoint_dir or f"{run_dir}/checkpoints")


def _timing(job: JobSpec, site: Site, plan: PlanFacts, opts: RenderOptions) -> _Timing:
    """When the trainer is asked to save before the time limit: the lead covers the predicted
    checkpoint save (launch.signal_lead)."""
    limit_min = launch.parse_time_limit_min(job.time_limit)
    save_s = launch.predicted_save_s(plan.params_total, site.storage.checkpoint_write_gb_per_s)
    return _Timing(limit_min, save_s, launch.signal_lead(limit_min, save_s, opts.signal_lead_s))


def _job_directives(job: JobSpec, plan: PlanFacts, nt: NodeType, opts: RenderOptions,
                    paths: _Paths, timing: _Timing) -> list[tuple[str, object]]:
    """Whole exclusive nodes, one task per GPU, where the job runs and logs, requeue, signal."""
    gpn = nt.gpus
    return [
        ("job-name", job.name),
        ("nodes", plan.nodes + opts.spares),
        ("ntasks-per-node", gpn),
        ("gpus-per-node", gpn),
        ("exclusive", True),
        ("mem", 0),
        ("time", job.time_limit),
        ("partition", job.partition),
        ("account", job.account),
        ("qos", job.qos),
        ("chdir", paths.run_dir),
        # %x job name, %j job id; a requeued job keeps its id, so append, never truncate.
        ("output", f"{paths.log_dir.replace('%', '%%')}/%x-%j.out"),
        ("open-mode", "append"),
        ("requeue", bool(job.requeue)),
        # B: only the batch shell hears the time-limit warning, and USR2 tells it apart from
        # every SIGTERM Slurm sends (cancel, preemption, requeue); the shell asks the trainer to
        # save. SIGUSR1 is taken by NCCL (its own debug/abort handler).
        ("signal", f"B:USR2@{timing.lead_s}"),
    ]


def _placement_directives(run: RunSpec, site: Site, nt: NodeType, plan: PlanFacts,
                          opts: RenderOptions) -> tuple[list[tuple[str, object]], bool]:
    """Placement by topology (--switches on a tree, --segment on blocks) and whether the job
    gets an IMEX channel."""
    gpn = nt.gpus
    if site.topology_plugin == "tree":
        # The spares are part of the allocation: count them in the leaf switches (SUs) asked for.
        su_nodes = site.su_groups[0].nodes_per_su
        sus = max(plan.min_sus, -(-(plan.nodes + opts.spares) // su_nodes))
        return [("switches", f"{sus}@{opts.switch_wait}")], False
    if site.slurm.version_tuple < (24, 5):
        return [], False
    # --segment (and --exclusive=topo) came with Slurm 24.05 (NEWS 24.05.0). Never
    # --nodelist with block topology: it can make the job unplaceable (-x is fine).
    # Plain --exclusive, not =topo: NVL72's NVSwitch trays are non-blocking and the IMEX
    # channel (switch/nvidia_imex) isolates a job's memory, so sharing a rack with another
    # job costs nothing, while =topo would idle the rest of every block (2 of 18 trays for
    # a 16-node segment). No --network=unique-channel-per-segment (25.11): Megatron's DP/PP
    # groups span segments, and ranks of two segments in one rack import each other's
    # memory over NVLink (NCCL MNNVL) only while they share one IMEX channel.
    # The segment divides the whole allocation, spares included: Slurm refuses a node count
    # that is not a multiple of it (topology/block eval_nodes_block.c, "segment_size does
    # not fit the job size"), so the job could never start.
    domain_nodes = max(1, nt.domain_gpus // gpn)
    from slurmpod.topology.generate import imex_enabled  # lazy: start-up

    imex = imex_enabled(site, site.slurm.version_tuple)
    tp_nodes = -(-run.megatron.tensor_model_parallel_size // gpn)
    return [("segment", segment_size(plan.nodes + opts.spares, domain_nodes, tp_nodes))], imex


def _chain_directives(opts: RenderOptions) -> list[tuple[str, object]]:
    d: list[tuple[str, object]] = []
    if opts.spares:
        d.append(("no-kill", True))  # keep the allocation when a node dies; a spare takes over
    if opts.chain > 1:
        d.append(("dependency", "singleton"))
    return d


def _run_facts(args: Mapping[str, Any]) -> RunFacts:
    from slurmpod.megatron.runspec import megatron_flag  # lazy: start-up

    impl = str(args.get("cuda_graph_impl") or "none").strip().lower()
    graphs = (impl != "none" or megatron_flag(args.get("enable_cuda_graph"))
              or megatron_flag(args.get("external_cuda_graph")))
    return RunFacts(cuda_graphs=graphs, nccl_ub=megatron_flag(args.get("nccl_ub")))


def _nccl_environment(site: Site, nt_name: str, nt: NodeType, run: RunSpec,
                      opts: RenderOptions) -> EnvPlan:
    """The fabric's NCCL variables, the allocator's for the run's arguments, then the site's,
    the run's and the debug layer."""
    job = run.job
    hcas = tuple(h.device for h in nt.compute_hcas)
    mgmt = [h.netdev for h in nt.hcas if h.role == "management" and h.netdev]
    rail0 = [h.netdev for h in nt.compute_hcas[:1] if h.netdev]
    facts = FabricFacts(
        kind=site.fabric.kind, sharp=site.fabric.sharp, hcas_in_rail_order=hcas,
        socket_ifnames=tuple(mgmt or rail0),
        topo_file=f"{opts.topo_dir.rstrip('/')}/{nt_name}.xml" if opts.topo_dir else None,
        nccl_version=parse_nccl_version(opts.nccl_version),
    )
    run_env = {**dict(job.env), **dict(opts.run_env)}
    return build_env(facts, site_overrides=opts.site_env, run_overrides=run_env,
                     debug=debug_vars(opts.nccl_debug, opts.nccl_algo, opts.nccl_proto),
                     run=_run_facts(run.megatron.values()))


def _launch(run: RunSpec, nt: NodeType, plan: PlanFacts, opts: RenderOptions, paths: _Paths,
            timing: _Timing) -> _Launch:
    """The trainer's command (Megatron's arguments with the derived save/exit timing) and the
    srun line, inside a container when the run names an image."""
    job = run.job
    container = None
    ckpt = paths.checkpoint_dir
    trainer_dirs: tuple[str, ...] = ()
    if job.container_image:
        from slurmpod.render.container import container_run  # lazy: start-up

        crun = container_run(job, run_dir=paths.run_dir, log_dir=paths.log_dir,
                             checkpoint_dir=ckpt, topo_dir=opts.topo_dir)
        container, ckpt, trainer_dirs = crun.container, crun.checkpoint_dir, crun.trainer_dirs
    exit_min = launch.exit_duration_min(timing.limit_min, timing.lead_s, timing.save_s)
    full = launch.with_derived(run.megatron.explicit(), checkpoint_dir=ckpt,
                               exit_duration=exit_min, save_interval=opts.save_interval)
    command = (*_command(job.entrypoint, opts.python), *launch.megatron_argv(full))
    gpu_numa = [p.numa for p in nt.gpu_pci]
    srun = launch.srun_argv(nodes=plan.nodes, tasks_per_node=nt.gpus, container=container,
                            cpu_bind=opts.cpu_bind, gpu_numa=gpu_numa)
    if opts.cpu_bind not in ("numactl", "slurm", "none"):
        raise ConfigError(f"cpu_bind {opts.cpu_bind!r}: use numactl, slurm or none")
    return _Launch(command, tuple(srun), ckpt, container is not None, tuple(trainer_dirs),
                   gpu_numa)


def _header(run_name: str, site: Site, nt_name: str, gpn: int, plan: PlanFacts,
            opts: RenderOptions) -> str:
    return (f"# Generated by slurmpod {__version__} from template {opts.template} for site "
            f"{opts.site_label}.\n# Run {run_name}: {plan.nodes} nodes x {gpn} "
            f"GPUs ({nt_name}), fabric {site.fabric.kind}"
            f"{' + SHARP' if site.fabric.sharp else ''}, topology {site.topology_plugin}.")


def _health_script() -> str:

    return NODE_CHECK


def render_script(ctx: SbatchContext, template: str = DEFAULT_TEMPLATE,
                  template_dirs: Sequence[Path] = ()) -> str:
    """Fill the template; a site template dir holding the same name overrides the built-in."""
    import jinja2  # lazy: start-up (jinja2 only when used)

    from slurmpod.render.env import make_env  # lazy: start-up

    env = make_env(template_dirs)
    _bytecode_cache(env)
    try:
        tpl = env.get_template(template)
    except jinja2.TemplateNotFound:
        raise ConfigError(f"template {template!r} not found in "
                          f"{', '.join(map(str, template_dirs)) or 'the built-in templates'}",
                          hint="pass --template-dir DIR holding sbatch/<name>.j2") from None
    try:
        text = tpl.render(ctx=ctx)
    except jinja2.UndefinedError as exc:
        raise ConfigError(f"template {template!r} uses an unknown value: {exc.message}") from None
    return text if text.endswith("\n") else text + "\n"


def _bytecode_cache(env: Any) -> None:
    """Keep compiled templates in ~/.cache/slurmpod/jinja (keyed by source checksum), so a
    submit does not recompile the script template each time; silently skipped if unwritable."""

    import jinja2  # lazy: start-up (jinja2 only when used)

    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    path = os.path.join(base, "slurmpod", "jinja")
    try:
        os.makedirs(path, mode=0o700, exist_ok=True)
    except OSError:
        return
    if os.access(path, os.W_OK):
        env.bytecode_cache = jinja2.FileSystemBytecodeCache(path)
