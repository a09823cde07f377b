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

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from slurmpod.errors import SlurmpodError
from slurmpod.model.memory import RecordedMemory

if TYPE_CHECKING:
    from slurmpod.model.site import Site


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
        est = ("" if self.estimate_gib is None else
               f"; slurmpod's estimate {gib_text(self.estimate_gib)} GiB (allocated / "
               f"estimate {self.vs_estimate:.2f})")
        return (peaks_text(self.rank, self.max_allocated_gib, self.max_reserved_gib,
                           self.device_used_gib)
                + f", of {self.hbm_gib:g} GiB ({self.held_gib / self.hbm_gib:.0%}){est}"
                + retries_text(self.alloc_retries))


def peaks_text(rank: int, allocated_gib: float, reserved_gib: float,
               device_used_gib: float | None) -> str:
    """A memory report's peaks, as the job report and `slurmpod mfu` print them."""
    outside = ("" if device_used_gib is None else
               f", {gib_text(device_used_gib)} GiB on the device")
    return (f"rank {rank} peak {gib_text(allocated_gib)} GiB allocated, "
            f"{gib_text(reserved_gib)} GiB reserved by PyTorch{outside}")


def retries_text(alloc_retries: int | None) -> str:
    return ("" if not alloc_retries else
            f"; {alloc_retries} allocator retries (cudaMalloc failed, PyTorch freed its cache "
            "and retried: at the memory limit)")


def gib_text(x: float) -> str:
    """GiB to one decimal, or 3 significant digits below 10 (a sandbox's emulated GPU holds
    MiB, which one decimal would show as 0.0)."""
    return f"{x:.1f}" if x >= 10 else f"{x:.3g}"


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
    got = RecordedMemory.from_record(mem, hbm)
    if got is None:
        return None
    return JobMemory(got.rank, hbm, got.max_allocated_gib, got.max_reserved_gib,
                     got.device_used_gib, _estimate_gib(args, gpus), got.alloc_retries)


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


__all__ = ["JobMemory", "gib_text", "job_memory", "peaks_text", "retries_text"]
