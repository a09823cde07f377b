"""The sandbox workload: Megatron's formats (checked with slurmpod's own Megatron log and
argument parsers), real FLOPs, exact resume from checkpoints, SIGTERM save-and-exit, idle ranks."""

from __future__ import annotations

import io
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from slurmpod.accounting.logparse import parse_log
from slurmpod.megatron.args import parse_arguments_dump
from slurmpod.megatron.flops import flops_per_iteration
from slurmpod.workload import megatron_emu as emu

TINY = ["--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4",
        "--seq-length", "32", "--micro-batch-size", "2", "--global-batch-size", "8",
        "--vocab-size", "256", "--log-interval", "1", "--log-throughput", "--lr", "1e-3",
        "--lr-warmup-iters", "2"]


def run_emu(argv: list[str], world: int = 1) -> tuple[str, emu.Trainer | None]:
    args, _ = emu.build_parser().parse_known_args(argv)
    dist = emu.Dist(rank=0, world_size=world, local_rank=0, job_id="77", step_id="0")
    args = emu.finish_args(args, dist)
    out = io.StringIO()
    assert emu.train(args, dist, out) == 0
    return out.getvalue(), None


def test_arguments_dump_is_megatrons_format_and_round_trips() -> None:
    out, _ = run_emu([*TINY, "--train-iters", "1", "--some-unknown-flag", "x"])
    lines = out.splitlines()
    start = lines.index("------------------------ arguments ------------------------")
    end = lines.index("-------------------- end of arguments ---------------------")
    rows = lines[start + 1:end]
    assert rows == sorted(rows, key=str.lower)
    for row in rows:
        name = row.split()[0]
        assert re.fullmatch(r"  \w+ \.+ .*", row) and row.index(" ", 2 + len(name)) == 2 + len(name)
        assert row[2 + len(name) + 1:].startswith("." * (48 - len(name)))
    parsed = parse_arguments_dump(out)
    assert parsed["num_layers"] == 2 and parsed["hidden_size"] == 64
    assert parsed["global_batch_size"] == 8 and parsed["seq_length"] == 32
    assert parsed["ffn_hidden_size"] == 256 and parsed["vocab_size"] == 256


def test_iteration_lines_parse_and_report_measured_throughput(tmp_path: Path) -> None:
    out, _ = run_emu([*TINY, "--train-iters", "4"], world=2)
    summary = parse_log(out.encode().splitlines(keepends=True))
    table = summary.iterations
    assert list(table.iteration) == [1, 2, 3, 4] and summary.n_rejected == 0
    assert list(table.consumed_samples) == [8, 16, 24, 32]
    assert list(table.global_batch_size) == [8] * 4
    # throughput per GPU = model FLOPs / (iteration time x world size), Megatron's definition
    args = emu.finish_args(emu.build_parser().parse_known_args([*TINY, "--train-iters", "4"])[0],
                           emu.Dist(0, 2, 0, "", "0"))
    flops = flops_per_iteration(dict(vars(args)))
    ms = np.asarray(table.elapsed_ms)
    expected = flops / (ms / 1e3) / 2 / 1e12
    # printed ms carry 0.1 ms (±0.05) and throughput 3 significant digits (±0.5 %)
    rtol = 0.05 / ms + 0.006
    assert np.all(np.abs(table.tflops_reported - expected) <= rtol * expected)
    losses = np.asarray(table.lm_loss)
    assert losses[-1] < losses[0] and np.all(np.isfinite(losses))
    stamp = re.search(r"\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{6})\] iteration", out)
    assert stamp is not None


def test_each_iteration_runs_this_ranks_share_of_the_model_flops() -> None:
    argv = [*TINY, "--train-iters", "1"]
    for world in (1, 4):
        args = emu.finish_args(emu.build_parser().parse_known_args(argv)[0],
                               emu.Dist(0, world, 0, "", "0"))
        flops = flops_per_iteration(dict(vars(args)))
        h = args.hidden_size
        rows = round(flops / world / (6 * h * h))
        trainer = emu.Trainer(args, rows)
        trainer.step()
        # three GEMMs of 2*rows*h*h each: within one row of the exact share
        assert trainer.flops_done == 6 * rows * h * h
        assert abs(trainer.flops_done - flops / world) <= 3 * h * h


def read_w(save: Path) -> np.ndarray:
    it = int((save / emu.TRACKER).read_text())
    with np.load(save / f"iter_{it:07d}" / "mp_rank_00" / "model_optim_rng.npz") as z:
        return z["w"]


def test_resume_continues_exactly(tmp_path: Path) -> None:
    straight, split = tmp_path / "straight", tmp_path / "split"
    out_a, _ = run_emu([*TINY, "--train-iters", "6", "--save", str(straight),
                        "--save-interval", "3"])
    out_first, _ = run_emu([*TINY, "--train-iters", "6", "--save", str(split),
                            "--save-interval", "3", "--exit-interval", "3"])
    assert (split / emu.TRACKER).read_text().strip() == "3"
    out_b, _ = run_emu([*TINY, "--train-iters", "6", "--save", str(split), "--load", str(split),
                        "--save-interval", "3"])
    assert "successfully loaded checkpoint from" in out_b and "at iteration 3" in out_b
    summary = parse_log(out_b.encode().splitlines(keepends=True))
    assert list(summary.iterations.iteration) == [4, 5, 6]
    assert list(summary.iterations.consumed_samples) == [32, 40, 48]
    np.testing.assert_array_equal(read_w(straight), read_w(split))
    def losses(text: str) -> dict[int, str]:
        return {int(m.group(1)): m.group(2)
                for m in re.finditer(r"iteration\s+(\d+)/.*?lm loss: (\S+) \|", text)}

    # the same data order and weights: the interrupted run logs the very same losses
    assert losses(out_a) == losses(out_first + out_b) and len(losses(out_a)) == 6
    assert sorted(p.name for p in split.iterdir()) == [
        "iter_0000003", "iter_0000006", emu.TRACKER, "progress.txt"]
    progress = (split / "progress.txt").read_text().splitlines()
    assert [ln.split("\t")[3] for ln in progress] == [
        "Starting job", "Saved checkpoint", "Starting job", "Saved checkpoint"]
    assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\tJob ID: 77\t# GPUs: 1\tSaved checkpoint"
                        r"\tIteration: 6\tJob throughput: \S+ TFLOP/s/GPU\tCumulative throughput:"
                        r" \S+ TFLOP/s/GPU\tFloating-point operations: \S+\t"
                        r"Tokens \(in billions\): 0\.00", progress[-1])


