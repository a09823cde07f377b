"""The checkpoint interval: Young/Daly optimum and the goodput it gives. Pure, no numpy.

Symbols as in Daly (2006): M the job's mean time between interruptions, δ the time one save
holds training up, R the time from an interruption to training again (detection, restart,
checkpoint load), τ the compute time between saves. Failures are a Poisson process at job
scale (the sum of many nodes' independent failures is close to one, whatever each node's law).

- Young (1974), "A first order approximation to the optimum checkpoint interval", CACM 17(9):
  τ = sqrt(2 δ M).
- Daly (2006), "A higher order estimate of the optimum checkpoint interval for restart dumps",
  FGCS 22(3) 303-312, eq. (37): τ = sqrt(2 δ M) [1 + ⅓ sqrt(δ / 2M) + (1/9)(δ / 2M)] − δ for
  δ < 2M, else τ = M. Its own check values (R = 10 min, δ = 5 min): M = 24 h -> 117 min,
  M = 6 h -> 57 min, M = 15 min -> 9.1 min (tests/unit/resilience/test_interval.py).
- Daly's exact expected wall time for that model gives the goodput of any τ:
  goodput = τ / (M e^(R/M) (e^((τ+δ)/M) − 1)): a failure during a save or a restart costs the
  whole segment, as in the simulator (slurmpod.resilience.simulate), which checks it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from slurmpod.errors import ConfigError
from slurmpod.render.launch import predicted_save_s

if TYPE_CHECKING:
    from slurmpod.model.site import Site
    from slurmpod.resilience.history import History

HOUR_S = 3600.0


def young_interval(save_s: float, mtbf_s: float) -> float:
    """Young's first-order optimum compute time between saves, seconds."""
    _check(save_s, mtbf_s)
    return math.sqrt(2.0 * save_s * mtbf_s)


def daly_interval(save_s: float, mtbf_s: float) -> float:
    """Daly's higher-order optimum compute time between saves, seconds (eq. 37)."""
    _check(save_s, mtbf_s)
    if save_s >= 2.0 * mtbf_s:
        return mtbf_s
    x = save_s / (2.0 * mtbf_s)
    return math.sqrt(2.0 * save_s * mtbf_s) * (1.0 + math.sqrt(x) / 3.0 + x / 9.0) - save_s


def expected_goodput(interval_s: float, save_s: float, restart_s: float, mtbf_s: float) -> float:
    """Fraction of wall time spent on work that is kept, for saves every `interval_s` of compute
    (Daly's exact model, exponential failures at job scale)."""
    _check(save_s, mtbf_s)
    if interval_s <= 0 or restart_s < 0:
        raise ValueError("interval must be > 0 and restart >= 0")
    # expm1 keeps precision when (τ + δ) ≪ M; the exponent is capped so a hopeless policy
    # gives ~0 instead of an overflow.
    wall = mtbf_s * math.exp(min(restart_s / mtbf_s, 700.0)) \
        * math.expm1(min((interval_s + save_s) / mtbf_s, 700.0))
    return interval_s / wall


def job_mtbf_s(node_mtbf_hours: float, nodes: int) -> float:
    """The job's mean time between interruptions: any of its nodes failing stops it."""
    if nodes < 1 or not node_mtbf_hours > 0:
        raise ValueError("nodes must be >= 1 and the node MTBF > 0")
    return node_mtbf_hours * HOUR_S / nodes


def _check(save_s: float, mtbf_s: float) -> None:
    if not (save_s >= 0 and mtbf_s > 0 and math.isfinite(save_s) and math.isfinite(mtbf_s)):
        raise ValueError("save time must be >= 0 and the MTBF > 0 (finite)")


# A save holds training up for at least this long even when its bytes are few: the ranks meet
# in a barrier, write metadata and fsync (Megatron's save_checkpoint, core 0.12-0.14). Without
# a floor a tiny model's predicted save of milliseconds asks for a save every few iterations.
MIN_SAVE_S = 1.0
# Restart latency when nothing measured it: requeue, node allocation, container start and
# checkpoint load of a large job take minutes (Meta reports restarts as the largest part of
# lost time at 16k GPUs; docs/resilience.md). 10 minutes is Daly's own worked example's R.
DEFAULT_RESTART_S = 600.0


