"""Layout search: every Megatron layout of a model on a fixed allocation, pruned by memory,
ranked by the performance model's predicted step time (`slurmpod plan --search`).

The space: TP dividing the NVLink domain (and the heads, query groups and FFN), CP a power of
two dividing seq_length / 2, PP dividing world / (TP x CP) and at most the layers, VPP whose
chunks hold at least one layer, EP dividing the experts with EP x ETP inside the NVLink domain
or a whole number of domains, micro-batch sizes whose DP x micro-batch divides the global
batch (with VPP, into microbatches the interleaved schedule accepts: a multiple of PP). A
PP x VPP the layers do not divide gets the split Megatron accepts for it
(`account_for_embedding/loss_in_pipeline_split`, else a balanced
`pipeline_model_parallel_layout`, slurmpod.megatron.validate.split_fix); the run's own split is
kept for its own PP x VPP. Each candidate carries the run's precision and recipe settings (FP8,
grad_reduce_in_bf16, dropout, overlap flags: everything but the layout keys), but for the EP
overlap, the TP communication overlap, DeepEP and per-layer CUDA graphs where Megatron refuses
them (EP 1, PP without VPP, full recompute; TP 1; EP x ETP 1; full recompute): the candidate
runs and is written without them (the alltoall dispatcher for DeepEP), `switches_off`);
recompute climbs
a ladder, the run's own setting included, from none to full, and the first rung that fits is
kept (a later rung is never faster). Memory is slurmpod's per-rank estimate
(slurmpod.megatron.memory.peak_memory, what `plan` checks), weights computed once per layout.
"""

from __future__ import annotations

import dataclasses
import heapq
from dataclasses import dataclass
from typing import Any

from slurmpod.megatron.memory import fits_tightly, rank_activation_bytes, rank_weight_bytes
from slurmpod.megatron.pipeline import balanced_layout
from slurmpod.megatron.runspec import ModelConfig, padded_vocab_size
from slurmpod.megatron.validate import (
    EP_OVERLAP,
    FLEX_DISPATCHER,
    LAYER_GRAPHS,
    TP_COMM_OVERLAP,
    interleave_error,
    refused_switches,
)
from slurmpod.perf.fitted import DEFAULT_EFFICIENCY, FITTED, Efficiency
from slurmpod.perf.hardware import Hardware
from slurmpod.perf.micro import layer_costs
from slurmpod.perf.model import Prediction, predict
from slurmpod.perf.moe import local_experts_beyond_checked, unchecked_experts
from slurmpod.perf.options import RunOptions

MICRO_BATCH_SIZES = (1, 2, 4, 8)
MAX_CP = 32
# Interleaving deeper than this many virtual stages per rank only adds p2p and launch cost.
MAX_VPP = 24


# Candidates predicted within this share of the fastest are inside the model's own error: its
# median |error| on published runs is 7.7 % on dense rows (docs/perf-model.md, Validation), so
# the prediction cannot order them; a short trial run can.
WITHIN_MODEL_ERROR = 0.10


