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
    USAGE_FIELDS,
    exit_of,
    gpus_from_tres,
    is_job_id,
    load_json,
    num,
    parse_sacct_json,
    parse_sacct_parsable,
    req_mem,
    sacct_json_job_id,
    sacct_rows,
    size_bytes,
    state_of,
    tres_values,
)
from slurmpod.errors import SlurmError
from slurmpod.model.jobs import JobRecord
from slurmpod.model.slurm_time import elapsed_s, time_limit_raw_s

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
    # GPUs this record held (AllocTRES): a resized job's phases differ (a node removed under
    # --no-kill ends the old record RESIZING). None when the query did not ask (older records).
    gpus: int | None = None

    @property
    def resized(self) -> bool:
        """This record ended because Slurm resized the job, not because it was restarted."""
        return self.state == "RESIZING"


def restarts_of(attempts: Sequence[Attempt]) -> int:
    """Restarts among a job's records: every record but the last, except resizes."""
    return sum(1 for a in attempts[:-1] if not a.resized)


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
            elapsed_s=int(num(t.get("elapsed")) or 0), state=str(state_of(job.get("state"))),
            gpus=_json_gpus(job)))
    records = parse_sacct_json(text)
    return [SacctJob(r, tuple(attempts.get(r.job_id, ()))) for r in records]


def _json_gpus(job: Mapping[str, Any]) -> int | None:
    """GPUs of one `sacct --json` record: tres.allocated's gres/gpu entries (22.05-24.11)."""
    alloc = (job.get("tres") or {}).get("allocated") if isinstance(job.get("tres"), dict) \
        else None
    if not isinstance(alloc, list):
        return None
    n = [num(t.get("count")) for t in alloc if isinstance(t, dict) and t.get("type") == "gres"
         and str(t.get("name", "")).split(":")[0] == "gpu"]
    return int(sum(x for x in n if x)) if n else None


EXIT_CODE_ARGV = ("sacct", "--noheader", "--parsable2", "--allocations", "--duplicates",
                  "--format=JobID,ExitCode")


_EXIT_CODE = re.compile(r"\d+:\d+")
_EPOCH_OR_UNSET = re.compile(r"\d+|Unknown|None|")
_STATE = re.compile(r"[A-Z_]+(?: by \d+)?")  # `CANCELLED by 1000`


def _narrow_rows(text: str, n: int | tuple[int, ...], delimiter: str, what: str
                 ) -> list[list[str]]:
    """Lines of a query without free text, each exactly `n` fields (one of them, for a tuple)
    with a job id first; others are left out with one warning. split("\\n"), not splitlines():
    only \\n ends a sacct row."""
    counts = (n,) if isinstance(n, int) else n
    rows, bad = [], []
    for line in text.rstrip("\n").split("\n"):
        if not line:
            continue
        parts = line.split(delimiter)
        if len(parts) in counts and is_job_id(parts[0]):
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


ATTEMPT_FIELDS = ("JobID", "Submit", "Start", "End", "ElapsedRaw", "State", "AllocTRES")
_TRES = re.compile(r"[A-Za-z0-9/:=,._-]*")  # billing=64,cpu=64,gres/gpu=16,mem=500G,node=2


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
    _, submit, start, end, elapsed, state, *tres = parts
    return (all(_EPOCH_OR_UNSET.fullmatch(t) for t in (submit, start, end))
            and elapsed.isdigit() and _STATE.fullmatch(state) is not None
            and all(_TRES.fullmatch(t) for t in tres))


def parse_attempts(text: str, delimiter: str = RECORDED_NARROW_DELIMITER
                   ) -> dict[str, list[Attempt]]:
    """`JobID|Submit|Start|End|ElapsedRaw|State|AllocTRES` rows (epoch times) -> job id ->
    attempts. Rows without AllocTRES (recorded before it was asked for) give `gpus` None."""
    out: dict[str, list[Attempt]] = {}
    rows = _narrow_rows(text, (len(ATTEMPT_FIELDS) - 1, len(ATTEMPT_FIELDS)), delimiter,
                        "attempts")
    good = [p for p in rows if _attempt_ok(p)]
    if len(good) < len(rows):
        _log.warning("slurmpod: warning: sacct attempts: left out %d line(s) with times or "
                     "state not as Slurm prints them", len(rows) - len(good))
    for parts in good:
        jid, submit, start, end, elapsed, state, *tres = parts
        if "." in jid:
            continue
        gpus = gpus_from_tres(tres[0]) if tres and "gres/gpu" in tres[0] else \
            (0 if tres and tres[0] else None)
        out.setdefault(jid, []).append(Attempt(
            submit_s=_epoch(submit), start_s=_epoch(start), end_s=_epoch(end),
            elapsed_s=int(elapsed) if elapsed.isdigit() else 0,
            state=str(state_of(state)), gpus=gpus))
    return out


