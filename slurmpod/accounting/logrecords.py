"""Records of a parsed Megatron log (what `logparse` produces) and the small pure helpers that
read timestamps. (The `arguments` dump is read by `megatron.args.parse_arguments_dump`.)

Times are "log clock" seconds: Megatron prints the node's local wall-clock time without a zone,
read here as if it were UTC (see `logparse`).
"""

from __future__ import annotations

import datetime as _dt
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np


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


# -- record columns, packed --------------------------------------------------------------------
#
# A log of nothing but iteration lines (`--log-interval 1`) has millions of records, and the
# numbers in them are small decimals printed by Megatron: iteration counters, byte offsets and
# timestamps that grow by about the same step, `elapsed time per iteration (ms): 5361.6`,
# `throughput ...: 243.6`. A column is kept in blocks of BLOCK values, each block packed the
# narrowest lossless way: one value (a block of equal values), or integers k, as offsets from
# the block's minimum ("frame of reference") or as differences from the previous value
# ("delta"), whichever is narrower, in 1, 2 or 4 bytes, or none for a counter (a constant
# step); a float block as decimals k / 10**d
# where that gives back every value bit for bit (checked, never assumed), else 8-byte floats.
# Decoding does exactly k.astype(float64) / 10.0**d, an exact integer divided by an exact power
# of ten: the correctly rounded double of the decimal, which is what the parser computed.

BLOCK = 1 << 14  # values per block: ~160 blocks for 2.6 million records
_CONST, _FOR, _DELTA, _RAW, _STEP = 0, 1, 2, 3, 4
_P10 = tuple(10.0 ** k for k in range(23))  # exact up to 1e22
_MAX_SCALE = 12  # decimals tried (Megatron prints at most 6 after the point; E notation more)
_EXACT = float(1 << 53)
_U = {1: np.uint8, 2: np.uint16, 4: np.uint32}
_S = {1: np.int8, 2: np.int16, 4: np.int32}

# (count, kind, ref, decimals, data): _CONST: ref a 1-value array; _FOR: value = ref + data;
# _DELTA: value = ref + cumsum(data); _STEP: value = ref + data * position (data an int: a
# counter's constant step); _RAW: data the values themselves.
_Block = tuple[int, int, Any, int, Any]


def _width(lo: int, hi: int, signed: bool) -> int:
    for w in (1, 2, 4):
        if (-(1 << (8 * w - 1)) <= lo and hi < 1 << (8 * w - 1)) if signed else hi < 1 << (8 * w):
            return w
    return 8


def _decimals(v: np.ndarray, bits: np.ndarray, hint: list[int]) -> tuple[np.ndarray, int] | None:
    """(k, d) with k / 10**d == v bit for bit, k integers below 2**53; None if no d does."""
    if hint[1] > 0:  # the last blocks had no decimal form: don't search every block
        hint[1] -= 1
        return None
    if not np.isfinite(v).all():
        return None
    top = float(np.abs(v).max())
    for j, d in enumerate((hint[0], *range(_MAX_SCALE + 1))):
        if j and d == hint[0]:
            continue
        if top * _P10[d] >= _EXACT:
            if j == 0:
                continue
            break
        k = np.rint(v * _P10[d]) if d else np.rint(v)
        k += 0.0  # -0.0 -> 0.0, as the integer will decode: a -0.0 must fail the check
        back = k / _P10[d] if d else k
        if (back.view(np.int64) == bits).all():
            hint[0] = d
            return k.astype(np.int64), d
    hint[1] = 8
    return None


def _pack(v: np.ndarray, hint: list[int]) -> _Block:
    """One block of int64 or float64 values, packed (see above); v is not kept."""
    n = int(v.shape[0])
    bits = v.view(np.int64)
    if (bits == bits[0]).all():
        return (n, _CONST, v[:1].copy(), 0, None)
    d = 0
    k = v
    if v.dtype.kind == "f":
        kd = _decimals(v, bits, hint)
        if kd is None:
            return (n, _RAW, None, 0, v.copy())
        k, d = kd
    lo, hi = int(k.min()), int(k.max())
    if hi - lo >= 1 << 62:
        return (n, _RAW, None, 0, v.copy())
    step = np.diff(k)
    w_for = _width(0, hi - lo, False)
    w_delta = _width(int(step.min()), int(step.max()), True) if n > 1 else 1
    if n > 1 and step.min() == step.max():  # a counter: iteration, consumed samples, ...
        return (n, _STEP, int(k[0]), d, int(step[0]))
    if min(w_for, w_delta) == 8:
        return (n, _RAW, None, 0, v.copy())
    if w_for <= w_delta:
        return (n, _FOR, lo, d, (k - lo).astype(_U[w_for]))
    data = np.empty(n, dtype=_S[w_delta])
    data[0] = 0
    data[1:] = step
    return (n, _DELTA, int(k[0]), d, data)


