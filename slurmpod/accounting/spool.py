"""The site spool: per-job records and AdminComment updates not yet delivered to Slurm.

Layout under the spool directory (created 0750 by the first hook that runs):

    records/<job_id>.<attempt>.json    summary + time series of one run of a job (30-35 KB)
    summaries/<job_id>.<attempt>.json  the same record without its series (a few hundred bytes):
                                       what a fleet report reads
    pending/<job_id>.<kind>.json       an update waiting for slurmctld/slurmdbd (one per job+kind)
    hook.log                           what the hooks did, one line per event

`attempt` is Slurm's restart count of the run (0 for a job never requeued). Every record carries
`attempt` and `seq` (nanoseconds at the write, above the seq of any earlier record of the same
attempt): updates are ordered by (attempt, seq), never by when they happen to be delivered, so an
epilog of attempt 1 that slurmdbd kept waiting cannot overwrite attempt 2's AdminComment.

Every file is written to a temp file in the same directory, fsynced, then renamed, so a crash
leaves the old file or the new one, never half of one. The record is written before its summary:
a crash between the two leaves a record without a summary, and readers fall back to the record.
Delivery is idempotent (setting a job's AdminComment twice to the same value is harmless), so a
crash between delivering and unlinking the pending file only causes one more delivery. A `flock`
on `<spool>/.lock` serialises `flush` runs (the epilog of every job flushes too); a second one,
`<spool>/.pending.lock`, is held only for the few milliseconds in which `put` compares and
replaces a pending file or `flush` moves one (so an epilog never waits on a slow delivery).

Why one small file per record and not an append-only index: a summary is written like the
record (temp file, fsync, rename), so a crash or two epilogs at once can never leave a torn or
interleaved line, a rerun of an attempt replaces its summary instead of adding a second one, and
nothing needs compacting; reading 100,000 of them (raw `os.read`, no buffered file objects) takes
about 0.4 s, the JSON parsing about as much again (benchmarks/report_scale.py).
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import json
import logging
import os
import re
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

PENDING_V = 1
# The layout (module docstring): these names are the only place it is spelled; the hooks write
# through `Spool`, reports read through `latest_record_paths`.
RECORDS_DIR = "records"
SUMMARIES_DIR = "summaries"
PENDING_DIR = "pending"
LOG_NAME = "hook.log"
log = logging.getLogger("slurmpod.hook")
# What a fleet report needs of `summary.metrics` (report/model.py figures_from_spool): the
# steady-state distributions (median, p10, p90 of each), the productive and redone time, the
# checkpoint stall total. Everything else there (counts, means, the FLOPs figure, the list of
# checkpoint stalls: 20 B each, hundreds in a long job) only the per-job report shows, from
# the full record.
COMPACT_METRICS = ("mfu", "tflops_per_gpu", "tokens_per_s", "iter_time_ms", "productive_s",
                   "lost_s", "checkpoint_stall_s")
_DIST_KEYS = ("median", "p10", "p90")
_SAFE_ID = re.compile(r"^[0-9]+(?:[_+][0-9]+)?$")  # 123, 123_4 (array), 123+1 (het)


class DeliveryError(Exception):
    """Slurm did not take the update; `retry` says whether a later attempt can succeed."""

    def __init__(self, message: str, retry: bool = True) -> None:
        super().__init__(message)
        self.retry = retry


def safe_job_id(job_id: str) -> str:
    """Job ids become file names: allow only Slurm's id shapes (no `/`, no `..`)."""
    if not _SAFE_ID.match(job_id):
        raise ValueError(f"not a Slurm job id: {job_id!r}")
    return job_id


def write_durable(path: Path, text: str, mode: int = 0o640) -> None:
    """Atomic and durable: temp file in the same directory, fsync, rename, fsync the directory."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    _fsync_dir(path.parent)


def _fsync_dir(directory: Path) -> None:
    dfd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


def compact_record(record: dict[str, Any]) -> dict[str, Any]:
    """The record a fleet report reads (about 800 bytes): what `report.model.figures_from_spool`
    reads, no more. The time series is left out but for its first two iterations and first
    iteration time (they date the first record's own training); `summary.metrics` is cut to
    `COMPACT_METRICS`; the job's identity (sacct has it, the file name says which job and
    attempt), the log's details, the AdminComment text and the decoded Comment stay in the full
    record. JSON parsing is most of a fleet report's reading time, so every key costs."""
    out: dict[str, Any] = {k: record[k] for k in ("v", "attempt", "seq", "written") if k in record}
    ser = record.get("series")
    if isinstance(ser, dict):
        its, ms = ser.get("iter"), ser.get("iter_ms")
        out["series"] = {"iter": list(its[:2]) if isinstance(its, list) else [],
                         "iter_ms": list(ms[:1]) if isinstance(ms, list) else []}
    summary = record.get("summary")
    if isinstance(summary, dict):
        small = {k: v for k, v in summary.items() if k != "metrics"}
        metrics = summary.get("metrics")
        if isinstance(metrics, dict):
            small["metrics"] = {k: _compact_metric(metrics[k]) for k in COMPACT_METRICS
                                if k in metrics}
        out["summary"] = small
    return out


