"""The fleet report: many job reports -> GPU-hours, weighted MFU, goodput, losses, tables. Pure.

Finished jobs only enter the sums; running and pending jobs are counted apart (their GPU time
is not final).
- GPU-hour-weighted MFU = Σ MFU·GPU-h / Σ GPU-h over the jobs that have an MFU figure.
- Goodput = Σ productive GPU-h / Σ allocated GPU-h over the jobs whose productive time is known.
- Lost GPU-h by cause: the per-job split of `slurmpod.report.model` summed.
- Typical MFU per model-size class: the GPU-hour-weighted median MFU of the class (fed back into
  the per-job "MFU far below typical" rule).

Achieved vs predicted: a finished job whose submit Comment recorded the performance model's
prediction (report/predicted.py `recorded_vs_predicted`) gets `vs_predicted` = achieved /
predicted speed (= achieved MFU / predicted MFU); the fleet shows the median over those jobs and
lists the ones below `LOW_VS_PREDICTED` with the job report's likely-cause note (`cause_note`).

A job whose figures are implausible (`JobReport.implausible`: an MFU over 100 %, a negative
time, ...) stays in the rows (CSV, `--jobs`) with its reasons but enters no aggregate: not the
sums, medians, groups, distribution, top list, typical MFU or the vs-predicted median and list
(nor gets a `vs_predicted`, as in the job report).

Built for 100,000 jobs in well under a second (benchmarks/report_scale.py): rows are plain
slotted objects, each row is added to its user's and account's group in one pass (the total is
the sum of the users'), time buckets are labelled once per hour or day, not per job.
"""

from __future__ import annotations

import csv
import heapq
import io
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from slurmpod.report.model import LOSS_CAUSES, JobReport, Note, stability_of
from slurmpod.report.predicted import (
    HIGH_VS_PREDICTED,
    LOW_VS_PREDICTED,
    cause_note,
    recorded_vs_predicted,
)
from slurmpod.report.rules import (
    GPU_IDLE_PCT,
    LOW_CPU_EFFICIENCY,
    MEM_OVER_REQUESTED,
    MIN_MEM_NOTE_BYTES,
    MIN_TIME_NOTE_S,
    MIN_USAGE_S,
    TIME_OVER_REQUESTED,
    size_class,
)
from slurmpod.report.sacct import Usage

MFU_BIN = 0.05
TOP_N = 10
CSV_COLUMNS = ("job_id", "name", "user", "account", "partition", "state", "exit_code", "n_nodes",
               "n_gpus", "start", "end", "elapsed_s", "restarts", "gpu_hours", "mfu", "mfu_p10",
               "mfu_p90", "vs_predicted", "tflops_per_gpu", "tokens_per_s", "goodput",
               "productive_gpu_hours",
               *(f"lost_{c}_gpu_hours" for c in LOSS_CAUSES), "lost_gpu_hours", "gpu_util",
               "energy_j", "source", "implausible")
# `--efficiency` (the usage query over the window): seff's figures per job, after CSV_COLUMNS.
EFFICIENCY_COLUMNS = ("cpu_eff", "mem_used_gib", "mem_req_gib", "time_used_frac",
                      "time_limit_s")
IMPLAUSIBLE_SEP = ";"
GIB = float(1 << 30)


