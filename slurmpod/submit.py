"""Plan -> refuse -> render -> store the script with the run -> submit once -> job id (-> where).

The orchestration behind `slurmpod render` and `slurmpod submit`. Nothing is queued unless the
plan is valid and fits. Submission is idempotent: the rendered script determines a token that
goes into the job's comment and into a marker file in the run directory
(`.slurmpod/submission.json`), so running the same submit again (after a timeout, a lost SSH
connection or a double Enter) finds the job it already queued instead of queueing a second one.

A local submit or render of inputs it has prepared before (same run spec, site file, template
files, options, working directory and slurmpod/Jinja/msgspec code) reuses the stored script
from ~/.cache/slurmpod/prepared: validating, planning and rendering cost a fresh process ~0.1 s
of CPU (Jinja's import and template compilation are most of it), which the cache saves. Only
prepared (valid, fitting) runs are stored, so every refusal is computed afresh.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any

from slurmpod import __version__
from slurmpod.errors import CommandError, ConfigError, SlurmError

if TYPE_CHECKING:
    from slurmpod.backends.base import SlurmBackend
    from slurmpod.megatron.runspec import RunSpec
    from slurmpod.model.site import Site
    from slurmpod.render.sbatch import PlanFacts, RenderOptions
    from slurmpod.transport.base import CommandRunner

MARKER = ".slurmpod/submission.json"
SITE_ENV_FILE = "nccl-env.toml"


@dataclass(frozen=True)
class Prepared:
    """A planned and rendered run, ready to store and submit."""

    run: RunSpec
    site: Site
    plan: dict[str, Any]
    facts: PlanFacts
    opts: RenderOptions
    run_dir: str
    script: str
    token: str
    warnings: tuple[str, ...] = ()  # `[megatron]` keys the site's Megatron release lacks

    @property
    def name(self) -> str:
        return self.run.job.name

    @property
    def min_sus(self) -> int:
        return self.facts.min_sus

    @property
    def time_limit(self) -> str:
        return self.run.job.time_limit

    @property
    def partition(self) -> str | None:
        return self.run.job.partition

    @property
    def script_path(self) -> str:
        return f"{self.run_dir}/{self.run.job.name}.sbatch"


@dataclass(frozen=True)
class Rendered:
    """What queueing needs from a prepared run; what the prepared-script cache stores."""

    name: str
    run_dir: str
    script: str
    token: str
    min_sus: int
    warnings: tuple[str, ...] = ()
    time_limit: str = "INFINITE"  # [job] time_limit, checked against the partition at submit
    partition: str | None = None

    @property
    def script_path(self) -> str:
        return f"{self.run_dir}/{self.name}.sbatch"

    @classmethod
    def of(cls, prep: Prepared) -> Rendered:
        return cls(prep.name, prep.run_dir, prep.script, prep.token, prep.min_sus,
                   prep.warnings, prep.run.job.time_limit, prep.run.job.partition)


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


def load_site_env(template_dirs: tuple[Path, ...]) -> dict[str, str | None]:
    """Site NCCL overrides: `[env]` of `nccl-env.toml` in the first template dir holding one.
    A value of false removes a preset variable."""
    for d in template_dirs:
        path = d / SITE_ENV_FILE
        if not path.is_file():
            continue
        from slurmpod.config import read_toml

        data = read_toml(path)
        env = data.get("env", {})
        if not isinstance(env, dict) or set(data) - {"env"}:
            raise ConfigError("expected one [env] table of NAME = \"value\" (false removes)",
                              file=str(path), key="env")
        out: dict[str, str | None] = {}
        for k, v in env.items():
            if v is False:
                out[k] = None
            elif isinstance(v, str | int | float) and not isinstance(v, bool):
                out[k] = str(v)
            else:
                raise ConfigError("value must be a string, a number or false", file=str(path),
                                  key=f"env.{k}")
        return out
    return {}


def plan_or_refuse(run: RunSpec, site: Site) -> dict[str, Any]:
    """The planner's JSON; a ConfigError (exit 3) when the layout is invalid or does not fit.
    Without the group placement: it only adds warnings, and it is what needs numpy."""
    from slurmpod.megatron.plan import make_plan

    plan = make_plan(run, site, placement=False)
    data = plan.to_json()
    if not data.get("ok", True):
        errors = list(data.get("errors") or [])
        if not data.get("fits", True):
            errors.append(
                f"needs {data['total_bytes_per_gpu'] / 2**30:.1f} GiB per GPU but "
                f"{data['usable_bytes_per_gpu'] / 2**30:.1f} GiB is usable"
            )
        first = errors[0] if errors else "plan is not valid"
        more = f" (+{len(errors) - 1} more)" if len(errors) > 1 else ""
        raise ConfigError(f"refusing to render run {run.job.name!r}: {first}{more}",
                          hint="see `slurmpod plan RUN.toml` for every problem and its fix")
    return data


# Rendered in place of the token, then replaced by the hash of the script holding it: one
# render instead of two (template compilation dominates rendering time).
TOKEN_SENTINEL = "5e7e7e7e7e7e7e75"


def token_for(script_without_token: str) -> str:
    return hashlib.sha256(script_without_token.encode()).hexdigest()[:16]


def save_interval_for(run: RunSpec, site: Site, facts: PlanFacts,
                      site_path: Path | None = None) -> int | None:
    """Megatron's --save-interval for a run spec without one: Daly's optimum for the job's
    nodes at the site's node MTBF, the predicted save time and the predicted iteration time
    (slurmpod.resilience.interval; `slurmpod plan` shows the same figure). None when the run
    spec sets it or the iteration time cannot be predicted. `site_path` finds the site's
    calibration (`slurmpod calibrate`) as `plan` does."""
    if "save_interval" in run.megatron.explicit():
        return None
    from slurmpod.perf.planning import predict_run
    from slurmpod.resilience.interval import recommend_for_run

    pred = predict_run(run, site, facts.nodes, site_path)
    if pred is None:
        return None
    return recommend_for_run(site, nodes=facts.nodes, params_total=facts.params_total,
                             step_s=pred.step_time_s).save_interval


def prepare(run: RunSpec, site: Site, opts: RenderOptions, run_dir: str,
            source: str = "run spec", site_path: Path | None = None) -> Prepared:
    """Plan, refuse, render; the token is the hash of the script with a fixed sentinel.
    `source` names the run spec in warnings."""
    from slurmpod.megatron.argnames import unknown_key_warnings
    from slurmpod.render.sbatch import build_context, plan_facts_from_json, render_script

    plan = plan_or_refuse(run, site)
    facts = plan_facts_from_json(plan)
    site_env = {**load_site_env(opts.template_dirs), **dict(opts.site_env)}
    opts = replace(opts, run_dir=run_dir, site_env=site_env, token=TOKEN_SENTINEL,
                   save_interval=save_interval_for(run, site, facts, site_path))
    draft = render_script(build_context(run, site, facts, opts), opts.template,
                          opts.template_dirs)
    if draft.count(TOKEN_SENTINEL) != 1:
        raise ConfigError(f"template {opts.template!r} must put the job comment "
                          "(ctx.directives) in the script exactly once")
    token = token_for(draft)
    script = draft.replace(TOKEN_SENTINEL, token)
    warnings = tuple(unknown_key_warnings(run.megatron.explicit(), site.software.megatron,
                                          source))
    return Prepared(run, site, plan, facts, replace(opts, token=token), run_dir, script, token,
                    warnings)


def resolve_run_dir(run: RunSpec, explicit: str | None, base: str) -> str:
    """An absolute run directory: explicit > [job] work_dir > slurmpod-runs/<name>, relative
    paths taken from `base` (the local cwd, or the remote home over SSH)."""
    from slurmpod.render.sbatch import default_run_dir

    raw = explicit or run.job.work_dir or default_run_dir(run.job.name)
    p = PurePosixPath(raw)
    return str(p if p.is_absolute() else PurePosixPath(base) / p)


class EnvRunner:
    """A runner that adds fixed environment to every command (e.g. SLURM_CONF or PATH of a
    cluster whose Slurm is not at the default place); everything else is delegated."""

    def __init__(self, inner: CommandRunner, env: Mapping[str, str]) -> None:
        self.inner = inner
        self.env = dict(env)

    @property
    def where(self) -> str:
        return self.inner.where

    def run(self, argv: Any, *, env: Mapping[str, str] | None = None, **kw: Any) -> Any:
        return self.inner.run(argv, env={**self.env, **(env or {})}, **kw)

    def write_text(self, path: str, text: str, mode: int = 0o644) -> str:
        return self.inner.write_text(path, text, mode)

    def upload(self, local_path: Path, remote_dir: str, name: str | None = None) -> str:
        return self.inner.upload(local_path, remote_dir, name)

    def close(self) -> None:
        self.inner.close()


def _read_marker(runner: CommandRunner, run_dir: str) -> dict[str, Any] | None:
    try:
        res = runner.run(["cat", f"{run_dir}/{MARKER}"], check=False, timeout_s=30)
    except CommandError:
        return None
    if res.returncode != 0:
        return None
    try:
        data = json.loads(res.stdout)
    except json.JSONDecodeError:
        return None
    return data if isinstance(data, dict) else None


def _write_marker(runner: CommandRunner, run_dir: str, data: Mapping[str, Any]) -> None:
    runner.write_text(f"{run_dir}/{MARKER}", json.dumps(data, indent=2) + "\n")


def _find_by_token(runner: CommandRunner, name: str, token: str) -> list[str]:
    """Jobs Slurm still holds whose comment carries `token` (the window between sbatch
    returning and the marker being written)."""
    try:
        res = runner.run(["squeue", "--noheader", f"--name={name}", "--format=%i|%k"],
                         check=False, timeout_s=30)
    except CommandError:
        return []
    ids = []
    for line in res.stdout.splitlines():
        jid, _, comment = line.partition("|")
        if f'"token":"{token}"' in comment:
            ids.append(jid.strip())
    return ids


def _live(backend: SlurmBackend, job_ids: list[str]) -> list[str]:
    if not job_ids:
        return []
    try:
        states = backend.status(job_ids)
    except SlurmError:
        return job_ids  # cannot tell: assume alive rather than queue a duplicate
    return [j for j in job_ids if j in states and states[j].state.is_active]


def check_time_limit(prep: Prepared | Rendered, backend: SlurmBackend) -> None:
    """Refuse (exit 3) a time limit above the partition's MaxTime, read from Slurm now.

    sbatch itself accepts such a job and leaves it PENDING with reason PartitionTimeLimit for
    ever (EnforcePartLimits=NO, Slurm's default through 24.11), or rejects it only with
    EnforcePartLimits set: either way the user learns late. Not at render time: the partition
    can change between render and submit, and render needs no Slurm."""
    from slurmpod.model.slurm_time import format_minutes, limit_minutes

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


def submit(prep: Prepared | Rendered, runner: CommandRunner, backend: SlurmBackend, *,
           chain: int = 1, force: bool = False) -> SubmitResult:
    """Store the script in the run dir and queue it (chain jobs), unless already queued."""
    res = SubmitResult([], prep.run_dir, prep.script_path, prep.token, runner.where,
                       min_sus=prep.min_sus)
    marker = _read_marker(runner, prep.run_dir)
    if marker and marker.get("token") == prep.token and not force:
        known = [str(j) for j in marker.get("job_ids") or []]
        if not known and marker.get("state") == "submitting":
            known = _find_by_token(runner, prep.name, prep.token)
        alive = _live(backend, known)
        if alive:
            res.job_ids, res.reused = alive, True
            return res
    check_time_limit(prep, backend)
    try:
        runner.write_text(prep.script_path, prep.script, mode=0o755)
        # Slurm opens --output at start and does not create directories.
        runner.write_text(f"{prep.run_dir}/logs/.keep", "")
    except OSError as exc:  # a local run dir; SSH raises SshError itself
        from slurmpod.fsutil import output_error

        raise output_error(prep.run_dir, exc) from None
    _write_marker(runner, prep.run_dir, {"token": prep.token, "state": "submitting",
                                         "script": prep.script_path, "job_ids": []})
    for _ in range(chain):
        jid = backend.submit(PurePosixPath(prep.script_path), cwd=prep.run_dir)
        res.job_ids.append(jid)
        _write_marker(runner, prep.run_dir, {"token": prep.token, "state": "submitted",
                                             "script": prep.script_path,
                                             "job_ids": res.job_ids})
    return res


def wait_for_start(backend: SlurmBackend, site: Site, res: SubmitResult, *,
                   timeout_s: float = 600.0, poll_s: float = 1.0,
                   clock: Callable[[], float] = time.monotonic,
                   sleep: Callable[[float], None] = time.sleep) -> SubmitResult:
    """Poll until the (first) job runs or ends; fill in its nodes and the SUs they span."""
    from slurmpod.errors import JobNotFinishedError
    from slurmpod.model.hostlist import expand

    jid = res.job_ids[0]
    deadline = clock() + timeout_s
    while True:
        st = backend.status([jid]).get(jid)
        started = st is not None and st.state.value in ("RUNNING", "COMPLETING", "SUSPENDED")
        if st is not None and (started or st.state.is_terminal):
            res.state = st.state.value
            res.nodes = st.nodes
            inv = site.inventory
            sus = []
            for name in expand(st.nodes) if st.nodes else []:
                node = inv.by_name.get(name)
                if node is not None and inv.su_names[node.su] not in sus:
                    sus.append(inv.su_names[node.su])
            res.sus = sus
            return res
        if clock() >= deadline:
            raise JobNotFinishedError(f"job {jid} has not started after {timeout_s:g} s "
                                      f"(state {st.state.value if st else 'unknown'})",
                                      hint=f"check `squeue -j {jid}`")
        sleep(poll_s)


def read_run_and_site(run_path: Path, site: str | None) -> tuple[RunSpec, Site, str]:
    from slurmpod.config import load_site, resolve_site_path
    from slurmpod.megatron.runspec import load_run

    site_path = resolve_site_path(site)
    return load_run(run_path), load_site(site_path), str(site_path.stem)



# --- prepared-script cache --------------------------------------------------------------------

CACHE_FORMAT = 2  # 2: warnings, time limit and partition kept with the script
CACHE_KEEP = 64  # entries kept; the oldest go first
# Code whose change can change a rendered script (besides slurmpod itself and its templates).
_LIBRARIES = ("jinja2", "markupsafe", "msgspec")


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "slurmpod" / "prepared"


def _stamp_tree(h: Any, root: Path) -> None:
    """Path, size and mtime of every file below `root` (not compiled bytecode)."""
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
        for name in sorted(filenames):
            st = os.stat(os.path.join(dirpath, name))
            h.update(f"{dirpath}/{name}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())


def prepared_key(run_path: Path, site_path: Path, template_dirs: Sequence[Path],
                 choices: Mapping[str, Any], base: str) -> str | None:
    """The cache key of a local prepare: run spec and site file contents, every template file,
    the command-line choices, the working directory, and the code that renders. None when an
    input cannot be read (the uncached path then reports it properly)."""
    from importlib.util import find_spec

    from slurmpod.config import PACKAGE_DIR, data_dir

    h = hashlib.sha256()
    try:
        head = [CACHE_FORMAT, __version__, sys.version, str(site_path), base, dict(choices)]
        h.update(json.dumps(head, sort_keys=True, default=str).encode())
        for f in (run_path, site_path):
            data = f.read_bytes()
            h.update(f"\0{len(data)}\0".encode() + data)
        # The site's calibration (perf.calibrate.store_path) sets the predicted iteration time
        # behind the derived --save-interval.
        calib = site_path.with_name(site_path.stem + ".perf.toml")
        data = calib.read_bytes() if calib.is_file() else b""
        h.update(f"\0{len(data)}\0".encode() + data)
        for root in (PACKAGE_DIR, data_dir("templates"), *template_dirs):
            _stamp_tree(h, Path(root))
        for lib in _LIBRARIES:
            spec = find_spec(lib)
            origin = spec.origin if spec is not None else None
            st = os.stat(origin) if origin else None
            h.update(f"{lib}\0{origin}\0{st and st.st_size}\0{st and st.st_mtime_ns}".encode())
    except (OSError, ValueError):
        return None
    return h.hexdigest()


def cache_load(key: str) -> Rendered | None:
    """The stored preparation for `key`, or None (missing, unreadable, or not ours)."""
    try:
        data = json.loads((cache_dir() / f"{key}.json").read_text(encoding="utf-8"))
        r = Rendered(name=data["name"], run_dir=data["run_dir"], script=data["script"],
                     token=data["token"], min_sus=data["min_sus"],
                     warnings=tuple(data["warnings"]), time_limit=data["time_limit"],
                     partition=data["partition"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    ok = (all(isinstance(v, str) for v in (r.name, r.run_dir, r.script, r.token, r.time_limit,
                                           *r.warnings))
          and isinstance(r.partition, str | None)
          and isinstance(r.min_sus, int) and token_matches(r.script, r.token))
    return r if ok else None


def token_matches(script: str, token: str) -> bool:
    """`script` is what `prepare` made with `token` (a damaged or foreign entry is not)."""
    return (script.count(token) == 1
            and token_for(script.replace(token, TOKEN_SENTINEL)) == token)


def cache_store(key: str, prep: Prepared) -> None:
    """Keep `prep` for the next identical prepare; any failure only means no cache."""
    from slurmpod.fsutil import write_atomic

    d = cache_dir()
    r = Rendered.of(prep)
    try:
        d.mkdir(parents=True, exist_ok=True, mode=0o700)
        write_atomic(d / f"{key}.json", json.dumps(r.__dict__), mode=0o600)
        entries = sorted(d.glob("*.json"), key=lambda p: p.stat().st_mtime_ns)
        for old in entries[:-CACHE_KEEP]:
            old.unlink(missing_ok=True)
    except OSError:
        pass