def test_missing_checkpoint_starts_from_scratch(tmp_path: Path) -> None:
    out, _ = run_emu([*TINY, "--train-iters", "1", "--load", str(tmp_path / "none")])
    assert "will not load any checkpoints" in out and "iteration        1/" in out


def test_failed_save_leaves_previous_checkpoint(tmp_path: Path, monkeypatch) -> None:
    args = emu.finish_args(emu.build_parser().parse_known_args([*TINY, "--train-iters", "2"])[0],
                           emu.Dist(0, 1, 0, "", "0"))
    trainer = emu.Trainer(args, 10)
    trainer.step()
    trainer.save(tmp_path)

    def boom(*a, **k):
        raise OSError("disk full")

    trainer.step()
    monkeypatch.setattr(emu.np, "savez", boom)
    with pytest.raises(OSError):
        trainer.save(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["iter_0000001", emu.TRACKER]
    assert (tmp_path / emu.TRACKER).read_text() == "1\n"


def test_rejects_indivisible_layout() -> None:
    args = emu.build_parser().parse_known_args(
        [*TINY, "--train-iters", "1", "--tensor-model-parallel-size", "3"])[0]
    with pytest.raises(SystemExit, match="not divisible"):
        emu.finish_args(args, emu.Dist(0, 8, 0, "", "0"))


def emu_cmd(*extra: str) -> list[str]:
    return [sys.executable, "-m", "slurmpod.workload.megatron_emu", *TINY, *extra]


def test_sigterm_saves_and_exits_then_resume_continues(tmp_path: Path) -> None:
    save = tmp_path / "ckpt"
    proc = subprocess.Popen(emu_cmd("--train-iters", "100000", "--save", str(save),
                                    "--save-interval", "100000", "--exit-signal-handler"),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert proc.stdout is not None
    for line in proc.stdout:
        if re.search(r"iteration\s+3/", line):
            break
    proc.send_signal(signal.SIGTERM)
    rest, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0
    assert "exiting program after receiving SIGTERM." in rest
    saved = int((save / emu.TRACKER).read_text())
    assert saved >= 3 and f"saving checkpoint at iteration {saved:7d}" in rest
    out = subprocess.run(emu_cmd("--train-iters", str(saved + 2), "--load", str(save),
                                 "--save", str(save)),
                         capture_output=True, text=True, timeout=60, check=True).stdout
    its = [int(m) for m in re.findall(r"iteration\s+(\d+)/", out)]
    assert its == [saved + 1, saved + 2]


def test_other_ranks_idle_until_rank0_finishes(tmp_path: Path) -> None:
    env = {**os.environ, "SLURM_PROCID": "1", "SLURM_NTASKS": "2",
           "SLURM_JOB_ID": f"t{os.getpid()}", "SLURM_STEP_ID": "0", "TMPDIR": str(tmp_path),
           "NCCL_IB_HCA": "mlx5_0,mlx5_1", "SLURMD_NODENAME": "gpu007", "SLURM_LOCALID": "1"}
    proc = subprocess.Popen(emu_cmd("--train-iters", "5", "--emu-report-env"), env=env,
                            stdout=subprocess.PIPE, text=True)
    time.sleep(1.5)
    assert proc.poll() is None  # still waiting, not training
    marker = emu.done_marker(emu.Dist.from_env(env), env)
    assert marker.parent.parent == tmp_path  # a private directory in TMPDIR
    marker.parent.mkdir(exist_ok=True)
    marker.touch()
    out, _ = proc.communicate(timeout=10)
    assert proc.returncode == 0
    assert out.strip() == ("megatron_emu: rank 1/2 node gpu007 local_rank 1 "
                           "NCCL_IB_HCA=mlx5_0,mlx5_1")


def test_an_old_marker_of_the_same_job_id_is_ignored(tmp_path: Path) -> None:
    # A new sandbox numbers jobs from 1 again: a marker left by an earlier job 1 must not end
    # the ranks of the new one at once.
    env = {**os.environ, "SLURM_PROCID": "1", "SLURM_NTASKS": "2", "SLURM_JOB_ID": "1",
           "SLURM_STEP_ID": "0", "TMPDIR": str(tmp_path), "SLURM_LOCALID": "1"}
    marker = emu.done_marker(emu.Dist.from_env(env), env)
    marker.parent.mkdir()
    marker.touch()
    os.utime(marker, (time.time() - 3600, time.time() - 3600))
    proc = subprocess.Popen(emu_cmd("--train-iters", "5"), env=env, stdout=subprocess.PIPE,
                            text=True)
    time.sleep(1.5)
    assert proc.poll() is None  # the stale marker did not release it
    marker.touch()
    proc.communicate(timeout=10)
    assert proc.returncode == 0
