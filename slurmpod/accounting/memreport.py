"""Megatron's GPU memory reports in a log, per rank: what the site's GPUs really held.

Megatron-LM prints, from every data-parallel rank 0, after the first logged iteration (again
after the second when the optimizer state was built then, every `--log-memory-interval`, and
around checkpoint saves), `report_memory` in megatron/training/utils.py (common_utils.py on
main):

    [Rank 5] (after 10 iterations) memory (MB) | allocated: 61234.5 | max allocated: 70123.25 |
    reserved: 72000.0 | max reserved: 74016.0

(one line), with ` | total device memory used: T` appended under `--log-device-memory-used`
(main since 2026-01: `torch.cuda.device_memory_used`, NVML's figure, which also holds the CUDA
context and NCCL's buffers). Values are MiB (`/ 1024 / 1024`); releases up to core_r0.13 print
Python's full float, later ones two decimals. `allocated` is what PyTorch's tensors hold,
`reserved` what its caching allocator holds (the difference is its cache and fragmentation).

Megatron-Bridge (NeMo 2's trainer, and NVIDIA's published performance runs) prints its own
form since 2025-10 (training/utils/train_utils.py `report_memory`, `MEMORY_KEYS`), in GB
(1e9 bytes) rounded to 5 significant digits, with PyTorch's allocator retries:

    [Rank 5] (after 10 iterations) memory (GB) | mem-allocated-gigabytes: 61.235 |
    mem-active-gigabytes: ... | mem-inactive-gigabytes: ... | mem-reserved-gigabytes: 72.0 |
    mem-max-allocated-gigabytes: 70.123 | mem-max-active-gigabytes: ... |
    mem-max-inactive-gigabytes: ... | mem-max-reserved-gigabytes: 74.016 |
    mem-alloc-retires: 0 | mem-allocated-count: 51234

(`mem-alloc-retires` is Bridge's spelling: cudaMalloc calls that failed and made PyTorch free
its cache and retry, a run at its memory limit).

Log text is job-controlled: a line that is not exactly one of these shapes, a value that is not
a plain decimal or above `MAX_MIB`, or `allocated` above `reserved`, is not read; at most
`MAX_RANKS` ranks are kept. What a report may decide (`slurmpod calibrate`'s memory reserve) is
further bounded by the site's HBM and taken over many jobs (perf/reserve.py).
"""

from __future__ import annotations

import math
import re
from typing import NamedTuple, TypeVar

from slurmpod.accounting.logrecords import MemoryPeaks

T = TypeVar("T", int, float)

# Both forms: `(after N iterations) memory (MB) | ...` and `... memory (GB) | ...`.
MARKER = b") memory ("

# No GPU holds 16 TiB; a larger figure is not a measurement.
MAX_MIB = float(1 << 24)
# Data-parallel rank 0 of every model-parallel rank prints: world / DP lines per report.
MAX_RANKS = 1 << 16
MAX_RANK = 1 << 20
MAX_RETRIES = 1 << 40

_NUM = rb"(\d{1,9}(?:\.\d{1,17})?)"
_HEAD = rb"\[Rank (\d{1,7})\] \(([^()\n]{1,80})\) memory "
_MB_LINE = re.compile(
    _HEAD + rb"\(MB\) \| allocated: " + _NUM
    + rb" \| max allocated: " + _NUM + rb" \| reserved: " + _NUM + rb" \| max reserved: "
    + _NUM + rb"(?: \| total device memory used: " + _NUM + rb")?[ \t\r]*$")
# Bridge: `| key: value` pairs; a float's repr may end in an exponent (5 significant digits of
# a tiny figure: 1.2346e-05).
_GB_LINE = re.compile(_HEAD + rb"\(GB\)((?: \| [a-z-]{1,40}: \d{1,15}(?:\.\d{1,17})?(?:e-\d\d)?)"
                      rb"{1,16})[ \t\r]*$")