@dataclass(slots=True)
class JobRow:
    """One finished job's figures, flat (CSV row, table row, aggregation input). Slotted and
    not frozen: a fleet report makes 100,000 of them, and a frozen dataclass's __init__ sets
    every field through object.__setattr__ (twice the time)."""

    job_id: str
    name: str
    user: str
    account: str
    partition: str
    state: str
    exit_code: int
    n_nodes: int
    n_gpus: int
    start_s: float | None
    end_s: float | None
    elapsed_s: int
    restarts: int
    gpu_hours: float
    mfu: float | None
    mfu_p10: float | None
    mfu_p90: float | None
    tflops: float | None
    tokens_per_s: float | None
    productive_gpu_hours: float | None
    lost: dict[str, float] = field(default_factory=dict)  # cause -> GPU-h
    source: str = "none"
    size_class: str | None = None
    implausible: tuple[str, ...] = ()  # reasons; empty when the figures can be right
    # GPU telemetry (the record's summary.gpu, docs/telemetry.md): mean utilisation (%) and
    # the energy of the job's GPUs (J); None: not measured.
    gpu_util: float | None = None
    energy_j: float | None = None
    # seff's figures from the usage query (`--efficiency` only; None: not asked or not
    # measured): CPU efficiency, peak memory and the request (GiB), elapsed / time limit.
    cpu_eff: float | None = None
    mem_used_gib: float | None = None
    mem_req_gib: float | None = None
    time_used_frac: float | None = None
    time_limit_s: int | None = None
    alloc_cpus: int = 0  # > 1 for a CPU verdict (one core cannot be over-requested)
    # Achieved / predicted speed against the prediction the submit Comment recorded (None: no
    # prediction, or implausible figures), and the job report's note when it is far below.
    vs_predicted: float | None = None
    predicted_note: Note | None = None

    @property
    def goodput(self) -> float | None:
        if self.productive_gpu_hours is None or self.gpu_hours <= 0:
            return None
        return self.productive_gpu_hours / self.gpu_hours

    @property
    def lost_gpu_hours(self) -> float | None:
        return sum(self.lost.values()) if self.lost else None

    @classmethod
    def of(cls, r: JobReport) -> JobRow:
        j, f, loss = r.job, r.figures, r.loss
        mfu, tflops, prod = f.mfu, f.tflops, loss.productive_gpu_s
        start, end = j.start_time, j.end_time
        eff = getattr(r, "efficiency", None)  # as implausible: older reports lack it
        gpu = eff.gpu if eff is not None else None
        util = gpu.get("util") if gpu is not None else None
        # Positional, in field order: 25 keyword arguments cost more than the rest of the row
        # (a fleet report makes 100,000 rows).
        row = cls(
            j.job_id, j.name, j.user, j.account, j.partition, str(j.state), j.exit_code,
            j.n_nodes, r.gpus, start.timestamp() if start else None,
            end.timestamp() if end else None, j.elapsed_s,
            # a RESIZING attempt is a resize (a node removed under --no-kill), not a restart
            max(j.restarts, sum(1 for a in r.attempts[:-1] if a.state != "RESIZING")),
            loss.allocated_gpu_s / 3600,
            mfu.median if mfu else None, mfu.p10 if mfu else None, mfu.p90 if mfu else None,
            tflops.median if tflops else None, f.tokens_per_s,
            None if prod is None else prod / 3600,
            {k: v / 3600 for k, v in loss.by_cause_gpu_s.items()}, f.source,
            None if r.params_b is None else size_class(r.params_b),
            # getattr: reports built before JobReport carried the field read as plausible.
            tuple(getattr(r, "implausible", None) or ()),
            float(util) if isinstance(util, int | float) else None,
            eff.energy_j if eff is not None else None)
        # getattr: as for implausible, a report of an older shape has neither
        comment: object = getattr(j, "comment", None)
        if (isinstance(comment, str) and comment and getattr(f, "iter_ms", None) is not None
                and j.state.is_terminal and not row.implausible):
            row._predicted(r)
        return row

    def _predicted(self, r: JobReport) -> None:
        """vs_predicted from the recorded prediction; the note of a job far below it (its
        stability from the summary's iteration p10/p90, as the job report's is without a
        series)."""
        med = r.figures.iter_ms.median if r.figures.iter_ms else None
        v = recorded_vs_predicted(r.job.comment, None if med is None else med / 1000.0,
                                  self.n_gpus)
        if v is None:
            return
        self.vs_predicted = v.ratio
        if v.flagged:
            self.predicted_note = cause_note(v, stability_of({}, r.figures))

    def to_json(self, efficiency: bool = False) -> dict[str, Any]:
        out = {k: v for k, v in zip(CSV_COLUMNS, self.csv_values(), strict=True)}
        out["implausible"] = list(self.implausible)
        if efficiency:
            out.update(zip(EFFICIENCY_COLUMNS, self.efficiency_values(), strict=True))
        return out

    def efficiency_values(self) -> list[Any]:
        return [self.cpu_eff, self.mem_used_gib, self.mem_req_gib, self.time_used_frac,
                self.time_limit_s]

    @property
    def mem_frac(self) -> float | None:
        if self.mem_used_gib is None or not self.mem_req_gib:
            return None
        return self.mem_used_gib / self.mem_req_gib

    def verdicts(self) -> tuple[str, ...]:
        """The fleet's counts of report/rules.py's verdicts, on the same thresholds (the
        short-job and small-request exemptions included)."""
        out = []
        if self.gpu_util is not None and self.n_gpus and self.gpu_util < GPU_IDLE_PCT:
            out.append("gpu_idle")
        long = self.elapsed_s >= MIN_USAGE_S
        if (self.cpu_eff is not None and long and self.cpu_eff < LOW_CPU_EFFICIENCY
                and self.alloc_cpus > 1):
            out.append("cpu_low")
        m = self.mem_frac
        if (m is not None and long and m < MEM_OVER_REQUESTED
                and (self.mem_req_gib or 0.0) * GIB >= MIN_MEM_NOTE_BYTES):
            out.append("mem_over_requested")
        if (self.time_used_frac is not None and self.time_limit_s is not None
                and self.time_limit_s >= MIN_TIME_NOTE_S
                and self.time_used_frac < TIME_OVER_REQUESTED and self.state == "COMPLETED"):
            out.append("time_over_requested")
        return tuple(out)

    def attach(self, u: Usage) -> None:
        """This job's usage (the latest attempt's, as seff shows): seff's figures, and Slurm's
        gres/gpuutil where the spool has no telemetry (as the job report falls back)."""
        self.cpu_eff = u.cpu_efficiency
        self.mem_used_gib = None if u.mem_peak_bytes is None else u.mem_peak_bytes / GIB
        self.mem_req_gib = None if u.req_mem_bytes is None else u.req_mem_bytes / GIB
        self.time_used_frac = u.time_fraction
        self.time_limit_s = u.limit_s
        self.alloc_cpus = u.req_cpus or u.alloc_cpus
        if self.gpu_util is None:
            self.gpu_util = u.gpu_util_pct

    def csv_values(self) -> list[Any]:
        iso = (lambda t: datetime.fromtimestamp(t, UTC).isoformat() if t else None)  # noqa: E731
        return [self.job_id, self.name, self.user, self.account, self.partition, self.state,
                self.exit_code, self.n_nodes, self.n_gpus, iso(self.start_s), iso(self.end_s),
                self.elapsed_s, self.restarts, self.gpu_hours, self.mfu, self.mfu_p10,
                self.mfu_p90, self.vs_predicted, self.tflops, self.tokens_per_s, self.goodput,
                self.productive_gpu_hours, *(self.lost.get(c) for c in LOSS_CAUSES),
                self.lost_gpu_hours, self.gpu_util, self.energy_j, self.source,
                IMPLAUSIBLE_SEP.join(self.implausible) or None]


