"""PyslurmBackend: the SlurmBackend protocol through pyslurm's object API (pyslurm ≥ 23.2).

pyslurm is imported only when this backend is chosen, and used only when its major.minor
matches the running Slurm (pyslurm links against one libslurm ABI; a mismatch fails in odd
ways). PyPI only carries pyslurm 25.11, so on older clusters choose the CLI backend.

Verified against a real Slurm 25.11.7 with pyslurm 25.11.2 (docs/backends.md). pyslurm reads
its slurm.conf (SLURM_CONF) once, when it is imported: set SLURM_CONF before the import.

Options are read by slurmpod, not by pyslurm: pyslurm 25.11.2's `load_sbatch_options` needs a
script *file*, splits values on `#` and `=` (a quoted JSON `--comment` breaks), and maps
`--gpus-per-node` and `--partition` to attributes JobSubmitDescription does not have. So
`#SBATCH` lines are tokenized as sbatch does (src/sbatch/opt.c `get_argument`) and, with `args`
(which win, as on sbatch's command line), translated by `SBATCH_OPTIONS` below.
"""

from __future__ import annotations

import getpass
import importlib
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path, PurePath
from typing import Any

from slurmpod.backends.base import Script, parent_id, wanted
from slurmpod.backends.parse import gpus_from_tres
from slurmpod.errors import SlurmError
from slurmpod.model.hostlist import expand
from slurmpod.model.jobs import JobRecord, JobState, JobStatus, NodeInfo, StepRecord
from slurmpod.model.slurm_time import limit_minutes

_CLI_HINT = "use the CLI backend (--backend cli)"


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
    have = getattr(pyslurm, "__version__", "")
    if not have:  # pyslurm < 22.5 had version(); 25.11's pyslurm.version is a module
        ver = getattr(pyslurm, "version", None)
        have = ver() if callable(ver) else getattr(ver, "__version__", "")
    have = str(have)
    if 0 <= _major_minor(have)[0] < 23:
        raise SlurmError(
            f"pyslurm {have} predates the object API slurmpod uses (pyslurm ≥ 23.2)",
            hint=_CLI_HINT,
        )
    if _major_minor(have) != _major_minor(slurm_version):
        raise SlurmError(
            f"pyslurm {have} does not match the running Slurm {slurm_version}",
            hint="pyslurm's major.minor must equal Slurm's; use the CLI backend (--backend cli)",
        )
    return pyslurm


# -- sbatch options -> JobSubmitDescription ----------------------------------------------------

@dataclass(frozen=True)
class _Opt:
    attr: str | None  # JobSubmitDescription attribute; None: handled in _apply
    short: str | None = None
    flag: Any = None  # the value a bare flag sets; None: the option takes a value


