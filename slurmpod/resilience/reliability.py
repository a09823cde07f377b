"""The fleet's reliability over a window: failures per node and per kind, suspect nodes with
their evidence, observed MTBF per node and at job scale, GPU time lost per cause. Pure.

Sources (docs/report.md, "Reliability"):
- sacct's attempts (`sacct -D`), from a narrow query of their own (`phases_argv`: no free text)
  that adds each attempt's NodeList and AllocTRES, so a NODE_FAIL attempt names its nodes and
  a resized job shows the GPUs it held in each phase;
- the job script's attempts record (`RUN_DIR/.slurmpod/attempts.jsonl`, docs/runs.md), where
  the caller could read it: its ends (hang, node_fail, failure, preempted, timelimit) and its
  hang / health / exclude events with their evidence. A job with a record is counted from its
  record (Slurm shows an attempt slurmpod's script requeued as REQUEUED whatever ended it);
  sacct's NODE_FAIL node lists still add evidence against nodes.

A Slurm resize is not a restart: with `--no-kill` (slurmpod's `--spares`) Slurm removes a failed
node from the job, ends the accounting record of the old allocation in state RESIZING and opens
a new one under the same job id (Slurm 22.05–24.05). Such a phase is listed under `resizes`
with the GPUs held before and after, and is neither an interruption nor a queue wait.

The rate itself is slurmpod.resilience.history's (node-hours ÷ interruptions, startup failures
apart), not recomputed here.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from slurmpod.backends.parse import gpus_from_tres, is_job_id, state_of
from slurmpod.model.hostlist import HostlistError, expand
from slurmpod.report.sacct import SacctJob
from slurmpod.resilience.history import History, from_attempts, from_sacct
from slurmpod.runs.attempts import Attempt as RunAttempt
from slurmpod.runs.attempts import AttemptLog

SCHEMA = "slurmpod.report.reliability/1"
PHASE_FIELDS = ("JobID", "Start", "End", "ElapsedRaw", "State", "NodeList", "AllocTRES")
MAX_RECORDS = 500  # attempts records read per report: each is a file on a shared file system
TOP_SUSPECTS = 20
MAX_EVIDENCE = 10  # evidence lines kept per node
KINDS = ("hang", "node_fail", "failure:xid", "failure:nccl", "failure:other", "preemption",
         "timelimit", "requeued")
# An end of the attempts record, or a sacct state, -> the kind it is counted as (None: not an
# interruption: a completion, a cancel, a resize).
RECORD_KIND = {"hang": "hang", "node_fail": "node_fail", "failure": "failure",
               "preempted": "preemption", "timelimit": "timelimit", "requeued": "requeued"}
SACCT_KIND = {"NODE_FAIL": "node_fail", "FAILED": "failure:other", "PREEMPTED": "preemption",
              "TIMEOUT": "timelimit", "REQUEUED": "requeued", "BOOT_FAIL": "node_fail",
              "OUT_OF_MEMORY": "failure:other", "DEADLINE": "timelimit"}
_XID = re.compile(r"\bXid\b", re.IGNORECASE)
_NCCL = re.compile(r"\bNCCL\b|ncclUnhandled|ncclSystemError|ncclRemoteError", re.IGNORECASE)
GPUS_PER_NODE = 8  # slurmpod's nodes (docs/architecture.md), when sacct gives no GPU count


@dataclass(frozen=True)
class Phase:
    """One accounting record of a job: an attempt, or a phase of a resized one."""

    job_id: str
    start_s: int | None
    end_s: int | None
    elapsed_s: int
    state: str
    nodes: tuple[str, ...]
    gpus: int | None  # AllocTRES gres/gpu; None when sacct gives none

    @property
    def node_hours(self) -> float:
        return len(self.nodes) * self.elapsed_s / 3600.0


def phases_argv(selection: Sequence[str], delimiter: str) -> list[str]:
    """The phases query: only with --reliability (one more sacct call, no free text)."""
    return ["sacct", "--noheader", "--parsable2", f"--delimiter={delimiter}", "--duplicates",
            "--allocations", f"--format={','.join(PHASE_FIELDS)}", *selection]


def _epoch(text: str) -> int | None:
    return int(text) if text.isdigit() and int(text) > 0 else None


def _hosts(expr: str) -> tuple[str, ...] | None:
    if expr in ("", "None assigned", "(null)"):
        return ()
    try:
        return tuple(expand(expr))
    except HostlistError:
        return None


def parse_phases(text: str, delimiter: str = "|") -> dict[str, list[Phase]]:
    """`JobID|Start|End|ElapsedRaw|State|NodeList|AllocTRES` rows -> job id -> phases in
    sacct's order. A row not as Slurm prints it is left out (counted in `n_bad`)."""
    out: dict[str, list[Phase]] = {}
    for line in text.rstrip("\n").split("\n"):
        parts = line.split(delimiter)
        if len(parts) != len(PHASE_FIELDS) or not is_job_id(parts[0]) or "." in parts[0]:
            continue
        jid, start, end, elapsed, state, nodelist, tres = parts
        hosts = _hosts(nodelist)
        if not elapsed.isdigit() or hosts is None or not re.fullmatch(r"[A-Z_]+( by \d+)?",
                                                                       state):
            continue
        gpus = gpus_from_tres(tres) if "gres/gpu" in tres else None
        out.setdefault(jid, []).append(Phase(jid, _epoch(start), _epoch(end), int(elapsed),
                                             str(state_of(state)).split(" ")[0], hosts, gpus))
    return out


