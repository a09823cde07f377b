"""Megatron's timer blocks in a job log, summed per rank as the log streams by.

With `--timing-log-level 1|2` the last rank prints, after each logged iteration line, the
timers of the interval averaged per iteration (megatron/core/timers.py `Timers.log`, called by
`training_log` with `normalizer=log_interval`), in one of three shapes (`--timing-log-option`):

    (min, max) time across ranks (ms):                    minmax, the default
        forward-backward ...............................: (1234.56, 1240.12)
    max time across ranks (ms):                            max
        forward-backward ...............................: 1240.12
    times across ranks (ms):                               all
      forward-backward:
         rank  0: 1234.56

A save prints its own block with only `save-checkpoint` (read by the parser's checkpoint
code); those entries are not training timers and are left out here.

The text is the job's: names are Megatron's shape (`[A-Za-z][A-Za-z0-9_.-]{0,63}`, at most
`MAX_TIMERS` of them), ranks below `MAX_RANK`, values finite and non-negative; anything else
ends the block. Per-rank sums live in numpy arrays (12 bytes per rank and timer), so a
16,384-rank job logging 20 timers keeps ~4 MB whatever the log's length.
"""

from __future__ import annotations

import re

import numpy as np

from slurmpod.accounting.logrecords import RankTimers

MARKER = b"across ranks (ms):"
# A rank's own compute (Megatron's Timer synchronises CUDA at start and stop), the timers that
# can name a straggler; the only ones a spool record keeps per rank (`for_record`).
COMPUTE_TIMERS = ("forward-compute", "backward-compute")
MAX_TIMERS = 64
MAX_RANK = 1 << 20
# Per-rank cells (timer x rank) one set of sums may hold, 12 bytes each: every timer of a
# 16,384-rank job with 64 timers; a log naming rank 2^20 - 1 under many timers (job text)
# fills it with the first and the later ones are not kept per rank, instead of costing GBs.
MAX_CELLS = 1 << 20

_HEADER = re.compile(rb"(\(min, max\) time|max time|times) across ranks \(ms\):[ \t]*$")
_OPTION = {b"(min, max) time": "minmax", b"max time": "max", b"times": "all"}
# One line of a block, after an optional launcher prefix (`srun --label`'s `15: `, torchrun's
# `[default3]:`, torch's `[rank3]:`): an `all` rank line, an `all` timer name, or a minmax/max
# entry (`(name + ' ').ljust(48, '.')`, so a name of 48+ characters has no dots).
_PREFIX = rb"[ \t]*(?:\d{1,7}: ?)?(?:\[default\d{1,7}\]:)?(?:\[rank\d{1,7}\]:)?[ \t]+"
_MS = rb"\d{1,12}(?:\.\d{1,9})?"
_PREFIX_RE = re.compile(_PREFIX)
_LINE = re.compile(
    rb"[ \t]*(?:\d{1,7}: ?)?(?:\[default\d{1,7}\]:)?(?:\[rank\d{1,7}\]:)?[ \t]+"
    rb"(?:rank +(\d{1,7}): (\d{1,12}(?:\.\d{1,9})?)"
    rb"|([A-Za-z][A-Za-z0-9_.\-]{0,63})(?::|(?: \.*)?: (?:\((\d{1,12}(?:\.\d{1,9})?), "
    rb"(\d{1,12}(?:\.\d{1,9})?)\)|(\d{1,12}(?:\.\d{1,9})?))))[ \t]*\r?")


def header_option(line: bytes) -> str | None:
    """The `--timing-log-option` a block header line names, or None when it is not one."""
    m = _HEADER.search(line)
    return _OPTION[m.group(1)] if m else None