@dataclass
class Group:
    """Sums for one user, account, or the whole fleet."""

    key: str
    jobs: int = 0
    gpu_hours: float = 0.0
    mfu_gpu_hours: float = 0.0  # GPU-h of jobs with an MFU figure
    mfu_weighted_sum: float = 0.0
    alloc_known_gpu_hours: float = 0.0  # GPU-h of jobs whose productive time is known
    productive_gpu_hours: float = 0.0
    lost: dict[str, float] = field(default_factory=lambda: dict.fromkeys(LOSS_CAUSES, 0.0))

    def add(self, row: JobRow) -> None:
        self.jobs += 1
        h = row.gpu_hours
        self.gpu_hours += h
        if row.mfu is not None:
            self.mfu_gpu_hours += h
            self.mfu_weighted_sum += row.mfu * h
        if row.productive_gpu_hours is not None:
            self.alloc_known_gpu_hours += h
            self.productive_gpu_hours += row.productive_gpu_hours
        if row.lost:
            lost = self.lost
            for cause, v in row.lost.items():
                lost[cause] = lost.get(cause, 0.0) + v

    def merge(self, other: Group) -> None:
        """Add another group's sums (the fleet's total is the sum of its users')."""
        self.jobs += other.jobs
        self.gpu_hours += other.gpu_hours
        self.mfu_gpu_hours += other.mfu_gpu_hours
        self.mfu_weighted_sum += other.mfu_weighted_sum
        self.alloc_known_gpu_hours += other.alloc_known_gpu_hours
        self.productive_gpu_hours += other.productive_gpu_hours
        for cause, v in other.lost.items():
            self.lost[cause] = self.lost.get(cause, 0.0) + v

    @property
    def mfu(self) -> float | None:
        return self.mfu_weighted_sum / self.mfu_gpu_hours if self.mfu_gpu_hours > 0 else None

    @property
    def goodput(self) -> float | None:
        if self.alloc_known_gpu_hours <= 0:
            return None
        return self.productive_gpu_hours / self.alloc_known_gpu_hours

    @property
    def lost_gpu_hours(self) -> float:
        return sum(self.lost.values())

    def to_json(self) -> dict[str, Any]:
        return {"key": self.key, "jobs": self.jobs, "gpu_hours": self.gpu_hours,
                "mfu_weighted": self.mfu, "mfu_covered_gpu_hours": self.mfu_gpu_hours,
                "goodput": self.goodput, "goodput_covered_gpu_hours": self.alloc_known_gpu_hours,
                "productive_gpu_hours": self.productive_gpu_hours,
                "lost_gpu_hours": self.lost_gpu_hours, "lost_gpu_hours_by_cause": self.lost}