@dataclass(frozen=True)
class Recommendation:
    """The save interval `plan` shows and `submit` sets, with what it rests on."""

    nodes: int
    node_mtbf_hours: float
    mtbf_source: str  # "site" (no history) | "history" (observed, see resilience.history)
    job_mtbf_s: float
    save_s: float
    save_source: str  # "predicted" (params × 14 B / write rate) | "measured" (log's save timers)
    restart_s: float
    step_s: float | None  # seconds per iteration (predicted or measured); None: unknown
    step_source: str | None
    interval_s: float  # Daly's optimum compute time between saves
    save_interval: int | None  # the same in iterations (None when the step time is unknown)
    goodput: float  # Daly's expected goodput at the interval actually set
    young_interval_s: float

    @property
    def interruptions_per_day(self) -> float:
        return 86400.0 / self.job_mtbf_s

    def to_json(self) -> dict[str, Any]:
        return {
            "save_interval": self.save_interval, "interval_s": round(self.interval_s, 3),
            "young_interval_s": round(self.young_interval_s, 3),
            "expected_goodput": round(self.goodput, 5), "nodes": self.nodes,
            "node_mtbf_hours": round(self.node_mtbf_hours, 3), "mtbf_source": self.mtbf_source,
            "job_mtbf_hours": round(self.job_mtbf_s / HOUR_S, 4),
            "interruptions_per_day": round(self.interruptions_per_day, 4),
            "save_s": round(self.save_s, 3), "save_source": self.save_source,
            "restart_s": round(self.restart_s, 3),
            "step_s": None if self.step_s is None else round(self.step_s, 6),
            "step_source": self.step_source,
        }

    def summary(self) -> str:
        """One line for `plan`."""
        every = (f"save_interval {self.save_interval} iterations (every "
                 f"{_duration(self.interval_s)})" if self.save_interval is not None
                 else f"a save every {_duration(self.interval_s)} of training")
        g = f"{self.goodput:.2%}" if self.goodput >= 0.99 else f"{self.goodput:.1%}"
        return (f"{every}; expected goodput {g} (job MTBF "
                f"{_duration(self.job_mtbf_s)} from {self.node_mtbf_hours:,.0f} h per node "
                f"[{self.mtbf_source}], save {self.save_s:.3g} s [{self.save_source}], restart "
                f"{_duration(self.restart_s)})")


def _duration(s: float) -> str:
    if s >= 100 * HOUR_S:
        return f"{s / HOUR_S:,.0f} h"
    if s >= 2 * HOUR_S:
        return f"{s / HOUR_S:.3g} h"
    if s >= 120:
        return f"{s / 60:.3g} min"
    return f"{s:.3g} s"


def round_iterations(x: float) -> int:
    """Iterations to two significant figures (1234.5 -> 1200): that moves τ by at most 5%, and
    the overhead δ/τ + τ/2M is flat at its optimum (a change ε raises it by ~ε²/2, 0.13% of
    itself at 5%), while a round number is easier to read in a run spec and a log."""
    if x < 1:
        return 1
    n = math.floor(math.log10(x)) - 1
    step = 10 ** max(n, 0)
    return max(1, round(x / step) * step)


def recommend(*, nodes: int, node_mtbf_hours: float, save_s: float, step_s: float | None,
              restart_s: float = DEFAULT_RESTART_S, mtbf_source: str = "site",
              save_source: str = "predicted", step_source: str | None = "predicted"
              ) -> Recommendation:
    """Daly's interval for a job of `nodes` nodes, in iterations when the step time is known."""
    if not (math.isfinite(save_s) and save_s >= 0):
        raise ConfigError(f"checkpoint save time {save_s!r} s is not a time")
    delta = max(save_s, MIN_SAVE_S)
    mtbf = job_mtbf_s(node_mtbf_hours, nodes)
    tau = daly_interval(delta, mtbf)
    iters: int | None = None
    used = tau
    if step_s is not None and step_s > 0 and math.isfinite(step_s):
        iters = round_iterations(tau / step_s)
        used = iters * step_s
    else:
        step_s, step_source = None, None
    return Recommendation(
        nodes=nodes, node_mtbf_hours=node_mtbf_hours, mtbf_source=mtbf_source, job_mtbf_s=mtbf,
        save_s=delta, save_source=save_source, restart_s=restart_s, step_s=step_s,
        step_source=step_source, interval_s=used, save_interval=iters,
        goodput=expected_goodput(used, delta, restart_s, mtbf),
        young_interval_s=young_interval(delta, mtbf))


def recommend_for_run(site: Site, *, nodes: int, params_total: float, step_s: float | None,
                      step_source: str | None = "predicted", history: History | None = None,
                      measured_save_s: float | None = None,
                      restart_s: float = DEFAULT_RESTART_S) -> Recommendation:
    """The recommendation for a run on `site`: the node MTBF observed in `history` (shrunk
    toward the site's `[reliability] node_mtbf_hours`), else the site's; the save time
    measured in a log, else predicted as `render` predicts it for the signal lead."""

    site_mtbf = site.reliability.node_mtbf_hours
    if history is not None and history.attempts:
        mtbf, mtbf_source = history.node_mtbf_hours(site_mtbf), "history"
    else:
        mtbf, mtbf_source = site_mtbf, "site"
    if measured_save_s is not None:
        save, save_source = measured_save_s, "measured"
    else:
        save = predicted_save_s(params_total, site.storage.checkpoint_write_gb_per_s)
        save_source = "predicted"
    return recommend(nodes=nodes, node_mtbf_hours=mtbf, save_s=save, step_s=step_s,
                     restart_s=restart_s, mtbf_source=mtbf_source, save_source=save_source,
                     step_source=step_source)