def failure_kind(end: str | None, evidence: Iterable[str | None] = ()) -> str | None:
    """The kind an attempts-record end counts as; a `failure` is split by its evidence."""
    kind = RECORD_KIND.get(end or "")
    if kind != "failure":
        return kind
    text = " ".join(e for e in evidence if e)
    if _XID.search(text):
        return "failure:xid"
    if _NCCL.search(text):
        return "failure:nccl"
    return "failure:other"


@dataclass
class NodeStats:
    name: str
    hours: float = 0.0
    interrupted: int = 0  # interrupted attempts it ran in
    blamed: dict[str, int] = field(default_factory=dict)  # kind -> interruptions blamed on it
    score: float = 0.0
    evidence: list[str] = field(default_factory=list)

    def blame(self, weight: float, line: str, kind: str | None = None) -> None:
        self.score += weight
        if kind is not None:
            self.blamed[kind] = self.blamed.get(kind, 0) + 1
        if len(self.evidence) < MAX_EVIDENCE:
            self.evidence.append(line)

    @property
    def mtbf_hours(self) -> float | None:
        n = sum(self.blamed.values())
        return self.hours / n if n else None

    def to_json(self) -> dict[str, Any]:
        mtbf = self.mtbf_hours
        return {"node": self.name, "score": round(self.score, 3),
                "node_hours": round(self.hours, 3), "interrupted_attempts": self.interrupted,
                "blamed": dict(sorted(self.blamed.items())),
                "mtbf_hours": None if mtbf is None else round(mtbf, 3),
                "evidence": list(self.evidence)}


@dataclass(frozen=True)
class Resize:
    job_id: str
    time_s: int | None
    nodes_before: tuple[str, ...]
    nodes_after: tuple[str, ...]
    gpus_before: int | None
    gpus_after: int | None

    def to_json(self) -> dict[str, Any]:
        return {"job_id": self.job_id, "time": self.time_s,
                "removed": sorted(set(self.nodes_before) - set(self.nodes_after)),
                "nodes_before": len(self.nodes_before), "nodes_after": len(self.nodes_after),
                "gpus_before": self.gpus_before, "gpus_after": self.gpus_after}


