"""A DCGM exporter scraped by Prometheus, queried by job id through the HTTP API.

dcgm-exporter labels each GPU's series with `gpu`, `UUID`, `Hostname` and, when the site maps
jobs to GPUs (its `--kubernetes`-less HPC mode reads `$DCGM_HPC_JOB_MAPPING_DIR`), `hpc_job`
with the Slurm job id. One instant query per field at the job's end, over its run time
(`avg_over_time(F{hpc_job="ID"}[Ns])`), gives per-GPU figures:

| field | unit | used as |
|---|---|---|
| DCGM_FI_DEV_GPU_UTIL | % | utilisation (mean) |
| DCGM_FI_PROF_SM_ACTIVE | ratio 0–1 | SM activity (mean, ×100) |
| DCGM_FI_PROF_PIPE_TENSOR_ACTIVE | ratio 0–1 | tensor activity (mean, ×100) |
| DCGM_FI_DEV_FB_USED | MiB | memory used (max) |
| DCGM_FI_DEV_POWER_USAGE | W | power (mean, max) |
| DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION | mJ, a counter | energy = max − min over the job |
| DCGM_FI_DEV_GPU_TEMP | °C | temperature (max) |
| DCGM_FI_DEV_SM_CLOCK, DCGM_FI_DEV_MEM_CLOCK | MHz | clocks (mean) |
| DCGM_FI_DEV_XID_ERRORS | the last XID code (a gauge) | GPUs that had one; the codes |

The answer (`{"status":"success","data":{"resultType":"vector","result":[{"metric":{…},
"value":[t,"87.5"]}]}}`) is read with a size cap; every request has a timeout; the job id
is checked against Slurm's id shapes before it goes into PromQL, so it cannot change the query.
"""

from __future__ import annotations

import json
import math
import re
import urllib.parse
from collections.abc import Callable
from typing import Any

from slurmpod.telemetry.schema import HBM_UNKNOWN_GIB, POWER_LIMIT_UNKNOWN_W, POWER_SLACK
from slurmpod.telemetry.stats import GpuStat, Telemetry

JOB_LABEL = "hpc_job"
MAX_BYTES = 8 << 20
_JOB_ID = re.compile(r"^\d{1,12}(?:[_+]\d{1,9})?$")
_LABEL = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]{0,63}$")
P_HI = POWER_LIMIT_UNKNOWN_W * POWER_SLACK

# attribute -> (PromQL over-time function, metric, scale, lo, hi)
FIELDS: dict[str, tuple[str, str, float, float, float]] = {
    "util": ("avg", "DCGM_FI_DEV_GPU_UTIL", 1.0, 0, 100),
    "sm": ("avg", "DCGM_FI_PROF_SM_ACTIVE", 100.0, 0, 100),
    "tensor": ("avg", "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", 100.0, 0, 100),
    "mem_gib": ("max", "DCGM_FI_DEV_FB_USED", 1 / 1024, 0, HBM_UNKNOWN_GIB),
    "power_w": ("avg", "DCGM_FI_DEV_POWER_USAGE", 1.0, 0, P_HI),
    "power_max_w": ("max", "DCGM_FI_DEV_POWER_USAGE", 1.0, 0, P_HI),
    "temp_max_c": ("max", "DCGM_FI_DEV_GPU_TEMP", 1.0, 0, 130),
    "sm_mhz": ("avg", "DCGM_FI_DEV_SM_CLOCK", 1.0, 0, 10000),
    "mem_mhz": ("avg", "DCGM_FI_DEV_MEM_CLOCK", 1.0, 0, 20000),
}
ENERGY = "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"
XID = "DCGM_FI_DEV_XID_ERRORS"


def promql(func: str, metric: str, job_id: str, span_s: int, label: str = JOB_LABEL) -> str:
    if not _JOB_ID.match(job_id) or not _LABEL.match(label):
        raise ValueError(f"unusable job id or label: {job_id!r} {label!r}")
    return f'{func}_over_time({metric}{{{label}="{job_id}"}}[{max(int(span_s), 1)}s])'


