"""Runs against Slurm and the run's files: list, resolve RUN, stream a log, cancel.

Slurm through a SlurmBackend only; files through a CommandRunner only (runs.files), so every
operation works the same on the login node and from a workstation over SSH.
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from slurmpod.accounting.logparse import LogParser
from slurmpod.backends.base import SlurmBackend
from slurmpod.errors import SlurmError, SlurmpodError, UsageError
from slurmpod.model.jobs import JobState, JobStatus
from slurmpod.runs import files
from slurmpod.runs.attempts import Attempt, AttemptLog, parse_attempts
from slurmpod.runs.view import (
    LogFigures,
    RunView,
    attempts_path,
    is_slurmpod_job,
    log_figures,
    log_path,
    run_name,
)
from slurmpod.transport.base import CommandRunner

ATTEMPTS_TAIL_BYTES = 4 << 20  # thousands of attempts; a longer (hostile) file is read from its end
LOG_TAIL_BYTES = 1 << 20  # enough for the last iteration lines among per-rank chatter
RESOLVE_WINDOW_S = 30 * 86400
JOB_ID = re.compile(r"^\d{1,12}(?:_\d{1,12})?(?:\+\d{1,6})?$")
_WINDOW = re.compile(r"^(\d{1,6})\s*([smhdw])$")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def parse_window(text: str, option: str = "--since") -> int:
    """`7d`, `12h`, `2w`, `30m`, `90s` -> seconds."""
    m = _WINDOW.match(text.strip())
    if not m:
        raise UsageError(f"{option} {text!r}: expected a duration like 7d, 12h, 2w or 30m")
    return int(m.group(1)) * _UNIT_S[m.group(2)]


# -- reading a run -------------------------------------------------------------------------------


def load_attempts(runner: CommandRunner, work_dir: str) -> AttemptLog:
    """The run directory's attempts.jsonl (its tail when huge); empty when there is none."""
    if not work_dir:
        return AttemptLog()
    piece = files.try_tail(runner, attempts_path(work_dir), ATTEMPTS_TAIL_BYTES)
    if piece is None:
        return AttemptLog()
    data = piece.data
    truncated = piece.offset > 0
    if truncated:  # the first line is cut: drop it instead of counting it as garbage
        data = data[data.find(b"\n") + 1:] if b"\n" in data else b""
    return parse_attempts(data, truncated=truncated)


def load_view(runner: CommandRunner, job: JobStatus) -> RunView:

    log = load_attempts(runner, job.work_dir)
    figures = LogFigures()
    path = log_path(job)
    piece = files.try_tail(runner, path, LOG_TAIL_BYTES) if path else None
    if piece is not None and piece.data:
        parser = LogParser()
        data = piece.data
        if piece.offset > 0 and b"\n" in data:
            data = data[data.find(b"\n") + 1:]
        parser.feed(data)
        figures = log_figures(parser.close())
    return RunView(job, log.of_job(job.job_id), figures, skipped_lines=log.n_skipped)


def list_runs(backend: SlurmBackend, runner: CommandRunner, *, window_s: int,
              all_users: bool = False) -> list[RunView]:
    jobs = [j for j in backend.jobs(window_s=window_s, all_users=all_users)
            if is_slurmpod_job(j)]
    return [load_view(runner, j) for j in jobs]


def resolve(backend: SlurmBackend, ref: str, *, window_s: int = RESOLVE_WINDOW_S) -> JobStatus:
    """RUN as a job id (any job), or a run name: the most recent job of that name."""
    ref = ref.strip()
    if not ref:
        raise UsageError("RUN is empty: give a job id or a run name")
    if JOB_ID.match(ref):
        found = [j for j in backend.jobs(job_ids=[ref]) if j.job_id == ref]
        if not found:
            raise SlurmError(f"job {ref} is not known to Slurm",
                             hint="check the id with `slurmpod runs`; a new job reaches "
                                  "sacct a few seconds after submission")
        return found[-1]
    found = [j for j in backend.jobs(window_s=window_s, name=ref) if run_name(j) == ref
             or j.name == ref]
    if not found:
        days = window_s // 86400
        raise SlurmError(f"no job of yours named {ref!r} in the last {days} days",
                         hint="`slurmpod runs --since 30d` lists your runs; or give a job id")
    return found[-1]


def need_work_dir(job: JobStatus) -> str:
    if not job.work_dir:
        raise SlurmError(f"job {job.job_id}: Slurm reports no working directory for it",
                         hint="slurmpod finds a run's files through its WorkDir (sbatch --chdir)")
    return job.work_dir


def pick_attempt(log: AttemptLog, job: JobStatus, number: int) -> Attempt:
    att = log.find(job.job_id, number)
    known = [a.attempt for a in log.of_job(job.job_id)]
    if att is None or att.log_offset is None:
        listed = ", ".join(map(str, known)) or "none recorded"
        raise UsageError(f"job {job.job_id} has no attempt {number} with a log offset in "
                         f"{attempts_path(job.work_dir)} (attempts: {listed})")
    return att


# -- logs ----------------------------------------------------------------------------------------


def read_range(runner: CommandRunner, path: str, start: int, end: int | None,
               piece_bytes: int = files.PIECE_BYTES) -> Iterator[bytes]:
    """Bytes [start, end) of `path` (to its current end when `end` is None), piece by piece."""
    off = start
    while end is None or off < end:
        want = piece_bytes if end is None else min(piece_bytes, end - off)
        p = files.read_piece(runner, path, off, want)
        if p.size < start:
            raise SlurmpodError(f"{path} is shorter ({p.size} bytes) than where the attempt "
                                f"starts ({start}): the log was truncated or replaced")
        if not p.data:
            return
        off += len(p.data)
        yield p.data


