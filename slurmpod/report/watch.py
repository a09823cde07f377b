"""`slurmpod report JOBID --watch`: a running job's live figures, refreshed. Pure but for the
output stream and the sleep, both passed in.

Each refresh the CLI builds a `Frame` (the job report from sacct, the live Comment and usage,
plus a `Progress` from the tail of the job's log) and `watch` shows it: on a terminal the whole
report is redrawn under a progress line; without one (a pipe, a file, CI) one line per refresh,
so a log of the watch reads as a time series. It stops when the job ends (showing the final
report), after `count` refreshes, or on Ctrl-C (a clean line, exit status 130).
"""

from __future__ import annotations

import math
import re
import statistics
from collections.abc import Callable
from dataclasses import dataclass
from typing import IO, TYPE_CHECKING

if TYPE_CHECKING:
    from slurmpod.report.model import JobReport

# Megatron-LM's training line (all releases): ` iteration      120/    1000 | … | elapsed time per
# iteration (ms): 1023.4 | …`. Only the progress is read here; the figures come from the hooks.
_ITER = re.compile(rb" iteration\s+(\d+)/\s*(\d+) \|")
_MS = re.compile(rb"elapsed time per iteration \(ms\): ([0-9.]+)")
RECENT_LINES = 5  # iteration lines whose median time gives the ETA
CLEAR = "\x1b[H\x1b[2J"  # cursor home, clear screen (VT100)


@dataclass(frozen=True)
class Progress:
    iteration: int | None
    train_iters: int | None = None
    iter_ms: float | None = None  # median of the last few logged iteration times
    source: str = "log"  # "log" | "comment"

    @property
    def fraction(self) -> float | None:
        if self.iteration is None or not self.train_iters:
            return None
        return min(1.0, self.iteration / self.train_iters)

    @property
    def eta_s(self) -> float | None:
        if self.iteration is None or not self.train_iters or not self.iter_ms:
            return None
        return max(0, self.train_iters - self.iteration) * self.iter_ms / 1000.0


def progress_from_log(tail: bytes) -> Progress | None:
    """The last Megatron iteration line of a log's tail -> Progress; None without one."""
    its, times = [], []
    for line in tail.splitlines()[-2000:]:
        m = _ITER.search(line)
        if m is None:
            continue
        its.append((int(m.group(1)), int(m.group(2))))
        t = _MS.search(line)
        if t is not None:
            try:
                ms = float(t.group(1))
            except ValueError:
                continue
            if math.isfinite(ms) and ms > 0:
                times.append(ms)
    if not its:
        return None
    it, total = its[-1]
    recent = times[-RECENT_LINES:]
    return Progress(it, total if total >= it else None,
                    statistics.median(recent) if recent else None, "log")


@dataclass(frozen=True)
class Frame:
    report: JobReport
    progress: Progress | None
    at: str  # wall-clock time of the refresh, for the reader


def _dur(s: float) -> str:
    s = round(s)
    d, rem = divmod(s, 86400)
    h, rem = divmod(rem, 3600)
    m, sec = divmod(rem, 60)
    return (f"{d}d " if d else "") + f"{h}:{m:02d}:{sec:02d}"


def progress_line(p: Progress | None, width: int = 30) -> str:
    if p is None or p.iteration is None:
        return "progress: no iterations yet"
    if p.train_iters is None:
        return f"progress: iteration {p.iteration:,} (train_iters not known: {p.source})"
    frac = p.fraction or 0.0
    bar = "#" * round(width * frac) + "." * (width - round(width * frac))
    eta = f", ETA {_dur(p.eta_s)}" if p.eta_s is not None else ""
    step = f" at {p.iter_ms:.4g} ms/iter" if p.iter_ms else ""
    return (f"progress: [{bar}] {p.iteration:,} / {p.train_iters:,} iterations "
            f"({100 * frac:.1f} %){step}{eta}")


def status_line(f: Frame) -> str:
    """One line per refresh (no terminal): time, state, progress and the live figures."""
    from slurmpod.report.text import pct  # lazy: start-up

    r = f.report
    fig = r.figures
    parts = [f.at, f"job {r.job.job_id}", str(r.job.state), progress_line(f.progress)]
    if fig.mfu and fig.mfu.median is not None:
        parts.append(f"MFU {pct(fig.mfu.median)}")
    if fig.tokens_per_s:
        parts.append(f"tokens/s {fig.tokens_per_s:,.0f}")
    e = r.efficiency
    if e is not None and e.gpu_util_pct is not None:
        parts.append(f"GPU util {e.gpu_util_pct:.1f} %")
    return "  ".join(parts)


def screen(f: Frame) -> str:
    from slurmpod.report.text import job_text  # lazy: start-up

    return (f"slurmpod report {f.report.job.job_id} --watch  ({f.at}; Ctrl-C to stop)\n"
            f"{progress_line(f.progress)}\n\n{job_text(f.report)}")


def watch(fetch: Callable[[], Frame], out: IO[str], *, interval_s: float, count: int | None,
          tty: bool, sleep: Callable[[float], None]) -> int:
    """Refresh until the job ends, `count` refreshes or Ctrl-C; returns the exit status."""
    n = 0
    try:
        while True:
            frame = fetch()
            n += 1
            ended = frame.report.job.state.is_terminal
            if tty:
                out.write(CLEAR + screen(frame))
            elif ended:
                out.write(status_line(frame) + "\n\n" + screen(frame))
            else:
                out.write(status_line(frame) + "\n")
            out.flush()
            if ended or (count is not None and n >= count):
                return 0
            sleep(interval_s)
    except KeyboardInterrupt:
        out.write("\nstopped (Ctrl-C)\n")
        out.flush()
        return 130
