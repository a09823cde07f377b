"""The SlurmBackend protocol: what slurmpod asks of Slurm, answered with model types.

Two real implementations (the Slurm CLI through a CommandRunner, and pyslurm) and an in-memory
fake pass the same contract tests (tests/unit/backends/test_contract.py and
tests/integration/test_backend_contract.py).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import PurePath
from typing import Protocol, runtime_checkable

from slurmpod.model.jobs import JobRecord, JobStatus, NodeInfo

Script = str | PurePath
"""A batch script: `str` is the script text; a path names a script file on the Slurm side."""


@runtime_checkable
class SlurmBackend(Protocol):
    name: str

    def version(self) -> str:
        """The running Slurm's version, e.g. `22.05.8`."""
        ...

    def submit(
        self,
        script: Script,
        *,
        args: Sequence[str] = (),
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
    ) -> str:
        """Queue a script once (never retried: a retry could queue it twice); return its id."""
        ...

    def cancel(self, job_ids: Sequence[str], *, signal: str | None = None,
               steps_only: bool = False) -> None:
        """End jobs (`scancel`), or send `signal` to the batch shell and every step
        (`scancel --signal --full`); with `steps_only`, to the job's steps but not its batch
        shell (`scancel --signal`), so the script sees its step end and decides what follows."""
        ...

    def status(self, job_ids: Sequence[str]) -> dict[str, JobStatus]:
        """Live state of many jobs in one call; jobs Slurm no longer knows are left out."""
        ...

    def jobs(
        self,
        *,
        window_s: int | None = None,
        job_ids: Sequence[str] = (),
        name: str | None = None,
        all_users: bool = False,
    ) -> list[JobStatus]:
        """The calling user's jobs (every user's with `all_users`): active ones and those that
        ran in the last `window_s` seconds, or the jobs `job_ids` whatever their age; only those
        named `name` when given. Each with its `work_dir`; the controller's live state and
        comment for jobs still active. Oldest submission first."""
        ...

    def queued(self, name: str) -> list[JobStatus]:
        """Jobs named `name` that the controller holds and that have not ended (every user's),
        with the controller's comment. From slurmctld, never accounting: slurmdbd hears of a
        job asynchronously, and this answers "did that sbatch queue it?" right after sbatch."""
        ...

    def accounting(self, job_ids: Sequence[str]) -> dict[str, JobRecord]:
        """Accounting records with their steps; jobs not (yet) in the database are left out."""
        ...

    def nodes(self, names: str | None = None) -> list[NodeInfo]:
        """Nodes, all or a hostlist expression."""
        ...

    def update_comment(self, job_id: str, comment: str) -> None:
        ...

    def requeue(self, job_id: str, *, hold: bool = False) -> None:
        ...

    def partition_max_time(self, partition: str | None) -> int | None:
        """MaxTime of `partition` (the default partition when None) in minutes; None when
        unlimited or the partition is unknown."""
        ...


def parent_id(job_id: str) -> str:
    """`6_1` (array task) and `38+1` (het component) belong to `6` and `38`."""
    return job_id.split("_")[0].split("+")[0]


def wanted(job_id: str, requested: Sequence[str]) -> bool:
    """True if `job_id` was asked for, directly or through its parent (`6` → `6_1`, `38+0`)."""
    return job_id in requested or parent_id(job_id) in requested
