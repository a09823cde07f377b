"""Streaming parser for Megatron-LM job logs (a job's stdout/stderr file, or a `progress.txt`).

Public API (used by `slurmpod mfu` and by the accounting hooks):

- `parse_log(source) -> LogSummary`: `source` is a binary file object (read in 1 MiB chunks) or
  any iterable of lines (`bytes` or `str`, trailing newline optional).
- `LogParser`: the incremental form, for tailing a growing file. `feed(chunk)` takes whatever
  bytes arrived (a line may be split across chunks); `summary()` is a consistent snapshot at any
  time (the unfinished last line is left out); `close()` at end of file parses that last line too.
- `LogSummary` (defined in `logrecords`, re-exported here): iteration records (columnar numpy
  arrays, `IterationTable`), restarts (`Segment`), checkpoint saves (`CheckpointSave`),
  `progress.txt` entries (`ProgressEntry`) and the recovered `arguments` dump of each launch.

What is understood, by Megatron-LM release:
- iteration lines `[ts] iteration I/ N | key: value | ... |`. No timestamp before 2024-01;
  `[%Y-%m-%d %H:%M:%S]` from 2024-01 (core 0.5/0.6); `.%f` microseconds from 2026-01. Throughput
  (`throughput per GPU (TFLOP/s/GPU)`) only with `--log-throughput` (2023-11 on); Megatron-
  DeepSpeed's `TFLOPs:` is read as the same self-reported figure. Unknown fields are skipped.
- the start-up dump between `--- arguments ---` and `--- end of arguments ---` (values typed:
  int/float/bool/None/list; strings otherwise), read by `slurmpod.megatron.args.
  parse_arguments_dump`, the one reader of the dump.
- `[label] datetime: ts` markers, `time to initialize megatron (seconds): X`, checkpoint lines
  (`saving checkpoint at iteration N`, `successfully saved checkpoint at/from iteration N`,
  `successfully loaded checkpoint ... at iteration N`, timestamped or not), the timer line
  `save-checkpoint ....: (min, max)`, `progress.txt` lines (tab-separated, `Job ID:`), and
  the timer blocks of `--timing-log-level 1|2` in each `--timing-log-option` shape, averaged
  per rank into `LogSummary.rank_timers` (`timerblocks`), and the memory reports
  `[Rank R] (...) memory (MB) | allocated: ...`, per-rank maxima in `LogSummary.memory`
  (`memreport`).
- restarts within one log (requeue with `--open-mode=append`, an auto-resume loop): a second
  arguments dump, or an iteration number that does not increase, opens a new `Segment`.
- `srun --label` rank prefixes (`0: `) and other text before a line's payload.

Also Megatron-DeepSpeed's `elapsed time per iteration (s)`, `--log-energy` fields, NeMo 2.x /
Megatron-Bridge `Training epoch E, iteration I/N | key: value ...` and NeMo 1.x Lightning bars
(`key=value` postfix), launcher prefixes, ECMA-48 escapes, and `\r` as a line end.

Speed: Megatron lines of a layout already seen (`_Layout`) are read in bulk: the layout's
regex runs once per line *shape* (the line with every digit a `0`), and numpy reads the numbers
of all lines of a shape at once (`_Plan`, exact like int()/float()); everything else is found
with `bytes.find` of a few marker words and read line by line (the careful path, which the bulk
reader matches exactly). Memory: one unfinished line (capped at `MAX_LINE_BYTES`), one chunk's
working set, the record columns packed losslessly (`logrecords.ColumnBuilder`: blocks of one
repeated value cost nothing, counters, offsets and printed decimals 1-2 bytes each), and a small
record per checkpoint/restart.

Garbage: lines that do not parse completely are counted (`n_rejected`) and dropped, never
guessed at. An iteration line must end with `|` and every field slurmpod reads must convert;
when two lines are glued together (no newline between them), the last iteration header on the
line is used.

Times: Megatron prints the node's local wall-clock time without a zone. Times here are "log
clock" seconds: that wall-clock read as if it were UTC. Differences are exact; to compare with
Slurm's epoch times, add the node's UTC offset to the epoch value (`epoch_to_log_clock`).
"""

from __future__ import annotations

import contextlib
import ctypes
import re
from bisect import bisect_right
from collections.abc import Collection, Iterable
from itertools import pairwise
from typing import IO, Any

import numpy as np

from slurmpod.accounting.logrecords import (
    COLUMNS,
    CheckpointSave,
    ColumnBuilder,
    IterationRecord,
    IterationTable,
    LogSummary,
    ProgressEntry,
    Segment,
    epoch_to_log_clock,
    minute_base,
    parse_timestamp,
)
from slurmpod.accounting.memreport import MARKER as MEMORY_MARKER
from slurmpod.accounting.memreport import MemoryReports
from slurmpod.accounting.timerblocks import MARKER as TIMER_MARKER
from slurmpod.accounting.timerblocks import TimerBlocks, header_option
from slurmpod.megatron.args import parse_arguments_dump

MAX_LINE_BYTES = 256 * 1024
MAX_ARGS_LINES = 5000
MAX_SEGMENTS = 1000
MAX_EVENTS = 100_000
MAX_LAYOUTS = 8
CHUNK_BYTES = 1 << 20

# Marker words; a line is looked at only if it contains one. Iteration lines by their required
# field (every Megatron-LM and Megatron-DeepSpeed release prints `elapsed time per iteration (`,
# in ms or, in older releases and Megatron-DeepSpeed, in s), NeMo's by `train_step_timing in s`,
# a tab for progress.txt lines (memchr-fast; Megatron's own output has no tabs).
_MARK_ITER = b"elapsed time per iteration ("
_MARK_NEMO = b"train_step_timing in s"
_MARKERS = (_MARK_ITER, _MARK_NEMO, b" arguments ---", b"] datetime: ", b" checkpoint ", b"\t",
            TIMER_MARKER, MEMORY_MARKER)

_ITER_HDR = re.compile(rb"iteration\s+(\d{1,12})\s*/\s*(\d{1,12})\s*\|")
_TS_RE = rb"(\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d(?:\.\d{1,9})?)"
_TS_BRACKET = re.compile(rb"\[" + _TS_RE + rb"\]")
_DATETIME = re.compile(rb"\[([^\]\[]{1,200})\] datetime: " + _TS_RE)
_INIT_S = re.compile(rb"time to initialize megatron \(seconds\): (\d{1,9}(?:\.\d{1,9})?)")
_SAVE_START = re.compile(rb"saving checkpoint at iteration\s+(\d{1,12}) to ")
_SAVE_DONE = re.compile(rb"successfully saved checkpoint (?:at|from) iteration\s+(\d{1,12})")
_LOADED = re.compile(rb"(?:successfully )?loaded checkpoint from .* at iteration\s+(\d{1,12})\s*$")
_TIMER = re.compile(rb"save-checkpoint(-non-persistent)?\s*\.*\s*:\s*"
                    rb"(?:\(\s*([0-9.]+)\s*,\s*([0-9.]+)\s*\)|([0-9.]+))\s*$")
_VOCAB = re.compile(rb"> padded vocab \(size: (\d{1,12})\) with \d{1,12} dummy tokens "
                    rb"\(new size: (\d{1,12})\)")