# sbatch long option -> JobSubmitDescription attribute (pyslurm 25.11.2's submission.pxd).
SBATCH_OPTIONS: dict[str, _Opt] = {
    "account": _Opt("account", "A"), "array": _Opt("array", "a"),
    "begin": _Opt("begin_time", "b"), "chdir": _Opt("working_directory", "D"),
    "comment": _Opt("comment"), "constraint": _Opt("constraints", "C"),
    "contiguous": _Opt("requires_contiguous_nodes", flag=True),
    "core-spec": _Opt("cores_reserved_for_system", "S"),
    "cores-per-socket": _Opt("cores_per_socket"), "cpus-per-gpu": _Opt("cpus_per_gpu"),
    "cpus-per-task": _Opt("cpus_per_task", "c"), "deadline": _Opt("deadline"),
    "delay-boot": _Opt("delay_boot_time"), "dependency": _Opt("dependencies", "d"),
    "distribution": _Opt("distribution", "m"), "error": _Opt("standard_error", "e"),
    "exclude": _Opt("excluded_nodes", "x"), "export": _Opt("environment"),
    "extra": _Opt("extra"), "gpus": _Opt("gpus", "G"), "gpus-per-node": _Opt(None),
    "gpus-per-socket": _Opt("gpus_per_socket"), "gpus-per-task": _Opt("gpus_per_task"),
    "gres": _Opt(None), "hold": _Opt("priority", "H", flag=0),
    "input": _Opt("standard_in", "i"), "job-name": _Opt("name", "J"),
    "licenses": _Opt("licenses", "L"), "mail-type": _Opt("mail_types"),
    "mail-user": _Opt("mail_user"), "mcs-label": _Opt("mcs_label"),
    "mem": _Opt("memory_per_node"), "mem-per-cpu": _Opt("memory_per_cpu"),
    "mem-per-gpu": _Opt("memory_per_gpu"), "mincpus": _Opt("min_cpus_per_node"),
    "network": _Opt("network"), "nice": _Opt("nice"),
    "no-kill": _Opt("kill_on_node_fail", "k", flag=False),
    "no-requeue": _Opt("is_requeueable", flag=False), "nodelist": _Opt("required_nodes", "w"),
    "nodes": _Opt("nodes", "N"), "ntasks": _Opt("ntasks", "n"),
    "ntasks-per-core": _Opt("ntasks_per_core"), "ntasks-per-gpu": _Opt("ntasks_per_gpu"),
    "ntasks-per-node": _Opt("ntasks_per_node"), "ntasks-per-socket": _Opt("ntasks_per_socket"),
    "open-mode": _Opt("log_files_open_mode"), "output": _Opt("standard_output", "o"),
    "overcommit": _Opt("overcommit", "O", flag=True),
    "oversubscribe": _Opt("resource_sharing", "s", flag="yes"),
    "partition": _Opt("partitions", "p"), "priority": _Opt("priority"),
    "qos": _Opt("qos", "q"), "reboot": _Opt("requires_node_reboot", flag=True),
    "requeue": _Opt("is_requeueable", flag=True), "reservation": _Opt("reservations"),
    "segment": _Opt("segment_size"), "signal": _Opt(None),
    "sockets-per-node": _Opt("sockets_per_node"),
    "spread-job": _Opt("spreads_over_nodes", flag=True),
    "thread-spec": _Opt("threads_reserved_for_system"),
    "threads-per-core": _Opt("threads_per_core"), "time": _Opt("time_limit", "t"),
    "time-min": _Opt("time_limit_min"), "tmp": _Opt("temporary_disk_per_node"),
    "use-min-nodes": _Opt("use_min_nodes", flag=True), "wckey": _Opt("wckey"),
    "exclusive": _Opt("resource_sharing"),  # optional value, see _parse_argv
}
_SHORT = {o.short: name for name, o in SBATCH_OPTIONS.items() if o.short}

# Options pyslurm 25.11.2 cannot carry: refused, never silently dropped.
REFUSED = {
    "switches": "pyslurm 25.11.2 fails on it (JobSubmitDescription._set_switches uses an "
                "undefined name)",
}


def sbatch_arguments(line: str) -> list[str]:
    """The arguments on one `#SBATCH` line after the magic word, split as sbatch's
    `get_argument` does (22.05 – 25.11): whitespace splits, '…' and "…" group, a backslash
    escapes the next character, an unquoted `#` starts a comment."""
    out: list[str] = []
    i, n = 0, len(line)
    while True:
        while i < n and line[i].isspace():
            i += 1
        if i >= n or line[i] == "#":
            return out
        buf: list[str] = []
        quote = ""
        while i < n and (quote or not line[i].isspace()):
            ch = line[i]
            if ch == "\\" and i + 1 < n:
                buf.append(line[i + 1])
                i += 2
                continue
            if quote:
                if ch == quote:
                    quote = ""
                else:
                    buf.append(ch)
            elif ch in "\"'":
                quote = ch
            elif ch == "#":
                break
            else:
                buf.append(ch)
            i += 1
        if quote:
            raise SlurmError(f"unmatched {quote} in #SBATCH line {line.strip()!r}")
        out.append("".join(buf))
        if i < n and line[i] == "#":
            return out


def script_arguments(text: str) -> list[str]:
    """Every `#SBATCH` argument of a script, up to its first command (as sbatch reads them)."""
    out: list[str] = []
    for line in text.splitlines():
        if line.startswith("#SBATCH"):
            out += sbatch_arguments(line[len("#SBATCH"):])
        elif line.strip() and not line.lstrip().startswith("#"):
            break
    return out


