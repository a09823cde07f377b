"""Calibration and validation of the performance model against measured iteration times.

Two sources of measurements:
- published points (tests/data/perf/published.toml: NVIDIA's NeMo / Megatron-Bridge tables and
  Megatron-LM papers): `fit_generation` fits `Efficiency` of one GPU generation on at most two
  `calibration` rows, `fit_host_forward` the host's FP8 MoE forward on the one marked
  `fits = "host"`; `evaluate` predicts every row and reports the error;
- a site's own finished jobs (`slurmpod calibrate`): `fit_site` scales the generation's factors
  so that the median job's prediction matches what it achieved; `perf.store` keeps the result
  in the site's directory (`<site>.perf.toml`), beside the memory reserve the same jobs
  measured (`perf.reserve`).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from slurmpod.errors import SlurmpodError
from slurmpod.megatron.memory import GIB, peak_memory, runtime_reserve
from slurmpod.megatron.runspec import ModelConfig, preset_path
from slurmpod.model.gpus import CATALOG
from slurmpod.perf.fitted import FITTED, Efficiency
from slurmpod.perf.hardware import Hardware, hardware_from_site
from slurmpod.perf.model import Prediction, predict
from slurmpod.perf.options import RunOptions
from slurmpod.perf.track import KNOWN_MISS_MEDIAN, Run, architecture, track

if TYPE_CHECKING:
    from slurmpod.model.jobs import JobRecord
    from slurmpod.model.site import Site
    from slurmpod.perf.search import Candidate


@dataclass(frozen=True)
class Point:
    id: str
    role: str  # calibration | validation | excluded
    source: str
    system: str
    precision: str
    gpus: int
    config: ModelConfig | None
    opts: RunOptions
    hardware: Hardware | None
    published_s: float | None
    raw: Mapping[str, Any]

    @property
    def generation(self) -> str:
        return self.hardware.generation if self.hardware else ""

    @property
    def is_moe(self) -> bool:
        return bool(self.config and self.config.is_moe)


def _hardware(system: Mapping[str, Any]) -> Hardware:

    g = CATALOG[system["gpu"]]
    return Hardware(gpu_model=g.model, generation=g.generation, peak_bf16=g.peak_tflops_bf16,
                    peak_fp8=g.peak_tflops_fp8, hbm_tb_s=g.hbm_tb_per_s,
                    nvlink_gb_s=g.nvlink_gb_per_s, domain_gpus=g.nvlink_domain_gpus,
                    gpus_per_node=int(system["gpus_per_node"]),
                    nic_gb_s=float(system["nic_gb_s"]), host_link_gb_s=g.host_link_gb_per_s,
                    host_memory_gb_s=g.host_memory_gb_per_s)


def _model_args(table: Mapping[str, Any], name: str) -> dict[str, Any]:
    from slurmpod.config import read_toml  # lazy: start-up

    m = dict(table["models"][name])
    preset = m.pop("preset", None)
    if preset is None:
        return m
    base = dict(read_toml(preset_path(preset))["megatron"])
    return base | m


def row_config(table: Mapping[str, Any], raw: Mapping[str, Any]
               ) -> tuple[ModelConfig, RunOptions]:
    """The Megatron config and run options of one row of a published table: its model's
    arguments (`models`), the source's unprinted settings (`defaults`), the row's layout and
    the settings it names."""
    args = _model_args(table, raw["model"]) | dict(raw.get("model_args", {}))
    args |= dict(table["defaults"][raw["defaults"]])
    args |= {"tensor_model_parallel_size": raw.get("tp", 1),
             "pipeline_model_parallel_size": raw.get("pp", 1),
             "context_parallel_size": raw.get("cp", 1),
             "expert_model_parallel_size": raw.get("ep", 1),
             "expert_tensor_parallel_size": 1 if raw.get("ep", 1) > 1 else raw.get("tp", 1),
             "virtual_pipeline_model_parallel_size": raw.get("vpp"),
             "global_batch_size": raw["global_batch_size"],
             "micro_batch_size": raw["micro_batch_size"]}
    for key in ("decoder_first_pipeline_num_layers", "decoder_last_pipeline_num_layers"):
        args.pop(key, None)  # the recipe's own split is not published with the row
    if "seq_length" in raw:
        args["seq_length"] = raw["seq_length"]
    for key in ("overlap_moe_expert_parallel_comm", "tp_comm_overlap", "overlap_param_gather",
                "moe_token_dispatcher_type", "pipeline_model_parallel_layout",
                "cuda_graph_impl", "cuda_graph_scope", "fp8_dot_product_attention",
                "use_transformer_engine_op_fuser", "use_megatron_fsdp",
                "cpu_offloading_num_layers"):
        if key in raw:
            args[key] = raw[key]
    if raw.get("recompute") == "none":
        # The recipe sets recompute_granularity None over its model's preset (TOML has no
        # null): Megatron refuses activation offload with any recompute.
        args.pop("recompute_granularity", None)
        args.pop("recompute_modules", None)
    if raw["precision"] == "fp8":
        args["fp8"] = "hybrid"
    c = ModelConfig.from_args(args)
    if "optimizer_state_bytes" in raw:
        # A run of another framework's optimizer (NeMo 1.x's Apex DistributedFusedAdam), whose
        # state no Megatron argument spells: bytes per parameter, as the row's source gives.
        c = replace(c, optimizer_state_bytes=float(raw["optimizer_state_bytes"]))
    return c, RunOptions.from_args(args)


def system_hardware(table: Mapping[str, Any], system: str) -> Hardware:
    """A published table's system (`systems`) as the model's Hardware."""
    return _hardware(table["systems"][system])


def load_published(path: Path | str) -> list[Point]:
    """Every point of the published table, with its config resolved."""
    from slurmpod.config import read_toml  # lazy: start-up

    table = read_toml(Path(path))
    out: list[Point] = []
    for raw in table["points"]:
        hw = system_hardware(table, raw["system"])
        if raw["role"] == "excluded":
            out.append(Point(raw["id"], "excluded", raw["source"], raw["system"],
                             raw["precision"], raw["gpus"], None, RunOptions(), hw, None, raw))
            continue
        c, opts = row_config(table, raw)
        out.append(Point(raw["id"], raw["role"], raw["source"], raw["system"], raw["precision"],
                         raw["gpus"], c, opts, hw, published_seconds(raw, c), raw))
    return out


def published_seconds(raw: Mapping[str, Any], c: ModelConfig) -> float:
    """The measured iteration time a row stands for: as printed, or from tokens/s/GPU, or
    from TFLOP/s/GPU through the FLOPs formula of the source's release."""
    gbs, n = raw["global_batch_size"], raw["gpus"]
    if "published_step_time_s" in raw:
        return float(raw["published_step_time_s"])
    if "published_tokens_per_s_per_gpu" in raw:
        return gbs * c.seq_length / (raw["published_tokens_per_s_per_gpu"] * n)
    s, l_, h, v = c.seq_length, c.num_layers, c.hidden_size, c.padded_vocab_size
    formula = raw.get("tflops_formula", "narayanan2021-eq3")
    if formula == "narayanan2021-eq3":
        # Narayanan et al. 2021, eq. 3: F = 96 B s l h^2 (1 + s/6h + V/16lh), recompute included.
        flops = 96 * gbs * s * l_ * h * h * (1 + s / (6 * h) + v / (16 * l_ * h))
    elif formula == "megatron-core-r0.8":
        # megatron/training/training.py num_floating_point_operations at core_r0.8.0: attention
        # with the full (non-causal) s x s scores, GeLU MLP, logits.
        q_ratio = c.kv_channels * c.num_attention_heads / h
        groups = c.num_query_groups / c.num_attention_heads
        gated = 1.5 if c.swiglu else 1.0
        flops = 12 * gbs * s * l_ * h * h * ((1 + groups + s / h) * q_ratio
                                             + c.ffn_hidden_size / h * gated
                                             + v / (2 * l_ * h))
    else:
        raise ValueError(f"{raw['id']}: unknown tflops_formula {formula!r}")
    return flops / (raw["published_tflops_per_gpu"] * 1e12 * n)


