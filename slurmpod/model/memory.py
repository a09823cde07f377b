"""A job record's GPU memory read back: the figures of Megatron's memory reports that the epilog
keeps (`accounting.logrecords.MemoryPeaks.for_record`), checked once for every reader (the job
report, `slurmpod mfu`, `slurmpod calibrate`). They are job text, so nothing is taken unchecked.
Pure."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

MIB_PER_GIB = 1024.0


@dataclass(frozen=True, slots=True)
class RecordedMemory:
    """A record's `memory`, in GiB, as `from_record` let it through: finite, non-negative,
    allocated <= reserved, a rank, and none above the HBM of the job's GPUs where known."""

    rank: int
    ranks: int | None  # ranks that printed a report
    max_allocated_gib: float
    max_reserved_gib: float
    device_used_gib: float | None  # `--log-device-memory-used` (NVML's figure)
    alloc_retries: int | None  # PyTorch's allocator retries (Megatron-Bridge prints them)

    @classmethod
    def from_record(cls, doc: Mapping[str, Any], hbm_gib: float | None
                    ) -> RecordedMemory | None:
        """`doc` checked (against `hbm_gib` when given); None when any figure is not one a
        GPU can have."""
        alloc, reserved = _gib_of(doc, "max_allocated_mib"), _gib_of(doc, "max_reserved_mib")
        used = _gib_of(doc, "device_used_mib") if doc.get("device_used_mib") is not None else None
        rank, ranks, retries = (_count(doc.get(k)) for k in ("rank", "ranks", "alloc_retries"))
        if (alloc is None or reserved is None or alloc > reserved or rank is None
                or (doc.get("device_used_mib") is not None and used is None)):
            return None
        if hbm_gib is not None and (reserved > hbm_gib or (used is not None and used > hbm_gib)):
            return None
        return cls(rank, ranks, alloc, reserved, used, retries)


def _gib_of(doc: Mapping[str, Any], key: str) -> float | None:
    """A MiB figure of `doc` in GiB; None when absent or not a real figure."""
    v = doc.get(key)
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) or v < 0:
        return None
    return float(v) / MIB_PER_GIB


def _count(v: Any) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) and v >= 0 else None


__all__ = ["MIB_PER_GIB", "RecordedMemory"]
