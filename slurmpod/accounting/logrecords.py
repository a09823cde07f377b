"""Records of a parsed Megatron log (what `logparse` produces) and the small pure helpers that
read single values: timestamps, and the typed values of the `arguments` dump.

Times are "log clock" seconds: Megatron prints the node's local wall-clock time without a zone,
read here as if it were UTC (see `logparse`).
"""

from __future__ import annotations

import ast
import datetime as _dt
import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

_FLOAT = re.compile(r"^[+-]?(\d+\.\d*|\.\d+|\d+)([eE][+-]?\d+)?$|^[+-]?(inf|nan)$")
_INT = re.compile(r"^[+-]?\d+$")


def epoch_to_log_clock(epoch_s: float, utc_offset_s: float) -> float:
    """Slurm epoch seconds -> the log clock of a node whose local time is UTC+utc_offset_s."""
    return epoch_s + utc_offset_s




@dataclass(frozen=True, slots=True)
class IterationRecord:
    """One iteration line. Unknown numbers are None (ints) or NaN (floats)."""

    iteration: int
    train_iters: int
    elapsed_ms: float
    time_s: float  # log clock; NaN before 2024 releases (no timestamp)
    consumed_samples: int | None
    global_batch_size: int | None
    tflops_reported: float  # Megatron's own TFLOP/s/GPU (--log-throughput); NaN if absent
    lm_loss: float
    loss_scale: float
    grad_norm: float
    skipped_iters: int | None
    nan_iters: int | None
    segment: int
    offset: int  # byte offset of the line in the stream
    energy_j: float = float("nan")  # Megatron's `energy per GPU (J/iter/GPU)` (--log-energy)
    power_w: float = float("nan")  # Megatron's `power per GPU (W/GPU)` (--log-energy)


@dataclass(frozen=True)
class IterationTable:
    """All iteration records as parallel numpy arrays (ints: -1 = unknown; floats: NaN)."""

    iteration: np.ndarray
    train_iters: np.ndarray
    consumed_samples: np.ndarray
    global_batch_size: np.ndarray
    skipped_iters: np.ndarray
    nan_iters: np.ndarray
    segment: np.ndarray
    offset: np.ndarray
    elapsed_ms: np.ndarray
    time_s: np.ndarray
    tflops_reported: np.ndarray
    lm_loss: np.ndarray
    loss_scale: np.ndarray
    grad_norm: np.ndarray
    energy_j: np.ndarray  # J per iteration per GPU as the log printed it (2025 on, --log-energy)
    power_w: np.ndarray  # W per GPU as the log printed it

    def __len__(self) -> int:
        return int(self.iteration.shape[0])

    def record(self, i: int) -> IterationRecord:
        def opt(col: np.ndarray) -> int | None:
            v = int(col[i])
            return None if v < 0 else v

        return IterationRecord(
            iteration=int(self.iteration[i]), train_iters=int(self.train_iters[i]),
            elapsed_ms=float(self.elapsed_ms[i]), time_s=float(self.time_s[i]),
            consumed_samples=opt(self.consumed_samples),
            global_batch_size=opt(self.global_batch_size),
            tflops_reported=float(self.tflops_reported[i]), lm_loss=float(self.lm_loss[i]),
            loss_scale=float(self.loss_scale[i]), grad_norm=float(self.grad_norm[i]),
            skipped_iters=opt(self.skipped_iters), nan_iters=opt(self.nan_iters),
            segment=int(self.segment[i]), offset=int(self.offset[i]),
            energy_j=float(self.energy_j[i]), power_w=float(self.power_w[i]))

    def __iter__(self) -> Iterator[IterationRecord]:
        return (self.record(i) for i in range(len(self)))


@dataclass(frozen=True, slots=True)
class Segment:
    """One launch of Megatron within the log (the first, or a restart)."""

    index: int
    offset: int
    cause: str  # "start" | "arguments" (a dump) | "restart" (init marker) | "iteration-reset"
    start_seen: bool  # the launch itself is in the log (dump, markers, or a restart)
    args: Mapping[str, Any] | None
    launch_time_s: float | None  # process start: "after megatron is initialized" − init time
    train_start_time_s: float | None  # "[before the start of training step] datetime"
    first_time_s: float | None
    last_time_s: float | None
    loaded_iteration: int | None  # checkpoint this launch resumed from
    first_iteration: int | None
    last_iteration: int | None
    n_records: int
    exit_marker: str | None  # "after training is done", "exiting program ...", or None


@dataclass(frozen=True, slots=True)
class CheckpointSave:
    iteration: int
    segment: int
    offset: int
    start_time_s: float | None  # timestamped save lines (2026 releases) only
    end_time_s: float | None
    timer_s: float | None  # `save-checkpoint` timer, max over ranks
    succeeded: bool


