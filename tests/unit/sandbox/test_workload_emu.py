"""The sandbox workload: Megatron's formats (checked with slurmpod's own Megatron log and
argument parsers), real FLOPs, exact resume from checkpoints, SIGTERM save-and-exit, ranks
that meet every iteration (a frozen rank stalls the step, a dead one fails it)."""

from __future__ import annotations

import io
import os
import re
import signal
import subprocess
import time
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from slurmpod.accounting.logparse import parse_log
from slurmpod.accounting.metrics import flops_fn_for, job_metrics
from slurmpod.config import builtin_site_path
from slurmpod.megatron.args import parse_arguments_dump
from slurmpod.megatron.flops import flops_per_iteration
from slurmpod.sandbox.measured_site import write_measured_site
from slurmpod.sandbox.workload import megatron_emu as emu
from slurmpod.sandbox.workload.calibrate import PeakEstimate
from tests.helpers import EMU

TINY = ["--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4",
        "--seq-length", "32", "--micro-batch-size", "2", "--global-batch-size", "8",
        "--vocab-size", "256", "--log-interval", "1", "--log-throughput", "--lr", "1e-3",
        "--lr-warmup-iters", "2"]


@pytest.fixture(autouse=True)
def _no_site_from_the_shell(monkeypatch: pytest.MonkeyPatch) -> None:
    # A shell with `slurmpod sandbox env` applied would pace these runs to its sandbox's peak.
    monkeypatch.delenv("SLURMPOD_SITE", raising=False)


def fake_cpu(tflops: float) -> PeakEstimate:
    return PeakEstimate(tflops, tflops * 0.98, (tflops * 0.9, tflops, tflops * 0.98), 1024, 0.1)


def run_emu(argv: list[str], world: int = 1, cpu_tflops: float = 0.2
            ) -> tuple[str, emu.Trainer | None]:
    args, _ = emu.build_parser().parse_known_args(argv)
    dist = emu.Dist(rank=0, world_size=world, local_rank=0, job_id="77", step_id="0")
    args = emu.finish_args(args, dist)
    out = io.StringIO()
    assert emu.train(args, dist, out, measure=lambda: fake_cpu(cpu_tflops)) == 0
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


