"""Pure parsers: Slurm CLI output text -> model types (no subprocess, no clock, no environment).

Covered shapes (recorded samples live in tests/data/slurm/<version>/):
- Slurm 22.05 `squeue --json` (openapi/v0.0.38) and `sacct --json` (openapi/dbv0.0.38);
- Slurm 23.02+ data_parser v0.0.39 … v0.0.4x (24.11 prints v0.0.41): numbers wrapped as
  `{"set": true, "infinite": false, "number": N}`, states as lists (`job_state: ["RUNNING"]`),
  step ids as `"123.batch"`;
- `sacct --parsable2` with slurmpod's own field list and delimiter, and `scontrol show node -o`.
"""

from __future__ import annotations

import json
import logging
import re
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import replace
from datetime import UTC, datetime, tzinfo
from typing import Any

from slurmpod.errors import SlurmError
from slurmpod.model.jobs import JobRecord, JobState, JobStatus, NodeInfo, StepRecord
from slurmpod.model.slurm_time import limit_minutes

# -- generic value helpers ------------------------------------------------------------------


def num(value: Any) -> int | float | None:
    """A Slurm number: plain, or data_parser's `{"set", "infinite", "number"}` wrapper (23.02+)."""
    kind = type(value)
    if kind is str:  # sacct's text columns: the common case of a fleet report, first
        try:
            return int(value)
        except ValueError:
            return None
    if kind is int or kind is float:
        return value
    if isinstance(value, Mapping):
        if not value.get("set", True) or value.get("infinite"):
            return None
        value = value.get("number")
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, int | float):
        return value
    try:
        return int(str(value))
    except ValueError:
        return None


def _int(value: Any, default: int = 0) -> int:
    n = num(value)
    return default if n is None else int(n)


def _int_or_none(value: Any) -> int | None:
    n = num(value)
    return None if n is None else int(n)


def _str(value: Any) -> str:
    return "" if value is None else str(value)


def epoch(value: Any) -> datetime | None:
    """Epoch seconds -> aware UTC datetime; 0/None/unset (not started) -> None."""
    n = num(value)
    return datetime.fromtimestamp(n, UTC) if n else None


def state_of(value: Any) -> JobState:
    """`"RUNNING"`, `["RUNNING", "COMPLETING"]` (23.02+) or `{"current": ..., "reason": ...}`."""
    if isinstance(value, Mapping):
        value = value.get("current")
    if isinstance(value, list | tuple):
        states = [JobState.parse(v) for v in value]
        known = [s for s in states if s is not JobState.UNKNOWN]
        return known[0] if known else JobState.UNKNOWN
    return JobState.parse(_str(value))


def exit_of(value: Any) -> tuple[int, int]:
    """(exit code, signal) from `{"status", "return_code", "signal"}` or sacct's `3:0` text."""
    if isinstance(value, str):
        code, _, sig = value.partition(":")
        return _int(code), _int(sig)
    if not isinstance(value, Mapping):
        return 0, 0
    sig_of = value.get("signal") or {}
    signal = _int(sig_of.get("signal_id", sig_of.get("id"))) if isinstance(sig_of, Mapping) else 0
    return _int(value.get("return_code")), signal


def gpus_from_tres(tres: str) -> int:
    """GPU count from a TRES string: `gres/gpu=32`, else the sum of typed `gres/gpu:h100=32`."""
    untyped = None
    typed = 0
    for item in tres.split(","):
        key, _, val = item.partition("=")
        if key == "gres/gpu":
            untyped = _int(val)
        elif key.startswith("gres/gpu:"):
            typed += _int(val)
    return typed if untyped is None else untyped


def _tres_list_count(items: Any, type_: str, name: str | None = None) -> int | None:
    if not isinstance(items, list):
        return None
    for item in items:
        if item.get("type") == type_ and (name is None or item.get("name") == name):
            return _int(item.get("count"))
    return None


def _nodes(value: Any) -> str:
    text = _str(value.get("range") if isinstance(value, Mapping) else value)
    return "" if text in ("None assigned", "(null)", "None") else text