@dataclass
class Reliability:
    window: str
    history: History
    by_kind: dict[str, int]
    nodes: list[NodeStats]  # every node seen, suspects first
    job_scale: list[tuple[int, float]]  # (nodes, MTBF hours of a job that size)
    lost: dict[str, float | None]  # cause -> GPU-hours (None: the data does not give it)
    queue_wait_hours: float
    resizes: list[Resize]
    records_read: int
    records_capped: bool
    jobs: int

    @property
    def suspects(self) -> list[NodeStats]:
        return [n for n in self.nodes if n.score > 0][:TOP_SUSPECTS]

    def to_json(self) -> dict[str, Any]:
        mtbf = self.history.observed_mtbf_hours
        return {
            "schema": SCHEMA, "window": self.window, "jobs": self.jobs,
            "records_read": self.records_read, "records_capped": self.records_capped,
            "max_records": MAX_RECORDS,
            "history": self.history.to_json(),
            "failures_by_kind": dict(self.by_kind),
            "node_mtbf_hours": None if mtbf is None else round(mtbf, 3),
            "job_scale_mtbf_hours": [{"nodes": n, "mtbf_hours": round(h, 3)}
                                     for n, h in self.job_scale],
            "suspects": [n.to_json() for n in self.suspects],
            "nodes": [n.to_json() for n in self.nodes],
            "lost_gpu_hours": {k: None if v is None else round(v, 3)
                               for k, v in self.lost.items()},
            "queue_wait_hours": round(self.queue_wait_hours, 3),
            "resizes": [r.to_json() for r in self.resizes],
        }


def _gpus_per_node(sj: SacctJob | None) -> float:
    if sj is not None and sj.record.n_nodes > 0 and sj.record.n_gpus > 0:
        return sj.record.n_gpus / sj.record.n_nodes
    return float(GPUS_PER_NODE)


def resizes_of(phases: Sequence[Phase]) -> list[Resize]:
    """Each RESIZING phase and the phase that followed it."""
    out = []
    for i, p in enumerate(phases[:-1]):
        if p.state == "RESIZING":
            nxt = phases[i + 1]
            out.append(Resize(p.job_id, p.end_s or nxt.start_s, p.nodes, nxt.nodes, p.gpus,
                              nxt.gpus))
    return out


@dataclass
class _Tally:
    """What build_reliability adds up while it walks the records and the phases."""

    nodes: dict[str, NodeStats] = field(default_factory=dict)
    by_kind: dict[str, int] = field(default_factory=lambda: dict.fromkeys(KINDS, 0))
    recomputed: float = 0.0  # GPU-hours of work redone after hangs
    recomputed_known: bool = False
    restart: float = 0.0  # GPU-hours between attempts of one allocation
    queue: float = 0.0  # wall hours between attempts waiting in the queue
    queue_gpu: float = 0.0  # GPU-hours of the same waits

    def node(self, name: str) -> NodeStats:
        got = self.nodes.get(name)
        if got is None:
            got = self.nodes[name] = NodeStats(name)
        return got

    def interrupted(self, kind: str, nodes: Iterable[str]) -> None:
        self.by_kind[kind] += 1
        for n in nodes:
            self.node(n).interrupted += 1


def _blame_attempt(t: _Tally, jid: str, a: RunAttempt, kind: str) -> None:
    """An interrupted attempt's blame: the nodes it excluded or drained (1 each; others it
    named 0.5), else its nodes share 1 (the kind counted against a node only when alone)."""
    named = [e for e in a.excluded if e.get("action") in ("excluded", "drained")]
    for e in a.excluded:
        w = 1.0 if e in named else 0.5
        t.node(str(e["node"])).blame(
            w, f"job {jid} attempt {a.attempt}: {kind}, {e.get('action')}"
            + (f" ({e['evidence']})" if e.get("evidence") else ""),
            kind if e in named else None)
    if not named and a.nodes:
        w = 1.0 / len(a.nodes)
        for n in a.nodes:
            t.node(n).blame(w, f"job {jid} attempt {a.attempt}: {kind} on "
                            f"{len(a.nodes)} node(s), none named",
                            kind if len(a.nodes) == 1 else None)


