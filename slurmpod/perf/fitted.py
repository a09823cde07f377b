"""The performance model's fitted coefficients, each with the published points it was fitted
on (docs/perf-model.md, Calibration).

`slurmpod.perf.calibrate` fits them (`fit_generation`, `fit_host_forward`) on the rows marked
`calibration` in tests/data/perf/published.toml, at most two per GPU generation;
tests/unit/perf/test_validation.py refits them and checks these values. Every other coefficient
of the model is chosen from hardware behaviour (slurmpod.perf.model) and not tuned to the
validation table.
"""

from __future__ import annotations

from dataclasses import dataclass

# Host time to launch one MoE layer's forward in FP8 (Transformer Engine), seconds per
# microbatch, without CUDA graphs. The alltoall and flex dispatchers copy the token counts to
# the host once per MoE layer forward (Megatron core 0.15 `_maybe_dtoh_and_synchronize`: the
# all-to-all splits and the grouped GEMM's m_splits are host lists), so the host cannot run
# ahead of the GPU across layers, and a te.Linear takes the host over twice as long to launch
# in FP8 as in BF16 (quantizers, scale bookkeeping; TransformerEngine issue 761: an FP8
# forward 140 ms against 77 ms in BF16, the GPU idle, the backward not). Such a forward takes
# at least this long. Fitted (`slurmpod.perf.calibrate.fit_host_forward`) on the row marked
# `fits = "host"` in tests/data/perf/published.toml; BF16 MoE rows show no such floor (Qwen3
# 235B BF16 on GB200 runs a whole MoE layer-microbatch in 8.6 ms). The figure is for that row's
# layer, standard attention and routed experts: slurmpod.perf.model's
# ATTENTION_FP8_MODULES + EXPERT_FP8_MODULES.
MOE_FP8_HOST_FORWARD_S = 5.0428e-3
HOST_FORWARD_FITTED_ON = "bridge2606-h100-qwen3-30b-fp8"


@dataclass(frozen=True, slots=True)
class Efficiency:
    """Fitted per GPU generation: share of the dense peak large GEMMs reach; and (one figure
    for all generations, the host's) the FP8 MoE forward's launch time, for a layer of standard
    attention and routed experts (MOE_FP8_HOST_FORWARD_S)."""

    gemm: float  # BF16/FP16 GEMMs, share of the BF16 peak
    fp8: float  # FP8 GEMMs (Transformer Engine), share of the FP8 peak
    fitted_on: str = ""
    moe_fp8_host_forward_s: float = MOE_FP8_HOST_FORWARD_S


# Fitted by `slurmpod.perf.calibrate.fit_generation` (module docstring).
FITTED: dict[str, Efficiency] = {
    "ampere": Efficiency(0.6912, 0.6912, "narayanan2021-t1-145_6b"),
    "hopper": Efficiency(0.6238, 0.6238, "bridge2511-h100-llama3-70b-fp8"),
    "blackwell": Efficiency(0.6094, 0.5047, "bridge2511-gb200-llama31-405b-fp8, "
                                            "bridge2511-gb200-qwen3-235b-bf16"),
    "gb300": Efficiency(0.7622, 0.6208, "bridge2511-gb300-llama31-405b-fp8, "
                                        "bridge2511-gb300-qwen3-235b-bf16"),
    "emulated": Efficiency(1.0, 1.0, "the sandbox's measured matmul peak"),
}
DEFAULT_EFFICIENCY = FITTED["hopper"]
