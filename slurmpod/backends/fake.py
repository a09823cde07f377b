"""FakeBackend: an in-memory Slurm for fast unit tests (kept honest by the contract tests).

It runs nothing. It reads the `#SBATCH` options it needs from the script and the extra args
(job name, nodes, GPUs per node, partition, comment, time limit), schedules jobs FIFO onto whole
free nodes, lets each job "run" for the sum of its `sleep N` lines on the injected clock, and
finishes it with the status of a final `exit N` line (0 otherwise).
"""

from __future__ import annotations

import itertools
import re
import shlex
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import PurePath

from slurmpod.backends.base import Script, wanted
from slurmpod.errors import CommandError
from slurmpod.model.hostlist import compress, expand
from slurmpod.model.jobs import JobRecord, JobState, JobStatus, NodeInfo, StepRecord
from slurmpod.model.slurm_time import limit_minutes


@dataclass
class _Job:
    job_id: str
    name: str
    n_nodes: int
    gpus_per_node: int
    partition: str
    comment: str
    duration_s: float
    exit_code: int
    submit_t: float
    state: JobState = JobState.PENDING
    start_t: float | None = None
    end_t: float | None = None
    nodes: list[str] = field(default_factory=list)
    restarts: int = 0
    attempts: list[JobRecord] = field(default_factory=list)
    signal: int = 0
    work_dir: str = ""
    user: str = ""


_OPT = re.compile(r"^#SBATCH\s+(.*)$")


def _options(script_text: str, args: Sequence[str]) -> dict[str, str]:
    words: list[str] = []
    for line in script_text.splitlines():
        if m := _OPT.match(line.strip()):
            words += shlex.split(m.group(1), comments=True)
        elif line.strip() and not line.startswith("#"):
            break  # sbatch stops reading #SBATCH lines at the first command
    words += list(args)  # command-line args override the script, as with sbatch
    opts: dict[str, str] = {}
    short = {"-J": "job-name", "-N": "nodes", "-p": "partition", "-t": "time", "-D": "chdir"}
    it = iter(words)
    for w in it:
        if w.startswith("--"):
            key, eq, val = w[2:].partition("=")
            opts[key] = val if eq else "1"
        elif w in short:
            opts[short[w]] = next(it, "")
    return opts


