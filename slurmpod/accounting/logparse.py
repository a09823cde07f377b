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
  int/float/bool/None/list; strings otherwise). Parsed by `slurmpod.megatron.args.
  parse_arguments_dump` when that is importable, else by the fallback here.
- `[label] datetime: ts` markers, `time to initialize megatron (seconds): X`, checkpoint lines
  (`saving checkpoint at iteration N`, `successfully saved checkpoint at/from iteration N`,
  `successfully loaded checkpoint ... at iteration N`, timestamped or not), the timer line
  `save-checkpoint ....: (min, max)`, and `progress.txt` lines (tab-separated, `Job ID:`).
- restarts within one log (requeue with `--open-mode=append`, an auto-resume loop): a second
  arguments dump, or an iteration number that does not increase, opens a new `Segment`.
- `srun --label` rank prefixes (`0: `) and other text before a line's payload.

Also Megatron-DeepSpeed's `elapsed time per iteration (s)`, `--log-energy` fields, NeMo 2.x /
Megatron-Bridge `Training epoch E, iteration I/N | key: value ...` and NeMo 1.x Lightning bars
(`key=value` postfix), launcher prefixes, ECMA-48 escapes, and `\r` as a line end.

Speed: Megatron lines of a layout already seen (`_Layout`) are read in bulk, one regex
`finditer` per chunk and numpy column conversion; everything else is found with `bytes.find`
of a few marker words and read line by line (the careful path, which the bulk reader matches
exactly). Memory: one unfinished line (capped at `MAX_LINE_BYTES`) plus 128 bytes per logged
iteration (typed arrays) and a small record per checkpoint/restart.

Garbage: lines that do not parse completely are counted (`n_rejected`) and dropped, never
guessed at. An iteration line must end with `|` and every field slurmpod reads must convert;
when two lines are glued together (no newline between them), the last iteration header on the
line is used.