@dataclass(frozen=True)
class Result:
    point: Point
    predicted_s: float
    error: float  # predicted / published - 1


def evaluate(points: Iterable[Point], fitted: Mapping[str, Efficiency] | None = None
             ) -> list[Result]:
    fitted = fitted or FITTED
    out: list[Result] = []
    for p in points:
        if p.config is None or p.published_s is None or p.hardware is None:
            continue
        pred = predict(p.config, p.gpus, p.hardware, fitted[p.generation], p.opts)
        assert pred is not None, p.id
        out.append(Result(p, pred.step_time_s, pred.step_time_s / p.published_s - 1))
    return out


def track_runs(results: Iterable[Result]) -> list[Run]:
    """The validation rows as the track record holds them (slurmpod.perf.track)."""
    return [Run(r.point.id, str(r.point.raw["model"]), architecture(r.point.config),
                r.point.hardware.gpu_model, r.point.precision, r.error)
            for r in results
            if r.point.role == "validation" and r.point.config is not None
            and r.point.hardware is not None]


def _solve(f: Callable[[float], float], lo: float = 0.05, hi: float = 1.5) -> float:
    """The x in [lo, hi] where the decreasing f crosses 0 (bisection on a log scale)."""
    for _ in range(60):
        mid = math.sqrt(lo * hi)
        if f(mid) > 0:
            lo = mid
        else:
            hi = mid
    return round(math.sqrt(lo * hi), 4)


