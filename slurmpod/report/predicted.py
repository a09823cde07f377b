"""Achieved vs predicted: a finished Megatron job's steady iteration time against what the
performance model (`slurmpod.perf`, docs/perf-model.md) predicts for its model and layout on
its nodes' GPU, and the likely cause when it ran far slower. Pure apart from
`site_factors` (a site's own calibration file, `slurmpod calibrate`) and the track record
(`slurmpod.perf.track.load`, package data).

The model and layout come from Megatron's `--- arguments ---` dump at the head of the job's
log (read by the CLI through the epilog's safe reader, `slurmpod.cli.report.log_hints`),
checked by `check_dump_args` before any number of it is used. The GPU is the site file's GPU of
the job's nodes (`trusted.site_gpu`), never the job's claim. Anything missing or wrong (no dump,
nodes of no or mixed types, a layout that does not divide the GPUs) gives no prediction, never
an error: the report is the same without it.

The ratio is compared on iteration time, as the model's validation is (the FLOPs formula a log
prints TFLOP/s with differs between Megatron releases): `ratio = predicted / achieved` seconds
per iteration, i.e. achieved throughput as a share of the predicted, which is also achieved MFU
over predicted MFU when both count the model's FLOPs the same way (slurmpod's formula).

The fleet report reads no log (by design: only the compact spool summaries), so it compares a
job with the prediction recorded at submission instead: the submit Comment's `pred` key
(`slurmpod.model.comment.prediction_keys`), read by `recorded_vs_predicted` into the same
`VsPredicted`, judged on the same threshold and worded by the same `cause_note`. The Comment is
the job's own text (its owner may rewrite it), so each recorded value is range-checked and the
layout and GPU words are shown only when they are plain; the figure decides no money. Its
`arch` id (`slurmpod.perf.track.architecture_id`) selects the published runs `known_miss`
quotes, as the dump's model shape does in the job report; an id of any other shape, or of no
published architecture, selects none.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from slurmpod.errors import SlurmpodError
from slurmpod.model.comment import PRED_PARTS, decode_field

if TYPE_CHECKING:
    from slurmpod.model.site import Site
    from slurmpod.perf.model import Prediction
    from slurmpod.perf.track import Track
    from slurmpod.report.model import Note, Stability
    from slurmpod.report.stragglers import StragglerFinding

# A job below 70 % of its predicted speed is flagged. The model's validation error is median
# ~10 %, max ~25 % on dense rows (docs/perf-model.md): a job at 1/1.25 = 80 % may still be the
# model's error; below 70 % the gap is the job's (its placement, fabric, settings, nodes).
LOW_VS_PREDICTED = 0.70
# A job faster than 1 / 0.70 = 143 % of its prediction is as far beyond the model's error the
# other way: the fitted factors under-rate these GPUs (a newer software stack, a GPU the
# built-in fit never saw), and the site's own calibration fits them.
HIGH_VS_PREDICTED = 1 / LOW_VS_PREDICTED
# A part of the predicted step (exposed communication, pipeline bubble) at least this share of
# it is named as the likely cause: it is the part the model says is most sensitive to the
# fabric and the schedule, and the one a setting can shrink.
CAUSE_SHARE = 0.10
# Megatron-LM's MoE guide, "CPU Overhead Bottleneck" (main, 2026).
HOST_WAIT_FIX = ("capture CUDA graphs (--cuda-graph-impl transformer_engine --cuda-graph-modules "
                 "attn moe_router moe_preprocess, or full_iteration), a larger micro-batch, and "
                 "--manual-gc; an Nsight Systems timeline shows the gaps between kernels")
# Iteration times this uneven (p10-p90 spread / median) in steady state point at stragglers
# (a slow node or GPU holds every collective back) before anything the model counts.
STRAGGLER_SPREAD = 0.10


@dataclass(frozen=True)
class VsPredicted:
    """A job's achieved iteration against the model's prediction for its layout and GPUs."""

    gpu: str  # the site's GPU model of the job's nodes
    world: int  # GPUs the run used (the dump's world_size, else the job's GPUs)
    achieved_step_s: float
    prediction: Prediction
    layout: str = ""  # "TP2 PP4 DP8 MBS1 GBS512", shown only
    # The Megatron settings of the dump the prediction counted (`RunOptions.switches`), shown
    # only; empty where the prediction was recorded at submission
    switches: tuple[str, ...] = ()
    # The model's track record on published runs of the job's architecture (slurmpod.perf.
    # track); from a recorded prediction, that of the architecture its `arch` id names, and
    # only for a flagged job (its note is all that reads it); None without one
    track: Track | None = None

    @property
    def predicted_step_s(self) -> float:
        return self.prediction.step_time_s

    @property
    def ratio(self) -> float:
        """Achieved speed / predicted speed (1.0 = as predicted, 0.5 = twice as slow)."""
        return self.prediction.step_time_s / self.achieved_step_s

    @property
    def achieved_mfu(self) -> float:
        """MFU the job reached, counted with the model's FLOPs (so it compares with
        `predicted_mfu`; the log's own TFLOP/s may use another release's formula)."""
        return self.prediction.mfu * self.ratio

    @property
    def flagged(self) -> bool:
        return self.ratio < LOW_VS_PREDICTED

    @property
    def above(self) -> bool:
        """Far faster than predicted: the model's factors, not the job, are off."""
        return self.ratio > HIGH_VS_PREDICTED

    def known_miss(self) -> str | None:
        """Where published runs of the job's architecture (on its GPU, else on any) also ran
        below LOW_VS_PREDICTED and the job is no slower than the slowest of them: the words
        saying the gap may be the model's, not the job's (as for GPT-OSS, docs/perf-model.md).
        None otherwise, and where the site's own calibration replaces the built-in factors
        those published errors are of."""
        t = self.track
        if t is None or not t.runs or t.site_calibrated:
            return None
        runs = t.on_gpu or t.runs
        lo, hi = (1 + min(r.error for r in runs), 1 + max(r.error for r in runs))
        if lo >= LOW_VS_PREDICTED or self.ratio < lo:
            return None
        where = f"on {self.gpu.upper()}" if t.on_gpu else "on other GPUs"
        return (f"published runs of this architecture ({', '.join(t.models)}) {where} ran at "
                f"{100 * lo:.0f}-{100 * hi:.0f} % of the model's prediction too, so part of "
                "the gap may be the model's (`slurmpod plan` prints this track record)")

    def to_json(self) -> dict[str, Any]:
        p = self.prediction
        return {"gpu": self.gpu, "world_size": self.world, "layout": self.layout,
                "achieved_step_time_s": self.achieved_step_s,
                "predicted_step_time_s": p.step_time_s, "ratio": self.ratio,
                "achieved_mfu": self.achieved_mfu, "predicted_mfu": p.mfu,
                "predicted_tokens_per_s_per_gpu": p.tokens_per_s_per_gpu,
                "breakdown_s": dict(p.breakdown_s), "flagged": self.flagged,
                "threshold": LOW_VS_PREDICTED, "above": self.above, "switches": list(self.switches),
                "efficiency": {"generation": p.generation, "fitted_on": p.efficiency_source},
                "track_record": self.track.to_json() if self.track else None,
                "known_miss": self.known_miss()}


