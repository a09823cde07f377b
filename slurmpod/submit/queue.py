"""Queue a prepared run once, through the SlurmBackend only (CLI or pyslurm, here or over SSH).

Submission is idempotent: before queueing, the run directory's marker (`store`) and, for a
submission cut short between sbatch and the marker update, the jobs the controller holds under
the run's name (`SlurmBackend.queued`) are searched for the script's token; a job of this very
script that is still alive is reported instead of queueing a second one.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any

from slurmpod.errors import ConfigError, JobNotFinishedError, SlurmError
from slurmpod.model.hostlist import expand
from slurmpod.model.slurm_time import format_minutes, limit_minutes
from slurmpod.submit.store import read_marker, store_script, write_marker

if TYPE_CHECKING:
    from slurmpod.backends.base import SlurmBackend
    from slurmpod.model.site import Site
    from slurmpod.submit.prepare import Prepared, Rendered
    from slurmpod.transport.base import CommandResult, CommandRunner


@dataclass
class SubmitResult:
    job_ids: list[str]
    run_dir: str
    script_path: str
    token: str
    where: str
    reused: bool = False
    dry_run: bool = False
    state: str = ""
    nodes: str = ""
    sus: list[str] = field(default_factory=list)
    min_sus: int | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "job_id": self.job_ids[-1] if self.job_ids else None, "job_ids": self.job_ids,
            "run_dir": self.run_dir, "script": self.script_path, "token": self.token,
            "where": self.where, "reused": self.reused, "dry_run": self.dry_run,
            "state": self.state or None, "nodes": self.nodes or None, "sus": self.sus,
            "min_sus": self.min_sus,
        }


class EnvRunner:
    """A runner that adds fixed environment to every command (e.g. SLURM_CONF or PATH of a
    cluster whose Slurm is not at the default place); everything else is delegated."""

    def __init__(self, inner: CommandRunner, env: Mapping[str, str]) -> None:
        self.inner = inner
        self.env = dict(env)

    @property
    def where(self) -> str:
        return self.inner.where

    def run(self, argv: Any, *, env: Mapping[str, str] | None = None,
            **kw: Any) -> CommandResult:
        return self.inner.run(argv, env={**self.env, **(env or {})}, **kw)

    def write_text(self, path: str, text: str, mode: int = 0o644) -> str:
        return self.inner.write_text(path, text, mode)

    def upload(self, local_path: Path, remote_dir: str, name: str | None = None) -> str:
        return self.inner.upload(local_path, remote_dir, name)

    def close(self) -> None:
        self.inner.close()


def check_time_limit(prep: Prepared | Rendered, backend: SlurmBackend) -> None:
    """Refuse (exit 3) a time limit above the partition's MaxTime, read from Slurm now.

    sbatch itself accepts such a job and leaves it PENDING with reason PartitionTimeLimit for
    ever (EnforcePartLimits=NO, Slurm's default through 24.11), or rejects it only with
    EnforcePartLimits set: either way the user learns late. Not at render time: the partition
    can change between render and submit, and render needs no Slurm."""

    max_min = backend.partition_max_time(prep.partition)
    limit = limit_minutes(prep.time_limit)
    if max_min is None or (limit is not None and limit <= max_min):
        return
    where = f"partition {prep.partition}" if prep.partition else "the default partition"
    asked = prep.time_limit if limit is not None else "UNLIMITED"
    raise ConfigError(f"{asked} exceeds the MaxTime of {where} ({format_minutes(max_min)})",
                      key="job.time_limit",
                      hint=f"set job.time_limit to at most {format_minutes(max_min)}; the "
                           "job requeues and resumes across time-limit segments")


def _has_token(comment: str, token: str) -> bool:
    """The job's comment is slurmpod's JSON carrying `token` (render puts it there; the live
    monitor keeps it when it merges its figures in)."""
    try:
        doc = json.loads(comment)
    except ValueError:
        return False
    return isinstance(doc, dict) and doc.get("token") == token


def _find_by_token(backend: SlurmBackend, name: str, token: str) -> list[str]:
    """Jobs Slurm still holds whose comment carries `token` (the window between sbatch
    returning and the marker being written)."""
    try:
        held = backend.queued(name)
    except SlurmError:
        return []
    return [j.job_id for j in held if _has_token(j.comment, token)]


def _live(backend: SlurmBackend, job_ids: list[str]) -> list[str]:
    if not job_ids:
        return []
    try:
        states = backend.status(job_ids)
    except SlurmError:
        return job_ids  # cannot tell: assume alive rather than queue a duplicate
    return [j for j in job_ids if j in states and states[j].state.is_active]


def _already_queued(prep: Prepared | Rendered, runner: CommandRunner,
                    backend: SlurmBackend) -> list[str]:
    """The live jobs of this very script (same token), from the marker or the controller."""
    marker = read_marker(runner, prep.run_dir)
    if not marker or marker.get("token") != prep.token:
        return []
    known = [str(j) for j in marker.get("job_ids") or []]
    if not known and marker.get("state") == "submitting":
        known = _find_by_token(backend, prep.name, prep.token)
    return _live(backend, known)


def submit(prep: Prepared | Rendered, runner: CommandRunner, backend: SlurmBackend, *,
           chain: int = 1, force: bool = False) -> SubmitResult:
    """Store the script in the run dir and queue it (chain jobs), unless already queued."""
    res = SubmitResult([], prep.run_dir, prep.script_path, prep.token, runner.where,
                       min_sus=prep.min_sus)
    alive = [] if force else _already_queued(prep, runner, backend)
    if alive:
        res.job_ids, res.reused = alive, True
        return res
    check_time_limit(prep, backend)
    store_script(runner, prep.run_dir, prep.script_path, prep.script)
    write_marker(runner, prep.run_dir, token=prep.token, state="submitting",
                 script=prep.script_path, job_ids=[])
    for _ in range(chain):
        res.job_ids.append(backend.submit(PurePosixPath(prep.script_path), cwd=prep.run_dir))
        write_marker(runner, prep.run_dir, token=prep.token, state="submitted",
                     script=prep.script_path, job_ids=res.job_ids)
    return res


def wait_for_start(backend: SlurmBackend, site: Site, res: SubmitResult, *,
                   timeout_s: float = 600.0, poll_s: float = 1.0,
                   clock: Callable[[], float] = time.monotonic,
                   sleep: Callable[[float], None] = time.sleep) -> SubmitResult:
    """Poll until the (first) job runs or ends; fill in its nodes and the SUs they span."""

    jid = res.job_ids[0]
    deadline = clock() + timeout_s
    while True:
        st = backend.status([jid]).get(jid)
        started = st is not None and st.state.value in ("RUNNING", "COMPLETING", "SUSPENDED")
        if st is not None and (started or st.state.is_terminal):
            res.state, res.nodes, res.sus = st.state.value, st.nodes, _sus_of(site, st.nodes)
            return res
        if clock() >= deadline:
            raise JobNotFinishedError(f"job {jid} has not started after {timeout_s:g} s "
                                      f"(state {st.state.value if st else 'unknown'})",
                                      hint=f"check `squeue -j {jid}`")
        sleep(poll_s)


def _sus_of(site: Site, nodes: str) -> list[str]:
    """The site's SUs that a hostlist's nodes lie in, in the order first met."""

    inv = site.inventory
    sus: list[str] = []
    for name in expand(nodes) if nodes else []:
        node = inv.by_name.get(name)
        if node is not None and inv.su_names[node.su] not in sus:
            sus.append(inv.su_names[node.su])
    return sus
