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

Speed: the input is scanned as bytes with `bytes.find` for a few marker words; only lines that
contain one are split and matched. Memory: one unfinished line (capped at `MAX_LINE_BYTES`) plus
112 bytes per logged iteration (typed arrays) and a small record per checkpoint/restart.

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
    parse_dump_lines,
    parse_timestamp,
    typed_value,
)

MAX_LINE_BYTES = 256 * 1024
MAX_ARGS_LINES = 5000
MAX_SEGMENTS = 1000
MAX_EVENTS = 100_000
CHUNK_BYTES = 1 << 20

# Marker words; a line is looked at only if it contains one. Iteration lines by their required
# field (all releases print `elapsed time per iteration (ms)`), a tab for progress.txt lines
# (memchr-fast; Megatron's own output has no tabs).
_MARKERS = (b"elapsed time per iteration (", b" arguments ---", b"] datetime: ", b" checkpoint ",
            b"\t")

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
_LABEL = re.compile(rb"^\s*\d{1,6}:\s")
_PROGRESS = re.compile(rb"(?:^|\s)" + _TS_RE
                       + rb"\tJob ID: ([^\t]*)\t# GPUs: (\d{1,9})\t([^\t]+)(.*)$")

# Iteration-line field -> (column, kind). Keys as Megatron prints them (training_log()).
_F, _I = "f", "i"
_FIELDS: dict[bytes, tuple[str, str]] = {
    b"consumed samples": ("consumed_samples", _I),
    b"elapsed time per iteration (ms)": ("elapsed_ms", _F),
    b"throughput per GPU (TFLOP/s/GPU)": ("tflops_reported", _F),
    b"TFLOPs": ("tflops_reported", _F),  # Megatron-DeepSpeed
    b"global batch size": ("global_batch_size", _I),
    b"lm loss": ("lm_loss", _F),
    b"loss scale": ("loss_scale", _F),
    b"grad norm": ("grad_norm", _F),
    b"number of skipped iterations": ("skipped_iters", _I),
    b"number of nan iterations": ("nan_iters", _I),
}
_FLOAT_COLS = ("elapsed_ms", "time_s", "tflops_reported", "lm_loss", "loss_scale", "grad_norm")
_INT_COLS = ("iteration", "train_iters", "consumed_samples", "global_batch_size", "skipped_iters",
             "nan_iters", "segment", "offset")
_NAN = float("nan")

# The usual layout (core 0.5 .. main 2026) in one regex: whole `key: value |` fields, the ones
# read are strict, anything between them must still be whole fields. Other layouts take the
# generic path; both give the same row for the same line (tested).
_GAP = rb"(?:[^|:]+:[^|]*\|)*?"  # whole `key: value |` fields only
_VAL = rb"\s*([^|\s]+)\s*\|"
_FAST = re.compile(
    rb"\s*consumed samples:\s*(\d+)\s*\|" + _GAP
    + rb"\s*elapsed time per iteration \(ms\):" + _VAL
    + rb"(?:\s*throughput per GPU \(TFLOP/s/GPU\):" + _VAL + rb")?" + _GAP
    + rb"\s*global batch size:\s*(\d+)\s*\|"
    + rb"(?:" + _GAP + rb"\s*lm loss:" + _VAL + rb")?" + _GAP
    + rb"\s*loss scale:" + _VAL
    + rb"(?:\s*grad norm:" + _VAL + rb")?" + _GAP
    + rb"\s*number of skipped iterations:\s*(\d+)\s*\|\s*number of nan iterations:\s*(\d+)\s*\|"
    + rb"\s*$")
_ROW_KEYS = ("consumed_samples", "elapsed_ms", "tflops_reported", "global_batch_size", "lm_loss",
             "loss_scale", "grad_norm", "skipped_iters", "nan_iters")