def _compact_metric(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: value[k] for k in _DIST_KEYS if k in value}
    return value


def order_of(doc: dict[str, Any]) -> tuple[int, int]:
    """(attempt, seq) of a record or a pending update. Files written before slurmpod stored
    them: attempt from the record's `job.restart` (else 0), seq from `written`/`queued` seconds."""
    attempt = doc.get("attempt")
    if not isinstance(attempt, int):
        job = doc.get("job")
        attempt = job.get("restart") if isinstance(job, dict) else 0
        attempt = attempt if isinstance(attempt, int) else 0
    seq = doc.get("seq")
    if not isinstance(seq, int):
        t = doc.get("written", doc.get("queued", 0))
        seq = int(t) * 1_000_000_000 if isinstance(t, int | float) else 0
    return attempt, seq


@functools.cache
def _fast_json() -> tuple[Callable[[bytes], Any], type[Exception]]:
    """msgspec's JSON decoder, imported on first use (not by every epilog)."""
    import msgspec  # lazy: start-up (msgspec only when used)

    return msgspec.json.Decoder().decode, msgspec.MsgspecError


def read_json_file(path: Path | str) -> Any:
    """One small JSON file, read with raw `os.read` and msgspec's decoder: a fleet report reads
    100,000 of them, and Python's buffered file objects and `json.loads` each cost about twice
    as much. msgspec refuses the NaN and Infinity that `json.dumps` may have written: such a
    file is parsed again by `json.loads`."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        chunks = []
        while chunk := os.read(fd, 1 << 16):  # to the end: a read may be short (NFS)
            chunks.append(chunk)
    finally:
        os.close(fd)
    data = b"".join(chunks)
    decode, error = _fast_json()
    try:
        return decode(data)
    except error:
        return json.loads(data)


@dataclass
class FlushResult:
    delivered: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)  # kept for the next flush
    errors: dict[str, str] = field(default_factory=dict)
    dropped: list[str] = field(default_factory=list)  # older than the job's newest record

    def to_json(self) -> dict[str, Any]:
        return {"delivered": self.delivered, "pending": self.failed, "errors": self.errors,
                "dropped": self.dropped}


Deliver = Callable[[str, str, str], None]
"""deliver(job_id, kind, value): raise DeliveryError when Slurm did not take it."""


def parse_record_name(name: str) -> tuple[str, int] | None:
    """`<job_id>.<attempt>.json` -> (job_id, attempt); None for anything else (temp files)."""
    stem, dot, ext = name.rpartition(".")
    job_id, _, attempt = stem.rpartition(".")
    if ext != "json" or not dot or not attempt.isdigit() or not _SAFE_ID.match(job_id):
        return None
    return job_id, int(attempt)


def latest_attempts(directory: Path, only: set[str] | None = None) -> dict[str, int]:
    """job id -> highest attempt with a file in `directory`, listing it once ({} if unreadable).
    `only`: just these jobs."""
    best: dict[str, int] = {}
    try:
        names = os.listdir(directory)
    except OSError:
        return {}
    for name in names:
        got = parse_record_name(name)
        if got is None or (only is not None and got[0] not in only):
            continue
        if got[1] > best.get(got[0], -1):
            best[got[0]] = got[1]
    return best


def latest_record_paths(root: Path | str, *, compact: bool) -> dict[str, str]:
    """job id -> the file of its latest attempt's record, for readers (nothing is created).
    Lists `records/` once, and `summaries/` once when `compact`: then each job's compact
    summary where it has one, its full record otherwise (written before summaries existed, or a
    crash between the two writes). Strings, not Paths: a fleet report builds thousands."""
    records = os.path.join(root, RECORDS_DIR)
    summaries = os.path.join(root, SUMMARIES_DIR)
    latest = latest_attempts(Path(records))
    have: set[str] = set()
    if compact:
        with contextlib.suppress(OSError):
            have = set(os.listdir(summaries))
    rec_dir, sum_dir = records + os.sep, summaries + os.sep
    out = {}
    for job_id, attempt in latest.items():
        name = f"{job_id}.{attempt}.json"
        out[job_id] = (sum_dir if name in have else rec_dir) + name
    return out


class Spool:
    """One spool directory, for writers. Creating the object creates the directories."""

    def __init__(self, root: Path | str) -> None:
        self.root = Path(root)
        self.records = self.root / RECORDS_DIR
        self.summaries = self.root / SUMMARIES_DIR
        self.pending = self.root / PENDING_DIR
        for d in (self.root, self.records, self.summaries, self.pending):
            d.mkdir(mode=0o750, parents=True, exist_ok=True)

    @property
    def log_path(self) -> Path:
        return self.root / LOG_NAME

    # -- records -------------------------------------------------------------------------
    def record_path(self, job_id: str, attempt: int = 0) -> Path:
        return self.records / f"{safe_job_id(job_id)}.{int(attempt)}.json"

    def summary_path(self, job_id: str, attempt: int = 0) -> Path:
        return self.summaries / f"{safe_job_id(job_id)}.{int(attempt)}.json"

    def write_record(self, job_id: str, attempt: int, record: dict[str, Any]) -> Path:
        """Write the record of one attempt (Slurm's restart count of the run) and its compact
        summary; a second write for the same attempt replaces both. Sets `record["attempt"]`
        and `record["seq"]` (also in the caller's dict, so that its AdminComment can be queued
        with the same order) and returns the record's path."""
        attempt = int(attempt)
        if attempt < 0:
            raise ValueError(f"attempt {attempt} < 0")
        seq = time.time_ns()
        prev = self._seq_of(job_id, attempt)
        if prev is not None and seq <= prev:  # the clock went back: stay monotonic
            seq = prev + 1
        record["attempt"], record["seq"] = attempt, seq
        path, summary = self.record_path(job_id, attempt), self.summary_path(job_id, attempt)
        if summary.exists():
            # A rerun: the old summary goes first, so that a crash before the new one is
            # written leaves a record without a summary (read whole), never a stale summary.
            with contextlib.suppress(FileNotFoundError):
                summary.unlink()
            _fsync_dir(self.summaries)
        write_durable(path, json.dumps(record, separators=(",", ":"), sort_keys=True) + "\n")
        write_durable(summary,
                      json.dumps(compact_record(record), separators=(",", ":"),
                                 sort_keys=True) + "\n")
        return path

    def read_record(self, job_id: str, attempt: int = 0) -> dict[str, Any]:
        return json.loads(self.record_path(job_id, attempt).read_text(encoding="utf-8"))

    def read_summary(self, job_id: str, attempt: int = 0) -> dict[str, Any]:
        """The compact summary; the record itself when it has none (written before summaries
        existed, or a crash between the two writes)."""
        try:
            return read_json_file(self.summary_path(job_id, attempt))
        except FileNotFoundError:
            return self.read_record(job_id, attempt)

    def _seq_of(self, job_id: str, attempt: int) -> int | None:
        try:
            doc = self.read_summary(job_id, attempt)
        except (OSError, ValueError):
            return None
        return order_of(doc)[1] if isinstance(doc, dict) else None

    def newest(self, job_id: str) -> tuple[int, int] | None:
        """(attempt, seq) of the job's newest record, None when it has none. Lists records/
        once (about 0.1 s at 100,000 records)."""
        got = self._newest_of({safe_job_id(job_id)})
        return got.get(job_id)

    def _newest_of(self, jobs: set[str]) -> dict[str, tuple[int, int]]:
        out = {}
        for job_id, attempt in latest_attempts(self.records, only=jobs).items():
            seq = self._seq_of(job_id, attempt)
            out[job_id] = (attempt, seq if seq is not None else 0)
        return out

    # -- pending updates -----------------------------------------------------------------
    def pending_path(self, job_id: str, kind: str) -> Path:
        if not re.fullmatch(r"[a-z_]+", kind):
            raise ValueError(f"bad update kind {kind!r}")
        return self.pending / f"{safe_job_id(job_id)}.{kind}.json"

    def put(self, job_id: str, kind: str, value: str, error: str = "", *, attempt: int = 0,
            seq: int | None = None) -> Path:
        """Queue `value` for `job_id`, ordered by (attempt, seq) (seq: the record's, else now).
        It replaces a pending update of the same kind unless that one is newer, including one
        a flush is delivering right now (then this one is not queued: the newer wins)."""
        path = self.pending_path(job_id, kind)
        order = (int(attempt), time.time_ns() if seq is None else int(seq))
        with self._pending_locked():
            tries = 0
            for existing in (path, path.with_name(path.name + ".inflight")):
                try:
                    doc = json.loads(existing.read_text(encoding="utf-8"))
                except (OSError, ValueError):
                    continue
                if not isinstance(doc, dict):
                    continue
                if order_of(doc) > order:
                    log.info("job %s: %s of attempt %d not queued: a newer one (attempt %d) "
                             "is pending", job_id, kind, order[0], order_of(doc)[0])
                    return path
                if existing == path:
                    with contextlib.suppress(TypeError, ValueError):
                        tries = int(doc.get("attempts", 0))
            doc = {"v": PENDING_V, "job_id": job_id, "kind": kind, "value": value,
                   "attempt": order[0], "seq": order[1], "queued": int(time.time()),
                   "attempts": tries, "last_error": error[-300:]}
            write_durable(path, json.dumps(doc, separators=(",", ":")) + "\n")
        return path

    def list_pending(self) -> list[dict[str, Any]]:
        out = []
        for path in sorted(self.pending.glob("*.json")):
            try:
                doc = json.loads(path.read_text(encoding="utf-8"))
            except (OSError, ValueError):
                continue  # a stray file; flush leaves it for a human
            doc["_path"] = str(path)
            out.append(doc)
        return out

    @contextlib.contextmanager
    def locked(self, blocking: bool = True) -> Iterator[bool]:
        fd = os.open(self.root / ".lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o640)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | (0 if blocking else fcntl.LOCK_NB))
            except BlockingIOError:
                yield False
                return
            yield True
        finally:
            os.close(fd)

    @contextlib.contextmanager
    def _pending_locked(self) -> Iterator[None]:
        """Held only while a pending file is compared and replaced or moved: never during a
        delivery."""
        fd = os.open(self.root / ".pending.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o640)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    def flush(self, deliver: Deliver, *, blocking: bool = True,
              stop_after_failures: int | None = None) -> FlushResult:
        """Try every pending update once; delivered ones are removed, others stay queued.

        `put` takes no flush lock (an epilog must never wait on a slow flush), so a pending file
        is first renamed to `*.inflight`: a `put` during the delivery creates a fresh pending
        file that the flush must not delete. A failed one is linked back unless a newer one was
        queued meanwhile. An update older in (attempt, seq) than the job's newest record is
        dropped, not delivered: a later attempt's epilog has set (or queued) its own.
        `stop_after_failures` bounds the time spent when Slurm is down (an epilog uses 1).
        """
        result = FlushResult()
        with self.locked(blocking) as got:
            if not got:  # another flush is running and will deliver everything
                return result
            for stale in sorted(self.pending.glob("*.json.inflight")):
                self._restore(stale)  # left by a flush that crashed mid-delivery
            paths = sorted(self.pending.glob("*.json"))
            jobs = {p.name.split(".", 1)[0] for p in paths}
            newest = self._newest_of(jobs) if paths else {}
            for path in paths:
                if stop_after_failures is not None and len(result.failed) >= stop_after_failures:
                    break
                inflight = path.with_name(path.name + ".inflight")
                try:
                    with self._pending_locked():
                        os.rename(path, inflight)
                    doc = json.loads(inflight.read_text(encoding="utf-8"))
                    job_id, kind, value = str(doc["job_id"]), str(doc["kind"]), str(doc["value"])
                    order = order_of(doc)
                except FileNotFoundError:
                    continue
                except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
                    key = path.name
                    result.failed.append(key)
                    result.errors[key] = f"malformed pending file: {exc}"
                    self._restore(inflight)
                    continue
                key = f"{job_id}.{kind}"
                if job_id in newest and order < newest[job_id]:
                    log.warning("job %s: pending %s of attempt %d dropped, not delivered: the "
                                "job's newest record is attempt %d (seq %d > %d)", job_id, kind,
                                order[0], newest[job_id][0], newest[job_id][1], order[1])
                    with contextlib.suppress(FileNotFoundError):
                        inflight.unlink()
                    result.dropped.append(key)
                    continue
                try:
                    deliver(job_id, kind, value)
                except DeliveryError as exc:
                    result.failed.append(key)
                    result.errors[key] = str(exc)
                    doc["attempts"] = int(doc.get("attempts", 0)) + 1
                    doc["last_error"] = str(exc)[-300:]
                    doc["last_try"] = int(time.time())
                    with contextlib.suppress(OSError):
                        write_durable(inflight, json.dumps(doc, separators=(",", ":")) + "\n")
                    self._restore(inflight)
                    continue
                with contextlib.suppress(FileNotFoundError):
                    inflight.unlink()
                result.delivered.append(key)
        return result

    def _restore(self, inflight: Path) -> None:
        """Put an in-flight update back unless a newer one (in attempt, seq) was queued
        meanwhile; an older one queued meanwhile is replaced."""
        target = inflight.with_name(inflight.name[: -len(".inflight")])
        with self._pending_locked():
            try:
                os.link(inflight, target)
            except FileExistsError:
                if _order_of_file(inflight) > _order_of_file(target):
                    os.replace(inflight, target)
            except FileNotFoundError:
                return
            with contextlib.suppress(FileNotFoundError):
                inflight.unlink()


def _order_of_file(path: Path) -> tuple[int, int]:
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return (-1, -1)
    return order_of(doc) if isinstance(doc, dict) else (-1, -1)
