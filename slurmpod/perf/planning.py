"""The performance model as `slurmpod plan` uses it: a run spec + site -> prediction or search.

The efficiency factors are the site's own when `slurmpod calibrate` stored some beside the site
file, else the published fit of the GPU's generation (slurmpod.perf.fitted.FITTED); so is the
runtime memory reserve (`site_reserve`) when the site's jobs measured it.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from slurmpod.megatron.runspec import ModelConfig, RunSpec
from slurmpod.perf.fitted import DEFAULT_EFFICIENCY, FITTED, Efficiency
from slurmpod.perf.hardware import Hardware, hardware_from_site
from slurmpod.perf.model import Prediction, predict
from slurmpod.perf.moe import CHECKED_EXPERTS_PER_GPU, unchecked_experts
from slurmpod.perf.options import RunOptions
from slurmpod.perf.store import load_site_efficiency, load_site_reserve
from slurmpod.perf.track import Track, architecture, architecture_id, load, track

if TYPE_CHECKING:
    from slurmpod.megatron.memory import MeasuredReserve
    from slurmpod.model.site import Site
    from slurmpod.perf.search import Candidate


def site_factors(hw: Hardware, site_path: Path | None) -> tuple[Efficiency, bool]:
    """The factors a prediction on the site uses, and whether they are the site's own
    (`slurmpod calibrate`) rather than the built-in fit the track record's errors are of."""
    own = load_site_efficiency(site_path, hw.generation)
    if own is not None:
        return own, True
    return FITTED.get(hw.generation, DEFAULT_EFFICIENCY), False


def site_efficiency(hw: Hardware, site_path: Path | None) -> Efficiency:
    return site_factors(hw, site_path)[0]


def site_reserve(site: Site, site_path: Path | None) -> MeasuredReserve | None:
    """The runtime memory reserve `slurmpod calibrate` measured on the site's GPU, if any."""
    return load_site_reserve(site_path, site.node_types[site.su_groups[0].node_type].gpu.model)


def predict_run(spec: RunSpec, site: Site, nodes: int, site_path: Path | None = None
                ) -> Prediction | None:
    """The predicted iteration of `spec` on `nodes` nodes of `site` (None without a batch)."""
    hw = hardware_from_site(site)
    c = ModelConfig.from_args(spec.megatron)
    return predict(c, nodes * hw.gpus_per_node, hw, site_efficiency(hw, site_path),
                   run_options(spec))


def run_options(spec: RunSpec) -> RunOptions:
    """The Megatron settings of `spec` the model reads (`RunOptions.switches` names them)."""
    return RunOptions.from_args(spec.megatron.values())


def switches(spec: RunSpec) -> list[str]:
    """The Megatron settings of `spec` the prediction counts, by Megatron's names."""
    return run_options(spec).switches(ModelConfig.from_args(spec.megatron))


def search_run(spec: RunSpec, site: Site, nodes: int, usable_bytes: float,
               site_path: Path | None = None, top: int | None = 10, room: bool = False,
               checked: bool = False) -> tuple[list[Candidate], int]:
    """`search` over the run's model on `nodes` of the site (`room`: only candidates that fit
    with room, as `plan --search --headroom` asks; `checked`: only layouts within the checked
    experts per GPU, `--checked`)."""
    from slurmpod.perf.search import search  # lazy: start-up (plan without --search)

    hw = hardware_from_site(site)
    c = ModelConfig.from_args(spec.megatron)
    args = spec.megatron.values()
    vocab = None
    if args.get("padded_vocab_size") is None and args.get("vocab_size") is not None:
        vocab = (int(args["vocab_size"]), int(args.get("make_vocab_size_divisible_by") or 128))
    return search(c, nodes * hw.gpus_per_node, hw, usable_bytes, site_efficiency(hw, site_path),
                  run_options(spec), top, vocab, room, checked)


