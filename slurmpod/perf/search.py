"""Layout search: every Megatron layout of a model on a fixed allocation, pruned by memory,
ranked by the performance model's predicted step time (`slurmpod plan --search`).

The space: TP dividing the NVLink domain (and the heads, query groups and FFN), CP a power of
two dividing seq_length / 2, PP dividing the layers, VPP dividing the layers per stage, EP
dividing the experts with ETP 1 or TP, micro-batch sizes whose DP x micro-batch divides the
global batch, and selective or full recompute (full only where selective does not fit: it is
never faster). Memory is slurmpod's estimate (slurmpod.megatron.memory), the same `plan` uses.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from slurmpod.megatron.memory import activation_bytes, weight_and_optimizer_bytes
from slurmpod.megatron.runspec import ModelConfig
from slurmpod.perf.model import Efficiency, Hardware, Prediction, RunOptions, predict

MICRO_BATCH_SIZES = (1, 2, 4, 8)
MAX_CP = 32


@dataclass(frozen=True)
class Candidate:
    config: ModelConfig
    memory_bytes: float
    fits: bool
    prediction: Prediction

    def layout(self) -> dict[str, Any]:
        c = self.config
        return {"tensor_model_parallel_size": c.tp, "context_parallel_size": c.cp,
                "pipeline_model_parallel_size": c.pp,
                "virtual_pipeline_model_parallel_size": c.vpp,
                "expert_model_parallel_size": c.ep, "expert_tensor_parallel_size": c.etp}

    def megatron_keys(self) -> dict[str, Any]:
        """The run-spec `[megatron]` keys that select this candidate."""
        c = self.config
        keys: dict[str, Any] = {k: v for k, v in self.layout().items()
                                if v is not None and (c.is_moe or not k.startswith("expert"))}
        keys["sequence_parallel"] = c.tp > 1
        keys["micro_batch_size"] = c.micro_batch_size
        keys["recompute_granularity"] = c.recompute_granularity
        if c.recompute_granularity == "full":
            keys["recompute_method"] = c.recompute_method
            keys["recompute_num_layers"] = c.recompute_num_layers
        return keys

    def to_json(self) -> dict[str, Any]:
        c = self.config
        return {"layout": self.layout(), "micro_batch_size": c.micro_batch_size,
                "recompute_granularity": c.recompute_granularity, "fits": self.fits,
                "memory_bytes_per_gpu": self.memory_bytes,
                "prediction": self.prediction.to_json()}


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def layouts(base: ModelConfig, world: int, domain_gpus: int
            ) -> list[tuple[int, int, int, int | None, int, int]]:
    """(tp, cp, pp, vpp, ep, etp) of every valid layout of `base`'s model on `world` GPUs."""
    c = base
    tps = [t for t in _divisors(domain_gpus)
           if c.num_attention_heads % t == 0
           and (c.multi_latent_attention or c.num_query_groups % t == 0)
           and (c.num_moe_layers == c.num_layers or c.ffn_hidden_size % t == 0)]
    cps = [x for x in (1, 2, 4, 8, 16, MAX_CP) if c.seq_length % (2 * x) == 0 or x == 1]
    pps = _divisors(c.num_layers)
    uneven = c.first_stage_layers is not None or c.last_stage_layers is not None
    if uneven and c.pp not in pps:
        pps.append(c.pp)
    experts = c.num_experts or 1
    out: list[tuple[int, int, int, int | None, int, int]] = []
    for tp in tps:
        for cp in cps:
            if world % (tp * cp):
                continue
            for pp in pps:
                if world % (tp * cp * pp):
                    continue
                if pp == c.pp and uneven:
                    vpps: list[int | None] = [c.vpp]
                elif pp > 1:
                    per = c.num_layers // pp
                    vpps = [None, *(v for v in _divisors(per) if v > 1)]
                else:
                    vpps = [None]
                if c.is_moe:
                    moe = [(ep, etp) for etp in sorted({1, tp}) for ep in _divisors(experts)
                           if world % (etp * ep * pp) == 0]
                else:
                    moe = [(1, tp)]
                for vpp in vpps:
                    for ep, etp in moe:
                        out.append((tp, cp, pp, vpp, ep, etp))
    return out


def search(base: ModelConfig, world: int, hw: Hardware, usable_bytes: float,
           eff: Efficiency | None = None, opts: RunOptions | None = None,
           top: int | None = 10) -> tuple[list[Candidate], int]:
    """The fastest `top` candidates (all when None) that fit, sorted by predicted step time,
    and how many layouts were evaluated. When none fits, the least memory-hungry ones, marked
    `fits = False`, so the caller can say by how much."""
    gbs = base.global_batch_size or 0
    fitting: list[Candidate] = []
    closest: list[Candidate] = []
    n = 0
    for tp, cp, pp, vpp, ep, etp in layouts(base, world, hw.domain_gpus):
        dp = world // (tp * cp * pp)
        for mbs in MICRO_BATCH_SIZES:
            if gbs % (mbs * dp):
                continue
            nmb = gbs // (mbs * dp)
            if vpp and nmb < pp:
                continue
            for gran in ("selective", "full"):
                n += 1
                c = dataclasses.replace(
                    base, tp=tp, cp=cp, pp=pp, vpp=vpp, ep=ep, etp=etp, micro_batch_size=mbs,
                    sequence_parallel=tp > 1, recompute_granularity=gran,
                    recompute_method="uniform" if gran == "full" else None,
                    recompute_num_layers=1 if gran == "full" else None,
                    first_stage_layers=base.first_stage_layers if pp == base.pp else None,
                    last_stage_layers=base.last_stage_layers if pp == base.pp else None)
                mem = (weight_and_optimizer_bytes(c, world).bytes_per_gpu
                       + activation_bytes(c, world).bytes_per_gpu)
                fits = mem <= usable_bytes
                if not fits and fitting:
                    continue
                pred = predict(c, world, hw, eff, opts)
                if pred is None:
                    break
                cand = Candidate(c, mem, fits, pred)
                if fits:
                    fitting.append(cand)
                    break  # full recompute is never faster than selective
                closest.append(cand)
    if fitting:
        fitting.sort(key=lambda x: x.prediction.step_time_s)
        return (fitting if top is None else fitting[:top]), n
    closest.sort(key=lambda x: x.memory_bytes)
    return (closest if top is None else closest[:top]), n
