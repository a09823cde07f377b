"""Job model types returned by every Slurm backend: live status, accounting records and nodes.

Pure data (no I/O). Slurm's CamelCase and JSON field names become snake_case at the parser
boundary; times are timezone-aware datetimes; job ids are strings (`123`, `123_4`, `123+1`).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum


class JobState(StrEnum):
    """Base job states (Slurm `job_state_string`; flags such as `+COMPLETING` are stripped)."""

    PENDING = "PENDING"
    CONFIGURING = "CONFIGURING"
    RUNNING = "RUNNING"
    SUSPENDED = "SUSPENDED"
    COMPLETING = "COMPLETING"
    COMPLETED = "COMPLETED"
    CANCELLED = "CANCELLED"
    FAILED = "FAILED"
    TIMEOUT = "TIMEOUT"
    NODE_FAIL = "NODE_FAIL"
    PREEMPTED = "PREEMPTED"
    BOOT_FAIL = "BOOT_FAIL"
    DEADLINE = "DEADLINE"
    OUT_OF_MEMORY = "OUT_OF_MEMORY"
    REQUEUED = "REQUEUED"
    REQUEUE_HOLD = "REQUEUE_HOLD"
    REQUEUE_FED = "REQUEUE_FED"
    RESIZING = "RESIZING"
    REVOKED = "REVOKED"
    SPECIAL_EXIT = "SPECIAL_EXIT"
    STOPPED = "STOPPED"
    UNKNOWN = "UNKNOWN"

    @property
    def is_terminal(self) -> bool:
        return self in _TERMINAL

    @property
    def is_active(self) -> bool:
        return not self.is_terminal

    @classmethod
    def parse(cls, text: str | None) -> JobState:
        """`CANCELLED by 0`, `COMPLETED+`, `RUNNING,COMPLETING` and abbreviations like `CA`."""
        if not text:
            return cls.UNKNOWN
        return _parse_state(text)


_TERMINAL = frozenset({
    JobState.COMPLETED, JobState.CANCELLED, JobState.FAILED, JobState.TIMEOUT,
    JobState.NODE_FAIL, JobState.PREEMPTED, JobState.BOOT_FAIL, JobState.DEADLINE,
    JobState.OUT_OF_MEMORY, JobState.REVOKED, JobState.SPECIAL_EXIT,
})
# squeue/sacct short codes (squeue(1) "JOB STATE CODES")
_ABBREV = {
    "PD": "PENDING", "CF": "CONFIGURING", "R": "RUNNING", "S": "SUSPENDED", "CG": "COMPLETING",
    "CD": "COMPLETED", "CA": "CANCELLED", "F": "FAILED", "TO": "TIMEOUT", "NF": "NODE_FAIL",
    "PR": "PREEMPTED", "BF": "BOOT_FAIL", "DL": "DEADLINE", "OOM": "OUT_OF_MEMORY",
    "RQ": "REQUEUED", "RH": "REQUEUE_HOLD", "RF": "REQUEUE_FED", "RS": "RESIZING",
    "RV": "REVOKED", "SE": "SPECIAL_EXIT", "ST": "STOPPED",
}


@dataclass(frozen=True)
class JobStatus:
    """A job as the controller sees it now (squeue / scontrol)."""

    job_id: str
    name: str
    state: JobState
    reason: str = ""
    user: str = ""
    account: str = ""
    partition: str = ""
    nodes: str = ""  # Slurm hostlist expression, "" while pending
    n_nodes: int = 0
    n_gpus: int = 0
    comment: str = ""
    admin_comment: str = ""
    restarts: int = 0
    submit_time: datetime | None = None
    start_time: datetime | None = None
    end_time: datetime | None = None
    time_limit_s: int | None = None  # None = unlimited/unknown
    work_dir: str = ""  # the job's working directory (sbatch --chdir); "" when not reported


@dataclass(frozen=True)
class StepRecord:
    """One step of a job from accounting: `batch`, `extern`, `interactive` or a number."""

    step_id: str  # the part after the dot: "batch", "extern", "0", "0+1"
    name: str
    state: JobState
    exit_code: int
    signal: int
    elapsed_s: int
    nodes: str
    n_nodes: int
    n_tasks: int | None = None
    start_time: datetime | None = None
    end_time: datetime | None = None

    @property
    def is_user_step(self) -> bool:
        """True for srun steps (numbered), false for the batch script and extern containers."""
        return self.step_id not in ("batch", "extern", "interactive")


@dataclass(frozen=True)
class JobRecord:
    """One job from accounting (sacct), with its step rows gathered under it.

    sacct prints a row for the allocation plus `.batch`, `.extern` and one per srun step; only
    the allocation row describes the job. Steps are kept, never summed into the job's figures.
    """

    job_id: str
    name: str
    user: str
    account: str
    partition: str
    state: JobState
    exit_code: int
    signal: int
    submit_time: datetime | None
    start_time: datetime | None
    end_time: datetime | None
    elapsed_s: int
    nodes: str  # hostlist expression; "None assigned" becomes ""
    n_nodes: int
    n_gpus: int  # from AllocTRES gres/gpu
    comment: str = ""
    admin_comment: str = ""
    restarts: int = 0  # times requeued (earlier attempts seen in accounting)
    steps: tuple[StepRecord, ...] = field(default_factory=tuple)

    @property
    def gpu_seconds(self) -> int:
        return self.n_gpus * self.elapsed_s

    def step(self, step_id: str) -> StepRecord | None:
        return next((s for s in self.steps if s.step_id == step_id), None)

    @property
    def user_steps(self) -> tuple[StepRecord, ...]:
        return tuple(s for s in self.steps if s.is_user_step)


@dataclass(frozen=True)
class NodeInfo:
    """One node as the controller reports it (scontrol show node / sinfo)."""

    name: str
    state: str  # base state, upper case: IDLE, ALLOCATED, MIXED, DOWN, ...
    flags: tuple[str, ...] = ()  # DRAIN, NOT_RESPONDING, ...
    cpus: int = 0
    real_memory_mb: int = 0
    n_gpus: int = 0
    features: tuple[str, ...] = ()
    partitions: tuple[str, ...] = ()
    reason: str = ""

    @property
    def available(self) -> bool:
        return self.state in ("IDLE", "MIXED", "ALLOCATED", "COMPLETING") and not (
            {"DRAIN", "DRAINING", "DRAINED", "NOT_RESPONDING", "FAIL"} & set(self.flags)
        )


@functools.lru_cache(maxsize=256)
def _parse_state(text: str) -> JobState:
    """JobState.parse for a non-empty text; cached: a fleet report parses one per sacct row, and
    the texts repeat (`CANCELLED by 1000` varies only by uid)."""
    word = text.strip().split()[0].split(",")[0].rstrip("+").upper()
    word = _ABBREV.get(word, word)
    try:
        return JobState(word)
    except ValueError:
        return JobState.UNKNOWN