def parse_vector(text: str | bytes) -> list[tuple[dict[str, str], float]]:
    """(labels, value) of an instant-vector answer; [] for anything else (errors, garbage)."""
    try:
        doc = json.loads(text)
    except (ValueError, UnicodeDecodeError, RecursionError):
        return []
    if not isinstance(doc, dict) or doc.get("status") != "success":
        return []
    data = doc.get("data")
    if not isinstance(data, dict) or data.get("resultType") != "vector":
        return []
    out: list[tuple[dict[str, str], float]] = []
    for item in data.get("result") or []:
        if not isinstance(item, dict):
            continue
        metric, value = item.get("metric"), item.get("value")
        if not isinstance(metric, dict) or not isinstance(value, list) or len(value) != 2:
            continue
        try:
            v = float(value[1])
        except (TypeError, ValueError):
            continue
        if math.isfinite(v):
            out.append(({str(k): str(x) for k, x in metric.items()}, v))
    return out


def _gpu_key(labels: dict[str, str]) -> tuple[str, str]:
    node = labels.get("Hostname") or labels.get("instance", "").split(":")[0]
    return node, labels.get("gpu") or labels.get("UUID", "?")


Fetch = Callable[[str, float], bytes]  # url, timeout -> body (raises OSError)


def http_fetch(url: str, timeout_s: float) -> bytes:
    import urllib.request  # lazy: start-up

    with urllib.request.urlopen(url, timeout=timeout_s) as resp:
        body: bytes = resp.read(MAX_BYTES + 1)
    if len(body) > MAX_BYTES:
        raise OSError("answer over the size cap")
    return body


def job_telemetry(base_url: str, job_id: str, start_s: float, end_s: float, *,
                  label: str = JOB_LABEL, timeout_s: float = 5.0,
                  fetch: Fetch = http_fetch) -> Telemetry | None:
    """Per-GPU figures of a job from Prometheus; None when it has no series for the job or does
    not answer (the first failing request ends the attempt: the epilog's time is bounded)."""
    span = int(end_s - start_s)
    if span <= 0:
        return None
    base = base_url.rstrip("/") + "/api/v1/query?"

    def ask(q: str) -> list[tuple[dict[str, str], float]] | None:
        url = base + urllib.parse.urlencode({"query": q, "time": f"{end_s:.3f}"})
        try:
            return parse_vector(fetch(url, timeout_s))
        except (OSError, ValueError):
            return None

    gpus: dict[tuple[str, str], GpuStat] = {}

    def gpu(labels: dict[str, str]) -> GpuStat:
        key = _gpu_key(labels)
        if key not in gpus:
            idx = labels.get("gpu", "")
            gpus[key] = GpuStat(node=key[0], index=int(idx) if idx.isdigit() else None,
                                uuid=labels.get("UUID"), span_s=float(span))
        return gpus[key]

    first = ask(promql(*FIELDS["util"][:2], job_id, span, label))
    if not first:
        return None
    for attr, (func, metric, scale, lo, hi) in FIELDS.items():
        rows = first if attr == "util" else ask(promql(func, metric, job_id, span, label))
        if rows is None:
            return None
        for labels, v in rows:
            x = v * scale
            if lo <= x <= hi:
                setattr(gpu(labels), attr, x)
    hi_rows = ask(promql("max", ENERGY, job_id, span, label)) or []
    lo_rows = {_gpu_key(la): v for la, v in ask(promql("min", ENERGY, job_id, span, label)) or []}
    energy_ok = bool(hi_rows)
    for labels, v in hi_rows:
        lo_v = lo_rows.get(_gpu_key(labels))
        e = (v - lo_v) / 1000.0 if lo_v is not None else None
        if e is not None and 0 <= e <= P_HI * span * 1.01:
            gpu(labels).energy_j = e
        else:
            energy_ok = False
    for labels, v in ask(promql("max", XID, job_id, span, label)) or []:
        g = gpu(labels)
        code = int(v) if 0 < v < 10000 else 0
        g.xid = 1 if code else 0
        g.xid_codes = (code,) if code else ()
    out = Telemetry("prometheus", "site", list(gpus.values()), span_s=float(span),
                    energy_src="counter" if energy_ok else None)
    return out


def answer(result: list[tuple[dict[str, Any], float]]) -> str:
    """An instant-vector answer as Prometheus writes it (tests, the sandbox)."""
    return json.dumps({"status": "success", "data": {"resultType": "vector", "result": [
        {"metric": m, "value": [1700000000.0, repr(v)]} for m, v in result]}})
