"""The monitor's `nvidia-smi` sampler: per-GPU running figures and bounded, downsampled series.

`slurmpod hook monitor` calls `Sampler.sample()` once per interval on the batch host. Memory
stays bounded whatever the job's length: per GPU a handful of running sums, and series of at
most `2 × MAX_SERIES_POINTS` points; when full, neighbouring points are averaged in pairs (the
bucket doubles), so the series always spans the whole job evenly. A sample that fails (tool
missing, timed out, garbage) adds nothing: the figures stay those of the samples that worked.

Energy: NVML's counter (`total_energy_consumption`, mJ) when the driver gives it (its increase
over the job; a counter that goes back, a driver reload, restarts the sum), else power × time
between consecutive samples (trapezoids), `energy_src` saying which.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from slurmpod.telemetry import nvidia_smi
from slurmpod.telemetry.schema import MAX_SERIES_KEYS, MAX_SERIES_POINTS
from slurmpod.telemetry.stats import GpuStat, Telemetry

SERIES = ("util", "power_w", "mem_gib")


@dataclass
class _Acc:
    n: int = 0
    sums: dict[str, float] = field(default_factory=dict)
    counts: dict[str, int] = field(default_factory=dict)
    maxes: dict[str, float] = field(default_factory=dict)
    uuid: str | None = None
    energy_j: float = 0.0
    energy_ok: bool = True  # every interval had a counter reading or two power readings
    last_t: float | None = None
    last_power: float | None = None
    last_mj: float | None = None
    mem_total: float | None = None

    def add(self, name: str, v: float | None, *, mean: bool = True, mx: bool = False) -> None:
        if v is None:
            return
        if mean:
            self.sums[name] = self.sums.get(name, 0.0) + v
            self.counts[name] = self.counts.get(name, 0) + 1
        if mx:
            self.maxes[name] = max(self.maxes.get(name, v), v)

    def mean(self, name: str) -> float | None:
        c = self.counts.get(name, 0)
        return self.sums[name] / c if c else None


@dataclass
class Sampler:
    """Samples the job's GPUs on this node. `run(argv, timeout) -> (rc, out, err)`."""

    run: nvidia_smi.Run
    node: str = ""
    ids: Sequence[int] | None = None
    timeout_s: float = 10.0
    now: Callable[[], float] = time.time
    max_points: int = MAX_SERIES_POINTS
    accs: dict[int, _Acc] = field(default_factory=dict)
    t: list[float] = field(default_factory=list)
    rows: dict[str, list[list[float | None]]] = field(default_factory=dict)  # name -> [[per t]]
    weights: list[int] = field(default_factory=list)
    first_t: float | None = None
    last_t: float | None = None
    samples: int = 0
    failures: int = 0
    with_energy: bool = True
    energy_counter: bool = False

    def sample(self) -> bool:
        """One sample of every GPU; False when nothing was measured this time."""
        try:
            got, self.with_energy = nvidia_smi.query(self.run, self.ids, timeout_s=self.timeout_s,
                                                     with_energy=self.with_energy)
        except Exception:  # a bug in a tool's output handling must not stop the monitor
            got = []
        if self.ids:
            got = [s for s in got if s.index in set(self.ids)]
        if not got:
            self.failures += 1
            return False
        t = self.now()
        self.first_t = t if self.first_t is None else self.first_t
        self.last_t = t
        self.samples += 1
        for s in got:
            acc = self.accs.setdefault(s.index, _Acc())
            self._accumulate(acc, s, t)
        self._append(t, got)
        return True

    def _accumulate(self, acc: _Acc, s: nvidia_smi.Sample, t: float) -> None:
        acc.n += 1
        acc.uuid = acc.uuid or s.uuid
        acc.add("util", s.util)
        acc.add("mem_util", s.mem_util)
        acc.add("power_w", s.power_w, mx=True)
        acc.add("mem_gib", s.mem_gib, mean=False, mx=True)
        acc.add("temp_c", s.temp_c, mean=False, mx=True)
        acc.add("sm_mhz", s.sm_mhz)
        acc.add("mem_mhz", s.mem_mhz)
        acc.mem_total = s.mem_total_gib or acc.mem_total
        if acc.last_t is not None:
            dt = t - acc.last_t
            if s.energy_mj is not None and acc.last_mj is not None and s.energy_mj >= acc.last_mj:
                acc.energy_j += (s.energy_mj - acc.last_mj) / 1000.0
                self.energy_counter = True
            elif s.power_w is not None and acc.last_power is not None and dt > 0:
                acc.energy_j += (s.power_w + acc.last_power) / 2 * dt
            else:
                acc.energy_ok = False
        acc.last_t, acc.last_power, acc.last_mj = t, s.power_w, s.energy_mj

    def _append(self, t: float, got: list[nvidia_smi.Sample]) -> None:
        by = {s.index: s for s in got}
        keys = sorted(self.accs)[:MAX_SERIES_KEYS]
        for name in SERIES:
            table = self.rows.setdefault(name, [])
            while len(table) < len(keys):  # a GPU seen for the first time: pad its past
                table.append([None] * len(self.t))
            for row, k in zip(table, keys, strict=False):
                s = by.get(k)
                row.append(None if s is None else getattr(s, name))
        self.t.append(t)
        self.weights.append(1)
        if len(self.t) >= 2 * self.max_points:
            self._halve()

    def _halve(self) -> None:
        def pair(a: float | None, b: float | None, wa: int, wb: int) -> float | None:
            if a is None or b is None:
                return a if b is None else b
            return (a * wa + b * wb) / (wa + wb)

        n = len(self.t) // 2 * 2
        w = self.weights
        self.t = [pair(self.t[i], self.t[i + 1], w[i], w[i + 1]) or 0.0
                  for i in range(0, n, 2)] + self.t[n:]
        for table in self.rows.values():
            for j, row in enumerate(table):
                table[j] = [pair(row[i], row[i + 1], w[i], w[i + 1])
                            for i in range(0, n, 2)] + row[n:]
        self.weights = [w[i] + w[i + 1] for i in range(0, n, 2)] + w[n:]

    def telemetry(self) -> Telemetry | None:
        if not self.accs or self.first_t is None or self.last_t is None:
            return None
        span = self.last_t - self.first_t
        gpus = []
        energy_ok = span > 0
        for idx, a in sorted(self.accs.items()):
            energy_ok = energy_ok and a.energy_ok and a.n >= 2
            gpus.append(GpuStat(
                node=self.node, index=idx, uuid=a.uuid, util=a.mean("util"),
                mem_util=a.mean("mem_util"), mem_gib=a.maxes.get("mem_gib"),
                mem_total_gib=a.mem_total, power_w=a.mean("power_w"),
                power_max_w=a.maxes.get("power_w"), energy_j=a.energy_j if a.n >= 2 else None,
                temp_max_c=a.maxes.get("temp_c"), sm_mhz=a.mean("sm_mhz"),
                mem_mhz=a.mean("mem_mhz"), span_s=span))
        if not energy_ok:
            for g in gpus:
                g.energy_j = None
        return Telemetry("nvidia-smi", "job", gpus, span_s=span, samples=self.samples,
                         energy_src=("counter" if self.energy_counter else "integrated")
                         if energy_ok else None,
                         series=self.series())

    def series(self) -> dict[str, Any] | None:
        if not self.t:
            return None
        keys = [f"{self.node}:{k}" for k in sorted(self.accs)[:MAX_SERIES_KEYS]]
        out: dict[str, Any] = {"t": [round(x, 1) for x in self.t], "keys": keys}
        for name in SERIES:
            out[name] = [[None if v is None else round(v, 2) for v in row]
                         for row in self.rows.get(name, [])]
        return out


def job_gpu_ids(env: dict[str, str] | Any) -> list[int] | None:
    """The job's GPUs on this node as nvidia-smi numbers them: `SLURM_JOB_GPUS` (Slurm's global
    indices, 20.11+; also `SLURM_STEP_GPUS`), else None (every GPU nvidia-smi lists)."""
    for name in ("SLURM_JOB_GPUS", "SLURM_STEP_GPUS"):
        text = env.get(name) or ""
        parts = [p.strip() for p in text.split(",") if p.strip()]
        if parts and all(p.isdigit() and len(p) <= 4 for p in parts):
            return sorted({int(p) for p in parts})
    return None