@dataclass
class FleetReport:
    window: str
    filters: dict[str, str | None]
    total: Group
    rows: list[JobRow]
    n_running: int
    by_user: list[Group]
    by_account: list[Group]
    top_lost: list[JobRow]
    mfu_hist: list[tuple[float, int, float]]  # (bin lower edge, jobs, GPU-h)
    lost_over_time: list[tuple[str, dict[str, float]]]  # (bucket label, cause -> GPU-h)
    bucket: str  # "day" | "hour"
    typical_mfu: dict[str, float]
    implausible: list[JobRow] = field(default_factory=list)  # in `rows`, in no aggregate
    # `--efficiency`: None when not asked; else verdict -> jobs, and per user/account/partition
    # the medians over the jobs Slurm measured.
    efficiency: Efficiencies | None = None
    # Achieved vs predicted over the plausible jobs with a recorded prediction: how many, the
    # median ratio, and those below LOW_VS_PREDICTED (lowest first), each with its note.
    jobs_with_prediction: int = 0
    vs_predicted_median: float | None = None
    below_predicted: list[JobRow] = field(default_factory=list)

    @property
    def jobs_with_mfu(self) -> int:
        return sum(1 for r in self.rows if r.mfu is not None and not r.implausible)

    def to_json(self, jobs: bool = False) -> dict[str, Any]:
        out: dict[str, Any] = {
            "schema": "slurmpod.report.fleet/1", "window": self.window, "filters": self.filters,
            "jobs": self.total.jobs, "running_jobs": self.n_running,
            "jobs_with_mfu": self.jobs_with_mfu,
            "implausible_jobs": [{"job_id": r.job_id, "user": r.user, "name": r.name,
                                  "state": r.state, "gpu_hours": r.gpu_hours, "mfu": r.mfu,
                                  "reasons": list(r.implausible)} for r in self.implausible],
            "total": self.total.to_json(),
            "by_user": [g.to_json() for g in self.by_user],
            "by_account": [g.to_json() for g in self.by_account],
            "top_lost": [r.to_json() for r in self.top_lost],
            "mfu_distribution": {"bin_width": MFU_BIN, "bins": [
                {"from": lo, "jobs": n, "gpu_hours": h} for lo, n, h in self.mfu_hist]},
            "lost_over_time": {"bucket": self.bucket, "series": [
                {"t": t, **c} for t, c in self.lost_over_time]},
            "typical_mfu_by_size": self.typical_mfu,
            "vs_predicted": {
                "jobs": self.jobs_with_prediction, "median": self.vs_predicted_median,
                "threshold": LOW_VS_PREDICTED, "calibrate_above": HIGH_VS_PREDICTED,
                "below": [{"job_id": r.job_id, "user": r.user, "name": r.name,
                           "vs_predicted": r.vs_predicted, "mfu": r.mfu,
                           **({"text": r.predicted_note.text, "fix": r.predicted_note.fix}
                              if r.predicted_note else {})} for r in self.below_predicted]},
        }
        if self.efficiency is not None:
            out["efficiency"] = self.efficiency.to_json()
        if jobs:
            eff = self.efficiency is not None
            out["job_rows"] = [r.to_json(eff) for r in self.rows]
        return out

    def to_csv(self) -> str:
        buf = io.StringIO()
        # RFC 4180's CRLF: the writer quotes a cell holding any line-terminator character, and
        # with "\n" alone a job name's bare \r went out unquoted, a row break to CSV readers.
        w = csv.writer(buf, lineterminator="\r\n")
        eff = self.efficiency is not None
        w.writerow((*CSV_COLUMNS, *EFFICIENCY_COLUMNS) if eff else CSV_COLUMNS)
        start = _FORMULA_START
        for r in self.rows:
            # csv_cell, inline (2.5 million cells at 100,000 jobs)
            w.writerow(["" if v is None else "'" + v if isinstance(v, str) and v.startswith(start)
                        else v for v in r.csv_values()]
                       + (["" if v is None else v for v in r.efficiency_values()] if eff else []))
        return buf.getvalue()


