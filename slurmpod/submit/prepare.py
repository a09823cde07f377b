"""Plan -> refuse -> render: a run spec and a site become a script with its idempotency token.

Nothing is rendered unless the plan is valid and fits (`plan_or_refuse`, exit 3). The token is
the hash of the rendered script (`token_for`); it goes into the job's comment and into the run
directory's marker, so that the same submit run twice finds the job it already queued.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from slurmpod.errors import ConfigError
from slurmpod.resilience.interval import recommend_for_run
from slurmpod.submit.store import script_path

if TYPE_CHECKING:
    from slurmpod.megatron.plan import Plan
    from slurmpod.megatron.runspec import RunSpec
    from slurmpod.model.site import Site
    from slurmpod.render.sbatch import PlanFacts, RenderOptions

SITE_ENV_FILE = "nccl-env.toml"
# Rendered in place of the token, then replaced by the hash of the script holding it: one
# render instead of two (template compilation dominates rendering time).
TOKEN_SENTINEL = "5e7e7e7e7e7e7e75"


@dataclass(frozen=True)
class Prepared:
    """A planned and rendered run, ready to store and submit."""

    run: RunSpec
    site: Site
    plan: Plan
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
        return script_path(self.run_dir, self.name)


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
        return script_path(self.run_dir, self.name)

    @classmethod
    def of(cls, prep: Prepared) -> Rendered:
        return cls(prep.name, prep.run_dir, prep.script, prep.token, prep.min_sus,
                   prep.warnings, prep.time_limit, prep.partition)


def read_run_and_site(run_path: Path, site: str | None) -> tuple[RunSpec, Site, str]:
    """The run spec, the site and the site's label (its file's stem) for the script header."""
    from slurmpod.config import load_site, resolve_site_path  # lazy: start-up
    from slurmpod.megatron.runspec import load_run  # lazy: start-up

    site_path = resolve_site_path(site)
    return load_run(run_path), load_site(site_path), str(site_path.stem)


def load_site_env(template_dirs: tuple[Path, ...]) -> dict[str, str | None]:
    """Site NCCL overrides: `[env]` of `nccl-env.toml` in the first template dir holding one.
    A value of false removes a preset variable."""
    for d in template_dirs:
        path = d / SITE_ENV_FILE
        if not path.is_file():
            continue
        from slurmpod.config import read_toml  # lazy: start-up

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


def plan_or_refuse(run: RunSpec, site: Site, site_path: Path | None = None) -> Plan:
    """The plan; a ConfigError (exit 3) when the layout is invalid or does not fit (with the
    memory reserve the site measured, as `plan` counts it). Without the group placement: it
    only adds warnings, and it is what needs numpy."""
    from slurmpod.megatron.plan import make_plan  # lazy: start-up
    from slurmpod.perf.planning import site_reserve  # lazy: start-up

    plan = make_plan(run, site, placement=False,
                     measured_reserve=site_reserve(site, site_path))
    if plan.ok:
        return plan
    errors = list(plan.errors)
    if not plan.fits:
        errors.append(f"needs {plan.total_bytes_per_gpu / 2**30:.1f} GiB per GPU but "
                      f"{plan.usable_bytes_per_gpu / 2**30:.1f} GiB is usable")
    first = errors[0] if errors else "plan is not valid"
    more = f" (+{len(errors) - 1} more)" if len(errors) > 1 else ""
    raise ConfigError(f"refusing to render run {run.job.name!r}: {first}{more}",
                      hint="see `slurmpod plan RUN.toml` for every problem and its fix")


def token_for(script_without_token: str) -> str:
    return hashlib.sha256(script_without_token.encode()).hexdigest()[:16]


def token_matches(script: str, token: str) -> bool:
    """`script` is what `prepare` made with `token` (a damaged or foreign one is not)."""
    return (script.count(token) == 1
            and token_for(script.replace(token, TOKEN_SENTINEL)) == token)


def save_interval_for(run: RunSpec, site: Site, facts: PlanFacts,
                      site_path: Path | None = None) -> int | None:
    """Megatron's --save-interval for a run spec without one: Daly's optimum for the job's
    nodes at the site's node MTBF, the predicted save time and the predicted iteration time
    (slurmpod.resilience.interval; `slurmpod plan` shows the same figure). None when the run
    spec sets it or the iteration time cannot be predicted. `site_path` finds the site's
    calibration (`slurmpod calibrate`) as `plan` does."""
    if "save_interval" in run.megatron.explicit():
        return None
    from slurmpod.perf.planning import predict_run  # lazy: start-up

    pred = predict_run(run, site, facts.nodes, site_path)
    if pred is None:
        return None
    return recommend_for_run(site, nodes=facts.nodes, params_total=facts.params_total,
                             step_s=pred.step_time_s).save_interval


def prepare(run: RunSpec, site: Site, opts: RenderOptions, run_dir: str,
            source: str = "run spec", site_path: Path | None = None) -> Prepared:
    """Plan, refuse, render; the token is the hash of the script with a fixed sentinel.
    `source` names the run spec in warnings."""
    from slurmpod.megatron.argnames import unknown_key_warnings  # lazy: start-up
    from slurmpod.perf.planning import predict_run, recorded_architecture  # lazy: start-up
    from slurmpod.render.sbatch import PlanFacts, build_context, render_script  # lazy: start-up

    plan = plan_or_refuse(run, site, site_path)
    # The prediction `plan` shows (the site's calibration included), recorded in the Comment
    # for the fleet report's achieved-vs-predicted, with the architecture whose track record
    # its note may quote.
    facts = PlanFacts.of(plan, predict_run(run, site, plan.nodes, site_path),
                         recorded_architecture(run, site, site_path))
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