def load_json(text: str, what: str) -> dict[str, Any]:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise SlurmError(f"{what}: output is not JSON ({exc.msg} at line {exc.lineno})",
                         hint="is this Slurm ≥ 21.08 with JSON output support?") from None
    if not isinstance(data, dict):
        raise SlurmError(f"{what}: expected a JSON object")
    errors = [e for e in data.get("errors") or [] if e]
    if errors:
        first = errors[0]
        msg = first.get("description") or first.get("error") if isinstance(first, dict) else first
        raise SlurmError(f"{what}: Slurm reported: {msg}")
    return data


# -- sbatch ---------------------------------------------------------------------------------


def parse_sbatch_parsable(stdout: str) -> str:
    """`sbatch --parsable` prints `jobid` or `jobid;cluster`."""
    lines = [ln.strip() for ln in stdout.splitlines() if ln.strip()]
    if not lines:
        raise SlurmError("sbatch printed no job id")
    job_id = lines[-1].split(";")[0]
    if not re.fullmatch(r"\d+(_\d+)?(\+\d+)?", job_id):
        raise SlurmError(f"sbatch printed an unexpected job id: {lines[-1]!r}")
    return job_id


# -- squeue --json --------------------------------------------------------------------------


def _array_job_id(raw_id: str, array_job: Any, array_task: Any, het_job: Any = None,
                  het_offset: Any = None) -> str:
    parent = _int(array_job)
    task = num(array_task)
    if parent and task is not None:
        return f"{parent}_{int(task)}"
    het = _int(het_job)
    if het:
        return f"{het}+{_int(het_offset)}"
    return raw_id


def parse_squeue_json(text: str) -> list[JobStatus]:
    data = load_json(text, "squeue --json")
    out = []
    for job in data.get("jobs") or []:
        raw = str(_int(job.get("job_id")))
        state = state_of(job.get("job_state"))
        # 22.05 reports end_time = start + 1 year for a running job without a time limit.
        end = epoch(job.get("end_time")) if state.is_terminal else None
        limit_min = num(job.get("time_limit"))
        out.append(JobStatus(
            job_id=_array_job_id(raw, job.get("array_job_id"), job.get("array_task_id"),
                                 job.get("het_job_id"), job.get("het_job_offset")),
            name=_str(job.get("name")),
            state=state,
            reason=_str(job.get("state_reason")),
            user=_str(job.get("user_name")),
            account=_str(job.get("account")),
            partition=_str(job.get("partition")),
            nodes=_nodes(job.get("nodes")),
            n_nodes=_int(job.get("node_count")),
            n_gpus=gpus_from_tres(_str(job.get("tres_alloc_str"))),
            comment=_str(job.get("comment")),
            admin_comment=_str(job.get("admin_comment")),
            restarts=_int(job.get("restart_cnt")),
            submit_time=epoch(job.get("submit_time")),
            start_time=epoch(job.get("start_time")),
            end_time=end,
            time_limit_s=None if limit_min is None else int(limit_min) * 60,
            work_dir=_str(job.get("current_working_directory")),
        ))
    return out


# -- sacct --json ---------------------------------------------------------------------------


def _step_from_json(step: Mapping[str, Any]) -> StepRecord:
    ident = step.get("step") or {}
    sid = ident.get("id")
    if isinstance(sid, Mapping):  # some versions nest {"job_id", "step_id"}
        sid = sid.get("step_id")
    sid = _str(sid)
    if "." in sid:  # 23.02+: "123.batch"
        sid = sid.split(".", 1)[1]
    code, sig = exit_of(step.get("exit_code"))
    nodes = step.get("nodes") or {}
    time_ = step.get("time") or {}
    return StepRecord(
        step_id=sid,
        name=_str(ident.get("name")),
        state=state_of(step.get("state")),
        exit_code=code,
        signal=sig,
        elapsed_s=_int(time_.get("elapsed")),
        nodes=_nodes(nodes.get("range")),
        n_nodes=_int(nodes.get("count")),
        n_tasks=_int_or_none((step.get("tasks") or {}).get("count")),
        start_time=epoch(time_.get("start")),
        end_time=epoch(time_.get("end")),
    )


def _comment(value: Any, key: str) -> str:
    if isinstance(value, Mapping):
        return _str(value.get(key))
    return _str(value) if key == "job" else ""


