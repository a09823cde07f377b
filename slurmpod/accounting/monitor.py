"""`slurmpod hook monitor`: follow a running job's log and keep its Comment showing live MFU.

Started in the background by the rendered sbatch script on the batch host, as the job's user.
Every `interval_s` it parses what the log gained since the last look (a fresh incremental parser
per chunk, so memory stays bounded by one chunk plus a window of recent iterations, whatever the
job's length), and sets the job's Comment (Comment v1, see `hooks.build_comment`) with
`scontrol update JobId=N Comment=...` through the CLI backend. It stops when the job is no longer
RUNNING, when the batch script that started it is gone, or on SIGTERM/SIGINT (the sbatch script's
`stop_monitor`) after one last update. Failing updates are logged and retried next interval; the
monitor never fails the job.

Hang detection (`HangDetector`, docs/resilience-in-job.md): between Comment updates the monitor
polls the log every `poll_s`. It follows the phases of each attempt from the lines the batch
script and Megatron print (`slurmpod: attempt N: launching`, iteration lines, `saving
checkpoint` / `successfully saved checkpoint`) and, when no iteration completes for
max(k x the median logged step time x the iterations between log lines, a floor) while
training, or for `setup_s` / `save_s` in the start-up or a save, calls `on_hang` once per
attempt: the CLI records it in the run's attempts record and signals the batch shell (SIGUSR1),
which dumps the ranks' stacks and ends the step.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import signal
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from slurmpod.accounting.figures import JobParams, LiveWindow, job_params
from slurmpod.model import comment as hooks

log = logging.getLogger("slurmpod.hook.monitor")
FIRST_POLL_HEAD_BYTES = 1 << 20  # the arguments dump is near the start
MAX_CHUNK_BYTES = 64 << 20  # a poll reads at most this much; a bigger backlog is skipped to its end


class LogTail:
    """Follows a growing file by offset; notices truncation or replacement (same path, new inode).

    `read_new()` returns only complete lines; a partial last line waits for the next call.
    """

    def __init__(self, path: str | Path, max_chunk_bytes: int = MAX_CHUNK_BYTES,
                 head_bytes: int = FIRST_POLL_HEAD_BYTES) -> None:
        self.path = Path(path)
        self.max_chunk_bytes = max_chunk_bytes
        self.head_bytes = head_bytes
        self.offset = 0
        self.ino: tuple[int, int] | None = None
        self._partial = b""
        self.skipped_bytes = 0

    def read_new(self) -> bytes:
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError:
            return b""  # not created yet (the trainer has not printed anything)
        try:
            st = os.fstat(fd)
            ident = (st.st_dev, st.st_ino)
            if ident != self.ino or st.st_size < self.offset:  # new file or truncated
                self.ino, self.offset, self._partial = ident, 0, b""
            size = st.st_size
            if size <= self.offset:
                return b""
            head = b""
            if size - self.offset <= self.max_chunk_bytes:
                data = os.pread(fd, size - self.offset, self.offset)
                self.offset += len(data)
                return self._complete(data)
            # A backlog bigger than one chunk (monitor started late, or a burst): parse only the
            # newest chunk; from a fresh start keep the head too (the arguments dump).
            if self.offset == 0:
                raw = os.pread(fd, min(self.head_bytes, size), 0)
                head = raw[: raw.rfind(b"\n") + 1]
            done = max(self.offset, len(head))
            start = max(size - self.max_chunk_bytes, done)
            self.skipped_bytes += start - done
            data = os.pread(fd, size - start, start)
            if start > done:  # starts mid-line: drop the fragment
                nl = data.find(b"\n")
                data = data[nl + 1:] if nl >= 0 else b""
                self._partial = b""
            self.offset = size
            return head + self._complete(data)
        finally:
            os.close(fd)

    def _complete(self, data: bytes) -> bytes:
        data = self._partial + data
        cut = data.rfind(b"\n") + 1
        self._partial = data[cut:][-(1 << 20):]  # a runaway line cannot grow without bound
        return data[:cut]


@dataclass
class MonitorState:
    window: LiveWindow = field(default_factory=LiveWindow)
    args: Mapping[str, Any] | None = None
    updates: int = 0
    failures: int = 0
    last_comment: str | None = None
    hangs: list[Hang] = field(default_factory=list)
    last_t: float | None = None  # `t` of the Comment last written
    last_gpu: dict[str, Any] | None = None  # GPU figures last written (telemetry.comment)


def parse_chunk(data: bytes, state: MonitorState) -> None:
    """Feed one chunk of complete lines to a fresh parser; keep arguments and the last rows."""
    from slurmpod.accounting.logparse import LogParser  # lazy: start-up

    if not data:
        return
    parser = LogParser()
    parser.feed(data)
    s = parser.close()
    if s.args is not None:
        state.args = s.args
    it = s.iterations
    n = len(it)
    first = max(0, n - (state.window.rows.maxlen or n))
    state.window.add(
        (int(it.iteration[i]), float(it.elapsed_ms[i]), int(it.global_batch_size[i]),
         float(it.tflops_reported[i])) for i in range(first, n))


# k: how many median step times without an iteration make a hang (docs/resilience-in-job.md,
# "Choosing k"). Megatron's healthy iterations vary by well under 2x in steady state (data
# loader stalls, Python GC, a straggler); evaluation passes and checkpoint saves are longer but
# are either phases (saves) or covered by the floor (eval_interval passes). nvidia-resiliency-
# ext sizes its computed heartbeat timeouts with a safety factor of 5 over the longest observed
# interval; 10 x the median leaves the same margin over a median-to-max spread of 2x.
HANG_K = 10.0
HANG_FLOOR_S = 300.0  # never less: an evaluation pass, a slow first iteration after a resume
HANG_SETUP_S = 1800.0  # launch to first iteration (checkpoint load, NCCL init) = the collective
HANG_SAVE_S = 1800.0  # timeout slurmpod gives Megatron (DISTRIBUTED_TIMEOUT_MIN)

_EVENTS = re.compile(
    rb"slurmpod: attempt (\d+): launching"
    rb"|(saving checkpoint at iteration)"
    rb"|(successfully saved checkpoint)"
    rb"|(?:\bloading (?:distributed )?checkpoint)"
    rb"| iteration +(\d+)/ *\d+ \|")


@dataclass(frozen=True)
class HangPolicy:
    k: float = HANG_K
    floor_s: float = HANG_FLOOR_S
    setup_s: float = HANG_SETUP_S
    save_s: float = HANG_SAVE_S


@dataclass(frozen=True)
class Hang:
    """What the detector saw when it declared a hang (the attempts record keeps it)."""

    attempt: int | None
    phase: str  # setup | train | save
    silent_s: float  # seconds since the last progress (iteration, save end, launch)
    bound_s: float
    iteration: int | None  # the last iteration logged
    step_s: float | None  # median logged time per iteration

    def to_json(self) -> dict[str, Any]:
        return {"attempt": self.attempt, "phase": self.phase, "silent_s": round(self.silent_s, 1),
                "bound_s": round(self.bound_s, 1), "iteration": self.iteration,
                "step_s": None if self.step_s is None else round(self.step_s, 4)}


@dataclass
class HangDetector:
    """Phases of the current attempt from the log, and the hang decision. Pure: the caller
    feeds chunks of complete lines with the time it read them."""

    policy: HangPolicy = field(default_factory=HangPolicy)
    attempt: int | None = None
    phase: str = "setup"
    since: float | None = None  # when the current phase began or last made progress
    last_iteration: int | None = None
    line_gap: int = 1  # iterations between two logged lines (Megatron's --log-interval)
    reported: bool = False

    def feed(self, data: bytes, now: float) -> None:
        if self.since is None:
            self.since = now  # the monitor starts with the job: start-up counts from here
        for m in _EVENTS.finditer(data):
            if m.group(1) is not None:  # a new attempt: its start-up begins
                self.attempt, self.phase, self.since = int(m.group(1)), "setup", now
                self.reported = False
                self.last_iteration = None
            elif m.group(2) is not None:
                self.phase, self.since = "save", now
            elif m.group(3) is not None or m.group(4) is None:
                # a save ended (back to training) or a checkpoint load (start-up goes on)
                self.since = now
                if m.group(3) is not None:
                    self.phase = "train"
            else:
                it = int(m.group(4))
                if self.last_iteration is not None and it > self.last_iteration:
                    self.line_gap = it - self.last_iteration
                self.last_iteration, self.phase, self.since = it, "train", now

    def bound_s(self, step_s: float | None) -> float:
        if self.phase == "setup":
            return self.policy.setup_s
        if self.phase == "save":
            return self.policy.save_s
        if step_s is None:
            return max(self.policy.floor_s, self.policy.setup_s)
        return max(self.policy.k * step_s * self.line_gap, self.policy.floor_s)

    def check(self, now: float, step_s: float | None) -> Hang | None:
        """A Hang the first time the current phase outlives its bound; None otherwise."""
        if self.reported or self.since is None:
            return None
        bound = self.bound_s(step_s)
        silent = now - self.since
        if silent <= bound:
            return None
        self.reported = True
        return Hang(self.attempt, self.phase, silent, bound, self.last_iteration, step_s)


def median_step_s(state: MonitorState) -> float | None:
    """Median logged time per iteration over the monitor's window, in seconds."""
    rows = [r[1] for r in state.window.rows if r[1] > 0]
    if not rows:
        return None
    rows.sort()
    return rows[len(rows) // 2] / 1000.0


def find_log(job_id: str, parent_pid: int | None,
             show_job: Callable[[str], Mapping[str, str]] | None) -> str | None:
    """The job's stdout file: the batch script's fd 1 (where srun's output goes by default),
    else `scontrol show job`'s StdOut (expanded by scontrol)."""
    if parent_pid:
        with contextlib.suppress(OSError):
            target = os.readlink(f"/proc/{parent_pid}/fd/1")
            if target.startswith("/") and Path(target).is_file():
                return target
    if show_job is not None:
        with contextlib.suppress(Exception):
            out = show_job(job_id).get("StdOut")
            if out and out.startswith("/"):
                return out
    return None


def parent_alive(pid: int | None) -> bool:
    """True while `pid` lives. For our own parent the test is exact (we are re-parented when it
    exits, so a recycled pid cannot fool it); for another pid, `kill(pid, 0)`."""
    if not pid:
        return True
    if pid == _START_PPID:
        return os.getppid() == pid
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


_START_PPID = os.getppid()


@dataclass
class MonitorIO:
    """What the monitor does to the outside world (injected, so tests need no Slurm)."""

    get_comment: Callable[[str], str | None]  # the job's current Comment (None: unknown)
    set_comment: Callable[[str, str], None]
    job_running: Callable[[str], bool | None]  # None: could not tell
    sleep: Callable[[float], bool]  # returns True when woken early (stop requested)
    now: Callable[[], float] = time.time
    sampler: Any = None  # slurmpod.telemetry.sampler.Sampler: the GPUs, sampled each interval
    on_hang: Callable[[Hang], None] | None = None  # None: no hang detection
    monotonic: Callable[[], float] = time.monotonic


def run_monitor(job_id: str, log_path: str, io: MonitorIO, *, interval_s: float = 180.0,
                peak_hint: float | None = None, gpus_hint: int | None = None,
                parent_pid: int | None = None, stop: threading.Event | None = None,
                max_cycles: int | None = None, poll_s: float | None = None,
                hang_policy: HangPolicy | None = None) -> MonitorState:
    """The monitor loop. Returns its final state (for tests and the exit log line).

    Every `interval_s` it updates the Comment; with `io.on_hang` it also looks at the log every
    `poll_s` (default: the interval) for a hang. A cycle is one look at the log."""
    stop = stop or threading.Event()
    state = MonitorState()
    tail = LogTail(log_path)
    detector = HangDetector(hang_policy or HangPolicy()) if io.on_hang is not None else None
    poll = min(poll_s or interval_s, interval_s) if detector is not None else interval_s
    base_comment = io.get_comment(job_id)
    initial = hooks.parse_initial_comment(base_comment)
    raw = hooks.decode_field(base_comment) or {}
    if "formula" in raw:
        initial["formula"] = raw["formula"]
    cycles = 0
    next_update = io.monotonic()
    while True:
        chunk = tail.read_new()
        parse_chunk(chunk, state)
        if detector is not None:
            t = io.monotonic()
            detector.feed(chunk, t)
            hang = detector.check(t, median_step_s(state))
            if hang is not None:
                state.hangs.append(hang)
                log.warning("job %s: hang: %s", job_id, hang.to_json())
                try:
                    io.on_hang(hang)  # type: ignore[misc]
                except Exception as exc:  # recording or signalling failed: say so, go on
                    log.error("job %s: acting on the hang failed: %s", job_id, exc)
        updated = io.monotonic() >= next_update or stop.is_set()
        if updated:
            next_update = io.monotonic() + interval_s
            # The monitor runs as the job's user and reports the job's own view, so the
            # Comment's GPUs and peak (rendered by slurmpod at submission) count here; the
            # epilog's do not.
            params: JobParams = job_params(initial, state.args, gpus=gpus_hint, peak=peak_hint,
                                           trust_comment=True)
            live = state.window.figures(params)
            gpu = _sample_gpus(io.sampler, log_path)
            if live.get("iter") is not None or gpu:
                _update(job_id, base_comment, live, state, io, gpu)
        cycles += 1
        if stop.is_set() or (max_cycles is not None and cycles >= max_cycles):
            break
        if not parent_alive(parent_pid):
            log.info("job %s: the batch script is gone; last update done", job_id)
            break
        running = io.job_running(job_id) if updated else None  # Slurm asked once an interval
        if running is False:
            log.info("job %s is no longer running; monitor exits", job_id)
            break
        if io.sleep(poll):  # woken by SIGTERM: one last look at the log, then exit
            stop.set()
    return state


def _sample_gpus(sampler: Any, log_path: str) -> dict[str, Any] | None:
    """One GPU sample; the compact summary for the Comment, the series beside the log.
    Never raises: GPU telemetry is optional (docs/telemetry.md)."""
    if sampler is None:
        return None
    from slurmpod.telemetry import comment as tcomment  # lazy: start-up

    try:
        sampler.sample()
        tel = sampler.telemetry()
        summary = tel.summary() if tel is not None else None
        if tel is None or summary is None:
            return None
        with contextlib.suppress(OSError):
            tcomment.write_series(log_path, tel.record_part())
        return tcomment.compact(summary)
    except Exception as exc:
        log.warning("GPU telemetry: %r", exc)
        return None


def _update(job_id: str, base_comment: str | None, live: Mapping[str, Any],
            state: MonitorState, io: MonitorIO, gpu: Mapping[str, Any] | None = None) -> None:
    try:
        figures = hooks.build_comment(base_comment, live)
        # Unchanged figures (no new iteration: a hang, a long checkpoint) are not rewritten, so
        # `t` stays the time of the last progress and shows how stale the figures are; new GPU
        # figures alone are written with that same `t`.
        progressed = figures != state.last_comment
        if not progressed and (not gpu or gpu == state.last_gpu):
            return
        t = io.now() if progressed or state.last_t is None else state.last_t
        text = hooks.build_comment(base_comment, live, now_s=t)
        if gpu:
            from slurmpod.telemetry.comment import with_gpu  # lazy: start-up

            text = with_gpu(text, gpu)
    except ValueError as exc:
        log.error("job %s: comment does not fit: %s", job_id, exc)
        return
    try:
        io.set_comment(job_id, text)
    except Exception as exc:  # slurmctld busy/restarting: try again next interval
        state.failures += 1
        log.warning("job %s: comment update failed: %s", job_id, exc)
        return
    state.updates += 1
    state.last_comment, state.last_t, state.last_gpu = figures, t, dict(gpu) if gpu else None
    log.info("job %s: comment %s", job_id, text)


def hang_record(job_id: str, hang: Hang, now_s: float) -> bytes:
    """One line of the attempts record (format v1, docs/runs.md): {"event":"hang",...}."""

    doc = {"v": 1, "event": "hang", "job_id": job_id, "attempt": hang.attempt or 1,
           "time": int(now_s), **{k: v for k, v in hang.to_json().items() if k != "attempt"}}
    return (json.dumps(doc, separators=(",", ":")) + "\n").encode()


def install_signal_handlers(stop: threading.Event) -> None:
    def handler(signum: int, _frame: Any) -> None:
        stop.set()

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, handler)