def _unpack(b: _Block, dtype: np.dtype, out: np.ndarray | None = None) -> np.ndarray:
    """The values of one block (a read-only broadcast view for one repeated value)."""
    n, kind, ref, d, data = b
    if kind == _CONST:
        if out is None:
            return np.broadcast_to(ref, (n,))
        out[:] = ref[0]
        return out
    if kind == _RAW:
        if out is None:
            return data
        out[:] = data
        return out
    if kind == _STEP:
        k = np.arange(n, dtype=np.int64)
        k *= data
    else:
        k = data.astype(np.int64) if kind == _FOR else np.cumsum(data, dtype=np.int64)
    k += ref
    if dtype.kind == "i":
        if out is None:
            return k
        out[:] = k
        return out
    v = k.astype(np.float64) if out is None else out
    if out is not None:
        out[:] = k
    if d:
        v /= _P10[d]
    return v


class PackedColumn:
    """An immutable column of int64 or float64 values in packed blocks of BLOCK (the last one
    may be shorter). `array()` decodes it all; `pieces()` block by block."""

    __slots__ = ("_blocks", "dtype", "n")

    def __init__(self, dtype: np.dtype | type, blocks: tuple[_Block, ...]) -> None:
        self.dtype = np.dtype(dtype)
        self._blocks = blocks
        self.n = sum(b[0] for b in blocks)

    @classmethod
    def of(cls, values: np.ndarray) -> PackedColumn:
        """Pack a whole int64/float64 array."""
        v = np.ascontiguousarray(values)
        hint = [0, 0]
        return cls(v.dtype, tuple(_pack(v[a:a + BLOCK], hint) for a in range(0, v.shape[0], BLOCK)))

    def __len__(self) -> int:
        return self.n

    @property
    def nbytes(self) -> int:
        """Bytes held by the values (not counting a few dozen bytes of bookkeeping per block)."""
        return sum(b[2].nbytes if b[1] == _CONST else 8 if b[1] == _STEP else b[4].nbytes
                   for b in self._blocks)

    def constant(self) -> Any:
        """The one value of a column whose values are all the same (bit for bit), else None."""
        if not self._blocks or any(b[1] != _CONST for b in self._blocks):
            return None
        first = self._blocks[0][2].view(np.int64)[0]
        if any(b[2].view(np.int64)[0] != first for b in self._blocks):
            return None
        return self._blocks[0][2][0]

    def array(self) -> np.ndarray:
        """All values, read-only; one repeated value comes out as a zero-copy broadcast view."""
        if self.constant() is not None:
            out = np.broadcast_to(self._blocks[0][2], (self.n,))
        else:
            out = np.empty(self.n, dtype=self.dtype)
            a = 0
            for b in self._blocks:
                _unpack(b, self.dtype, out[a:a + b[0]])
                a += b[0]
        out.flags.writeable = False
        return out

    def pieces(self) -> Iterator[np.ndarray]:
        """The values block by block (read-only; don't keep them past the next one)."""
        for b in self._blocks:
            yield _unpack(b, self.dtype)

    def first(self) -> Any:
        return _unpack(self._blocks[0], self.dtype)[0] if self._blocks else None

    def last(self) -> Any:
        return _unpack(self._blocks[-1], self.dtype)[-1] if self._blocks else None


