"""Read the job script's attempt record next to a job log on this machine.

A slurmpod job log is `RUN_DIR/logs/NAME-JOB.out` and the record `RUN_DIR/.slurmpod/attempts.jsonl`
(docs/runs.md). The job owns both: the record is opened without blocking (a FIFO in its place
must not hang `mfu` or `report`), read only as a regular file, and only its last
`MAX_BYTES`; `parse_attempts` skips lines that are not valid records.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from slurmpod.runs.attempts import Attempt, parse_attempts

MAX_BYTES = 16 * 1024 * 1024  # the record's tail: ~300 B a line, ~50k attempts


def record_beside(log: str | Path) -> Path:
    return Path(log).parent.parent / ".slurmpod" / "attempts.jsonl"


def attempts_of_log(log: str | Path) -> tuple[Attempt, ...] | None:
    """The attempts that wrote to `log`, by attempt number; None when the record cannot be
    read as a regular file."""
    record = record_beside(log)
    try:
        fd = os.open(record, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_NOCTTY
                     | os.O_CLOEXEC)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as fh:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return None
        fh.seek(max(0, st.st_size - MAX_BYTES))
        data = fh.read(MAX_BYTES)
    mine = [a for a in parse_attempts(data).attempts if a.log is not None
            and Path(a.log) == Path(log)]
    return tuple(sorted(mine, key=lambda a: a.attempt))
