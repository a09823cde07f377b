"""The submit-time keys of a slurmpod job's Slurm Comment (pure: render writes them, the
accounting hooks read them; the live and final keys are in `slurmpod.accounting.hooks`).

Render lives in the pure core and may not import the accounting package, so the keys both
sides share live here, in one place.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

SUBMIT_FMT = 1  # version of the submit-time keys `slurmpod render` puts in --comment
SUBMIT_KEYS = ("slurmpod", "fmt", "run", "flops_per_iter", "peak_tflops", "gpus", "formula",
               "tokens_per_iter", "token", "pred")
# The breakdown parts a recorded prediction keeps (`pred.b`): the ones the fleet report's
# likely-cause wording reads (slurmpod.report.predicted.cause_note).
PRED_PARTS = ("compute", "exposed_communication", "pp_bubble", "tp", "cp", "ep", "dp", "pp_p2p")


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
                    breakdown_s: Mapping[str, float], gpu: str, layout: str) -> dict[str, Any]:
    """The submit Comment's `pred` key: the performance model's prediction for the planned
    layout (`slurmpod.perf.predict`), which the fleet report compares each finished job with
    (report/predicted.py `recorded_vs_predicted`). Compact (the Comment holds 1,024 bytes with
    the monitor's keys): 4 significant digits, zero parts left out."""
    def g(x: float) -> float:
        return float(f"{x:.4g}")

    return {"s": g(step_time_s), "mfu": g(mfu), "tps": g(tokens_per_s_per_gpu),
            "b": {k: g(v) for k in PRED_PARTS if (v := breakdown_s.get(k) or 0.0) > 0},
            "gpu": gpu, "layout": layout}


def is_slurmpod_comment(doc: Mapping[str, Any] | None) -> bool:
    """A Comment slurmpod rendered (submit keys) or its monitor wrote (Comment v1)."""
    return doc is not None and any(k in doc for k in ("slurmpod", "flops_per_iter", "mfu", "fmt"))
