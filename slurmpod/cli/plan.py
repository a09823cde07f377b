"""`slurmpod plan`: validate a Megatron run spec on a site and print the plan (or JSON).

Exit 0 when the layout is valid and fits in GPU memory, 3 when not; the numbers are shown in
both cases. Heavy modules (numpy, msgspec) load only when the command runs.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from slurmpod.cli.output import emit_json, table
from slurmpod.errors import ConfigError, UsageError
from slurmpod.resilience import interval as ri

if TYPE_CHECKING:
    from slurmpod.megatron.plan import Plan
    from slurmpod.megatron.runspec import RunSpec
    from slurmpod.model.site import Site


def _gib(b: float) -> str:
    if b >= 1024**3:
        return f"{b / 1024**3:.1f} GiB"
    return f"{b / 1024**2:.1f} MiB"


def _count(n: float) -> str:
    return f"{n / 1e9:.2f} B" if n >= 1e8 else f"{n / 1e6:.2f} M"


def _si(x: float) -> str:
    for unit, scale in (("E", 1e18), ("P", 1e15), ("T", 1e12), ("G", 1e9), ("M", 1e6),
                        ("k", 1e3)):
        if abs(x) >= scale:
            return f"{x / scale:.3g} {unit}"
    return f"{x:.3g} "


def load_run_input(spec: str | None, preset: str | None, megatron_args: str | None,
                   nodes: int | None, site: Site) -> tuple[RunSpec, str]:
    """The run spec from a TOML file, a preset, a Megatron command line or a launch script."""
    from slurmpod.megatron import args as margs  # lazy: start-up
    from slurmpod.megatron import runspec  # lazy: start-up

    given = [x for x in (spec, preset, megatron_args) if x is not None]
    if len(given) != 1:
        raise UsageError("give exactly one of RUN (a run spec TOML or launch script), --preset, "
                         "or --from-megatron-args")
    if preset is not None:
        path = runspec.preset_path(preset)
        builtin = path.parent == runspec.PRESETS_DIR
        return runspec.load_run(path), (f"preset {preset}" if builtin else str(path))
    if spec is not None and Path(spec).suffix == ".toml":
        return runspec.load_run(spec), spec
    if spec is not None:
        parsed = margs.read_launch_script(spec)
        source = spec
    else:
        try:
            parsed = margs.from_megatron_args(megatron_args or "")
        except ConfigError as exc:  # the option's text, not a file: a usage error
            raise UsageError(f"--from-megatron-args: {exc.message}", hint=exc.hint) from None
        source = "--from-megatron-args"
    if nodes is None:
        # Smallest node count holding one model replica.
        gpn = site.node_types[site.su_groups[0].node_type].gpus
        mp = 1
        for key in ("tensor_model_parallel_size", "context_parallel_size",
                    "pipeline_model_parallel_size"):
            v = parsed.get(key, 1)
            mp *= v if isinstance(v, int) and v > 0 else 1
        nodes = max(1, math.ceil(mp / gpn))
    return runspec.run_from_dict({"job": {"nodes": nodes}, "megatron": parsed}, source), source


def render_summary(plan: Plan, source: str | None = None) -> str:
    from slurmpod.megatron.flops import FLOPS_FORMULA_VERSION  # lazy: start-up

    p = plan
    out: list[str] = []
    out.append(f"{p.run_name} on {p.site}: {p.nodes} nodes × {p.gpus_per_node} = "
               f"{p.world_size} GPUs ({p.gpu_model})")
    vpp = f" VPP={p.vpp}" if p.vpp else ""
    moe = (f" EP={p.ep} ETP={p.etp}" if p.is_moe else "")
    edp = f", expert-DP={p.expert_data_parallel_size}" if p.is_moe else ""
    out.append(f"  layout     TP={p.tp} CP={p.cp} PP={p.pp}{vpp}{moe} -> "
               f"DP={p.data_parallel_size}{edp}")
    if p.tokens_per_iteration:
        out.append(f"  batch      {p.global_batch_size} × {p.seq_length} = "
                   f"{p.tokens_per_iteration:,} tokens/iteration; micro batch "
                   f"{p.micro_batch_size}, {p.num_microbatches} microbatches per DP rank")
    out.append(f"  model      {_count(p.params_total)} parameters "
               f"({_count(p.params_active)} active), "
               f"padded vocab {p.padded_vocab_size:,}")
    flops = (f"{_si(p.flops_per_iteration)}FLOP/iteration, " if p.flops_per_iteration else "")
    out.append(f"  flops      {flops}{_si(p.flops_per_token)}FLOP/token "
               f"({FLOPS_FORMULA_VERSION})")
    verdict = "fits" if p.fits else "DOES NOT FIT"
    out.append(f"  memory     weights+grads+optimizer {_gib(p.weight_and_optimizer_bytes_per_gpu)}"
               f" + activations {_gib(p.activation_bytes_per_gpu)} = "
               f"{_gib(p.total_bytes_per_gpu)} per GPU of {_gib(p.usable_bytes_per_gpu)} usable "
               f"({_gib(p.hbm_bytes_per_gpu)} HBM less a "
               f"{_gib(p.hbm_bytes_per_gpu - p.usable_bytes_per_gpu)} runtime reserve"
               + (f", {p.reserve_measured} of this site" if p.reserve_measured else "")
               + f"): {verdict}")
    ideal = p.ideal_seconds_per_iteration
    out.append(f"  peak       {_si(p.peak_pflops_job * 1e15)}FLOP/s for the job "
               f"({p.peak_tflops_per_gpu:g} TFLOP/s per GPU)"
               + (f"; ≥ {ideal:.3g} s/iteration at 100% MFU" if ideal else ""))
    if p.placement:
        pl = p.placement
        out.append(f"  placement  rank order {pl.order}; {pl.nodes} nodes in {pl.sus_spanned} "
                   f"SU(s), {pl.racks_spanned} rack(s), {pl.domains_spanned} NVLink domain(s); "
                   f"needs at least {pl.min_sus} SU(s) / {pl.min_blocks} block(s)")
        rows = []
        for kind, g in pl.groups.items():
            if g.size == 1 or (kind in ("ep", "etp", "edp") and not p.is_moe):
                continue
            rows.append([kind, g.size, g.count, g.max_nodes, g.cross_node, g.cross_domain,
                         g.cross_su, "yes" if g.rail_aligned else "no"])
        if rows:
            text = table(["group", "size", "count", "max nodes", "x-node", "x-domain", "x-SU",
                          "rail-aligned"], rows)
            out.extend("    " + line for line in text.splitlines())
    for w in p.warnings:
        out.append(f"warning: {w}")
    where = f"{source}: " if source else ""
    for e in p.errors:
        out.append(f"error: {where}{e}")
    out.append("plan: OK" if p.ok else f"plan: NOT OK ({len(p.errors)} error(s))")
    return "\n".join(out)


@click.command("plan")
@click.argument("run", required=False)
@click.option("--site", "site_name", default=None,
              help="Site TOML or built-in site name (default: dgx-h100-superpod).")
@click.option("--nodes", type=click.IntRange(1, 100_000), default=None,
              help="Override [job] nodes.")
@click.option("--preset", default=None, help="A built-in model preset, e.g. llama3-70b.")
@click.option("--from-megatron-args", "megatron_args", default=None, metavar="ARGS",
              help="Import a Megatron command line ('--num-layers 32 --hidden-size 4096 ...').")
@click.option("--write-spec", type=click.Path(dir_okay=False), default=None,
              help="Also write the run spec (as planned) to this TOML file.")
@click.option("--json", "as_json", is_flag=True, help="Print the plan as JSON.")
@click.option("--search", "do_search", is_flag=True,
              help="Also rank every layout of the model on these nodes by predicted step time; "
                   "--write-spec then writes the fastest.")
@click.option("--top", type=click.IntRange(1, 10_000), default=10, show_default=True,
              help="Candidates --search shows.")
@click.option("--distinct", is_flag=True,
              help="With --search: show the fastest candidate of each parallel layout (TP, CP, "
                   "PP, EP, ETP), its other VPP sizes, micro-batches and recompute folded in.")
@click.option("--headroom", is_flag=True,
              help="With --search: rank only candidates that fit by at least the memory "
                   "estimate's shortfall on published peaks (6%), taking more recompute where "
                   "a layout would fit tightly; --write-spec then writes the fastest of those.")
@click.option("--checked", is_flag=True,
              help="With --search: rank only layouts with at most as many routed experts per "
                   "GPU as a published run the model is checked on (32); --write-spec then "
                   "writes the fastest of those.")
@click.option("--pick", type=click.IntRange(1, 10_000), default=None, metavar="N",
              help="With --search and --write-spec: write the N-th candidate shown, not the "
                   "fastest (e.g. the next one to try within the model's error).")
@click.option("--history", "history_paths", multiple=True,
              type=click.Path(exists=True, path_type=Path),
              help="attempts.jsonl, a run directory or a directory of runs: the fleet's "
                   "observed failures per node set the checkpoint interval. Repeatable.")
@click.option("--checkpoint-log", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              default=None, help="A Megatron log of this run: its measured save time and "
                                 "iteration time replace the predicted ones.")
@click.option("--restart", "restart_s", type=click.FloatRange(0, 86400), default=None,
              help="Seconds from a failure to training again [default: 600].")
@click.pass_context
def plan(ctx: click.Context, run: str | None, site_name: str | None, nodes: int | None,
         preset: str | None, megatron_args: str | None, write_spec: str | None,
         as_json: bool, do_search: bool, top: int, distinct: bool, headroom: bool,
         checked: bool, pick: int | None,
         history_paths: tuple[Path, ...], checkpoint_log: Path | None,
         restart_s: float | None) -> None:
    """Validate a Megatron run spec (RUN.toml or a launch script) and plan it on the site."""
    from slurmpod.config import load_site, resolve_site_path  # lazy: start-up
    from slurmpod.megatron.plan import make_plan  # lazy: start-up

    if distinct and not do_search:
        raise click.UsageError("--distinct needs --search")
    if headroom and not do_search:
        raise click.UsageError("--headroom needs --search")
    if checked and not do_search:
        raise click.UsageError("--checked needs --search")
    if pick is not None and not (do_search and write_spec):
        raise click.UsageError("--pick needs --search and --write-spec")
    if pick is not None and pick > top:
        raise click.UsageError(f"--pick {pick} is beyond the {top} candidates --top shows")
    site_path = resolve_site_path(site_name, default="dgx-h100-superpod")
    site = load_site(site_path)
    spec, source = load_run_input(run, preset, megatron_args, nodes, site)
    from slurmpod.megatron.argnames import unknown_key_warnings  # lazy: start-up

    for line in unknown_key_warnings(spec.megatron.explicit(), site.software.megatron, source):
        click.echo(f"slurmpod: warning: {line}", err=True)
    # lazy: start-up
    from slurmpod.perf.planning import (
        experts_beyond_checked,
        host_line,
        predict_run,
        site_reserve,
        summary_line,
        switches,
        track_record,
        unchecked_line,
    )
    from slurmpod.perf.track import track_line  # lazy: start-up

    site_file = Path(site_path)
    result = make_plan(spec, site, nodes=nodes, measured_reserve=site_reserve(site, site_file))
    prediction = predict_run(spec, site, result.nodes, site_file)
    candidates: list[Any] = []
    evaluated = 0
    if do_search:
        candidates, evaluated = _search(spec, site, result, site_file, top, distinct,
                                        headroom, checked)
    unchecked = experts_beyond_checked(spec)
    validated = track_record(spec, site, site_file) if prediction else None
    rec = _checkpoint_recommendation(spec, site, result, prediction, history_paths,
                                     checkpoint_log, restart_s)
    if write_spec:
        if do_search and pick is not None and pick > len(candidates):
            raise ConfigError(f"--pick {pick}: only {len(candidates)} layouts of "
                              f"{spec.job.name} fit on {result.nodes} nodes",
                              hint=f"--pick {len(candidates)} or less")
        extra = candidates[(pick or 1) - 1].megatron_keys() if do_search else None
        _write_spec(spec, result.nodes, Path(write_spec), extra)
    if as_json:

        data: dict[str, Any] = {"source": source, **result.to_json(),
                                "prediction": ({**prediction.to_json(),
                                                "switches": switches(spec),
                                                "unchecked_experts_per_gpu": unchecked,
                                                "track_record": (validated.to_json()
                                                                 if validated else None)}
                                               if prediction else None),
                                "checkpoint": rec}
        if do_search:
            data["search"] = {"evaluated": evaluated, "world_size": result.world_size,
                              "distinct": distinct, "headroom": headroom, "checked": checked}
            data["candidates"] = _candidates_json(candidates)
        emit_json(data)
    else:
        text = render_summary(result, source)
        if prediction is not None:
            head, _, tail = text.rpartition("\nplan: ")
            named = ", ".join(switches(spec)) or (
                "none (Megatron's defaults: no overlap, no CUDA graphs; a MoE dispatcher timed as "
                "alltoall)")
            host = host_line(prediction)
            text = (f"{head}\n  predicted  {summary_line(prediction)}\n  switches   {named}"
                    + (f"\n  host       {host}" if host else "")
                    + (f"\n  unchecked  {unchecked_line(unchecked)}" if unchecked else "")
                    + (f"\n  validated  {track_line(validated)}" if validated else "")
                    + f"\nplan: {tail}")
        if rec is not None:
            head, _, tail = text.rpartition("\nplan: ")
            text = f"{head}\n  checkpoint {rec['line']}\nplan: {tail}"
        click.echo(text)
        if do_search:
            click.echo(_render_candidates(candidates, evaluated, distinct, headroom, checked))
    if not result.ok and not (do_search and candidates):
        ctx.exit(3)


def _search(spec: RunSpec, site: Site, result: Plan, site_file: Path, top: int, distinct: bool,
            headroom: bool, checked: bool) -> tuple[list[Any], int]:
    """`--search`'s candidates and how many layouts it evaluated; none fitting (with room,
    under `--headroom`; within the checked experts per GPU, under `--checked`) is one error
    line."""
    from slurmpod.perf.planning import search_run  # lazy: start-up
    from slurmpod.perf.search import fastest_per_layout  # lazy: start-up

    candidates, evaluated = search_run(spec, site, result.nodes, result.usable_bytes_per_gpu,
                                       site_file, None if distinct else top, room=headroom,
                                       checked=checked)
    if distinct:
        candidates = fastest_per_layout(candidates, top)
    if not candidates or not candidates[0].fits:
        tight = headroom and any(c.tight for c in candidates)
        raise ConfigError(f"no layout of {spec.job.name} "
                          + ("within the checked experts per GPU " if checked else "")
                          + "fits " + ("with room " if headroom else "")
                          + f"on {result.nodes} nodes of {result.site} ({evaluated} evaluated)",
                          hint=_no_fit_hint(tight, checked))
    return candidates, evaluated


def _no_fit_hint(tight: bool, checked: bool) -> str:
    """What to change when `--search` finds nothing that fits."""
    drop = [flag for flag, on in (("--headroom", tight), ("--checked", checked)) if on]
    if drop:
        return f"drop {' and '.join(drop)} to rank more layouts, or use more nodes"
    return "use more nodes or a smaller model"


def _checkpoint_recommendation(spec: RunSpec, site: Site, result: Plan, prediction: Any,
                               history_paths: tuple[Path, ...], checkpoint_log: Path | None,
                               restart_s: float | None) -> dict[str, Any] | None:
    """The save interval for this run (slurmpod.resilience.interval) as plan shows it: the
    recommendation's JSON plus `line`, and what the run spec's own save_interval would give."""
    from slurmpod.resilience.history import measured_from_log, read_history  # lazy: start-up

    history = read_history(history_paths) if history_paths else None
    measured = measured_from_log(checkpoint_log) if checkpoint_log is not None else None
    step_s, step_source = (prediction.step_time_s, "predicted") if prediction else (None, None)
    if measured is not None and measured.step_s is not None:
        step_s, step_source = measured.step_s, "measured"
    rec = ri.recommend_for_run(
        site, nodes=result.nodes, params_total=result.params_total, step_s=step_s,
        step_source=step_source, history=history,
        measured_save_s=measured.save_s if measured is not None else None,
        restart_s=ri.DEFAULT_RESTART_S if restart_s is None else restart_s)
    out = rec.to_json()
    out["line"] = rec.summary()
    out["history"] = history.to_json(site.reliability.node_mtbf_hours) if history else None
    given = spec.megatron.explicit().get("save_interval")
    out["run_spec_save_interval"] = given if isinstance(given, int) else None
    if isinstance(given, int) and given > 0 and rec.step_s is not None:
        g = ri.expected_goodput(given * rec.step_s, rec.save_s, rec.restart_s, rec.job_mtbf_s)
        out["run_spec_goodput"] = round(g, 5)
        out["line"] = (f"run spec sets save_interval {given}: expected goodput {g:.1%}; "
                       f"recommended {rec.summary()}")
    return out


def _vs_fastest(candidates: list[Any]) -> list[float]:
    """Each candidate's predicted step over the fastest's (the list is sorted)."""
    fastest = candidates[0].prediction.step_time_s if candidates else 1.0
    return [c.prediction.step_time_s / fastest for c in candidates]


def _candidates_json(candidates: list[Any]) -> list[dict[str, Any]]:
    from slurmpod.perf.search import WITHIN_MODEL_ERROR  # lazy: start-up

    return [c.to_json() | {"vs_fastest": round(r, 4),
                           "within_model_error": r <= 1 + WITHIN_MODEL_ERROR}
            for c, r in zip(candidates, _vs_fastest(candidates), strict=True)]


def _recompute_words(c: Any) -> str:
    """A candidate's recompute as the table shows it: none, full, or the selective modules."""
    if c.recompute_granularity == "selective":
        return "selective " + ",".join(c.recompute_modules)
    return c.recompute_granularity or "none"


