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

Log text is job-controlled: a line that is not exactly this shape, a value that is not a plain
decimal or above `MAX_MIB`, or `allocated` above `reserved`, is not read; at most `MAX_RANKS`
ranks are kept. What a report may decide (`slurmpod calibrate`'s memory reserve) is further
bounded by the site's HBM and taken over many jobs (perf/calibrate.py).
"""

from __future__ import annotations

import math
import re

from slurmpod.accounting.logrecords import MemoryPeaks

MARKER = b" memory (MB) | allocated: "

# No GPU holds 16 TiB; a larger figure is not a measurement.
MAX_MIB = float(1 << 24)
# Data-parallel rank 0 of every model-parallel rank prints: world / DP lines per report.
MAX_RANKS = 1 << 16
MAX_RANK = 1 << 20

_NUM = rb"(\d{1,9}(?:\.\d{1,17})?)"
_LINE = re.compile(
    rb"\[Rank (\d{1,7})\] \(([^()\n]{1,80})\) memory \(MB\) \| allocated: " + _NUM
    + rb" \| max allocated: " + _NUM + rb" \| reserved: " + _NUM + rb" \| max reserved: "
    + _NUM + rb"(?: \| total device memory used: " + _NUM + rb")?[ \t\r]*$")


# A fresh run's first iteration creates the optimizer's states at its very end, after its
# activations were freed into PyTorch's cache: its report's peak is the optimizer step, and the
# cached activations read as allocator overhead. Megatron main reports again after the second
# iteration for that reason; older releases report once, after the first logged iteration, which
# is iteration 1 only with `--log-interval 1` (Megatron-LM issue 756: 7.1 GiB "reserved" over
# "max allocated" on an H100, the activations' blocks). Such a report is not read.
_FIRST_ITERATION = b"after 1 iterations"


def parse_line(line: bytes) -> tuple[int, float, float, float | None] | None:
    """One report line -> (rank, max allocated, max reserved, device used or None) in MiB;
    None when the line is not Megatron's shape or its figures cannot be real."""
    m = _LINE.search(line)
    if m is None or m.group(2) == _FIRST_ITERATION:
        return None
    rank = int(m.group(1))
    alloc, max_alloc, reserved, max_reserved = (float(m.group(i)) for i in range(3, 7))
    used = float(m.group(7)) if m.group(7) is not None else None
    values = (alloc, max_alloc, reserved, max_reserved) + ((used,) if used is not None else ())
    if (rank >= MAX_RANK or any(not math.isfinite(v) or v > MAX_MIB for v in values)
            or alloc > reserved or max_alloc > max_reserved or alloc > max_alloc
            or reserved > max_reserved):
        return None
    return rank, max_alloc, max_reserved, used


class MemoryReports:
    """Per-rank maxima over the log's reports (`add` each parsed line, `freeze`)."""

    def __init__(self) -> None:
        self._ranks: dict[int, tuple[float, float, float | None]] = {}

    def add(self, line: bytes) -> bool:
        got = parse_line(line)
        if got is None:
            return False
        rank, max_alloc, max_reserved, used = got
        old = self._ranks.get(rank)
        if old is None:
            if len(self._ranks) >= MAX_RANKS:
                return False
            self._ranks[rank] = (max_alloc, max_reserved, used)
            return True
        old_used = old[2]
        if used is None or (old_used is not None and old_used > used):
            used = old_used
        self._ranks[rank] = (max(old[0], max_alloc), max(old[1], max_reserved), used)
        return True

    def freeze(self) -> MemoryPeaks | None:
        return MemoryPeaks(dict(self._ranks)) if self._ranks else None


__all__ = ["MARKER", "MAX_MIB", "MAX_RANKS", "MemoryReports", "parse_line"]