Times: Megatron prints the node's local wall-clock time without a zone. Times here are "log
clock" seconds: that wall-clock read as if it were UTC. Differences are exact; to compare with
Slurm's epoch times, add the node's UTC offset to the epoch value (`epoch_to_log_clock`).
"""

from __future__ import annotations

import re
from array import array
from bisect import bisect_right
from collections.abc import Iterable
from typing import IO, Any

import numpy as np

from slurmpod.accounting.logrecords import (
    CheckpointSave,
    IterationRecord,
    IterationTable,
    LogSummary,
    ProgressEntry,
    Segment,
    arguments_from_dump,
    epoch_to_log_clock,
    minute_base,
    parse_dump_lines,
    parse_timestamp,
    typed_value,
)

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
_MARKERS = (_MARK_ITER, _MARK_NEMO, b" arguments ---", b"] datetime: ", b" checkpoint ", b"\t")

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
_INT64_MAX = (1 << 63) - 1


def _generic_fields(fields: bytes) -> tuple[tuple[Any, ...], tuple[bytes, ...]]:
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
# job) is compiled into one regex that matches whole lines of exactly that shape. Each chunk is
# then read with finditer per layout and its columns converted by numpy in bulk; every line the
# regex does not take goes through the careful path as before. The regex only takes lines the
# careful path reads identically (tested): the last header of its line (values hold no `/`),
# every field whole, the numbers in the shapes Python's int()/float() accept, the line ending
# with `|`.

_WS = rb"[ \t\x0b\x0c]*"
_FNUM = rb"([-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)"
_INUM = rb"(\d{1,18})"
_OTHER = rb"[^|/\n\r\x1b]*"
_HDR_FAST = (rb"iteration[ \t\x0b\x0c]+(\d{1,12})" + _WS + rb"/" + _WS + rb"(\d{1,12})" + _WS
             + rb"\|")
_TS_FAST = rb"\[(\d{4}-\d\d-\d\d[ T]\d\d:\d\d):(\d\d)(\.\d{1,9})?\] "


class _Layout:
    __slots__ = ("cols", "regex", "timestamped")

    def __init__(self, keys: tuple[bytes, ...], timestamped: bool) -> None:
        parts = [_TS_FAST + _HDR_FAST if timestamped
                 else _HDR_FAST.replace(b"iteration", rb"iteration(?<!\] iteration)", 1)]
        group = 5 if timestamped else 2
        cols: dict[str, tuple[int, str, float]] = {}
        for key in keys:
            spec = _FIELDS.get(key)
            if spec is None:
                parts.append(_WS + re.escape(key) + _WS + b":" + _OTHER + rb"\|")
                continue
            group += 1
            cols[spec[0]] = (group, spec[1], spec[2])
            parts.append(_WS + re.escape(key) + _WS + b":" + _WS
                         + (_FNUM if spec[1] == _F else _INUM) + _WS + rb"\|")
        parts.append(rb"[ \t\r]*$")
        self.regex = re.compile(b"".join(parts), re.MULTILINE)
        self.cols = cols
        self.timestamped = timestamped


def _layout_ok(keys: tuple[bytes, ...]) -> bool:
    """A layout the bulk reader can take: each column read from one key only."""
    cols = [_FIELDS[k][0] for k in keys if k in _FIELDS]
    return len(cols) == len(set(cols)) and all(k and b"\n" not in k for k in keys)


def _column(col: list[bytes], dtype: type) -> np.ndarray:
    """Numbers in the shapes the layout regex allows -> array (numpy's C conversion, correctly
    rounded like float()); ValueError if any does not convert."""
    try:
        out = np.fromstring(b" ".join(col), dtype=dtype, sep=" ")
    except DeprecationWarning:  # numpy warns (or raises, under -W error) on unread input
        raise ValueError("column does not convert") from None
    if out.shape[0] != len(col):
        raise ValueError("column does not convert")
    return out


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


class LogParser:
    """Incremental Megatron log parser: `feed(chunk)` ..., `summary()`, `close()`."""

    def __init__(self) -> None:
        self._partial = b""
        self._skip_line = False  # inside an over-long line: drop it up to the next newline
        self._base = 0  # stream offset of the next byte fed
        self._want_timer = False
        self._want_vocab = False  # after a dump without padded_vocab_size, until training starts
        self._n_rejected = 0
        self._n_duplicates = 0
        self._closed = False
        self._ints = array("q")  # rows of _INT_COLS
        self._floats = array("d")  # rows of _FLOAT_COLS
        self._segs: list[_Seg] = [_Seg(0, 0, "start", False)]
        self._saves: list[_Save] = []
        self._progress: list[ProgressEntry] = []
        self._first_time: float | None = None
        self._last_time: float | None = None
        self._dump: list[str] | None = None  # lines of an arguments dump being read
        self._layouts: dict[tuple[bool, tuple[bytes, ...]], _Layout] = {}
        self.bulk = True  # the bulk reader of learnt layouts (off: every line the careful way)

    # -- input --

    def feed(self, chunk: bytes | str) -> None:
        """Consume the next piece of the stream (any size; lines may span pieces)."""
        if self._closed:
            raise ValueError("LogParser.feed() after close()")
        if isinstance(chunk, str):
            chunk = chunk.encode("utf-8", "surrogateescape")
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

    def _scan_plain(self, data: bytes, end: int, base: int) -> None:
        """Handle the complete lines in data[:end] (no escapes).

        Lines of a learnt layout are read in bulk (`_bulk`); of the rest, only lines holding a
        marker word are looked at, and `bytes.find` locates them at memory speed.
        """
        pos = 0
        if self._dump is not None:
            pos = self._dump_lines(data, 0, end, base)
        if self._want_timer:
            self._timer_after(data, pos, end)
        if self._want_vocab:
            self._find_vocab(data, pos, end)
        fast = self._bulk_matches(data, pos, end) if self._layouts and self.bulk else None
        n_fast = len(fast[0]) if fast else 0
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
                k = bisect_right(fast[0], h)
                if k and h < fast[1][k - 1]:
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
    def _gaps(fast: tuple[list[int], list[int], Any] | None, pos: int, end: int,
              ) -> list[tuple[int, int]]:
        """The stretches of data[pos:end] outside the lines taken in bulk (all of it if none);
        a line taken in bulk ends at its newline, consecutive ones leave no gap."""
        if not fast:
            return [(pos, end)]
        ls, ends = fast[0], fast[1]
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

    def _bulk_matches(self, data: bytes, pos: int, end: int,
                      ) -> tuple[list[int], list[int], list[tuple[_Layout, int, list[Any]]]] | None:
        """Lines of learnt layouts in data[pos:end]: (line starts, line ends, per layout its
        first index and its matches' groups). None when there are none."""
        found: list[tuple[int, int, _Layout, tuple[Any, ...]]] = []
        per: list[tuple[_Layout, list[int], list[int], list[Any]]] = []
        for lay in self._layouts.values():
            ms = list(lay.regex.finditer(data, pos, end))
            if ms:
                per.append((lay, [m.start() for m in ms], [m.end() for m in ms],
                            [m.groups() for m in ms]))
        if not per:
            return None
        if len(per) == 1:
            lay, starts, ends, groups = per[0]
            ls = [data.rfind(b"\n", 0, st) + 1 for st in starts]
            return ls, ends, [(lay, 0, groups)]
        for lay, starts, ends, groups in per:
            found.extend((data.rfind(b"\n", 0, st) + 1, en, lay, g)
                         for st, en, g in zip(starts, ends, groups, strict=True))
        found.sort(key=lambda r: r[0])
        # consecutive runs of one layout
        runs: list[tuple[_Layout, int, list[Any]]] = []
        for j, (_, _, lay, g) in enumerate(found):
            if runs and runs[-1][0] is lay:
                runs[-1][2].append(g)
            else:
                runs.append((lay, j, [g]))
        return [r[0] for r in found], [r[1] for r in found], runs

    def _bulk(self, data: bytes,
              fast: tuple[list[int], list[int], list[tuple[_Layout, int, list[Any]]]],
              lo: int, hi: int, base: int) -> None:
        """Records of bulk lines lo..hi-1, converted column-wise; the same checks and segment
        rules as `_iteration`, vectorised for the usual case (iterations increasing)."""
        ls_all = fast[0]
        for lay, first, groups in fast[2]:
            a, b = max(lo, first), min(hi, first + len(groups))
            if a < b:
                self._bulk_run(data, lay, groups[a - first:b - first], ls_all[a:b],
                               fast[1][a:b], base)

    def _bulk_run(self, data: bytes, lay: _Layout, groups: list[Any], ls: list[int],
                  ends: list[int], base: int) -> None:
        n = len(groups)
        cols = list(zip(*groups, strict=True))
        try:
            it = _column(cols[3 if lay.timestamped else 0], np.int64)
            ti = _column(cols[4 if lay.timestamped else 1], np.int64)
            row: dict[str, np.ndarray] = {}
            for name, (g, kind, scale) in lay.cols.items():
                col = _column(cols[g - 1], np.float64 if kind == _F else np.int64)
                row[name] = col * scale if scale != 1.0 else col
        except ValueError:  # a number numpy will not take: the careful path decides
            for a, b in zip(ls, ends, strict=True):
                m = None
                for m in _ITER_HDR.finditer(data, a, b):  # noqa: B007 - the last header wins
                    pass
                if m is not None:
                    self._iteration(data, m, a, b, base)
            return
        t = np.full(n, _NAN)
        ok = np.ones(n, dtype=bool)
        if lay.timestamped:
            minutes = cols[0]
            uniq = {x: minute_base(x) for x in set(minutes)}  # a few per chunk
            if None in uniq.values():
                ok &= np.array([uniq[x] is not None for x in minutes])
                uniq = {k: _NAN if v is None else v for k, v in uniq.items()}
            secs = _column(cols[1], np.int64)
            ok &= secs <= 60  # 60: a leap second
            t = np.array([uniq[x] for x in minutes], dtype=np.float64) + secs
            if any(x is not None for x in cols[2]):
                t = t + _column([x or b"0" for x in cols[2]], np.float64)
        el = row["elapsed_ms"]
        gbs = row.get("global_batch_size")
        ok &= (el > 0.0) & (el < 1e9) & (it <= ti)
        ok &= gbs >= 1 if gbs is not None else False
        vals = {k: row.get(k) for k in _ROW_KEYS}
        offs = np.asarray(ls, dtype=np.int64) + base
        if not ok.all():
            self._n_rejected += int(n - ok.sum())
            keep = np.flatnonzero(ok)
            it, ti, t, offs = it[keep], ti[keep], t[keep], offs[keep]
            vals = {k: None if v is None else v[keep] for k, v in vals.items()}
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
            for j in range(n):
                self._accept(int(it[j]), int(ti[j]), *(
                    (-1 if k in _ROW_INT else _NAN) if vals[k] is None
                    else vals[k][j].item() for k in _ROW_KEYS), float(t[j]), int(offs[j]))
            return
        self._want_vocab = False
        if lay.timestamped:
            self._see_time(float(t[0]))
            self._see_time(float(t[-1]))
        if seg.first_iteration is None:
            seg.first_iteration = int(it[0])
        seg.last_iteration = int(it[-1])
        el = vals["elapsed_ms"]
        seg.last_key = (int(it[-1]), float(el[-1]), float(t[-1]))
        seg.n_records += n

        def col(k: str) -> np.ndarray | int | float:
            v = vals[k]
            return (-1 if k in _ROW_INT else _NAN) if v is None else v

        ints = np.empty((n, len(_INT_COLS)), dtype=np.int64)
        for j, (_k, v) in enumerate(zip(_INT_COLS, (
                it, ti, col("consumed_samples"), col("global_batch_size"), col("skipped_iters"),
                col("nan_iters"), seg.index, offs), strict=True)):
            ints[:, j] = v
        floats = np.empty((n, len(_FLOAT_COLS)), dtype=np.float64)
        for j, k in enumerate(_FLOAT_COLS):
            floats[:, j] = t if k == "time_s" else col(k)
        self._ints.frombytes(ints.tobytes())
        self._floats.frombytes(floats.tobytes())

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
        elif b"] datetime: " in line:  # before checkpoint lines: a marker label may say anything
            self._datetime_line(line, base + ls, data, ls)
        elif b" checkpoint " in line:
            self._checkpoint_line(line, base + ls)
            if self._want_timer:
                self._timer_after(data, nl, end)
        elif b"\t" in line:
            self._progress_line(line)
        return nl + 1

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
                self._layouts[lk] = _Layout(keys, timestamped)

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
        self._ints.extend((iteration, train_iters, consumed, gbs, skipped, nans, seg.index,
                           offset))
        self._floats.extend((elapsed, t, tfl, loss, scale, gnorm, energy, power))
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
            save = self._saves[-1] if self._saves else None
            if save is None or save.iteration != it or save.segment != seg.index:
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
        args = arguments_from_dump(lines)
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

    def _table(self, rows: array, dtype: type, width: int) -> np.ndarray:
        """Rows as a read-only 2-D array: a copy while parsing goes on (the buffer still
        grows), the buffer itself once closed (no second copy of a large log's records)."""
        if self._closed and len(rows):
            out = np.frombuffer(rows, dtype=dtype)
        else:
            out = np.array(rows, dtype=dtype)
        out = out.reshape(-1, width)
        out.flags.writeable = False
        return out

    def summary(self) -> LogSummary:
        """A snapshot of everything parsed so far (complete lines only, unless closed)."""
        ints = self._table(self._ints, np.int64, len(_INT_COLS))
        floats = self._table(self._floats, np.float64, len(_FLOAT_COLS))
        arrays = {k: ints[:, j] for j, k in enumerate(_INT_COLS)}
        arrays.update({k: floats[:, j] for j, k in enumerate(_FLOAT_COLS)})
        return LogSummary(
            iterations=IterationTable(**arrays),
            segments=tuple(s.freeze() for s in self._segs),
            checkpoints=tuple(s.freeze() for s in self._saves),
            progress=tuple(self._progress),
            n_bytes=self._base, n_rejected=self._n_rejected,
            n_duplicates=self._n_duplicates, first_time_s=self._first_time,
            last_time_s=self._last_time, complete=self._closed)


def parse_log(source: IO[bytes] | Iterable[bytes | str]) -> LogSummary:
    """Parse a whole log: a binary file object, or an iterable of lines."""
    parser = LogParser()
    read = getattr(source, "read", None)
    if callable(read):
        while True:
            chunk = read(CHUNK_BYTES)
            if not chunk:
                break
            parser.feed(chunk)
    else:
        parser.feed_lines(source)  # type: ignore[arg-type]
    return parser.close()


__all__ = ["CheckpointSave", "IterationRecord", "IterationTable", "LogParser", "LogSummary",
           "ProgressEntry", "Segment", "epoch_to_log_clock", "parse_dump_lines", "parse_log",
           "parse_timestamp", "typed_value"]