_BANNER = re.compile(rb"-{3,} (end of )?arguments -{3,}")
# Launcher prefixes before a dump line: `srun --label` (`15: `), torchrun `--tee 3`
# (`[default3]:`), and torch >= 2.2's rank prefix on top of it (`[default0]:[rank0]:`).
_LABEL = re.compile(rb"^\s*(?:\d{1,6}:\s)?(?:\[default\d{1,6}\]:)?(?:\[rank\d{1,6}\]:)?")
_PROGRESS = re.compile(rb"(?:^|\s)" + _TS_RE
                       + rb"\tJob ID: ([^\t]*)\t# GPUs: (\d{1,9})\t([^\t]+)(.*)$")
# ECMA-48 escapes (colour, cursor) that some launchers and loggers wrap lines in.
_ANSI = re.compile(rb"\x1b(?:\[[0-?]*[ -/]*[@-~]|[@-Z\\-_]|$)")
# NeMo 2.x / Megatron-Bridge progress line (MegatronProgressBar): the step index is 0-based.
_NEMO2 = re.compile(rb"Training epoch (\d{1,9}), iteration (\d{1,12})/(\d{1,12}) ?\|")
# NeMo 1.x: PyTorch Lightning's tqdm bar, postfix `[elapsed<left, rate, key=value, ...]`.
_NEMO1 = re.compile(rb"Epoch (\d{1,9})(?:: :|:) *\d{1,3}%\|[^|\n]*\| *(\d{1,12})/(?:\d{1,12}|\?) "
                    rb"\[([^\[\]]*)\][ \t]*$")
_RATE = re.compile(rb"^\s*(?:[0-9.]+|\?)\s*(?:s/it|it/s)\s*$")

# Iteration-line field -> (column, kind, scale). Keys as the releases print them (training_log).
_F, _I = "f", "i"
_FIELDS: dict[bytes, tuple[str, str, float]] = {
    b"consumed samples": ("consumed_samples", _I, 1.0),
    b"elapsed time per iteration (ms)": ("elapsed_ms", _F, 1.0),
    # Megatron-LM before 2021 and Megatron-DeepSpeed (BLOOM, ALCF, the JUBE GPT-3 benchmark)
    b"elapsed time per iteration (s)": ("elapsed_ms", _F, 1000.0),
    b"throughput per GPU (TFLOP/s/GPU)": ("tflops_reported", _F, 1.0),
    b"TFLOPs": ("tflops_reported", _F, 1.0),  # Megatron-DeepSpeed
    b"global batch size": ("global_batch_size", _I, 1.0),
    b"lm loss": ("lm_loss", _F, 1.0),
    b"loss scale": ("loss_scale", _F, 1.0),
    b"grad norm": ("grad_norm", _F, 1.0),
    b"number of skipped iterations": ("skipped_iters", _I, 1.0),
    b"number of nan iterations": ("nan_iters", _I, 1.0),
    # --log-energy (Megatron-LM 2025 on, Megatron-Bridge): per GPU, averaged over the interval.
    b"energy per GPU (J/iter/GPU)": ("energy_j", _F, 1.0),
    b"energy per GPU (J/iter)": ("energy_j", _F, 1.0),
    b"power per GPU (W/GPU)": ("power_w", _F, 1.0),
    b"power per GPU (W)": ("power_w", _F, 1.0),
}
# NeMo's logged metrics (`key=value` in 1.x, `key: value` in 2.x).
_NEMO_FIELDS: dict[bytes, tuple[str, str, float]] = {
    b"train_step_timing in s": ("elapsed_ms", _F, 1000.0),
    b"global_step": ("global_step", _I, 1.0),
    b"consumed_samples": ("consumed_samples", _I, 1.0),
    b"global_batch_size": ("global_batch_size", _I, 1.0),
    b"reduced_train_loss": ("lm_loss", _F, 1.0),
    b"TFLOPS_per_GPU": ("tflops_reported", _F, 1.0),
}
_FLOAT_COLS = ("elapsed_ms", "time_s", "tflops_reported", "lm_loss", "loss_scale", "grad_norm",
               "energy_j", "power_w")
_INT_COLS = ("iteration", "train_iters", "consumed_samples", "global_batch_size", "skipped_iters",
             "nan_iters", "segment", "offset")
_NAN = float("nan")
_ROW_KEYS = ("consumed_samples", "elapsed_ms", "tflops_reported", "global_batch_size", "lm_loss",
             "loss_scale", "grad_norm", "skipped_iters", "nan_iters", "energy_j", "power_w")
_ROW_INT = frozenset({"consumed_samples", "global_batch_size", "skipped_iters", "nan_iters"})
# One record's _ROW_KEYS values, in that order (the middle arguments of `LogParser._accept`).
_Row = tuple[int, float, float, int, float, float, float, int, int, float, float]
_INT64_MAX = (1 << 63) - 1


def _generic_fields(fields: bytes) -> tuple[_Row, tuple[bytes, ...]]:
    """Any layout: `key: value |` fields in any order; raises ValueError on a bad value.
    Returns the row (_ROW_KEYS) and the keys in line order (the layout)."""
    vals: dict[str, Any] = {}
    keys: list[bytes] = []
    for part in fields.split(b"|")[:-1]:
        key, sep, raw = part.partition(b":")
        if not sep:
            raise ValueError("a field without `key:`")  # Megatron prints none
        key = key.strip()
        keys.append(key)
        spec = _FIELDS.get(key)
        if spec is not None:
            if spec[1] == _F:
                vals[spec[0]] = float(raw) * spec[2]
            else:
                v = int(raw)
                if not 0 <= v <= _INT64_MAX:
                    raise ValueError("out of range")
                vals[spec[0]] = v
    if "elapsed_ms" not in vals:
        raise ValueError("no elapsed time")
    return tuple(vals.get(k, -1 if k in _ROW_INT else _NAN) for k in _ROW_KEYS), tuple(keys)


def _nemo_fields(items: list[bytes], sep: bytes) -> dict[str, Any]:
    """NeMo's `key=value` / `key: value` items; raises ValueError on a bad value."""
    vals: dict[str, Any] = {}
    for item in items:
        key, s, raw = item.partition(sep)
        if not s:
            raise ValueError("an item without a key")
        spec = _NEMO_FIELDS.get(key.strip())
        if spec is None:
            continue
        x = float(raw)
        if spec[1] == _I:  # Lightning logs steps and samples as floats: `global_step=119.0`
            if not (x.is_integer() and 0 <= x < 2 ** 62):
                raise ValueError("not a count")
            vals[spec[0]] = int(x)
        else:
            vals[spec[0]] = x * spec[2]
    if "elapsed_ms" not in vals:
        raise ValueError("no step time")
    return vals


# --- the bulk reader of a learnt layout ------------------------------------------------------
# After the careful path has read one Megatron line, its key sequence (the layout, fixed for a
# job) is compiled into one regex that matches whole lines of exactly that shape. The bulk
# reader does not run that regex on every line (Python's `re` walks every byte of the literal
# keys, ~1.5 µs per 410-byte line): it maps every digit of the chunk to `0` (`bytes.translate`)
# and splits it into lines, so that lines differing only in their numbers share one *shape*.
# The regex runs once per distinct shape (a handful per job: the numbers' widths change rarely);
# a shape it takes fixes where each number's digits sit in the line, and numpy then reads those
# digits of all lines of the shape at once (`_Plan`). Integers are sums of digits × powers of
# ten; a float is its integer mantissa m (< 2**53) divided or multiplied by an exact power of
# ten (10**k, k <= 22), which IEEE rounds once, correctly, to the same double that float()
# gives; other floats (very long mantissas, large exponents) go through float() line by line.
# Every line the regex does not take goes through the careful path as before. The regex only
# takes lines the careful path reads identically (tested): the last header of its line (values
# hold no `/`), every field whole, the numbers in the shapes Python's int()/float() accept, the
# line ending with `|`.

