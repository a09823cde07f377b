"""The site spool: per-job records and AdminComment updates not yet delivered to Slurm.

Layout under the spool directory (created 0750 by the first hook that runs):

    records/<job_id>.<restart>.json    summary + time series of one job run (written once)
    pending/<job_id>.<kind>.json       an update waiting for slurmctld/slurmdbd (one per job+kind;
                                       a newer one replaces an older one: last writer wins)
    hook.log                           what the hooks did, one line per event

Every file is written to a temp file in the same directory, fsynced, then renamed, so a crash
leaves the old file or the new one, never half of one. Delivery is idempotent (setting a job's
AdminComment twice to the same value is harmless), so a crash between delivering and unlinking
the pending file only causes one more delivery. A `flock` on `<spool>/.lock` serialises `flush`
runs (the epilog of every job flushes too).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

PENDING_V = 1
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
    dfd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


@dataclass
class FlushResult:
    delivered: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)  # kept for the next flush
    errors: dict[str, str] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"delivered": self.delivered, "pending": self.failed, "errors": self.errors}


Deliver = Callable[[str, str, str], None]
"""deliver(job_id, kind, value): raise DeliveryError when Slurm did not take it."""


class Spool:
    """One spool directory. Creating the object creates the directories."""

    def __init__(self, root: Path | str) -> None:
        self.root = Path(root)
        self.records = self.root / "records"
        self.pending = self.root / "pending"
        for d in (self.root, self.records, self.pending):
            d.mkdir(mode=0o750, parents=True, exist_ok=True)

    @property
    def log_path(self) -> Path:
        return self.root / "hook.log"

    # -- records -------------------------------------------------------------------------
    def record_path(self, job_id: str, restart: int = 0) -> Path:
        return self.records / f"{safe_job_id(job_id)}.{int(restart)}.json"

    def write_record(self, job_id: str, restart: int, record: dict[str, Any]) -> Path:
        path = self.record_path(job_id, restart)
        write_durable(path, json.dumps(record, separators=(",", ":"), sort_keys=True) + "\n")
        return path

    def read_record(self, job_id: str, restart: int = 0) -> dict[str, Any]:
        return json.loads(self.record_path(job_id, restart).read_text(encoding="utf-8"))

    # -- pending updates -----------------------------------------------------------------
    def pending_path(self, job_id: str, kind: str) -> Path:
        if not re.fullmatch(r"[a-z_]+", kind):
            raise ValueError(f"bad update kind {kind!r}")
        return self.pending / f"{safe_job_id(job_id)}.{kind}.json"

    def put(self, job_id: str, kind: str, value: str, error: str = "") -> Path:
        """Queue `value` for `job_id`; replaces an older pending update of the same kind."""
        path = self.pending_path(job_id, kind)
        attempts = 0
        with contextlib.suppress(OSError, ValueError):
            attempts = int(json.loads(path.read_text(encoding="utf-8")).get("attempts", 0))
        doc = {"v": PENDING_V, "job_id": job_id, "kind": kind, "value": value,
               "queued": int(time.time()), "attempts": attempts, "last_error": error[-300:]}
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

    def flush(self, deliver: Deliver, *, blocking: bool = True,
              stop_after_failures: int | None = None) -> FlushResult:
        """Try every pending update once; delivered ones are removed, others stay queued.

        `put` takes no lock (an epilog must never wait on a slow flush), so a pending file is
        first renamed to `*.inflight`: a `put` during the delivery creates a fresh pending file
        that the flush must not delete. A failed one is linked back only when no newer exists.
        `stop_after_failures` bounds the time spent when Slurm is down (an epilog uses 1).
        """
        result = FlushResult()
        with self.locked(blocking) as got:
            if not got:  # another flush is running and will deliver everything
                return result
            for stale in sorted(self.pending.glob("*.json.inflight")):
                self._restore(stale)  # left by a flush that crashed mid-delivery
            for path in sorted(self.pending.glob("*.json")):
                if stop_after_failures is not None and len(result.failed) >= stop_after_failures:
                    break
                inflight = path.with_name(path.name + ".inflight")
                try:
                    os.rename(path, inflight)
                    doc = json.loads(inflight.read_text(encoding="utf-8"))
                    job_id, kind, value = str(doc["job_id"]), str(doc["kind"]), str(doc["value"])
                except FileNotFoundError:
                    continue
                except (OSError, ValueError, KeyError, TypeError) as exc:
                    key = path.name
                    result.failed.append(key)
                    result.errors[key] = f"malformed pending file: {exc}"
                    self._restore(inflight)
                    continue
                key = f"{job_id}.{kind}"
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

    @staticmethod
    def _restore(inflight: Path) -> None:
        """Put an in-flight update back unless a newer one was queued meanwhile."""
        target = inflight.with_name(inflight.name[: -len(".inflight")])
        with contextlib.suppress(FileExistsError):
            os.link(inflight, target)
        with contextlib.suppress(FileNotFoundError):
            inflight.unlink()
