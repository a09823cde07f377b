"""The JSON slurmpod keeps in Slurm for a job, in one place: the submit-time keys of the
Comment (render writes them), the live Comment v1 (the monitor) and the final AdminComment v1
(the epilog), with their one writer and one reader each. Pure functions, no I/O; render (pure
core) and the accounting hooks both import it.

Both Slurm fields are small and pass through Slurm's own plumbing, so:

- **Size.** Slurm 22.05 rejects a Comment over 1024 bytes on submit *and* on update
  (`job_mgr.c::_test_job_desc_fields`); AdminComment has no check in slurmctld but lands in a
  `text` column, and squeue/sacct tables truncate anyway: both are kept under `MAX_FIELD_BYTES`.
- **Quotes and case.** A finished job cannot be updated through slurmctld (`_update_job` returns
  ESLURM_JOB_FINISHED once the job is COMPLETING, which it is when EpilogSlurmctld runs), so the
  AdminComment goes through `sacctmgr modify job ... set AdminComment=`. sacctmgr rewrites every
  `"` and `'` to a backtick (`strip_quotes`, all versions, to keep the SQL safe) and, before 23.02,
  lower-cases the value. So the AdminComment holds only numbers and lowercase `[a-z0-9._:-]`
  strings, and `decode_field` turns backticks back into quotes. What sacct shows on 22.05 is
  ``{`v`:1,`mfu`:0.4123,...}``: JSON once backticks are read as quotes.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from typing import Any

# ---- submit-time keys (render) ----

SUBMIT_FMT = 1  # version of the submit-time keys `slurmpod render` puts in --comment
SUBMIT_KEYS = ("slurmpod", "fmt", "run", "flops_per_iter", "peak_tflops", "gpus", "formula",
               "tokens_per_iter", "token", "pred")
# The breakdown parts a recorded prediction keeps (`pred.b`): the ones the fleet report's
# likely-cause wording reads (slurmpod.report.predicted.cause_note).
PRED_PARTS = ("compute", "exposed_communication", "pp_bubble", "tp", "cp", "ep", "dp", "pp_p2p",
              "host", "offload")


def submit_comment(*, version: str, run: str, flops_per_iter: float, peak_tflops: float,
                   gpus: int, formula: str, tokens_per_iter: float | None = None,
                   token: str = "", prediction: Mapping[str, Any] | None = None) -> str:
    """The job's `--comment` at submission: what the planner knew (compact JSON). The monitor
    merges its live keys in and keeps these; the epilog takes only `flops_per_iter` and
    `formula` from them (GPUs and peak come from Slurm and the site: docs/accounting.md)."""
    data: dict[str, Any] = {"slurmpod": version, "fmt": SUBMIT_FMT, "run": run,
                            "flops_per_iter": flops_per_iter, "peak_tflops": peak_tflops,
                            "gpus": gpus, "formula": formula}
    if tokens_per_iter:
        data["tokens_per_iter"] = tokens_per_iter
    if token:
        data["token"] = token
    if prediction:
        data["pred"] = dict(prediction)
    return json.dumps(data, separators=(",", ":"), sort_keys=False)


def prediction_keys(*, step_time_s: float, mfu: float, tokens_per_s_per_gpu: float,
                    breakdown_s: Mapping[str, float], gpu: str, layout: str,
                    arch: str = "") -> dict[str, Any]:
    """The submit Comment's `pred` key: the performance model's prediction for the planned
    layout (`slurmpod.perf.predict`), which the fleet report compares each finished job with
    (report/predicted.py `recorded_vs_predicted`). Compact (the Comment holds 1,024 bytes with
    the monitor's keys): 4 significant digits, zero parts left out. `arch`: the model
    architecture's id (`slurmpod.perf.track.architecture_id`) where the prediction used the
    built-in factors, whose track record the fleet report then quotes; else left out."""
    def g(x: float) -> float:
        return float(f"{x:.4g}")

    keys = {"s": g(step_time_s), "mfu": g(mfu), "tps": g(tokens_per_s_per_gpu),
            "b": {k: g(v) for k in PRED_PARTS if (v := breakdown_s.get(k) or 0.0) > 0},
            "gpu": gpu, "layout": layout}
    if arch:
        keys["arch"] = arch
    return keys


def is_slurmpod_comment(doc: Mapping[str, Any] | None) -> bool:
    """A Comment slurmpod rendered (submit keys) or its monitor wrote (Comment v1)."""
    return doc is not None and any(k in doc for k in ("slurmpod", "flops_per_iter", "mfu", "fmt"))


# ---- live Comment and final AdminComment (the hooks) ----

COMMENT_V = 1
ADMIN_V = 1
RECORD_V = 1
MAX_FIELD_BYTES = 1024
SIG_DIGITS = 4
SCHEMA_PREFIX = "slurmpod"

# Live keys the monitor owns in the Comment; everything else there is preserved as found.
LIVE_KEYS = ("v", "mfu", "tflops", "iter", "tokens_per_s", "peak", "t")
# Keys the epilog needs from the initial comment: never dropped to make room.
PROTECTED_KEYS = frozenset({"v", "mfu", "tflops", "iter", "tokens_per_s", "peak",
                            "flops_per_iter", "flops", "gpus", "tokens_per_iter", "run"})

# AdminComment v1: key -> (meaning, decimals or None for int / str).
ADMIN_FIELDS: dict[str, tuple[str, int | None]] = {
    "v": ("schema version (1)", None),
    "mfu": ("median MFU over steady-state iterations, fraction of peak", 4),
    "mfu_p10": ("10th percentile MFU (steady state)", 4),
    "mfu_p90": ("90th percentile MFU (steady state)", 4),
    "tflops": ("median model TFLOP/s per GPU (steady state)", 1),
    "tflops_mlm": ("median TFLOP/s per GPU as Megatron printed it, when it did", 1),
    "tokens_per_s": ("median tokens/s for the whole job (steady state)", 0),
    "iter_ms": ("median iteration time, ms (steady state)", 1),
    "iters": ("iterations logged", None),
    "last_iter": ("last iteration number reached", None),
    "gpus": ("GPUs of the job, from Slurm's allocation (never from the job's Comment)", None),
    "peak": ("peak dense BF16 TFLOP/s per GPU used for MFU, from the site file", 1),
    "mfu_fp8": ("FP8 runs: median MFU against the FP8 dense peak", 4),
    "peak_fp8": ("FP8 runs: peak dense FP8 TFLOP/s per GPU (site file)", 1),
    "goodput": ("productive training time / allocated GPU time", 4),
    "ttfi_s": ("time from job start to first logged iteration, s", None),
    "ckpt_s": ("time spent in checkpoint stalls, s", None),
    "restarts": ("restarts seen in the log", None),
    "fv": ("FLOPs formula version (see docs/accounting.md)", None),
    "src": ("where FLOPs came from: comment | args | none", None),
    "gsrc": ("where the GPU count came from: slurm (AllocTRES gres/gpu) | site (nodes × GPUs "
             "per node)", None),
    "attempt": ("Slurm's restart count of the run these figures describe", None),
    "implausible": ("why the figures cannot be right (plausible.reasons, ':'-joined); such "
                    "a job stays out of fleet aggregates", None),
    "err": ("why there are no figures: a refusal reason or parse error", None),
}
# AdminComment v1 keys whose values are strings (everything else is a number).
ADMIN_STR_KEYS = frozenset({"fv", "src", "gsrc", "implausible", "err"})
STR_MAX = 64  # characters of a string value; `implausible` (all reasons) may use 160
_STR_OK = re.compile(r"^[a-z0-9._:-]{0,160}$")


def _num(x: Any, decimals: int | None) -> int | float | None:
    if x is None or isinstance(x, bool):
        return None
    try:
        f = float(x)
    except (TypeError, ValueError):
        return None
    if not math.isfinite(f):
        return None
    if decimals is None:
        return round(f)
    # `decimals` places, but never fewer than SIG_DIGITS significant digits: a sandbox's CPU
    # "GPU" peaks at 0.05 TFLOP/s, and 0.000491 TFLOP/s must not print as 0.0.
    if f != 0 and abs(f) < 10 ** (SIG_DIGITS - 1 - decimals):
        return float(f"{f:.{SIG_DIGITS}g}")
    return round(f) if decimals == 0 else round(f, decimals)


def _safe_str(x: Any) -> str | None:
    """A string that survives sacctmgr (lower case, no quotes, no backslash) or None."""
    s = str(x).lower()
    s = re.sub(r"[^a-z0-9._:-]+", "-", s)[:160]
    return s if _STR_OK.match(s) else None


def dumps_compact(doc: Mapping[str, Any]) -> str:
    """Compact JSON, ASCII only, insertion order kept (the version key first)."""
    return json.dumps(doc, separators=(",", ":"), ensure_ascii=True, allow_nan=False)


def decode_field(text: str | None) -> dict[str, Any] | None:
    """Parse a Comment/AdminComment written by slurmpod: JSON, or JSON whose quotes sacctmgr
    turned into backticks. None when it is empty or not ours."""
    if not text:
        return None
    text = text.strip()
    if not text.startswith("{"):
        return None
    for candidate in (text, text.replace("`", '"')):
        try:
            doc = json.loads(candidate)
        except ValueError:
            continue
        return doc if isinstance(doc, dict) else None
    return None


def build_comment(existing: str | None, live: Mapping[str, Any], *, now_s: float | None = None,
                  max_bytes: int = MAX_FIELD_BYTES) -> str:
    """Comment v1: the live figures merged into the job's existing Comment.

    Keys already in the comment (the submit-time keys: run name, FLOPs per iteration, GPUs, …)
    are kept; the live keys are overwritten. A comment that is not JSON is kept under `note`.
    If the result would exceed `max_bytes`, unprotected preserved keys are dropped, longest first.
    """
    old = decode_field(existing)
    base: dict[str, Any] = dict(old) if old is not None else {}
    if old is None and existing and existing.strip():
        base["note"] = existing.strip()[:200]
    doc: dict[str, Any] = {"v": COMMENT_V}
    rounding = {"mfu": 4, "tflops": 1, "iter": None, "tokens_per_s": 0, "peak": 1}
    for key, decimals in rounding.items():
        val = _num(live.get(key), decimals)
        if val is not None:
            doc[key] = val
        else:
            base.pop(key, None)  # a stale live value must not survive as if it were current
    if now_s is not None:
        doc["t"] = int(now_s)
    for key, val in base.items():
        if key not in doc and key not in LIVE_KEYS:
            doc[key] = val
    text = dumps_compact(doc)
    while len(text.encode()) > max_bytes:
        droppable = [k for k in doc if k not in PROTECTED_KEYS and k not in LIVE_KEYS]
        if not droppable:
            raise ValueError(f"comment of {len(text)} bytes does not fit {max_bytes}")
        doc.pop(max(droppable, key=lambda k: len(dumps_compact({k: doc[k]}))))
        text = dumps_compact(doc)
    return text


def build_admin_comment(summary: Mapping[str, Any], *,
                        max_bytes: int = MAX_FIELD_BYTES) -> str:
    """AdminComment v1 from a summary dict (keys of ADMIN_FIELDS; unknown keys are ignored)."""
    doc: dict[str, Any] = {"v": ADMIN_V}
    for key, (_, decimals) in ADMIN_FIELDS.items():
        if key == "v" or key not in summary or summary[key] is None:
            continue
        val = summary[key]
        if key in ADMIN_STR_KEYS:
            s = _safe_str(val)
            if s:
                doc[key] = s if key == "implausible" else s[:STR_MAX]
            continue
        num = _num(val, decimals)
        if num is not None:
            doc[key] = num
    text = dumps_compact(doc)
    # Only a summary of absurd numbers with every reason flagged gets near the limit: keep as
    # many whole reasons as fit (the spool record keeps them all).
    while len(text.encode()) > max_bytes and ":" in doc.get("implausible", ""):
        doc["implausible"] = doc["implausible"].rsplit(":", 1)[0]
        text = dumps_compact(doc)
    if len(text.encode()) > max_bytes:  # cannot happen with the fixed key set; keep the guard
        raise ValueError(f"admin comment of {len(text)} bytes exceeds {max_bytes}")
    return text


def parse_initial_comment(comment: str | None) -> dict[str, Any]:
    """What the hooks need from a slurmpod-rendered Comment: FLOPs per iteration, GPUs, peak,
    tokens per iteration (all optional; missing ones come from the log's arguments dump)."""
    doc = decode_field(comment) or {}
    out: dict[str, Any] = {}
    for key, alias in (("flops_per_iter", "flops"), ("gpus", None), ("peak", "peak_tflops"),
                       ("tokens_per_iter", None), ("run", None)):
        val = doc.get(key, doc.get(alias) if alias else None)
        if val is not None:
            out[key] = val
    return out


def validate_comment(doc: Mapping[str, Any]) -> list[str]:
    """Problems with a decoded Comment v1 (empty list when it is valid)."""
    problems = []
    if doc.get("v") != COMMENT_V:
        problems.append("v must be 1")
    for key in ("mfu", "tflops", "tokens_per_s", "peak"):
        if key in doc and not isinstance(doc[key], int | float):
            problems.append(f"{key} must be a number")
    # MFU above 1 means a wrong peak or FLOPs figure (the sandbox's CPU "GPUs"), not bad JSON.
    if "mfu" in doc and isinstance(doc["mfu"], int | float) and doc["mfu"] < 0:
        problems.append("mfu must not be negative")
    if "iter" in doc and not isinstance(doc["iter"], int):
        problems.append("iter must be an integer")
    return problems


def validate_admin_comment(doc: Mapping[str, Any]) -> list[str]:
    """Problems with a decoded AdminComment v1 (empty list when it is valid)."""
    problems = []
    if doc.get("v") != ADMIN_V:
        problems.append("v must be 1")
    for key, val in doc.items():
        if key not in ADMIN_FIELDS:
            problems.append(f"unknown key {key}")
        elif key in ADMIN_STR_KEYS:
            if not isinstance(val, str) or not _STR_OK.match(val):
                problems.append(f"{key} must be a short lowercase string")
        elif not isinstance(val, int | float) or isinstance(val, bool):
            problems.append(f"{key} must be a number")
    return problems