_WS = rb"[ \t\x0b\x0c]*"
_FNUM = rb"([-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)"
_INUM = rb"(\d{1,18})"
_OTHER = rb"[^|/\n\r\x1b]*"
_HDR_FAST = (rb"iteration[ \t\x0b\x0c]+(\d{1,12})" + _WS + rb"/" + _WS + rb"(\d{1,12})" + _WS
             + rb"\|")
_TS_FAST = rb"\[(\d{4}-\d\d-\d\d[ T]\d\d:\d\d):(\d\d)(\.\d{1,9})?\] "
_SHAPE = bytes.maketrans(b"123456789", b"000000000")  # a line's shape: every digit a `0`
# Exact: 1e22 is the largest power of ten a double holds exactly.
_P10 = np.array([10.0 ** k for k in range(23)])
_EXACT = 1 << 53
MAX_PLANS = 4096


class _Layout:
    __slots__ = ("cols", "index", "regex", "timestamped")

    def __init__(self, keys: tuple[bytes, ...], timestamped: bool, index: int) -> None:
        parts = [_TS_FAST + _HDR_FAST if timestamped
                 else _HDR_FAST.replace(b"iteration", rb"iteration(?<!\] iteration)", 1)]
        group = 5 if timestamped else 2
        cols: dict[str, tuple[int, str, float]] = {}
        for key in keys:
            spec = _FIELDS.get(key)
            # The regex reads shapes: digits in a key are `0` there too. Only unknown keys can
            # hold digits (no key of _FIELDS does), and the careful path ignores their names.
            lit = re.escape(key.translate(_SHAPE))
            if spec is None:
                parts.append(_WS + lit + _WS + b":" + _OTHER + rb"\|")
                continue
            group += 1
            cols[spec[0]] = (group, spec[1], spec[2])
            parts.append(_WS + lit + _WS + b":" + _WS
                         + (_FNUM if spec[1] == _F else _INUM) + _WS + rb"\|")
        parts.append(rb"[ \t\r]*$")
        self.regex = re.compile(b"".join(parts))
        self.cols = cols
        self.timestamped = timestamped
        self.index = index


def _layout_ok(keys: tuple[bytes, ...]) -> bool:
    """A layout the bulk reader can take: each column read from one key only."""
    cols = [_FIELDS[k][0] for k in keys if k in _FIELDS]
    return len(cols) == len(set(cols)) and all(k and b"\n" not in k for k in keys)


class _Plan:
    """Where the numbers sit in the lines of one shape, for one layout: digit positions (from
    the line start) with their weights, summed per quantity by `np.add.reduceat`."""

    __slots__ = ("fields", "hdr", "lay", "pos", "segs", "ts", "wts")

    def __init__(self, lay: _Layout, shape: bytes, m: re.Match[bytes]) -> None:
        self.lay = lay
        pos: list[int] = []
        wts: list[int] = []
        segs: list[int] = []

        def quantity(digits: list[int]) -> int:
            segs.append(len(pos))
            pos.extend(digits)
            wts.extend(10 ** (len(digits) - 1 - j) for j in range(len(digits)))
            return len(segs) - 1

        def number(g: int, kind: str) -> tuple[Any, ...]:
            a, b = m.span(g)
            if kind == _I:
                return (quantity(list(range(a, b))),)
            text = shape[a:b]
            neg = text[:1] == b"-"
            e = max(text.find(b"e"), text.find(b"E"))
            mant_end = a + e if e >= 0 else b
            digits = [j for j in range(a, mant_end) if shape[j] == 48]
            dot = shape.find(b".", a, mant_end)
            frac = 0 if dot < 0 else mant_end - dot - 1
            exp = [j for j in range(mant_end + 1, b) if shape[j] == 48] if e >= 0 else []
            if len(digits) > 17 or len(exp) > 4:  # beyond int64 sums: float() per line
                return (-1, -1, 0, False, False, a, b)
            eneg = e >= 0 and shape[mant_end + 1] == 45  # `-`
            return (quantity(digits), quantity(exp) if exp else -1, frac, neg, eneg, a, b)

        if lay.timestamped:
            a = m.start(1)  # YYYY-MM-DD HH:MM
            self.ts: tuple[Any, ...] | None = (
                quantity(list(range(a, a + 4))), quantity([a + 5, a + 6]),
                quantity([a + 8, a + 9]), quantity([a + 11, a + 12]),
                quantity([a + 14, a + 15]), quantity(list(range(*m.span(2)))),
                number(3, _F) if m.start(3) >= 0 else None)
            hdr = 4
        else:
            self.ts = None
            hdr = 1
        self.hdr = (quantity(list(range(*m.span(hdr)))), quantity(list(range(*m.span(hdr + 1)))))
        self.fields = {name: (number(g, kind), kind, scale)
                       for name, (g, kind, scale) in lay.cols.items()}
        self.pos = np.asarray(pos, dtype=np.intp)
        self.wts = np.asarray(wts, dtype=np.int64)
        self.segs = np.asarray(segs, dtype=np.intp)


def _float_col(q: np.ndarray, spec: tuple[Any, ...], data: bytes, starts: np.ndarray,
               ) -> np.ndarray:
    """A float column from its digit sums (see the section comment); float() where inexact."""
    qm, qe, frac, neg, eneg, a, b = spec
    if qm < 0:
        return np.array([float(data[s + a:s + b]) for s in starts.tolist()], dtype=np.float64)
    m = q[:, qm]
    if qe >= 0:
        p = (-q[:, qe] if eneg else q[:, qe]) - frac
        mf = m.astype(np.float64)
        v = np.where(p >= 0, mf * _P10[np.clip(p, 0, 22)], mf / _P10[np.clip(-p, 0, 22)])
        bad = (m >= _EXACT) | (p > 22) | (p < -22)
    else:
        v = m.astype(np.float64) / _P10[min(frac, 22)]
        bad = m >= _EXACT if frac <= 22 else np.ones(m.shape[0], dtype=bool)
    if neg:
        v = -v
    if bad.any():
        for j in np.flatnonzero(bad).tolist():
            s = int(starts[j])
            v[j] = float(data[s + a:s + b])
    return v


class _Bulk:
    """The lines of a chunk taken in bulk, their numbers converted (arrays in line order)."""

    __slots__ = ("cols", "ends", "it", "ls", "ok", "runs", "t", "ti")

    def __init__(self, n: int) -> None:
        self.it = np.empty(n, dtype=np.int64)
        self.ti = np.empty(n, dtype=np.int64)
        self.t = np.full(n, _NAN)
        self.ok = np.ones(n, dtype=bool)
        self.cols: dict[str, np.ndarray] = {}
        self.ls: list[int] = []
        self.ends: list[int] = []
        self.runs: list[tuple[_Layout, int, int]] = []  # (layout, first, end) in bulk lines