def jobs_from_text(records_text: str, attempts_text: str,
                   delimiter: str | None = None) -> list[SacctJob]:
    """The two text queries' outputs -> jobs in sacct's order, with their attempts. `delimiter`
    is the one both queries were run with; None reads the recorded samples (records with
    `backends.parse.SACCT_DELIMITER`, attempts with `|`)."""
    attempts = parse_attempts(attempts_text, delimiter or RECORDED_NARROW_DELIMITER)
    return [SacctJob(r, tuple(attempts.get(r.job_id, ())))
            for r in parse_sacct_parsable(records_text, delimiter=delimiter or SACCT_DELIMITER)]


# -- usage (seff-style efficiency of one job) -----------------------------------------------


@dataclass(frozen=True)
class Usage:
    """What Slurm measured of one job's latest attempt (sacct without --duplicates shows only
    that one, as seff does). None means "not measured", never zero.

    Memory: the peak of the job is the largest step's sum over its tasks of each task's peak
    RSS (`TRESUsageInTot` mem; the batch script and the srun steps run one after the other in
    the usual job, so steps are not added up), falling back to MaxRSS (one task's peak) where a
    step has no TRES usage. jobacct_gather samples every JobAcctGatherFrequency (default 30 s),
    so a shorter spike can be missed. Requested memory is ReqMem for the whole job."""

    job_id: str
    state: str
    elapsed_s: int
    limit_s: int | None  # None: UNLIMITED or the partition's
    alloc_cpus: int
    req_cpus: int | None  # ReqTRES cpu (what the job asked; an exclusive node allocates more)
    cpu_s: float | None  # TotalCPU: user + system time of every step
    cpu_alloc_s: int | None  # CPUTimeRAW: AllocCPUS × elapsed
    req_mem_bytes: int | None
    alloc_mem_bytes: int | None  # AllocTRES mem (an exclusive node gets all of it)
    mem_peak_bytes: int | None
    n_nodes: int
    gpus: int
    steps: int  # steps with usage figures (0 while the first step runs: Slurm stores a step's
    # usage when it ends)
    gpu_util_pct: float | None = None  # Slurm's gres/gpuutil (NVML, last poll), per GPU
    gpu_mem_bytes: int | None = None  # largest gres/gpumem of a task
    energy_j: float | None = None  # ConsumedEnergyRaw (acct_gather_energy), when configured

    @property
    def cpu_efficiency(self) -> float | None:
        if self.cpu_s is None or not self.cpu_alloc_s or not self.steps:
            return None
        return self.cpu_s / self.cpu_alloc_s

    @property
    def mem_efficiency(self) -> float | None:
        if self.mem_peak_bytes is None or not self.req_mem_bytes:
            return None
        return self.mem_peak_bytes / self.req_mem_bytes

    @property
    def time_fraction(self) -> float | None:
        return self.elapsed_s / self.limit_s if self.limit_s else None

    def to_json(self) -> dict[str, Any]:
        return {"elapsed_s": self.elapsed_s, "time_limit_s": self.limit_s,
                "time_fraction": self.time_fraction, "alloc_cpus": self.alloc_cpus,
                "req_cpus": self.req_cpus,
                "cpu_s": self.cpu_s, "cpu_alloc_s": self.cpu_alloc_s,
                "cpu_efficiency": self.cpu_efficiency, "req_mem_bytes": self.req_mem_bytes,
                "alloc_mem_bytes": self.alloc_mem_bytes, "mem_peak_bytes": self.mem_peak_bytes,
                "mem_efficiency": self.mem_efficiency, "n_nodes": self.n_nodes,
                "gpus": self.gpus, "steps_measured": self.steps,
                "gpu_util_pct": self.gpu_util_pct, "gpu_mem_bytes": self.gpu_mem_bytes,
                "energy_j": self.energy_j}