def _render_candidates(candidates: list[Any], evaluated: int, distinct: bool = False,
                       headroom: bool = False, checked: bool = False) -> str:
    from slurmpod.megatron.memory import ESTIMATE_LOW_BY  # lazy: start-up
    from slurmpod.perf.moe import CHECKED_EXPERTS_PER_GPU  # lazy: start-up
    from slurmpod.perf.planning import unchecked_words  # lazy: start-up
    from slurmpod.perf.search import WITHIN_MODEL_ERROR  # lazy: start-up

    rows = []
    ratios = _vs_fastest(candidates)
    for i, (cand, r) in enumerate(zip(candidates, ratios, strict=True), 1):
        lay, p = cand.layout(), cand.prediction
        rows.append([i, lay["tensor_model_parallel_size"], lay["context_parallel_size"],
                     lay["pipeline_model_parallel_size"],
                     lay["virtual_pipeline_model_parallel_size"] or "-",
                     f"{lay['expert_model_parallel_size']}"
                     + (" ~" if cand.unchecked_experts else ""),
                     lay["expert_tensor_parallel_size"],
                     cand.config.micro_batch_size,
                     _recompute_words(cand.config) + ("*" if cand.switches_off else ""),
                     _gib(cand.memory_bytes) + (" !" if cand.tight else ""),
                     f"{p.step_time_s:.3g}", f"{r - 1:+.1%}",
                     f"{p.mfu:.1%}"])
    out = [f"search: {evaluated} layouts evaluated; fastest predicted first"
           + ("; the fastest of each TP/CP/PP/EP/ETP layout" if distinct else "")
           + (f"; only those that fit by at least {ESTIMATE_LOW_BY:.0%}" if headroom else "")
           + (f"; only those with at most {CHECKED_EXPERTS_PER_GPU} experts per GPU"
              if checked else "")]
    out.extend("  " + line for line in table(
        ["#", "TP", "CP", "PP", "VPP", "EP", "ETP", "MBS", "recompute", "memory/GPU",
         "step s", "vs best", "MFU"], rows).splitlines())
    off = sorted({s for c in candidates for s in c.switches_off})
    if off:
        out.append(f"  * without {' or '.join(off)}: Megatron refuses it with this layout or "
                   "recompute (--write-spec turns it off)")
    if any(c.tight for c in candidates):
        out.append(f"  ! fits by less than {ESTIMATE_LOW_BY:.0%}, what the memory estimate has "
                   "run below published peaks: it may run out of memory (docs/plan.md); "
                   "--headroom ranks only the layouts that fit with room")
    many = sorted({n for c in candidates if (n := c.unchecked_experts)})
    if many:
        out.append(f"  ~ {unchecked_words(' or '.join(map(str, many)))} (docs/perf-model.md); "
                   "--checked ranks only the layouts within it")
    close = sum(1 for r in ratios if r <= 1 + WITHIN_MODEL_ERROR)
    if close > 1:
        out.append(f"  {close} of these within {WITHIN_MODEL_ERROR:.0%} of the fastest: the "
                   "model's error on published runs cannot order them (docs/perf-model.md); a "
                   "short trial run can")
    return "\n".join(out)


def _write_spec(spec: RunSpec, nodes: int, path: Path,
                layout: dict[str, Any] | None = None) -> None:
    from slurmpod.fsutil import output_error, write_atomic  # lazy: start-up
    from slurmpod.megatron.runspec import to_toml  # lazy: start-up

    megatron = spec.megatron.explicit()
    if layout is not None:  # a --search candidate replaces the layout keys
        for key in ("num_layers_per_virtual_pipeline_stage", "num_virtual_stages_per_pipeline_rank",
                    "recompute_method", "recompute_num_layers"):
            megatron.pop(key, None)
        if layout.get("pipeline_model_parallel_size") != spec.megatron.pipeline_model_parallel_size:
            megatron.pop("decoder_first_pipeline_num_layers", None)
            megatron.pop("decoder_last_pipeline_num_layers", None)
        megatron.update(layout)
        if "virtual_pipeline_model_parallel_size" not in layout:
            megatron.pop("virtual_pipeline_model_parallel_size", None)
    data: dict[str, dict[str, Any]] = {
        "job": spec.job.explicit() | {"nodes": nodes},
        "megatron": megatron,
    }
    try:
        write_atomic(path, to_toml(data))
    except OSError as exc:
        raise output_error(path, exc) from None
