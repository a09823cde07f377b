"""Plausibility of a job's figures: what no real training run can produce.

An MFU above 100 % means the FLOPs or the peak are wrong (an FP8 step counted against the BF16
peak, a forged FLOPs figure, a sandbox peak measured under load); a goodput above 100 % or a
negative time means the clocks or the log disagree with Slurm. Such a job is not dropped: its
figures are kept for audit, labelled "implausible" with the reasons, and left out of every fleet
aggregate (`slurmpod.report.fleet`). Pure: numbers in, reason codes out.

Reason codes are short lower-case words (`[a-z0-9-]`), so they fit AdminComment v1 strings
(sacctmgr turns quotes into backticks and, before Slurm 23.02, lower-cases values).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

# A fraction may exceed 1 by rounding alone (4 significant digits in AdminComment v1).
FRACTION_SLACK = 1e-3
FRACTIONS = ("mfu", "mfu_p10", "mfu_p90", "goodput")
DURATIONS = ("ttfi_s", "ckpt_s", "iter_ms")
RATES = ("tflops", "tflops_mlm", "tokens_per_s")
SEPARATOR = ":"


def _value(x: Any) -> float | None:
    """A number, NaN for a non-number that is present (a string, a bool), None when absent."""
    if x is None:
        return None
    if isinstance(x, bool) or not isinstance(x, int | float | str):
        return math.nan
    try:
        return float(x)
    except ValueError:
        return math.nan


_FRACTION_MAX = 1.0 + FRACTION_SLACK
_CHECKS = tuple((key, key in FRACTIONS, key.replace("_", "-"))
                for key in (*FRACTIONS, *DURATIONS, *RATES))


def reasons(figures: Mapping[str, Any]) -> tuple[str, ...]:
    """Why the figures (AdminComment v1 keys) cannot be right; empty when they can.

    `mfu-over-100`, `mfu-negative`, `goodput-over-100`, `goodput-negative`, `<key>-negative`
    for a time or rate, `<key>-not-finite` for NaN, infinity or a non-number. A fleet report
    asks this of every job, so the usual case (plain finite numbers in range) is a few
    comparisons per key."""
    out: list[str] = []
    get = figures.get
    for key, fraction, name in _CHECKS:
        x = get(key)
        if x is None:
            continue
        if type(x) is float or type(x) is int:
            # NaN fails every comparison, so it falls through to the slow path
            if 0 <= x <= (_FRACTION_MAX if fraction else math.inf) and x != math.inf:
                continue
            v = float(x)
        else:
            v = _value(x)  # type: ignore[assignment]
            if v is None:
                continue
        if not math.isfinite(v):
            out.append(f"{name}-not-finite")
        elif v < 0:
            out.append(f"{name}-negative")
        elif fraction and v > _FRACTION_MAX:
            out.append(f"{name}-over-100")
    if not out:
        return ()
    # The percentiles repeat what the median says; keep one reason per figure.
    if "mfu-over-100" in out:
        out = [r for r in out if r not in ("mfu-p10-over-100", "mfu-p90-over-100")]
    return tuple(out)


def joined(codes: tuple[str, ...]) -> str | None:
    """The AdminComment form of the reasons (None when there are none)."""
    return SEPARATOR.join(codes) if codes else None


def split(text: Any) -> tuple[str, ...]:
    """Reasons back from their AdminComment form."""
    if not isinstance(text, str) or not text:
        return ()
    return tuple(r for r in text.split(SEPARATOR) if r)
