"""The fleet report: many job reports -> GPU-hours, weighted MFU, goodput, losses, tables. Pure.

Finished jobs only enter the sums; running and pending jobs are counted apart (their GPU time
is not final).
- GPU-hour-weighted MFU = Σ MFU·GPU-h / Σ GPU-h over the jobs that have an MFU figure.
- Goodput = Σ productive GPU-h / Σ allocated GPU-h over the jobs whose productive time is known.
- Lost GPU-h by cause: the per-job split of `slurmpod.report.model` summed.
- Typical MFU per model-size class: the GPU-hour-weighted median MFU of the class (fed back into
  the per-job "MFU far below typical" rule).
"""

from __future__ import annotations

import csv
import io
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from slurmpod.report.model import LOSS_CAUSES, JobReport
from slurmpod.report.rules import size_class

MFU_BIN = 0.05
TOP_N = 10
CSV_COLUMNS = ("job_id", "name", "user", "account", "partition", "state", "exit_code", "n_nodes",
               "n_gpus", "start", "end", "elapsed_s", "restarts", "gpu_hours", "mfu", "mfu_p10",
               "mfu_p90", "tflops_per_gpu", "tokens_per_s", "goodput", "productive_gpu_hours",
               *(f"lost_{c}_gpu_hours" for c in LOSS_CAUSES), "lost_gpu_hours", "source")


@dataclass(frozen=True)
class JobRow:
    """One finished job's figures, flat (CSV row, table row, aggregation input)."""

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
        return cls(
            job_id=j.job_id, name=j.name, user=j.user, account=j.account,
            partition=j.partition, state=str(j.state), exit_code=j.exit_code,
            n_nodes=j.n_nodes, n_gpus=r.gpus,
            start_s=j.start_time.timestamp() if j.start_time else None,
            end_s=j.end_time.timestamp() if j.end_time else None, elapsed_s=j.elapsed_s,
            restarts=max(j.restarts, len(r.attempts) - 1), gpu_hours=loss.allocated_gpu_s / 3600,
            mfu=f.mfu.median if f.mfu else None, mfu_p10=f.mfu.p10 if f.mfu else None,
            mfu_p90=f.mfu.p90 if f.mfu else None,
            tflops=f.tflops.median if f.tflops else None, tokens_per_s=f.tokens_per_s,
            productive_gpu_hours=(None if loss.productive_gpu_s is None
                                  else loss.productive_gpu_s / 3600),
            lost={k: v / 3600 for k, v in loss.by_cause_gpu_s.items()}, source=f.source,
            size_class=size_class(r.params_b))

    def to_json(self) -> dict[str, Any]:
        return {k: v for k, v in zip(CSV_COLUMNS, self.csv_values(), strict=True)}

    def csv_values(self) -> list[Any]:
        iso = (lambda t: datetime.fromtimestamp(t, UTC).isoformat() if t else None)  # noqa: E731
        return [self.job_id, self.name, self.user, self.account, self.partition, self.state,
                self.exit_code, self.n_nodes, self.n_gpus, iso(self.start_s), iso(self.end_s),
                self.elapsed_s, self.restarts, self.gpu_hours, self.mfu, self.mfu_p10,
                self.mfu_p90, self.tflops, self.tokens_per_s, self.goodput,
                self.productive_gpu_hours, *(self.lost.get(c) for c in LOSS_CAUSES),
                self.lost_gpu_hours, self.source]


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
        self.gpu_hours += row.gpu_hours
        if row.mfu is not None:
            self.mfu_gpu_hours += row.gpu_hours
            self.mfu_weighted_sum += row.mfu * row.gpu_hours
        if row.productive_gpu_hours is not None:
            self.alloc_known_gpu_hours += row.gpu_hours
            self.productive_gpu_hours += row.productive_gpu_hours
        for cause, v in row.lost.items():
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

    def to_json(self, jobs: bool = False) -> dict[str, Any]:
        out: dict[str, Any] = {
            "schema": "slurmpod.report.fleet/1", "window": self.window, "filters": self.filters,
            "jobs": self.total.jobs, "running_jobs": self.n_running,
            "jobs_with_mfu": sum(1 for r in self.rows if r.mfu is not None),
            "total": self.total.to_json(),
            "by_user": [g.to_json() for g in self.by_user],
            "by_account": [g.to_json() for g in self.by_account],
            "top_lost": [r.to_json() for r in self.top_lost],
            "mfu_distribution": {"bin_width": MFU_BIN, "bins": [
                {"from": lo, "jobs": n, "gpu_hours": h} for lo, n, h in self.mfu_hist]},
            "lost_over_time": {"bucket": self.bucket, "series": [
                {"t": t, **c} for t, c in self.lost_over_time]},
            "typical_mfu_by_size": self.typical_mfu,
        }
        if jobs:
            out["job_rows"] = [r.to_json() for r in self.rows]
        return out

    def to_csv(self) -> str:
        buf = io.StringIO()
        # RFC 4180's CRLF: the writer quotes a cell holding any line-terminator character, and
        # with "\n" alone a job name's bare \r went out unquoted, a row break to CSV readers.
        w = csv.writer(buf, lineterminator="\r\n")
        w.writerow(CSV_COLUMNS)
        for r in self.rows:
            w.writerow([csv_cell(v) for v in r.csv_values()])
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
        if r.mfu is not None and r.size_class:
            by.setdefault(r.size_class, []).append((r.mfu, r.gpu_hours))
    out = {}
    for cls, pairs in by.items():
        med = weighted_median(pairs)
        if med is not None:
            out[cls] = med
    return out