def sacct_json_job_id(job: Mapping[str, Any]) -> str:
    """The id of one `sacct --json` job entry: `123`, `123_4` (array task) or `123+1` (het)."""
    array = job.get("array") or {}
    het = job.get("het") or {}
    return _array_job_id(str(_int(job.get("job_id"))), array.get("job_id"), array.get("task_id"),
                         het.get("job_id"), het.get("job_offset"))


def parse_sacct_json(text: str) -> list[JobRecord]:
    """One JobRecord per job id; earlier attempts of a requeued job (`-D`) count as restarts."""
    data = load_json(text, "sacct --json")
    attempts: dict[str, list[JobRecord]] = {}
    for job in data.get("jobs") or []:
        job_id = sacct_json_job_id(job)
        steps = tuple(_step_from_json(s) for s in job.get("steps") or [])
        code, sig = exit_of(job.get("exit_code"))
        batch = next((s for s in steps if s.step_id == "batch"), None)
        if code == 0 and sig == 0 and batch is not None and (batch.exit_code or batch.signal):
            # Slurm 22.05 (dbv0.0.38) prints the job-level exit_code as SUCCESS/0 even for a
            # failed job; the batch step carries the script's real exit status.
            code, sig = batch.exit_code, batch.signal
        time_ = job.get("time") or {}
        tres = (job.get("tres") or {}).get("allocated")
        n_nodes = _tres_list_count(tres, "node")
        record = JobRecord(
            job_id=job_id,
            name=_str(job.get("name")),
            user=_str(job.get("user")),
            account=_str(job.get("account")),
            partition=_str(job.get("partition")),
            state=state_of(job.get("state")),
            exit_code=code,
            signal=sig,
            submit_time=epoch(time_.get("submission")),
            start_time=epoch(time_.get("start")),
            end_time=epoch(time_.get("end")),
            elapsed_s=_int(time_.get("elapsed")),
            nodes=_nodes(job.get("nodes")),
            n_nodes=n_nodes if n_nodes is not None else _int(job.get("allocation_nodes")),
            n_gpus=_tres_list_count(tres, "gres", "gpu") or 0,
            comment=_comment(job.get("comment"), "job"),
            admin_comment=_comment(job.get("comment"), "administrator"),
            restarts=_int(job.get("restart_cnt")),  # 23.02+; absent in 22.05
            steps=steps,
        )
        attempts.setdefault(job_id, []).append(record)
    return [_merge_attempts(recs) for recs in attempts.values()]


def _merge_attempts(records: Sequence[JobRecord]) -> JobRecord:
    """With `sacct -D` a requeued job appears once per attempt; keep the latest, count the rest."""
    if len(records) == 1:
        return records[0]
    latest = records[-1]
    # A RESIZING record is the old allocation of a job Slurm shrank (--no-kill), not a restart.
    restarts = max(latest.restarts,
                   sum(1 for r in records[:-1] if r.state is not JobState.RESIZING))
    return replace(latest, restarts=restarts)


# -- sacct --parsable2 ----------------------------------------------------------------------
#
# sacct prints every field verbatim: `printf("%s%s", value, fields_delimiter)` in
# print_fields_str (src/common/print_fields.c, 22.05 – 24.11), no escaping. A job controls some
# of those fields (Comment, JobName, WorkDir; AdminComment is set by whoever can run sacctmgr)
# and they may hold any byte but NUL: newlines, `|`, the unit separator. So:
# - every query gets its own delimiter (`sacct_delimiter`: the unit separator and 64 random
#   bits, chosen after every job's text was written, so no field can contain it);
# - the field list starts with JobID and ends with JobIDRaw, which no job controls: a record is
#   complete once its delimiters are all seen, however many lines its free text spans;
# - each record must have exactly its fields, and its JobID and JobIDRaw must have Slurm's shapes
#   and agree; one that does not is left out with a warning, never repaired by guessing.

SACCT_FIELDS: tuple[str, ...] = (
    "JobID", "JobName", "User", "Account", "Partition", "State", "ExitCode",
    "Submit", "Start", "End", "ElapsedRaw", "NodeList", "NNodes", "NTasks", "AllocTRES",
    "AdminComment", "Comment", "JobIDRaw",
)
# The first character of every query's delimiter (ASCII unit separator), and the whole delimiter
# of the recorded samples in tests/data/slurm/22.05/.
SACCT_DELIMITER = "\x1f"
# Epoch seconds in sacct's text output, so no guessing at the cluster's time zone.
SACCT_TIME_ENV = {"SLURM_TIME_FORMAT": "%s"}