class _Sums:
    """Per timer: per-rank sums and counts (`all`), or sums of min and max (minmax/max)."""

    def __init__(self) -> None:
        self.blocks = 0
        self.rank_sum: dict[str, np.ndarray] = {}
        self.rank_n: dict[str, np.ndarray] = {}
        self.mm: dict[str, list[float]] = {}  # timer -> [sum of min, sum of max, n, n with min]
        self.cells = 0  # per-rank cells held (MAX_CELLS)

    def _arrays(self, name: str, top: int) -> tuple[np.ndarray, np.ndarray] | None:
        """The timer's per-rank sums and counts, grown to hold rank `top`; None for a timer
        past MAX_TIMERS."""
        s = self.rank_sum.get(name)
        if s is None:
            if len(self.rank_sum) >= MAX_TIMERS or self.cells + 64 > MAX_CELLS:
                return None
            s = self.rank_sum[name] = np.zeros(64)
            self.rank_n[name] = np.zeros(64, dtype=np.int32)
            self.cells += 64
        if top >= s.shape[0]:
            size = max(top + 1, 2 * s.shape[0])
            if self.cells + size - s.shape[0] > MAX_CELLS:
                size = top + 1  # no doubling near the budget
                if self.cells + size - s.shape[0] > MAX_CELLS:
                    return None
            self.cells += size - s.shape[0]
            self.rank_sum[name] = s = np.concatenate([s, np.zeros(size - s.shape[0])])
            n = self.rank_n[name]
            self.rank_n[name] = np.concatenate([n, np.zeros(size - n.shape[0], np.int32)])
        return s, self.rank_n[name]

    def add_rank(self, name: str, rank: int, ms: float) -> None:
        arrays = self._arrays(name, rank)
        if arrays is not None:
            arrays[0][rank] += ms
            arrays[1][rank] += 1

    def add_ranks(self, name: str, ranks: np.ndarray, ms: np.ndarray) -> None:
        """`add_rank` for a run of lines (ranks below MAX_RANK)."""
        arrays = self._arrays(name, int(ranks.max()))
        if arrays is not None:
            np.add.at(arrays[0], ranks, ms)
            np.add.at(arrays[1], ranks, 1)

    def add_min_max(self, name: str, lo: float | None, hi: float) -> None:
        v = self.mm.get(name)
        if v is None:
            if len(self.mm) >= MAX_TIMERS:
                return
            v = self.mm[name] = [0.0, 0.0, 0, 0]
        if lo is not None:
            v[0] += lo
            v[3] += 1
        v[1] += hi
        v[2] += 1

    def freeze(self, option: str) -> RankTimers:
        per_rank = {}
        for name, s in self.rank_sum.items():
            n = self.rank_n[name]
            have = np.flatnonzero(n)
            per_rank[name] = {int(r): float(s[r] / n[r]) for r in have}
        min_max = {name: (v[0] / v[3] if v[3] else None, v[1] / v[2])
                   for name, v in self.mm.items() if v[2]}
        return RankTimers(option, self.blocks, per_rank, min_max)