def _layout_text(args: Mapping[str, Any], world: int) -> str:
    tp, pp, cp = (int(args.get(k) or 1) for k in ("tensor_model_parallel_size",
                                                  "pipeline_model_parallel_size",
                                                  "context_parallel_size"))
    parts = [f"TP{tp}", f"PP{pp}"]
    vpp = args.get("virtual_pipeline_model_parallel_size")
    if isinstance(vpp, int) and vpp > 1:
        parts.append(f"VPP{vpp}")
    if cp > 1:
        parts.append(f"CP{cp}")
    ep = args.get("expert_model_parallel_size")
    if isinstance(ep, int) and ep > 1:
        parts.append(f"EP{ep}")
    parts.append(f"DP{world // max(1, tp * pp * cp)}")
    parts += [f"MBS{args.get('micro_batch_size')}", f"GBS{args.get('global_batch_size')}"]
    return " ".join(parts)


def vs_predicted(args: Mapping[str, Any] | None, achieved_step_s: float | None, *,
                 site: Site | None, nodelist: str, gpus: int,
                 site_path: Path | None = None) -> VsPredicted | None:
    """The job's achieved vs predicted iteration; None when anything needed is missing or the
    model cannot place the layout (module docstring)."""
    if not args or site is None or not nodelist or achieved_step_s is None:
        return None
    if not (math.isfinite(achieved_step_s) and achieved_step_s > 0):
        return None
    from slurmpod.accounting.trusted import site_gpu  # lazy: start-up
    from slurmpod.megatron.runspec import ModelConfig  # lazy: start-up
    from slurmpod.megatron.validate import check_dump_args, dump_world  # lazy: start-up
    from slurmpod.perf.hardware import hardware_from_site  # lazy: start-up
    from slurmpod.perf.model import predict  # lazy: start-up
    from slurmpod.perf.options import RunOptions  # lazy: start-up
    from slurmpod.perf.planning import site_factors  # lazy: start-up
    from slurmpod.perf.track import load, track  # lazy: start-up

    if check_dump_args(args) is not None:
        return None
    try:
        sg = site_gpu(nodelist, site, site.inventory)
        if sg is None:
            return None
        world = dump_world(args, gpus)
        if world is None:
            return None
        hw = hardware_from_site(site, sg.node_type)
        opts = RunOptions.from_args(args)
        config = ModelConfig.from_args(args)
        eff, own = site_factors(hw, site_path)
        pred = predict(config, world, hw, eff, opts)
        layout = _layout_text(args, world)
        runs = load()
        record = track(config, hw.gpu_model, runs, own) if runs else None
    except (SlurmpodError, ValueError, TypeError, KeyError, ArithmeticError):
        # A dump the model cannot take (a layout it refuses, an argument of the wrong kind):
        # no prediction, the report is the same without it.
        return None
    if pred is None or not (math.isfinite(pred.step_time_s) and pred.step_time_s > 0):
        return None
    return VsPredicted(gpu=hw.gpu_model, world=world, achieved_step_s=achieved_step_s,
                       prediction=pred, layout=layout,
                       switches=tuple(opts.switches(config)), track=record)


