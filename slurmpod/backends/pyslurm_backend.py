"""PyslurmBackend: the SlurmBackend protocol through pyslurm's object API (pyslurm ≥ 23.2).

pyslurm is imported only when this backend is chosen, and used only when its major.minor
matches the running Slurm (pyslurm links against one libslurm ABI; a mismatch fails in odd
ways). PyPI only carries pyslurm 25.11, so on older clusters choose the CLI backend.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path, PurePath
from typing import Any

from slurmpod.backends.base import Script, parent_id, wanted
from slurmpod.backends.parse import gpus_from_tres
from slurmpod.errors import SlurmError
from slurmpod.model.jobs import JobRecord, JobState, JobStatus, NodeInfo, StepRecord


def _major_minor(version: str) -> tuple[int, int]:
    parts = version.strip().split(".")
    try:
        return int(parts[0]), int(parts[1])
    except (IndexError, ValueError):
        return (-1, -1)


def load_pyslurm(slurm_version: str) -> Any:
    """Import pyslurm and check it matches `slurm_version` (e.g. from `sinfo --version`)."""
    try:
        pyslurm = importlib.import_module("pyslurm")
    except ImportError as exc:
        raise SlurmError(
            f"the pyslurm backend needs the pyslurm package ({exc})",
            hint="install pyslurm built for this Slurm, or use the CLI backend (--backend cli)",
        ) from None
    have = str(getattr(pyslurm, "__version__", "") or pyslurm.version())
    if 0 <= _major_minor(have)[0] < 23:
        raise SlurmError(
            f"pyslurm {have} predates the object API slurmpod uses (pyslurm ≥ 23.2)",
            hint="use the CLI backend (--backend cli)",
        )
    if _major_minor(have) != _major_minor(slurm_version):
        raise SlurmError(
            f"pyslurm {have} does not match the running Slurm {slurm_version}",
            hint="pyslurm's major.minor must equal Slurm's; use the CLI backend (--backend cli)",
        )
    return pyslurm


def _dt(value: Any) -> datetime | None:
    if value in (None, 0):
        return None
    if isinstance(value, datetime):
        return value if value.tzinfo else value.replace(tzinfo=UTC)
    return datetime.fromtimestamp(int(value), UTC)


def _s(value: Any) -> str:
    return "" if value is None else str(value)


def _g(obj: Any, *names: str, default: Any = None) -> Any:
    """The first attribute that exists (pyslurm renamed several between 23.2 and 25.11)."""
    for name in names:
        value = getattr(obj, name, None)
        if value is not None:
            return value
    return default


def _gpus(job: Any) -> int:
    tres = _g(job, "tres_alloc_str", "allocated_tres", default="")
    if isinstance(tres, str) and tres:
        return gpus_from_tres(tres)
    if isinstance(tres, dict):
        return int(tres.get("gres/gpu", 0) or 0)
    per_node = _g(job, "gres_per_node", default={}) or {}
    gpn = per_node.get("gpu", 0) if isinstance(per_node, dict) else 0
    return int(gpn or 0) * int(_g(job, "num_nodes", default=0) or 0)


def _call(what: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
    try:
        return fn(*args, **kwargs)
    except SlurmError:
        raise
    except Exception as exc:  # pyslurm.RPCError and friends: keep one clear line
        raise SlurmError(f"pyslurm {what} failed: {exc}") from None


class PyslurmBackend:
    name = "pyslurm"

    def __init__(self, slurm_version: str, module: Any | None = None) -> None:
        self._slurm_version = slurm_version
        self.ps = module if module is not None else load_pyslurm(slurm_version)

    def version(self) -> str:
        return self._slurm_version

    def submit(
        self,
        script: Script,
        *,
        args: Sequence[str] = (),
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
    ) -> str:
        if args:
            raise SlurmError("the pyslurm backend takes options only from #SBATCH lines",
                             hint="put the options into the script, or use the CLI backend")
        # pyslurm submits from this process: a script path is a file on this machine
        text = Path(script).read_text() if isinstance(script, PurePath) else script
        desc = self.ps.JobSubmitDescription(script=text, working_directory=cwd,
                                            environment=dict(env or {}) or None)
        _call("reading #SBATCH options", desc.load_sbatch_options)
        return str(_call("submit", desc.submit))

    def cancel(self, job_ids: Sequence[str], *, signal: str | None = None) -> None:
        for jid in job_ids:
            job = self.ps.Job(int(parent_id(jid)))
            if signal:
                _call("signal", job.send_signal, signal)
            else:
                _call("cancel", job.cancel)

    def status(self, job_ids: Sequence[str]) -> dict[str, JobStatus]:
        jobs = _call("loading jobs", self.ps.Jobs.load)
        out: dict[str, JobStatus] = {}
        for job in jobs.values():
            jid = str(job.id)
            if getattr(job, "array_id", None) and getattr(job, "array_task_id", None) is not None:
                jid = f"{job.array_id}_{job.array_task_id}"
            if not wanted(jid, job_ids):
                continue
            state = JobState.parse(_s(job.state))
            limit = _g(job, "time_limit")
            out[jid] = JobStatus(
                job_id=jid, name=_s(job.name), state=state,
                reason=_s(_g(job, "state_reason", default="")), user=_s(_g(job, "user_name")),
                account=_s(_g(job, "account")), partition=_s(_g(job, "partition")),
                nodes=_s(_g(job, "allocated_nodes", "nodes", default="")),
                n_nodes=int(_g(job, "num_nodes", default=0) or 0), n_gpus=_gpus(job),
                comment=_s(_g(job, "comment")), admin_comment=_s(_g(job, "admin_comment")),
                restarts=int(_g(job, "requeue_count", default=0) or 0),
                submit_time=_dt(_g(job, "submit_time")), start_time=_dt(_g(job, "start_time")),
                end_time=_dt(_g(job, "end_time")) if state.is_terminal else None,
                time_limit_s=int(limit) * 60 if isinstance(limit, int) and limit else None,
            )
        return out

    def accounting(self, job_ids: Sequence[str]) -> dict[str, JobRecord]:
        ids = [int(parent_id(j)) for j in job_ids]
        db = self.ps.db
        jobs = _call("loading accounting", db.Jobs.load, db.JobFilter(ids=ids))
        out: dict[str, JobRecord] = {}
        for job in jobs.values():
            jid = str(job.id)
            steps = tuple(
                StepRecord(
                    step_id=_s(_g(st, "id", default="")).split(".")[-1],
                    name=_s(_g(st, "name")), state=JobState.parse(_s(_g(st, "state"))),
                    exit_code=int(_g(st, "exit_code", default=0) or 0),
                    signal=int(_g(st, "exit_code_signal", default=0) or 0),
                    elapsed_s=int(_g(st, "elapsed_time", default=0) or 0),
                    nodes=_s(_g(st, "nodelist", "nodes", default="")),
                    n_nodes=int(_g(st, "num_nodes", default=0) or 0),
                    n_tasks=_g(st, "num_tasks", "ntasks"),
                )
                for st in (_g(job, "steps", default={}) or {}).values()
            )
            out[jid] = JobRecord(
                job_id=jid, name=_s(job.name), user=_s(_g(job, "user_name")),
                account=_s(_g(job, "account")), partition=_s(_g(job, "partition")),
                state=JobState.parse(_s(job.state)),
                exit_code=int(_g(job, "exit_code", default=0) or 0),
                signal=int(_g(job, "exit_code_signal", default=0) or 0),
                submit_time=_dt(_g(job, "submit_time")), start_time=_dt(_g(job, "start_time")),
                end_time=_dt(_g(job, "end_time")),
                elapsed_s=int(_g(job, "elapsed_time", default=0) or 0),
                nodes=_s(_g(job, "nodelist", "nodes", default="")),
                n_nodes=int(_g(job, "num_nodes", default=0) or 0), n_gpus=_gpus(job),
                comment=_s(_g(job, "comment")), admin_comment=_s(_g(job, "admin_comment")),
                restarts=int(_g(job, "requeue_count", default=0) or 0), steps=steps,
            )
        return {k: v for k, v in out.items() if wanted(k, job_ids)}

    def nodes(self, names: str | None = None) -> list[NodeInfo]:
        from slurmpod.model.hostlist import expand

        chosen = set(expand(names)) if names else None
        nodes = _call("loading nodes", self.ps.Nodes.load)
        out = []
        for node in nodes.values():
            if chosen is not None and node.name not in chosen:
                continue
            words = _s(node.state).upper().split("+")
            out.append(NodeInfo(
                name=node.name, state=words[0], flags=tuple(words[1:]),
                cpus=int(node.total_cpus or 0), real_memory_mb=int(node.real_memory or 0),
                n_gpus=gpus_from_tres(_s(getattr(node, "configured_tres", ""))),
                features=tuple(node.available_features or ()),
                partitions=tuple(node.partitions or ()), reason=_s(node.reason),
            ))
        return out

    def update_comment(self, job_id: str, comment: str) -> None:
        job = self.ps.Job(int(parent_id(job_id)))
        _call("update comment", job.modify, self.ps.JobSubmitDescription(comment=comment))

    def requeue(self, job_id: str, *, hold: bool = False) -> None:
        job = self.ps.Job(int(parent_id(job_id)))
        _call("requeue", job.requeue, hold=hold)
