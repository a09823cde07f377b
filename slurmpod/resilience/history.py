"""The fleet's observed failure rate per node, from slurmpod's records of attempts. Pure.

Two sources, each an exposure (node-hours that attempts ran) and a count of interruptions:
- the job script's `RUN_DIR/.slurmpod/attempts.jsonl` (docs/runs.md), read by
  slurmpod.runs.attempts: an attempt's nodes × (end − start); an interruption is an end of
  `failure` or `node_fail` (or `hang`, should the script record one). Time limits, preemptions,
  cancels and completions are not failures of the hardware or the job.
- sacct's attempts (slurmpod.report.sacct, `--duplicates`): each attempt's NNodes × elapsed;
  an interruption is NODE_FAIL or FAILED. Slurm shows an attempt that slurmpod's script
  requeued as REQUEUED whatever ended it, so this source undercounts: prefer attempts.jsonl.

An attempt that failed without progress within `STARTUP_S` of its start is a startup failure
(a bad argument, a missing file): it says nothing about how often nodes fail, is counted apart
and left out of the rate.

The estimate shrinks toward the site's figure when history is thin: a Gamma prior worth one
interruption at the site's MTBF (Poisson-Gamma conjugacy), so MTBF = (node-hours + site MTBF)
/ (interruptions + 1): no history gives the site's figure, a year of a large fleet gives its
own, and a quiet week does not give an infinite MTBF.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from slurmpod.errors import ConfigError

if TYPE_CHECKING:
    from slurmpod.report.sacct import SacctJob
    from slurmpod.runs.attempts import AttemptLog

FAILURE_ENDS = frozenset({"failure", "node_fail", "hang"})
SACCT_FAILURE_STATES = frozenset({"NODE_FAIL", "FAILED"})
STARTUP_S = 600  # a failure this soon after the start, with no checkpoint progress, is setup
PRIOR_FAILURES = 1.0
MAX_ATTEMPTS_FILE_BYTES = 64 * 1024 * 1024


@dataclass(frozen=True)
class History:
    node_hours: float = 0.0
    failures: int = 0
    startup_failures: int = 0
    attempts: int = 0
    by_end: dict[str, int] = field(default_factory=dict)
    sources: tuple[str, ...] = ()

    def __add__(self, other: History) -> History:
        ends = dict(self.by_end)
        for k, v in other.by_end.items():
            ends[k] = ends.get(k, 0) + v
        return History(self.node_hours + other.node_hours, self.failures + other.failures,
                       self.startup_failures + other.startup_failures,
                       self.attempts + other.attempts, ends, self.sources + other.sources)

    @property
    def observed_mtbf_hours(self) -> float | None:
        """Node-hours per interruption as observed (None without an interruption)."""
        return self.node_hours / self.failures if self.failures else None

    def node_mtbf_hours(self, site_mtbf_hours: float) -> float:
        """The estimate used: observation shrunk toward the site's figure (module doc)."""
        return (self.node_hours + PRIOR_FAILURES * site_mtbf_hours) \
            / (self.failures + PRIOR_FAILURES)

    def to_json(self, site_mtbf_hours: float | None = None) -> dict[str, Any]:
        out: dict[str, Any] = {
            "node_hours": round(self.node_hours, 3), "failures": self.failures,
            "startup_failures": self.startup_failures, "attempts": self.attempts,
            "by_end": dict(sorted(self.by_end.items())),
            "observed_node_mtbf_hours": (None if self.observed_mtbf_hours is None
                                         else round(self.observed_mtbf_hours, 3)),
            "sources": list(self.sources)}
        if site_mtbf_hours is not None:
            out["node_mtbf_hours"] = round(self.node_mtbf_hours(site_mtbf_hours), 3)
        return out


