"""Cross-check on the real Mixtral 8x7B log: Megatron's printed TFLOP/s, an independent count of
the model's matrix multiplies, and slurmpod's FLOPs model.

The log (April 2024 release, `--log-throughput`) prints 243.6 TFLOP/s/GPU at 5361.6 ms on 16
GPUs. Counting every GEMM of one token by hand, without causal halving of core attention (that
release did not halve it), reproduces the printed numbers; slurmpod's formula (Megatron core
0.14 / main) halves the causal attention scores, so it is lower by exactly that term.
"""

from __future__ import annotations

import pytest

from slurmpod.accounting.logparse import parse_log
from slurmpod.accounting.metrics import flops_fn_for, job_metrics
from slurmpod.megatron.runspec import load_run
from tests.helpers import DATA_DIR

DATA = DATA_DIR / "megatron"

# Mixtral 8x7B (NVIDIA/Megatron-LM issue 756 arguments dump) and the log's job.
H, LAYERS, HEADS, KV_HEADS, HEAD_DIM = 4096, 32, 32, 8, 128
FFN, EXPERTS_PER_TOKEN, VOCAB, SEQ, BATCH, GPUS = 14336, 2, 32000, 2048, 128, 16


def forward_flops_per_token(causal_half: bool) -> float:
    """2 FLOPs per multiply-add, one token, forward only."""
    q_and_out = 2 * (2 * H * HEADS * HEAD_DIM)  # W_q and W_o
    k_and_v = 2 * (2 * H * KV_HEADS * HEAD_DIM)  # GQA: 8 KV heads
    scores_and_values = 2 * (2 * SEQ * HEADS * HEAD_DIM)  # QK^T and softmax(.)V over SEQ keys
    if causal_half:
        scores_and_values /= 2  # a token attends to the ones before it: SEQ/2 on average
    experts = EXPERTS_PER_TOKEN * 3 * (2 * H * FFN)  # SwiGLU: gate, up and down projections
    logits = 2 * H * VOCAB
    return LAYERS * (q_and_out + k_and_v + scores_and_values + experts) + logits


def iteration_flops(causal_half: bool) -> float:
    return 3 * forward_flops_per_token(causal_half) * SEQ * BATCH  # forward + 2x backward


@pytest.mark.parametrize(("ms", "printed"), [(5361.6, 243.6), (5470.7, 238.7), (5829.9, 224.0)])
def test_independent_count_reproduces_megatrons_printed_tflops(ms: float, printed: float) -> None:
    tflops = iteration_flops(causal_half=False) / (ms / 1000 * GPUS) / 1e12
    assert tflops == pytest.approx(printed, abs=0.05 + printed * 2e-5)  # printed to 0.1


def test_slurmpod_formula_differs_by_the_causal_half_of_attention() -> None:
    run = load_run(DATA / "mixtral-8x7b-h100x16.run.toml")
    flops_fn, version = flops_fn_for(run.megatron)
    ours = flops_fn(BATCH)
    assert ours == pytest.approx(iteration_flops(causal_half=True), rel=1e-9)
    ratio = ours / iteration_flops(causal_half=False)
    # The attention-score share of this model at 2048 tokens is small: 1 - 0.9798.
    assert ratio == pytest.approx(0.97979, abs=1e-5)
    assert version  # stored next to every figure


def test_mfu_on_the_real_log_with_its_ratio_to_megatrons_own() -> None:
    summary = parse_log((DATA / "mixtral-8x7b-h100x16.log").open("rb"))
    run = load_run(DATA / "mixtral-8x7b-h100x16.run.toml")
    flops_fn, version = flops_fn_for(run.megatron)
    m = job_metrics(summary, flops_fn, 989.0, GPUS, seq_length=SEQ, flops_formula=version)
    expected = iteration_flops(causal_half=True) / (5470.7 / 1000 * GPUS) / 1e12  # median record
    assert m.tflops_per_gpu is not None and m.tflops_per_gpu.median == pytest.approx(expected)
    assert m.mfu is not None and m.mfu.median == pytest.approx(expected / 989.0)
    assert m.reported_ratio == pytest.approx(expected / 238.7, rel=3e-4)
    assert m.tokens_per_s is not None
    assert m.tokens_per_s.median == pytest.approx(BATCH * SEQ / 5.4707)