class _Seg:
    """Mutable segment state while parsing."""

    __slots__ = ("args", "cause", "exit_marker", "first_iteration", "first_time_s", "index",
                 "last_iteration", "last_key", "last_time_s", "launch_time_s", "loaded_iteration",
                 "n_records", "offset", "start_seen", "train_start_time_s")

    def __init__(self, index: int, offset: int, cause: str, start_seen: bool) -> None:
        self.index, self.offset, self.cause, self.start_seen = index, offset, cause, start_seen
        self.args: dict[str, Any] | None = None
        self.launch_time_s: float | None = None
        self.train_start_time_s: float | None = None
        self.first_time_s: float | None = None
        self.last_time_s: float | None = None
        self.loaded_iteration: int | None = None
        self.first_iteration: int | None = None
        self.last_iteration: int | None = None
        self.last_key: tuple[Any, ...] | None = None
        self.n_records = 0
        self.exit_marker: str | None = None

    def freeze(self) -> Segment:
        return Segment(
            index=self.index, offset=self.offset, cause=self.cause, start_seen=self.start_seen,
            args=None if self.args is None else dict(self.args),
            launch_time_s=self.launch_time_s, train_start_time_s=self.train_start_time_s,
            first_time_s=self.first_time_s, last_time_s=self.last_time_s,
            loaded_iteration=self.loaded_iteration, first_iteration=self.first_iteration,
            last_iteration=self.last_iteration, n_records=self.n_records,
            exit_marker=self.exit_marker)


class _Save:
    __slots__ = ("end_time_s", "iteration", "offset", "segment", "start_time_s", "succeeded",
                 "timer_s")

    def __init__(self, iteration: int, segment: int, offset: int) -> None:
        self.iteration, self.segment, self.offset = iteration, segment, offset
        self.start_time_s: float | None = None
        self.end_time_s: float | None = None
        self.timer_s: float | None = None
        self.succeeded = False

    def freeze(self) -> CheckpointSave:
        return CheckpointSave(self.iteration, self.segment, self.offset, self.start_time_s,
                              self.end_time_s, self.timer_s, self.succeeded)


# --- the parser ------------------------------------------------------------------------------


_heap_padded = False


def _pad_heap() -> None:
    """Ask glibc to keep 16 MiB free at the top of the heap (M_TOP_PAD). Each chunk's working
    set (~10 MiB: the chunk, its shapes, the digit matrix) is freed at the top of the heap, and
    glibc would hand it back to the kernel every time, to fault it in again, zeroed, for the
    next chunk: 4-5 page faults per iteration line, a quarter of the parse's CPU time. The
    peak RSS already holds that working set; this keeps it instead of returning it."""
    global _heap_padded
    if _heap_padded:
        return
    _heap_padded = True
    # no mallopt (macOS): nothing to tune
    with contextlib.suppress(OSError, AttributeError, TypeError):
        ctypes.CDLL(None).mallopt(-2, 16 << 20)  # M_TOP_PAD (malloc.h); glibc and musl