class ColumnBuilder:
    """An append-only column while parsing: values go into a raw block, packed when it is
    full. Memory: the packed blocks and one raw block of BLOCK values."""

    __slots__ = ("_blocks", "_dropped", "_fill", "_hint", "_tail", "dtype")

    def __init__(self, dtype: type, keep: bool = True) -> None:
        """keep=False: only count the values; the column reads as unknown (-1, NaN)."""
        self.dtype = np.dtype(dtype)
        self._blocks: list[_Block] = []
        self._tail = np.empty(BLOCK if keep else 0, dtype=self.dtype)
        self._fill = 0
        self._hint = [0, 0]
        self._dropped: int | None = None if keep else 0

    def _seal(self) -> None:
        self._blocks.append(_pack(self._tail, self._hint))
        self._fill = 0

    def extend(self, v: np.ndarray | float) -> None:
        """Append a 1-D array of this dtype (or, with count 1, a scalar)."""
        v = np.asarray(v, dtype=self.dtype)
        if self._dropped is not None:
            self._dropped += v.size
            return
        n, f = v.size, self._fill
        if f + n < BLOCK:  # the usual case: a chunk's records fit in the open block
            self._tail[f:f + n] = v
            self._fill = f + n
            return
        v = v.reshape(-1)
        a = 0
        while a < n:
            k = min(n - a, BLOCK - self._fill)
            self._tail[self._fill:self._fill + k] = v[a:a + k]
            self._fill += k
            a += k
            if self._fill == BLOCK:
                self._seal()

    def fill(self, x: float, count: int) -> None:
        """Append `count` copies of x."""
        if self._dropped is not None:
            self._dropped += max(0, count)
            return
        f = self._fill
        if f + count < BLOCK:
            self._tail[f:f + count] = x
            self._fill = f + count
            return
        while count > 0:
            k = min(count, BLOCK - self._fill)
            self._tail[self._fill:self._fill + k] = x
            self._fill += k
            count -= k
            if self._fill == BLOCK:
                self._seal()

    def column(self, closed: bool) -> PackedColumn:
        """The column so far; the values still being collected are copied (a snapshot stays
        as it is while parsing goes on), or packed once parsing is over."""
        if self._dropped is not None:  # unknown, in blocks that line up with the others'
            one = np.array([-1 if self.dtype.kind == "i" else np.nan], dtype=self.dtype)
            full, rest = divmod(self._dropped, BLOCK)
            return PackedColumn(self.dtype, (*((BLOCK, _CONST, one, 0, None),) * full,
                                             *(((rest, _CONST, one, 0, None),) if rest else ())))
        blocks = list(self._blocks)
        if self._fill:
            tail = self._tail[:self._fill]
            blocks.append(_pack(tail, list(self._hint)) if closed
                          else (self._fill, _RAW, None, 0, tail.copy()))
        return PackedColumn(self.dtype, tuple(blocks))


COLUMNS = ("iteration", "train_iters", "consumed_samples", "global_batch_size", "skipped_iters",
           "nan_iters", "segment", "offset", "elapsed_ms", "time_s", "tflops_reported", "lm_loss",
           "loss_scale", "grad_norm", "energy_j", "power_w")