def fit_generation(points: Sequence[Point], generation: str) -> Efficiency:
    """Fit `gemm` on the generation's BF16 calibration row and `fp8` on its FP8 row (at most
    two rows); with one row, one factor serves both."""
    every = [p for p in points if p.role == "calibration" and p.generation == generation]
    if len(every) > 2:
        raise ValueError(f"{generation}: {len(every)} calibration points; at most two")
    cal = [p for p in every if not _fits_host(p)]
    bf16 = [p for p in cal if p.precision != "fp8"]
    fp8 = [p for p in cal if p.precision == "fp8"]
    names = ", ".join(p.id for p in cal)

    def err(p: Point, eff: Efficiency) -> float:
        assert p.config is not None and p.hardware is not None and p.published_s is not None
        pred = predict(p.config, p.gpus, p.hardware, eff, p.opts)
        assert pred is not None
        return math.log(pred.step_time_s / p.published_s)

    if not bf16 and fp8:
        # One FP8 row only (Hopper): one factor for both, as Ampere's one BF16 row gives.
        x = _solve(lambda x: err(fp8[0], Efficiency(x, x)))
        return Efficiency(x, x, names)
    gemm = FITTED[generation].gemm
    if bf16:
        gemm = _solve(lambda x: err(bf16[0], Efficiency(x, x)))
    f8 = gemm
    if fp8:
        f8 = _solve(lambda x: err(fp8[0], Efficiency(gemm, x)))
    return Efficiency(gemm, f8, names)


def _fits_host(p: Point) -> bool:
    return p.raw.get("fits") == "host"


def fit_host_forward(points: Sequence[Point]) -> tuple[float, str]:
    """Fit MOE_FP8_HOST_FORWARD_S on the one calibration row marked `fits = "host"` (an FP8 MoE
    row without CUDA graphs, on its generation's fitted factors): (seconds, the row's id)."""
    rows = [p for p in points if p.role == "calibration" and _fits_host(p)]
    if len(rows) != 1:
        raise ValueError(f"{len(rows)} calibration rows marked fits = \"host\"; one is needed")
    p = rows[0]
    assert p.config is not None and p.hardware is not None and p.published_s is not None
    config, hw, published = p.config, p.hardware, p.published_s
    base = FITTED[p.generation]

    def too_fast(ms: float) -> float:  # decreasing in the host time
        pred = predict(config, p.gpus, hw, replace(base, moe_fp8_host_forward_s=ms / 1e3),
                       p.opts)
        assert pred is not None
        return -math.log(pred.step_time_s / published)

    return _solve(too_fast, 0.01, 100.0) / 1e3, p.id


# --- a site's own jobs ---------------------------------------------------------------------------

@dataclass(frozen=True)
class Achieved:
    """One finished job: what ran and its steady-state iteration time."""

    job_id: str
    config: ModelConfig
    world: int
    opts: RunOptions
    step_time_s: float
    # The GPU of the job's own nodes (same generation as the fit's); None: the fit's hardware.
    hardware: Hardware | None = None


# No steady training iteration takes a day: a record saying so is not a measurement.
MAX_STEP_S = 86_400.0

# Why a job of Slurm's accounting gives no point to fit on (`achieved_from_record`'s reasons,
# `slurmpod calibrate --json`'s `skipped` keys, the hint when no job is left).
SKIP_REASONS = {
    "running": "not finished",
    "no-record": "no spool record of the epilog",
    "implausible": "figures the epilog flagged implausible",
    "no-step-time": "no steady-state median iteration time in the record",
    "bad-step-time": "a median iteration time no real step has (not a number, <= 0, over a day)",
    "unknown-nodes": "nodes not all of one node type of the site file",
    "other-generation": "GPUs of another generation than the one fitted",
    "no-dump": "no Megatron arguments dump in the head of a log this user may read",
    "bad-dump": "an arguments dump that fails its checks",
    "more-gpus-than-slurm": "a dump world_size above the GPUs Slurm allocated",
    "no-prediction": "a model or layout the performance model cannot place",
    "known-miss": "an architecture whose published runs the built-in model misses by more "
                  f"than {100 * KNOWN_MISS_MEDIAN:.0f} % (median: GPT-OSS 120B)",
}


