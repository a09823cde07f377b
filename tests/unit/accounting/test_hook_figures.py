"""Figures of the hooks: live window and final summary, checked against hand arithmetic."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from slurmpod.accounting.figures import (
    SERIES_MAX_POINTS,
    LiveWindow,
    job_params,
    per_iteration,
    summarise_log,
)

SAMPLE = Path("/work/shared/data/megatron-logs/mixtral-8x7b-h100x16.log")


def iteration_line(i: int, n: int, ms: float, gbs: int = 128, ts: str | None = None,
                   tflops: float | None = None) -> str:
    head = f" [{ts}]" if ts else ""
    thr = f" throughput per GPU (TFLOP/s/GPU): {tflops:.1f} |" if tflops is not None else ""
    return (f"{head} iteration {i:8d}/{n:8d} | consumed samples: {i * gbs:12d} | elapsed time "
            f"per iteration (ms): {ms:.1f} |{thr} learning rate: 1.0E-05 | global batch size: "
            f"{gbs:5d} | lm loss: 2.0E+00 | loss scale: 1.0 | grad norm: 1.0 | number of skipped "
            f"iterations:   0 | number of nan iterations:   0 |\n")


# What the epilog learns from Slurm (AllocTRES gres/gpu) for these jobs of 2 nodes × 8 GPUs.
SLURM16 = {"alloc_gpus": 16, "gsrc": "slurm"}


def comment(**kw: object) -> str:
    base = {"slurmpod": "0.1.0", "fmt": 1, "run": "t", "flops_per_iter": 8.0e15,
            "peak_tflops": 1000.0, "gpus": 16, "formula": "megatron-core-0.14-main"}
    base.update(kw)
    return json.dumps(base)


def test_summary_matches_hand_arithmetic() -> None:
    # Warm-up rule (metrics.job_metrics): records covering the first 10 iterations are excluded.
    warm = [9000.0] * 10
    steady = [2000.0, 2500.0, 2000.0, 1600.0, 2000.0, 2400.0]
    times = warm + steady
    log = "".join(iteration_line(i + 1, 100, ms) for i, ms in enumerate(times)).encode()
    summary, series = summarise_log(log, {"comment": comment(), **SLURM16}, peak_tflops=1000.0)
    assert summary["iter_ms"] == float(np.median(steady)) == 2000.0
    # 8e15 FLOPs / 2.0 s / 16 GPUs = 250 TFLOP/s per GPU; MFU = 250 / 1000
    assert summary["tflops"] == pytest.approx(250.0)
    assert summary["mfu"] == pytest.approx(0.25)
    per_mfu = [8e15 / (ms / 1000) / 16 / 1e12 / 1000 for ms in steady]
    assert summary["mfu_p10"] == pytest.approx(np.percentile(per_mfu, 10))
    assert summary["mfu_p90"] == pytest.approx(np.percentile(per_mfu, 90))
    assert summary["iters"] == 16 and summary["last_iter"] == 16 and summary["restarts"] == 0
    assert summary["src"] == "comment" and summary["fv"] == "megatron-core-0.14-main"
    assert summary["gpus"] == 16 and summary["peak"] == 1000.0
    assert "tokens_per_s" not in summary or summary["tokens_per_s"] is None  # no seq_length
    # no timestamps in these lines and no Slurm start/end: nothing to divide goodput by
    assert summary["goodput"] is None
    assert series["iter"] == list(range(1, 17))
    assert series["steady"] == [False] * 10 + [True] * 6
    assert series["mfu"][-1] == pytest.approx(8e15 / 2.4 / 16 / 1e12 / 1000, abs=1e-5)


def test_goodput_uses_slurm_allocation_when_known() -> None:
    times = [1000.0] * 20  # 20 s of iterations
    log = "".join(iteration_line(i + 1, 100, ms) for i, ms in enumerate(times)).encode()
    summary, _ = summarise_log(log, {"comment": comment(), **SLURM16, "start_time": 1000,
                                     "end_time": 1040})
    # productive 20 s x 16 GPUs over an allocation of 40 s x 16 GPUs
    assert summary["goodput"] == pytest.approx(0.5)


def test_flops_from_arguments_dump_when_comment_has_none() -> None:
    args = {"num_layers": 2, "hidden_size": 256, "num_attention_heads": 4, "seq_length": 128,
            "max_position_embeddings": 128, "padded_vocab_size": 1024, "global_batch_size": 8,
            "micro_batch_size": 1, "world_size": 8}
    dump = ["------------------------ arguments ------------------------\n"]
    dump += [f"  {k} {'.' * (48 - len(k))} {v}\n" for k, v in args.items()]
    dump += ["-------------------- end of arguments ---------------------\n"]
    body = "".join(iteration_line(i, 10, 500.0, gbs=8) for i in range(1, 6))
    summary, _ = summarise_log(("".join(dump) + body).encode(),
                               {"comment": "", "alloc_gpus": 8}, peak_tflops=989.0)
    from slurmpod.megatron.flops import FLOPS_FORMULA_VERSION, flops_per_iteration

    flops = flops_per_iteration(args)
    assert summary["src"] == "args" and summary["fv"] == FLOPS_FORMULA_VERSION
    assert summary["tflops"] == pytest.approx(flops / 0.5 / 8 / 1e12)
    assert summary["mfu"] == pytest.approx(flops / 0.5 / 8 / 1e12 / 989.0)
    assert summary["tokens_per_s"] == pytest.approx(8 * 128 / 0.5)
    assert summary["peak"] == 989.0


def test_real_sample_without_flops_keeps_megatron_figure() -> None:
    if not SAMPLE.exists():
        pytest.skip("shared sample logs not present")
    summary, series = summarise_log(SAMPLE.read_bytes(), {"comment": ""})
    assert summary["iters"] == 3 and summary["last_iter"] == 73
    assert summary["src"] == "none" and "mfu" not in summary
    # the log starts mid-run (iteration 71, no launch seen): no warm-up is dropped
    assert summary["tflops_mlm"] == pytest.approx(np.median([243.6, 238.7, 224.0]))
    assert summary["iter_ms"] == pytest.approx(5470.7)
    assert series["tflops_mlm"] == [243.6, 238.7, 224.0]


def test_batch_ramp_up_scales_flops() -> None:
    p = job_params({"flops_per_iter": 1e15}, {"global_batch_size": 100, "seq_length": 10},
                   gpus=1, peak=1000)
    assert p.flops_at(50) == 5e14 and p.flops_at(None) == 1e15
    per = per_iteration(np.array([1000.0, 1000.0, 500.0]), np.array([50, 100, -1]), p)
    # 1e15 * 50/100 / 1 s / 1 GPU = 500 TFLOP/s; full batch 1000; unknown batch = planned, 0.5 s
    assert per["tflops"].tolist() == pytest.approx([500.0, 1000.0, 2000.0])
    assert per["mfu"].tolist() == pytest.approx([0.5, 1.0, 2.0])
    assert per["tokens_per_s"].tolist() == pytest.approx([500.0, 1000.0, 2000.0])
    # without the arguments dump the planned batch is unknown: every iteration counts 1e15
    q = job_params({"flops_per_iter": 1e15}, None, gpus=1)
    assert per_iteration(np.array([1000.0]), np.array([50]), q)["tflops"].tolist() == [1000.0]


def test_no_iterations_is_reported() -> None:
    summary, series = summarise_log(b"hello\nworld\n", {"comment": comment()})
    assert summary["err"] == "no-iterations" and summary["iters"] == 0 and series == {}


def test_series_is_bounded() -> None:
    log = "".join(iteration_line(i, 5000, 1000.0 + (i % 7)) for i in range(1, 3001)).encode()
    summary, series = summarise_log(log, {"comment": comment()})
    assert summary["iters"] == 3000
    assert len(series["iter"]) == SERIES_MAX_POINTS
    assert series["iter"][0] == 1 and series["iter"][-1] == 3000


def test_restart_segments_each_lose_their_warm_up() -> None:
    first = [iteration_line(i, 50, 9e3 if i <= 10 else 1e3) for i in range(1, 15)]
    # relaunch from iteration 12: its first record opens a new segment; warm-up again
    second = [iteration_line(i, 50, 8e3 if i <= 22 else 2e3) for i in range(13, 27)]
    summary, _ = summarise_log("".join(first + second).encode(), {"comment": comment()})
    assert summary["restarts"] == 1
    steady = [1e3] * 4 + [2e3] * 4  # 11..14 of the first launch, 23..26 of the second
    assert summary["iter_ms"] == pytest.approx(np.median(steady))


def test_live_window_median_and_bound() -> None:
    w = LiveWindow(size=4)
    w.add([(i, 1000.0 * (1 + (i == 3)), 128, math.nan) for i in range(1, 7)])
    assert len(w.rows) == 4  # iterations 3..6 kept
    # The live monitor reports the job's own view: the Comment's GPUs and peak count there.
    p = job_params({"flops_per_iter": 4e15, "gpus": 4, "peak_tflops": 1000}, None,
                   trust_comment=True)
    got = w.figures(p)
    # times 2000, 1000, 1000, 1000 -> median 1.0 s: 4e15 / 1 / 4 = 1000 TFLOP/s = MFU 1.0
    assert got == {"iter": 6, "tflops": pytest.approx(1000.0), "mfu": pytest.approx(1.0),
                   "peak": 1000}


def test_live_window_without_model_uses_megatron_figure() -> None:
    w = LiveWindow()
    w.add([(10, 900.0, 64, 300.0), (11, 950.0, 64, 310.0)])
    got = w.figures(job_params({}, None))
    assert got == {"iter": 11, "tflops": 305.0}
    assert LiveWindow().figures(job_params({}, None, peak=989)) == {"peak": 989}


def test_truncated_log_has_no_goodput() -> None:
    log = "".join(iteration_line(i + 1, 100, 1000.0) for i in range(20)).encode()
    job = {"comment": comment(), **SLURM16, "start_time": 1000, "end_time": 1040}
    assert summarise_log(log, job)[0]["goodput"] == pytest.approx(0.5)
    assert summarise_log(log, job, truncated=True)[0].get("goodput") is None


def test_requeued_attempt_leaves_goodput_to_the_report() -> None:
    # The appended log also holds earlier attempts, which this attempt's allocation did not pay for.
    log = "".join(iteration_line(i + 1, 100, 1000.0) for i in range(20)).encode()
    job = {"comment": comment(), **SLURM16, "start_time": 1000, "end_time": 1040}
    assert summarise_log(log, job)[0]["goodput"] == pytest.approx(0.5)
    assert summarise_log(log, {**job, "restart": 1})[0].get("goodput") is None


def test_forged_comment_cannot_set_gpus_or_peak() -> None:
    """The Comment is the job's: its `gpus` and `peak_tflops` never scale the epilog's figures."""
    times = [2000.0] * 16
    log = "".join(iteration_line(i + 1, 100, ms) for i, ms in enumerate(times)).encode()
    forged = comment(gpus=4096, peak_tflops=0.001, peak=0.001)
    summary, _ = summarise_log(log, {"comment": forged, **SLURM16}, peak_tflops=1000.0)
    assert summary["gpus"] == 16 and summary["peak"] == 1000.0
    assert summary["mfu"] == pytest.approx(0.25) and summary["implausible"] is None
    # no trusted GPU count or peak: no TFLOP/s and no MFU rather than the job's claim
    bare, _ = summarise_log(log, {"comment": forged})
    assert bare["gpus"] is None and bare["peak"] is None and "mfu" not in bare


def test_forged_flops_are_flagged_implausible() -> None:
    """FLOPs per iteration are the job's to state, so a forged figure is caught by range."""
    times = [2000.0] * 16
    log = "".join(iteration_line(i + 1, 100, ms) for i, ms in enumerate(times)).encode()
    summary, _ = summarise_log(log, {"comment": comment(flops_per_iter=8e18), **SLURM16},
                               peak_tflops=1000.0)
    # 8e18 / 2 s / 16 GPUs = 250 000 TFLOP/s per GPU: MFU 250 (25 000 %)
    assert summary["mfu"] == pytest.approx(250.0)
    assert summary["implausible"] == "mfu-over-100"