# A spreadsheet runs a cell that starts with one of these as a formula (CSV injection); job
# names, users and accounts are chosen by users. Numbers are written as numbers.
_FORMULA_START = ("=", "+", "-", "@", "\t", "\r")


def csv_cell(value: Any) -> Any:
    """One CSV cell: None is empty; text that a spreadsheet would run as a formula gets a
    leading apostrophe (OWASP's advice), so `=HYPERLINK(...)` in a job name stays text."""
    if value is None:
        return ""
    if isinstance(value, str) and value.startswith(_FORMULA_START):
        return "'" + value
    return value


VERDICTS = ("gpu_idle", "cpu_low", "mem_over_requested", "time_over_requested")


@dataclass(frozen=True)
class EffGroup:
    """Medians over one user's (account's, partition's) jobs that Slurm measured."""

    key: str
    jobs: int  # jobs with any seff figure
    cpu_eff: float | None
    mem_frac: float | None  # peak / requested
    time_frac: float | None  # elapsed / limit

    def to_json(self) -> dict[str, Any]:
        return {"key": self.key, "jobs": self.jobs, "cpu_eff_median": self.cpu_eff,
                "mem_used_frac_median": self.mem_frac, "time_used_frac_median": self.time_frac}


@dataclass(frozen=True)
class Efficiencies:
    measured: int  # finished plausible jobs with usage from Slurm
    verdicts: dict[str, int]  # VERDICTS -> jobs
    by: dict[str, list[EffGroup]]  # "user" | "account" | "partition" -> groups, most jobs first

    def to_json(self) -> dict[str, Any]:
        return {"jobs_measured": self.measured, "verdicts": self.verdicts,
                **{f"by_{k}": [g.to_json() for g in v] for k, v in self.by.items()}}


def attach_usage(rows: Iterable[JobRow], usage: Mapping[str, Usage]) -> None:
    for r in rows:
        u = usage.get(r.job_id)
        if u is not None:
            r.attach(u)


