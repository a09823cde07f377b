"""Pure: one row of `slurmpod runs` from a job, its attempts and the tail of its main log.

Where each figure comes from (first that is known):
- iteration / train_iters: the last iteration line of the log tail; else the checkpointed
  iteration of the latest ended attempt; else the live monitor's `iter` in the Comment.
- MFU: the live monitor's `mfu` in the Comment; else from the log tail: FLOPs per iteration
  (the submit-time Comment) / (median recent iteration time × GPUs × peak), else Megatron's own
  TFLOP/s (`--log-throughput`) / peak.
- ETA (running jobs only): remaining iterations × the median time of the last `RECENT_ITERS`
  logged iterations of the latest launch. Queue waits and future requeues are not in it.
"""

from __future__ import annotations

import math
import shlex
from dataclasses import dataclass
from typing import Any

import numpy as np

from slurmpod.accounting.logparse import LogSummary
from slurmpod.model.comment import decode_field, parse_initial_comment
from slurmpod.model.hostlist import compress
from slurmpod.model.jobs import JobState, JobStatus
from slurmpod.runs.attempts import Attempt, fault_text, faults

RECENT_ITERS = 20
JSON_KEYS = (
    "job_id", "run", "name", "user", "state", "reason", "attempt", "attempt_running",
    "last_end", "last_rc", "failures", "max_restarts", "iteration", "train_iters",
    "checkpoint_iteration", "iteration_s", "mfu", "mfu_source", "eta_s", "nodes", "n_nodes",
    "work_dir", "log", "submit_time", "start_time", "end_time", "attempts_skipped_lines",
    "attempts",
)
ATTEMPT_KEYS = ("attempt", "restart", "start_time", "end_time", "nodes", "end", "rc",
                "iteration", "progress", "faults")
SHOWN_ATTEMPTS = 5  # the text view's fault lines: the latest attempts of each run


def comment_doc(comment: str) -> dict[str, Any]:
    """The job's Comment as slurmpod wrote it (submit keys + the live monitor's), or {}."""
    return decode_field(comment) or {}


def is_slurmpod_job(job: JobStatus) -> bool:
    """slurmpod's jobs carry a JSON Comment naming slurmpod (render.sbatch.compact_comment)."""
    doc = comment_doc(job.comment)
    return "slurmpod" in doc or isinstance(doc.get("run"), str)


def run_name(job: JobStatus) -> str:
    run = comment_doc(job.comment).get("run")
    return run[:200] if isinstance(run, str) and run else job.name


def log_path(job: JobStatus) -> str:
    """The main log by the contract with the job script: RUN_DIR/logs/<job name>-<job id>.out."""
    return f"{job.work_dir.rstrip('/')}/logs/{job.name}-{job.job_id}.out" if job.work_dir else ""


def attempts_path(work_dir: str) -> str:
    return f"{work_dir.rstrip('/')}/.slurmpod/attempts.jsonl"


def _finite(x: Any, lo: float = 0.0, hi: float = math.inf) -> float | None:
    if isinstance(x, bool) or not isinstance(x, int | float):
        return None
    f = float(x)
    return f if math.isfinite(f) and lo <= f <= hi else None


@dataclass(frozen=True)
class LogFigures:
    iteration: int | None = None
    train_iters: int | None = None
    iteration_s: float | None = None  # median of the recent iterations of the latest launch
    tflops_reported: float | None = None


def log_figures(summary: LogSummary | None) -> LogFigures:
    if summary is None or len(summary.iterations) == 0:
        return LogFigures()
    it = summary.iterations
    last_seg = it.segment[-1]
    recent = np.flatnonzero(it.segment == last_seg)[-RECENT_ITERS:]
    ms = it.elapsed_ms[recent]
    ms = ms[np.isfinite(ms) & (ms > 0)]
    tf = it.tflops_reported[recent]
    tf = tf[np.isfinite(tf) & (tf > 0)]
    train = int(it.train_iters[-1])
    return LogFigures(
        iteration=int(it.iteration[-1]),
        train_iters=train if train > 0 else None,
        iteration_s=float(np.median(ms)) / 1000.0 if ms.size else None,
        tflops_reported=float(np.median(tf)) if tf.size else None,
    )


