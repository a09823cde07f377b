"""sacct output -> job records plus every attempt of each job. Pure.

Two inputs give the same `SacctJob`s:
- the text queries `slurmpod report` runs (`records_argv` + `attempts_argv`): slurmpod's
  `--parsable2` field list (`backends.parse.SACCT_FIELDS`, the CLI backend's own parser), one row
  per attempt (`--duplicates --allocations`), and a narrow attempts query without free text.
  Both take the delimiter `backends.parse.sacct_delimiter()` chose for this report, and every
  row is checked against the shapes Slurm prints (docs/backends.md: job-controlled text).
  Allocation rows only: a fleet of 10,000 jobs is ~3 MB of text instead of ~190 MB of JSON
  whose step statistics the report never reads (benchmarks/report_scale.py compares both);
- `sacct --json --duplicates` (`parse_sacct_jobs`), for recorded JSON.

`slurmpod.backends.parse.parse_sacct_json` merges the attempts of a requeued job into its
latest record (and counts the rest as restarts); a report also needs the time the earlier
attempts held their GPUs, so this module keeps each attempt's start, end and elapsed time too.

Slurm 22.05's `sacct --json` (dbv0.0.38) reports exit code 0 for a job that exited 3 (recorded
in tests/data/slurm/22.05/), so exit codes come from a second, narrow text query
(`EXIT_CODE_ARGV`: job id and ExitCode only, no free text) merged in by `with_exit_codes`.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from slurmpod.backends.parse import (
    SACCT_DELIMITER,
    SACCT_FIELDS,
    exit_of,
    is_job_id,
    load_json,
    num,
    parse_sacct_json,
    parse_sacct_parsable,
    sacct_json_job_id,
    state_of,
)
from slurmpod.errors import SlurmError
from slurmpod.model.jobs import JobRecord

_log = logging.getLogger("slurmpod.sacct")
# The delimiter of the recorded narrow queries (tests/data/report/): sacct's default.
RECORDED_NARROW_DELIMITER = "|"


@dataclass(frozen=True)
class Attempt:
    """One run of a job (a requeued job has several; the last is the job's own record)."""

    submit_s: int | None  # epoch seconds (a requeued attempt is submitted again)
    start_s: int | None
    end_s: int | None
    elapsed_s: int
    state: str


@dataclass(frozen=True)
class SacctJob:
    record: JobRecord
    attempts: tuple[Attempt, ...]

    @property
    def allocated_s(self) -> int:
        """Seconds the job held its nodes, summed over attempts."""
        return sum(a.elapsed_s for a in self.attempts)


def _int_or_none(value: Any) -> int | None:
    n = num(value)
    return int(n) if n else None


def parse_sacct_jobs(text: str) -> list[SacctJob]:
    """Jobs in the order sacct listed them (first appearance), each with all its attempts."""
    try:
        data = load_json(text, "sacct --json")
    except SlurmError as exc:
        # 22.05 answers a query that matches no job with an error entry (exit status 0).
        if exc.message.endswith("Nothing found"):
            return []
        raise
    attempts: dict[str, list[Attempt]] = {}
    for job in data.get("jobs") or []:
        t = job.get("time") or {}
        attempts.setdefault(sacct_json_job_id(job), []).append(Attempt(
            submit_s=_int_or_none(t.get("submission")), start_s=_int_or_none(t.get("start")),
            end_s=_int_or_none(t.get("end")),
            elapsed_s=int(num(t.get("elapsed")) or 0), state=str(state_of(job.get("state")))))
    records = parse_sacct_json(text)
    return [SacctJob(r, tuple(attempts.get(r.job_id, ()))) for r in records]


EXIT_CODE_ARGV = ("sacct", "--noheader", "--parsable2", "--allocations", "--duplicates",
                  "--format=JobID,ExitCode")


_EXIT_CODE = re.compile(r"\d+:\d+")
_EPOCH_OR_UNSET = re.compile(r"\d+|Unknown|None|")
_STATE = re.compile(r"[A-Z_]+(?: by \d+)?")  # `CANCELLED by 1000`


def _narrow_rows(text: str, n: int, delimiter: str, what: str) -> list[list[str]]:
    """Lines of a query without free text, each exactly `n` fields with a job id first; others
    are left out with one warning. split("\\n"), not splitlines(): only \\n ends a sacct row."""
    rows, bad = [], []
    for line in text.rstrip("\n").split("\n"):
        if not line:
            continue
        parts = line.split(delimiter)
        if len(parts) == n and is_job_id(parts[0]):
            rows.append(parts)
        else:
            bad.append(line)
    if bad:
        _log.warning("slurmpod: warning: sacct %s: left out %d line(s) not as Slurm prints "
                     "them, first: %.120r", what, len(bad), bad[0])
    return rows


def parse_exit_codes(text: str, delimiter: str = RECORDED_NARROW_DELIMITER
                     ) -> dict[str, tuple[int, int]]:
    """`JobID|ExitCode` rows -> job id -> (exit code, signal); the last attempt wins."""
    out: dict[str, tuple[int, int]] = {}
    for jid, code in _narrow_rows(text, 2, delimiter, "exit codes"):
        if "." not in jid and _EXIT_CODE.fullmatch(code):
            out[jid] = exit_of(code)
    return out


def with_exit_codes(jobs: Sequence[SacctJob],
                    codes: Mapping[str, tuple[int, int]]) -> list[SacctJob]:
    """Jobs with the exit code and signal of the text query where it has the job."""
    out = []
    for sj in jobs:
        got = codes.get(sj.record.job_id)
        if got is not None and got != (sj.record.exit_code, sj.record.signal):
            sj = SacctJob(replace(sj.record, exit_code=got[0], signal=got[1]), sj.attempts)
        out.append(sj)
    return out


def select(jobs: Sequence[SacctJob], *, user: str | None = None, account: str | None = None,
           partition: str | None = None) -> list[SacctJob]:
    """Apply the fleet filters on the client too: Slurm 22.05's sacct returned other users' jobs
    for `--user=nobody` on the sandbox, so its own filtering is not relied on."""
    def ok(r: JobRecord) -> bool:
        return ((user is None or r.user == user)
                and (account is None or r.account == account)
                and (partition is None or partition in r.partition.split(",")))

    return [sj for sj in jobs if ok(sj.record)]


ATTEMPT_FIELDS = ("JobID", "Submit", "Start", "End", "ElapsedRaw", "State")


def records_argv(selection: Sequence[str], delimiter: str) -> list[str]:
    """The records query; `delimiter` from `backends.parse.sacct_delimiter()`, fresh per report."""
    return ["sacct", "--noheader", "--parsable2", f"--delimiter={delimiter}",
            f"--format={','.join(SACCT_FIELDS)}", "--duplicates", "--allocations", *selection]


def attempts_argv(selection: Sequence[str], delimiter: str) -> list[str]:
    """The attempts query (no free text; the same delimiter all the same)."""
    return ["sacct", "--noheader", "--parsable2", f"--delimiter={delimiter}", "--duplicates",
            "--allocations", f"--format={','.join(ATTEMPT_FIELDS)}", *selection]


def _epoch(text: str) -> int | None:
    return int(text) if text.isdigit() and int(text) > 0 else None


def _attempt_ok(parts: Sequence[str]) -> bool:
    _, submit, start, end, elapsed, state = parts
    return (all(_EPOCH_OR_UNSET.fullmatch(t) for t in (submit, start, end))
            and elapsed.isdigit() and _STATE.fullmatch(state) is not None)


def parse_attempts(text: str, delimiter: str = RECORDED_NARROW_DELIMITER
                   ) -> dict[str, list[Attempt]]:
    """`JobID|Submit|Start|End|ElapsedRaw|State` rows (epoch times) -> job id -> attempts."""
    out: dict[str, list[Attempt]] = {}
    rows = _narrow_rows(text, len(ATTEMPT_FIELDS), delimiter, "attempts")
    good = [p for p in rows if _attempt_ok(p)]
    if len(good) < len(rows):
        _log.warning("slurmpod: warning: sacct attempts: left out %d line(s) with times or "
                     "state not as Slurm prints them", len(rows) - len(good))
    for parts in good:
        jid, submit, start, end, elapsed, state = parts
        if "." in jid:
            continue
        out.setdefault(jid, []).append(Attempt(
            submit_s=_epoch(submit), start_s=_epoch(start), end_s=_epoch(end),
            elapsed_s=int(elapsed) if elapsed.isdigit() else 0,
            state=str(state_of(state))))
    return out


def jobs_from_text(records_text: str, attempts_text: str,
                   delimiter: str | None = None) -> list[SacctJob]:
    """The two text queries' outputs -> jobs in sacct's order, with their attempts. `delimiter`
    is the one both queries were run with; None reads the recorded samples (records with
    `backends.parse.SACCT_DELIMITER`, attempts with `|`)."""
    attempts = parse_attempts(attempts_text, delimiter or RECORDED_NARROW_DELIMITER)
    return [SacctJob(r, tuple(attempts.get(r.job_id, ())))
            for r in parse_sacct_parsable(records_text, delimiter=delimiter or SACCT_DELIMITER)]