_log = logging.getLogger("slurmpod.sacct")


def sacct_delimiter() -> str:
    """A fresh `--delimiter` for one sacct query: the unit separator and 16 random hex digits.

    sacct takes any string (22.05.8 and 24.11.5 print it whole between fields, checked on the
    sandbox). A job's text was stored before this query chose its delimiter, so it cannot hold it.
    """
    return SACCT_DELIMITER + secrets.token_hex(8)


# Step ids as log_build_step_id_str prints them (src/common/log.c, 22.05 – 24.11): batch, extern,
# interactive, TDB (a pending step, spelled so), a number; `+N` for a het step component.
_STEP = r"(?:batch|extern|interactive|TDB|\d+)(?:\+\d+)?"
# slurmdb_get_job_id_str: `123`, array task `123_4`, pending array `123_[1-9%2]` (also
# `1-99:2` and a `...`-truncated list), het component `123+1`; then `.step`.
_JOB_ID = re.compile(rf"(?P<base>\d+)(?P<kind>_\d+|_\[[0-9,:%.\-]+\]|\+\d+)?"
                     rf"(?:\.(?P<step>{_STEP}))?")
_JOB_ID_RAW = re.compile(rf"(?P<base>\d+)(?:\.(?P<step>{_STEP}))?")
_ID_FIELDS = frozenset({"JobID", "JobIDRaw"})


def is_job_id(text: str) -> bool:
    """True for a JobID as sacct prints it (`123`, `123_4`, `123_[1-3]`, `123+1`, `123.batch`)."""
    return _JOB_ID.fullmatch(text) is not None


def job_ids_agree(job_id: str, raw: str) -> bool:
    """True when sacct's JobID and JobIDRaw of one row have Slurm's shapes and name the same
    job: the same step, and the same number unless JobID is an array task or het component
    (which have their own raw id: `4_1` is raw `5`, `38+1` is raw `39`)."""
    j = _JOB_ID.fullmatch(job_id)
    r = _JOB_ID_RAW.fullmatch(raw)
    if j is None or r is None or j["step"] != r["step"]:
        return False
    return j["kind"] is not None or j["base"] == r["base"]


def sacct_rows(text: str, fields: Sequence[str], delimiter: str) -> list[dict[str, str]]:
    """The verified records of `sacct --noheader --parsable2 --delimiter=… --format=<fields>`.

    `fields` must start and end with JobID and JobIDRaw (either order). A record whose field
    count or ids do not check out is left out, with one warning for the whole output.
    """
    if {fields[0], fields[-1]} != _ID_FIELDS or not delimiter or "\n" in delimiter:
        raise ValueError("sacct fields must start and end with JobID and JobIDRaw")
    n = len(fields)
    rows: list[dict[str, str]] = []
    bad: list[str] = []
    pending: list[str] = []
    seen = 0
    # split("\n"), not splitlines(): a Comment may hold \r, \x85 or \u2028, which sacct does
    # not end rows with.
    for line in text.rstrip("\n").split("\n"):
        if not pending and not line:
            continue
        pending.append(line)
        seen += line.count(delimiter)
        if seen < n - 1:
            continue
        record = "\n".join(pending)
        pending, seen = [], 0
        values = record.split(delimiter)
        row = dict(zip(fields, values, strict=True)) if len(values) == n else None
        if row is not None and job_ids_agree(row["JobID"], row["JobIDRaw"]):
            rows.append(row)
        else:
            bad.append(record)
    if pending:
        bad.append("\n".join(pending))
    if bad:
        _log.warning("slurmpod: warning: sacct: left out %d record(s) that do not check out "
                     "(fields or job ids not as Slurm prints them), first: %.120r",
                     len(bad), bad[0])
    return rows


def _sacct_time(text: str, tz: tzinfo) -> datetime | None:
    if not text or text in ("Unknown", "None", "N/A"):
        return None
    if text.isdigit():  # SLURM_TIME_FORMAT=%s
        return datetime.fromtimestamp(int(text), UTC) if int(text) else None
    try:
        return datetime.fromisoformat(text).replace(tzinfo=tz)
    except ValueError:
        return None


