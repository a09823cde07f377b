"""GPU telemetry as slurmpod stores it: the one definition the hooks write and the reports read.

A job's GPU figures come from one *source* chosen at run time (`slurmpod.telemetry.sources`):
DCGM job statistics (`dcgmi stats`), a DCGM exporter scraped by Prometheus, Slurm's own
accounting (`sacct` TRESUsage `gres/gpuutil`, `gres/gpumem`, ConsumedEnergyRaw), or
`nvidia-smi` sampled by `slurmpod hook monitor`. Whatever the source, the figures land in two
places of the job's spool record (docs/accounting.md, "The spool"; docs/telemetry.md):

1. `record["summary"]["gpu"]`: the job-level summary below (also in the compact summary that
   fleet reports read, so it stays a few hundred bytes: numbers and short strings only);
2. `record["gpu"]`: per-GPU summaries and bounded, downsampled time series (full record only):

   ```
   {"gpus": [{"node": "gpu001", "index": 0, "uuid": "GPU-…", "util": 91.0, "sm": 63.0,
              "tensor": 31.0, "mem_gib": 71.2, "power_w": 512.0, "energy_j": 1.8e6,
              "temp_max_c": 71, "sm_mhz": 1980, "mem_mhz": 2619, "xid": 0}, …],
    "series": {"t": [epoch s, …], "keys": ["gpu001:0", …],
               "util": [[% per t] per key], "power_w": [[…]], "mem_gib": [[…]]}}
   ```

   At most `MAX_GPUS_LISTED` GPUs are listed; the series has at most `MAX_SERIES_POINTS` points
   (evenly downsampled by averaging neighbours) and at most `MAX_SERIES_KEYS` keys: a job with
   more GPUs gets one key per node (`"gpu001"`, the mean over its GPUs). A `None` in a series
   is a sample that did not measure that GPU.

Job-level summary (`GPU_FIELDS`; every key is optional: **a missing key means "not measured"**,
never zero):

```json
{"v":1,"src":"nvidia-smi","trust":"job","n":8,"span_s":3540,"samples":59,"util":87.5,
 "util_min":80.1,"idle_gpus":0,"mem_util":41.0,"mem_gib":71.2,"mem_total_gib":79.6,
 "power_w":512.3,"power_max_w":688.0,"energy_j":1.45e7,"energy_src":"counter","temp_max_c":78,
 "sm_mhz":1980,"mem_mhz":2619,"xid":0}
```

`trust` says who measured: `site` (the epilog read it from the site's DCGM, Prometheus or
Slurm: the job cannot touch it) or `job` (the job's own `slurmpod hook monitor`, through the
job's Comment: the job could have written anything there, so it is only shown for that job,
range-checked, never used to judge another job). Every value passes `clean_gpu_summary`, which
drops (never clamps) a value outside its physical range: utilisation 0–100 %, power up to the
GPU model's board limit (`POWER_LIMIT_W`), memory up to the model's HBM, energy up to
that power × GPUs × span.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from slurmpod.model.gpus import lookup

GPU_V = 1
SOURCES = ("dcgm", "prometheus", "sacct", "nvidia-smi")
TRUST = ("site", "job")
ENERGY_SOURCES = ("counter", "integrated", "dcgm", "slurm")
IDLE_UTIL_PCT = 5.0  # a GPU whose mean utilisation stays under this did no work (jobstats: 0 %)
MAX_GPUS_LISTED = 256
MAX_SERIES_POINTS = 128
MAX_SERIES_KEYS = 64

# Board power limits (W): the most a GPU of the model can draw (SXM TDPs; NVIDIA data sheets).
# A reading above its model's limit by more than POWER_SLACK is not a measurement.
POWER_LIMIT_W: dict[str, float] = {"a100": 400.0, "h100": 700.0, "h200": 700.0,
                                   "b200": 1000.0, "gb200": 1200.0, "b300": 1100.0,
                                   "gb300": 1400.0, "emu": 700.0}
POWER_LIMIT_UNKNOWN_W = 1500.0  # no data-centre GPU draws more (GB300: 1,400 W)
POWER_SLACK = 1.10  # transients and sensor error above the limit
HBM_UNKNOWN_GIB = 512.0
MAX_SPAN_S = 400 * 86400.0  # longer than any Slurm time limit a site would set
MAX_XID = 1_000_000

# key -> (meaning, unit, kind): kind is "int", "float" or "str".
GPU_FIELDS: dict[str, tuple[str, str, str]] = {
    "v": ("schema version (1)", "", "int"),
    "src": ("where the figures came from: " + " | ".join(SOURCES), "", "str"),
    "trust": ("who measured: site (site tools, read by the epilog) | job (the job's monitor)",
              "", "str"),
    "n": ("GPUs measured", "", "int"),
    "span_s": ("time the figures cover", "s", "float"),
    "samples": ("samples behind the means (sampling sources only)", "", "int"),
    "util": ("mean GPU utilisation over GPUs and time (NVML: a kernel was running)", "%",
             "float"),
    "util_min": ("lowest per-GPU mean utilisation: an idle GPU shows here", "%", "float"),
    "idle_gpus": (f"GPUs whose mean utilisation stayed under {IDLE_UTIL_PCT:g} %", "", "int"),
    "sm": ("mean SM activity (DCGM_FI_PROF_SM_ACTIVE), DCGM only", "%", "float"),
    "tensor": ("mean tensor-pipe activity (DCGM_FI_PROF_PIPE_TENSOR_ACTIVE), DCGM only", "%",
               "float"),
    "mem_util": ("mean memory-controller utilisation (NVML utilization.memory)", "%", "float"),
    "mem_gib": ("most GPU memory used on any GPU at any time", "GiB", "float"),
    "mem_total_gib": ("GPU memory per GPU", "GiB", "float"),
    "power_w": ("mean power per GPU", "W", "float"),
    "power_max_w": ("highest power of any GPU", "W", "float"),
    "energy_j": ("energy of all measured GPUs over span_s", "J", "float"),
    "energy_src": ("how energy was measured: counter (NVML total energy) | integrated (power "
                   "samples × time) | dcgm (job statistics) | slurm (ConsumedEnergyRaw)", "",
                   "str"),
    "temp_max_c": ("highest GPU temperature", "°C", "float"),
    "sm_mhz": ("mean SM clock", "MHz", "float"),
    "mem_mhz": ("mean memory clock", "MHz", "float"),
    "xid": ("XID errors seen on the job's GPUs", "", "int"),
    "xid_codes": ("distinct XID codes, ':'-joined (e.g. 79:48)", "", "str"),
}
_STR_VALUES: dict[str, tuple[str, ...]] = {"src": SOURCES, "trust": TRUST,
                                           "energy_src": ENERGY_SOURCES}
_PCT = ("util", "util_min", "sm", "tensor", "mem_util")


def power_limit_w(model: str | None) -> float:
    """Board power limit of a GPU model (gres Type, catalog name), else the generous bound."""
    return POWER_LIMIT_W.get((model or "").lower(), POWER_LIMIT_UNKNOWN_W)


def hbm_limit_gib(model: str | None) -> float:

    spec = lookup(model or "")
    return spec.hbm_gib * 1.05 if spec is not None else HBM_UNKNOWN_GIB


def finite(x: Any) -> float | None:
    """A finite float from a number (not a bool), else None."""
    if isinstance(x, bool) or not isinstance(x, int | float):
        return None
    f = float(x)
    return f if math.isfinite(f) else None


def in_range(x: Any, lo: float, hi: float) -> float | None:
    f = finite(x)
    return f if f is not None and lo <= f <= hi else None


def clean_gpu_summary(doc: Any, *, model: str | None = None,
                      max_gpus: int | None = None) -> dict[str, Any] | None:
    """The job-level summary with every value checked; None when nothing usable is left.

    Values out of range are dropped, not clamped: a wrong number is worse than "not measured".
    `model` (the GPU model of the job's nodes, from the site) sets the power and memory bounds;
    `max_gpus` (Slurm's allocation) bounds `n` and the energy.
    """
    if not isinstance(doc, Mapping) or doc.get("v") != GPU_V:
        return None
    out: dict[str, Any] = {"v": GPU_V}
    for key, allowed in _STR_VALUES.items():
        if doc.get(key) in allowed:
            out[key] = doc[key]
    n_hi = float(max_gpus) if max_gpus else 1e6
    n = in_range(doc.get("n"), 1, n_hi)
    if n is not None and n == int(n):
        out["n"] = int(n)
    span = in_range(doc.get("span_s"), 0, MAX_SPAN_S)
    if span is not None:
        out["span_s"] = round(span, 1)
    samples = in_range(doc.get("samples"), 0, 1e9)
    if samples is not None:
        out["samples"] = int(samples)
    for key in _PCT:
        v = in_range(doc.get(key), 0.0, 100.0)
        if v is not None:
            out[key] = round(v, 2)
    idle = in_range(doc.get("idle_gpus"), 0, out.get("n", n_hi))
    if idle is not None:
        out["idle_gpus"] = int(idle)
    hbm = hbm_limit_gib(model)
    for key in ("mem_gib", "mem_total_gib"):
        v = in_range(doc.get(key), 0.0, hbm if key == "mem_gib" else HBM_UNKNOWN_GIB)
        if v is not None:
            out[key] = round(v, 3)
    p_hi = power_limit_w(model) * POWER_SLACK
    for key in ("power_w", "power_max_w"):
        v = in_range(doc.get(key), 0.0, p_hi)
        if v is not None:
            out[key] = round(v, 1)
    e_hi = p_hi * out.get("n", n_hi) * out["span_s"] * 1.01 + 1.0 if "span_s" in out else 0.0
    e = in_range(doc.get("energy_j"), 0.0, e_hi)
    if e is not None:
        out["energy_j"] = round(e)
    t = in_range(doc.get("temp_max_c"), 0.0, 130.0)
    if t is not None:
        out["temp_max_c"] = round(t, 1)
    for key in ("sm_mhz", "mem_mhz"):
        v = in_range(doc.get(key), 0.0, 10000.0)
        if v is not None:
            out[key] = round(v)
    x = in_range(doc.get("xid"), 0, MAX_XID)
    if x is not None:
        out["xid"] = int(x)
    codes = doc.get("xid_codes")
    if isinstance(codes, str) and codes and len(codes) <= 64 and all(
            part.isdigit() and len(part) <= 4 for part in codes.split(":")):
        out["xid_codes"] = codes
    if "energy_j" not in out:
        out.pop("energy_src", None)
    measured = set(out) - {"v", "src", "trust", "n", "span_s", "samples", "energy_src"}
    return out if measured else None


def read_gpu_summary(record: Any) -> dict[str, Any] | None:
    """The checked job-level GPU summary of a spool record or compact summary (report side)."""
    if not isinstance(record, Mapping):
        return None
    summary = record.get("summary")
    gpus = summary.get("gpus") if isinstance(summary, Mapping) else None
    doc = summary.get("gpu") if isinstance(summary, Mapping) else None
    return clean_gpu_summary(doc, max_gpus=gpus if isinstance(gpus, int) and gpus > 0 else None)


def read_gpu_util_energy(record: Any) -> tuple[float | None, float | None]:
    """(mean utilisation %, energy J) of a record's summary.gpu, checked as clean_gpu_summary
    checks them (model unknown: the widest power bound), or None each. A fleet report's fast
    path: it reads 100,000 summaries and shows only these two (the full check costs ~18 us)."""
    # Any: JSON values, narrowed by the exact-type tests below (bool is not a number here).
    summary: Any = record.get("summary") if isinstance(record, Mapping) else None
    g: Any = summary.get("gpu") if isinstance(summary, Mapping) else None
    if not isinstance(g, Mapping) or g.get("v") != GPU_V:
        return None, None
    util: Any = g.get("util")
    u = float(util) if type(util) in (int, float) and 0.0 <= util <= 100.0 else None
    n: Any = g.get("n")
    span: Any = g.get("span_s")
    e: Any = g.get("energy_j")
    gpus = summary.get("gpus")
    if type(n) is not int or n < 1:
        n = None
    if type(gpus) is int and gpus > 0 and (n is None or n > gpus):
        n = gpus  # the energy bound: at most Slurm's allocation, as clean_gpu_summary
    if (type(e) in (int, float) and n is not None and type(span) in (int, float)
            and 0.0 <= span <= MAX_SPAN_S
            and 0.0 <= e <= POWER_LIMIT_UNKNOWN_W * POWER_SLACK * n * span * 1.01 + 1.0):
        return u, float(e)
    return u, None


# Per-GPU entry of record["gpu"]["gpus"]: key -> (lo, hi) or None for the model's bounds.
_GPU_ENTRY_PCT = ("util", "sm", "tensor", "mem_util")


def clean_gpu_entry(doc: Any, *, model: str | None = None) -> dict[str, Any] | None:
    """One checked entry of `record["gpu"]["gpus"]`; out-of-range values dropped."""
    if not isinstance(doc, Mapping):
        return None
    out: dict[str, Any] = {}
    node = doc.get("node")
    if isinstance(node, str) and 0 < len(node) <= 64 and node.isprintable():
        out["node"] = node
    idx = in_range(doc.get("index"), 0, 4096)
    if idx is not None and idx == int(idx):
        out["index"] = int(idx)
    uuid = doc.get("uuid")
    if isinstance(uuid, str) and len(uuid) <= 64 and uuid.isprintable():
        out["uuid"] = uuid
    for key in _GPU_ENTRY_PCT:
        v = in_range(doc.get(key), 0.0, 100.0)
        if v is not None:
            out[key] = v
    p_hi = power_limit_w(model) * POWER_SLACK
    bounds = {"mem_gib": hbm_limit_gib(model), "mem_total_gib": HBM_UNKNOWN_GIB,
              "power_w": p_hi, "power_max_w": p_hi, "temp_max_c": 130.0, "sm_mhz": 10000.0,
              "mem_mhz": 20000.0, "span_s": MAX_SPAN_S}
    for key, hi in bounds.items():
        v = in_range(doc.get(key), 0.0, hi)
        if v is not None:
            out[key] = v
    span = out.get("span_s")
    e = in_range(doc.get("energy_j"), 0.0, p_hi * span * 1.01 + 1.0 if span else 0.0)
    if e is not None:
        out["energy_j"] = e
    x = in_range(doc.get("xid"), 0, MAX_XID)
    if x is not None:
        out["xid"] = int(x)
    return out if set(out) - {"node", "index", "uuid", "span_s"} else None


def clean_series(doc: Any, *, model: str | None = None) -> dict[str, Any] | None:
    """`record["gpu"]["series"]` checked: shapes (≤ 2 × MAX_SERIES_POINTS times, ≤
    MAX_SERIES_KEYS keys, one row per key of one value per time) and every value's range; a
    value out of range becomes None. None when the shape is wrong."""
    if not isinstance(doc, Mapping):
        return None
    t, keys = doc.get("t"), doc.get("keys")
    if not isinstance(t, list) or not isinstance(keys, list) or not t:
        return None
    if len(t) > 2 * MAX_SERIES_POINTS or len(keys) > MAX_SERIES_KEYS:
        return None
    times = [finite(x) for x in t]
    if any(x is None or x < 0 for x in times):
        return None
    if not all(isinstance(k, str) and 0 < len(k) <= 80 and k.isprintable() for k in keys):
        return None
    out: dict[str, Any] = {"t": times, "keys": list(keys)}
    bounds = {"util": 100.0, "power_w": power_limit_w(model) * POWER_SLACK,
              "mem_gib": hbm_limit_gib(model)}
    for name, hi in bounds.items():
        rows = doc.get(name)
        if rows is None:
            continue
        if not isinstance(rows, list) or len(rows) > len(keys) or not all(
                isinstance(r, list) and len(r) == len(times) for r in rows):
            return None
        out[name] = [[in_range(v, 0.0, hi) for v in r] for r in rows]
    return out


def clean_record_part(doc: Any, *, model: str | None = None) -> dict[str, Any] | None:
    """`record["gpu"]` checked (report side): per-GPU entries and the series."""
    if not isinstance(doc, Mapping):
        return None
    out: dict[str, Any] = {}
    gpus = doc.get("gpus")
    if isinstance(gpus, list):
        cleaned = [c for g in gpus[:MAX_GPUS_LISTED]
                   if (c := clean_gpu_entry(g, model=model)) is not None]
        if cleaned:
            out["gpus"] = cleaned
    series = clean_series(doc.get("series"), model=model)
    if series is not None:
        out["series"] = series
    return out or None