def _generic_fields(fields: bytes) -> tuple[Any, ...]:
    """Any layout: `key: value |` fields in any order; raises ValueError on a bad value."""
    vals: dict[str, Any] = {}
    for part in fields.split(b"|")[:-1]:
        key, sep, raw = part.partition(b":")
        if not sep:
            raise ValueError("a field without `key:`")  # Megatron prints none
        spec = _FIELDS.get(key.strip())
        if spec is not None:
            vals[spec[0]] = float(raw) if spec[1] == _F else int(raw)
    if "elapsed_ms" not in vals:
        raise ValueError("no elapsed time")
    return tuple(vals.get(k, -1 if k in _INT_COLS else _NAN) for k in _ROW_KEYS)


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
        """Handle the complete lines in data[:end] (data[end-1] is a newline).

        Only lines holding a marker word are looked at; `bytes.find` locates them at memory
        speed. Iteration lines are found by their one required field, `elapsed time per
        iteration (`, whose rare letters let the search skip fast.
        """
        pos = 0
        if self._dump is not None:
            pos = self._dump_lines(data, 0, end, base)
        if self._want_timer:
            self._timer_after(data, pos, end)
        if self._want_vocab:
            self._find_vocab(data, pos, end)
        hits: list[int] = []
        for marker in _MARKERS:
            p = data.find(marker, pos, end)
            while p >= 0:
                hits.append(p)
                p = data.find(marker, p + 1, end)
        hits.sort()
        i, n = 0, len(hits)
        while i < n:
            h = hits[i]
            i += 1
            if h < pos:
                continue
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
            if m is not None:
                self._iteration(data, m, ls, nl, base)
                pos = nl + 1
            else:
                pos = self._rare_line(data, ls, nl, end, base)

    def _rare_line(self, data: bytes, ls: int, nl: int, end: int, base: int) -> int:
        """A line holding a marker word; returns where scanning continues."""
        line = data[ls:nl].rstrip(b"\r")
        if b" arguments ---" in line:
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
            f = _FAST.match(data, m.end(), le)
            if f is not None:  # the usual Megatron layout, matched in one go
                g = f.groups()
                row = (int(g[0]), float(g[1]), _NAN if g[2] is None else float(g[2]), int(g[3]),
                       _NAN if g[4] is None else float(g[4]), float(g[5]),
                       _NAN if g[6] is None else float(g[6]), int(g[7]), int(g[8]))
            else:
                row = _generic_fields(data[m.end():le])
        except ValueError:
            self._n_rejected += 1
            return
        consumed, elapsed, tfl, gbs, loss, scale, gnorm, skipped, nans = row
        # Every Megatron release prints the elapsed time and the global batch size.
        if (not 0.0 < elapsed < 1e9 or gbs < 1 or min(consumed, skipped, nans) < -1
                or iteration > train_iters):  # Megatron stops at train_iters
            self._n_rejected += 1
            return
        t = _NAN
        s0 = m.start()
        if data[s0 - 2:s0] == b"] ":  # ` [2024-04-06 03:02:12] iteration` (2024-01 on)
            lb = data.rfind(b"[", max(ls, s0 - 40), s0)
            ts = parse_timestamp(data[lb + 1:s0 - 2]) if lb >= 0 else None
            if ts is None:
                self._n_rejected += 1
                return
            t = ts
        if not 0.0 <= tfl < 1e7:
            tfl = _NAN

        seg = self._segs[-1]
        self._want_vocab = False
        key = (iteration, elapsed, t)
        if seg.last_iteration is not None and iteration <= seg.last_iteration:
            if seg.last_key == key:
                self._n_duplicates += 1
                return
            seg = self._new_segment(base + ls, "iteration-reset")
        if t == t:  # seg is the current (last) segment, the one _see_time stamps
            self._see_time(t)
        if seg.first_iteration is None:
            seg.first_iteration = iteration
        seg.last_iteration = iteration
        seg.last_key = key
        seg.n_records += 1
        self._ints.extend((iteration, train_iters, consumed, gbs, skipped, nans, seg.index,
                           base + ls))
        self._floats.extend((elapsed, t, tfl, loss, scale, gnorm))

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