def parse_sacct_parsable(
    text: str,
    fields: Sequence[str] = SACCT_FIELDS,
    delimiter: str = SACCT_DELIMITER,
    tz: tzinfo = UTC,
) -> list[JobRecord]:
    """Records from `sacct --noheader --parsable2 --delimiter=… --format=<fields>`; pass the
    query's own delimiter (`sacct_delimiter`). The default is the recorded samples'.

    sacct prints local wall-clock times without an offset, so the caller passes the cluster's
    time zone (none needed with `SACCT_TIME_ENV`).
    """
    groups: dict[str, list[tuple[dict[str, str], list[dict[str, str]]]]] = {}
    for row in sacct_rows(text, fields, delimiter):
        base, dot, _ = row["JobID"].partition(".")
        if not dot:
            groups.setdefault(base, []).append((row, []))
        elif base in groups:
            groups[base][-1][1].append(row)
    return [_merge_attempts([_record_from_row(r, s, tz) for r, s in attempts])
            for attempts in groups.values()]


def _row_common(row: dict[str, str], tz: tzinfo) -> dict[str, Any]:
    """The fields a job row and a step row read from the same sacct columns."""
    code, sig = exit_of(row.get("ExitCode", "0:0"))
    return {
        "name": row.get("JobName", ""),
        "state": JobState.parse(row.get("State")),
        "exit_code": code,
        "signal": sig,
        "elapsed_s": _int(row.get("ElapsedRaw")),
        "nodes": _nodes(row.get("NodeList")),
        "n_nodes": _int(row.get("NNodes")),
        "start_time": _sacct_time(row.get("Start", ""), tz),
        "end_time": _sacct_time(row.get("End", ""), tz),
    }


def _record_from_row(row: dict[str, str], steps: list[dict[str, str]], tz: tzinfo) -> JobRecord:
    return JobRecord(
        job_id=row.get("JobID", ""),
        user=row.get("User", ""),
        account=row.get("Account", ""),
        partition=row.get("Partition", ""),
        submit_time=_sacct_time(row.get("Submit", ""), tz),
        n_gpus=gpus_from_tres(row.get("AllocTRES", "")),
        comment=row.get("Comment", ""),
        admin_comment=row.get("AdminComment", ""),
        steps=tuple(_step_from_row(s, tz) for s in steps),
        **_row_common(row, tz),
    )


def _step_from_row(row: dict[str, str], tz: tzinfo) -> StepRecord:
    ntasks = row.get("NTasks", "")
    return StepRecord(
        step_id=row.get("JobID", "").partition(".")[2],
        n_tasks=int(ntasks) if ntasks.isdigit() else None,
        **_row_common(row, tz),
    )


# -- scontrol show node -o -----------------------------------------------------------------

_KV = re.compile(r"(\w[\w:/]*)=(.*?)(?=\s+\w[\w:/]*=|$)")


def parse_scontrol_kv(line: str) -> dict[str, str]:
    """`Key=Value Key2=Value with spaces ...` (one-line scontrol output) -> dict."""
    return {m.group(1): m.group(2).strip() for m in _KV.finditer(line.strip())}


def parse_scontrol_nodes(text: str) -> list[NodeInfo]:
    nodes = []
    for line in text.splitlines():
        if not line.startswith("NodeName="):
            continue
        kv = parse_scontrol_kv(line)
        words = kv.get("State", "UNKNOWN").split("+")
        gres = kv.get("Gres", "")
        gpus = sum(_int(m.group(1)) for m in re.finditer(r"gpu(?::[\w.-]+)?:(\d+)", gres))
        feats = kv.get("AvailableFeatures", "")
        parts = kv.get("Partitions", "")
        reason = kv.get("Reason", "")
        nodes.append(NodeInfo(
            name=kv["NodeName"],
            state=words[0].rstrip("*~#!%$@^-").upper(),
            flags=tuple(w.upper() for w in words[1:]),
            cpus=_int(kv.get("CPUTot")),
            real_memory_mb=_int(kv.get("RealMemory")),
            n_gpus=gpus,
            features=tuple(f for f in feats.split(",") if f and f != "(null)"),
            partitions=tuple(p for p in parts.split(",") if p and p != "(null)"),
            reason="" if reason in ("", "(null)") else reason,
        ))
    return nodes


