"""`slurmpod mfu LOG`: MFU, throughput and goodput of any Megatron job from its log.

The model comes from `--run RUN.toml` or from the log's own `arguments` dump; the GPU count from
`--gpus`, else the dump's `world_size`, else the run spec's nodes × GPUs per node; the peak from
the site (`--site`, default the built-in `dgx-h100-superpod`). FLOPs are slurmpod's own
(`slurmpod.megatron.flops`), so jobs from different Megatron releases compare; Megatron's own
TFLOP/s is shown next to them when the log has it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from slurmpod.accounting import plausible
from slurmpod.cli.output import emit_json, table
from slurmpod.errors import ConfigError, UsageError

if TYPE_CHECKING:
    from slurmpod.accounting.metrics import JobMetrics, Stats
    from slurmpod.model.site import Site


def _read_log(path: Path, attempt: int | None = None) -> Any:
    from slurmpod.accounting.logparse import LogParser, parse_log  # lazy: start-up
    from slurmpod.accounting.metrics import COLUMNS_READ  # lazy: start-up

    try:
        if attempt is None:
            with path.open("rb") as f:
                return parse_log(f, COLUMNS_READ)
        start, end = _attempt_range(path, attempt)
        with path.open("rb") as f:
            f.seek(start)
            # Pieces of the stream, not lines: parse_log would end each piece with a newline.
            parser = LogParser(COLUMNS_READ)
            for chunk in _chunks(f, end - start if end is not None else None):
                parser.feed(chunk)
            return parser.close()
    except OSError as exc:
        raise UsageError(f"{path}: cannot read the log: {exc.strerror}") from None


def _attempt_range(log: Path, attempt: int) -> tuple[int, int | None]:
    """Byte range of one attempt in a slurmpod job log (RUN_DIR/logs/NAME-JOB.out), from the
    job script's record next to it (RUN_DIR/.slurmpod/attempts.jsonl, docs/runs.md)."""
    from slurmpod.runs.attempts import byte_range  # lazy: start-up
    from slurmpod.runs.local import attempts_of_log, record_beside  # lazy: start-up

    mine = attempts_of_log(log.resolve())
    if mine is None:
        raise UsageError(f"{log}: --attempt needs the job script's attempt record "
                         f"{record_beside(log.resolve())}, which cannot be read",
                         hint="only logs of jobs submitted by slurmpod have attempts")
    chosen = [a for a in mine if a.attempt == attempt and a.log_offset is not None]
    if not chosen:
        have = ", ".join(str(a.attempt) for a in mine) or "none"
        raise UsageError(f"{log}: no attempt {attempt} in {record_beside(log.resolve())} "
                         f"(attempts: {have})")
    return byte_range(chosen[0])


def _chunks(f: Any, limit: int | None, size: int = 4 * 1024 * 1024) -> Any:
    left = limit
    while left is None or left > 0:
        data = f.read(size if left is None else min(size, left))
        if not data:
            return
        if left is not None:
            left -= len(data)
        yield data


def _fp8_peak(site: Site, node_type: str | None) -> float | None:
    """The site's dense FP8 peak when the job's GPUs have one (one GPU kind), else None."""
    types = site.node_types
    chosen = [types[node_type]] if node_type is not None else list(types.values())
    peaks = {nt.gpu.peak_tflops_fp8 for nt in chosen}
    peak = peaks.pop() if len(peaks) == 1 else None
    return float(peak) if peak else None


def _fp8_run(args: Any) -> bool:
    from slurmpod.accounting.figures import is_fp8  # lazy: start-up

    if isinstance(args, Mapping):
        return is_fp8(args)
    return is_fp8({"fp8": getattr(args, "fp8", None)})


def _peak(site: Site, site_name: str, node_type: str | None) -> tuple[float, str]:
    types = site.node_types
    chosen = {node_type: types[node_type]} if node_type is not None else dict(types)
    peaks = {nt.gpu.peak_tflops_bf16 for nt in chosen.values()}
    if len(peaks) != 1:
        listing = ", ".join(f"{k}: {v.gpu.model} {v.gpu.peak_tflops_bf16:g}"
                            for k, v in sorted(chosen.items()))
        raise UsageError(f"site {site_name} has GPUs with different peaks ({listing})",
                         hint="choose the job's nodes with --node-type, or give --peak-tflops")
    name = sorted(chosen)[0]
    nt = chosen[name]
    return float(nt.gpu.peak_tflops_bf16), f"{site_name}: {name}, {nt.gpu.name or nt.gpu.model}"


def _fmt(x: float | None, spec: str) -> str:
    return "-" if x is None or not math.isfinite(x) else format(x, spec)


