"""What the HTML job report shows beyond `JobReport`: the run's name and parallel layout, the
job script's record of how each attempt ended, GPU telemetry, and the typical MFU band.

`job_extras` is the I/O edge (it reads the head of the job's log and the attempt record through
the same safe readers as the report's notes); `extras_from` and the helpers are pure. Everything
here is shown, never computed with: the job wrote the log and the attempt record, so their
values only appear as text or as words from fixed sets (`slurmpod.runs.attempts.ENDS`).
"""

from __future__ import annotations

import io
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from slurmpod.accounting.safeio import UnsafeFileError, read_job_file
from slurmpod.telemetry.schema import clean_record_part

# Megatron-LM argument names (the `--- arguments ---` dump, core_v0.12+) shown as the layout, in
# this order, with the label the report uses.
LAYOUT_ARGS = (
    ("tensor_model_parallel_size", "TP"), ("pipeline_model_parallel_size", "PP"),
    ("virtual_pipeline_model_parallel_size", "VPP"), ("context_parallel_size", "CP"),
    ("expert_model_parallel_size", "EP"), ("expert_tensor_parallel_size", "ETP"),
    ("data_parallel_size", "DP"),
)
MODEL_ARGS = (
    ("num_layers", "layers"), ("hidden_size", "hidden size"),
    ("num_attention_heads", "attention heads"), ("num_query_groups", "query groups"),
    ("ffn_hidden_size", "FFN hidden size"), ("num_experts", "experts"),
    ("moe_router_topk", "experts per token"), ("seq_length", "sequence length"),
    ("global_batch_size", "global batch"), ("micro_batch_size", "micro batch"),
    ("recompute_granularity", "recompute"),
)
LOG_HEAD_BYTES = 4 << 20
MAX_TEXT = 80  # a job-written value longer than this is cut (it is only ever shown)


@dataclass(frozen=True)
class Telemetry:
    """GPU time series per node for the heatmaps.

    `t`: seconds since the job's first sample; `util`/`power`: one row per entry of `rows`
    (a node, or node:GPU), one value per `t` (None: not measured); power is per GPU."""

    rows: tuple[str, ...] = ()
    t: tuple[float, ...] = ()
    util: tuple[tuple[float | None, ...], ...] = ()  # %
    power: tuple[tuple[float | None, ...], ...] = ()  # W
    source: str = ""


@dataclass(frozen=True)
class JobExtras:
    run: str | None = None  # the run spec's name (slurmpod's submit Comment)
    layout: tuple[tuple[str, str], ...] = ()  # (label, value)
    model: tuple[tuple[str, str], ...] = ()
    precision: str | None = None
    script_attempts: tuple[Any, ...] = ()  # slurmpod.runs.attempts.Attempt
    telemetry: Telemetry | None = None
    typical: tuple[float, float, str] | None = None  # MFU band lo, hi, what it is
    notes: tuple[str, ...] = field(default_factory=tuple)


def _text(v: Any) -> str:
    s = str(v)
    return s if len(s) <= MAX_TEXT else s[:MAX_TEXT - 1] + "…"


def _table(v: Any) -> Mapping[str, Any]:
    """A record's sub-table, or an empty one when absent or not a table."""
    return v if isinstance(v, Mapping) else {}


def _num(v: Any) -> float | None:
    if v is None or isinstance(v, bool):
        return None
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return f if math.isfinite(f) else None


def layout_of(args: Mapping[str, Any] | None, gpus: int = 0) -> tuple[
        tuple[tuple[str, str], ...], tuple[tuple[str, str], ...], str | None]:
    """(layout, model, precision) rows from Megatron's argument dump; DP is derived from the
    job's GPUs when Megatron did not print it (it prints `data_parallel_size` since 2020)."""
    if not args:
        return (), (), None
    lay: list[tuple[str, str]] = []
    for key, label in LAYOUT_ARGS:
        v = args.get(key)
        if v is None and key == "data_parallel_size" and gpus:
            tp, pp, cp = (_num(args.get(k)) or 1 for k in (
                "tensor_model_parallel_size", "pipeline_model_parallel_size",
                "context_parallel_size"))
            if tp * pp * cp and gpus % int(tp * pp * cp) == 0:
                v = gpus // int(tp * pp * cp)
        if v is None or (label in ("VPP", "CP", "EP", "ETP") and _num(v) in (None, 1)):
            continue
        lay.append((label, _text(v)))
    model = tuple((label, f"{int(v):,}" if isinstance(v, int) and not isinstance(v, bool)
                   else _text(v)) for key, label in MODEL_ARGS
                  if (v := args.get(key)) is not None)
    from slurmpod.megatron.runspec import fp8_format  # lazy: start-up

    fp8 = fp8_format(args)
    prec = ("FP8 (" + _text(fp8) + ")" if fp8
            else "BF16" if args.get("bf16") else "FP16" if args.get("fp16") else None)
    return tuple(lay), model, prec


