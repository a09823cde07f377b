"""Which nodes failed an attempt, and which of them the next attempt leaves out.

After a failed or hung attempt the batch script runs `python -m slurmpod.resilience.shedding`.
It reads the evidence Slurm and the job left (docs/resilience-in-job.md, "Shedding bad nodes"):

- **srun's per-task exit**: the `srun: error: NODE: task(s) R: REASON` lines of the attempt's
  part of the log *before* srun starts ending the step (`Terminating StepId`, `*** STEP …
  CANCELLED`,
  `Force Terminated`): a task killed by a signal other than SIGTERM (`Killed`, `Segmentation
  fault`, `Bus error`, `Aborted`, …) blames its node; an exit code does not (an application error
  would follow the job to any node). `Node failure on NODE` and `Task launch … failed on node
  NODE` blame that node.
- **The node's Slurm state**: DOWN, DRAIN, FAIL or NOT_RESPONDING (`sinfo -N`), with its Reason.
- **The stack dump after a hang** (`slurmpod-dump:` lines): a rank whose process is stopped (T),
  a zombie (Z) or gone, and a node that did not answer the dump step.
- **The health gate** (slurmpod.resilience.health): a node that failed a check or did not
  answer; when every node failed the same way the check is suspect and nobody is excluded.

Every exclusion is one `exclude` event in the attempts record with its evidence. Bounded: a run
never excludes more than its spares plus `fraction` of the partition's nodes; beyond that a
culprit is recorded `not_excluded`. Drain (`scontrol update State=DRAIN Reason=…`) only when the
script was rendered with `--drain-bad-nodes` (an admin's choice: Slurm lets only operators drain).
"""

from __future__ import annotations

import argparse
import json
import math
import re
import subprocess
import sys
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from slurmpod.resilience import stepargs
from slurmpod.resilience.health import failed_nodes

_SRUN_TASK = re.compile(r"^srun: error: (?P<node>[A-Za-z0-9._-]+): tasks? (?P<tasks>[0-9,-]+): "
                        r"(?P<why>.+?)\s*$")
_SRUN_NODE_FAIL = re.compile(r"^srun: error: Node failure on (?P<node>[A-Za-z0-9._-]+)")
_SRUN_LAUNCH = re.compile(r"Task launch for \S+ failed on node (?P<node>[A-Za-z0-9._-]+): "
                          r"(?P<why>.+?)\s*$")
_STEP_ENDING = re.compile(r"Terminating StepId|\*\*\* STEP \S+ ON \S+ CANCELLED|Force Terminated")
_DUMP = re.compile(r"^slurmpod-dump: (?P<node>[A-Za-z0-9._-]+) (?:rank (?P<rank>\d+) pid "
                   r"(?P<pid>\d+) state (?P<state>\S+)|(?P<done>done))")
BAD_STATES = ("down", "drain", "drained", "draining", "fail", "failing", "not_responding",
              "no_respond")
NOT_BLAMED = ("Terminated", "Exited with exit code", "Done")
DEFAULT_FRACTION = 0.02


@dataclass(frozen=True)
class Culprit:
    node: str
    evidence: str


def _strip_label(line: str) -> str:
    # srun --label puts "  3: " before a rank's lines; srun's own lines have none
    return re.sub(r"^\s*\d+: ", "", line)


def from_srun(log_part: str) -> list[Culprit]:
    """Nodes srun's own lines blame, up to the moment srun starts ending the step."""
    out: list[Culprit] = []
    node_failed = False
    for raw in log_part.splitlines():
        line = _strip_label(raw)
        if _STEP_ENDING.search(line):
            break
        if m := _SRUN_NODE_FAIL.search(line):
            out.append(Culprit(m["node"], "srun: node failure"))
            node_failed = True
        elif m := _SRUN_LAUNCH.search(line):
            out.append(Culprit(m["node"], f"srun: task launch failed: {m['why']}"))
        elif node_failed:
            # Once a node of the step failed, Slurm kills the step's other tasks, and srun may
            # report them `Killed` before its `Terminating StepId` line (seen on 22.05 when a
            # node's slurmd died: the surviving node's tasks came first): not their fault.
            continue
        elif (m := _SRUN_TASK.match(line)) and not m["why"].startswith(NOT_BLAMED):
            out.append(Culprit(m["node"], f"srun: task {m['tasks']} {m['why']}"))
    return out


