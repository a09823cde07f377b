"""Stragglers from Megatron's per-rank timers: the ranks (and so the nodes) whose own compute
ran well above their pipeline stage's median, for the note of a job far below its prediction
(`slurmpod.report.predicted.cause_note`). Pure: a `RankTimers` (the log's timer blocks), the
arguments dump and the job's node list in, a `StragglerFinding` or None out.

Why compute and not the step: Megatron's `Timer` synchronises CUDA at start and stop
(megatron/core/timers.py), so `forward-compute` and `backward-compute` (`--timing-log-level 2`,
megatron/core/pipeline_parallel/schedules.py) hold a rank's own kernels. `forward-backward`
(level 1) also holds every wait for pipeline peers, so the fast ranks of a slow pipeline read
as slow as the straggler and it cannot name one.

What this sees and what it cannot:
- Tensor-parallel (and context/expert-parallel) collectives run inside the compute timers, so a
  slow GPU slows its whole TP group: several ranks of one node show up together.
- Ranks of one pipeline stage do the same work; the first and last stages carry the embedding
  and the loss, so each rank is compared with the median of its own stage only.
- A stage whose ranks are one TP group (data-parallel size 1) slows as a whole and shows no
  straggler; nor does a stage of fewer than MIN_STAGE_RANKS reported ranks (no majority says
  what normal is).
- The stop synchronisation also waits for the overlapped gradient reduction of the last
  microbatch, which includes waiting for the slow rank, so the ratio is a lower bound.
- With MoE, an unbalanced router gives uneven compute too; the finding names the ranks either way.

The timers are the job's own log text: ranks outside [0, world), values that are not finite
positive numbers and arguments of the wrong type are ignored, and nothing here raises on them.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from slurmpod.accounting.timerblocks import COMPUTE_TIMERS

if TYPE_CHECKING:
    from slurmpod.accounting.logrecords import RankTimers

# A rank whose forward + backward compute is at least this many times its stage's median is a
# straggler. Healthy GPUs of one stage agree within a few per cent (clock and thermal jitter,
# TP rank 0's data loading inside forward-compute); a throttled, power-capped or degraded GPU
# runs 15-50 % slow, and because every collective waits for it the whole job loses about as
# much, a share that matters next to the 70 % below-predicted threshold. Lower values flag
# jitter, the more so as the measured ratio understates the real one (see the module doc).
STRAGGLER_RATIO = 1.15
# Stragglers kept in a finding (worst first); the phrase counts the rest.
STRAGGLER_CAP = 16
# Reported ranks a stage needs to be judged: with one or two, no majority says what normal is.
MIN_STAGE_RANKS = 3
# Nodes named in the phrase; the rest are counted.
_PHRASE_NODES = 3

_COMPUTE = COMPUTE_TIMERS  # the timers a spool record keeps per rank
_WORDS = {"forward-compute": "forward compute", "backward-compute": "backward compute"}


# What to do about a named straggler (the job report's notes).
FIX = ("check the named nodes' GPUs (`nvidia-smi -q -d PERFORMANCE`: clocks, throttling; "
       "`dcgmi diag -r 2`) and exclude a bad one with --exclude, or drain it")


@dataclass(frozen=True)
class Straggler:
    rank: int  # global rank
    stage: int  # pipeline stage
    node: str | None  # from srun's block distribution; None when the node list does not cover it
    local_rank: int | None
    ms: float  # forward + backward compute, mean ms per iteration
    stage_median_ms: float

    @property
    def ratio(self) -> float:
        return self.ms / self.stage_median_ms

    def to_json(self) -> dict[str, Any]:
        return {"rank": self.rank, "stage": self.stage, "node": self.node,
                "local_rank": self.local_rank, "ms": round(self.ms, 3),
                "stage_median_ms": round(self.stage_median_ms, 3),
                "ratio": round(self.ratio, 4)}


@dataclass(frozen=True)
class StragglerFinding:
    timer: str  # what was compared: "forward-compute + backward-compute", or one timer (min/max)
    ranks_judged: int  # ranks compared with their stage's median; 0 for a min/max-only finding
    max_ratio: float  # worst rank over its stage's median, or max over min (min/max-only)
    stragglers: tuple[Straggler, ...]  # worst first, at most STRAGGLER_CAP; empty for min/max
    count: int = 0  # stragglers found, before the cap
    pipeline_stages: int = 1
    threshold: float = STRAGGLER_RATIO  # the ratio judged against

    def to_json(self) -> dict[str, Any]:
        return {"timer": self.timer, "ranks_judged": self.ranks_judged,
                "max_ratio": round(self.max_ratio, 4), "count": self.count,
                "pipeline_stages": self.pipeline_stages, "threshold": self.threshold,
                "stragglers": [s.to_json() for s in self.stragglers]}

    def phrase(self) -> str:
        """One clause for the report's note, e.g. "node gpu-003 (ranks 16-23) ran forward +
        backward compute at 1.32x its pipeline stage's median"."""
        if not self.stragglers:
            what = _WORDS.get(self.timer, "compute")
            return (f"the slowest rank's {what} ran {self.max_ratio:.2f}x the fastest's "
                    "(rerun with --timing-log-option all to name it)")
        median = ("its pipeline stage's median" if self.pipeline_stages > 1
                  else "the median rank's")
        groups = _by_node(self.stragglers)
        parts = []
        for k, (node, ranks, worst) in enumerate(groups[:_PHRASE_NODES]):
            who = (f"node {node} ({_ranks_words(ranks)})" if node is not None
                   else _ranks_words(ranks))
            if k == 0:
                parts.append(f"{who} ran forward + backward compute at {worst:.2f}x {median}")
            else:
                parts.append(f"{who} at {worst:.2f}x")
        listed = sum(len(r) for _, r, _ in groups[:_PHRASE_NODES])
        more = self.count - listed if self.count > listed else 0
        if more:
            parts.append(f"{more} more rank{'s' if more != 1 else ''} above "
                         f"{self.threshold:.2f}x")
        return ", ".join(parts)