def _count_attempt(t: _Tally, jid: str, a: RunAttempt, nxt: RunAttempt | None,
                   per_node: float) -> None:
    """One attempt of a job's record: node-hours, health-gate blame, its end's kind, work
    redone after a hang and the gap to the next attempt (restart or queue)."""
    ran = (a.end_s - a.start_s) if a.start_s and a.end_s and a.end_s >= a.start_s else 0
    for n in a.nodes:
        t.node(n).hours += ran / 3600.0
    if a.health and a.health.get("failed"):
        for n, why in a.health["failed"].items():
            t.node(n).blame(1.0, f"job {jid} attempt {a.attempt}: health gate failed"
                            + (f" ({why})" if why else ""))
    kind = failure_kind(a.end, [e.get("evidence") for e in a.excluded])
    if kind is not None:
        t.interrupted(kind, a.nodes)
        _blame_attempt(t, jid, a, kind)
    if a.hang and a.hang.get("step_s") and a.hang.get("iteration") is not None \
            and a.iteration is not None and a.nodes:
        redo = max(0, int(a.hang["iteration"]) - a.iteration) * float(a.hang["step_s"])
        t.recomputed += redo * len(a.nodes) * per_node / 3600.0
        t.recomputed_known = True
    if nxt is not None and a.end_s and nxt.start_s and nxt.start_s >= a.end_s:
        gap = nxt.start_s - a.end_s
        if nxt.restart == a.restart:  # same allocation: an in-job restart
            t.restart += gap * len(a.nodes) * per_node / 3600.0
        else:  # requeued: the run waited in the queue
            t.queue += gap / 3600.0
            t.queue_gpu += gap * len(a.nodes) * per_node / 3600.0


def _count_records(t: _Tally, records: Mapping[str, Sequence[RunAttempt]],
                   by_id: Mapping[str, SacctJob]) -> History:
    """Jobs with an attempts record, counted from it; their history (exposure, failures)."""
    for jid, atts in records.items():
        per_node = _gpus_per_node(by_id.get(jid))
        for i, a in enumerate(atts):
            _count_attempt(t, jid, a, atts[i + 1] if i + 1 < len(atts) else None, per_node)
    if not records:
        return History()
    return from_attempts(AttemptLog(attempts=tuple(a for atts in records.values()
                                                   for a in atts)), "attempts.jsonl")


def _count_phases(t: _Tally, jid: str, ph: Sequence[Phase], mine: bool) -> None:
    """One job's sacct phases: NODE_FAIL/BOOT_FAIL node lists always add evidence; a job
    without a record (`mine`) is also counted from them (node-hours, kinds, queue waits)."""
    for i, p in enumerate(ph):
        if mine:
            for n in p.nodes:
                t.node(n).hours += p.elapsed_s / 3600.0
        kind = SACCT_KIND.get(p.state)
        if kind is None:
            continue
        if p.state in ("NODE_FAIL", "BOOT_FAIL") and p.nodes:
            w = 1.0 / len(p.nodes)
            for n in p.nodes:
                t.node(n).blame(w, f"job {jid}: sacct {p.state} on {len(p.nodes)} node(s)",
                                kind if mine and len(p.nodes) == 1 else None)
        if not mine:
            continue
        t.interrupted(kind, p.nodes)
        after = ph[i + 1] if i + 1 < len(ph) else None
        if after is not None and p.end_s and after.start_s and after.start_s >= p.end_s:
            gap = after.start_s - p.end_s
            t.queue += gap / 3600.0
            t.queue_gpu += gap * (p.gpus if p.gpus is not None
                                  else len(p.nodes) * GPUS_PER_NODE) / 3600.0


def _job_scale(jobs: Sequence[SacctJob], node_mtbf: float | None) -> list[tuple[int, float]]:
    """The MTBF of a job as large as each of the eight largest job sizes seen."""
    sizes = sorted({sj.record.n_nodes for sj in jobs if sj.record.n_nodes > 0}, reverse=True)
    return [(n, node_mtbf / n) for n in sizes[:8]] if node_mtbf else []