def from_states(sinfo: str, nodes: Iterable[str]) -> list[Culprit]:
    """`sinfo -h -N -o '%N|%T|%E'` lines: the job's nodes in a bad state."""
    mine = set(nodes)
    out: list[Culprit] = []
    for line in sinfo.splitlines():
        parts = line.strip().split("|", 2)
        if len(parts) < 2 or parts[0] not in mine:
            continue
        state = parts[1].lower().rstrip("*~#!%$@^-+")
        if any(state.startswith(b) for b in BAD_STATES) or parts[1].endswith("*"):
            reason = parts[2].strip() if len(parts) > 2 and parts[2].strip() not in ("", "none") \
                else ""
            out.append(Culprit(parts[0], f"Slurm state {parts[1].upper()}"
                                         + (f" ({reason})" if reason else "")))
    return out


def from_dump(dump: str, nodes: Sequence[str]) -> list[Culprit]:
    """Stack-dump step output: stopped/zombie/missing ranks, and nodes that did not answer."""
    out: list[Culprit] = []
    answered: set[str] = set()
    for line in dump.splitlines():
        m = _DUMP.match(_strip_label(line).strip())
        if not m:
            continue
        if m["done"]:
            answered.add(m["node"])
        elif m["state"] in ("T", "t", "Z", "gone"):
            what = {"T": "stopped", "t": "stopped (traced)", "Z": "a zombie",
                    "gone": "gone"}[m["state"]]
            out.append(Culprit(m["node"], f"hang: rank {m['rank']} (pid {m['pid']}) {what}"))
    out += [Culprit(n, "hang: node did not answer the stack dump") for n in nodes
            if n not in answered]
    return out


def limit(spares: int, partition_nodes: int, fraction: float) -> int:
    """The most nodes one run may exclude: its spares plus `fraction` of the partition."""
    return spares + math.floor(max(fraction, 0.0) * max(partition_nodes, 0))


def decide(culprits: Sequence[Culprit], already: Sequence[str], cap: int
           ) -> tuple[list[Culprit], list[Culprit]]:
    """(newly excluded, refused by the bound), one entry per node, evidence joined."""
    merged: dict[str, list[str]] = {}
    for c in culprits:
        if c.node in already:
            continue
        ev = merged.setdefault(c.node, [])
        if c.evidence not in ev:
            ev.append(c.evidence)
    take: list[Culprit] = []
    refuse: list[Culprit] = []
    room = cap - len(set(already))
    for node, ev in merged.items():
        (take if room > 0 else refuse).append(Culprit(node, "; ".join(ev)))
        room -= 1
    return take, refuse


def excluded_so_far(attempts: str, job_id: str) -> list[str]:
    """Nodes this job already excluded (its `exclude` events with action excluded/drained)."""
    from slurmpod.runs.attempts import parse_attempts  # lazy: start-up

    out: list[str] = []
    for att in parse_attempts(attempts).of_job(job_id):
        for ex in att.excluded:
            if ex.get("action") in ("excluded", "drained") and ex["node"] not in out:
                out.append(ex["node"])
    return out


def record(job_id: str, attempt: int, node: str, evidence: str, action: str) -> str:
    return json.dumps({"v": 1, "event": "exclude", "job_id": job_id, "attempt": attempt,
                       "time": int(time.time()), "node": node, "evidence": evidence[:500],
                       "action": action}, separators=(",", ":")) + "\n"


def drain_reason(evidence: str) -> str:
    """A Reason scontrol takes as one argument: printable ASCII, no quotes, at most 200."""
    text = re.sub(r"[^ -~]", "?", "slurmpod: " + evidence).replace('"', "'")
    return text[:200]


def _run(argv: list[str]) -> str:
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=30,
                              check=False).stdout
    except (OSError, subprocess.TimeoutExpired):
        return ""