@dataclass
class Follow:
    """`logs -f`: poll the file's size; stop once the job has ended and the file stopped
    growing (or the followed attempt's range is complete)."""

    runner: CommandRunner
    path: str
    check: Callable[[], tuple[bool, int | None]]  # -> (job ended, end offset or None)
    poll_s: float = 1.0
    check_every_s: float = 5.0
    sleep: Callable[[float], None] = time.sleep
    clock: Callable[[], float] = time.monotonic

    def stream(self, start: int, end: int | None) -> Iterator[bytes]:
        off = start
        last_check = -math.inf
        ended = False
        while True:
            # Check before reading: an attempt's end offset must be known before its bytes
            # are printed (the next attempt's lines follow it in the same file).
            if self.clock() - last_check >= self.check_every_s:
                last_check = self.clock()
                ended, new_end = self.check()
                if new_end is not None:
                    end = new_end
            got = False
            for chunk in read_range(self.runner, self.path, off, end):
                off += len(chunk)
                got = True
                yield chunk
            if end is not None and off >= end:
                return
            if got:
                continue
            if ended:  # the job had ended before this read, and nothing new came
                return
            self.sleep(self.poll_s)


_RANK = re.compile(rb"^\s*(\d{1,7}):\s")
_DECIDE_BYTES = 32  # srun --label pads the rank to the width of the largest task id


class RankFilter:
    """Keep only the lines of one rank (`srun --label` prefixes: `  3: text`), streaming:
    a line is kept or dropped once its first bytes are seen, so no line is held whole."""

    def __init__(self, rank: int) -> None:
        self.rank = rank
        self._head = b""  # start of the current line, while undecided
        self._keep: bool | None = None  # decision for the current line

    def _decide(self, head: bytes) -> bool:
        m = _RANK.match(head)
        return m is not None and int(m.group(1)) == self.rank

    def feed(self, chunk: bytes) -> bytes:
        out: list[bytes] = []
        pos = 0
        while pos < len(chunk):
            nl = chunk.find(b"\n", pos)
            part = chunk[pos:] if nl < 0 else chunk[pos:nl + 1]
            pos = len(chunk) if nl < 0 else nl + 1
            if self._keep is None:
                self._head += part
                if nl < 0 and len(self._head) < _DECIDE_BYTES:
                    continue
                self._keep = self._decide(self._head)
                part, self._head = self._head, b""
            if self._keep:
                out.append(part)
            if nl >= 0:
                self._keep = None
        return b"".join(out)

    def flush(self) -> bytes:
        head, self._head = self._head, b""
        keep = self._keep if self._keep is not None else (bool(head) and self._decide(head))
        self._keep = None
        return head if keep else b""


# -- cancel --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CancelResult:
    job_id: str
    run: str
    state_before: str
    save: bool
    request_file: str | None
    argv: tuple[str, ...]

    def to_json(self) -> dict[str, Any]:
        return {"job_id": self.job_id, "run": self.run, "state_before": self.state_before,
                "action": "save-then-cancel" if self.save else "cancel",
                "request_file": self.request_file, "command": list(self.argv)}

    def message(self) -> str:
        who = f"job {self.job_id} (run {self.run})"
        if self.save:
            return (f"asked {who} to save and stop: wrote {self.request_file} and sent SIGTERM "
                    f"to its steps ({' '.join(self.argv)}); the job ends CANCELLED once the "
                    "checkpoint is saved")
        return f"cancelled {who}: {' '.join(self.argv)}"


def cancel_run(backend: SlurmBackend, runner: CommandRunner, job: JobStatus, *, save: bool,
               now_s: float | None = None) -> CancelResult:
    """Plain: `scancel JOB` (the script sees a cancel and does not requeue). With `save` on a
    running job: write RUN_DIR/.slurmpod/cancel-JOB, then SIGTERM to the steps only; the
    trainer saves (Megatron --exit-signal-handler), the script finds the request, records the
    end `cancelled` and cancels the job. A job that already ended is refused (SlurmError,
    exit 4: what scancel itself answers)."""
    if job.state.is_terminal:
        raise SlurmError(f"job {job.job_id} ({run_name(job)}) already ended "
                         f"{job.state.value}: nothing to cancel",
                         hint="`slurmpod runs` shows the state of your runs")
    run = run_name(job)
    if save and job.state is JobState.RUNNING:
        wd = need_work_dir(job)
        request = f"{wd.rstrip('/')}/.slurmpod/cancel-{job.job_id}"
        stamp = int(time.time() if now_s is None else now_s)
        runner.run(["mkdir", "-p", "--", f"{wd.rstrip('/')}/.slurmpod"], timeout_s=30)
        runner.write_text(request, f"{job.job_id} {stamp}\n")
        backend.cancel([job.job_id], signal="TERM", steps_only=True)
        return CancelResult(job.job_id, run, job.state.value, True, request,
                            ("scancel", "--signal=TERM", job.job_id))
    # not running (pending, requeued): no trainer to save, cancel outright
    backend.cancel([job.job_id])
    return CancelResult(job.job_id, run, job.state.value, False, None, ("scancel", job.job_id))