def usage_argv(job_id: str, delimiter: str) -> list[str]:
    """The usage query of one job: every step row (no --allocations: see backends.parse)."""
    return usage_selection_argv([f"--jobs={job_id}"], delimiter)


def usage_selection_argv(selection: Sequence[str], delimiter: str) -> list[str]:
    """The usage query of every job `selection` picks (the fleet's `--efficiency`: its window
    and filters). Step rows make this text 3-4x the records query's, hence opt-in there."""
    return ["sacct", "--noheader", "--parsable2", f"--delimiter={delimiter}",
            f"--format={','.join(USAGE_FIELDS)}", *selection]


def _digits(text: str) -> int | None:
    return int(text) if text.isdigit() else None


def _usage_of(row: Mapping[str, str], steps: Sequence[Mapping[str, str]]) -> Usage:
    req, per = req_mem(row.get("ReqMem", ""))
    n_nodes = _digits(row.get("NNodes", "")) or 0
    alloc_cpus = _digits(row.get("AllocCPUS", "")) or 0
    if req is not None and per == "node":
        req *= max(n_nodes, 1)
    elif req is not None and per == "cpu":
        req *= max(alloc_cpus, 1)
    alloc = tres_values(row.get("AllocTRES", ""))
    peak: int | None = None
    gpu_mem: int | None = None
    util_sum = util_gpus = 0.0
    measured = 0
    for s in steps:
        tot = tres_values(s.get("TRESUsageInTot", ""))
        mx = tres_values(s.get("TRESUsageInMax", ""))
        step_mem = size_bytes(tot.get("mem", "")) or size_bytes(s.get("MaxRSS", ""))
        if step_mem is None and not tot:
            continue  # still running: Slurm stores a step's usage when it ends
        measured += 1
        if step_mem is not None:
            peak = max(peak or 0, step_mem)
        g = size_bytes(mx.get("gres/gpumem", ""))
        if g is not None:
            gpu_mem = max(gpu_mem or 0, g)
        # gpu_nvml adds the SM utilisation of every GPU a task uses; Tot adds the tasks.
        util = tot.get("gres/gpuutil", "")
        step_gpus = gpus_from_tres(s.get("AllocTRES", ""))
        if util.isdigit() and step_gpus:
            util_sum += int(util)
            util_gpus += step_gpus
    util_pct = util_sum / util_gpus if util_gpus else None
    energy = _digits(row.get("ConsumedEnergyRaw", ""))
    return Usage(
        job_id=row["JobID"], state=str(state_of(row.get("State", ""))),
        elapsed_s=_digits(row.get("ElapsedRaw", "")) or 0,
        limit_s=time_limit_raw_s(row.get("TimelimitRaw", "")), alloc_cpus=alloc_cpus,
        req_cpus=_digits(tres_values(row.get("ReqTRES", "")).get("cpu", "")),
        cpu_s=elapsed_s(row.get("TotalCPU", "")),
        cpu_alloc_s=_digits(row.get("CPUTimeRAW", "")),
        req_mem_bytes=req, alloc_mem_bytes=size_bytes(alloc.get("mem", "")),
        mem_peak_bytes=peak, n_nodes=n_nodes, gpus=gpus_from_tres(row.get("AllocTRES", "")),
        steps=measured,
        # A sum over GPUs above 100 % per GPU is not a reading (range check, as telemetry's).
        gpu_util_pct=util_pct if util_pct is not None and 0 <= util_pct <= 100 else None,
        gpu_mem_bytes=gpu_mem,
        # 0 is what sacct prints without an energy plugin (AcctGatherEnergyType=none).
        energy_j=float(energy) if energy else None)


def parse_usage(text: str, delimiter: str) -> dict[str, Usage]:
    """The usage query's output -> job id -> its latest attempt's Usage."""
    jobs: dict[str, tuple[dict[str, str], list[dict[str, str]]]] = {}
    for row in sacct_rows(text, USAGE_FIELDS, delimiter):
        base, dot, _ = row["JobID"].partition(".")
        if not dot:
            jobs[base] = (row, [])
        elif base in jobs:
            jobs[base][1].append(row)
    return {jid: _usage_of(row, steps) for jid, (row, steps) in jobs.items()}