def parse_scontrol_partitions(text: str) -> dict[str, tuple[bool, int | None]]:
    """`scontrol --oneliner show partition` -> {name: (is the default, MaxTime in minutes or
    None for UNLIMITED)}. The default partition is `Default=YES` (sinfo's `*`)."""
    out: dict[str, tuple[bool, int | None]] = {}
    for line in text.splitlines():
        if not line.startswith("PartitionName="):
            continue
        kv = parse_scontrol_kv(line)
        try:
            max_min = limit_minutes(kv.get("MaxTime", "UNLIMITED"))
        except ValueError:
            max_min = None  # a form this Slurm prints that we do not know: no check
        out[kv["PartitionName"]] = (kv.get("Default", "NO").upper() == "YES", max_min)
    return out


def partition_max_time(parts: dict[str, tuple[bool, int | None]],
                       partition: str | None) -> int | None:
    """MaxTime (minutes) of `partition`, or of the default one when None; None when unlimited
    or unknown (sbatch then reports an unknown partition itself)."""
    if partition is None:
        partition = next((name for name, (dflt, _) in parts.items() if dflt), None)
    entry = parts.get(partition) if partition is not None else None
    return entry[1] if entry else None


# -- sacct usage fields (seff-style efficiency) ---------------------------------------------
#
# One job's usage, step rows included: the allocation row's TotalCPU is the sum of its steps'
# only without --allocations (with -X, 22.05.8 and 24.11.5 print 00:00:00, checked on the
# sandbox), and MaxRSS / TRESUsageIn* exist only on step rows. No field here is job-controlled
# text, but the query still takes its own delimiter and the JobID … JobIDRaw frame
# (`sacct_rows`). Recorded outputs: tests/data/report/usage-22.05/, usage-24.11/.

USAGE_FIELDS: tuple[str, ...] = (
    "JobID", "State", "ElapsedRaw", "TimelimitRaw", "AllocCPUS", "TotalCPU", "CPUTimeRAW",
    "ReqMem", "MaxRSS", "NNodes", "NTasks", "AllocTRES", "ReqTRES", "TRESUsageInTot",
    "TRESUsageInMax", "ConsumedEnergyRaw", "JobIDRaw",
)
# sacct's unit suffixes (convert_num_unit, powers of 1024); a bare number is the base unit.
_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40, "P": 1 << 50}
_SIZE = re.compile(r"(\d+(?:\.\d+)?)([KMGTP]?)")
# ReqMem: `4000M` (21.08 on: the job's total, from ReqTRES mem), `16Gn` / `16Gc` (up to 20.11:
# per node / per CPU).
_REQ_MEM = re.compile(r"(\d+(?:\.\d+)?)([KMGTP]?)([nc]?)")


def size_bytes(text: str) -> int | None:
    """A sacct size (`322100K`, `4000M`, `1.50G`, `1718104`) -> bytes; None when empty or not
    a size. A bare number is bytes (TRESUsageIn's `fs/disk=1718104`)."""
    m = _SIZE.fullmatch(text.strip())
    if m is None:
        return None
    return int(float(m.group(1)) * _UNITS[m.group(2)])


def req_mem(text: str) -> tuple[int | None, str]:
    """ReqMem -> (bytes, per): per is "job" (21.08+: the whole job, e.g. 500G for 2 nodes of
    250G), "node" (`16Gn`) or "cpu" (`16Gc`); (None, "") when unset or not a size."""
    m = _REQ_MEM.fullmatch(text.strip())
    if m is None:
        return None, ""
    value = int(float(m.group(1)) * _UNITS[m.group(2)])
    return value, {"n": "node", "c": "cpu"}.get(m.group(3), "job")


def tres_values(text: str) -> dict[str, str]:
    """`cpu=00:00:03,energy=0,gres/gpuutil=87,mem=322100K` -> {name: value text}."""
    out: dict[str, str] = {}
    for item in text.split(","):
        key, eq, val = item.partition("=")
        if eq and key:
            out[key] = val
    return out