@dataclass(frozen=True)
class Candidate:
    config: ModelConfig
    memory_bytes: float
    fits: bool
    prediction: Prediction
    # The run's switches Megatron refuses with this layout or recompute (the EP overlap, the
    # TP communication overlap: slurmpod.megatron.validate.refused_switches): predicted, and
    # written, without them.
    switches_off: tuple[str, ...] = ()
    # Fits by less than the memory estimate's shortfall on published peaks (ESTIMATE_LOW_BY):
    # it may run out of memory, as `plan` warns.
    tight: bool = False

    @property
    def unchecked_experts(self) -> int | None:
        """Its experts per GPU, when more than any published run the model is checked on."""
        return unchecked_experts(self.config)

    def layout(self) -> dict[str, Any]:
        c = self.config
        return {"tensor_model_parallel_size": c.tp, "context_parallel_size": c.cp,
                "pipeline_model_parallel_size": c.pp,
                "virtual_pipeline_model_parallel_size": c.vpp,
                "expert_model_parallel_size": c.ep, "expert_tensor_parallel_size": c.etp}

    def megatron_keys(self) -> dict[str, Any]:
        """The run-spec `[megatron]` keys that select this candidate (None: leave the key out,
        so a split argument of the original spec does not survive into another layout)."""
        c = self.config
        keys: dict[str, Any] = {k: v for k, v in self.layout().items()
                                if v is not None and (c.is_moe or not k.startswith("expert"))}
        keys["sequence_parallel"] = c.tp > 1
        keys["micro_batch_size"] = c.micro_batch_size
        keys["recompute_granularity"] = c.recompute_granularity
        keys["recompute_modules"] = (list(c.recompute_modules)
                                     if c.recompute_granularity == "selective" else None)
        if c.recompute_granularity == "full":
            keys["recompute_method"] = c.recompute_method
            keys["recompute_num_layers"] = c.recompute_num_layers
        keys["cpu_offloading_num_layers"] = c.cpu_offloading_num_layers or None
        keys["pipeline_model_parallel_layout"] = c.pipeline_layout
        if c.pipeline_layout is not None:
            keys.pop("virtual_pipeline_model_parallel_size", None)  # the layout implies it
        keys["account_for_embedding_in_pipeline_split"] = c.account_for_embedding or None
        keys["account_for_loss_in_pipeline_split"] = c.account_for_loss or None
        keys["decoder_first_pipeline_num_layers"] = c.first_stage_layers
        keys["decoder_last_pipeline_num_layers"] = c.last_stage_layers
        for switch in self.switches_off:
            keys |= _SWITCHED_OFF[switch]
        return keys

    def to_json(self) -> dict[str, Any]:
        c = self.config
        return {"layout": self.layout(), "micro_batch_size": c.micro_batch_size,
                "recompute_granularity": c.recompute_granularity, "fits": self.fits,
                "memory_bytes_per_gpu": self.memory_bytes,
                "pipeline_split": _split_name(c),
                "switches_off": list(self.switches_off), "tight_memory": self.tight,
                "unchecked_experts_per_gpu": self.unchecked_experts,
                "prediction": self.prediction.to_json()}


def _split_name(c: ModelConfig) -> str:
    if c.pipeline_layout is not None:
        return f"pipeline_model_parallel_layout {c.pipeline_layout}"
    if c.account_for_embedding or c.account_for_loss:
        return "embedding/loss slots"
    if c.first_stage_layers is not None or c.last_stage_layers is not None:
        return "decoder_first/last_pipeline_num_layers"
    return "even"


_FIELDS = tuple(f.name for f in dataclasses.fields(ModelConfig))


def _with(c: ModelConfig, **changes: Any) -> ModelConfig:
    """dataclasses.replace without its per-field checks (a third of the search's time)."""
    return ModelConfig(*[changes[n] if n in changes else getattr(c, n) for n in _FIELDS])


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


_NO_SPLIT: dict[str, Any] = {"first_stage_layers": None, "last_stage_layers": None,
                             "account_for_embedding": False, "account_for_loss": False,
                             "pipeline_layout": None, "vpp_given": None}


def _split_args(base: ModelConfig, pp: int, vpp: int | None) -> dict[str, Any] | None:
    """The split arguments that make Megatron accept `pp` x `vpp` for `base`'s layers (the
    run's own for its own PP x VPP), or None when no split does."""

    if pp == base.pp and vpp == base.vpp:
        own = {k: getattr(base, k) for k in _NO_SPLIT}
        if not base.pipeline_split().errors:
            return own
    L, v = base.num_layers, vpp or 1
    if L % (pp * v) == 0:
        return dict(_NO_SPLIT)
    trial = dataclasses.replace(base, pp=pp, vpp=vpp, **_NO_SPLIT)
    for emb, loss in ((True, True), (False, True), (True, False)):
        if (L + emb + loss) % (pp * v) == 0:
            args = _NO_SPLIT | {"account_for_embedding": emb, "account_for_loss": loss}
            if not dataclasses.replace(trial, **args).pipeline_split().errors:
                return args
    if pp == 1:
        return None
    layout = balanced_layout(L, pp, v, base.mtp_num_layers)
    if layout is None:
        return None
    args = _NO_SPLIT | {"pipeline_layout": layout}
    if dataclasses.replace(trial, **args).pipeline_split().errors:
        return None
    return args