class LogParser:
    """Incremental Megatron log parser: `feed(chunk)` ..., `summary()`, `close()`."""

    def __init__(self, columns: Collection[str] | None = None) -> None:
        """`columns`: the record columns to keep (`logrecords.COLUMNS`; default all). The
        others are not stored and read as unknown (-1, NaN): `slurmpod mfu` keeps what
        `metrics.job_metrics` reads (`metrics.COLUMNS_READ`), not the loss or the grad norm."""
        _pad_heap()
        keep = set(COLUMNS if columns is None else columns)
        if keep - set(COLUMNS):
            raise ValueError(f"no such record column: {', '.join(sorted(keep - set(COLUMNS)))}")
        self._partial = b""
        self._skip_line = False  # inside an over-long line: drop it up to the next newline
        self._base = 0  # stream offset of the next byte fed
        self._want_timer = False
        self._timers = TimerBlocks()  # Megatron's per-rank timer blocks
        self._memory = MemoryReports()  # Megatron's per-rank memory reports
        self._want_vocab = False  # after a dump without padded_vocab_size, until training starts
        self._n_rejected = 0
        self._n_duplicates = 0
        self._closed = False
        self._cols = {k: ColumnBuilder(np.int64, k in keep) for k in _INT_COLS}
        self._cols.update({k: ColumnBuilder(np.float64, k in keep) for k in _FLOAT_COLS})
        self._rows: list[tuple[Any, ...]] = []  # careful-path records not yet in _cols
        self._segs: list[_Seg] = [_Seg(0, 0, "start", False)]
        self._saves: list[_Save] = []
        self._progress: list[ProgressEntry] = []
        self._first_time: float | None = None
        self._last_time: float | None = None
        self._dump: list[str] | None = None  # lines of an arguments dump being read
        self._layouts: dict[tuple[bool, tuple[bytes, ...]], _Layout] = {}
        self._plans: dict[bytes, _Plan | None] = {}  # line shape -> plan (None: careful path)
        self._dense = True  # the last chunk was mostly iteration lines
        self.bulk = True  # the bulk reader of learnt layouts (off: every line the careful way)
        # Below this many bytes (a few lines: a tail poll, a line with terminal escapes) the
        # careful path is cheaper than the bulk reader's fixed cost (~0.1 ms); same records.
        self.bulk_min_bytes = 4096

    # -- input --

    def feed(self, chunk: bytes | str) -> None:
        """Consume the next piece of the stream (any size; lines may span pieces)."""
        if self._closed:
            raise ValueError("LogParser.feed() after close()")
        if isinstance(chunk, str):
            chunk = chunk.encode("utf-8", "surrogateescape")
        if len(chunk) > 2 * CHUNK_BYTES:  # a large backlog (the monitor's): bounded pieces
            for k in range(0, len(chunk), CHUNK_BYTES):
                self.feed(chunk[k:k + CHUNK_BYTES])
            return
        if not chunk:
            return
        base = self._base - len(self._partial)
        self._base += len(chunk)
        if self._skip_line:
            nl = chunk.find(b"\n")
            if nl < 0:
                return
            self._skip_line = False  # (the partial line is empty while skipping)
            base += nl + 1
            chunk = chunk[nl + 1:]
        data = self._partial + chunk if self._partial else chunk
        if b"\r" in chunk:
            # A carriage return ends a line, as on a terminal: progress bars (NeMo 1.x, tqdm)
            # redraw with `\r` and never print a newline. Same length, so offsets stay exact;
            # `\r\n` becomes an empty line.
            data = data.replace(b"\r", b"\n")
        last = data.rfind(b"\n")
        if last < 0:
            self._partial = data
        else:
            self._partial = data[last + 1:]
            self._scan(data, last + 1, base)
        if len(self._partial) > MAX_LINE_BYTES:
            self._partial, self._skip_line = b"", True

    def feed_lines(self, lines: Iterable[bytes | str]) -> None:
        """Consume lines (a newline is added where missing), batched for the fast path."""
        batch: list[bytes] = []
        size = 0
        for line in lines:
            b = line.encode("utf-8", "surrogateescape") if isinstance(line, str) else line
            if not b.endswith(b"\n"):
                b += b"\n"
            batch.append(b)
            size += len(b)
            if size >= CHUNK_BYTES:
                self.feed(b"".join(batch))
                batch, size = [], 0
        if batch:
            self.feed(b"".join(batch))

    def close(self) -> LogSummary:
        """End of input: parse an unterminated last line; return the final summary."""
        if not self._closed:
            if self._partial and not self._skip_line:
                tail = self._partial
                self._partial = b""
                self._scan(tail + b"\n", len(tail) + 1, self._base - len(tail))
            self._partial = b""
            if self._dump is not None:
                self._end_dump()
            self._closed = True
        return self.summary()

    # -- scanning --

    def _scan(self, data: bytes, end: int, base: int) -> None:
        """Handle the complete lines in data[:end] (data[end-1] is a newline)."""
        if data.find(b"\x1b", 0, end) < 0:
            self._scan_plain(data, end, base)
            return
        # Lines wrapped in terminal escapes are read with the escapes removed, one at a time.
        start = 0
        while start < end:
            e = data.find(b"\x1b", start, end)
            if e < 0:
                self._scan_plain(data[start:end], end - start, base + start)
                return
            ls = max(start, data.rfind(b"\n", start, e) + 1)
            nl = data.find(b"\n", e, end)
            if ls > start:
                self._scan_plain(data[start:ls], ls - start, base + start)
            line = _ANSI.sub(b"", data[ls:nl]).replace(b"\x1b", b"") + b"\n"
            self._scan_plain(line, len(line), base + ls)
            start = nl + 1

    def _scan_plain(self, data: bytes, end: int, base: int, start: int = 0) -> None:
        """Handle the complete lines in data[start:end] (no escapes).

        Lines of a learnt layout are read in bulk (`_bulk`); of the rest, only lines holding a
        marker word are looked at, and `bytes.find` locates them at memory speed.
        """
        while not self._layouts and end - start > 65536:
            # No layout learnt yet: read 64 KiB pieces carefully until one is, so that the
            # rest of the chunk goes in bulk (same cuts with the bulk reader off).
            cut = data.rfind(b"\n", start, start + 65536) + 1
            if cut <= start:
                break
            self._scan_plain(data, cut, base, start)
            start = cut
        pos = start
        if self._dump is not None:
            pos = self._dump_lines(data, pos, end, base)
        if self._timers.open:  # a timer block cut by the chunk's end
            pos = self._timer_lines(data, pos, end)
        if self._want_timer:
            self._timer_after(data, pos, end)
        if self._want_vocab:
            self._find_vocab(data, pos, end)
        fast = (self._bulk_matches(data, pos, end) if self._layouts and self.bulk
                and end - pos >= self.bulk_min_bytes else None)
        n_fast = len(fast.ls) if fast else 0
        hits: list[int] = []
        for a, b in self._gaps(fast, pos, end):  # markers between the lines taken in bulk
            for marker in _MARKERS:
                p = data.find(marker, a, b)
                while p >= 0:
                    hits.append(p)
                    p = data.find(marker, p + 1, b)
        hits.sort()
        fi = 0  # bulk lines before this one are in
        i, n = 0, len(hits)
        while i < n:
            h = hits[i]
            i += 1
            if h < pos:
                continue
            if fast:
                k = bisect_right(fast.ls, h)
                if k and h < fast.ends[k - 1]:
                    continue  # inside a line taken in bulk
                if k > fi:  # bulk lines before this one first: events stay in stream order
                    self._bulk(data, fast, fi, k, base)
                    fi = k
            ls = data.rfind(b"\n", 0, h) + 1
            nl = data.find(b"\n", h, end)
            if i < n and hits[i] < nl:  # more markers on the line: glued lines, or a rare line
                while i < n and hits[i] < nl:
                    i += 1
                m = None
                for m in _ITER_HDR.finditer(data, ls, nl):  # noqa: B007 - the last header wins
                    pass
            else:
                m = _ITER_HDR.search(data, ls, h) if data[h] == 101 else None  # b"e"lapsed
                while m is not None and (nxt := _ITER_HDR.search(data, m.end(), h)):
                    m = nxt  # a cut line glued to a whole one: the last header wins
            if m is not None and data.find(_MARK_NEMO, ls, nl) < 0:
                self._iteration(data, m, ls, nl, base)
                pos = nl + 1
            else:
                pos = self._rare_line(data, ls, nl, end, base)
        if fast and fi < n_fast:
            self._bulk(data, fast, fi, n_fast, base)

    @staticmethod
    def _gaps(fast: _Bulk | None, pos: int, end: int,
              ) -> list[tuple[int, int]]:
        """The stretches of data[pos:end] outside the lines taken in bulk (all of it if none);
        a line taken in bulk ends at its newline, consecutive ones leave no gap."""
        if not fast:
            return [(pos, end)]
        ls, ends = fast.ls, fast.ends
        if len(ls) > 1:
            a = np.asarray(ls[1:], dtype=np.int64)
            b = np.asarray(ends[:-1], dtype=np.int64)
            brk = np.flatnonzero(a != b + 1).tolist()
        else:
            brk = []
        gaps = [(pos, ls[0])] if ls[0] > pos else []
        gaps.extend((ends[k] + 1, ls[k + 1]) for k in brk)
        if ends[-1] + 1 < end:
            gaps.append((ends[-1] + 1, end))
        return gaps

    def _bulk_matches(self, data: bytes, pos: int, end: int) -> _Bulk | None:
        """Lines of learnt layouts in data[pos:end], converted; None when there are none.

        Where most bytes were iteration lines (the previous chunk says), the whole stretch is
        shaped and split at once; elsewhere only the lines holding the iteration marker."""
        if self._dense:
            shapes = data[pos:end].translate(_SHAPE).split(b"\n")
            shapes.pop()  # data[end - 1] is a newline
            lens = np.fromiter(map(len, shapes), np.int64, len(shapes))
            starts = np.empty_like(lens)
            starts[:1] = pos
            np.cumsum(lens[:-1] + 1, out=starts[1:])
            starts[1:] += pos
        else:
            first: list[int] = []
            lines: list[bytes] = []
            find, rfind = data.find, data.rfind
            p = find(_MARK_ITER, pos, end)
            while p >= 0:
                a = rfind(b"\n", 0, p) + 1
                nl = find(b"\n", p, end)
                first.append(a)
                lines.append(data[a:nl])
                p = find(_MARK_ITER, nl + 1, end)
            if not lines:
                return None
            shapes = b"\n".join(lines).translate(_SHAPE).split(b"\n")
            lens = np.fromiter(map(len, shapes), np.int64, len(shapes))
            starts = np.asarray(first, dtype=np.int64)
        ids_of: dict[bytes, int] = dict.fromkeys(shapes, -1)
        plans: list[_Plan] = []
        for s in ids_of:
            pl = self._plan(s)
            if pl is not None:
                ids_of[s] = len(plans)
                plans.append(pl)
        if not plans:
            self._dense = False
            return None
        ids = np.fromiter(map(ids_of.__getitem__, shapes), np.int32, len(shapes))
        take = np.flatnonzero(ids >= 0)
        lens = lens[take]
        self._dense = int(lens.sum()) * 2 > end - pos
        n = take.size
        bk = _Bulk(n)
        buf = np.frombuffer(data, dtype=np.uint8)
        tid = ids[take]
        starts = starts[take]
        for k, pl in enumerate(plans):
            rows = np.flatnonzero(tid == k) if len(plans) > 1 else np.arange(n)
            self._convert(pl, data, buf, starts[rows], bk, rows)
        lay_of = np.array([pl.lay.index for pl in plans], dtype=np.int32)[tid]
        edges = [0, *(np.flatnonzero(lay_of[1:] != lay_of[:-1]) + 1).tolist(), n]
        lays = list(self._layouts.values())
        bk.runs = [(lays[int(lay_of[a])], a, b) for a, b in pairwise(edges)]
        bk.ls = starts.tolist()
        bk.ends = (starts + lens).tolist()
        return bk

    def _plan(self, shape: bytes) -> _Plan | None:
        """The plan of a line shape: the first learnt layout whose regex takes it (cached)."""
        if _MARK_ITER not in shape:
            return None
        try:
            return self._plans[shape]
        except KeyError:
            pass
        plan = None
        for lay in self._layouts.values():
            m = lay.regex.search(shape)
            if m is not None:
                plan = _Plan(lay, shape, m)
                break
        if len(self._plans) >= MAX_PLANS:
            self._plans.clear()
        self._plans[shape] = plan
        return plan

    @staticmethod
    def _convert(pl: _Plan, data: bytes, buf: np.ndarray, starts: np.ndarray, bk: _Bulk,
                 rows: np.ndarray) -> None:
        """The numbers of the lines of one plan (line starts `starts`) into bk at `rows`."""
        if not rows.size:
            return
        digits = buf[starts[:, None] + pl.pos] - 48
        q = np.add.reduceat(np.multiply(digits, pl.wts, dtype=np.int64), pl.segs, axis=1)
        bk.it[rows] = q[:, pl.hdr[0]]
        bk.ti[rows] = q[:, pl.hdr[1]]
        if pl.ts is not None:
            y, mo, d, h, mi, sec, frac = pl.ts
            # minute_base of each line, from the base of its day (a day or two per chunk)
            day = (q[:, y] * 100 + q[:, mo]) * 100 + q[:, d]
            if day[0] == day[-1] and (day == day[0]).all():
                uniq, inv = day[:1], np.zeros(day.shape[0], dtype=np.intp)
            else:
                uniq, inv = np.unique(day, return_inverse=True)
            bases = [minute_base(b"%04d-%02d-%02d 00:00" % (k // 10000, k // 100 % 100, k % 100))
                     for k in uniq.tolist()]
            hh, mm, secs = q[:, h], q[:, mi], q[:, sec]
            base = (np.array([_NAN if x is None else x for x in bases], dtype=np.float64)[inv]
                    + (hh * 3600 + mm * 60))  # exact: whole seconds below 2**53, as minute_base
            bk.ok[rows] = (base == base) & (hh <= 23) & (mm <= 59) & (secs <= 60)  # 60: leap
            t = base + secs
            if frac is not None:
                t = t + _float_col(q, frac, data, starts)
            bk.t[rows] = t
        n = bk.it.shape[0]
        for name, (spec, kind, scale) in pl.fields.items():
            col = bk.cols.get(name)
            if col is None:
                col = bk.cols[name] = (np.full(n, _NAN) if kind == _F
                                       else np.full(n, -1, dtype=np.int64))
            v = q[:, spec[0]] if kind == _I else _float_col(q, spec, data, starts)
            col[rows] = v * scale if scale != 1.0 else v

    def _bulk(self, data: bytes, fast: _Bulk, lo: int, hi: int, base: int) -> None:
        """Records of bulk lines lo..hi-1, run by run of one layout."""
        for lay, first, last in fast.runs:
            a, b = max(lo, first), min(hi, last)
            if a < b:
                self._bulk_run(lay, fast, a, b, base)

    def _bulk_run(self, lay: _Layout, bk: _Bulk, a: int, b: int, base: int) -> None:
        """The same checks and segment rules as `_iteration`, vectorised for the usual case
        (iterations increasing)."""
        n = b - a
        it, ti, t = bk.it[a:b], bk.ti[a:b], bk.t[a:b]
        ok = bk.ok[a:b].copy()
        row = {name: bk.cols[name][a:b] for name in lay.cols}
        el = row["elapsed_ms"]
        gbs = row.get("global_batch_size")
        ok &= (el > 0.0) & (el < 1e9) & (it <= ti)
        ok &= gbs >= 1 if gbs is not None else False
        vals = {k: row.get(k) for k in _ROW_KEYS}
        offs = np.asarray(bk.ls[a:b], dtype=np.int64) + base
        if not ok.all():
            self._n_rejected += int(n - ok.sum())
            keep = np.flatnonzero(ok)
            it, ti, t, offs = it[keep], ti[keep], t[keep], offs[keep]
            vals = {k: None if v is None else v[keep] for k, v in vals.items()}
            el = el[keep]
            n = len(keep)
            if n == 0:
                return
        for k in ("tflops_reported", "energy_j", "power_w"):
            v = vals[k]
            if v is not None:
                vals[k] = np.where((v >= 0.0) & (v < (1e7 if k == "tflops_reported" else 1e9)),
                                   v, _NAN)
        seg = self._segs[-1]
        if not ((seg.last_iteration is None or it[0] > seg.last_iteration)
                and (n == 1 or bool((it[1:] > it[:-1]).all()))):
            # a restart or a duplicate inside: record by record, as the careful path does
            # (value when the line lacks the key, the column): int or float by key
            given: list[tuple[Any, np.ndarray | None]] = [
                (-1 if k in _ROW_INT else _NAN, vals[k]) for k in _ROW_KEYS]
            for j in range(n):
                row_j: _Row = tuple(missing if v is None else v[j].item() for missing, v in given)
                self._accept(int(it[j]), int(ti[j]), *row_j, float(t[j]), int(offs[j]))
            return
        self._want_vocab = False
        if lay.timestamped:
            self._see_time(float(t[0]))
            self._see_time(float(t[-1]))
        if seg.first_iteration is None:
            seg.first_iteration = int(it[0])
        seg.last_iteration = int(it[-1])
        seg.last_key = (int(it[-1]), float(el[-1]), float(t[-1]))
        seg.n_records += n

        def col(k: str) -> np.ndarray | int | float:
            v = vals[k]
            return (-1 if k in _ROW_INT else _NAN) if v is None else v

        self._flush()
        cols = self._cols
        for k, values in zip(_INT_COLS + _FLOAT_COLS, (
                it, ti, col("consumed_samples"), col("global_batch_size"), col("skipped_iters"),
                col("nan_iters"), seg.index, offs, el, t, col("tflops_reported"),
                col("lm_loss"), col("loss_scale"), col("grad_norm"), col("energy_j"),
                col("power_w")), strict=True):
            if isinstance(values, np.ndarray):
                cols[k].extend(values)
            else:
                cols[k].fill(values, n)

    def _flush(self) -> None:
        """Careful-path records into the columns (they come one by one; batched here)."""
        if self._rows:
            for k, vals in zip(_INT_COLS + _FLOAT_COLS, zip(*self._rows, strict=True),
                               strict=True):
                self._cols[k].extend(np.array(vals, dtype=self._cols[k].dtype))
            self._rows = []

    def _rare_line(self, data: bytes, ls: int, nl: int, end: int, base: int) -> int:
        """A line holding a marker word; returns where scanning continues."""
        line = data[ls:nl].rstrip(b"\r")
        if _MARK_NEMO in line:  # a progress line; NeMo 2's also looks like an iteration header
            self._nemo_line(line, base + ls)
        elif b" arguments ---" in line:
            bm = _BANNER.search(line)
            if bm and not bm.group(1):
                self._start_dump(base + ls)
                return self._dump_lines(data, nl + 1, end, base)
        elif TIMER_MARKER in line and (option := header_option(line)):
            self._timers.start(option, self._segs[-1].index)
            return self._timer_lines(data, nl + 1, end)
        elif MEMORY_MARKER in line:  # before checkpoint lines: "(before save_checkpoint ...)"
            self._memory.add(line)
        elif b"] datetime: " in line:  # before checkpoint lines: a marker label may say anything
            self._datetime_line(line, base + ls, data, ls)
        elif b" checkpoint " in line:
            self._checkpoint_line(line, base + ls)
            if self._want_timer:
                self._timer_after(data, nl, end)
        elif b"\t" in line:
            self._progress_line(line)
        return nl + 1

    def _timer_lines(self, data: bytes, pos: int, end: int) -> int:
        """Read lines of an open timer block from pos; returns where the block stopped."""
        timers = self._timers
        while timers.open and pos < end:
            run = timers.rank_run(data, pos, end)
            if run > pos:
                pos = run
                continue
            nl = data.find(b"\n", pos, end)
            if nl < 0:
                nl = end
            if not timers.line(data, pos, nl):
                return pos
            pos = nl + 1
        return pos

    def _timer_after(self, data: bytes, pos: int, end: int) -> None:
        """The `save-checkpoint` timer is logged right after a save (timers.log in
        save_checkpoint_and_time); look for it in the next 64 KiB only."""
        q = data.find(b"save-checkpoint", pos, min(end, pos + 65536))
        if q < 0:
            self._want_timer = pos + 65536 > end  # may still come in the next chunk
            return
        self._want_timer = False
        nl = data.find(b"\n", q)
        tm = _TIMER.search(data[q:nl if nl >= 0 else len(data)].rstrip(b"\r"))
        if tm and self._saves:
            try:
                ms = float(tm.group(3) or tm.group(4))
            except ValueError:
                return
            if self._saves[-1].timer_s is None:
                self._saves[-1].timer_s = ms / 1000.0

    def _see_time(self, t: float) -> None:
        seg = self._segs[-1]
        if seg.first_time_s is None:
            seg.first_time_s = t
        seg.last_time_s = t
        if self._first_time is None:
            self._first_time = t
        self._last_time = t

    def _new_segment(self, offset: int, cause: str) -> _Seg:
        if len(self._segs) >= MAX_SEGMENTS:  # pathological input: stop splitting
            return self._segs[-1]
        seg = _Seg(len(self._segs), offset, cause, True)
        self._segs.append(seg)
        return seg

    # -- iteration lines --

    def _iteration(self, data: bytes, m: re.Match[bytes], ls: int, nl: int, base: int) -> None:
        le = nl
        if data[le - 1] != 124:  # usually the line ends with its last `|`
            while le > m.end() and data[le - 1] in b" \t\r":
                le -= 1
        if data[le - 1] != 124:
            self._n_rejected += 1
            return
        try:
            hdr = m.groups()
            iteration, train_iters = int(hdr[0]), int(hdr[1])
            row, keys = _generic_fields(data[m.end():le])
        except ValueError:
            self._n_rejected += 1
            return
        t = _NAN
        s0 = m.start()
        timestamped = data[s0 - 2:s0] == b"] "
        if timestamped:  # ` [2024-04-06 03:02:12] iteration` (2024-01 on)
            lb = data.rfind(b"[", max(ls, s0 - 40), s0)
            ts = parse_timestamp(data[lb + 1:s0 - 2]) if lb >= 0 else None
            if ts is None:
                self._n_rejected += 1
                return
            t = ts
        gbs = row[3]
        # Every Megatron release prints the elapsed time and the global batch size.
        if gbs < 1:
            self._n_rejected += 1
            return
        if self._accept(iteration, train_iters, *row, t, base + ls) and self.bulk:
            lk = (timestamped, keys)
            if lk not in self._layouts and len(self._layouts) < MAX_LAYOUTS and _layout_ok(keys):
                self._layouts[lk] = _Layout(keys, timestamped, len(self._layouts))
                self._plans.clear()  # shapes no layout took may be this one's

    def _accept(self, iteration: int, train_iters: int, consumed: int, elapsed: float,
                tfl: float, gbs: int, loss: float, scale: float, gnorm: float, skipped: int,
                nans: int, energy: float, power: float, t: float, offset: int) -> bool:
        """Checks common to every format, then the record into its segment. True if taken."""
        if (not 0.0 < elapsed < 1e9 or min(consumed, skipped, nans, gbs) < -1
                or 0 <= train_iters < iteration):  # Megatron stops at train_iters
            self._n_rejected += 1
            return False
        if not 0.0 <= tfl < 1e7:
            tfl = _NAN
        if not 0.0 <= energy < 1e9:
            energy = _NAN
        if not 0.0 <= power < 1e9:
            power = _NAN
        seg = self._segs[-1]
        self._want_vocab = False
        key = (iteration, elapsed, t)
        if seg.last_iteration is not None and iteration <= seg.last_iteration:
            if seg.last_key == key:
                self._n_duplicates += 1
                return False
            seg = self._new_segment(offset, "iteration-reset")
        if t == t:  # seg is the current (last) segment, the one _see_time stamps
            self._see_time(t)
        if seg.first_iteration is None:
            seg.first_iteration = iteration
        seg.last_iteration = iteration
        seg.last_key = key
        seg.n_records += 1
        self._rows.append((iteration, train_iters, consumed, gbs, skipped, nans, seg.index,
                           offset, elapsed, t, tfl, loss, scale, gnorm, energy, power))
        if len(self._rows) >= 4096:
            self._flush()
        return True

    def _nemo_line(self, line: bytes, offset: int) -> None:
        """NeMo 2.x / Megatron-Bridge progress lines and NeMo 1.x (Lightning tqdm) bars."""
        try:
            m = None
            for m in _NEMO2.finditer(line):  # noqa: B007 - the last header wins
                pass
            if m is not None:
                rest = line[m.end():].rstrip(b" \t")
                items = rest.split(b"|")
                if items and not items[-1].strip():
                    items.pop()  # a trailing `|`
                vals = _nemo_fields(items, b":")
                step = vals.get("global_step")
                # The printed step index is 0-based (global_step before the step's increment):
                # iteration N of Megatron's count is index N-1.
                iteration = (step if step is not None else int(m.group(2))) + 1
            else:
                m = _NEMO1.search(line)
                if m is None:
                    self._n_rejected += 1
                    return
                items = m.group(3).split(b", ")
                if b"<" not in items[0]:  # `elapsed<remaining` comes first
                    raise ValueError("no time spec")
                items = [x for x in items[1:] if not _RATE.match(x)]
                vals = _nemo_fields(items, b"=")
                if "global_step" not in vals:
                    raise ValueError("no global_step")
                iteration = vals["global_step"] + 1
        except ValueError:
            self._n_rejected += 1
            return
        # NeMo prints no timestamp, and its bar's total is per epoch, not the run's last step.
        self._accept(iteration, -1, vals.get("consumed_samples", -1), vals["elapsed_ms"],
                     vals.get("tflops_reported", _NAN), vals.get("global_batch_size", -1),
                     vals.get("lm_loss", _NAN), _NAN, _NAN, -1, -1, _NAN, _NAN, _NAN, offset)

    # -- other lines --

    def _line_time(self, line: bytes) -> float | None:
        m = _TS_BRACKET.search(line)
        if not m:
            return None
        t = parse_timestamp(m.group(1))
        if t is not None:
            self._see_time(t)
        return t

    def _checkpoint_line(self, line: bytes, offset: int) -> None:
        seg = self._segs[-1]
        m = _SAVE_START.search(line)
        if m:
            if len(self._saves) < MAX_EVENTS:
                save = _Save(int(m.group(1)), seg.index, offset)
                save.start_time_s = self._line_time(line)
                self._saves.append(save)
            return
        m = _SAVE_DONE.search(line)
        if m:
            it = int(m.group(1))
            last = self._saves[-1] if self._saves else None
            if last is not None and last.iteration == it and last.segment == seg.index:
                save = last
            else:
                if len(self._saves) >= MAX_EVENTS:
                    return
                save = _Save(it, seg.index, offset)  # the start line was lost or not printed
                self._saves.append(save)
            save.succeeded = True
            self._want_timer = True
            save.end_time_s = self._line_time(line)
            return
        m = _LOADED.search(line)
        if m:
            seg.loaded_iteration = int(m.group(1))
            self._line_time(line)

    def _datetime_line(self, line: bytes, offset: int, data: bytes, ls: int) -> None:
        m = _DATETIME.search(line)
        if not m:
            return
        t = parse_timestamp(m.group(2))
        if t is None:
            return
        self._see_time(t)
        label = m.group(1).strip()
        seg = self._segs[-1]
        if label == b"after megatron is initialized":
            # A relaunch whose arguments dump was not in the log starts here.
            if seg.n_records:
                seg = self._new_segment(offset, "restart")
            seg.start_seen = seg.start_seen or seg.n_records == 0
            # `time to initialize megatron (seconds): X` is printed just before this marker
            # (initialize_megatron, core 0.5 .. main); X runs from the start of the process.
            q = data.rfind(b"time to initialize megatron (seconds): ", max(0, ls - 65536), ls)
            if q >= 0 and seg.launch_time_s is None:
                im = _INIT_S.match(data, q, data.find(b"\n", q))
                if im:
                    seg.launch_time_s = t - float(im.group(1))
        elif label == b"before the start of training step":
            seg.train_start_time_s = t
            seg.start_seen = seg.start_seen or seg.n_records == 0
        elif label.startswith((b"after training is done", b"exiting program")):
            seg.exit_marker = label[:120].decode("utf-8", "replace")

    def _progress_line(self, line: bytes) -> None:
        m = _PROGRESS.search(line)
        if not m or len(self._progress) >= MAX_EVENTS:
            return
        t = parse_timestamp(m.group(1))
        if t is None:
            return
        fields: dict[bytes, bytes] = {}
        for part in m.group(5).split(b"\t"):
            k, sep, v = part.partition(b": ")
            if sep:
                fields[k.strip()] = v.strip()

        def num(key: bytes, conv: type) -> Any:
            raw = fields.get(key)
            if raw is None:
                return None
            raw = raw.split(b" ")[0]  # "239.9 TFLOP/s/GPU"
            try:
                return conv(raw)
            except ValueError:
                return None

        self._see_time(t)
        self._progress.append(ProgressEntry(
            time_s=t, job_id=m.group(2).decode("utf-8", "replace").strip(),
            n_gpus=int(m.group(3)), event=m.group(4).decode("utf-8", "replace").strip(),
            iteration=num(b"Iteration", int), job_tflops=num(b"Job throughput", float),
            cumulative_tflops=num(b"Cumulative throughput", float),
            flops=num(b"Floating-point operations", float),
            tokens_billions=num(b"Tokens (in billions)", float)))

    # -- the arguments dump --

    def _start_dump(self, offset: int) -> None:
        seg = self._segs[-1]
        if seg.n_records or seg.args is not None:
            seg = self._new_segment(offset, "arguments")
        elif seg.index == 0 and seg.cause == "start":
            seg.cause = "arguments"
        seg.start_seen = True
        self._dump = []

    def _dump_lines(self, data: bytes, pos: int, end: int, base: int) -> int:
        """Read dump lines from pos while a dump is open; returns where the dump stopped."""
        while self._dump is not None and pos < end:
            nl = data.find(b"\n", pos, end)
            if nl < 0:
                nl = end
            line = data[pos:nl].rstrip(b"\r")
            if b" arguments ---" in line and (bm := _BANNER.search(line)):
                self._end_dump()
                if not bm.group(1):  # a new start banner without an end: a truncated dump
                    self._start_dump(base + pos)
                elif self._want_vocab:
                    self._find_vocab(data, nl + 1, end)
            elif b"|" in line and _ITER_HDR.search(line):  # cut short: training output follows
                self._end_dump()
                return pos
            elif len(line) <= 16384:
                lm = _LABEL.match(line)
                self._dump.append(line[lm.end() if lm else 0:].decode("utf-8", "replace"))
                if len(self._dump) >= MAX_ARGS_LINES:
                    self._end_dump()
            pos = nl + 1
        return pos

    def _end_dump(self) -> None:
        lines, self._dump = self._dump or [], None
        args = parse_arguments_dump(lines, strict=False)
        if args:
            self._segs[-1].args = args
            self._want_vocab = args.get("padded_vocab_size") is None

    def _find_vocab(self, data: bytes, pos: int, end: int) -> None:
        """The padded vocabulary is computed after the dump is printed (the tokenizer is built
        later in initialize_megatron) and logged as `> padded vocab (size: V) with k dummy
        tokens (new size: P)`; the FLOPs need P."""
        q = data.find(b"> padded vocab (size: ", pos, end)
        if q < 0:
            return
        vm = _VOCAB.match(data, q, data.find(b"\n", q, end))
        seg = self._segs[-1]
        if vm and seg.args is not None:
            if seg.args.get("padded_vocab_size") is None:
                seg.args["padded_vocab_size"] = int(vm.group(2))
            if seg.args.get("vocab_size") is None:
                seg.args["vocab_size"] = int(vm.group(1))
        self._want_vocab = False

    # -- output --

    def summary(self) -> LogSummary:
        """A snapshot of everything parsed so far (complete lines only, unless closed)."""
        self._flush()
        columns = {k: c.column(self._closed) for k, c in self._cols.items()}
        return LogSummary(
            iterations=IterationTable(**columns),
            segments=tuple(s.freeze() for s in self._segs),
            checkpoints=tuple(s.freeze() for s in self._saves),
            progress=tuple(self._progress),
            n_bytes=self._base, n_rejected=self._n_rejected,
            n_duplicates=self._n_duplicates, first_time_s=self._first_time,
            last_time_s=self._last_time, complete=self._closed,
            rank_timers=self._timers.freeze(), memory=self._memory.freeze())


def parse_log(source: IO[bytes] | Iterable[bytes | str],
              columns: Collection[str] | None = None) -> LogSummary:
    """Parse a whole log: a binary file object, or an iterable of lines. `columns`: the
    record columns to keep (default all, see `LogParser`)."""
    parser = LogParser(columns)
    read = getattr(source, "read", None)
    if callable(read):
        while True:
            chunk = read(CHUNK_BYTES)
            if not chunk:
                break
            parser.feed(chunk)
    else:
        parser.feed_lines(source)
    return parser.close()


__all__ = ["CheckpointSave", "IterationRecord", "IterationTable", "LogParser", "LogSummary",
           "ProgressEntry", "Segment", "epoch_to_log_clock", "parse_log",
           "parse_timestamp"]