def from_attempts(log: AttemptLog, source: str = "attempts.jsonl") -> History:
    """Exposure and interruptions of every ended attempt with both times and its nodes."""
    node_s = 0.0
    failures = startup = n = 0
    ends: dict[str, int] = {}
    for a in log.attempts:
        if a.end is None or a.start_s is None or a.end_s is None or not a.nodes \
                or a.end_s < a.start_s:
            continue
        n += 1
        ran = a.end_s - a.start_s
        node_s += len(a.nodes) * ran
        ends[a.end] = ends.get(a.end, 0) + 1
        if a.end in FAILURE_ENDS:
            if not a.progress and ran < STARTUP_S:
                startup += 1
            else:
                failures += 1
    return History(node_s / 3600.0, failures, startup, n, ends, (source,))


def from_sacct(jobs: Iterable[SacctJob], source: str = "sacct") -> History:
    """Exposure and interruptions from sacct's attempts of each job (module doc: undercounts
    the failures slurmpod's own script requeued)."""
    node_s = 0.0
    failures = startup = n = 0
    ends: dict[str, int] = {}
    for job in jobs:
        nodes = job.record.n_nodes
        if nodes < 1:
            continue
        for a in job.attempts:
            if a.start_s is None or a.elapsed_s <= 0:
                continue
            n += 1
            node_s += nodes * a.elapsed_s
            state = a.state.split(" ")[0].upper()
            ends[state] = ends.get(state, 0) + 1
            if state in SACCT_FAILURE_STATES:
                if a.elapsed_s < STARTUP_S:
                    startup += 1
                else:
                    failures += 1
    return History(node_s / 3600.0, failures, startup, n, ends, (source,))


def attempt_files(path: Path) -> list[Path]:
    """attempts.jsonl files a `--history` argument names: the file itself, a run directory
    (RUN/.slurmpod/attempts.jsonl), or a directory of run directories (one level down)."""
    if path.is_file():
        return [path]
    own = path / ".slurmpod" / "attempts.jsonl"
    if own.is_file():
        return [own]
    if path.is_dir():
        return sorted(path.glob("*/.slurmpod/attempts.jsonl"))
    return []


def read_history(paths: Iterable[Path]) -> History:
    """The history of every attempts.jsonl the paths name; each file's last 64 MiB (as a
    job owns its file, it is read as hostile input: slurmpod.runs.attempts). A path that
    names none is a ConfigError (one line)."""
    from slurmpod.runs.attempts import parse_attempts  # lazy: start-up

    total = History()
    seen: set[Path] = set()
    for p in paths:
        files = attempt_files(p)
        if not files:
            raise ConfigError(f"{p}: no attempts.jsonl there (give the file, a run directory "
                              "or a directory of run directories)")
        for f in files:
            real = f.resolve()
            if real in seen:
                continue
            seen.add(real)
            try:
                with f.open("rb") as fh:
                    size = fh.seek(0, 2)
                    start = max(0, size - MAX_ATTEMPTS_FILE_BYTES)
                    fh.seek(start)
                    data = fh.read()
            except OSError as exc:
                raise ConfigError(f"{f}: cannot read ({exc.strerror})") from None
            if start:
                data = data.split(b"\n", 1)[-1]  # the first line is cut
            total = total + from_attempts(parse_attempts(data, truncated=bool(start)), str(f))
    return total


@dataclass(frozen=True)
class Measured:
    """What a run's own log says: median save stall and median iteration time."""

    save_s: float | None
    step_s: float | None
    saves: int
    source: str


def measured_from_log(path: Path) -> Measured:
    """Median checkpoint stall (the log's save timers, else save timestamps, else the gap in
    the iteration clock: slurmpod.accounting.metrics) and median iteration time of a
    Megatron log."""

    from slurmpod.accounting.logparse import parse_log  # lazy: start-up
    from slurmpod.accounting.metrics import job_metrics  # lazy: start-up

    try:
        with path.open("rb") as fh:
            summary = parse_log(fh)
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read ({exc.strerror})") from None
    m = job_metrics(summary, None, math.nan, 1, seq_length=None)
    stalls = sorted(c.duration_s for c in m.checkpoint_stalls)
    save = stalls[len(stalls) // 2] if stalls else None
    step = m.iter_time_ms.median / 1000.0 if m.iter_time_ms is not None else None
    return Measured(save, step, len(stalls), str(path))