_GB_PAIR = re.compile(rb" \| ([a-z-]{1,40}): ([0-9.e-]{1,40})")
_GB_KEYS = {b"mem-allocated-gigabytes": 0, b"mem-max-allocated-gigabytes": 1,
            b"mem-reserved-gigabytes": 2, b"mem-max-reserved-gigabytes": 3}
_MIB_PER_GB = 1e9 / (1 << 20)

# A fresh run's first iteration creates the optimizer's states at its very end, after its
# activations were freed into PyTorch's cache: its report's peak is the optimizer step, and the
# cached activations read as allocator overhead. Megatron main reports again after the second
# iteration for that reason; older releases report once, after the first logged iteration, which
# is iteration 1 only with `--log-interval 1` (Megatron-LM issue 756: 7.1 GiB "reserved" over
# "max allocated" on an H100, the activations' blocks). Such a report is not read.
_FIRST_ITERATION = b"after 1 iterations"


class Report(NamedTuple):
    """One report line, MiB: the figures the record keeps."""

    rank: int
    max_allocated: float
    max_reserved: float
    device_used: float | None
    alloc_retries: int | None  # Megatron-Bridge only


def _gb_figures(pairs: bytes) -> tuple[list[float], int | None] | None:
    """Bridge's pairs -> (allocated, max allocated, reserved, max reserved) MiB, retries."""
    got: list[float | None] = [None] * 4
    retries: int | None = None
    for key, value in _GB_PAIR.findall(pairs):
        if key in _GB_KEYS:
            try:
                got[_GB_KEYS[key]] = float(value) * _MIB_PER_GB
            except ValueError:
                return None
        elif key == b"mem-alloc-retires":
            if not value.isdigit() or int(value) > MAX_RETRIES:
                return None
            retries = int(value)
    if any(v is None for v in got):
        return None
    return [v for v in got if v is not None], retries


def parse_line(line: bytes) -> Report | None:
    """One report line (either form); None when the line is not one of Megatron's shapes, is a
    first iteration's, or its figures cannot be real."""
    m = _MB_LINE.search(line)
    retries: int | None = None
    if m is not None:
        values = [float(m.group(i)) for i in range(3, 7)]
        used = float(m.group(7)) if m.group(7) is not None else None
    else:
        m = _GB_LINE.search(line)
        gb = _gb_figures(m.group(3)) if m is not None else None
        if m is None or gb is None:
            return None
        values, retries = gb
        used = None
    if m.group(2) == _FIRST_ITERATION:
        return None
    rank = int(m.group(1))
    alloc, max_alloc, reserved, max_reserved = values
    if (rank >= MAX_RANK
            or any(not math.isfinite(v) or v > MAX_MIB for v in (*values, used or 0.0))
            or alloc > reserved or max_alloc > max_reserved or alloc > max_alloc
            or reserved > max_reserved):
        return None
    return Report(rank, max_alloc, max_reserved, used, retries)


class MemoryReports:
    """Per-rank maxima over the log's reports (`add` each parsed line, `freeze`)."""

    def __init__(self) -> None:
        self._ranks: dict[int, tuple[float, float, float | None, int | None]] = {}

    def add(self, line: bytes) -> bool:
        got = parse_line(line)
        if got is None:
            return False
        old = self._ranks.get(got.rank)
        if old is None:
            if len(self._ranks) >= MAX_RANKS:
                return False
            self._ranks[got.rank] = got[1:]
            return True
        self._ranks[got.rank] = (max(old[0], got.max_allocated),
                                 max(old[1], got.max_reserved),
                                 _max_opt(old[2], got.device_used),
                                 _max_opt(old[3], got.alloc_retries))
        return True

    def freeze(self) -> MemoryPeaks | None:
        return MemoryPeaks(dict(self._ranks)) if self._ranks else None


def _max_opt(a: T | None, b: T | None) -> T | None:
    if a is None:
        return b
    return a if b is None or a >= b else b


__all__ = ["MARKER", "MAX_MIB", "MAX_RANKS", "MemoryReports", "Report", "parse_line"]