def experts_beyond_checked(spec: RunSpec) -> int | None:
    """The run's routed experts per GPU when more than any published run the performance
    model is checked on (`slurmpod.perf.moe.CHECKED_EXPERTS_PER_GPU`), else None."""
    return unchecked_experts(ModelConfig.from_args(spec.megatron))


def track_record(spec: RunSpec, site: Site, site_path: Path | None = None) -> Track | None:
    """How the prediction did on published runs of the run's model architecture, on any GPU
    and on the site's (slurmpod.perf.track), and whether the site's own calibration replaces
    the built-in factors those errors are of; None without a readable record."""
    runs = load()
    if not runs:
        return None
    hw = hardware_from_site(site)
    own = site_factors(hw, site_path)[1]
    return track(ModelConfig.from_args(spec.megatron), hw.gpu_model, runs, own)


def recorded_architecture(spec: RunSpec, site: Site, site_path: Path | None = None) -> str:
    """The id of the run's architecture (`slurmpod.perf.track.architecture_id`) its submit
    Comment records, so the fleet report can quote the track record as the job report does:
    only where published runs of it are in the record and the prediction uses the built-in
    factors those errors are of (not the site's own calibration); else ""."""
    runs = load()
    if not runs or site_factors(hardware_from_site(site), site_path)[1]:
        return ""
    arch = architecture(ModelConfig.from_args(spec.megatron))
    return architecture_id(arch) if any(r.architecture == arch for r in runs) else ""


def unchecked_words(local: str) -> str:
    """What `plan` and its search say of `local` experts per GPU beyond the checked range."""
    return (f"{local} experts per GPU, more than any published run the model is checked on "
            f"({CHECKED_EXPERTS_PER_GPU}): its terms for many small expert GEMMs are unchecked "
            "there")


def unchecked_line(local: int) -> str:
    """`plan`'s line for a run whose layout holds `local` experts per GPU beyond the range."""
    return unchecked_words(str(local)) + "; a short trial run decides"


def host_line(p: Prediction) -> str | None:
    """`plan`'s line for a step that waits on the host, or None."""
    if not p.host_bound:
        return None
    host = p.breakdown_s["host"]
    return (f"{host:.3g} s of the {p.step_time_s:.3g} s step is the FP8 MoE layers' forward "
            "waiting on the host's kernel launches; capturing the iteration as one CUDA graph "
            "(cuda_graph_impl = \"full_iteration\", Megatron-LM main) or a larger micro-batch "
            "removes it; graphs of each layer's attention (cuda_graph_impl = "
            "\"transformer_engine\", cuda_graph_scope = [\"attn\", \"moe_router\", "
            "\"moe_preprocess\"]) shorten it")


def _tflops_text(v: float) -> str:
    """Whole TFLOP/s for a GPU, three significant figures for the sandbox's emulated one
    (a CPU's fraction of a TFLOP/s)."""
    return f"{v:,.0f}" if v >= 100 else f"{v:.3g}"


def summary_line(p: Prediction) -> str:
    b = p.breakdown_s
    comm = ", ".join(f"{k} {b[k]:.3g}" for k in ("tp", "cp", "ep", "dp", "pp_p2p") if b[k] > 0)
    return (f"{p.step_time_s:.3g} s/iteration, {p.tokens_per_s_per_gpu:,.0f} tokens/s/GPU, "
            f"{_tflops_text(p.model_tflops_per_gpu)} TFLOP/s/GPU, MFU {p.mfu:.0%} (compute "
            f"{b['compute']:.3g} s, "
            + (f"host {b['host']:.3g} s, " if b.get("host", 0.0) > 0 else "")
            + (f"activation offload {b['offload']:.3g} s, " if b.get("offload", 0.0) > 0 else "")
            + f"bubble {b['pp_bubble']:.3g} s, exposed communication "
            f"{b['exposed_communication']:.3g} s" + (f": {comm}" if comm else "")
            + f", optimizer {b['optimizer']:.2g} s)")
