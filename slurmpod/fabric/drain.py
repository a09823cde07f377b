"""`topo check --drain`: the `scontrol update ... State=DRAIN` commands for nodes that a fabric
finding makes unfit for jobs, printed for the admin to review; run only with `--apply`.

A node is drained for a finding that slows or breaks the jobs on it: a cable with errors, a
link below its rate, a missing rail link, a rail cable in the wrong leaf. Not for `wrong-port`
(harmless for routing), `node-missing` (slurmctld marks an unreachable node DOWN itself), or
switch-level findings (no node of their own). Node names and switch names in a reason come from
the fabric (node descriptions are set by whoever is root on a host), so a reason keeps only
characters that mean nothing to a shell or to scontrol's parser and is double-quoted.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from slurmpod.fabric.check import Finding
    from slurmpod.transport.base import CommandRunner

DRAIN_KINDS = ("link-errors", "degraded-link", "missing-link", "wrong-rail", "wrong-su",
               "wrong-leaf", "swapped-cables", "storage-on-compute")

# Slurm keeps Reason in a 1024-byte column (slurmdbd's event table); one line is plenty.
_MAX_REASON = 200
_UNSAFE = re.compile(r"[^A-Za-z0-9 _.,:;/+=()<>\[\]-]")


@dataclass(frozen=True)
class Drain:
    node: str
    reason: str

    @property
    def argv(self) -> list[str]:
        return ["scontrol", "update", f"NodeName={self.node}", "State=DRAIN",
                f"Reason={self.reason}"]

    @property
    def command(self) -> str:
        """The shell line: the node name shell-quoted, the reason in double quotes."""
        return (f"scontrol update NodeName={shlex.quote(self.node)} State=DRAIN "
                f'Reason="{self.reason}"')


def safe_reason(text: str) -> str:
    """Characters a shell or scontrol would act on ($ ` \\ " ' ! newline ...) become '?'."""
    one = " ".join(text.split())
    out = _UNSAFE.sub("?", one)
    return out if len(out) <= _MAX_REASON else out[: _MAX_REASON - 3] + "..."


def _nodes_of(f: Finding) -> list[str]:
    if f.kind == "swapped-cables":  # "a mlx5_0 / b mlx5_1": both nodes
        return sorted({part.split()[0] for part in f.subject.split(" / ") if part.split()})
    return [f.node] if f.node else []


def drains(findings: Iterable[Finding], known: Iterable[str]) -> list[Drain]:
    """One drain per node of the site that a drain-worthy finding names, with every reason."""
    names = set(known)
    why: dict[str, list[str]] = {}
    for f in findings:
        if f.kind not in DRAIN_KINDS or f.severity != "error":
            continue
        for node in _nodes_of(f):
            if node not in names:
                continue
            if f.kind == "swapped-cables":  # both cables: "a mlx5_0 / b mlx5_1"
                what = f"{f.kind} {f.subject}"
            else:
                what = f.kind if f.hca is None or node != f.node else f"{f.kind} {f.hca}"
                if f.switch and f.port is not None and node == f.node:
                    what += f" at {f.switch}:{f.port}"
            reasons = why.setdefault(node, [])
            if what not in reasons:
                reasons.append(what)
    return [Drain(n, safe_reason("slurmpod fabric: " + "; ".join(r)))
            for n, r in sorted(why.items())]


def apply(plan: Sequence[Drain], runner: CommandRunner) -> list[tuple[Drain, str | None]]:
    """Run each scontrol (argv, no shell); (drain, error or None) for each."""
    out: list[tuple[Drain, str | None]] = []
    for d in plan:
        res = runner.run(d.argv, check=False, timeout_s=30)
        err = None if res.returncode == 0 else (res.stderr.strip() or
                                                f"exit {res.returncode}")
        out.append((d, err))
    return out