@click.command("mfu")
@click.argument("log", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--run", "run_file", type=click.Path(dir_okay=False, path_type=Path),
              help="Run spec (TOML) with the job's Megatron arguments [default: the log's "
                   "arguments dump].")
@click.option("--site", default=None,
              help="Site file or built-in site name [default: dgx-h100-superpod].")
@click.option("--node-type", default=None, help="The site node type the job ran on.")
@click.option("--gpus", type=click.IntRange(min=1), default=None,
              help="GPUs of the job [default: world_size from the log].")
@click.option("--peak-tflops", type=click.FloatRange(min=0, min_open=True), default=None,
              help="Dense BF16 peak per GPU, overriding the site's.")
@click.option("--warmup-iters", type=click.IntRange(min=0), default=10, show_default=True,
              help="Iterations after each launch left out of the steady-state statistics.")
@click.option("--attempt", type=click.IntRange(min=1), default=None,
              help="Only this attempt of a slurmpod job (its bytes of the log, from the job "
                   "script's .slurmpod/attempts.jsonl).")
@click.option("--series", is_flag=True, help="With --json: add the per-record series.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def mfu(log: Path, run_file: Path | None, site: str | None, node_type: str | None,
        gpus: int | None, peak_tflops: float | None, warmup_iters: int, attempt: int | None,
        series: bool, as_json: bool) -> None:
    """MFU and throughput from a Megatron LOG (any release, submitted by slurmpod or not)."""
    from slurmpod.accounting.metrics import job_metrics  # lazy: start-up

    summary = _read_iterations(log, attempt)
    site_obj = _site_for(site, node_type)
    site_name = site_obj.site.name
    args, source, world_size = _model_args(log, run_file, summary, site_obj, node_type)
    n_gpus = gpus or world_size
    peak, peak_src = _peak_for(peak_tflops, site_obj, site_name, node_type)
    if args is None:
        # No model: what the log itself says (iteration times, Megatron's own TFLOP/s, power).
        m = job_metrics(summary, None, peak, n_gpus or 1, seq_length=None,
                        flops_formula="none", warmup_iters=warmup_iters,
                        series=series and as_json)
        if as_json:

            doc = _json_doc(log, attempt, None, peak_src, summary, m, series)
            doc["n_gpus"] = n_gpus
            emit_json(doc)
            return
        click.echo(_text(log, summary, m, None, peak_src, n_gpus))
        return
    if n_gpus is None:
        where = ("the run spec's nodes need the node type (the site has several)" if run_file
                 else "no world_size in the log's arguments")
        raise UsageError(f"the number of GPUs is unknown: {where}",
                         hint="give it with --gpus N" + (" or --node-type" if run_file else ""))
    m = _model_metrics(log, run_file, summary, args, peak, n_gpus, warmup_iters,
                       series and as_json)
    # FP8 runs: MFU against the BF16 dense peak (the usual convention) and, labelled, the FP8
    # one; the site's, so only with the site's peak.
    peak_fp8 = (_fp8_peak(site_obj, node_type) if peak_tflops is None and _fp8_run(args)
                else None)
    if as_json:
        _emit_model_json(log, attempt, source, peak_src, summary, m, series, peak, peak_fp8)
    else:
        click.echo(_model_text(log, summary, m, source, peak_src, n_gpus, peak, peak_fp8))


def _read_iterations(log: Path, attempt: int | None) -> Any:
    """The log's parsed summary; a log without one iteration line is a usage error."""
    summary = _read_log(log, attempt)
    if len(summary.iterations) == 0:
        raise UsageError(f"{log}: no Megatron iteration lines found "
                         f"({summary.n_rejected} malformed)",
                         hint="is this the job's stdout? Megatron prints `iteration N/ M | ...` "
                              "every --log-interval iterations")
    return summary


def _site_for(site: str | None, node_type: str | None) -> Site:
    """The site (default the built-in dgx-h100-superpod), with `--node-type` one of its types."""
    from slurmpod.config import load_site, resolve_site_path  # lazy: start-up

    site_obj = load_site(resolve_site_path(site, default="dgx-h100-superpod"))
    if node_type is not None and node_type not in site_obj.node_types:
        raise UsageError(f"--node-type {node_type!r}: not a node type of site "
                         f"{site_obj.site.name}",
                         hint=f"node types: {', '.join(sorted(site_obj.node_types))}")
    return site_obj


