"""sacct output -> job records plus every attempt of each job. Pure.

Two inputs give the same `SacctJob`s:
- the text queries `slurmpod report` runs (`records_argv` + `attempts_argv`): slurmpod's
  `--parsable2` field list (`backends.parse.SACCT_FIELDS`, the CLI backend's own parser), one row
  per attempt (`--duplicates --allocations`), and a narrow attempts query without free text.
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

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from slurmpod.backends.parse import (
    SACCT_DELIMITER,
    SACCT_FIELDS,
    exit_of,
    load_json,
    num,
    parse_sacct_json,
    parse_sacct_parsable,
    sacct_json_job_id,
    state_of,
)
from slurmpod.errors import SlurmError
from slurmpod.model.jobs import JobRecord


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


def parse_exit_codes(text: str) -> dict[str, tuple[int, int]]:
    """`JobID|ExitCode` rows -> job id -> (exit code, signal); the last attempt wins."""
    out: dict[str, tuple[int, int]] = {}
    for line in text.splitlines():
        jid, sep, code = line.strip().partition("|")
        if sep and jid and "." not in jid:
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


def records_argv(selection: Sequence[str]) -> list[str]:
    return ["sacct", "--noheader", "--parsable2", f"--delimiter={SACCT_DELIMITER}",
            f"--format={','.join(SACCT_FIELDS)}", "--duplicates", "--allocations", *selection]


def attempts_argv(selection: Sequence[str]) -> list[str]:
    return ["sacct", "--noheader", "--parsable2", "--duplicates", "--allocations",
            f"--format={','.join(ATTEMPT_FIELDS)}", *selection]


def _epoch(text: str) -> int | None:
    return int(text) if text.isdigit() and int(text) > 0 else None


def parse_attempts(text: str) -> dict[str, list[Attempt]]:
    """`JobID|Submit|Start|End|ElapsedRaw|State` rows (epoch times) -> job id -> attempts."""
    out: dict[str, list[Attempt]] = {}
    for line in text.splitlines():
        parts = line.strip().split("|")
        if len(parts) != len(ATTEMPT_FIELDS) or not parts[0] or "." in parts[0]:
            continue
        jid, submit, start, end, elapsed, state = parts
        out.setdefault(jid, []).append(Attempt(
            submit_s=_epoch(submit), start_s=_epoch(start), end_s=_epoch(end),
            elapsed_s=int(elapsed) if elapsed.isdigit() else 0,
            state=str(state_of(state))))
    return out


def jobs_from_text(records_text: str, attempts_text: str) -> list[SacctJob]:
    """The two text queries' outputs -> jobs in sacct's order, with their attempts."""
    attempts = parse_attempts(attempts_text)
    return [SacctJob(r, tuple(attempts.get(r.job_id, ())))
            for r in parse_sacct_parsable(records_text)]
