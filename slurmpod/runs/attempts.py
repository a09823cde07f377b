"""Pure: `RUN_DIR/.slurmpod/attempts.jsonl`, the job script's record of every training attempt.

One JSON object per line, appended by the batch script (format v1, docs/runs.md):

    {"v":1,"event":"start","job_id":"42","attempt":1,"restart":0,"time":1700000000,
     "nodes":["gpu001","gpu002"],"log":"/runs/a/logs/a-42.out","log_offset":0}
    {"v":1,"event":"end","job_id":"42","attempt":1,"restart":0,"time":1700003600,
     "end":"timelimit","rc":143,"iteration":1200,"progress":true,"failures":0,"max_restarts":3}

and, from the resilience work (docs/resilience-in-job.md), between them:

    {"v":1,"event":"hang","job_id":"42","attempt":1,"time":…,"phase":"train","silent_s":31.2,
     "bound_s":30.0,"iteration":1180,"step_s":2.9}
    {"v":1,"event":"health","job_id":"42","attempt":2,"time":…,"checked":["gpu001",…],
     "failed":{"gpu003":"no answer"},"duration_s":1.4}
    {"v":1,"event":"exclude","job_id":"42","attempt":1,"time":…,"node":"gpu002",
     "evidence":"srun: task 9 Killed","action":"excluded"}

The job owns the file, so it is read as hostile: a line that is not a JSON object with the
required keys of the right types (a node died mid-write, or someone wrote garbage) is skipped
and counted; optional values of the wrong type or out of range become None; strings and lists
are capped. Numbers are for display only: nothing here decides anything from them.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

FORMAT_V = 1
MAX_LINE_BYTES = 64 * 1024  # a start line of a 4,096-node job is ~70 KB at worst; skip longer
MAX_NODES = 4096
MAX_PATH_CHARS = 4096
MAX_ATTEMPT = 1_000_000
MAX_EPOCH_S = 1 << 40
MAX_OFFSET = 1 << 60
ENDS = ("completed", "cancelled", "timelimit", "preempted", "node_fail", "failure", "requeued",
        "hang")
EVENTS = ("start", "end", "hang", "health", "exclude")
EXCLUDE_ACTIONS = ("excluded", "drained", "not_excluded")
MAX_TEXT = 512
_JOB_ID = re.compile(r"^\d{1,12}(?:_\d{1,12})?(?:\+\d{1,6})?$")
_HOST = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,254}$")


@dataclass(frozen=True)
class Attempt:
    """One launch of the training step of one job, from its start line and its end line."""

    job_id: str
    attempt: int
    restart: int | None = None  # SLURM_RESTART_COUNT at the start
    start_s: int | None = None  # epoch seconds
    end_s: int | None = None
    nodes: tuple[str, ...] = ()
    log: str | None = None  # absolute path of the main log, as the script wrote it
    log_offset: int | None = None  # the main log's size when the attempt started
    log_end: int | None = None  # where the next attempt of this job starts in the same log
    end: str | None = None  # one of ENDS, or None while running (or when the end was lost)
    rc: int | None = None
    iteration: int | None = None  # latest checkpointed iteration after the attempt
    progress: bool | None = None
    failures: int | None = None
    max_restarts: int | None = None
    hang: Mapping[str, Any] | None = None  # the monitor's hang record, if it declared one
    health: Mapping[str, Any] | None = None  # the health gate before this attempt
    excluded: tuple[Mapping[str, Any], ...] = ()  # nodes shed after it, with their evidence

    @property
    def ended(self) -> bool:
        return self.end is not None

    def to_json(self) -> dict[str, Any]:
        return {
            "job_id": self.job_id, "attempt": self.attempt, "restart": self.restart,
            "start_time": self.start_s, "end_time": self.end_s, "nodes": list(self.nodes),
            "log": self.log, "log_offset": self.log_offset, "log_end": self.log_end,
            "end": self.end, "rc": self.rc, "iteration": self.iteration,
            "progress": self.progress, "failures": self.failures,
            "max_restarts": self.max_restarts, "hang": self.hang, "health": self.health,
            "excluded": list(self.excluded),
        }


@dataclass(frozen=True)
class AttemptLog:
    """Attempts in file order of their first line, and how many lines were skipped."""

    attempts: tuple[Attempt, ...] = ()
    n_skipped: int = 0
    truncated: bool = False  # only the file's tail was read
    by_job: dict[str, tuple[Attempt, ...]] = field(default_factory=dict, compare=False)

    def of_job(self, job_id: str) -> tuple[Attempt, ...]:
        return self.by_job.get(job_id, ())

    def latest(self, job_id: str) -> Attempt | None:
        mine = self.of_job(job_id)
        return mine[-1] if mine else None

    def find(self, job_id: str, attempt: int) -> Attempt | None:
        return next((a for a in self.of_job(job_id) if a.attempt == attempt), None)


def _int(value: Any, lo: int = 0, hi: int = MAX_OFFSET) -> int | None:
    # bool is an int in Python, and JSON's true must not read as 1
    if isinstance(value, bool) or not isinstance(value, int):
        return None
    return value if lo <= value <= hi else None


def _path(value: Any) -> str | None:
    if not isinstance(value, str) or not value.startswith("/") or len(value) > MAX_PATH_CHARS \
            or "\x00" in value or "\n" in value:
        return None
    return value


def _nodes(value: Any) -> tuple[str, ...]:
    if not isinstance(value, list):
        return ()
    return tuple(n for n in value[:MAX_NODES] if isinstance(n, str) and _HOST.match(n))


def _num(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if 0 <= value < 1e9 else None


def _text(value: Any) -> str | None:
    return value[:MAX_TEXT] if isinstance(value, str) else None


def parse_line(line: bytes | str) -> dict[str, Any] | None:
    """One line -> a checked event dict, or None when the line is not a v1 event."""
    if len(line) > MAX_LINE_BYTES:
        return None
    try:
        doc = json.loads(line)
    except (ValueError, RecursionError):
        return None
    if not isinstance(doc, dict) or doc.get("v") != FORMAT_V:
        return None
    event, job_id = doc.get("event"), doc.get("job_id")
    attempt = _int(doc.get("attempt"), 1, MAX_ATTEMPT)
    if event not in EVENTS or not isinstance(job_id, str) \
            or not _JOB_ID.match(job_id) or attempt is None:
        return None
    out: dict[str, Any] = {"event": event, "job_id": job_id, "attempt": attempt,
                           "restart": _int(doc.get("restart"), 0, MAX_ATTEMPT),
                           "time": _int(doc.get("time"), 1, MAX_EPOCH_S)}
    if event == "start":
        out["nodes"] = _nodes(doc.get("nodes"))
        out["log"] = _path(doc.get("log"))
        out["log_offset"] = _int(doc.get("log_offset"))
    elif event == "hang":
        out["hang"] = {"phase": doc.get("phase") if doc.get("phase") in ("setup", "train", "save")
                       else None, "silent_s": _num(doc.get("silent_s")),
                       "bound_s": _num(doc.get("bound_s")), "step_s": _num(doc.get("step_s")),
                       "iteration": _int(doc.get("iteration"), 0, MAX_OFFSET), "time": out["time"]}
    elif event == "health":
        failed = doc.get("failed")
        out["health"] = {
            "checked": list(_nodes(doc.get("checked"))),
            "failed": {k: _text(v) for k, v in list(failed.items())[:MAX_NODES]
                       if isinstance(k, str) and _HOST.match(k)} if isinstance(failed, dict)
            else {},
            "duration_s": _num(doc.get("duration_s"))}
    elif event == "exclude":
        node = doc.get("node")
        if not isinstance(node, str) or not _HOST.match(node):
            return None
        action = doc.get("action")
        out["exclude"] = {"node": node, "evidence": _text(doc.get("evidence")),
                          "action": action if action in EXCLUDE_ACTIONS else None,
                          "time": out["time"]}
    else:
        end = doc.get("end")
        out["end"] = end if end in ENDS else ("unknown" if end is not None else None)
        out["rc"] = _int(doc.get("rc"), -(1 << 31), 1 << 31)
        out["iteration"] = _int(doc.get("iteration"), 0, MAX_OFFSET)
        progress = doc.get("progress")
        out["progress"] = progress if isinstance(progress, bool) else None
        out["failures"] = _int(doc.get("failures"), 0, MAX_ATTEMPT)
        out["max_restarts"] = _int(doc.get("max_restarts"), 0, MAX_ATTEMPT)
    return out


def parse_attempts(data: bytes | str | Iterable[bytes | str], *,
                   truncated: bool = False) -> AttemptLog:
    """All attempts in `data` (the file's bytes, or its lines). A start line opens attempt
    (job_id, attempt) — a repeated start keeps the first; an end line closes it (the last end
    wins; an end without its start still counts: the start may lie before a read tail)."""
    if isinstance(data, bytes | str):
        lines: Iterable[bytes | str] = data.splitlines() if isinstance(data, str) \
            else data.split(b"\n")
    else:
        lines = data
    found: dict[tuple[str, int], Attempt] = {}
    skipped = 0
    for raw in lines:
        if not raw.strip():
            continue
        ev = parse_line(raw)
        if ev is None:
            skipped += 1
            continue
        key = (ev["job_id"], ev["attempt"])
        cur = found.get(key) or Attempt(job_id=ev["job_id"], attempt=ev["attempt"])
        if ev["event"] == "hang":
            cur = replace(cur, hang=ev["hang"])
        elif ev["event"] == "health":
            cur = replace(cur, health=ev["health"])
        elif ev["event"] == "exclude":
            cur = replace(cur, excluded=(*cur.excluded, ev["exclude"])[:MAX_NODES])
        elif ev["event"] == "start":
            if cur.start_s is not None or cur.log_offset is not None:
                continue  # a second start of the same attempt: the first one stands
            cur = replace(cur, restart=ev["restart"], start_s=ev["time"], nodes=ev["nodes"],
                          log=ev["log"], log_offset=ev["log_offset"])
        else:
            cur = replace(cur, end_s=ev["time"], end=ev["end"], rc=ev["rc"],
                          iteration=ev["iteration"], progress=ev["progress"],
                          failures=ev["failures"], max_restarts=ev["max_restarts"],
                          restart=cur.restart if cur.restart is not None else ev["restart"])
        found[key] = cur
    by_job: dict[str, list[Attempt]] = {}
    for att in found.values():
        by_job.setdefault(att.job_id, []).append(att)
    ordered: dict[str, tuple[Attempt, ...]] = {}
    for job_id, atts in by_job.items():
        atts.sort(key=lambda a: a.attempt)
        ordered[job_id] = tuple(_with_log_ends(atts))
    every = tuple(a for atts in ordered.values() for a in atts)
    return AttemptLog(attempts=every, n_skipped=skipped, truncated=truncated, by_job=ordered)


def _with_log_ends(atts: list[Attempt]) -> Iterable[Attempt]:
    """An attempt's lines run from its offset to the next attempt's offset in the same log."""
    for i, att in enumerate(atts):
        nxt = next((b for b in atts[i + 1:] if b.log_offset is not None), None)
        end = None
        if nxt is not None and att.log_offset is not None and nxt.log == att.log \
                and nxt.log_offset is not None and nxt.log_offset >= att.log_offset:
            end = nxt.log_offset
        yield replace(att, log_end=end) if end is not None else att


def byte_range(att: Attempt) -> tuple[int, int | None]:
    """(first byte, end byte or None = to the end of the log) of one attempt's lines."""
    return att.log_offset or 0, att.log_end


FAILED_ENDS = ("failure", "node_fail", "hang")


def faults(att: Attempt) -> list[dict[str, Any]]:
    """The attempt's fault events, in the order they happened: nodes the health gate failed
    (before the step), a hang the monitor declared, the step's failure (`failure`: a rank or
    the step failed; `node_fail`: Slurm lost a node), then each node shed after it (`excluded`,
    `drained`, or `not_excluded` when the run's exclusion bound was reached) with its evidence.
    Display only, like every figure of the record."""
    out: list[dict[str, Any]] = []
    if att.health and att.health.get("failed"):
        out.append({"kind": "health", "time": att.start_s,
                    "failed": dict(att.health["failed"]),
                    "duration_s": att.health.get("duration_s")})
    if att.hang is not None:
        out.append({"kind": "hang", **att.hang})
    if att.end in ("failure", "node_fail"):
        out.append({"kind": att.end, "time": att.end_s, "rc": att.rc})
    for ex in att.excluded:
        out.append({"kind": ex.get("action") or "excluded", "time": ex.get("time"),
                    "node": ex.get("node"), "evidence": ex.get("evidence")})
    return out


def fault_text(fault: Mapping[str, Any], width: int = 60) -> str:
    """One fault as a few words for a terminal (`runs`' text view)."""
    kind = str(fault.get("kind"))

    def cut(text: Any) -> str:
        t = "".join(c if c.isprintable() else "?" for c in str(text or ""))
        return t if len(t) <= width else t[:width - 1] + "…"

    if kind == "hang":
        silent, bound = fault.get("silent_s"), fault.get("bound_s")
        told = f" after {silent:.0f} s (bound {bound:.0f} s)" \
            if isinstance(silent, float) and isinstance(bound, float) else ""
        return f"hang in {fault.get('phase') or '?'}{told}"
    if kind == "health":
        failed = fault.get("failed") or {}
        return "health gate failed " + ", ".join(f"{n} ({cut(w)})" for n, w in
                                                  list(failed.items())[:3]) \
            + (f" +{len(failed) - 3}" if len(failed) > 3 else "")
    if kind in ("failure", "node_fail"):
        return ("step failed" if kind == "failure" else "node failure") \
            + (f" (exit {fault['rc']})" if fault.get("rc") is not None else "")
    return f"{kind.replace('_', ' ')} {fault.get('node')}: {cut(fault.get('evidence'))}"


def summarize(atts: Iterable[Attempt]) -> Mapping[str, Any]:
    """Counts per end reason, for the JSON of `slurmpod runs` (display only)."""
    counts: dict[str, int] = {}
    for att in atts:
        if att.end:
            counts[att.end] = counts.get(att.end, 0) + 1
    return counts