def _model_args(log: Path, run_file: Path | None, summary: Any, site_obj: Site,
                node_type: str | None) -> tuple[Any, str | None, int | None]:
    """(Megatron arguments, where they came from, world size) from `--run`, else the log's
    arguments dump (checked first: it is the job's word), else (None, None, None)."""
    from slurmpod.megatron.runspec import load_run  # lazy: start-up
    from slurmpod.megatron.validate import check_dump_args  # lazy: start-up

    if run_file is not None:
        run = load_run(run_file)
        nt_name = node_type or (next(iter(site_obj.node_types)) if len(site_obj.node_types) == 1
                                else None)
        world_size = (run.job.nodes * site_obj.node_types[nt_name].gpus
                      if nt_name in site_obj.node_types else None)
        return run.megatron, f"run spec {run_file}", world_size
    if summary.args is None:
        return None, None, None
    args = summary.args
    # A dump is the job's word, not checked by slurmpod: refuse nonsense before using it
    # (a negative layer count gave a negative MFU, 1e12 layers a MemoryError).
    problem = check_dump_args(args)
    if problem is not None:
        raise ConfigError(f"arguments dump: {problem}", file=str(log),
                          hint="fix the numbers with --run RUN.toml (the job's run spec)")
    ws = args.get("world_size")
    return args, "the log's arguments dump", ws if isinstance(ws, int) and ws > 0 else None


def _peak_for(peak_tflops: float | None, site_obj: Site, site_name: str,
              node_type: str | None) -> tuple[float, str]:
    """(dense BF16 peak per GPU, where it came from): `--peak-tflops`, else the site's."""
    if peak_tflops is None:
        return _peak(site_obj, site_name, node_type)
    if not math.isfinite(peak_tflops):  # click's FloatRange lets nan and inf through
        raise UsageError(f"--peak-tflops {peak_tflops}: give the GPU's finite dense peak in "
                         "TFLOP/s (H100 SXM: 989)")
    return float(peak_tflops), "--peak-tflops"


def _model_metrics(log: Path, run_file: Path | None, summary: Any, args: Any, peak: float,
                   n_gpus: int, warmup_iters: int, series: bool) -> JobMetrics:
    """The job's figures with slurmpod's FLOPs of the model; a model it cannot count is a
    config error naming the run spec or the log."""
    from slurmpod.accounting.metrics import flops_fn_for, job_metrics  # lazy: start-up
    from slurmpod.megatron.runspec import ModelConfig  # lazy: start-up

    try:
        cfg = ModelConfig.from_args(args)
        flops_fn, formula = flops_fn_for(cfg)
    except ConfigError as exc:
        where = str(run_file) if run_file else f"{log} (arguments dump)"
        raise ConfigError(exc.message, file=where, hint=exc.hint) from None
    return job_metrics(summary, flops_fn, peak, n_gpus, seq_length=cfg.seq_length,
                       default_global_batch_size=cfg.global_batch_size, flops_formula=formula,
                       warmup_iters=warmup_iters, series=series)


def _emit_model_json(log: Path, attempt: int | None, source: str | None, peak_src: str,
                     summary: Any, m: JobMetrics, series: bool, peak: float,
                     peak_fp8: float | None) -> None:

    doc = _json_doc(log, attempt, source, peak_src, summary, m, series)
    if peak_fp8 and m.mfu is not None:
        scale = peak / peak_fp8
        doc["mfu_fp8"] = {"median": m.mfu.median * scale, "p10": m.mfu.p10 * scale,
                          "p90": m.mfu.p90 * scale}
        doc["peak_fp8_tflops"] = peak_fp8
    doc["implausible"] = list(_implausible(m))
    emit_json(doc)


def _model_text(log: Path, summary: Any, m: JobMetrics, source: str | None, peak_src: str,
                n_gpus: int, peak: float, peak_fp8: float | None) -> str:
    text = _text(log, summary, m, source, peak_src, n_gpus)
    if peak_fp8 and m.mfu is not None:
        text += (f"\nFP8 run: MFU {m.mfu.median * peak / peak_fp8 * 100:.2f} % of the FP8 dense "
                 f"peak {peak_fp8:g} TFLOP/s (the MFU above is against BF16, the usual "
                 "convention)")
    flags = _implausible(m)
    if flags:
        text += (f"\nIMPLAUSIBLE: {', '.join(flags)}: the FLOPs, the GPU count or the peak "
                 "cannot be right for this log (check --gpus, --peak-tflops, the model)")
    return text


def _implausible(m: JobMetrics) -> tuple[str, ...]:

    mfu = m.mfu
    return plausible.reasons({"mfu": mfu.median if mfu else None,
                              "goodput": m.goodput,
                              "iter_ms": m.iter_time_ms.median if m.iter_time_ms else None})


def _json_doc(log: Path, attempt: int | None, source: str | None, peak_src: str, summary: Any,
              m: JobMetrics, series: bool) -> dict[str, Any]:
    out = {"log": str(log), "attempt": attempt, "model_source": source,
           "peak_source": peak_src,
           "log_summary": {"n_bytes": summary.n_bytes, "n_rejected": summary.n_rejected,
                           "n_duplicates": summary.n_duplicates}}
    doc = out | m.to_json(series=series)
    if source is None:  # no FLOPs model: nothing of slurmpod's own FLOPs to show
        doc["flops_formula"] = None
    return doc