def _step_time_s(record: Mapping[str, Any]) -> float | str:
    """The epilog's steady-state median iteration time in seconds, or a skip reason."""
    summary = record.get("summary")
    metrics = summary.get("metrics") if isinstance(summary, dict) else None
    stats = metrics.get("iter_time_ms") if isinstance(metrics, dict) else None
    median = stats.get("median") if isinstance(stats, dict) else None
    if median is None:
        return "no-step-time"
    if isinstance(median, bool) or not isinstance(median, int | float):
        return "bad-step-time"
    s = float(median) / 1000.0
    if not (math.isfinite(s) and 0 < s <= MAX_STEP_S):
        return "bad-step-time"
    return s


def achieved_from_record(job: JobRecord, record: Any,
                         args: Mapping[str, Any] | Callable[[], Mapping[str, Any] | None] | None,
                         *, node_type: str | None, site: Site, generation: str
                         ) -> Achieved | str:
    """One finished job of Slurm's accounting as a point to fit on, or why not (a key of
    `SKIP_REASONS`). Pure.

    What decides the fit comes from Slurm and the epilog: the job's state, GPUs and nodes
    (`job`; `node_type`: the site file's type of all its nodes, `trusted.site_gpu`, None when
    unknown or mixed) and the record's steady-state median (`summary.metrics.iter_time_ms`);
    what ran (model, layout, world_size) comes from the log's arguments dump `args`, checked by
    `check_dump_args`, and may not claim more GPUs than Slurm allocated. `args` may be a
    callable, called only once every cheaper check has passed (it reads the job's log)."""
    from slurmpod.megatron.validate import check_dump_args  # lazy: start-up

    if not job.state.is_terminal:
        return "running"
    if not isinstance(record, dict):
        return "no-record"
    summary = record.get("summary")
    if isinstance(summary, dict) and summary.get("implausible"):
        return "implausible"
    step = _step_time_s(record)
    if isinstance(step, str):
        return step
    nt = site.node_types.get(node_type) if node_type is not None else None
    if nt is None:
        return "unknown-nodes"
    try:
        hw = hardware_from_site(site, node_type)
    except (StopIteration, KeyError):  # a node type no SU group uses
        return "unknown-nodes"
    if hw.generation != generation:
        return "other-generation"
    # Slurm's gres/gpu allocation; a whole-node job that asked for no gres holds its nodes'
    # GPUs (as `trusted.allocated_gpus` counts it).
    slurm_gpus = job.n_gpus if job.n_gpus > 0 else nt.gpus * max(job.n_nodes, 0)
    dump = args() if callable(args) else args
    if not dump:
        return "no-dump"
    if check_dump_args(dump) is not None:
        return "bad-dump"
    world = dump.get("world_size", slurm_gpus)
    if world is None:
        world = slurm_gpus
    if isinstance(world, bool) or not isinstance(world, int) or world < 1:
        return "bad-dump"
    if world > slurm_gpus:
        return "more-gpus-than-slurm"
    try:
        config, opts = ModelConfig.from_args(dump), RunOptions.from_args(dump)
    except (SlurmpodError, ValueError, TypeError, KeyError, ArithmeticError):
        return "bad-dump"
    return Achieved(job.job_id, config, world, opts, step, hw)


def without_known_misses(jobs: Sequence[Achieved], runs: Sequence[Run]
                         ) -> tuple[list[Achieved], int]:
    """The jobs to fit a site's factors on, and how many were left out: those of an
    architecture the built-in model is known to miss (`slurmpod.perf.track`, `Track.missed`;
    GPT-OSS 120B), whose gap the factors would otherwise spread over every other model."""
    kept = [j for j in jobs if not track(j.config, "", runs).missed]
    return kept, len(jobs) - len(kept)


def _predictable(j: Achieved, hw: Hardware, eff: Efficiency) -> bool:
    """The model places the job's layout (a dump's layout it refuses is no point to fit on)."""
    try:
        return predict(j.config, j.world, j.hardware or hw, eff, j.opts) is not None
    except (SlurmpodError, ValueError, TypeError, KeyError, ArithmeticError):
        return False