def _by_node(stragglers: Sequence[Straggler]) -> list[tuple[str | None, list[int], float]]:
    """(node, its straggling ranks ascending, worst ratio), worst node first. Without a node
    list every rank is under None: one group, read as ranges."""
    groups: dict[str | None, list[Straggler]] = {}
    for s in stragglers:
        groups.setdefault(s.node, []).append(s)
    out = [(node, sorted(s.rank for s in ss), max(s.ratio for s in ss))
           for node, ss in groups.items()]
    out.sort(key=lambda g: (-g[2], g[1][0]))
    return out


def _ranks_words(ranks: Sequence[int]) -> str:
    """[16, 17, 18, 19, 40] -> "ranks 16-19, 40"; [40] -> "rank 40"."""
    spans: list[str] = []
    start = prev = ranks[0]
    for r in [*ranks[1:], None]:
        if r is not None and r == prev + 1:
            prev = r
            continue
        spans.append(str(start) if start == prev else f"{start}-{prev}")
        if r is not None:
            start = prev = r
    return f"{'rank' if len(ranks) == 1 else 'ranks'} {', '.join(spans)}"


def _pos_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and x >= 1


def _ms(x: Any) -> float | None:
    """A timer value the log could have printed: a finite positive number, else None."""
    if isinstance(x, bool) or not isinstance(x, int | float):
        return None
    v = float(x)
    return v if math.isfinite(v) and v > 0.0 else None


def _layout(args: Mapping[str, Any]) -> tuple[int, int, bool] | None:
    """(tp, pp, tp-pp-dp order) from the arguments dump; None when a value has the wrong type.
    A missing (or None) size is 1, a missing mapping flag the default order."""
    sizes = []
    for key in ("tensor_model_parallel_size", "pipeline_model_parallel_size"):
        v = args.get(key)
        if v is None:
            v = 1
        if not _pos_int(v):
            return None
        sizes.append(v)
    mapping = args.get("use_tp_pp_dp_mapping")
    if mapping is None:
        mapping = False
    if not isinstance(mapping, bool):
        return None
    return sizes[0], sizes[1], mapping