def test_fp8_run_reports_mfu_against_both_peaks() -> None:
    args = {"num_layers": 2, "hidden_size": 256, "num_attention_heads": 4, "seq_length": 128,
            "max_position_embeddings": 128, "padded_vocab_size": 1024, "global_batch_size": 8,
            "micro_batch_size": 1, "world_size": 8, "fp8": "hybrid"}
    dump = ["------------------------ arguments ------------------------\n"]
    dump += [f"  {k} {'.' * (48 - len(k))} {v}\n" for k, v in args.items()]
    dump += ["-------------------- end of arguments ---------------------\n"]
    body = "".join(iteration_line(i, 10, 500.0, gbs=8) for i in range(1, 6))
    summary, _ = summarise_log(("".join(dump) + body).encode(),
                               {"comment": "", "alloc_gpus": 8}, peak_tflops=989.0,
                               peak_fp8=1979.0)
    assert summary["peak"] == 989.0 and summary["peak_fp8"] == 1979.0
    assert summary["mfu_fp8"] == pytest.approx(summary["mfu"] * 989.0 / 1979.0)
    bf16 = dict(args, fp8="None")
    dump2 = [line for line in dump if " fp8 " not in line]
    dump2.insert(1, f"  fp8 {'.' * 45} {bf16['fp8']}\n")
    summary2, _ = summarise_log(("".join(dump2) + body).encode(),
                                {"comment": "", "alloc_gpus": 8}, peak_tflops=989.0,
                                peak_fp8=1979.0)
    assert "mfu_fp8" not in summary2 and summary2["mfu"] == pytest.approx(summary["mfu"])