def _split_choice(base: ModelConfig, pp: int, vpp: int | None, loss_layers: float
                  ) -> dict[str, Any] | None:
    """The split to predict at `pp` x `vpp`: the one Megatron accepts by default
    (`_split_args`) or, when it leaves a slower slowest stage, the balanced layout that gives
    the embedding and the loss a layer slot each. The rank holding the loss also runs the
    output layer and cross-entropy (`loss_layers` layer-times), and the slowest stage sets the
    pipeline's pace: NVIDIA pins such a layout for Llama 3 70B at PP8 x VPP5 (Megatron-Bridge's
    H100 FP8 recipe, "Et*2|(t*2|)*34,t*3|(t*2|)*3,tL")."""

    first = _split_args(base, pp, vpp)
    if pp == 1 or (first is not None and (first["pipeline_layout"] is not None
                                          or first["account_for_loss"])):
        return first
    layout = balanced_layout(base.num_layers, pp, vpp or 1, base.mtp_num_layers)
    if layout is None:
        return first
    args = _NO_SPLIT | {"pipeline_layout": layout}
    trial = dataclasses.replace(base, pp=pp, vpp=vpp, **args)
    if trial.pipeline_split().errors:
        return first
    if first is None:
        return args

    def slowest(c: ModelConfig) -> float:
        return max(sum(ch.decoder + ch.mtp + (loss_layers if ch.loss else 0.0) for ch in r)
                   for r in c.pipeline_split().chunks)

    even = dataclasses.replace(base, pp=pp, vpp=vpp, **first)
    return args if slowest(trial) < slowest(even) else first


def _loss_layers(base: ModelConfig, hw: Hardware, eff: Efficiency | None) -> float:
    """The output layer and loss in layer-times: their multiply-adds over a layer's, times how
    much slower the BF16 output GEMM runs than the layers' GEMMs (FP8 with Transformer Engine)."""

    k = layer_costs(base)
    layer = k.attn_linear + k.attn_core + (
        k.n_dense * k.mlp_dense + k.n_moe * (k.moe_routed + k.moe_shared)) / max(
        1, k.n_dense + k.n_moe)
    e = eff or FITTED.get(hw.generation, DEFAULT_EFFICIENCY)
    slow = 1.0
    if base.fp8 is not None and hw.peak_fp8:
        slow = hw.peak_fp8 * e.fp8 / (hw.peak_bf16 * e.gemm)
    return k.logits * (1 + base.mtp_num_layers) / max(layer, 1.0) * slow


