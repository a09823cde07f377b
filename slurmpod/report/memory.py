"""A finished job's GPU memory as Megatron measured it, beside slurmpod's estimate.

The epilog's record keeps Megatron's memory report of the rank that held the most
(`summary.metrics.memory`, accounting/memreport.py). The job report shows it against the HBM
of the job's nodes (the site file's GPU of Slurm's node list) and, when the log has the
arguments dump, against `plan`'s estimate for that model and layout (`peak_memory`: weights,
optimizer and activations of the rank that needs the most), so a user sees how close to the
limit the run was and how far the estimate is from what ran. The figures are job text: a
report claiming more than the GPU holds is not shown. Pure.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from slurmpod.errors import SlurmpodError

if TYPE_CHECKING:
    from slurmpod.model.site import Site

MIB_PER_GIB = 1024.0


@dataclass(frozen=True, slots=True)
class JobMemory:
    rank: int
    hbm_gib: float
    max_allocated_gib: float
    max_reserved_gib: float
    device_used_gib: float | None
    estimate_gib: float | None  # slurmpod's estimate of the rank that needs the most
    # cudaMalloc calls that failed and made PyTorch free its cache and retry (Megatron-Bridge
    # prints them): above 0, the run was at its memory limit and paid for it in time
    alloc_retries: int | None = None

    @property
    def held_gib(self) -> float:
        return self.device_used_gib if self.device_used_gib is not None else self.max_reserved_gib

    @property
    def vs_estimate(self) -> float | None:
        """Peak allocated / estimate (above 1: the estimate was short)."""
        if not self.estimate_gib:
            return None
        return self.max_allocated_gib / self.estimate_gib

    def to_json(self) -> dict[str, Any]:
        return {"rank": self.rank, "hbm_gib": self.hbm_gib,
                "max_allocated_gib": self.max_allocated_gib,
                "max_reserved_gib": self.max_reserved_gib,
                "device_used_gib": self.device_used_gib, "held_fraction": self.held_gib
                / self.hbm_gib, "estimate_gib": self.estimate_gib,
                "vs_estimate": self.vs_estimate, "alloc_retries": self.alloc_retries}

    def line(self) -> str:
        outside = ("" if self.device_used_gib is None else
                   f", {gib_text(self.device_used_gib)} GiB on the device")
        est = ("" if self.estimate_gib is None else
               f"; slurmpod's estimate {gib_text(self.estimate_gib)} GiB (allocated / "
               f"estimate {self.vs_estimate:.2f})")
        retries = ("" if not self.alloc_retries else
                   f"; {self.alloc_retries} allocator retries (cudaMalloc failed, PyTorch "
                   "freed its cache and retried: at the memory limit)")
        return (f"rank {self.rank} peak {gib_text(self.max_allocated_gib)} GiB allocated, "
                f"{gib_text(self.max_reserved_gib)} GiB reserved by PyTorch{outside}, of "
                f"{self.hbm_gib:g} GiB ({self.held_gib / self.hbm_gib:.0%}){est}{retries}")


def gib_text(x: float) -> str:
    """GiB to one decimal, or 3 significant digits below 10 (a sandbox's emulated GPU holds
    MiB, which one decimal would show as 0.0)."""
    return f"{x:.1f}" if x >= 10 else f"{x:.3g}"


def _gib(doc: Mapping[str, Any], key: str) -> float | None:
    v = doc.get(key)
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) or v < 0:
        return None
    return float(v) / MIB_PER_GIB


def job_memory(record: Mapping[str, Any] | None, args: Mapping[str, Any] | None, *,
               site: Site | None, nodelist: str, gpus: int) -> JobMemory | None:
    """The job's measured memory and slurmpod's estimate; None without a report, or on nodes
    the site file does not place, or with figures no GPU of those nodes can have."""
    metrics = ((record or {}).get("summary") or {}).get("metrics") or {}
    mem = metrics.get("memory") if isinstance(metrics, Mapping) else None
    if not isinstance(mem, Mapping) or site is None or not nodelist:
        return None
    from slurmpod.accounting.trusted import site_gpu  # lazy: start-up

    sg = site_gpu(nodelist, site, site.inventory)
    if sg is None:
        return None
    hbm = site.node_types[sg.node_type].gpu.hbm_gib
    alloc, reserved = _gib(mem, "max_allocated_mib"), _gib(mem, "max_reserved_mib")
    used = _gib(mem, "device_used_mib") if mem.get("device_used_mib") is not None else None
    rank, retries = mem.get("rank"), mem.get("alloc_retries")
    if not isinstance(retries, int) or isinstance(retries, bool) or retries < 0:
        retries = None
    if (alloc is None or reserved is None or alloc > reserved or reserved > hbm
            or (used is not None and used > hbm) or isinstance(rank, bool)
            or not isinstance(rank, int) or rank < 0):
        return None
    return JobMemory(rank, hbm, alloc, reserved, used, _estimate_gib(args, gpus), retries)


def _estimate_gib(args: Mapping[str, Any] | None, gpus: int) -> float | None:
    """`plan`'s estimate for the dump's model and layout (None when it cannot be made)."""
    if not args:
        return None
    from slurmpod.megatron.memory import GIB, peak_memory  # lazy: start-up
    from slurmpod.megatron.runspec import ModelConfig  # lazy: start-up
    from slurmpod.megatron.validate import check_dump_args, dump_world  # lazy: start-up

    world = dump_world(args, gpus) if check_dump_args(args) is None else None
    if world is None:
        return None
    try:
        return peak_memory(ModelConfig.from_args(args), world).bytes_per_gpu / GIB
    except (SlurmpodError, ValueError, TypeError, KeyError, ArithmeticError, ZeroDivisionError):
        return None


__all__ = ["JobMemory", "gib_text", "job_memory"]