@dataclass(frozen=True)
class RunView:
    job: JobStatus
    attempts: tuple[Attempt, ...]
    figures: LogFigures
    skipped_lines: int = 0

    # -- derived ---------------------------------------------------------------------------
    @property
    def latest(self) -> Attempt | None:
        return self.attempts[-1] if self.attempts else None

    @property
    def last_ended(self) -> Attempt | None:
        return next((a for a in reversed(self.attempts) if a.ended), None)

    @property
    def attempt_running(self) -> bool:
        a = self.latest
        return a is not None and not a.ended and self.job.state is JobState.RUNNING

    @property
    def iteration(self) -> tuple[int | None, int | None]:
        f = self.figures
        if f.iteration is not None:
            return f.iteration, f.train_iters
        ended = self.last_ended
        if ended is not None and ended.iteration is not None:
            return ended.iteration, f.train_iters
        it = comment_doc(self.job.comment).get("iter")
        return (it if isinstance(it, int) and not isinstance(it, bool) and it >= 0
                else None), f.train_iters

    @property
    def mfu(self) -> tuple[float | None, str | None]:
        doc = comment_doc(self.job.comment)
        live = _finite(doc.get("mfu"), 0.0, 10.0)
        if live is not None:
            return live, "comment"
        facts = parse_initial_comment(self.job.comment)
        peak = _finite(facts.get("peak"), 1e-9)
        f = self.figures
        if peak is None:
            return None, None
        flops = _finite(facts.get("flops_per_iter"), 1.0)
        gpus = _finite(facts.get("gpus"), 1.0)
        if flops and gpus and f.iteration_s:
            return flops / (f.iteration_s * gpus * peak * 1e12), "log"
        if f.tflops_reported:
            return f.tflops_reported / peak, "log"
        return None, None

    @property
    def eta_s(self) -> int | None:
        it, total = self.iteration
        step = self.figures.iteration_s
        if self.job.state is not JobState.RUNNING or it is None or not total or not step:
            return None
        return round(max(0, total - it) * step)

    @property
    def nodes(self) -> str:
        a = self.latest
        if a is not None and a.nodes and not a.ended:
            return compress(sorted(a.nodes))
        return self.job.nodes

    # -- output ----------------------------------------------------------------------------
    def to_json(self) -> dict[str, Any]:
        it, total = self.iteration
        mfu, source = self.mfu
        a, ended = self.latest, self.last_ended
        j = self.job

        def t(d: Any) -> int | None:
            return int(d.timestamp()) if d is not None else None

        out = {
            "job_id": j.job_id, "run": run_name(j), "name": j.name, "user": j.user,
            "state": j.state.value, "reason": j.reason or None,
            "attempt": a.attempt if a else None, "attempt_running": self.attempt_running,
            "last_end": ended.end if ended else None, "last_rc": ended.rc if ended else None,
            "failures": ended.failures if ended else None,
            "max_restarts": ended.max_restarts if ended else None,
            "iteration": it, "train_iters": total,
            "checkpoint_iteration": ended.iteration if ended else None,
            "iteration_s": (round(self.figures.iteration_s, 4)
                            if self.figures.iteration_s else None),
            "mfu": round(mfu, 4) if mfu is not None else None, "mfu_source": source,
            "eta_s": self.eta_s, "nodes": self.nodes, "n_nodes": j.n_nodes,
            "work_dir": j.work_dir or None, "log": log_path(j) or None,
            "submit_time": t(j.submit_time), "start_time": t(j.start_time),
            "end_time": t(j.end_time), "attempts_skipped_lines": self.skipped_lines,
            "attempts": [attempt_json(x) for x in self.attempts],
        }
        return out

    def fault_lines(self, limit: int = SHOWN_ATTEMPTS) -> list[str]:
        """`JOB attempt N: fault; fault` for the latest attempts that met a fault."""
        hit = [(a, f) for a in self.attempts if (f := faults(a))]
        lines = [f"{self.job.job_id} attempt {a.attempt}: " + "; ".join(fault_text(x) for x in f)
                 for a, f in hit[-limit:]]
        if len(hit) > limit:
            lines.insert(0, f"{self.job.job_id}: {len(hit) - limit} earlier attempts with "
                            "faults (runs --json lists them all)")
        return lines

    def row(self) -> list[str]:
        it, total = self.iteration
        mfu, _ = self.mfu
        a, ended = self.latest, self.last_ended
        attempt = "-" if a is None else f"{a.attempt}{' (running)' if self.attempt_running else ''}"
        iters = "-" if it is None else f"{it}/{total}" if total else str(it)
        return [self.job.job_id, _printable(run_name(self.job)), self.job.state.value, attempt,
                ended.end if ended and ended.end else "-", iters,
                "-" if mfu is None else f"{100 * mfu:.1f}%", duration(self.eta_s),
                self.nodes or "-"]


def attempt_json(att: Attempt) -> dict[str, Any]:
    """One attempt of `runs --json`: where it ran, how it ended, and its fault events."""
    return {"attempt": att.attempt, "restart": att.restart, "start_time": att.start_s,
            "end_time": att.end_s, "nodes": list(att.nodes), "end": att.end, "rc": att.rc,
            "iteration": att.iteration, "progress": att.progress, "faults": faults(att)}


HEADERS = ("JOB", "RUN", "STATE", "ATTEMPT", "LAST END", "ITER", "MFU", "ETA", "NODES")


def _printable(text: str) -> str:
    """A name as one safe table cell (a comment is user text: no control characters)."""
    return text if text.isprintable() else shlex.quote(text.encode("unicode_escape").decode())


def duration(seconds: int | None) -> str:
    if seconds is None:
        return "-"
    d, rem = divmod(int(seconds), 86400)
    h, rem = divmod(rem, 3600)
    m = rem // 60
    if d:
        return f"{d}d{h:02d}h"
    if h:
        return f"{h}h{m:02d}m"
    return f"{m}m" if m else f"{int(seconds)}s"
