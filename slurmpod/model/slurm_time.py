"""Slurm time values: every form Slurm reads or prints, parsed and formatted here only.

Time limits (sbatch/srun `--time`, slurm.conf `MaxTime`/`DefaultTime`, scontrol's `TimeLimit`),
read by Slurm's `_get_time`/`time_str2mins` (src/common/parse_time.c, 22.05 - 25.11):

    MM   MM:SS   HH:MM:SS   D-HH   D-HH:MM   D-HH:MM:SS   UNLIMITED | INFINITE (no limit)

Slurm stores a limit in whole minutes and rounds seconds *up* (sbatch(1) --time: "seconds
values are rounded up to the next minute"); `limit_minutes` does the same.

What sacct prints (`_elapsed_time`, sacct/print.c): `MM:SS.mmm` under an hour (TotalCPU,
UserCPU, SystemCPU keep milliseconds), else `HH:MM:SS` or `D-HH:MM:SS`; `Timelimit` may also
read `Partition_Limit` (the job has no limit of its own) or `UNLIMITED`, and `TimelimitRaw` is
whole minutes or one of those two words. Pure: no I/O.
"""

from __future__ import annotations

import math
import re

__all__ = [
    "NO_LIMIT",
    "TIME_PATTERN",
    "duration_s",
    "elapsed_s",
    "format_minutes",
    "format_seconds",
    "limit_minutes",
    "time_limit_raw_s",
]

# Words meaning "no limit of the job's own": Slurm's INFINITE/UNLIMITED (either case is
# accepted, strcasecmp in time_str2mins) and sacct's Partition_Limit (the partition's applies).
NO_LIMIT = frozenset({"UNLIMITED", "INFINITE", "PARTITION_LIMIT"})

# The forms a site file (`partitions.max_time`) and a run spec (`job.time_limit`) may give:
# what sbatch --time and MaxTime accept, in the case Slurm prints.
TIME_PATTERN = r"^(INFINITE|UNLIMITED|(\d+-)?\d+(:\d{2}){0,2})$"

# Input forms: [D-]A[:B[:C]]; what A, B and C mean depends on the dash and the field count.
_INPUT = re.compile(r"(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?")
# Printed forms: MM:SS.mmm, HH:MM:SS, D-HH:MM:SS (milliseconds only without hours).
_PRINTED = re.compile(r"(?:(\d+)-)?(?:(\d+):)?(\d+):(\d+)(?:\.(\d+))?")


def duration_s(text: str) -> int | None:
    """A time limit in any form Slurm accepts -> seconds; None for UNLIMITED, INFINITE and
    Partition_Limit. Raises ValueError for anything else (`2-`, `1:2:3:4`, `abc`, ``)."""
    t = text.strip()
    if t.upper() in NO_LIMIT:
        return None
    m = _INPUT.fullmatch(t)
    if m is None:
        raise ValueError(f"not a Slurm time: {text!r} (use MM, MM:SS, HH:MM:SS, D-HH, "
                         "D-HH:MM, D-HH:MM:SS or UNLIMITED)")
    days, a, b, c = m.groups()
    fields = [int(x) for x in (a, b, c) if x is not None]
    if days is not None:  # D-HH, D-HH:MM, D-HH:MM:SS
        h, mi, s = [*fields, 0, 0][:3]
        return int(days) * 86400 + h * 3600 + mi * 60 + s
    if len(fields) == 3:  # HH:MM:SS
        return fields[0] * 3600 + fields[1] * 60 + fields[2]
    if len(fields) == 2:  # MM:SS
        return fields[0] * 60 + fields[1]
    return fields[0] * 60  # MM


def limit_minutes(text: str) -> int | None:
    """A time limit -> whole minutes as Slurm stores it (seconds rounded up); None for no limit.
    Raises ValueError like `duration_s`."""
    secs = duration_s(text)
    return None if secs is None else math.ceil(secs / 60)


def elapsed_s(text: str) -> float | None:
    """A duration as sacct prints it (TotalCPU `00:05.918`, Elapsed `01:02:03`, `2-03:04:05`)
    -> seconds; None for anything else, including input-only forms (`D-HH:MM`, bare `MM`)."""
    m = _PRINTED.fullmatch(text.strip())
    if m is None:
        return None
    d, h, mi, s, frac = m.groups()
    if h is None and d is not None:  # `D-MM:SS` is not a form sacct prints
        return None
    secs = int(d or 0) * 86400 + int(h or 0) * 3600 + int(mi) * 60 + int(s)
    return secs + (int(frac) / 10 ** len(frac) if frac else 0.0)


def time_limit_raw_s(text: str) -> int | None:
    """sacct TimelimitRaw (whole minutes) -> seconds; None for UNLIMITED, Partition_Limit
    (no limit of the job's own), empty or anything else."""
    t = text.strip()
    return int(t) * 60 if t.isdigit() else None


def format_seconds(seconds: int | None) -> str:
    """Seconds -> `HH:MM:SS` or `D-HH:MM:SS` (Slurm's secs2time_str); None -> `UNLIMITED`."""
    if seconds is None:
        return "UNLIMITED"
    days, rest = divmod(int(seconds), 86400)
    h, rest = divmod(rest, 3600)
    mi, s = divmod(rest, 60)
    text = f"{h:02d}:{mi:02d}:{s:02d}"
    return f"{days}-{text}" if days else text


def format_minutes(minutes: int | None) -> str:
    """Whole minutes -> `HH:MM:00` or `D-HH:MM:00` (Slurm's mins2time_str); None ->
    `UNLIMITED`."""
    return format_seconds(None if minutes is None else minutes * 60)