@dataclass(frozen=True, slots=True)
class ProgressEntry:
    """A `progress.txt` line (megatron/training/training.py `append_to_progress_log`)."""

    time_s: float
    job_id: str
    n_gpus: int
    event: str  # "Starting job", "Saved checkpoint", "Saving async checkpoint", ...
    iteration: int | None
    job_tflops: float | None
    cumulative_tflops: float | None
    flops: float | None
    tokens_billions: float | None


@dataclass(frozen=True)
class LogSummary:
    iterations: IterationTable
    segments: tuple[Segment, ...]
    checkpoints: tuple[CheckpointSave, ...]
    progress: tuple[ProgressEntry, ...]
    n_bytes: int
    n_rejected: int  # iteration-like lines that did not parse completely
    n_duplicates: int  # iteration lines repeated verbatim (dropped)
    first_time_s: float | None
    last_time_s: float | None
    complete: bool  # close() was called: the whole input is in

    @property
    def args(self) -> Mapping[str, Any] | None:
        """The arguments of the latest launch that printed them."""
        for seg in reversed(self.segments):
            if seg.args is not None:
                return seg.args
        return None

    @property
    def restarts(self) -> int:
        return max(0, len(self.segments) - 1)

    def to_json(self) -> dict[str, Any]:
        """Counts and events (not the iteration series: see metrics.JobMetrics.to_json)."""
        return {
            "n_bytes": self.n_bytes, "n_records": len(self.iterations),
            "n_rejected": self.n_rejected, "n_duplicates": self.n_duplicates,
            "first_time_s": self.first_time_s, "last_time_s": self.last_time_s,
            "segments": [{k: getattr(s, k) for k in Segment.__slots__ if k != "args"}
                         | {"has_args": s.args is not None} for s in self.segments],
            "checkpoints": [{k: getattr(c, k) for k in CheckpointSave.__slots__}
                            for c in self.checkpoints],
            "progress": [{k: getattr(p, k) for k in ProgressEntry.__slots__}
                         for p in self.progress],
        }



_TS_SHAPE = re.compile(rb"\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d(?:\.\d{1,9})?")
_EPOCH = _dt.date(1970, 1, 1)
_minute_cache: dict[bytes, float] = {}


def minute_base(minute: bytes) -> float | None:
    """`2024-04-06 03:02` (shape already checked) -> log-clock seconds of that minute; None if
    not a real date/time. Cached: consecutive lines share the minute."""
    base = _minute_cache.get(minute)
    if base is None:
        try:
            d = _dt.date(int(minute[0:4]), int(minute[5:7]), int(minute[8:10]))
        except ValueError:
            return None
        h, mi = int(minute[11:13]), int(minute[14:16])
        if h > 23 or mi > 59:
            return None
        base = float((d - _EPOCH).days * 86400 + h * 3600 + mi * 60)
        if len(_minute_cache) > 4096:
            _minute_cache.clear()
        _minute_cache[minute] = base
    return base


def parse_timestamp(ts: bytes) -> float | None:
    """`2024-04-06 03:02:12[.ffffff]` -> log-clock seconds; None if not a real date/time."""
    if _TS_SHAPE.fullmatch(ts) is None:
        return None
    base = minute_base(ts[:16])
    if base is None:
        return None
    s = int(ts[17:19])
    if s > 60:  # 60: a leap second
        return None
    return base + s + (float(ts[19:]) if len(ts) > 19 else 0.0)


def typed_value(raw: str) -> Any:
    """A value as `_print_args` printed it (str() of the Python value) -> that value, where it
    is a literal; anything else (`torch.bfloat16`, paths) stays a string."""
    if raw == "None":
        return None
    if raw in ("True", "False"):
        return raw == "True"
    if _INT.match(raw):
        return int(raw)
    if _FLOAT.match(raw):
        return float(raw)
    if len(raw) <= 4096 and raw[:1] in "[({" and raw[-1:] in "])}":
        try:
            val = ast.literal_eval(raw)
        except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
            return raw
        return list(val) if isinstance(val, tuple) else val
    return raw


_DUMP_LINE = re.compile(r"^\s*([A-Za-z_][A-Za-z0-9_]*) (?:\.+ | )(.*?)\s*$")


def parse_dump_lines(lines: Iterable[str]) -> dict[str, Any]:
    """Fallback dump parser over the lines *between* the banners. Megatron pads names with
    `48 - len(name)` dots, so names of 48+ characters have no dots at all (`  name  value`)."""
    out: dict[str, Any] = {}
    for line in lines:
        m = _DUMP_LINE.match(line)
        if m:
            out[m.group(1)] = typed_value(m.group(2))
    return out


def arguments_from_dump(lines: list[str]) -> dict[str, Any]:
    try:
        from slurmpod.megatron.args import parse_arguments_dump
    except ImportError:
        return parse_dump_lines(lines)
    try:
        out = parse_arguments_dump(lines)
    except Exception:  # a value the planner's reader rejects must not lose the whole dump
        return parse_dump_lines(lines)
    # Names of 48+ characters are printed without dots; keep them too.
    for k, v in parse_dump_lines(lines).items():
        out.setdefault(k, v)
    return out