def _s(x: float) -> str:
    return f"{x:.3g} s"


def _ran_at(v: VsPredicted, more: str = "") -> str:
    """The opening of both notes: the job's speed against its prediction, for which layout."""
    return (f"the job ran at {100 * v.ratio:.0f} % of its predicted speed "
            f"({_s(v.achieved_step_s)} per iteration against {_s(v.predicted_step_s)} "
            f"predicted for {v.layout} on {v.world} {v.gpu.upper()} GPUs{more})")


def cause_note(v: VsPredicted, stability: Stability | None,
               stragglers: StragglerFinding | None = None) -> Note:
    """The note of a job far below its prediction: the likely cause and its fix, and where
    published runs of its architecture ran as far below the model, that too
    (`VsPredicted.known_miss`)."""
    note = _likely_cause(v, stability, stragglers)
    known = v.known_miss()
    return replace(note, text=f"{note.text}; {known}") if known else note


def _likely_cause(v: VsPredicted, stability: Stability | None,
                  stragglers: StragglerFinding | None = None) -> Note:
    """The likely cause of a job far below its prediction, and its fix.

    Stragglers first, measured: the ranks Megatron's per-rank timers name (report/stragglers.py)
    when the log has them, else uneven steady iterations; then the largest of the predicted
    step's exposed communication and pipeline bubble when it is at least CAUSE_SHARE of it,
    else the compute itself (clocks, throttling, host or data-loader stalls)."""
    from slurmpod.report.model import Note  # lazy: start-up
    from slurmpod.report.stragglers import FIX as STRAGGLER_FIX  # lazy: start-up

    b = v.prediction.breakdown_s
    step = v.predicted_step_s
    head = _ran_at(v, f"; MFU {100 * v.achieved_mfu:.1f} % against "
                      f"{100 * v.prediction.mfu:.1f} % predicted")
    if stragglers is not None:
        return Note("warn", "below-predicted",
                    f"{head}: stragglers, by Megatron's per-rank timers: {stragglers.phrase()}",
                    STRAGGLER_FIX)
    spread = stability.spread if stability is not None else None
    cv = stability.cv if stability is not None else None
    if ((spread is not None and spread > STRAGGLER_SPREAD)
            or (cv is not None and cv > STRAGGLER_SPREAD)):
        what = (f"p10-p90 spread {100 * spread:.0f} % of the median"
                if spread is not None and spread > STRAGGLER_SPREAD
                else f"std/mean {100 * (cv or 0.0):.0f} %")
        return Note("warn", "below-predicted",
                    f"{head}: likely stragglers, iteration times are uneven ({what})",
                    "find the slow node: `nvidia-smi -q -d PERFORMANCE` (clocks, throttling) "
                    "on each node, `slurmpod fabric check`; exclude it with --exclude")
    comm = b.get("exposed_communication", 0.0)
    bubble = b.get("pp_bubble", 0.0)
    host = b.get("host", 0.0)
    if host >= CAUSE_SHARE * step and host >= max(comm, bubble):
        return Note("warn", "below-predicted",
                    f"{head}: likely the host, whose kernel launches already hold up the FP8 "
                    f"MoE layers' forward for {_s(host)} of the predicted step",
                    HOST_WAIT_FIX)
    offload = b.get("offload", 0.0)
    if offload >= CAUSE_SHARE * step and offload >= max(comm, bubble):
        return Note("warn", "below-predicted",
                    f"{head}: likely the activation offload, whose copies to and from the host "
                    f"already outlast the layers they run under by {_s(offload)} of the "
                    "predicted step",
                    "offload fewer layers (--cpu-offloading-num-layers), or search a layout "
                    "whose activations fit without it (`slurmpod plan RUN.toml --search`)")
    if max(comm, bubble) >= CAUSE_SHARE * step:
        if comm >= bubble:
            parts = ", ".join(f"{k.upper()} {_s(b[k])}" for k in ("tp", "cp", "ep", "dp",
                                                                  "pp_p2p") if b.get(k))
            return Note("warn", "below-predicted",
                        f"{head}: likely exposed communication, already {_s(comm)} of the "
                        f"predicted step ({parts}) and the part most sensitive to the fabric "
                        "and placement",
                        "turn on Megatron's overlap (--overlap-grad-reduce, "
                        "--overlap-param-gather, --tp-comm-overlap), check the fabric "
                        "(`slurmpod fabric check`) and the placement notes, or search a layout "
                        "with less traffic (`slurmpod plan RUN.toml --search`)")
        return Note("warn", "below-predicted",
                    f"{head}: likely the pipeline bubble, already {_s(bubble)} of the "
                    "predicted step",
                    "more microbatches per step (a larger global batch or smaller micro-batch), "
                    "interleaving (--num-layers-per-virtual-pipeline-stage), or fewer pipeline "
                    "stages (`slurmpod plan RUN.toml --search`)")
    return Note("warn", "below-predicted",
                f"{head}: the model predicts a compute-bound step "
                f"({_s(b.get('compute', 0.0))} compute), so the GPUs themselves ran slow",
                "check clocks and throttling (`nvidia-smi -q -d PERFORMANCE`), GPU "
                "utilisation (data loader or host stalls), and that the run's settings match "
                "its arguments dump")