def telemetry_of(doc: Any, summary: Any = None) -> Telemetry | None:
    """The heatmap rows of a spool record's `gpu` part (`slurmpod.telemetry.schema`: checked by
    `clean_record_part`, so a value out of range is None, never drawn). Per-GPU keys
    (`node:index`) are averaged per node; a one-node job keeps one row per GPU."""

    part = clean_record_part(doc)
    series = (part or {}).get("series")
    if not series:
        return None
    keys = [str(k) for k in series["keys"]]
    t = [float(x) for x in series["t"]]
    nodes = list(dict.fromkeys(k.split(":", 1)[0] for k in keys))
    by_node = len(nodes) > 1 and len(nodes) < len(keys)
    rows = nodes if by_node else keys

    def grouped(name: str) -> tuple[tuple[float | None, ...], ...]:
        data = series.get(name) or []
        out = []
        for row in rows:
            members = [data[i] for i, k in enumerate(keys) if i < len(data)
                       and (k.split(":", 1)[0] == row if by_node else k == row)]
            col = []
            for j in range(len(t)):
                got = [m[j] for m in members if m[j] is not None]
                col.append(sum(got) / len(got) if got else None)
            out.append(tuple(col))
        return tuple(out)

    src = _table(summary).get("src")
    return Telemetry(tuple(_text(r) for r in rows), tuple(x - t[0] for x in t),
                     grouped("util"), grouped("power_w"),
                     SOURCE_TEXT.get(src, "") if isinstance(src, str) else "")


SOURCE_TEXT = {"dcgm": "DCGM job statistics", "prometheus": "the DCGM exporter (Prometheus)",
               "sacct": "Slurm's accounting", "nvidia-smi": "nvidia-smi, sampled in the job"}


def typical_band(rows: Iterable[Any], size_class: str | None) -> tuple[float, float] | None:
    """GPU-hour-weighted 25th-75th percentile MFU of the fleet's jobs of this size class
    (`fleet.JobRow`s; implausible ones left out); None below 5 jobs."""
    pairs = sorted((r.mfu, r.gpu_hours) for r in rows
                   if r.mfu is not None and not r.implausible and r.gpu_hours > 0
                   and (size_class is None or r.size_class == size_class))
    if len(pairs) < 5:
        return None
    total = sum(w for _, w in pairs)
    out = []
    for q in (0.25, 0.75):
        acc = 0.0
        for v, w in pairs:
            acc += w
            if acc >= q * total:
                out.append(v)
                break
    return (out[0], out[1]) if len(out) == 2 else None


def extras_from(record: Mapping[str, Any] | None, *, log_head: bytes = b"",
                script_attempts: Sequence[Any] = (), gpus: int = 0,
                typical: tuple[float, float, str] | None = None) -> JobExtras:
    """Pure: the extras of a job from its spool record and the head of its log."""
    rec = _table(record)
    comment = _table(rec.get("comment"))
    run = comment.get("run") if isinstance(comment.get("run"), str) else None
    args = None
    if log_head:
        from slurmpod.accounting.logparse import parse_log  # lazy: start-up

        try:
            args = parse_log(io.BytesIO(log_head)).args
        except (ValueError, OverflowError):
            args = None
    lay, model, prec = layout_of(args, gpus)
    return JobExtras(run=_text(run) if run else None, layout=lay, model=model, precision=prec,
                     script_attempts=tuple(script_attempts),
                     telemetry=telemetry_of(rec.get("gpu"), (rec.get("summary") or {}).get("gpu")),
                     typical=typical)


def job_extras(record: Mapping[str, Any] | None, *, gpus: int = 0,
               typical: tuple[float, float, str] | None = None) -> JobExtras:
    """The extras of a job, reading its log's head and attempt record when this user may (the
    epilog's safe reader: no symlink, FIFO, device or other user's file; bounded)."""
    from slurmpod.runs.local import attempts_of_log  # lazy: start-up

    rec = _table(record)
    log = _table(rec.get("log"))
    job = _table(rec.get("job"))
    path, uid = str(log.get("path") or ""), job.get("uid")
    head = b""
    atts: Sequence[Any] = ()
    if path and not log.get("refused") and isinstance(uid, int):
        try:
            head = read_job_file(path, uid, head_bytes=LOG_HEAD_BYTES, tail_bytes=0).head
        except (UnsafeFileError, OSError):
            head = b""
        atts = attempts_of_log(path) or ()
    return extras_from(rec, log_head=head, script_attempts=atts, gpus=gpus, typical=typical)


def page_extras(r: Any, record: Mapping[str, Any] | None, fleet: Any = None) -> JobExtras:
    """The extras of a job report `r` (`JobReport`); with a fleet report (`--typical-since`),
    the MFU band is the middle half of that fleet's jobs of the same model-size class."""
    from slurmpod.report.rules import size_class  # lazy: start-up

    typical = None
    if fleet is not None:
        cls = size_class(r.params_b)
        band = typical_band(fleet.rows, cls)
        if band is not None:
            what = f"{cls} models" if cls else "jobs"
            typical = (band[0], band[1],
                       f"middle half of this fleet's {what} since {fleet.window}")
    return job_extras(record, gpus=r.gpus, typical=typical)