def _predicted(j: Achieved, hw: Hardware, eff: Efficiency) -> Prediction:
    pred = predict(j.config, j.world, j.hardware or hw, eff, j.opts)
    assert pred is not None  # _predictable
    return pred


def _median_log(jobs: Sequence[Achieved], hw: Hardware, eff: Efficiency) -> float:
    return statistics.median(math.log(_predicted(j, hw, eff).step_time_s / j.step_time_s)
                             for j in jobs)


def fit_site(jobs: Sequence[Achieved], hw: Hardware, base: Efficiency | None = None
             ) -> tuple[Efficiency, list[tuple[str, float]]]:
    """Scale the generation's factors by one number so that the median job's prediction equals
    its achieved time, over the jobs whose predicted step does not wait on the host; then fit
    the host's FP8 MoE forward (`MOE_FP8_HOST_FORWARD_S`) the same way on those that do (at
    least `HOST_BOUND_SHARE` of the step). Returns the factors and each job's predicted /
    achieved after the fit."""
    base = base or FITTED.get(hw.generation, FITTED["hopper"])
    usable = [j for j in jobs if _predictable(j, hw, base)]
    if not usable:
        raise ValueError("no job with a model and a steady iteration time to calibrate on")
    # A host-bound job (`Prediction.host_bound`) is a point for the host's figure, not the
    # GPU factors.
    host_bound = [_predicted(j, hw, base).host_bound for j in usable]
    gpu_jobs = [j for j, h in zip(usable, host_bound, strict=True) if not h]
    host_jobs = [j for j, h in zip(usable, host_bound, strict=True) if h]
    eff = base
    if gpu_jobs:
        scale = _solve(lambda x: _median_log(gpu_jobs, hw, replace(
            base, gemm=base.gemm * x, fp8=base.fp8 * x)), 0.05, 1.0 / max(base.gemm, base.fp8))
        eff = replace(base, gemm=round(base.gemm * scale, 4), fp8=round(base.fp8 * scale, 4))
    if host_jobs:
        fitted = eff
        ms = _solve(lambda x: -_median_log(host_jobs, hw, replace(
            fitted, moe_fp8_host_forward_s=x / 1e3)), 0.01, 100.0)
        eff = replace(eff, moe_fp8_host_forward_s=ms / 1e3)
    eff = replace(eff, fitted_on=f"{len(usable)} jobs of this site (slurmpod calibrate)")
    return eff, [(j.job_id, _predicted(j, hw, eff).step_time_s / j.step_time_s) for j in usable]


# --- the validation report (benchmarks/plan_search.py, tests/unit/perf/test_validation.py) -----

def error_stats(results: Sequence[Result], role: str = "validation") -> dict[str, float]:
    """Median and max |error| over `role` rows: all, dense, MoE, and MoE rows whose published
    configuration holds what decides their time (no `config_gap`)."""
    out: dict[str, float] = {}
    for name, sel in (("all", None), ("dense", False), ("moe", True), ("moe_published", True)):
        errs = [abs(r.error) for r in results
                if r.point.role == role and (sel is None or r.point.is_moe == sel)
                and not (name == "moe_published" and r.point.raw.get("config_gap"))]
        if errs:
            out[f"{name}_median"] = statistics.median(errs)
            out[f"{name}_max"] = max(errs)
            out[f"{name}_n"] = len(errs)
    return out


def usable_bytes(c: ModelConfig, world: int, hw: Hardware) -> float:
    """HBM per GPU the search may fill for `c` on `world` GPUs of `hw`: what `slurmpod plan`
    counts as usable (the GPU's HBM less megatron.memory.runtime_reserve), so "fits" means
    the same in the recipe ranking, the search benchmark and `plan`."""
    hbm_gib = CATALOG[hw.gpu_model].hbm_gib
    reserve = runtime_reserve(c, world, hbm_gib, gpus_per_node=hw.gpus_per_node)
    return (hbm_gib - reserve.total_gib) * GIB


class LayoutRank(NamedTuple):
    """Where the search ranks a layout: its rank (None: not a fitting candidate), the number of
    candidates, why it is not one, its predicted step over the fastest candidate's, its rank
    among the candidates within the range of published runs the model is checked on (no more
    experts per GPU than `moe.CHECKED_EXPERTS_PER_GPU`), and the rank of its parallel layout
    among the distinct ones, of all and of those checked."""

    rank: int | None
    candidates: int
    why: str
    vs_fastest: float | None = None
    checked_rank: int | None = None
    # Among parallel layouts (TP, CP, PP, EP, ETP), each its fastest candidate, as `plan
    # --search --distinct` lists them: all, and those within the checked range
    distinct_rank: int | None = None
    checked_distinct_rank: int | None = None