def build_reliability(jobs: Sequence[SacctJob], *, window: str,
                      phases: Mapping[str, Sequence[Phase]] | None = None,
                      records: Mapping[str, Sequence[RunAttempt]] | None = None,
                      records_capped: bool = False,
                      loss_gpu_hours: Mapping[str, float] | None = None) -> Reliability:
    """`phases`: parse_phases of the phases query; `records`: job id -> its attempts from the
    attempts record; `loss_gpu_hours`: the fleet report's lost GPU-hours by cause (its
    checkpoint figure is the checkpoint overhead here)."""
    phases = phases or {}
    records = {k: tuple(v) for k, v in (records or {}).items() if v}
    t = _Tally()
    hist = _count_records(t, records, {sj.record.job_id: sj for sj in jobs})
    resizes: list[Resize] = []
    for jid, ph in phases.items():
        resizes += resizes_of(ph)
        _count_phases(t, jid, ph, jid not in records)
    rest = [sj for sj in jobs if sj.record.job_id not in records]
    hist = hist + from_sacct(rest) if rest else hist
    lost: dict[str, float | None] = {
        "recomputed": t.recomputed if t.recomputed_known else None,
        "restart_latency": t.restart if records else None,
        "checkpoint": (loss_gpu_hours or {}).get("checkpoint"),
        "queue_wait": t.queue_gpu}
    ranked = sorted(t.nodes.values(), key=lambda s: (-s.score, -sum(s.blamed.values()), s.name))
    return Reliability(window, hist, {k: v for k, v in t.by_kind.items() if v}, ranked,
                       _job_scale(jobs, hist.observed_mtbf_hours), lost, t.queue, resizes,
                       len(records), records_capped, len(jobs))


def _h(v: float | None) -> str:
    return "-" if v is None else f"{v:,.1f}"


def reliability_text(r: Reliability) -> str:
    lines = [f"Fleet reliability, last {r.window}: {r.jobs} jobs, {r.history.attempts} attempts,"
             f" {r.history.node_hours:,.1f} node-hours"]
    src = f"attempts records read: {r.records_read}"
    if r.records_capped:
        src += f" (capped at {MAX_RECORDS}; the other jobs counted from sacct)"
    lines.append(src)
    mtbf = r.history.observed_mtbf_hours
    lines.append(f"interruptions: {r.history.failures} (+{r.history.startup_failures} at "
                 f"startup, left out of the rate); node MTBF observed: {_h(mtbf)} h")
    if r.job_scale:
        lines.append("MTBF at job scale: " + ", ".join(
            f"{n} nodes {_h(h)} h" for n, h in r.job_scale))
    lines.append("")
    lines.append("Failures by kind:" + ("" if r.by_kind else " none"))
    for k, v in r.by_kind.items():
        lines.append(f"  {k:<14} {v}")
    lines.append("")
    sus = r.suspects
    lines.append("Suspect nodes:" + ("" if sus else " none"))
    for s in sus:
        lines.append(f"  {s.name:<12} score {s.score:.2f}  {s.hours:,.1f} node-h  "
                     f"MTBF {_h(s.mtbf_hours)} h")
        for e in s.evidence:
            lines.append(f"      {e}")
    lines.append("")
    lines.append("GPU-hours lost by cause:")
    for k, lv in r.lost.items():
        lines.append(f"  {k:<16} {_h(lv)}" + ("  (not in the data)" if lv is None else ""))
    lines.append(f"  queue wait between attempts: {_h(r.queue_wait_hours)} h wall")
    if r.resizes:
        lines.append("")
        lines.append("Resizes (a node removed, the job went on; not restarts):")
        for z in r.resizes:
            gone = ",".join(sorted(set(z.nodes_before) - set(z.nodes_after))) or "-"
            g = (f"{z.gpus_before} -> {z.gpus_after} GPUs" if z.gpus_before is not None
                 else f"{len(z.nodes_before)} -> {len(z.nodes_after)} nodes")
            lines.append(f"  job {z.job_id}: {g}, removed {gone}")
    return "\n".join(lines) + "\n"