def _vpps(base: ModelConfig, pp: int) -> list[int | None]:
    """Virtual stage counts worth trying at `pp`: every count whose chunks split the layers
    (with or without the embedding/loss slots) evenly, up to MAX_VPP, and the run's own."""
    if pp == 1:
        return [None]
    L = base.num_layers
    out: set[int] = set()
    for slots in (L, L + 1, L + 2, L + 2 + base.mtp_num_layers):
        per = -(-slots // pp)  # ceil: a balanced layout evens the rest out
        out.update(v for v in _divisors(per) if 1 < v <= MAX_VPP and pp * v <= L)
    vs: list[int | None] = [None, *sorted(out)]
    if pp == base.pp and base.vpp not in vs:
        vs.append(base.vpp)
    return vs


def layouts(base: ModelConfig, world: int, domain_gpus: int
            ) -> list[tuple[int, int, int, int | None, int, int]]:
    """(tp, cp, pp, vpp, ep, etp) of every valid layout of `base`'s model on `world` GPUs."""
    return [lay for lay, _ in _layouts(base, world, domain_gpus, 1.0)]


def _ep_fits_domain(span: int, domain: int) -> bool:
    """An expert group (EP x ETP GPUs) lies inside one NVLink domain or spans whole ones."""
    return span <= domain or span % domain == 0


def _layouts(base: ModelConfig, world: int, domain_gpus: int, loss_layers: float = 0.0
             ) -> list[tuple[tuple[int, int, int, int | None, int, int], dict[str, Any]]]:
    c = base
    tps = [t for t in _divisors(domain_gpus)
           if c.num_attention_heads % t == 0
           and (c.multi_latent_attention or c.num_query_groups % t == 0)
           and (c.num_moe_layers == c.num_layers or c.ffn_hidden_size % t == 0)]
    cps = [x for x in (1, 2, 4, 8, 16, MAX_CP) if c.seq_length % (2 * x) == 0 or x == 1]
    experts = c.num_experts or 1
    splits: dict[tuple[int, int | None], dict[str, Any] | None] = {}
    out: list[tuple[tuple[int, int, int, int | None, int, int], dict[str, Any]]] = []
    for tp in tps:
        for cp in cps:
            if world % (tp * cp):
                continue
            for pp in _divisors(world // (tp * cp)):
                if pp > c.num_layers:
                    break
                if c.is_moe:
                    moe = [(ep, etp) for etp in sorted({1, tp}) for ep in _divisors(experts)
                           if world % (etp * ep * pp) == 0
                           and _ep_fits_domain(ep * etp, domain_gpus)]
                else:
                    moe = [(1, tp)]
                for vpp in _vpps(c, pp):
                    key = (pp, vpp)
                    if key not in splits:
                        splits[key] = _split_choice(c, pp, vpp, loss_layers)
                    args = splits[key]
                    if args is None:
                        continue
                    for ep, etp in moe:
                        out.append(((tp, cp, pp, vpp, ep, etp), args))
    return out


# The RunOptions fields of each layout-bound switch (slurmpod.megatron.validate), the first
# saying whether the run has it on, all off without it; and the `[megatron]` keys a candidate
# without it is written with (None: left out).
_SWITCH_FIELDS = {EP_OVERLAP: ("ep_overlap",), TP_COMM_OVERLAP: ("tp_comm_overlap",),
                  FLEX_DISPATCHER: ("moe_flex_needs_peers", "moe_flex"),
                  LAYER_GRAPHS: ("per_layer_graphs", "graphed_attention")}
_SWITCHED_OFF: dict[str, dict[str, Any]] = {
    EP_OVERLAP: {EP_OVERLAP: False, "delay_wgrad_compute": None},  # which needs the overlap
    TP_COMM_OVERLAP: {TP_COMM_OVERLAP: False},
    FLEX_DISPATCHER: {"moe_token_dispatcher_type": "alltoall",
                      "moe_flex_dispatcher_backend": None},
    LAYER_GRAPHS: {"cuda_graph_impl": None, "cuda_graph_scope": None,
                   "cuda_graph_modules": None},
}


def _switches_on(opts: RunOptions | None) -> tuple[str, ...]:
    if opts is None:
        return ()
    return tuple(s for s, fields in _SWITCH_FIELDS.items() if getattr(opts, fields[0]))


def _recompute_ladder(base: ModelConfig) -> list[dict[str, Any]]:
    """Recompute settings from the least to the most recompute, the run's own among them."""
    none = {"recompute_granularity": None, "recompute_method": None,
            "recompute_num_layers": None}
    sel = none | {"recompute_granularity": "selective", "recompute_modules": ("core_attn",)}
    own = {"recompute_granularity": base.recompute_granularity,
           "recompute_method": base.recompute_method,
           "recompute_num_layers": base.recompute_num_layers,
           "recompute_modules": base.recompute_modules}
    full = {"recompute_granularity": "full", "recompute_method": "uniform",
            "recompute_num_layers": 1}
    ladder: list[dict[str, Any]] = [none, sel]
    if base.recompute_granularity == "selective" and set(base.recompute_modules) - {"core_attn"}:
        ladder.append(own)
    ladder.append(full)
    return ladder


def search(base: ModelConfig, world: int, hw: Hardware, usable_bytes: float,
           eff: Efficiency | None = None, opts: RunOptions | None = None,
           top: int | None = 10, vocab: tuple[int, int] | None = None, room: bool = False,
           checked: bool = False) -> tuple[list[Candidate], int]:
    """The fastest `top` candidates (all when None) that fit, sorted by predicted step time,
    and how many layouts were evaluated. `vocab`: the run's (vocab_size,
    make_vocab_size_divisible_by) when it gives no padded size, so each TP pads it as Megatron
    does. `room`: a candidate fits only with room, by at least the memory estimate's shortfall
    (none is `tight`), so a layout that would fit tightly takes the next recompute rung that
    leaves room. `checked`: only layouts within `moe.CHECKED_EXPERTS_PER_GPU`. When none
    fits, the least memory-hungry ones, marked `fits = False`, to say by how much."""

    gbs = base.global_batch_size or 0
    fitting: list[Candidate] = []
    closest: list[Candidate] = []
    # With `top`, the top-th fastest step time so far (a max-heap of the fastest `top`): a
    # micro-batch whose least-recompute rung is predicted slower cannot enter the answer, so
    # its memory is never computed.
    best: list[float] = []
    ladder = _recompute_ladder(base)
    # Megatron refuses some of the run's switches with some layouts and recompute rungs: those
    # candidates run without them.
    on = _switches_on(opts)
    variants: dict[tuple[str, ...], RunOptions | None] = {(): opts}
    n = 0
    loss_layers = _loss_layers(base, hw, eff)
    for (tp, cp, pp, vpp, ep, etp), split_args in _layouts(base, world, hw.domain_gpus,
                                                           loss_layers):
        if checked and local_experts_beyond_checked(base.num_experts, ep):
            continue
        dp = world // (tp * cp * pp)
        pad = ({"padded_vocab_size": padded_vocab_size(vocab[0], vocab[1], tp)}
               if vocab else {})
        # Megatron offloads activations with PP 1 and no recompute only (TransformerConfig,
        # core 0.12 to main): other layouts and recompute rungs run without it.
        offload = base.cpu_offloading_num_layers if pp == 1 else 0
        lay = _with(base, tp=tp, cp=cp, pp=pp, vpp=vpp, ep=ep, etp=etp,
                    sequence_parallel=tp > 1, cpu_offloading_num_layers=offload,
                    **split_args, **pad)
        weights: list[Any] | None = None
        wmax: Any = None
        for mbs in MICRO_BATCH_SIZES:
            if gbs % (mbs * dp):
                continue
            nmb = gbs // (mbs * dp)
            if vpp and interleave_error(lay, nmb):
                continue
            if weights is None:
                weights = rank_weight_bytes(lay, world)
                wmax = max(weights, key=lambda w: w.bytes_per_gpu)
            fitted_rung = False
            bound: Prediction | None = None
            for i, rung in enumerate(ladder):
                n += 1
                c = _with(lay, micro_batch_size=mbs, **rung)
                if offload and c.recompute_granularity is not None:
                    c = _with(c, cpu_offloading_num_layers=0)
                off = refused_switches(c, on) if on else ()
                if off not in variants and opts is not None:
                    variants[off] = dataclasses.replace(
                        opts, **{f: False for s in off for f in _SWITCH_FIELDS[s]})
                o = variants[off]
                if i == 0 and top is not None and fitting:
                    bound = predict(c, world, hw, eff, o, weights=wmax)
                    if bound is None:
                        break
                    if len(best) >= top and bound.step_time_s >= -best[0]:
                        fitted_rung = True  # not an answer, but it says nothing of memory
                        break
                acts = rank_activation_bytes(c, world)
                mem = max(w.bytes_per_gpu + a.bytes_per_gpu
                          for w, a in zip(weights, acts, strict=True))
                tight = fits_tightly(mem, usable_bytes)
                fits = mem <= usable_bytes and not (room and tight)
                if not fits and fitting:
                    continue
                pred = bound if bound is not None and i == 0 else predict(
                    c, world, hw, eff, o, weights=wmax)
                if pred is None:
                    break
                cand = Candidate(c, mem, fits, pred, off, tight=tight)
                if fits:
                    fitting.append(cand)
                    if top is not None:
                        if len(best) < top:
                            heapq.heappush(best, -pred.step_time_s)
                        elif pred.step_time_s < -best[0]:
                            heapq.heapreplace(best, -pred.step_time_s)
                    fitted_rung = True
                    break  # more recompute is never faster
                closest.append(cand)
            if not fitted_rung:
                # Activation memory never falls with the micro-batch: a rank keeps
                # min(mbs x in-flight, GBS / DP x VPP) samples (1F1B and interleaved alike).
                break
    if fitting:
        fitting.sort(key=lambda x: x.prediction.step_time_s)
        return (fitting if top is None else fitting[:top]), n
    closest.sort(key=lambda x: x.memory_bytes)
    return (closest if top is None else closest[:top]), n


def fastest_per_layout(candidates: list[Candidate], top: int | None = None) -> list[Candidate]:
    """The fastest candidate of each parallel layout (TP, CP, PP, EP, ETP), in the order given
    (fastest first): a layout's other virtual-pipeline sizes, micro-batches and recompute are
    folded into its fastest, so the first `top` are that many different ways to split the
    model."""
    seen: set[tuple[int, int, int, int, int]] = set()
    out: list[Candidate] = []
    for cand in candidates:
        c = cand.config
        key = (c.tp, c.cp, c.pp, c.ep, c.etp)
        if key in seen:
            continue
        seen.add(key)
        out.append(cand)
        if top is not None and len(out) >= top:
            break
    return out