def above_note(v: VsPredicted) -> Note:
    """The note of a job far faster than its prediction: calibrate the site's factors. On the
    sandbox's emulated GPU no fit can close the gap (its factors are already its measured peak):
    the stand-in does only the model's GEMMs, so the note says that instead."""
    from slurmpod.report.model import Note  # lazy: start-up

    head = _ran_at(v)
    if v.prediction.generation == "emulated":
        return Note("info", "above-predicted",
                    f"{head}: the sandbox's emulated GPU runs only the model's GEMMs, with no "
                    "element-wise work, pipeline bubble or communication to wait for, so it "
                    "beats what the model predicts of a GPU")
    fitted = v.prediction.efficiency_source
    return Note("info", "above-predicted",
                f"{head}: beyond the model's error, so its factors under-rate these GPUs"
                + (f" (fitted on {fitted})" if fitted else ""),
                "fit the site's own factors from its finished jobs: `slurmpod calibrate "
                "--since 7d` (docs/perf-model.md)")


# A recorded prediction's limits: a step over a day, an MFU over 100 % or a part longer than the
# step is not a prediction slurmpod made; the words are shown, so only plain ones are taken.
_MAX_STEP_S = 86400.0
_WORDS = re.compile(r"[A-Za-z0-9 ]{1,80}")