def _median(values: list[float]) -> float | None:
    if not values:
        return None
    values.sort()
    n = len(values)
    return values[n // 2] if n % 2 else (values[n // 2 - 1] + values[n // 2]) / 2


def efficiencies(rows: Sequence[JobRow]) -> Efficiencies:
    """Verdict counts over `rows` (the plausible finished jobs) and the medians per group."""
    counts = dict.fromkeys(VERDICTS, 0)
    for r in rows:
        for v in r.verdicts():
            counts[v] += 1
    measured = [r for r in rows if r.cpu_eff is not None or r.mem_used_gib is not None
                or r.time_used_frac is not None]
    by: dict[str, list[EffGroup]] = {}
    for attr in ("user", "account", "partition"):
        groups: dict[str, list[JobRow]] = {}
        for r in measured:
            groups.setdefault(getattr(r, attr), []).append(r)
        by[attr] = sorted(
            (EffGroup(k, len(g), _median([r.cpu_eff for r in g if r.cpu_eff is not None]),
                      _median([m for r in g if (m := r.mem_frac) is not None]),
                      _median([r.time_used_frac for r in g if r.time_used_frac is not None]))
             for k, g in groups.items()), key=lambda e: (-e.jobs, e.key))
    return Efficiencies(len(measured), counts, by)


def weighted_median(pairs: Sequence[tuple[float, float]]) -> float | None:
    """The value where half the weight lies below: (value, weight) pairs, weights > 0."""
    items = sorted((v, w) for v, w in pairs if w > 0)
    total = sum(w for _, w in items)
    if total <= 0:
        return None
    acc = 0.0
    for v, w in items:
        acc += w
        if acc >= total / 2:
            return v
    return items[-1][0]


def typical_mfu(rows: Iterable[JobRow]) -> dict[str, float]:
    by: dict[str, list[tuple[float, float]]] = {}
    for r in rows:
        if r.mfu is not None and r.size_class and not r.implausible:
            by.setdefault(r.size_class, []).append((r.mfu, r.gpu_hours))
    out = {}
    for cls, pairs in by.items():
        med = weighted_median(pairs)
        if med is not None:
            out[cls] = med
    return out


def _bucket_label(end_s: float, hourly: bool) -> str:
    return datetime.fromtimestamp(end_s, UTC).strftime("%Y-%m-%dT%H:00Z" if hourly
                                                       else "%Y-%m-%d")


def rows_of(reports: Iterable[JobReport]) -> tuple[list[JobRow], int]:
    """The finished jobs' rows and the number of running (or pending) jobs. `reports` may be a
    generator: a fleet of 100,000 jobs need not hold 100,000 reports at once."""
    rows: list[JobRow] = []
    running = 0
    for r in reports:
        if r.job.state.is_active:
            running += 1
            continue
        rows.append(JobRow.of(r))
    return rows, running


def build_fleet(reports: Iterable[JobReport], *, window: str,
                filters: Mapping[str, str | None] | None = None) -> FleetReport:
    rows, running = rows_of(reports)
    return fleet_from_rows(rows, running, window=window, filters=filters)


def fleet_from_rows(rows: list[JobRow], running: int, *, window: str,
                    filters: Mapping[str, str | None] | None = None,
                    efficiency: bool = False) -> FleetReport:
    """`efficiency`: the rows carry the usage query's figures (`attach_usage`); the report
    gets their verdict counts and medians."""
    ok = [r for r in rows if not r.implausible]
    total = Group("all")
    users: dict[str, Group] = {}
    accounts: dict[str, Group] = {}
    hist: dict[int, list[float]] = {}
    top_bin = int(1 / MFU_BIN)
    for row in ok:
        g = users.get(row.user)
        if g is None:
            g = users[row.user] = Group(row.user)
        g.add(row)
        g = accounts.get(row.account)
        if g is None:
            g = accounts[row.account] = Group(row.account)
        g.add(row)
        if row.mfu is not None:
            b = hist.get(k := min(int(row.mfu / MFU_BIN + 1e-9), top_bin))
            if b is None:
                b = hist[k] = [0, 0.0]
            b[0] += 1
            b[1] += row.gpu_hours
    for g in users.values():
        total.merge(g)
    n_bins = max([top_bin, *(k + 1 for k in hist)])
    mfu_hist = [(round(k * MFU_BIN, 4), int(hist.get(k, [0, 0.0])[0]),
                 float(hist.get(k, [0, 0.0])[1])) for k in range(n_bins)]
    ends = [r.end_s for r in ok if r.end_s]
    hourly = bool(ends) and max(ends) - min(ends) <= 2 * 86400
    step = 3600 if hourly else 86400
    over_by: dict[int, dict[str, float]] = {}  # UTC hour or day number -> cause -> GPU-h
    for row in ok:
        if not row.end_s or not row.lost:
            continue
        slot = over_by.get(n := int(row.end_s // step))
        if slot is None:
            slot = over_by[n] = dict.fromkeys(LOSS_CAUSES, 0.0)
        for cause, v in row.lost.items():
            slot[cause] = slot.get(cause, 0.0) + v
    over = sorted((_bucket_label(n * step, hourly), c) for n, c in over_by.items())
    top = heapq.nlargest(TOP_N, (r for r in ok if r.lost_gpu_hours),
                         key=lambda r: r.lost_gpu_hours or 0.0)
    by_hours = (lambda g: (-g.gpu_hours, g.key))  # noqa: E731
    vs = [r for r in ok if r.vs_predicted is not None]
    return FleetReport(
        window=window, filters=dict(filters or {}), total=total, rows=rows, n_running=running,
        by_user=sorted(users.values(), key=by_hours),
        by_account=sorted(accounts.values(), key=by_hours), top_lost=top,
        mfu_hist=mfu_hist, lost_over_time=over, bucket="hour" if hourly else "day",
        typical_mfu=typical_mfu(ok), implausible=[r for r in rows if r.implausible],
        efficiency=efficiencies(ok) if efficiency else None,
        jobs_with_prediction=len(vs),
        vs_predicted_median=_median([r.vs_predicted for r in vs if r.vs_predicted is not None]),
        below_predicted=sorted((r for r in vs if r.predicted_note is not None),
                               key=lambda r: (r.vs_predicted or 0.0, r.job_id)))
