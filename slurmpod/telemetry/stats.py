"""One GPU's figures from one source, and the job-level summary built from them (pure)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

from slurmpod.telemetry.schema import GPU_V, IDLE_UTIL_PCT, MAX_GPUS_LISTED, clean_gpu_summary


@dataclass
class GpuStat:
    """A GPU's figures over the job (or one sample). None: not measured."""

    node: str = ""
    index: int | None = None
    uuid: str | None = None
    util: float | None = None  # mean %, NVML "a kernel was running"
    sm: float | None = None  # mean % SM active (DCGM profiling)
    tensor: float | None = None  # mean % tensor pipe active (DCGM profiling)
    mem_util: float | None = None
    mem_gib: float | None = None  # max used
    mem_total_gib: float | None = None
    power_w: float | None = None  # mean
    power_max_w: float | None = None
    energy_j: float | None = None
    temp_max_c: float | None = None
    sm_mhz: float | None = None
    mem_mhz: float | None = None
    xid: int | None = None
    xid_codes: tuple[int, ...] = ()
    span_s: float | None = None

    def key(self) -> str:
        return f"{self.node}:{self.index if self.index is not None else self.uuid or '?'}"

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for f in fields(self):
            v = getattr(self, f.name)
            if v is None or v == () or (f.name == "node" and not v):
                continue
            if f.name == "xid_codes":
                v = list(v)
            elif isinstance(v, float):
                v = round(v, 3)
            out[f.name] = v
        return out


def _mean(xs: Iterable[float | None]) -> float | None:
    vals = [x for x in xs if x is not None]
    return sum(vals) / len(vals) if vals else None


def _max(xs: Iterable[float | None]) -> float | None:
    vals = [x for x in xs if x is not None]
    return max(vals) if vals else None


@dataclass
class Telemetry:
    """What one source measured for one job: per-GPU figures and, for sampling sources, series."""

    src: str
    trust: str
    gpus: list[GpuStat] = field(default_factory=list)
    span_s: float | None = None
    samples: int | None = None
    energy_src: str | None = None
    series: dict[str, Any] | None = None

    def summary(self, *, model: str | None = None, max_gpus: int | None = None
                ) -> dict[str, Any] | None:
        """The job-level summary (`schema.GPU_FIELDS`), checked; None if nothing was measured."""
        g = self.gpus
        if not g:
            return None
        utils = [x.util for x in g if x.util is not None]
        xids = [x.xid for x in g if x.xid is not None]
        codes = sorted({c for x in g for c in x.xid_codes})
        energies = [x.energy_j for x in g if x.energy_j is not None]
        doc: dict[str, Any] = {
            "v": GPU_V, "src": self.src, "trust": self.trust, "n": len(g),
            "span_s": self.span_s if self.span_s is not None else _max(x.span_s for x in g),
            "samples": self.samples,
            "util": _mean(utils), "util_min": min(utils) if utils else None,
            "idle_gpus": sum(u < IDLE_UTIL_PCT for u in utils) if utils else None,
            "sm": _mean(x.sm for x in g), "tensor": _mean(x.tensor for x in g),
            "mem_util": _mean(x.mem_util for x in g),
            "mem_gib": _max(x.mem_gib for x in g),
            "mem_total_gib": _max(x.mem_total_gib for x in g),
            "power_w": _mean(x.power_w for x in g),
            "power_max_w": _max(x.power_max_w if x.power_max_w is not None else x.power_w
                                for x in g),
            # all GPUs' energy, only when every GPU has a figure (a partial sum would be wrong)
            "energy_j": sum(energies) if energies and len(energies) == len(g) else None,
            "energy_src": self.energy_src,
            "temp_max_c": _max(x.temp_max_c for x in g),
            "sm_mhz": _mean(x.sm_mhz for x in g), "mem_mhz": _mean(x.mem_mhz for x in g),
            "xid": sum(xids) if xids else None,
            "xid_codes": ":".join(str(c) for c in codes[:8]) if codes else None,
        }
        return clean_gpu_summary({k: v for k, v in doc.items() if v is not None},
                                 model=model, max_gpus=max_gpus)

    def record_part(self) -> dict[str, Any]:
        """`record["gpu"]`: per-GPU figures (at most MAX_GPUS_LISTED) and the series."""
        out: dict[str, Any] = {"gpus": [x.to_json() for x in self.gpus[:MAX_GPUS_LISTED]]}
        if self.series:
            out["series"] = self.series
        return out


def pick_first(candidates: Sequence[Telemetry | None]) -> Telemetry | None:
    """The first source that measured something."""
    for t in candidates:
        if t is not None and t.gpus:
            return t
    return None
