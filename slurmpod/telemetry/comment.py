"""The monitor's GPU figures in the job's Comment (key `gpu`), and its series file.

The Comment has 1024 bytes in all (Slurm 22.05 `_test_job_desc_fields`), most of them taken by
the submit keys and the live MFU, so the GPU summary travels with one- and two-letter keys
(about 110 bytes) and is left out, never truncated, when it does not fit. It is the job's word:
the epilog range-checks it (`schema.clean_gpu_summary`) and marks it `trust: job`.

The series go to a file beside the job's log (`series_path`), written by the monitor as the
job's user; the epilog reads it only through `accounting.safeio` (no symlink, the job's own
regular file, size-capped) and checks every value (`schema.clean_record_part`).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from slurmpod.telemetry.schema import GPU_V

KEY = "gpu"
MAX_SERIES_FILE_BYTES = 512 << 10
# summary key -> Comment key
SHORT = {"n": "n", "span_s": "d", "samples": "s", "util": "u", "util_min": "um",
         "idle_gpus": "i", "mem_util": "mu", "mem_gib": "m", "mem_total_gib": "mt",
         "power_w": "p", "power_max_w": "pm", "energy_j": "e", "temp_max_c": "tc",
         "sm_mhz": "c", "mem_mhz": "mc", "xid": "x"}
_LONG = {v: k for k, v in SHORT.items()}
_ESRC = {"counter": "c", "integrated": "i"}


def compact(summary: Mapping[str, Any]) -> dict[str, Any]:
    """The Comment form of a job-level summary (from nvidia-smi sampling)."""
    out: dict[str, Any] = {}
    for key, short in SHORT.items():
        v = summary.get(key)
        if isinstance(v, int | float) and not isinstance(v, bool):
            out[short] = round(v) if key in ("energy_j", "span_s") else v
    if summary.get("energy_src") in _ESRC:
        out["es"] = _ESRC[summary["energy_src"]]
    return out


def expand(doc: Any) -> dict[str, Any] | None:
    """A Comment's `gpu` value as a (not yet checked) job-level summary, or None."""
    if not isinstance(doc, Mapping):
        return None
    out: dict[str, Any] = {"v": GPU_V, "src": "nvidia-smi", "trust": "job"}
    for short, key in _LONG.items():
        if short in doc:
            out[key] = doc[short]
    es = {v: k for k, v in _ESRC.items()}.get(doc.get("es"))  # type: ignore[arg-type]
    if es:
        out["energy_src"] = es
    return out


def with_gpu(comment: str, gpu: Mapping[str, Any], max_bytes: int = 1024) -> str:
    """`comment` (Comment v1 JSON) with `gpu` set; unchanged when it would not fit."""
    try:
        doc = json.loads(comment)
    except ValueError:
        return comment
    if not isinstance(doc, dict):
        return comment
    doc[KEY] = dict(gpu)
    text = json.dumps(doc, separators=(",", ":"), ensure_ascii=True, allow_nan=False)
    return text if len(text.encode()) <= max_bytes else comment


def series_path(log_path: str | Path) -> Path:
    return Path(f"{log_path}.gpu.json")


def write_series(log_path: str | Path, part: Mapping[str, Any]) -> None:
    """Write the monitor's per-GPU figures and series beside the log (temp file + rename)."""
    path = series_path(log_path)
    text = json.dumps(part, separators=(",", ":"), allow_nan=False)
    if len(text) > MAX_SERIES_FILE_BYTES:
        part = {k: v for k, v in part.items() if k != "series"}
        text = json.dumps(part, separators=(",", ":"), allow_nan=False)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    tmp.write_text(text)
    os.replace(tmp, path)
