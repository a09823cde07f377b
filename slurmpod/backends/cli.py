"""CliBackend: drive Slurm through its commands (sbatch, squeue, sacct, scontrol, scancel).

Runs through any CommandRunner, so the same code submits locally or over SSH. Read-only queries
get a bounded retry when the controller or slurmdbd is briefly unreachable; sbatch is never
retried, because a timed-out submission may still have been queued.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import PurePath

from slurmpod.backends.base import Script, parent_id, wanted
from slurmpod.backends.parse import (
    SACCT_FIELDS,
    SACCT_TIME_ENV,
    parse_sacct_parsable,
    parse_sbatch_parsable,
    parse_scontrol_nodes,
    parse_scontrol_partitions,
    parse_squeue_json,
    sacct_delimiter,
)
from slurmpod.backends.parse import partition_max_time as pick
from slurmpod.errors import CommandError, SlurmError
from slurmpod.model.jobs import JobRecord, JobStatus, NodeInfo
from slurmpod.transport.base import CommandResult, CommandRunner, CommandTimeoutError

# squeue's stderr when it knows none of the ids asked for (Slurm 25.11)
_UNKNOWN_JOB = "Invalid job id specified"
# stderr fragments of a controller/slurmdbd that is restarting or overloaded (22.05 – 24.11)
_TRANSIENT = (
    "Socket timed out",
    "Unable to contact slurm controller",
    "Connection refused",
    "slurm_persist_conn_open",
    "Zero Bytes were transmitted or received",
    "Resource temporarily unavailable",
)


class CliBackend:
    name = "cli"

    def __init__(
        self,
        runner: CommandRunner,
        *,
        retries: int = 2,
        retry_delay_s: float = 1.0,
        timeout_s: float = 60.0,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.runner = runner
        self.retries = retries
        self.retry_delay_s = retry_delay_s
        self.timeout_s = timeout_s
        self._sleep = sleep

    # -- commands ---------------------------------------------------------------------------
    def query(self, argv: Sequence[str], env: Mapping[str, str] | None = None) -> CommandResult:
        """Run a read-only Slurm command (sinfo, squeue, sacct, scontrol show), retried a
        bounded number of times on transient failures; CommandError naming it otherwise."""
        attempt = 0
        while True:
            try:
                return self.runner.run(argv, timeout_s=self.timeout_s, env=env)
            except CommandError as exc:
                transient = isinstance(exc, CommandTimeoutError) or any(
                    t in exc.stderr for t in _TRANSIENT)
                if not transient or attempt >= self.retries:
                    raise _slurm_error(exc) from None
            attempt += 1
            self._sleep(self.retry_delay_s * attempt)

    def _action(self, argv: Sequence[str]) -> CommandResult:
        try:
            return self.runner.run(argv, timeout_s=self.timeout_s)
        except CommandError as exc:
            raise _slurm_error(exc) from None

    # -- protocol ---------------------------------------------------------------------------
    def version(self) -> str:
        out = self.query(["sinfo", "--version"]).stdout.split()
        return out[-1] if out else ""

    def submit(
        self,
        script: Script,
        *,
        args: Sequence[str] = (),
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
    ) -> str:
        argv = ["sbatch", "--parsable", *args]
        text: str | None = None
        if isinstance(script, PurePath):
            argv.append(str(script))
        else:
            text = script  # sbatch reads the script from stdin when no file is given
        try:
            result = self.runner.run(argv, input_text=text, timeout_s=self.timeout_s,
                                     env=env, cwd=cwd)
        except CommandTimeoutError as exc:
            raise SlurmError(
                f"sbatch timed out after {exc.timeout_s:g} s on {self.runner.where}; "
                "the job may or may not have been queued",
                hint="check `squeue --me` before submitting again, to avoid a duplicate job",
            ) from None
        except CommandError as exc:
            raise _slurm_error(exc, "sbatch rejected the job") from None
        return parse_sbatch_parsable(result.stdout)

    def cancel(self, job_ids: Sequence[str], *, signal: str | None = None,
               steps_only: bool = False) -> None:
        if steps_only and not signal:
            raise ValueError("steps_only needs a signal (scancel without one ends the job)")
        if not job_ids:
            return
        argv = ["scancel"]
        if signal:
            # Without --full (or --batch) scancel signals the steps only, never the batch shell
            # (scancel(1), all releases 22.05 – 25.11).
            argv += [f"--signal={signal}"] if steps_only else [f"--signal={signal}", "--full"]
        self._action([*argv, *job_ids])

    def jobs(
        self,
        *,
        window_s: int | None = None,
        job_ids: Sequence[str] = (),
        name: str | None = None,
        all_users: bool = False,
    ) -> list[JobStatus]:
        from slurmpod.backends.joblist import list_argv, parse_job_list  # lazy: start-up

        delim = sacct_delimiter()  # per query: no job's text can hold it (backends.parse)
        argv = list_argv(window_s=window_s, job_ids=job_ids, name=name, all_users=all_users,
                         delimiter=delim)
        listed = parse_job_list(self.query(argv, env=SACCT_TIME_ENV).stdout, delim)
        if name is not None:
            listed = [j for j in listed if j.name == name]
        active = [j.job_id for j in listed if j.state.is_active]
        # sacct may lag the controller (and the live monitor's Comment updates): take state,
        # nodes and comment of active jobs from squeue.
        live = self.status(active) if active else {}
        out = [_merge_live(j, live.get(j.job_id)) for j in listed]
        return sorted(out, key=_submit_order)

    def status(self, job_ids: Sequence[str]) -> dict[str, JobStatus]:
        if not job_ids:
            return {}
        ids = list(dict.fromkeys(job_ids))
        # Slurm 22.05's `squeue --json` ignores --jobs and dumps every job: filter here too.
        try:
            result = self.query(["squeue", "--json", "--all", "--states=all",
                                  f"--jobs={','.join(ids)}"])
            listed = parse_squeue_json(result.stdout)
        except CommandError as exc:
            # Slurm 25.11 fails when no id is known to the controller (22.05 lists nothing).
            if _UNKNOWN_JOB not in exc.stderr:
                raise
            listed = []
        found = {s.job_id: s for s in listed if wanted(s.job_id, ids)}
        missing = [j for j in ids if j not in found
                   and not any(parent_id(k) == j for k in found)]
        if missing:  # left the controller (MinJobAge): fall back to accounting
            for rec in self.accounting(missing).values():
                found.setdefault(rec.job_id, _status_from_record(rec))
        return found

    def queued(self, name: str) -> list[JobStatus]:
        # Slurm 22.05's `squeue --json` ignores its filters (as --jobs in `status`): filter
        # here too. --name takes a comma list, so the exact name is checked as well.
        result = self.query(["squeue", "--json", f"--name={name}"])
        return [s for s in parse_squeue_json(result.stdout)
                if s.name == name and s.state.is_active]

    def accounting(self, job_ids: Sequence[str]) -> dict[str, JobRecord]:
        if not job_ids:
            return {}
        ids = list(dict.fromkeys(job_ids))
        # --parsable2 rather than --json: 22.05's dbv0.0.38 JSON reports exit code 0 for failed
        # jobs (recorded in tests/data/slurm/22.05/sacct.json), the text ExitCode is right.
        delim = sacct_delimiter()  # per query: no job's text can hold it (backends.parse)
        argv = ["sacct", "--noheader", "--parsable2", f"--delimiter={delim}",
                f"--format={','.join(SACCT_FIELDS)}", "--duplicates", f"--jobs={','.join(ids)}"]
        result = self.query(argv, env=SACCT_TIME_ENV)
        records = parse_sacct_parsable(result.stdout, delimiter=delim)
        return {r.job_id: r for r in records if wanted(r.job_id, ids)}

    def nodes(self, names: str | None = None) -> list[NodeInfo]:
        argv = ["scontrol", "--oneliner", "show", "node"]
        if names:
            argv.append(names)
        return parse_scontrol_nodes(self.query(argv).stdout)

    def partition_max_time(self, partition: str | None) -> int | None:

        # All partitions in one call: `show partition NAME` exits 1 for an unknown name, and
        # the default one (Default=YES) must be found among them anyway.
        text = self.query(["scontrol", "--oneliner", "show", "partition"]).stdout
        return pick(parse_scontrol_partitions(text), partition)

    def update_comment(self, job_id: str, comment: str) -> None:
        # One argv element: scontrol takes everything after `Comment=` as the value.
        self._action(["scontrol", "update", f"JobId={job_id}", f"Comment={comment}"])

    def requeue(self, job_id: str, *, hold: bool = False) -> None:
        self._action(["scontrol", "requeuehold" if hold else "requeue", job_id])


def _slurm_error(exc: CommandError, what: str | None = None) -> CommandError:
    """The same failure (argv, exit code, stderr kept) with a message naming what failed."""
    lines = [ln for ln in exc.stderr.strip().splitlines() if ln.strip()]
    detail = lines[-1] if lines else f"exit code {exc.returncode}"
    cmd = exc.argv[0] if exc.argv else "command"
    hint = exc.hint
    if any(t in exc.stderr for t in _TRANSIENT) or isinstance(exc, CommandTimeoutError):
        hint = "is slurmctld (and slurmdbd for sacct) running? try `sinfo`"
    err = CommandError(list(exc.argv), exc.returncode, exc.stderr, hint=hint)
    err.message = f"{what or cmd + ' failed'}: {detail}"
    err.args = (err.message,)
    return err


def _merge_live(listed: JobStatus, live: JobStatus | None) -> JobStatus:
    if live is None:
        return listed
    return replace(live, work_dir=live.work_dir or listed.work_dir,
                   submit_time=live.submit_time or listed.submit_time)


def _submit_order(job: JobStatus) -> tuple[float, int, str]:
    t = job.submit_time.timestamp() if job.submit_time else 0.0
    head = parent_id(job.job_id)
    return t, int(head) if head.isdigit() else 0, job.job_id


def _status_from_record(rec: JobRecord) -> JobStatus:
    return replace(
        JobStatus(job_id=rec.job_id, name=rec.name, state=rec.state),
        user=rec.user, account=rec.account, partition=rec.partition, nodes=rec.nodes,
        n_nodes=rec.n_nodes, n_gpus=rec.n_gpus, comment=rec.comment,
        admin_comment=rec.admin_comment, restarts=rec.restarts, submit_time=rec.submit_time,
        start_time=rec.start_time, end_time=rec.end_time,
    )