def _parse_argv(argv: Sequence[str]) -> list[tuple[str, str | None]]:
    """sbatch-style argv -> (long option, value or None for a bare flag), in order."""
    out: list[tuple[str, str | None]] = []
    i = 0
    while i < len(argv):
        arg = argv[i]
        i += 1
        if arg.startswith("--"):
            name, eq, value = arg[2:].partition("=")
            opt = _known(name, arg)
            if opt.flag is not None or name == "exclusive":
                out.append((name, value if eq else None))
                continue
            if not eq:
                if i >= len(argv):
                    raise SlurmError(f"sbatch option {arg} needs a value")
                value, i = argv[i], i + 1
            out.append((name, value))
        elif arg.startswith("-") and len(arg) > 1:
            long_name = _SHORT.get(arg[1])
            if long_name is None:
                raise _unknown(arg)
            opt = SBATCH_OPTIONS[long_name]
            if opt.flag is not None:
                out.append((long_name, None))
                continue
            value = arg[2:]
            if not value:
                if i >= len(argv):
                    raise SlurmError(f"sbatch option {arg} needs a value")
                value, i = argv[i], i + 1
            out.append((long_name, value))
        else:
            raise SlurmError(f"unexpected argument {arg!r}: the pyslurm backend takes sbatch "
                             "options only (script arguments are not supported)",
                             hint=_CLI_HINT)
    return out


def _known(name: str, arg: str) -> _Opt:
    if name in REFUSED:
        raise SlurmError(f"the pyslurm backend cannot submit {arg}: {REFUSED[name]}",
                         hint=_CLI_HINT)
    if name not in SBATCH_OPTIONS:
        raise _unknown(arg)
    return SBATCH_OPTIONS[name]


def _unknown(arg: str) -> SlurmError:
    return SlurmError(f"sbatch option {arg} is not supported by the pyslurm backend",
                      hint=_CLI_HINT)


def _signal_name(sig: str) -> str:
    """pyslurm wants `SIGTERM` or a number; sbatch and scancel also take `TERM`."""
    return sig if sig.isdigit() or sig.upper().startswith("SIG") else f"SIG{sig.upper()}"


# pyslurm 25.11.2's timestr_to_mins returns a digits-only *string* unchanged ("30"), which then
# fails as "an integer is required": every limit goes in as whole minutes, read as sbatch reads it
# (model.slurm_time); a form that is not a Slurm time goes through for pyslurm to refuse.
_MINUTES = frozenset({"time_limit", "time_limit_min"})


def _limit(value: str) -> int | str:
    try:
        minutes = limit_minutes(value)
    except ValueError:
        return value
    return value if minutes is None else minutes


def submit_fields(options: Sequence[tuple[str, str | None]]) -> dict[str, Any]:
    """Options (first occurrence wins, like sbatch's command line over #SBATCH) ->
    JobSubmitDescription keyword arguments."""
    fields: dict[str, Any] = {}
    gres: dict[str, str] = {}  # --gres and --gpus-per-node both become tres_per_node
    seen: set[str] = set()
    for name, value in options:
        if name in seen:
            continue
        seen.add(name)
        opt = SBATCH_OPTIONS[name]
        if name == "gres":
            for item in (value or "").split(","):
                key, _, count = item.removeprefix("gres:").rpartition(":")
                gres.setdefault(key or item, count if key else "1")
        elif name == "gpus-per-node":
            kind, _, count = (value or "").rpartition(":")
            gres.setdefault(f"gpu:{kind}" if kind else "gpu", count)
        elif name == "signal":
            flags, colon, rest = (value or "").rpartition(":")
            sig, at, when = rest.partition("@")
            fields["signal"] = f"{flags}{colon}{_signal_name(sig)}{at}{when}"
        elif name == "exclusive":
            fields["resource_sharing"] = value or "no"
        elif opt.flag is not None and value is None:
            fields[opt.attr] = opt.flag  # type: ignore[index]
        elif opt.attr in _MINUTES and value is not None:
            fields[opt.attr] = _limit(value)
        else:
            fields[opt.attr] = value  # type: ignore[index]
    if gres:
        fields["gres_per_node"] = ",".join(f"{k}:{v}" for k, v in gres.items())
    # sbatch derives the task count from a fixed node count (src/common/slurm_opt.c,
    # fill_job_desc_from_opts, 22.05 – 25.11); pyslurm would send ntasks=1 (SLURM_NTASKS=1).
    nodes, per_node = str(fields.get("nodes", "1")), str(fields.get("ntasks_per_node", ""))
    if "ntasks" not in fields and per_node.isdigit() and nodes.isdigit():
        fields["ntasks"] = int(nodes) * int(per_node)
    return fields