class FakeBackend:
    name = "fake"

    def __init__(
        self,
        nodes: str = "gpu[001-016]",
        gpus_per_node: int = 8,
        partitions: Sequence[str] = ("batch",),
        clock: Callable[[], float] = time.time,
        user: str = "root",
        max_time_min: Mapping[str, int] | None = None,  # partition -> MaxTime; absent = none
    ) -> None:
        self._max_time = dict(max_time_min or {})
        self._nodes = expand(nodes)
        self._gpus = gpus_per_node
        self._partitions = list(partitions)
        self._clock = clock
        self._user = user
        self._jobs: dict[str, _Job] = {}
        self._ids = itertools.count(1)
        self._files: dict[str, str] = {}
        self.signals: list[tuple[str, str, bool]] = []  # (job id, signal, steps only) sent

    def add_file(self, path: str, text: str) -> None:
        """Make a script file 'exist' on the fake cluster, for submit(PurePath)."""
        self._files[path] = text

    def version(self) -> str:
        return "fake"

    # -- scheduling -------------------------------------------------------------------------
    def _tick(self) -> None:
        now = self._clock()
        for job in self._jobs.values():
            if job.state is JobState.RUNNING and job.start_t is not None \
                    and now >= job.start_t + job.duration_s:
                job.state = JobState.COMPLETED if job.exit_code == 0 else JobState.FAILED
                job.end_t = job.start_t + job.duration_s
        busy = {n for j in self._jobs.values() if j.state is JobState.RUNNING for n in j.nodes}
        for job in self._jobs.values():  # FIFO, no backfill
            if job.state is not JobState.PENDING:
                continue
            free = [n for n in self._nodes if n not in busy]
            if len(free) < job.n_nodes:
                break
            job.nodes = free[: job.n_nodes]
            busy.update(job.nodes)
            job.state, job.start_t = JobState.RUNNING, now

    def _fail(self, argv: list[str], msg: str) -> CommandError:
        return CommandError(argv, 1, f"{argv[0]}: error: {msg}")

    # -- protocol ---------------------------------------------------------------------------
    def submit(
        self,
        script: Script,
        *,
        args: Sequence[str] = (),
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
    ) -> str:
        argv = ["sbatch", "--parsable", *args]
        if isinstance(script, PurePath):
            if str(script) not in self._files:
                raise self._fail(argv, f"Unable to open file {script}")
            text = self._files[str(script)]
        else:
            text = script
        if not text.startswith("#!"):
            raise self._fail(argv, "This does not look like a batch script.  The first line "
                             "must start with #! followed by the path to an interpreter.")
        opts = _options(text, args)
        partition = opts.get("partition", self._partitions[0])
        if partition not in self._partitions:
            raise self._fail(argv, "Batch job submission failed: Invalid partition name specified")
        n_nodes = int(opts.get("nodes", "1").split("-")[0])
        if n_nodes > len(self._nodes):
            raise self._fail(argv, "Batch job submission failed: Node count specification invalid")
        gpn = opts.get("gpus-per-node", "0").split(":")[-1]
        body = [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.startswith("#")]
        # The script's own top-level `sleep N` lines are its run time; a sleep inside a shell
        # function or loop (indented) runs only on some path, so it does not count.
        duration = sum(float(m.group(1)) for ln in text.splitlines()
                       if (m := re.fullmatch(r"sleep\s+(\d+(?:\.\d+)?)\s*", ln)))
        last = re.fullmatch(r"exit\s+(\d+)", body[-1]) if body else None
        try:
            limit = limit_minutes(opts["time"]) if opts.get("time") else None
        except ValueError:
            raise self._fail(argv, "Invalid --time specification") from None
        job = _Job(
            job_id=str(next(self._ids)), name=opts.get("job-name", "sbatch"), n_nodes=n_nodes,
            gpus_per_node=int(gpn) if gpn.isdigit() else 0, partition=partition,
            comment=opts.get("comment", ""),
            duration_s=duration if limit is None else min(duration, limit * 60.0),
            exit_code=int(last.group(1)) if last else 0, submit_t=self._clock(),
            work_dir=opts.get("chdir") or cwd or "/fake/home", user=self._user,
        )
        self._jobs[job.job_id] = job
        self._tick()
        return job.job_id

    def cancel(self, job_ids: Sequence[str], *, signal: str | None = None,
               steps_only: bool = False) -> None:
        if steps_only and not signal:
            raise ValueError("steps_only needs a signal (scancel without one ends the job)")
        self._tick()
        now = self._clock()
        for jid in job_ids:
            job = self._jobs.get(jid)
            if job is None or job.state.is_terminal:
                continue
            if signal:
                self.signals.append((jid, signal, steps_only))
            # The fake runs no steps: a signal to the steps only reaches nothing, and the batch
            # script (`sleep N`) goes on, as on a real Slurm.
            if steps_only or signal not in (None, "TERM", "KILL"):
                continue
            job.state, job.end_t, job.signal = JobState.CANCELLED, now, 15
            if job.start_t is None:
                job.start_t = now

    def status(self, job_ids: Sequence[str]) -> dict[str, JobStatus]:
        self._tick()
        return {j.job_id: self._status(j) for j in self._jobs.values() if wanted(j.job_id, job_ids)}

    def jobs(
        self,
        *,
        window_s: int | None = None,
        job_ids: Sequence[str] = (),
        name: str | None = None,
        all_users: bool = False,
    ) -> list[JobStatus]:
        self._tick()
        since = self._clock() - (window_s or 0)
        out = []
        for job in self._jobs.values():  # submission order
            if job_ids and not wanted(job.job_id, job_ids):
                continue
            if not job_ids and job.state.is_terminal and (job.end_t or 0) < since:
                continue
            if (name is not None and job.name != name) or \
                    (not all_users and job.user != self._user):
                continue
            out.append(self._status(job))
        return out

    def queued(self, name: str) -> list[JobStatus]:
        self._tick()
        return [self._status(j) for j in self._jobs.values()
                if j.name == name and j.state.is_active]

    def accounting(self, job_ids: Sequence[str]) -> dict[str, JobRecord]:
        self._tick()
        return {j.job_id: self._record(j) for j in self._jobs.values()
                if wanted(j.job_id, job_ids)}

    def nodes(self, names: str | None = None) -> list[NodeInfo]:
        self._tick()
        busy = {n for j in self._jobs.values() if j.state is JobState.RUNNING for n in j.nodes}
        chosen = set(expand(names)) if names else None
        return [
            NodeInfo(name=n, state="ALLOCATED" if n in busy else "IDLE", cpus=32,
                     real_memory_mb=256000, n_gpus=self._gpus, partitions=tuple(self._partitions))
            for n in self._nodes if chosen is None or n in chosen
        ]

    def partition_max_time(self, partition: str | None) -> int | None:
        """The first partition is the default, as in FakeBackend's scheduling."""
        name = partition if partition is not None else self._partitions[0]
        return self._max_time.get(name) if name in self._partitions else None

    def update_comment(self, job_id: str, comment: str) -> None:
        job = self._jobs.get(job_id)
        if job is None:
            raise self._fail(["scontrol", "update"], "Invalid job id specified")
        job.comment = comment

    def requeue(self, job_id: str, *, hold: bool = False) -> None:
        self._tick()
        job = self._jobs.get(job_id)
        argv = ["scontrol", "requeue", job_id]
        if job is None:
            raise self._fail(argv, "Invalid job id specified")
        if job.state is JobState.PENDING:
            raise self._fail(argv, f"Requeue of JobId={job_id} returned an error: "
                             "Job is pending execution")
        earlier = self._record(job)
        job.attempts.append(replace(earlier, state=JobState.REQUEUED))
        job.restarts += 1
        job.state, job.start_t, job.end_t, job.nodes = JobState.PENDING, None, None, []
        if hold:
            job.state = JobState.REQUEUE_HOLD

    # -- views ------------------------------------------------------------------------------
    def _dt(self, t: float | None) -> datetime | None:
        return None if t is None else datetime.fromtimestamp(t, UTC)

    def _status(self, job: _Job) -> JobStatus:
        return JobStatus(
            job_id=job.job_id, name=job.name, state=job.state, user=job.user,
            account="root", partition=job.partition, nodes=compress(job.nodes),
            n_nodes=job.n_nodes, n_gpus=job.n_nodes * job.gpus_per_node if job.nodes else 0,
            comment=job.comment, restarts=job.restarts, submit_time=self._dt(job.submit_t),
            start_time=self._dt(job.start_t), end_time=self._dt(job.end_t),
            work_dir=job.work_dir,
        )

    def _record(self, job: _Job) -> JobRecord:
        now = self._clock()
        elapsed = 0
        if job.start_t is not None:
            elapsed = int((job.end_t if job.end_t is not None else now) - job.start_t)
        steps: tuple[StepRecord, ...] = ()
        if job.start_t is not None:
            batch_state = JobState.CANCELLED if job.state is JobState.CANCELLED else (
                JobState.FAILED if job.state is JobState.FAILED else job.state)
            steps = (StepRecord(
                step_id="batch", name="batch", state=batch_state, exit_code=job.exit_code
                if job.state.is_terminal and job.state is not JobState.CANCELLED else 0,
                signal=job.signal, elapsed_s=elapsed, nodes=job.nodes[0] if job.nodes else "",
                n_nodes=1, n_tasks=1, start_time=self._dt(job.start_t),
                end_time=self._dt(job.end_t)),)
        return JobRecord(
            job_id=job.job_id, name=job.name, user=job.user, account="root",
            partition=job.partition, state=job.state,
            exit_code=job.exit_code if job.state is JobState.FAILED else 0, signal=0,
            submit_time=self._dt(job.submit_t), start_time=self._dt(job.start_t),
            end_time=self._dt(job.end_t), elapsed_s=elapsed, nodes=compress(job.nodes),
            n_nodes=job.n_nodes, n_gpus=job.n_nodes * job.gpus_per_node if job.nodes else 0,
            comment=job.comment, restarts=job.restarts, steps=steps,
        )