def partition_size(partition: str | None) -> int:
    out = _run(["sinfo", "-h", "-o", "%D", *(["-p", partition] if partition else [])])
    return sum(int(x) for x in out.split() if x.isdigit())


def _read_part(path: str, offset: int, max_bytes: int = 4 << 20) -> str:
    try:
        with open(path, "rb") as fh:
            fh.seek(offset)
            return fh.read(max_bytes).decode(errors="replace")
    except OSError:
        return ""


def shed(args: argparse.Namespace) -> list[str]:
    nodes = stepargs.node_list(args.nodes)
    try:
        with open(args.attempts, encoding="utf-8", errors="replace") as fh:
            already = excluded_so_far(fh.read(), args.job_id)
    except OSError:
        already = []
    culprits: list[Culprit] = []
    if args.log:
        culprits += from_srun(_read_part(args.log, args.offset))
    culprits += from_states(_run(["sinfo", "-h", "-N", "-n", ",".join(nodes), "-o", "%N|%T|%E"]),
                            nodes)
    if args.dump:
        culprits += from_dump(_read_part(args.dump, 0), nodes)
    for path in args.health or ():
        failed = _read_health(path, nodes)
        if len(nodes) > 1 and len(failed) == len(nodes) \
                and len({w for w in failed.values()}) == 1:
            # Every node failed the same way: the check (or its tool) is suspect, not the nodes.
            print(f"slurmpod: health gate: every node failed the same check "
                  f"({next(iter(failed.values()))}); excluding none", file=sys.stderr)
            continue
        culprits += [Culprit(n, f"health: {why}") for n, why in failed.items()]
    cap = limit(args.spares, partition_size(args.partition), args.fraction)
    take, refuse = decide(culprits, already, cap)
    lines = []
    for c in take:
        action = "excluded"
        if args.drain:
            cp = subprocess.run(["scontrol", "update", f"NodeName={c.node}", "State=DRAIN",
                                 f"Reason={drain_reason(c.evidence)}"], capture_output=True,
                                text=True, timeout=30, check=False)
            action = "drained" if cp.returncode == 0 else "excluded"
        lines.append(record(args.job_id, args.attempt, c.node, c.evidence, action))
        print(f"slurmpod: excluding {c.node} ({action}): {c.evidence}", file=sys.stderr)
    for c in refuse:
        lines.append(record(args.job_id, args.attempt, c.node,
                            f"{c.evidence} [limit of {cap} excluded nodes reached]",
                            "not_excluded"))
        print(f"slurmpod: not excluding {c.node} (limit of {cap} reached): {c.evidence}",
              file=sys.stderr)
    if lines:
        with open(args.attempts, "a", encoding="utf-8") as fh:
            fh.write("".join(lines))
    return [*already, *(c.node for c in take)]


def _read_health(path: str, nodes: Sequence[str]) -> Mapping[str, str]:

    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            text = fh.read(4 << 20)
    except OSError:
        return {}
    return failed_nodes(text, nodes)


def build_parser() -> argparse.ArgumentParser:
    """The shedder's one parser: argparse, as it runs in the job script with the job's Python,
    starts fast and needs no `slurmpod` on PATH (slurmpod.resilience.stepargs)."""
    p = stepargs.parser("shedding")
    stepargs.add_attempt(p)
    stepargs.add_nodes(p, required=False, help="the attempt's nodes, comma-separated")
    p.add_argument("--log", help="the job log; its part from --offset is the attempt's")
    p.add_argument("--offset", type=int, default=0)
    p.add_argument("--dump", help="output of the stack-dump step after a hang")
    p.add_argument("--health", action="append", help="the health gate's output (repeatable)")
    p.add_argument("--spares", type=int, default=0)
    p.add_argument("--fraction", type=float, default=DEFAULT_FRACTION)
    p.add_argument("--partition")
    p.add_argument("--drain", action="store_true")
    p.add_argument("--list", action="store_true", help="only print the nodes excluded so far")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.list:
        try:
            with open(args.attempts, encoding="utf-8", errors="replace") as fh:
                print("\n".join(excluded_so_far(fh.read(), args.job_id)))
        except OSError:
            pass
        return 0
    print("\n".join(shed(args)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