def recipe_rank(p: Point) -> LayoutRank:
    """Where the search ranks the published layout of `p` (`LayoutRank`)."""

    assert p.config is not None and p.hardware is not None
    return layout_rank(p.config, p.gpus, p.hardware, FITTED[p.generation], p.opts,
                       usable_bytes(p.config, p.gpus, p.hardware))


def layout_rank(c: ModelConfig, world: int, hw: Hardware, eff: Efficiency, opts: RunOptions,
                usable_bytes: float) -> LayoutRank:
    """Where the search ranks `c`'s own layout (TP, CP, PP, VPP, EP, micro-batch) among every
    fitting candidate (`LayoutRank`)."""
    from slurmpod.perf.search import search  # lazy: start-up

    cands, _ = search(c, world, hw, usable_bytes, eff, opts, top=None)
    if not cands or not cands[0].fits:
        return LayoutRank(None, 0, "nothing fits")
    want = (c.tp, c.cp, c.pp, c.vpp, c.ep, c.micro_batch_size)
    fastest = cands[0].prediction.step_time_s
    checked = 0
    for i, cand in enumerate(cands, 1):
        k = cand.config
        checked += cand.unchecked_experts is None
        if (k.tp, k.cp, k.pp, k.vpp, k.ep, k.micro_batch_size) == want:
            inside = cand.unchecked_experts is None
            return LayoutRank(i, len(cands), "", cand.prediction.step_time_s / fastest,
                              checked if inside else None, _distinct_rank(cands, c),
                              _distinct_rank([x for x in cands if x.unchecked_experts is None],
                                             c) if inside else None)
    need = peak_memory(c, world).bytes_per_gpu
    if need > usable_bytes:
        return LayoutRank(None, len(cands), (
            f"the recipe as published needs {need / 1024**3:.1f} GiB per GPU, above "
            f"{usable_bytes / 1024**3:.1f} usable"))
    return LayoutRank(None, len(cands), "not a fitting candidate (layout rule)")


def _distinct_rank(cands: Sequence[Candidate], c: ModelConfig) -> int | None:
    """The rank of `c`'s parallel layout among the distinct layouts of `cands` (sorted)."""
    from slurmpod.perf.search import fastest_per_layout  # lazy: start-up

    want = (c.tp, c.cp, c.pp, c.ep, c.etp)
    for i, cand in enumerate(fastest_per_layout(list(cands)), 1):
        k = cand.config
        if (k.tp, k.cp, k.pp, k.ep, k.etp) == want:
            return i
    return None


def markdown_table(points: Sequence[Point], results: Sequence[Result]) -> str:
    """Every point with its source, config, published and predicted time and error."""
    by_id = {r.point.id: r for r in results}
    lines = ["| id | role | source | GPUs | precision | layout (TP/CP/PP/VPP/EP, MBS, GBS) | "
             "published s | predicted s | error |", "|---|---|---|---|---|---|---|---|---|"]
    for p in points:
        raw = p.raw
        lay = (f"{raw.get('tp', 1)}/{raw.get('cp', 1)}/{raw.get('pp', 1)}/"
               f"{raw.get('vpp') or '-'}/{raw.get('ep', 1)}, {raw['micro_batch_size']}, "
               f"{raw['global_batch_size']}")
        r = by_id.get(p.id)
        pub = f"{p.published_s:.3f}" if p.published_s else "-"
        pred = f"{r.predicted_s:.3f}" if r else "-"
        err = f"{r.error:+.1%}" if r else raw.get("reason", "-")
        gap = " (a)" if raw.get("config_gap") else ""
        role = f"{p.role} (host)" if _fits_host(p) else p.role
        lines.append(f"| {p.id}{gap} | {role} | {p.source} | {p.gpus} | {p.precision} | "
                     f"{lay} | {pub} | {pred} | {err} |")
    gaps = [p for p in points if p.raw.get("config_gap")]
    if gaps:
        lines += ["", "(a) What decides the row's time is not published with it, or not modelled; "
                  "the row stays in the MoE figures, and is left out of `moe_published`:", ""]
        lines += [f"- {p.id}: {p.raw['config_gap']}" for p in gaps]
    return "\n".join(lines) + "\n"