def build_fleet(reports: Iterable[JobReport], *, window: str,
                filters: Mapping[str, str | None] | None = None) -> FleetReport:
    rows: list[JobRow] = []
    running = 0
    for r in reports:
        if r.job.state.is_active:
            running += 1
            continue
        rows.append(JobRow.of(r))
    total = Group("all")
    users: dict[str, Group] = {}
    accounts: dict[str, Group] = {}
    hist: dict[int, list[float]] = {}
    for row in rows:
        total.add(row)
        users.setdefault(row.user, Group(row.user)).add(row)
        accounts.setdefault(row.account, Group(row.account)).add(row)
        if row.mfu is not None:
            b = hist.setdefault(min(int(row.mfu / MFU_BIN + 1e-9), int(1 / MFU_BIN)), [0, 0.0])
            b[0] += 1
            b[1] += row.gpu_hours
    n_bins = max([int(1 / MFU_BIN), *(k + 1 for k in hist)])
    mfu_hist = [(round(k * MFU_BIN, 4), int(hist.get(k, [0, 0.0])[0]),
                 float(hist.get(k, [0, 0.0])[1])) for k in range(n_bins)]
    ends = [r.end_s for r in rows if r.end_s]
    bucket = "hour" if ends and max(ends) - min(ends) <= 2 * 86400 else "day"
    fmt = "%Y-%m-%dT%H:00Z" if bucket == "hour" else "%Y-%m-%d"
    over: dict[str, dict[str, float]] = {}
    for row in rows:
        if not row.end_s or not row.lost:
            continue
        key = datetime.fromtimestamp(row.end_s, UTC).strftime(fmt)
        slot = over.setdefault(key, dict.fromkeys(LOSS_CAUSES, 0.0))
        for cause, v in row.lost.items():
            slot[cause] = slot.get(cause, 0.0) + v
    top = sorted((r for r in rows if r.lost_gpu_hours), key=lambda r: -(r.lost_gpu_hours or 0))
    by_hours = (lambda g: (-g.gpu_hours, g.key))  # noqa: E731
    return FleetReport(
        window=window, filters=dict(filters or {}), total=total, rows=rows, n_running=running,
        by_user=sorted(users.values(), key=by_hours),
        by_account=sorted(accounts.values(), key=by_hours), top_lost=top[:TOP_N],
        mfu_hist=mfu_hist, lost_over_time=sorted(over.items()), bucket=bucket,
        typical_mfu=typical_mfu(rows))