# -- reading pyslurm's objects ------------------------------------------------------------------

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


def _count(value: Any) -> int:
    """A GPU count: an int, pyslurm's GPU/TrackableResource (`.count`) or {"count": n}."""
    if isinstance(value, dict):
        value = value.get("count", 0)
    return int(getattr(value, "count", value) or 0)


def _gpus_in(gres: Mapping[str, Any]) -> int:
    """`gpu` counts all GPUs; typed `gpu:h100` entries are summed when it is absent."""
    if "gpu" in gres:
        return _count(gres["gpu"])
    return sum(_count(v) for k, v in gres.items() if k.startswith("gpu:"))


def _gpus(job: Any) -> int:
    # pyslurm 25.11: allocated_tres / tres are TrackableResources (GPUs under .gres);
    # tres_alloc_str is a plain TRES string in older object APIs.
    for name in ("tres_alloc_str", "allocated_tres", "tres"):
        tres = getattr(job, name, None)
        if isinstance(tres, str) and tres:
            return gpus_from_tres(tres)
        if isinstance(tres, dict) and tres:
            return int(tres.get("gres/gpu", 0) or 0)
        gres = getattr(tres, "gres", None)
        if isinstance(gres, Mapping) and gres:
            return _gpus_in(gres)
    per_node = _g(job, "gres_per_node", default={}) or {}
    gpn = _gpus_in(per_node) if isinstance(per_node, dict) else 0
    return gpn * int(_g(job, "num_nodes", default=0) or 0)