class IterationTable:
    """All iteration records as parallel columns (ints: -1 = unknown; floats: NaN). Reading a
    column attribute gives a read-only numpy array, decoded on first use and kept; `blocks()`
    reads columns a block at a time without decoding them whole (`metrics.job_metrics` without
    the series)."""

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

    __slots__ = ("_cache", "_cols", "_n")

    def __init__(self, **columns: np.ndarray | PackedColumn) -> None:
        if set(columns) != set(COLUMNS):
            raise TypeError(f"IterationTable needs the columns {', '.join(COLUMNS)}")
        cols = {k: c if isinstance(c, PackedColumn) else PackedColumn.of(np.asarray(c))
                for k, c in columns.items()}
        lens = {len(c) for c in cols.values()}
        if len(lens) != 1:
            raise ValueError("IterationTable columns differ in length")
        self._cols = cols
        self._cache: dict[str, np.ndarray] = {}
        self._n = lens.pop()

    def __getattr__(self, name: str) -> np.ndarray:
        if name.startswith("_") or name not in COLUMNS:
            raise AttributeError(name)
        arr = self._cache.get(name)
        if arr is None:
            arr = self._cache[name] = self._cols[name].array()
        return arr

    def __len__(self) -> int:
        return self._n

    def column(self, name: str) -> PackedColumn:
        return self._cols[name]

    @property
    def nbytes(self) -> int:
        """Bytes of the packed record values."""
        return sum(c.nbytes for c in self._cols.values())

    def blocks(self, *names: str) -> Iterator[tuple[int, tuple[np.ndarray, ...]]]:
        """(index of the first record, the columns' values) a block of records at a time, in
        record order; the arrays are read-only and valid until the next block."""
        start = 0
        for vals in zip(*(self._cols[k].pieces() for k in names), strict=True):
            yield start, vals
            start += int(vals[0].shape[0])

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
class RankTimers:
    """Megatron's timer blocks (`--timing-log-level 1|2`, printed by the last rank after each
    logged iteration, megatron/core/timers.py), averaged per iteration over the blocks read.

    `--timing-log-option all` prints every rank's time (`times across ranks (ms):`): `per_rank`
    holds timer -> {rank: mean ms per iteration}. `minmax` (the default) and `max` print only
    the extremes over ranks: `min_max` holds timer -> (mean min or None under `max`, mean max).
    The first block is left out when there are others (it holds start-up: compilation,
    allocator warm-up, NCCL connection set-up)."""

    option: str  # "all" | "minmax" | "max"
    blocks: int  # blocks averaged
    per_rank: Mapping[str, Mapping[int, float]]
    min_max: Mapping[str, tuple[float | None, float]]

    def to_json(self) -> dict[str, Any]:
        return {"option": self.option, "blocks": self.blocks,
                "per_rank": {k: {str(r): v for r, v in ranks.items()}
                             for k, ranks in self.per_rank.items()},
                "min_max": {k: list(v) for k, v in self.min_max.items()}}

    @classmethod
    def from_json(cls, doc: Any) -> RankTimers | None:
        """The inverse of to_json, for a spool record (written by the epilog, so trusted as to
        shape, yet checked: a record that does not read back gives None)."""
        if not isinstance(doc, Mapping) or doc.get("option") not in ("all", "minmax", "max"):
            return None
        try:
            per_rank = {str(k): {int(r): float(v) for r, v in ranks.items()}
                        for k, ranks in (doc.get("per_rank") or {}).items()}
            min_max = {str(k): (None if v[0] is None else float(v[0]), float(v[1]))
                       for k, v in (doc.get("min_max") or {}).items()}
            return cls(doc["option"], int(doc.get("blocks") or 0), per_rank, min_max)
        except (TypeError, ValueError, AttributeError, IndexError):
            return None


@dataclass(frozen=True, slots=True)
class MemoryPeaks:
    """Megatron's GPU memory reports (`accounting.memreport`), per rank the maxima in MiB:
    rank -> (max allocated, max reserved, total device memory used or None, PyTorch's
    allocator retries or None: Megatron-Bridge prints them)."""

    per_rank: Mapping[int, tuple[float, float, float | None, int | None]]

    def for_record(self, n_gpus: int | None) -> dict[str, Any] | None:
        """What a job's record keeps: the figures of the rank that held the most (device memory
        used where every rank printed it, else PyTorch's reserved), only of ranks Slurm gave
        the job (`n_gpus`; None: all). `cached_mib` is PyTorch's cache and fragmentation
        (reserved - allocated), `outside_torch_mib` what the process held beyond PyTorch's
        allocator (device used - reserved: CUDA context, NCCL buffers), both on that rank."""
        ranks = {r: v for r, v in self.per_rank.items() if n_gpus is None or r < n_gpus}
        if not ranks:
            return None
        with_used = all(v[2] is not None for v in ranks.values())

        def held(item: tuple[int, tuple[float, float, float | None, int | None]]
                 ) -> tuple[float, int]:
            rank, (_, reserved, used, _) = item
            return (used if with_used and used is not None else reserved, -rank)

        rank, (alloc, reserved, used, _) = max(ranks.items(), key=held)
        if not with_used:
            used = None
        retries = [v[3] for v in ranks.values() if v[3] is not None]
        return {"ranks": len(ranks), "rank": rank, "max_allocated_mib": alloc,
                "max_reserved_mib": reserved, "device_used_mib": used,
                "cached_mib": reserved - alloc,
                "outside_torch_mib": None if used is None else max(0.0, used - reserved),
                "peak_allocated_mib": max(v[0] for v in ranks.values()),
                "alloc_retries": max(retries) if retries else None}


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
    rank_timers: RankTimers | None = None  # Megatron's timer blocks, when the log has them
    memory: MemoryPeaks | None = None  # Megatron's memory reports, when the log has them

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
            "rank_timers": self.rank_timers.to_json() if self.rank_timers else None,
            "memory": self.memory.for_record(None) if self.memory else None,
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