def _stage_of(rank: int, world: int, tp: int, pp: int, tp_pp_dp: bool) -> int:
    """Megatron's rank order (megatron/training/initialize.py: `order='tp-cp-ep-dp-pp'`, or
    `'tp-pp-dp'` with --use-tp-pp-dp-mapping): pp is outermost by default, else next to tp."""
    if tp_pp_dp:
        return (rank // tp) % pp
    return rank // (world // pp)


def _compute_per_rank(per_rank: Any, world: int) -> dict[int, float]:
    """rank -> forward + backward compute ms, for ranks in [0, world) with both values sane."""
    if not isinstance(per_rank, Mapping):
        return {}
    columns = []
    for name in _COMPUTE:
        col = per_rank.get(name)
        if not isinstance(col, Mapping):
            return {}
        clean: dict[int, float] = {}
        for r, v in col.items():
            ms = _ms(v)
            if isinstance(r, int) and not isinstance(r, bool) and 0 <= r < world \
                    and ms is not None:
                clean[r] = ms
        columns.append(clean)
    fwd, bwd = columns
    return {r: fwd[r] + bwd[r] for r in fwd if r in bwd}


def _judge_stages(compute: Mapping[int, float], stage: Mapping[int, int], ratio: float
                  ) -> tuple[int, float, list[tuple[int, int, float, float]]]:
    """(ranks judged, worst ratio, [(rank, stage, ms, stage median)] of the stragglers)."""
    by_stage: dict[int, list[int]] = {}
    for r in compute:
        by_stage.setdefault(stage[r], []).append(r)
    judged, worst = 0, 0.0
    found: list[tuple[int, int, float, float]] = []
    for s, ranks in by_stage.items():
        if len(ranks) < MIN_STAGE_RANKS:
            continue
        median = statistics.median(compute[r] for r in ranks)
        judged += len(ranks)
        for r in ranks:
            worst = max(worst, compute[r] / median)
            if compute[r] >= ratio * median:
                found.append((r, s, compute[r], median))
    return judged, worst, found


def _from_all_ranks(timers: RankTimers, tp: int, pp: int, tp_pp_dp: bool, world: int,
                    nodes: Sequence[str], tasks_per_node: int, ratio: float
                    ) -> StragglerFinding | None:
    compute = _compute_per_rank(getattr(timers, "per_rank", None), world)
    if not compute:
        return None
    stage = {r: _stage_of(r, world, tp, pp, tp_pp_dp) for r in compute}
    judged, worst, found = _judge_stages(compute, stage, ratio)
    if not found:
        return None
    mapped = (_pos_int(tasks_per_node) and not isinstance(nodes, str)
              and all(isinstance(n, str) for n in nodes)
              and len(nodes) * tasks_per_node >= world)
    stragglers = [Straggler(r, s, nodes[r // tasks_per_node] if mapped else None,
                            r % tasks_per_node if mapped else None, ms, median)
                  for r, s, ms, median in found]
    stragglers.sort(key=lambda x: (-x.ratio, x.rank))
    return StragglerFinding(" + ".join(_COMPUTE), judged, worst,
                            tuple(stragglers[:STRAGGLER_CAP]), len(stragglers), pp, ratio)


def _from_min_max(min_max: Any, ratio: float) -> StragglerFinding | None:
    """--timing-log-option minmax with one pipeline stage: the compute timers' max over min."""
    if not isinstance(min_max, Mapping):
        return None
    best: tuple[float, str] | None = None
    for name in _COMPUTE:
        pair = min_max.get(name)
        if not isinstance(pair, tuple | list) or len(pair) != 2:
            continue
        lo, hi = _ms(pair[0]), _ms(pair[1])
        if lo is None or hi is None:
            continue
        if best is None or hi / lo > best[0]:
            best = (hi / lo, name)
    if best is None or best[0] < ratio:
        return None
    return StragglerFinding(best[1], 0, best[0], (), 0, 1, ratio)


def find_stragglers(timers: RankTimers | None, args: Mapping[str, Any] | None, *, world: int,
                    nodes: Sequence[str] = (), tasks_per_node: int = 8,
                    ratio: float = STRAGGLER_RATIO) -> StragglerFinding | None:
    """The straggling ranks of a job from its timer blocks, or None when there are none or the
    log cannot tell (no per-rank compute timers, no arguments dump, a layout that does not
    divide `world`, bad values).

    `world` is the job's GPU count (from Slurm, not the log); `nodes` its node list in Slurm's
    order: with srun's default block distribution rank r runs on nodes[r // tasks_per_node]."""
    if timers is None or not isinstance(args, Mapping):
        return None
    if not _pos_int(world) or isinstance(ratio, bool) or not isinstance(ratio, int | float):
        return None
    if not math.isfinite(ratio) or ratio <= 1.0:
        return None
    layout = _layout(args)
    if layout is None:
        return None
    tp, pp, tp_pp_dp = layout
    if world % (tp * pp):
        return None
    option = getattr(timers, "option", None)
    if option == "all":
        return _from_all_ranks(timers, tp, pp, tp_pp_dp, world, nodes, tasks_per_node,
                               float(ratio))
    if option == "minmax" and pp == 1:
        return _from_min_max(getattr(timers, "min_max", None), float(ratio))
    return None