def _pos(x: Any, hi: float) -> float | None:
    if isinstance(x, bool) or not isinstance(x, int | float):
        return None
    v = float(x)
    return v if math.isfinite(v) and 0 < v <= hi else None


def recorded_prediction(doc: Mapping[str, Any] | None) -> Prediction | None:
    """The prediction recorded at submission (the submit Comment's `pred` key, decoded), or
    None when there is none or any of its numbers is out of range."""
    from slurmpod.perf.model import Prediction  # lazy: start-up

    pred = doc.get("pred") if doc is not None else None
    if not isinstance(pred, Mapping):
        return None
    step, mfu = _pos(pred.get("s"), _MAX_STEP_S), _pos(pred.get("mfu"), 1.0)
    parts = pred.get("b") or {}
    if step is None or mfu is None or not isinstance(parts, Mapping):
        return None
    breakdown: dict[str, float] = {}
    for k, v in parts.items():
        if k not in PRED_PARTS or (x := _pos(v, step)) is None:
            return None
        breakdown[k] = x
    return Prediction(step_time_s=step, tokens_per_s_per_gpu=_pos(pred.get("tps"), 1e9) or 0.0,
                      model_tflops_per_gpu=0.0, mfu=mfu, breakdown_s=breakdown,
                      efficiency_source="recorded at submission")


def _word(x: Any, default: str) -> str:
    return x if isinstance(x, str) and _WORDS.fullmatch(x) else default


def recorded_vs_predicted(comment: str, achieved_step_s: float | None,
                          gpus: int) -> VsPredicted | None:
    """A finished job's achieved iteration against the prediction its submit Comment recorded
    (the fleet report's source, module docstring); None without one. `gpus` is Slurm's."""
    if "pred" not in comment or achieved_step_s is None or gpus < 1:
        return None  # the substring test spares decoding 100,000 Comments without one
    if not (math.isfinite(achieved_step_s) and achieved_step_s > 0):
        return None

    doc = decode_field(comment)
    pred = recorded_prediction(doc)
    if pred is None or doc is None:
        return None
    raw = doc["pred"]
    v = VsPredicted(gpu=_word(raw.get("gpu"), "unknown"), world=gpus,
                    achieved_step_s=achieved_step_s, prediction=pred,
                    layout=_word(raw.get("layout"), "the planned layout"))
    if not v.flagged or "arch" not in raw:
        return v  # the track record only words the note of a flagged job
    from slurmpod.perf.track import load, recorded_track  # lazy: start-up

    runs = load()
    record = recorded_track(raw["arch"], v.gpu, runs) if runs else None
    return replace(v, track=record) if record is not None else v