def _call(what: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
    try:
        return fn(*args, **kwargs)
    except SlurmError:
        raise
    except Exception as exc:  # pyslurm.RPCError, ValueError from its checks: one clear line
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
        # pyslurm submits from this process: a script path is a file on this machine
        text = Path(script).read_text() if isinstance(script, PurePath) else script
        fields = submit_fields([*_parse_argv(args), *_parse_argv(script_arguments(text))])
        if env is not None:
            if "environment" in fields:
                raise SlurmError("give the job's environment either as env or as --export, "
                                 "not both", hint=_CLI_HINT)
            # the CLI backend adds env to sbatch's inherited environment (--export=ALL)
            fields["environment"] = {**os.environ, **env}
        if cwd is not None:
            fields.setdefault("working_directory", cwd)
        desc = _call("building the job description",
                     lambda: self.ps.JobSubmitDescription(script=text, **fields))
        return str(_call("submit", desc.submit))

    def cancel(self, job_ids: Sequence[str], *, signal: str | None = None,
               steps_only: bool = False) -> None:
        if steps_only and not signal:
            raise ValueError("steps_only needs a signal (scancel without one ends the job)")
        for jid in job_ids:
            job = self.ps.Job(int(parent_id(jid)))
            if signal:
                # "all": every step and the batch shell, like `scancel --signal --full`;
                # "children": the steps but not the batch shell, like `scancel --signal`
                _call("signal", job.send_signal, _signal_name(signal),
                      steps="children" if steps_only else "all")
            else:
                _call("cancel", job.cancel)

    def status(self, job_ids: Sequence[str]) -> dict[str, JobStatus]:
        if not job_ids:
            return {}
        return {s.job_id: s for s in self._controller_jobs(lambda jid, _: wanted(jid, job_ids))}

    def queued(self, name: str) -> list[JobStatus]:
        return [s for s in self._controller_jobs(lambda _, n: n == name) if s.state.is_active]

    def _controller_jobs(self, keep: Callable[[str, str], bool]) -> list[JobStatus]:
        """The jobs slurmctld holds (pyslurm.Jobs.load: one RPC, as `squeue --all`) whose
        (id, name) `keep` accepts."""
        jobs = _call("loading jobs", self.ps.Jobs.load)
        out: list[JobStatus] = []
        for job in jobs.values():
            jid = str(job.id)
            if getattr(job, "array_id", None) and getattr(job, "array_task_id", None) is not None:
                jid = f"{job.array_id}_{job.array_task_id}"
            if not keep(jid, _s(job.name)):
                continue
            state = JobState.parse(_s(job.state))
            limit = _g(job, "time_limit")
            out.append(JobStatus(
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
                work_dir=_s(_g(job, "working_directory", default="")),
            ))
        return out

    def jobs(
        self,
        *,
        window_s: int | None = None,
        job_ids: Sequence[str] = (),
        name: str | None = None,
        all_users: bool = False,
    ) -> list[JobStatus]:

        db = self.ps.db
        kw: dict[str, Any] = {}
        if job_ids:
            kw["ids"] = [int(parent_id(j)) for j in job_ids]
        else:
            kw["start_time"] = int(time.time()) - int(window_s or 0)
        if not all_users:
            kw["users"] = [getpass.getuser()]
        if name is not None:
            kw["names"] = [name]
        found = _call("loading accounting", db.Jobs.load, db.JobFilter(**kw))
        listed = []
        for job in found.values():
            jid = str(job.id)
            if (job_ids and not wanted(jid, job_ids)) or (name is not None
                                                          and _s(job.name) != name):
                continue
            listed.append(JobStatus(
                job_id=jid, name=_s(job.name), state=JobState.parse(_s(job.state)),
                user=_s(_g(job, "user_name")), account=_s(_g(job, "account")),
                partition=_s(_g(job, "partition")),
                nodes=_s(_g(job, "nodelist", "nodes", default="")),
                n_nodes=int(_g(job, "num_nodes", default=0) or 0), n_gpus=_gpus(job),
                comment=_s(_g(job, "comment")), submit_time=_dt(_g(job, "submit_time")),
                start_time=_dt(_g(job, "start_time")), end_time=_dt(_g(job, "end_time")),
                work_dir=_s(_g(job, "working_directory", "work_dir", default="")),
            ))
        live = self.status([j.job_id for j in listed if j.state.is_active])
        out = [replace(live[j.job_id], work_dir=j.work_dir) if j.job_id in live else j
               for j in listed]
        return sorted(out, key=lambda j: (j.submit_time.timestamp() if j.submit_time else 0.0,
                                          j.job_id))

    def accounting(self, job_ids: Sequence[str]) -> dict[str, JobRecord]:
        if not job_ids:
            return {}  # an empty filter would load every job of the day
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

        chosen = set(expand(names)) if names else None
        nodes = _call("loading nodes", self.ps.Nodes.load)
        out = []
        for node in nodes.values():
            if chosen is not None and node.name not in chosen:
                continue
            words = _s(node.state).upper().split("+")
            # pyslurm 25.11 has no configured TRES string on Node: count GPUs in its gres
            gres = getattr(node, "configured_gres", None)
            n_gpus = (_gpus_in(gres) if isinstance(gres, Mapping)
                      else gpus_from_tres(_s(getattr(node, "configured_tres", ""))))
            out.append(NodeInfo(
                name=node.name, state=words[0].rstrip("*~#!%$@^-"),
                flags=tuple(words[1:]),
                cpus=int(node.total_cpus or 0), real_memory_mb=int(node.real_memory or 0),
                n_gpus=n_gpus, features=tuple(node.available_features or ()),
                partitions=tuple(node.partitions or ()), reason=_s(node.reason),
            ))
        return out

    def partition_max_time(self, partition: str | None) -> int | None:
        """Best effort: pyslurm 23.x+ `Partitions.load()`; `max_time` is in minutes there (an
        int, or "UNLIMITED"/None). Anything else reads as unknown (None): no check."""
        parts = _call("loading partitions", self.ps.Partitions.load)
        chosen = None
        for name, part in dict(parts).items():
            if (partition is None and getattr(part, "is_default", False)) or name == partition:
                chosen = part
                break
        value = getattr(chosen, "max_time", None) if chosen is not None else None
        if isinstance(value, int) and not isinstance(value, bool) and 0 < value < 2**31 - 1:
            return value
        return None

    def update_comment(self, job_id: str, comment: str) -> None:
        job = self.ps.Job(int(parent_id(job_id)))
        _call("update comment", job.modify, self.ps.JobSubmitDescription(comment=comment))

    def requeue(self, job_id: str, *, hold: bool = False) -> None:
        job = self.ps.Job(int(parent_id(job_id)))
        _call("requeue", job.requeue, hold=hold)


__all__ = ["SBATCH_OPTIONS", "PyslurmBackend", "load_pyslurm", "sbatch_arguments",
           "script_arguments", "submit_fields"]