def test_a_save_is_left_out_of_the_next_iterations_time(tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """As Megatron's save_checkpoint_and_time stops the interval timer: the save shows as a gap
    in the iteration lines' clock, which the report counts as a checkpoint stall. The save
    moves the emulator's clocks (monotonic and the lines' timestamps) ten minutes on instead of
    sleeping, so the test depends on no machine's speed."""
    save_s = 600.0
    shift = [0.0]

    class Clock:  # the emulator's `time`: its monotonic clock runs `shift` ahead
        monotonic = staticmethod(lambda: time.monotonic() + shift[0])
        sleep = staticmethod(time.sleep)

    class Stamp(datetime):  # the emulator's `datetime`: its timestamps too
        @classmethod
        def now(cls, tz: Any = None) -> datetime:  # type: ignore[override]
            return datetime.now(tz) + timedelta(seconds=shift[0])

    save = emu.Trainer.save

    def slow_save(self: emu.Trainer, path: Path) -> Path:
        done = save(self, path)
        shift[0] += save_s  # the save's duration
        return done

    monkeypatch.setattr(emu, "time", Clock)
    monkeypatch.setattr(emu, "datetime", Stamp)
    monkeypatch.setattr(emu.Trainer, "save", slow_save)
    out, _ = run_emu([*TINY, "--train-iters", "4", "--save", str(tmp_path / "c"),
                      "--save-interval", "2"])
    summary = parse_log(out.encode().splitlines(keepends=True))
    assert max(summary.iterations.elapsed_ms.tolist()) < 1000 * save_s
    m = job_metrics(summary, None, 1.0, 1, seq_length=None)
    assert [c.iteration for c in m.checkpoint_stalls][:1] == [2]
    assert m.checkpoint_stalls[0].duration_s >= save_s


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
    return [*EMU, *TINY, *extra]


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


REPORTED = ("NCCL_", "CUDA_", "UCX_", "FI_", "PYTORCH_", "TORCH_")  # what --emu-report-env prints


def rank_env(tmp_path: Path, rank: int, world: int, **extra: str) -> dict[str, str]:
    # Without the variables --emu-report-env prints, whatever the machine running the tests
    # has set: the report holds only what a test passes.
    inherited = {k: v for k, v in os.environ.items() if not k.startswith(REPORTED)}
    return {**inherited, "SLURM_PROCID": str(rank), "SLURM_NTASKS": str(world),
            "SLURM_JOB_ID": f"t{os.getpid()}", "SLURM_STEP_ID": "0", "TMPDIR": str(tmp_path),
            "SLURM_LOCALID": str(rank), "SLURMD_NODENAME": f"gpu00{rank}",
            "MASTER_ADDR": "127.0.0.1", **extra}


def start_ranks(tmp_path: Path, world: int, *extra: str) -> list[subprocess.Popen[str]]:
    """Rank 0 last, so the others already poll for its rendezvous file."""
    procs = [subprocess.Popen(emu_cmd(*extra), env=rank_env(tmp_path, r, world),
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for r in range(world - 1, -1, -1)]
    return procs[::-1]


def read_until(proc: subprocess.Popen[str], pattern: str) -> str:
    assert proc.stdout is not None
    seen = []
    for line in proc.stdout:
        seen.append(line)
        if re.search(pattern, line):
            return "".join(seen)
    raise AssertionError(f"{pattern!r} never printed:\n{''.join(seen)}")


def test_ranks_meet_every_iteration_and_finish_together(tmp_path: Path) -> None:
    save = tmp_path / "ckpt"
    procs = start_ranks(tmp_path, 4, "--train-iters", "6", "--save", str(save),
                        "--emu-report-env")
    outs = [p.communicate(timeout=60)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0, 0], outs
    assert [int(m) for m in re.findall(r"iteration\s+(\d+)/", outs[0])] == list(range(1, 7))
    assert outs[1].strip() == "megatron_emu: rank 1/4 node gpu001 local_rank 1"
    assert not list(save.glob(".emu-rendezvous-*"))  # removed once everyone joined


def test_a_hold_pauses_every_rank_until_released_and_is_not_timed(tmp_path: Path) -> None:
    """--emu-hold-after-iteration N: rank 0 stops after iteration N until the hold file exists
    (a test can then look at the job mid-run without racing its end); the other rank waits at
    the all-reduce; the logged iteration times leave the pause out."""
    release = tmp_path / "release"
    procs = start_ranks(tmp_path, 2, "--train-iters", "6", "--save", str(tmp_path / "c"),
                        "--emu-hold-after-iteration", "3", "--emu-hold-file", str(release))
    head = read_until(procs[0], r"holding after iteration 3 until")
    assert re.findall(r"iteration\s+(\d+)/", head) == ["1", "2", "3"]
    assert all(p.poll() is None for p in procs)  # both ranks wait, neither has finished
    held_s = 2.0  # ten times an iteration of these ranks on a loaded 2-core machine
    deadline = time.monotonic() + held_s
    while time.monotonic() < deadline:  # the pause to leave out of the times, not a sync
        assert all(p.poll() is None for p in procs)
        time.sleep(0.05)
    release.touch()
    rest = procs[0].communicate(timeout=60)[0]
    procs[1].communicate(timeout=60)
    assert [p.returncode for p in procs] == [0, 0], rest
    assert re.findall(r"iteration\s+(\d+)/", rest) == ["4", "5", "6"]
    times = parse_log(io.BytesIO((head + rest).encode())).iterations.elapsed_ms.tolist()
    assert len(times) == 6 and times[3] < 1000 * held_s  # iteration 4 starts after the hold


def test_a_frozen_rank_stalls_every_rank_until_the_watchdog(tmp_path: Path) -> None:
    # A 3-second collective timeout: the step can only end by the watchdog if the frozen
    # rank really holds up rank 0 (an emulator that did not wait would train on and finish).
    procs = start_ranks(tmp_path, 2, "--train-iters", "1000000", "--save", str(tmp_path / "c"),
                        "--distributed-timeout-minutes", "0.05")
    try:
        read_until(procs[0], r"iteration\s+3/")
        procs[1].send_signal(signal.SIGSTOP)
        out = procs[0].communicate(timeout=60)[0]
        assert procs[0].returncode == 1
        assert "watchdog timeout: rank 1 on gpu001 sent nothing for 3 s" in out
    finally:
        procs[1].kill()
        procs[1].wait()


def test_a_dead_rank_fails_the_step_and_the_others_wait_like_nccl(tmp_path: Path) -> None:
    # A 1-minute timeout bounds the test should the lost peer go unnoticed.
    procs = start_ranks(tmp_path, 2, "--train-iters", "1000000", "--save", str(tmp_path / "c"),
                        "--exit-signal-handler", "--distributed-timeout-minutes", "1")
    read_until(procs[0], r"iteration\s+3/")
    procs[1].kill()
    procs[1].wait()
    # EOF, a reset or a broken pipe, depending on where rank 0 was in the exchange
    read_until(procs[0], r"NCCL error: lost rank 1 on gpu001")
    assert procs[0].poll() is None  # blocked, as NCCL would be, until srun ends the step
    procs[0].send_signal(signal.SIGTERM)
    procs[0].communicate(timeout=30)
    assert procs[0].returncode == 1


def test_sigterm_to_one_rank_stops_all_ranks_at_one_saved_iteration(tmp_path: Path) -> None:
    save = tmp_path / "ckpt"
    procs = start_ranks(tmp_path, 2, "--train-iters", "1000000", "--save", str(save),
                        "--save-interval", "1000000", "--exit-signal-handler")
    read_until(procs[0], r"iteration\s+3/")
    procs[1].send_signal(signal.SIGTERM)  # Megatron all-reduces the exit flag
    out = procs[0].communicate(timeout=60)[0]
    procs[1].communicate(timeout=30)
    assert [p.returncode for p in procs] == [0, 0]
    saved = int((save / emu.TRACKER).read_text())
    assert f"saving checkpoint at iteration {saved:7d}" in out
    assert "exiting program after receiving SIGTERM." in out


def test_a_stale_rendezvous_file_of_the_same_job_id_is_ignored(tmp_path: Path) -> None:
    # A new sandbox numbers jobs from 1 again: an old file must not send rank 1 elsewhere
    # (its nonce is refused; rank 1 reads the file again until rank 0 has rewritten it).
    save = tmp_path / "ckpt"
    save.mkdir()
    dist = emu.Dist.from_env(rank_env(tmp_path, 1, 2))
    old = emu.rendezvous_file(save, dist)
    old.write_text("127.0.0.1 1 0123456789abcdef\n")
    os.utime(old, (time.time() - 3600, time.time() - 3600))
    procs = start_ranks(tmp_path, 2, "--train-iters", "3", "--save", str(save))
    assert [p.communicate(timeout=60) and p.returncode for p in procs] == [0, 0]


# -- pacing: an emulated GPU is never faster than its peak -------------------------------------

def measured_site(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, peak: float) -> Path:
    site = tmp_path / "site.toml"
    write_measured_site(builtin_site_path("sandbox"), site, measure=lambda: peak)
    monkeypatch.setenv("SLURMPOD_SITE", str(site))
    return site


def test_peak_comes_from_the_flag_else_the_measured_site(tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    assert emu.emulated_peak(None).tflops is None  # no flag, no $SLURMPOD_SITE
    site = measured_site(tmp_path, monkeypatch, 0.0123)
    assert emu.emulated_peak(None) == emu.Peak(0.0123, f"$SLURMPOD_SITE {site}")
    assert emu.emulated_peak(0.5) == emu.Peak(0.5, "--emu-peak-tflops")
    # A real site's GPUs are not emulated: their peak is not this CPU's.
    monkeypatch.setenv("SLURMPOD_SITE", "dgx-h100-superpod")
    assert emu.emulated_peak(None).tflops is None
    monkeypatch.setenv("SLURMPOD_SITE", str(tmp_path / "gone.toml"))
    none = emu.emulated_peak(None)
    assert none.tflops is None and "gone.toml" in none.source
    with pytest.raises(SystemExit, match="positive"):
        emu.emulated_peak(float("nan"))


def test_the_lowest_emulated_peak_of_a_site_is_the_pace(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    site = tmp_path / "two.toml"
    site.write_text("""
[node_types.a]
gpu = { model = "emu", emulated = true, peak_tflops_bf16 = 0.3 }
[node_types.b]
gpu = { model = "emu", emulated = true, peak_tflops_bf16 = 0.2 }
[node_types.real]
gpu = { model = "h100", peak_tflops_bf16 = 989 }
""")
    monkeypatch.setenv("SLURMPOD_SITE", str(site))
    assert emu.emulated_peak(None).tflops == 0.2


@pytest.mark.parametrize(("flops", "peak", "ms"), [
    (1.825e8, 0.05, 3.7),     # 3.65 ms: rounded up to what the log can print
    (2.0e9, 0.2, 10.0),       # exactly 10 ms stays 10 ms (up to float noise)
    (2.0e9, 0.2001, 10.0),    # 9.995 ms
    (1.0e6, 1.0, 0.1),        # 1 us: the shortest printable iteration
])
def test_min_iteration_is_the_share_at_the_peak_rounded_up_to_the_printed_0_1_ms(
        flops: float, peak: float, ms: float) -> None:
    got = emu.min_iteration_s(flops, peak) * 1e3
    assert got == pytest.approx(ms, abs=0.1) and got >= flops / peak / 1e9
    assert round(got * 10) == pytest.approx(got * 10)  # a multiple of 0.1 ms
    assert emu.min_iteration_s(flops, None) == 0.0


@pytest.mark.parametrize("world", [1, 4])
def test_mfu_from_the_log_stays_within_the_site_peak(tmp_path: Path, world: int,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    # A site peak far below what this CPU does (as when `sandbox up` measured it under load):
    # unpaced, TINY's ~3 ms share at >= 10 GFLOP/s would be an MFU of several hundred percent.
    argv = [*TINY, "--train-iters", "6", "--log-interval", "2"]
    peak = 0.002
    measured_site(tmp_path, monkeypatch, peak)
    out, _ = run_emu(argv, world=world, cpu_tflops=0.25)
    line = next(ln for ln in out.splitlines() if ln.startswith("megatron_emu: emulated GPU"))
    assert f"peak 0.002 TFLOP/s ($SLURMPOD_SITE {tmp_path / 'site.toml'})" in line
    assert "this CPU now 0.25 TFLOP/s" in line and "the job runs at the peak" in line
    args = emu.finish_args(emu.build_parser().parse_known_args(argv)[0],
                           emu.Dist(0, world, 0, "", "0"))
    min_ms = emu.min_iteration_s(flops_per_iteration(dict(vars(args))) / world, peak) * 1e3
    assert f"paced to >= {min_ms:.1f} ms" in line
    # MFU as the hooks compute it (metrics.job_metrics), from the printed log alone.
    summary = parse_log(out.encode().splitlines(keepends=True))
    flops_fn, _ = flops_fn_for(dict(vars(args)))
    m = job_metrics(summary, flops_fn, peak, world, seq_length=args.seq_length, warmup_iters=0)
    assert len(m.series) == 3
    assert np.all(m.series.mfu > 0) and np.all(m.series.mfu <= 1.0), m.series.mfu
    assert np.all(np.asarray(summary.iterations.tflops_reported) <= peak)


def test_no_peak_no_pacing_and_the_log_says_so() -> None:
    out, _ = run_emu([*TINY, "--train-iters", "1"], cpu_tflops=0.123)
    (line,) = [ln for ln in out.splitlines() if ln.startswith("megatron_emu: this CPU")]
    assert line == ("megatron_emu: this CPU now 0.123 TFLOP/s (second-best of 3 float32 "
                    "1024x1024 matmuls, median 0.1205); no emulated GPU peak (no "
                    "--emu-peak-tflops and no $SLURMPOD_SITE): not paced")


def test_the_real_start_measurement_is_logged(tmp_path: Path) -> None:
    out = subprocess.run(emu_cmd("--train-iters", "1", "--emu-peak-tflops", "1e6"),
                         capture_output=True, text=True, timeout=120, check=True).stdout
    m = re.search(r"megatron_emu: emulated GPU peak 1e\+06 TFLOP/s \(--emu-peak-tflops\); "
                  r"this CPU now (\S+) TFLOP/s \(second-best of 6 float32 1024x1024 matmuls, "
                  r"median (\S+)\); iterations paced to >= 0\.1 ms", out)
    assert m is not None, out
    assert 0 < float(m.group(2)) <= float(m.group(1))  # median <= second-best of 6


# -- Megatron's timers: per-rank compute, a slow rank -----------------------------------------

@pytest.mark.parametrize("option", ["minmax", "max", "all"])
def test_timer_blocks_are_megatrons_and_the_log_parser_reads_them(option: str) -> None:
    out, _ = run_emu([*TINY, "--train-iters", "4", "--timing-log-level", "2",
                      "--timing-log-option", option])
    t = parse_log(io.BytesIO(out.encode())).rank_timers
    assert t is not None and t.option == option and t.blocks == 3  # the first left out
    names = {"forward-backward", "forward-compute", "backward-compute"}
    if option == "all":
        assert set(t.per_rank) == names and set(t.per_rank["forward-compute"]) == {0}
        fwd, bwd = t.per_rank["forward-compute"][0], t.per_rank["backward-compute"][0]
        assert bwd == pytest.approx(2 * fwd, abs=0.02)  # printed to 0.01 ms
    else:
        assert set(t.min_max) == names
        assert (t.min_max["forward-backward"][0] is None) == (option == "max")


def test_a_slow_rank_joins_late_and_its_timers_show_it(tmp_path: Path) -> None:
    procs = start_ranks(tmp_path, 4, "--train-iters", "5", "--save", str(tmp_path / "c"),
                        "--timing-log-level", "2", "--timing-log-option", "all",
                        "--emu-slow-rank", "2", "--emu-slow-ms", "150")
    outs = [p.communicate(timeout=60)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0, 0], outs
    s = parse_log(io.BytesIO(outs[0].encode()))
    t = s.rank_timers
    assert t is not None and sorted(t.per_rank["forward-compute"]) == [0, 1, 2, 3]
    compute = {r: t.per_rank["forward-compute"][r] + t.per_rank["backward-compute"][r]
               for r in range(4)}
    assert compute[2] - compute[0] == pytest.approx(150.0, abs=0.05)
    assert compute[0] == compute[1] == compute[3]
    # Rank 0 waited for it: each iteration took the slow rank's extra, from the third on. The
    # slow rank sent its first line while rank 0 was still starting up, and slept for its
    # second while rank 0 paced its first step; the 10 % margin is the clock reads' jitter on
    # a loaded machine (an iteration without the slow rank takes a few ms).
    elapsed = s.iterations.elapsed_ms.tolist()
    assert len(elapsed) == 5 and min(elapsed[2:]) >= 0.9 * 150.0, elapsed


# -- Megatron's memory report ------------------------------------------------------------------

@pytest.mark.parametrize("device", [False, True])
def test_memory_reports_are_megatrons_and_the_log_parser_reads_them(device: bool) -> None:
    """After the first logged iterations and every --log-memory-interval: the emulated GPU's
    arrays as allocated, rounded to PyTorch's 2 MiB blocks as reserved, and with
    --log-device-memory-used the process's resident memory beyond them."""
    out, _ = run_emu([*TINY, "--train-iters", "6", "--log-memory-interval", "3"]
                     + (["--log-device-memory-used"] if device else []))
    lines = [ln for ln in out.splitlines() if " memory (MB) | " in ln]
    # first and second iteration (Megatron main), then the interval
    assert [ln.split(")")[0] for ln in lines] == ["[Rank 0] (after 1 iterations",
                                                 "[Rank 0] (after 2 iterations",
                                                 "[Rank 0] (after 3 iterations",
                                                 "[Rank 0] (after 6 iterations"]
    mem = parse_log(io.BytesIO(out.encode())).memory
    assert mem is not None and set(mem.per_rank) == {0}
    alloc, reserved, used, retries = mem.per_rank[0]
    assert retries is None  # Megatron-LM prints none
    assert 0 < alloc <= reserved < alloc + 8 * 2  # at most 2 MiB per array rounded up
    assert (used is not None) == device
    if used is not None:
        assert used > reserved  # the interpreter and numpy are resident too