def _text(log: Path, summary: Any, m: JobMetrics, source: str | None, peak_src: str,
          n_gpus: int | None) -> str:

    of = f" of {m.train_iters}" if m.train_iters is not None else ""
    lines = [
        f"log            {log} ({m.n_records} iteration records, iterations "
        f"{m.first_iteration}..{m.last_iteration}{of}, "
        f"{summary.n_rejected} malformed lines skipped)",
    ]
    if source is None:
        lines += [
            "model          unknown: the log has no arguments dump (give --run RUN.toml for "
            "slurmpod's FLOPs and MFU)",
            f"GPUs           {n_gpus if n_gpus is not None else 'unknown (--gpus N)'}",
        ]
    else:
        lines += [
            f"model          from {source}",
            f"GPUs           {m.n_gpus}; peak {m.peak_tflops:g} TFLOP/s per GPU, dense BF16 "
            f"({peak_src})",
            f"FLOPs model    {m.flops_formula}: {_fmt(m.flops_per_iteration, '.4g')} per "
            f"iteration (sequence length {m.seq_length})",
        ]
    lines += [
        "",
        f"steady state: {m.iter_time_ms.n if m.iter_time_ms else 0} of {m.n_records} records "
        f"(warm-up: first {m.warmup_iters} iterations of each launch"
        f"{'; too few records, all used' if m.steady_fallback else ''})",
    ]

    def row(name: str, st: Stats | None, spec: str, scale: float = 1.0) -> list[str]:
        if st is None:
            return [name, "-", "-", "-"]
        if spec == "tflops":  # 0.1 resolution for real GPUs, 3 digits for the sandbox's
            spec = ".1f" if st.median >= 10 else ".3g"
        return [name, *(_fmt(v * scale, spec) for v in (st.median, st.p10, st.p90))]

    rows = [row("iteration time (ms)", m.iter_time_ms, ".1f")]
    if m.tokens_per_s is not None or source is not None:
        rows.append(row("tokens/s", m.tokens_per_s, ",.0f"))
    if source is not None:
        rows += [row("model TFLOP/s per GPU", m.tflops_per_gpu, "tflops"),
                 row("MFU (%)", m.mfu, ".2f", 100.0)]
    if m.tflops_reported is not None:
        rows.append(row("log's own TFLOP/s/GPU", m.tflops_reported, "tflops"))
    if m.power_w is not None:
        rows.append(row("power per GPU (W)", m.power_w, ".1f"))
    if m.energy_j is not None:
        rows.append(row("energy per GPU (J/iter)", m.energy_j, ".1f"))
    lines.append(table(["metric", "median", "p10", "p90"], rows))
    if m.reported_ratio is not None:
        lines.append(f"slurmpod ÷ log-reported TFLOP/s: {m.reported_ratio:.3f} (slurmpod counts "
                     f"with {m.flops_formula}, Megatron with its own release's formula; see "
                     "docs/accounting.md, Formula versions)")
    lines.append("")
    ttfi = m.time_to_first_iteration_s
    lines.append(f"time to first iteration  {_fmt(ttfi, '.1f')} s"
                 + (f" (from {m.time_to_first_iteration_ref.replace('_', ' ')})"
                    if m.time_to_first_iteration_ref else ""))
    lines.append(f"checkpoint saves         {len(m.checkpoint_stalls)} timed, "
                 f"{m.checkpoint_stall_s:.1f} s in total")
    lines.append(f"restarts                 {m.restarts}; work lost {m.lost_iters} iterations "
                 f"({m.lost_s:.1f} s)")
    if m.goodput is not None and source is not None:
        lines.append(f"goodput                  {m.goodput * 100:.1f} % (productive "
                     f"{m.productive_s:.1f} s of {_fmt(m.wall_s, '.1f')} s in the log, "
                     f"× {m.n_gpus} GPUs)")
    if m.memory is not None:  # Megatron's memory report (accounting/memreport.py)
        from slurmpod.model.memory import RecordedMemory  # lazy: start-up
        from slurmpod.report.memory import peaks_text, retries_text  # lazy: start-up

        got = RecordedMemory.from_record(m.memory, None)
        if got is not None:
            lines.append("GPU memory               "
                         + peaks_text(got.rank, got.max_allocated_gib, got.max_reserved_gib,
                                      got.device_used_gib)
                         + retries_text(got.alloc_retries) + f" ({got.ranks} rank(s) reported)")
    return "\n".join(lines)
