"""Pure: the sacct query that lists a user's jobs with their working directories, and its parser.

`slurmpod runs`, `logs` and `cancel` find a run's files through its Slurm WorkDir (sbatch
--chdir), which slurmpod's usual `SACCT_FIELDS` do not carry. One allocation row per job (`-X`,
and no `--duplicates`: a requeued job shows its latest attempt only), `--parsable2` with the
query's own delimiter and epoch times, read by `backends.parse.sacct_rows` (docs/backends.md:
job-controlled text). Comment, JobName and WorkDir are free text; JobID opens and JobIDRaw
closes every row.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC

from slurmpod.backends.parse import (
    SACCT_DELIMITER,
    _nodes,
    _sacct_time,
    gpus_from_tres,
    sacct_rows,
)
from slurmpod.model.jobs import JobState, JobStatus

LIST_FIELDS: tuple[str, ...] = (
    "JobID", "JobName", "User", "Account", "Partition", "State", "Submit", "Start", "End",
    "NodeList", "NNodes", "AllocTRES", "WorkDir", "Comment", "JobIDRaw",
)
_NAME_SAFE = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-")


def list_argv(*, window_s: int | None = None, job_ids: Sequence[str] = (),
              name: str | None = None, all_users: bool = False,
              delimiter: str = SACCT_DELIMITER) -> list[str]:
    """sacct's argv for `SlurmBackend.jobs` (see there for the selection); pass a fresh
    `backends.parse.sacct_delimiter()` and the same to `parse_job_list`."""
    argv = ["sacct", "--noheader", "--parsable2", "--allocations",
            f"--delimiter={delimiter}", f"--format={','.join(LIST_FIELDS)}"]
    if job_ids:
        argv.append(f"--jobs={','.join(dict.fromkeys(job_ids))}")
    else:
        # Without --starttime sacct lists only today's jobs; `now-Nseconds` is parse_time's
        # relative form (all releases).
        argv += [f"--starttime=now-{max(0, int(window_s or 0))}seconds", "--endtime=now"]
    if all_users:
        argv.append("--allusers")
    # --name takes a comma list: pass only a plain name; callers filter exactly anyway.
    if name and set(name) <= _NAME_SAFE:
        argv.append(f"--name={name}")
    return argv


def parse_job_list(text: str, delimiter: str = SACCT_DELIMITER) -> list[JobStatus]:
    """Rows of `list_argv`'s output -> JobStatus (sacct has no reason or time limit: left empty)."""
    out: dict[str, JobStatus] = {}
    for row in sacct_rows(text, LIST_FIELDS, delimiter):
        job_id = row["JobID"]
        if not job_id or "." in job_id:
            continue
        nnodes = row.get("NNodes", "")
        out[job_id] = JobStatus(
            job_id=job_id, name=row.get("JobName", ""), state=JobState.parse(row.get("State")),
            user=row.get("User", ""), account=row.get("Account", ""),
            partition=row.get("Partition", ""), nodes=_nodes(row.get("NodeList")),
            n_nodes=int(nnodes) if nnodes.isdigit() else 0,
            n_gpus=gpus_from_tres(row.get("AllocTRES", "")), comment=row.get("Comment", ""),
            submit_time=_sacct_time(row.get("Submit", ""), UTC),
            start_time=_sacct_time(row.get("Start", ""), UTC),
            end_time=_sacct_time(row.get("End", ""), UTC),
            work_dir=row.get("WorkDir", ""),
        )
    return list(out.values())