class TimerBlocks:
    """The timer blocks of one log: `start(option, segment)` at a header, then `line(...)` for
    each following line until it returns False (the block ended), `freeze()` for the summary."""

    def __init__(self) -> None:
        self.option: str | None = None  # the option of the first block with training timers
        self.open = False  # inside a block
        self._block_option = ""  # the option of the open block
        self._warm = _Sums()  # the first block of each launch (start-up)
        self._steady = _Sums()
        self._segments_seen: set[int] = set()
        self._segment = 0
        self._sums: _Sums | None = None  # where this block's entries go (None: not yet known)
        self._name: str | None = None  # `all`: the timer whose rank lines follow
        self._runs: dict[bytes, re.Pattern[bytes]] = {}  # line prefix -> its rank-run regex

    def start(self, option: str, segment: int) -> None:
        self._block_option, self.open = option, True
        self._segment, self._sums, self._name = segment, None, None

    def _target(self) -> _Sums | None:
        """Where the open block's training entries go; None (the block is closed) when its
        option is not the one of the earlier blocks (not comparable: the first kept). A save's
        block (`save-checkpoint` only) never gets here, so it fixes no option."""
        if self.option is None:
            self.option = self._block_option
        elif self._block_option != self.option:
            self.open = False
            return None
        if self._sums is None:  # the first training entry: is this block a launch's first?
            first = self._segment not in self._segments_seen
            self._segments_seen.add(self._segment)
            self._sums = self._warm if first else self._steady
            self._sums.blocks += 1
        return self._sums

    def rank_run(self, data: bytes, pos: int, end: int) -> int:
        """Read the rank lines of an `all` block's timer from pos in one go (a 1,024-rank block
        is 3,000 of them per logged iteration); returns where they stop. pos when there are
        none, or when one names a rank of MAX_RANK or more: the lines are then read one by
        one, which ends the block there. The run is every following line with the first one's
        prefix (one rank prints the block, so one launcher label) and Megatron's shape, checked
        by one regex; its numbers are then cut out with split and read by numpy."""
        if self._block_option != "all" or self._name is None:
            return pos
        q = data.find(b"rank ", pos, min(end, pos + 64))
        if q < 0:
            return pos
        prefix = data[pos:q]
        run = self._runs.get(prefix)
        if run is None:
            if len(self._runs) >= 8 or not _PREFIX_RE.fullmatch(prefix):
                return pos
            run = self._runs[prefix] = re.compile(
                rb"(?:" + re.escape(prefix) + rb"rank +\d{1,7}: " + _MS + rb"[ \t]*\r?\n)+")
        m = run.match(data, pos, end)
        if m is None:
            return pos
        toks = data[pos:m.end()].split()
        k = len(prefix.split())
        ranks = np.array(b" ".join(toks[k + 1::k + 3]).replace(b":", b"").split(), dtype=np.int64)
        if int(np.max(ranks)) >= MAX_RANK:
            return pos
        if not self._name.startswith("save-checkpoint") and (t := self._target()):
            t.add_ranks(self._name, ranks,
                        np.fromstring(b" ".join(toks[k + 2::k + 3]), dtype=np.float64, sep=" "))
        return m.end() if self.open else pos

    def line(self, data: bytes, pos: int, nl: int) -> bool:
        """Read data[pos:nl] as a line of the open block; False when it is not one (the block
        ended before it)."""
        m = _LINE.fullmatch(data, pos, nl)
        if m is None:
            self.open = False
            return False
        rank, value, name, lo, hi, single = m.groups()
        if rank is not None:
            r = int(rank)
            if self._block_option != "all" or self._name is None or r >= MAX_RANK:
                self.open = False
                return False
            if not self._name.startswith("save-checkpoint") and (t := self._target()):
                t.add_rank(self._name, r, float(value))
            return self.open
        assert name is not None
        key = name.decode("ascii")
        if lo is None and hi is None and single is None:  # `all`: a timer name line
            if self._block_option != "all":
                self.open = False
                return False
            self._name = key
            return True
        if self._block_option == "all":  # a minmax/max entry cannot be part of an `all` block
            self.open = False
            return False
        if not key.startswith("save-checkpoint") and (t := self._target()):
            t.add_min_max(key, float(lo) if lo is not None else None,
                          float(hi if hi is not None else single))
        return self.open

    def freeze(self) -> RankTimers | None:
        """Steady blocks when there are any, else the start-up ones; None without blocks."""
        if self.option is None:
            return None
        sums = self._steady if self._steady.blocks else self._warm
        return sums.freeze(self.option) if sums.blocks else None


def for_record(t: RankTimers | None, world: int) -> RankTimers | None:
    """What a spool record keeps: every timer's min/max, and per rank only `COMPUTE_TIMERS`
    of the ranks below `world` (the job's GPUs as Slurm counts them: the log may name any
    rank), to 0.01 ms as Megatron prints them (a 16,384-rank job: ~0.5 MB)."""
    if t is None:
        return None
    per_rank = {k: {r: round(v, 2) for r, v in t.per_rank[k].items() if r < world}
                for k in COMPUTE_TIMERS if k in t.per_rank}
    min_max = {k: (None if lo is None else round(lo, 2), round(hi, 2))
               for k, (lo, hi) in t.min_max.items()}
    return RankTimers(t.option, t.blocks, per_rank, min_max)
