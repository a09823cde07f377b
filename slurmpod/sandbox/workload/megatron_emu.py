"""A stand-in for Megatron-LM in the sandbox: Megatron's arguments, log lines and checkpoints,
with real numpy matrix work per iteration instead of a GPU model.

Run as `python -m slurmpod.sandbox.workload.megatron_emu <megatron args>`. It accepts the flags
slurmpod renders (unknown ones are tolerated), prints Megatron's `arguments` dump and iteration
lines with measured timings, saves `iter_NNNNNNN/` checkpoints with
`latest_checkpointed_iteration.txt` every `--save-interval`, resumes from `--load`, appends to
`<save>/progress.txt`, and with `--exit-signal-handler` saves and exits on SIGTERM (as Megatron
does).

The work: each iteration performs this rank's share of the model's FLOPs (slurmpod's Megatron
FLOPs formula ÷ world size) as the forward, data-gradient and weight-gradient GEMMs of a real
least-squares model of width `hidden_size`, trained by SGD, so `lm loss` and `grad norm` are
computed, not invented, and a resumed run continues exactly where the saved one stopped.
An emulated GPU cannot beat its peak: rank 0 measures this CPU's matmul rate at start, logs it
with the site's peak, and paces every iteration to at least its model FLOPs per GPU at that peak,
so MFU against the site's peak stays within 0-100 % (docs/workload.md, "Pacing").
Only rank 0 computes and logs; the other ranks (srun tasks) do no arithmetic, so 16 tasks on a
2-core machine stay light, but every rank meets rank 0 once per iteration over TCP (a stand-in
for the gradient all-reduce, `Collective`): one frozen rank stalls every rank's step and one
dead rank fails it, as with NCCL (docs/workload.md, "Ranks").
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import shutil
import signal
import socket
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

import numpy as np

from slurmpod.errors import SlurmpodError
from slurmpod.sandbox.workload import gpu_activity

if TYPE_CHECKING:
    from slurmpod.sandbox.workload.calibrate import PeakEstimate

TRACKER = "latest_checkpointed_iteration.txt"
_DATA_ROWS = 4096  # rows of the synthetic dataset, cycled through by consumed samples


def build_parser() -> argparse.ArgumentParser:
    """The emulator's one parser. argparse, not click like slurmpod's commands, on purpose: this
    stands in for Megatron-LM, whose parser is argparse (megatron/training/arguments.py), so
    argparse gives the same `--flag value` and `--flag=value` forms, `store_true` flags and,
    through `parse_known_args`, the tolerance of flags it does not model that a job script
    written for Megatron needs (docs/workload.md, "Arguments")."""
    p = argparse.ArgumentParser(prog="megatron_emu", allow_abbrev=False,
                                description="Megatron-LM stand-in for the slurmpod sandbox")
    a = p.add_argument
    a("--num-layers", type=int, required=True)
    a("--hidden-size", type=int, required=True)
    a("--num-attention-heads", type=int, required=True)
    a("--ffn-hidden-size", type=int, default=None)
    a("--kv-channels", type=int, default=None)
    a("--group-query-attention", action="store_true")
    a("--num-query-groups", type=int, default=1)
    a("--swiglu", action="store_true")
    a("--seq-length", type=int, required=True)
    a("--max-position-embeddings", type=int, default=None)
    a("--vocab-size", type=int, default=50257)
    a("--make-vocab-size-divisible-by", type=int, default=128)
    a("--micro-batch-size", type=int, default=1)
    a("--global-batch-size", type=int, default=None)
    a("--train-iters", type=int, required=True)
    a("--log-interval", type=int, default=100)
    a("--log-throughput", action="store_true")
    a("--lr", type=float, default=1.0e-4)
    a("--min-lr", type=float, default=0.0)
    a("--lr-warmup-iters", type=int, default=0)
    a("--lr-decay-style", default="cosine", choices=["constant", "linear", "cosine"])
    a("--lr-decay-iters", type=int, default=None)
    a("--save", default=None)
    a("--load", default=None)
    a("--save-interval", type=int, default=None)
    a("--exit-duration-in-mins", type=float, default=None)
    a("--exit-interval", type=int, default=None)
    a("--exit-signal-handler", action="store_true")
    a("--seed", type=int, default=1234)
    a("--tensor-model-parallel-size", type=int, default=1)
    a("--pipeline-model-parallel-size", type=int, default=1)
    a("--context-parallel-size", type=int, default=1)
    a("--expert-model-parallel-size", type=int, default=1)
    a("--virtual-pipeline-model-parallel-size", type=int, default=None)
    a("--num-virtual-stages-per-pipeline-rank", type=int, default=None)
    a("--sequence-parallel", action="store_true")
    a("--use-distributed-optimizer", action="store_true")
    a("--bf16", action="store_true")
    a("--fp16", action="store_true")
    a("--distributed-timeout-minutes", type=float, default=10.0)
    # Megatron's timers (megatron/core/timers.py): level 1 `forward-backward`, level 2 also each
    # rank's `forward-compute` and `backward-compute`, printed after each iteration line.
    a("--timing-log-level", type=int, default=0, choices=[0, 1, 2])
    a("--timing-log-option", default="minmax", choices=["max", "minmax", "all"])
    # Megatron's memory report (report_memory): after the first logged iteration, and every
    # --log-memory-interval; with --log-device-memory-used also the device memory in use.
    a("--log-memory-interval", type=int, default=None)
    a("--log-device-memory-used", action="store_true")
    a("--emu-peak-tflops", type=float, default=None, metavar="TFLOPS",
      help="peak of one emulated GPU to pace to (default: the emulated GPUs' peak in "
           "$SLURMPOD_SITE, which `slurmpod sandbox env` sets to the measured site)")
    a("--emu-report-env", action="store_true",
      help="every rank prints one line with its rank, node and NCCL/CUDA variables")
    # Faults to rehearse the job script's handling of failures on the sandbox.
    a("--emu-fail-at-iteration", type=int, default=None,
      help="crash (exit 1) after this iteration, once per run (a marker in --save)")
    a("--emu-fail-at-start", type=int, default=None, metavar="CODE",
      help="exit with CODE before training, as a launch that cannot start would")
    a("--emu-slow-rank", type=int, default=None, metavar="RANK",
      help="this rank's compute takes --emu-slow-ms longer every iteration (a throttled GPU): "
           "it joins each all-reduce late, and its per-rank timers show it")
    a("--emu-slow-ms", type=float, default=0.0, metavar="MS")
    # A pause a test can end: observe the job mid-run without racing its end.
    a("--emu-hold-after-iteration", type=int, default=None, metavar="N",
      help="after iteration N, rank 0 waits (untimed) until --emu-hold-file exists; the other "
           "ranks wait at the next all-reduce, as behind a paused rank")
    a("--emu-hold-file", type=Path, default=None, metavar="PATH")
    return p


@dataclass(frozen=True)
class Dist:
    rank: int
    world_size: int
    local_rank: int
    job_id: str
    step_id: str

    @classmethod
    def from_env(cls, env: dict[str, str] | os._Environ[str] = os.environ) -> Dist:
        # torchrun sets RANK/WORLD_SIZE; srun sets SLURM_PROCID/SLURM_NTASKS.
        rank = int(env.get("RANK", env.get("SLURM_PROCID", "0")))
        world = int(env.get("WORLD_SIZE", env.get("SLURM_NTASKS", "1")))
        local = int(env.get("LOCAL_RANK", env.get("SLURM_LOCALID", "0")))
        return cls(rank, max(world, 1), local, env.get("SLURM_JOB_ID", ""),
                   env.get("SLURM_STEP_ID", "0"))


def finish_args(args: argparse.Namespace, dist: Dist) -> argparse.Namespace:
    """Derived values, as Megatron's validate_args does (the ones this stand-in needs)."""
    tp, pp, cp = (args.tensor_model_parallel_size, args.pipeline_model_parallel_size,
                  args.context_parallel_size)
    model_parallel = tp * pp * cp
    if dist.world_size % model_parallel:
        raise SystemExit(f"world size ({dist.world_size}) is not divisible by tensor ({tp}) x "
                         f"pipeline ({pp}) x context ({cp}) parallel size")
    if args.num_virtual_stages_per_pipeline_rank is not None:  # as Megatron's validate_args
        args.virtual_pipeline_model_parallel_size = args.num_virtual_stages_per_pipeline_rank
    args.world_size = dist.world_size
    args.rank = dist.rank
    args.data_parallel_size = dist.world_size // model_parallel
    if args.global_batch_size is None:
        args.global_batch_size = args.micro_batch_size * args.data_parallel_size
    if args.global_batch_size % (args.micro_batch_size * args.data_parallel_size):
        raise SystemExit(f"global batch size ({args.global_batch_size}) is not divisible by "
                         f"micro batch size ({args.micro_batch_size}) times data parallel size "
                         f"({args.data_parallel_size})")
    if args.max_position_embeddings is None:
        args.max_position_embeddings = args.seq_length
    if args.ffn_hidden_size is None:
        args.ffn_hidden_size = (int((4 * args.hidden_size * 2 / 3) / 64) * 64 if args.swiglu
                                else 4 * args.hidden_size)
    if args.kv_channels is None:
        args.kv_channels = args.hidden_size // args.num_attention_heads
    if not args.group_query_attention:
        args.num_query_groups = args.num_attention_heads
    if args.lr_decay_iters is None:
        args.lr_decay_iters = args.train_iters
    args.params_dtype = "torch.bfloat16" if args.bf16 else "torch.float16" if args.fp16 \
        else "torch.float32"
    return args


def arguments_dump(args: argparse.Namespace, title: str = "arguments") -> str:
    """Megatron's `_print_args`: `  name ..... value`, 48-column dots, sorted case-blind."""
    rows = [f"  {k} {'.' * (48 - len(k))} {v}" for k, v in vars(args).items()]
    rows.sort(key=lambda r: r.lower())
    return "\n".join([f"------------------------ {title} ------------------------", *rows,
                      f"-------------------- end of {title} ---------------------"])


def model_flops_per_iteration(args: argparse.Namespace) -> float:
    """slurmpod's Megatron FLOPs formula, so the sandbox MFU uses the same arithmetic."""
    from slurmpod.megatron.flops import flops_per_iteration  # lazy: start-up

    return float(flops_per_iteration(dict(vars(args))))


@dataclass(frozen=True)
class Peak:
    """The emulated GPU's peak this run is paced to, and where it came from."""
    tflops: float | None
    source: str


def emulated_peak(flag: float | None, env: dict[str, str] | os._Environ[str] = os.environ
                  ) -> Peak:
    """`--emu-peak-tflops`, else the lowest `peak_tflops_bf16` of the emulated GPUs in the site
    `$SLURMPOD_SITE` names (the sandbox's measured site: the peak slurmpod submit puts in the
    job's comment and the hooks compute MFU against). The lowest, so that no node type's MFU
    can pass 100 %; a site without emulated GPUs (a real one) gives no peak."""
    if flag is not None:
        if not (flag > 0 and math.isfinite(flag)):
            raise SystemExit(f"--emu-peak-tflops must be a positive number, not {flag}")
        return Peak(flag, "--emu-peak-tflops")
    site = env.get("SLURMPOD_SITE")
    if not site:
        return Peak(None, "no --emu-peak-tflops and no $SLURMPOD_SITE")
    from slurmpod.config import read_toml, resolve_site_path  # lazy: start-up

    try:
        path = resolve_site_path(site)
        data = read_toml(path)
    except (SlurmpodError, OSError) as exc:
        return Peak(None, f"$SLURMPOD_SITE {site} unreadable ({exc})")
    peaks = [gpu.get("peak_tflops_bf16") for nt in (data.get("node_types") or {}).values()
             if isinstance(nt, dict) and isinstance(gpu := nt.get("gpu"), dict)
             and gpu.get("emulated")]
    ok = [float(x) for x in peaks if isinstance(x, int | float) and x > 0 and math.isfinite(x)]
    if not ok:
        return Peak(None, f"no emulated GPU with a peak in $SLURMPOD_SITE {path}")
    return Peak(min(ok), f"$SLURMPOD_SITE {path}")


def min_iteration_s(flops_per_gpu: float, peak_tflops: float | None) -> float:
    """The shortest iteration allowed: its model FLOPs per GPU at the peak. Rounded up to the
    0.1 ms Megatron prints the iteration time with, because MFU is computed from the printed
    time: 0.74 ms printed as 0.7 would be 6 % faster than it was."""
    if not peak_tflops:
        return 0.0
    ms = flops_per_gpu / (peak_tflops * 1e12) * 1e3
    return math.ceil(ms * 10.0 * (1.0 + 1e-9)) / 10.0 / 1e3


def pace(deadline: float) -> None:
    """Sleep (no CPU used) until time.monotonic() reaches `deadline`."""
    while (left := deadline - time.monotonic()) > 0:
        time.sleep(left)


def pacing_line(peak: Peak, flops_per_gpu: float, min_s: float,
                measure: Callable[[], PeakEstimate] | None = None) -> str:
    """What the job measured and how it is paced, for its log. `measure()` returns a
    `calibrate.PeakEstimate` of this CPU now."""
    from slurmpod.sandbox.workload.calibrate import sample_peak  # lazy: start-up

    # About 0.1 s on a quiet machine: a log figure, not the peak (that is the site's).
    est = (measure or (lambda: sample_peak(rounds=3, repeats=2, pause_s=0.02)))()
    now = (f"this CPU now {est.peak_tflops:.4g} TFLOP/s (second-best of {len(est.samples)} "
           f"float32 {est.size}x{est.size} matmuls, median {est.median_tflops:.4g})")
    if peak.tflops is None:
        return f"megatron_emu: {now}; no emulated GPU peak ({peak.source}): not paced"
    s = (f"megatron_emu: emulated GPU peak {peak.tflops:.4g} TFLOP/s ({peak.source}); {now}; "
         f"iterations paced to >= {min_s * 1e3:.1f} ms ({flops_per_gpu:.3e} model FLOPs per "
         f"GPU at the peak)")
    if est.peak_tflops > peak.tflops * 1.1:
        s += "; this CPU is now faster than that peak, so the job runs at the peak"
        if peak.source.startswith("$SLURMPOD_SITE"):
            s += " (a sandbox measures it at `up`: `down` and `up` again to re-measure)"
    return s


def learning_rate(args: argparse.Namespace, iteration: int) -> float:
    """Megatron's OptimizerParamScheduler: linear warm-up, then constant/linear/cosine decay."""
    if args.lr_warmup_iters and iteration <= args.lr_warmup_iters:
        return args.lr * iteration / args.lr_warmup_iters
    if args.lr_decay_style == "constant":
        return args.lr
    span = max(args.lr_decay_iters - args.lr_warmup_iters, 1)
    ratio = min(max((iteration - args.lr_warmup_iters) / span, 0.0), 1.0)
    coeff = 1.0 - ratio if args.lr_decay_style == "linear" else 0.5 * (math.cos(math.pi * ratio)
                                                                         + 1.0)
    return args.min_lr + coeff * (args.lr - args.min_lr)


class Trainer:
    """Rank 0's model: W (h×h) fitted by SGD to Y = X·W* over a fixed synthetic dataset."""

    def __init__(self, args: argparse.Namespace, rows_per_iteration: int) -> None:
        self.args = args
        h = args.hidden_size
        rng = np.random.default_rng(args.seed)
        self.x = rng.standard_normal((_DATA_ROWS, h), dtype=np.float32)
        w_true = rng.standard_normal((h, h), dtype=np.float32) / np.float32(math.sqrt(h))
        self.y = self.x @ w_true
        self.w = np.zeros((h, h), dtype=np.float32)
        self.rows = max(rows_per_iteration, 1)
        self.iteration = 0
        self.consumed_samples = 0
        self.flops_done = 0.0  # FLOPs of GEMMs this rank actually ran, over all jobs
        self.train_s = 0.0  # seconds spent in iterations, over all jobs (for progress.txt)

    def _rows(self, start: int, count: int) -> np.ndarray:
        idx = (start + np.arange(count)) % _DATA_ROWS
        return idx

    def step(self) -> tuple[float, float]:
        """One iteration: micro-batch chunks of fwd, dgrad and wgrad GEMMs; returns (loss, ‖g‖)."""
        args = self.args
        h = args.hidden_size
        grad = np.zeros_like(self.w)
        loss = 0.0
        start = (self.consumed_samples * 131) % _DATA_ROWS  # data order depends on progress only
        done = 0
        while done < self.rows:
            m = min(self.rows - done, _DATA_ROWS)
            idx = self._rows(start + done, m)
            x, y = self.x[idx], self.y[idx]
            err = x @ self.w - y              # forward GEMM   (2·m·h·h)
            grad += x.T @ err                 # weight-gradient GEMM
            _ = err @ self.w.T                # data-gradient GEMM (what backprop would pass on)
            loss += float(np.einsum("ij,ij->", err, err))
            done += m
        self.flops_done += 6.0 * self.rows * h * h
        grad /= np.float32(self.rows)
        loss /= self.rows * h
        gnorm = float(np.linalg.norm(grad))
        # SGD on a unit-curvature problem: Megatron's lr schedule, rescaled to a stable step.
        lr = learning_rate(args, self.iteration + 1)
        self.w -= np.float32(0.5 * lr / args.lr if args.lr > 0 else 0.0) * grad
        self.iteration += 1
        self.consumed_samples += args.global_batch_size
        return loss, gnorm

    # -- checkpoints ------------------------------------------------------------------------
    def save(self, save_dir: Path) -> Path:
        """Write iter_NNNNNNN/ into a temp dir and rename it; then the tracker, atomically."""
        from slurmpod.fsutil import write_atomic  # lazy: start-up

        save_dir.mkdir(parents=True, exist_ok=True)
        name = f"iter_{self.iteration:07d}"
        final = save_dir / name
        stage = Path(tempfile.mkdtemp(dir=save_dir, prefix=f".{name}."))
        try:
            (stage / "mp_rank_00").mkdir()
            meta = {"iteration": self.iteration, "consumed_samples": self.consumed_samples,
                    "flops_done": self.flops_done, "train_s": self.train_s,
                    "hidden_size": self.args.hidden_size}
            with open(stage / "mp_rank_00" / "model_optim_rng.npz", "wb") as fh:
                np.savez(fh, w=self.w, meta=np.array(json.dumps(meta)))
                fh.flush()
                os.fsync(fh.fileno())
            if final.exists():
                shutil.rmtree(final)
            os.replace(stage, final)
        except BaseException:
            shutil.rmtree(stage, ignore_errors=True)
            raise
        write_atomic(save_dir / TRACKER, f"{self.iteration}\n")
        return final

    def load(self, load_dir: Path) -> int | None:
        """Resume from the tracked iteration; None when there is no checkpoint yet."""
        tracker = load_dir / TRACKER
        if not tracker.is_file():
            return None
        iteration = int(tracker.read_text().strip())
        path = load_dir / f"iter_{iteration:07d}" / "mp_rank_00" / "model_optim_rng.npz"
        with np.load(path) as z:
            meta = json.loads(str(z["meta"]))
            if meta["hidden_size"] != self.args.hidden_size:
                raise SystemExit(f"checkpoint {path} has hidden size {meta['hidden_size']}, "
                                 f"not {self.args.hidden_size}")
            self.w = z["w"].astype(np.float32)
        self.iteration = meta["iteration"]
        self.consumed_samples = meta["consumed_samples"]
        self.flops_done = meta["flops_done"]
        self.train_s = meta.get("train_s", 0.0)
        return iteration


def _now() -> str:
    return datetime.now().strftime("%Y-%m-%d %H:%M:%S.%f")


def iteration_line(it: int, args: argparse.Namespace, consumed: int, elapsed_s: float,
                   tflops: float | None, lr: float, loss: float, gnorm: float) -> str:
    """Megatron's training_log line (megatron/training/training.py, core 0.8+ layout)."""
    s = f" [{_now()}] iteration {it:8d}/{args.train_iters:8d} |"
    s += f" consumed samples: {consumed:12d} |"
    s += f" elapsed time per iteration (ms): {elapsed_s * 1000.0:.1f} |"
    if tflops is not None:
        # Megatron prints {:.1f}; CPU-scale figures (0.004) need significant digits instead.
        shown = f"{tflops:.1f}" if tflops >= 10 else f"{tflops:.3g}"
        s += f" throughput per GPU (TFLOP/s/GPU): {shown} |"
    s += f" learning rate: {lr:.6E} |"
    s += f" global batch size: {args.global_batch_size:5d} |"
    s += f" lm loss: {loss:.6E} |"
    s += " loss scale: 1.0 |"
    s += f" grad norm: {gnorm:.3f} |"
    s += " number of skipped iterations:   0 |"
    s += " number of nan iterations:   0 |"
    return s


# PyTorch's caching allocator rounds a large block (over 1 MiB) up to 2 MiB
# (c10/cuda/CUDACachingAllocator.cpp kRoundLarge): what `reserved` adds to `allocated` here.
_ROUND_LARGE = 2 << 20


def memory_line(it: int, rank: int, arrays: list[int], args: argparse.Namespace) -> str:
    """Megatron's report_memory line (main's two-decimal form) for the emulated GPU: its memory
    is the emulator's arrays (`arrays`: their sizes in bytes; gpu_activity.trainer_bytes), as
    PyTorch's allocator would reserve them, and with --log-device-memory-used the process's
    resident memory beyond them (the emulated runtime: interpreter and libraries)."""
    mb = 1024.0 * 1024.0
    allocated = float(sum(arrays))
    reserved = float(sum(-(-n // _ROUND_LARGE) * _ROUND_LARGE for n in arrays))
    s = f"[Rank {rank}] (after {it} iterations) memory (MB)"
    s += f" | allocated: {allocated / mb:.2f} | max allocated: {allocated / mb:.2f}"
    s += f" | reserved: {reserved / mb:.2f} | max reserved: {reserved / mb:.2f}"
    if args.log_device_memory_used:
        s += f" | total device memory used: {(reserved + _rss_bytes()) / mb:.2f}"
    return s


def _rss_bytes() -> int:
    """This process's resident memory (Linux /proc; 0 where there is none)."""
    try:
        with open("/proc/self/statm", encoding="ascii") as fh:
            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def append_progress(save: Path, dist: Dist, text: str) -> None:
    """Megatron's append_to_progress_log: `time<TAB>Job ID: J<TAB># GPUs: G<TAB>text`."""
    save.mkdir(parents=True, exist_ok=True)
    with open(save / "progress.txt", "a", encoding="utf-8") as fh:
        stamp = datetime.now().strftime("%Y-%m-%d %H:%M:%S")
        fh.write(f"{stamp}\tJob ID: {dist.job_id}\t# GPUs: {dist.world_size}\t{text}\n")


class _Signals:
    def __init__(self) -> None:
        self.received: int | None = None

    def install(self) -> None:
        signal.signal(signal.SIGTERM, self._handle)

    def _handle(self, signum: int, _frame: Any) -> None:
        self.received = signum


class PeerLost(Exception):
    """A rank's connection closed in the middle of a collective (the process died)."""


class CollectiveTimeout(Exception):
    """No answer within --distributed-timeout-minutes (NCCL's watchdog would fire)."""


def rendezvous_dir(args: argparse.Namespace,
                   env: dict[str, str] | os._Environ[str] = os.environ) -> Path:
    """Where rank 0 publishes its address: the checkpoint directory (every node sees it, as a
    torch FileStore's file), else this user's private directory in TMPDIR (one-host runs)."""
    return Path(args.save) if args.save else marker_dir(env)


def marker_dir(env: dict[str, str] | os._Environ[str] = os.environ) -> Path:
    """This user's private scratch directory (the sandbox runs every "node" on one machine)."""
    return Path(env.get("TMPDIR") or "/tmp") / f"megatron_emu-{os.getuid()}"


def rendezvous_file(where: Path, dist: Dist) -> Path:
    return where / f".emu-rendezvous-{dist.job_id}.{dist.step_id}"


def _node(env: dict[str, str] | os._Environ[str] = os.environ) -> str:
    return env.get("SLURMD_NODENAME") or os.uname().nodename


class Collective:
    """Every iteration each rank sends rank 0 one line and waits for its answer, so the step of
    every rank completes only when all ranks took part: the shape of a gradient all-reduce.

    Rank 0 listens on an ephemeral port of MASTER_ADDR (127.0.0.1 by default; never a guessed
    port) and publishes `addr port` in a rendezvous file; the others read it and connect, as
    torch's file:// rendezvous does. After everyone joined the listening socket is closed, so a
    relaunched step never meets the old one's port. A closed connection is a dead peer
    (`PeerLost`); no line within the timeout is `CollectiveTimeout` (NCCL's watchdog)."""

    def __init__(self, dist: Dist, where: Path, timeout_s: float,
                 env: dict[str, str] | os._Environ[str] = os.environ) -> None:
        self.dist = dist
        self.file = rendezvous_file(where, dist)
        self.timeout_s = timeout_s
        self.env = env
        self.peers: dict[int, tuple[socket.socket, Any, str]] = {}  # rank -> (sock, file, node)
        self.sock: socket.socket | None = None
        self.rfile: Any = None
        self.server: socket.socket | None = None
        self.start_iteration = 0
        self.nonce = ""
        self.extra_ms: dict[int, float] = {}  # rank -> its extra compute ms this log interval

    # rank 0 ----------------------------------------------------------------------------------
    def listen(self) -> None:
        host = self.env.get("MASTER_ADDR") or "127.0.0.1"
        try:
            self.server = socket.create_server((host, 0))
        except OSError:
            self.server = socket.create_server(("127.0.0.1", 0))
        port = self.server.getsockname()[1]
        from slurmpod.fsutil import write_atomic  # lazy: start-up

        self.file.parent.mkdir(parents=True, exist_ok=True)
        # The nonce: a stale file (an earlier job with the same ids, or another job's rank 0
        # now on that port) can only lead a rank to a rank 0 that refuses it.
        self.nonce = os.urandom(8).hex()
        write_atomic(self.file, f"{self.server.getsockname()[0]} {port} {self.nonce}\n")

    def accept_all(self, iteration: int) -> None:
        """Wait for the other world_size - 1 ranks; tell each the iteration to start from."""
        assert self.server is not None
        self.server.settimeout(self.timeout_s)
        try:
            while len(self.peers) < self.dist.world_size - 1:
                try:
                    conn, _ = self.server.accept()
                except TimeoutError:
                    raise CollectiveTimeout(
                        f"{self.dist.world_size - 1 - len(self.peers)} rank(s) did not join "
                        f"within {self.timeout_s:g} s") from None
                conn.settimeout(self.timeout_s)
                fh = conn.makefile("rwb")
                words = fh.readline().split()
                if len(words) != 5 or words[0] != b"EMU1" or not words[1].isdigit() \
                        or words[4].decode(errors="replace") != self.nonce:
                    conn.close()  # not one of ours (a stray connection): ignore it
                    continue
                rank = int(words[1])
                if not 0 < rank < self.dist.world_size or rank in self.peers:
                    conn.close()
                    continue
                self.peers[rank] = (conn, fh, words[2].decode(errors="replace"))
            for _, fh, _ in self.peers.values():
                fh.write(b"%d\n" % iteration)
                fh.flush()
        finally:
            self.server.close()
            self.server = None
            with contextlib.suppress(OSError):
                self.file.unlink()

    def node_of(self, rank: int) -> str:
        return self.peers[rank][2] if rank in self.peers else "?"

    def allreduce(self, iteration: int, stop: bool) -> bool:
        """Rank 0: gather every rank's line for `iteration`, answer with the OR of the stop
        flags (Megatron's exit-signal handler all-reduces its flag the same way)."""
        any_stop = stop
        for rank in sorted(self.peers):
            _, fh, node = self.peers[rank]
            peer = f"rank {rank} on {node}"
            line = self._line_from(fh, None, peer, f"{peer} sent nothing", iteration)
            words = line.split()
            any_stop = any_stop or (len(words) >= 2 and words[1] == b"1")
            if len(words) == 3:
                with contextlib.suppress(ValueError):
                    extra = float(words[2])
                    if math.isfinite(extra) and extra > 0:
                        self.extra_ms[rank] = self.extra_ms.get(rank, 0.0) + extra
        self._send_all(b"%d %d\n" % (iteration, 1 if any_stop else 0))
        return any_stop

    def finish(self) -> None:
        """Rank 0 is done (trained, saved and exiting): release every rank."""
        self._send_all(b"done\n")
        self.close()

    def _send_all(self, msg: bytes) -> None:
        for rank, (_, fh, node) in sorted(self.peers.items()):
            try:
                fh.write(msg)
                fh.flush()
            except OSError as exc:
                raise PeerLost(f"rank {rank} on {node}: {exc}") from None

    # other ranks -------------------------------------------------------------------------------
    def join(self, stopped: Callable[[], bool]) -> bool:
        """Find rank 0's address and connect; False when stopped (a signal) before that."""
        deadline = time.monotonic() + self.timeout_s
        while not stopped():
            if time.monotonic() > deadline:
                raise CollectiveTimeout(f"rank 0 did not publish {self.file} within "
                                        f"{self.timeout_s:g} s")
            try:
                host, port, nonce = self.file.read_text().split()
                sock = socket.create_connection((host, int(port)), timeout=self.timeout_s)
                fh = sock.makefile("rwb")
                fh.write(b"EMU1 %d %s %d %s\n" % (self.dist.rank, _node(self.env).encode(),
                                                    os.getpid(), nonce.encode()))
                fh.flush()
                first = fh.readline()
                if first.strip().isdigit():
                    self.sock, self.rfile = sock, fh
                    self.start_iteration = int(first)
                    return True
                sock.close()
            except (OSError, ValueError):
                pass  # not published yet, or the old file of a finished step: look again
            time.sleep(0.05)
        return False

    def follow(self, stopped: Callable[[], bool], slow_ms: float = 0.0) -> int:
        """A non-zero rank's training loop: one line per iteration until rank 0 says done.
        A slow rank (`--emu-slow-rank`) spends `slow_ms` more on each step before it joins, and
        says so in its line (rank 0's per-rank timers). Rank 0's death is a lost peer: like
        NCCL, wait (the step is ended by srun's --kill-on-bad-exit or by hang detection), up
        to the timeout."""
        fh = self.rfile
        iteration = self.start_iteration
        while True:
            iteration += 1
            if slow_ms > 0:
                time.sleep(slow_ms / 1000.0)
            line = self._line_from(fh, b"%d %d %.3f\n" % (iteration, 1 if stopped() else 0,
                                                          slow_ms),
                                   "rank 0", "no answer from rank 0", iteration)
            if line.strip() == b"done":
                return 0
            words = line.split()
            if len(words) == 2 and words[1] == b"1":
                continue  # stopping: rank 0 saves, then says done

    def _line_from(self, fh: Any, send: bytes | None, peer: str, silent: str,
                   iteration: int) -> bytes:
        """Send `send` (if any) to `peer`, then read its next line. Silence past the timeout is
        NCCL's watchdog (`CollectiveTimeout`); a broken or closed connection is a dead peer."""
        try:
            if send is not None:
                fh.write(send)
                fh.flush()
            line: bytes = fh.readline()
        except TimeoutError:
            raise CollectiveTimeout(f"{silent} for {self.timeout_s:g} s in "
                                    f"iteration {iteration}") from None
        except OSError as exc:
            raise PeerLost(f"{peer}: {exc}") from None
        if not line:
            raise PeerLost(f"{peer} closed its connection")
        return line

    def close(self) -> None:
        for conn, fh, _ in self.peers.values():
            with contextlib.suppress(OSError):
                fh.close()
                conn.close()
        self.peers.clear()
        if self.sock is not None:
            with contextlib.suppress(OSError):
                self.rfile.close()
                self.sock.close()
            self.sock = None
        if self.server is not None:
            self.server.close()
            with contextlib.suppress(OSError):
                self.file.unlink()


def lost_peer_wait(timeout_s: float, sig: _Signals) -> None:
    """After a lost peer, block as a rank in a broken NCCL collective does, until srun ends the
    step (a dead task with --kill-on-bad-exit), a signal, or the watchdog timeout."""
    deadline = time.monotonic() + timeout_s
    while sig.received is None and (left := deadline - time.monotonic()) > 0:
        time.sleep(min(left, 1.0))


def other_rank(args: argparse.Namespace, dist: Dist) -> int:
    """A non-zero rank: join rank 0's collective and take part in every iteration."""
    sig = _Signals()
    sig.install()
    timeout_s = args.distributed_timeout_minutes * 60.0
    coll = Collective(dist, rendezvous_dir(args), timeout_s)
    try:
        if not coll.join(lambda: sig.received is not None):
            return 0  # ended before the step began
        slow = args.emu_slow_ms if args.emu_slow_rank == dist.rank else 0.0
        return coll.follow(lambda: sig.received is not None, max(0.0, slow))
    except PeerLost as exc:
        print(f"megatron_emu: rank {dist.rank}: NCCL error: lost {exc}", file=sys.stderr,
              flush=True)
        lost_peer_wait(timeout_s, sig)
        return 1
    except CollectiveTimeout as exc:
        print(f"megatron_emu: rank {dist.rank}: watchdog timeout: {exc}", file=sys.stderr,
              flush=True)
        return 1
    finally:
        coll.close()


def timer_block(timers: dict[str, list[float]], option: str) -> str:
    """Megatron's `Timers.log` text for per-rank times in ms (megatron/core/timers.py
    `_get_all_ranks_time_string`, `_get_global_min_max_time_string`)."""
    if option == "all":
        out = "times across ranks (ms):"
        for name, ms in timers.items():
            out += f"\n  {name}:" + "".join(f"\n     rank {r:2d}: {t:.2f}"
                                             for r, t in enumerate(ms))
        return out + "\n"
    out = "max time across ranks (ms):" if option == "max" else \
        "(min, max) time across ranks (ms):"
    for name, ms in timers.items():
        dots = (name + " ").ljust(48, ".")
        out += (f"\n    {dots}: {max(ms):.2f}" if option == "max"
                else f"\n    {dots}: ({min(ms):.2f}, {max(ms):.2f})")
    return out + "\n"


def report_env(dist: Dist, out: TextIO) -> None:
    keys = sorted(k for k in os.environ
                  if k.startswith(("NCCL_", "CUDA_", "UCX_", "FI_", "PYTORCH_", "TORCH_")))
    env = " ".join(f"{k}={os.environ[k]}" for k in keys)
    node = os.environ.get("SLURMD_NODENAME", os.uname().nodename)
    print(f"megatron_emu: rank {dist.rank}/{dist.world_size} node {node} local_rank "
          f"{dist.local_rank} {env}", file=out, flush=True)


def train(args: argparse.Namespace, dist: Dist, out: TextIO = sys.stdout,
          measure: Callable[[], PeakEstimate] | None = None,
          coll: Collective | None = None) -> int:
    """Rank 0's run. With `coll` (world size > 1, already listening) every iteration ends in
    its all-reduce; a lost peer or a collective timeout ends the run with exit 1, after a lost
    peer only once srun or a signal ends the step (as NCCL)."""
    try:
        return _train(args, dist, out, measure, coll)
    except PeerLost as exc:
        print(f"megatron_emu: rank 0: NCCL error: lost {exc}", file=out, flush=True)
        lost_peer_wait(args.distributed_timeout_minutes * 60.0, _LAST_SIGNALS)
        return 1
    except CollectiveTimeout as exc:
        print(f"megatron_emu: rank 0: watchdog timeout: {exc}", file=out, flush=True)
        return 1


_LAST_SIGNALS = _Signals()


def _train(args: argparse.Namespace, dist: Dist, out: TextIO,
           measure: Callable[[], PeakEstimate] | None, coll: Collective | None) -> int:
    """Megatron's order: arguments, load, initialise (the collective, the pacing record), the
    `training ...` marker, then iterations until done, a fault or an exit condition."""
    t_start = time.monotonic()
    sig = _LAST_SIGNALS
    if args.exit_signal_handler:
        sig.install()
    print(arguments_dump(args), file=out, flush=True)
    flops_iter = model_flops_per_iteration(args)
    rows = round(flops_iter / dist.world_size / (6.0 * args.hidden_size**2))
    trainer = Trainer(args, rows)
    _load_checkpoint(args, trainer, out)
    if args.emu_fail_at_start is not None:
        print(f"megatron_emu: failing at start with exit {args.emu_fail_at_start} (as asked)",
              file=out, flush=True)
        return int(args.emu_fail_at_start)
    if coll is not None:
        coll.accept_all(trainer.iteration)
    save = Path(args.save) if args.save else None
    if save is not None:
        append_progress(save, dist, "Starting job")
    min_s = _announce_pacing(args, dist, flops_iter, out, measure)
    _print_initialized(t_start, out)
    run = _Run(args, dist, out, trainer, save, flops_iter, t_start)
    return run.loop(sig, coll, min_s)


def _load_checkpoint(args: argparse.Namespace, trainer: Trainer, out: TextIO) -> None:
    """`--load`: resume from the tracked iteration, with Megatron's lines for either outcome."""
    if not args.load:
        return
    loaded = trainer.load(Path(args.load))
    if loaded is None:
        print(f"WARNING: could not find the metadata file {Path(args.load) / TRACKER}",
              file=out)
        print("    will not load any checkpoints and will start from random", file=out)
    else:
        print(f" successfully loaded checkpoint from {args.load} [ t 1/1, p 1/1 ] "
              f"at iteration {loaded}", file=out, flush=True)


def _announce_pacing(args: argparse.Namespace, dist: Dist, flops_iter: float, out: TextIO,
                     measure: Callable[[], PeakEstimate] | None) -> float:
    """The peak this run is paced to, logged with what this CPU does now; the shortest
    iteration it allows (0 when not paced)."""
    peak = emulated_peak(args.emu_peak_tflops)
    flops_per_gpu = flops_iter / dist.world_size
    min_s = min_iteration_s(flops_per_gpu, peak.tflops)
    print(pacing_line(peak, flops_per_gpu, min_s, measure), file=out, flush=True)
    return min_s


def _print_initialized(t_start: float, out: TextIO) -> None:
    print(f"time to initialize megatron (seconds): {time.monotonic() - t_start:.3f}", file=out)
    # Megatron's print_datetime marker; the log parser dates the launch and start-up from it.
    stamp = datetime.now().strftime("%Y-%m-%d %H:%M:%S")
    print(f"[after megatron is initialized] datetime: {stamp} ", file=out)
    print("training ...", file=out, flush=True)


class _Run:
    """Rank 0's training loop and what it keeps between iterations: the FLOPs of this job,
    the last saved iteration, and the iterations of the current log interval."""

    def __init__(self, args: argparse.Namespace, dist: Dist, out: TextIO, trainer: Trainer,
                 save: Path | None, flops_iter: float, t_start: float) -> None:
        self.args, self.dist, self.out, self.trainer = args, dist, out, trainer
        self.save, self.flops_iter, self.t_start = save, flops_iter, t_start
        self.job_flops = 0.0
        self.job_t0 = time.monotonic()
        self.saved_at = trainer.iteration
        self.interval_t0 = self.job_t0
        self.step_end = self.job_t0  # when the last step's all-reduce returned
        self.interval_iters = 0
        self.losses: list[float] = []
        self.busy_s = 0.0  # this interval's own compute (every rank's, in this stand-in)
        self.own_extra_ms = 0.0  # rank 0 as the slow rank: its extra this interval
        self.coll: Collective | None = None
        self.report_memory = True
        self.start_iteration = trainer.iteration  # the iteration this launch resumed from

    def loop(self, sig: _Signals, coll: Collective | None, min_s: float) -> int:
        args, trainer = self.args, self.trainer
        self.coll = coll
        activity = gpu_activity.Recorder.from_env()
        self.interval_t0 = time.monotonic()
        while trainer.iteration < args.train_iters:
            t_step = time.monotonic()
            loss, gnorm = trainer.step()
            busy_s = time.monotonic() - t_step
            self.busy_s += busy_s
            if args.emu_slow_rank == 0 and args.emu_slow_ms > 0:
                time.sleep(args.emu_slow_ms / 1000.0)
                self.own_extra_ms += args.emu_slow_ms
            if coll is not None and coll.allreduce(trainer.iteration, sig.received is not None) \
                    and sig.received is None:
                sig.received = signal.SIGTERM  # another rank was told to stop: stop together
            pace(t_step + min_s)  # an emulated GPU is never faster than its peak
            # The step is over for every rank once the all-reduce returned: Megatron reads its
            # interval timer at this point (after the step's barrier), so what rank 0 does
            # next (logging, while the others already compute) falls in the next interval.
            self.step_end = time.monotonic()
            trainer.train_s += self.step_end - t_step
            if activity is not None:  # the sandbox's emulated GPU counters (gpu_activity.py)
                activity.iteration(busy_s, self.step_end - t_step,
                                   gpu_activity.trainer_bytes(trainer))
            self.job_flops += self.flops_iter
            it = trainer.iteration
            self._log(it, loss, gnorm)
            if args.save_interval and it % args.save_interval == 0:
                self.checkpoint()
            if it == args.emu_hold_after_iteration and args.emu_hold_file is not None:
                self._hold(it, args.emu_hold_file)
            rc = self._stop_after(it, sig)
            if rc is not None:
                return rc
        if self.save is not None and self.saved_at != trainer.iteration:
            self.checkpoint()
        print("after training is done", file=self.out, flush=True)
        return 0

    def _hold(self, it: int, release: Path) -> None:
        """Wait for `release` to exist. The wait is outside every timed interval (the next
        iteration's time starts after it), so it changes no logged figure."""
        print(f"megatron_emu: holding after iteration {it} until {release} exists (as asked)",
              file=self.out, flush=True)
        t0 = time.monotonic()
        while not release.exists():
            time.sleep(0.05)
        self.interval_t0 += time.monotonic() - t0

    def _log(self, it: int, loss: float, gnorm: float) -> None:
        """Megatron's iteration line every `--log-interval`: the interval's mean time and loss."""
        args = self.args
        self.interval_iters += 1
        self.losses.append(loss)
        if it % args.log_interval:
            return
        now = self.step_end
        elapsed = (now - self.interval_t0) / self.interval_iters
        tflops = self.flops_iter / (elapsed * 1e12 * self.dist.world_size) \
            if args.log_throughput else None
        print(iteration_line(it, args, self.trainer.consumed_samples, elapsed, tflops,
                             learning_rate(args, it), float(np.mean(self.losses)), gnorm),
              file=self.out, flush=True)
        if args.timing_log_level:
            print(self._timers(elapsed), file=self.out, end="", flush=True)
        if self.report_memory or (args.log_memory_interval
                                  and it % args.log_memory_interval == 0):
            print(memory_line(it, self.dist.rank, gpu_activity.trainer_arrays(self.trainer),
                              args), file=self.out, flush=True)
            # As Megatron main: again after the second iteration when the first was logged
            # (the optimizer's states exist from the end of the first).
            self.report_memory = it <= self.start_iteration + 1
        self.interval_t0, self.interval_iters, self.losses = now, 0, []
        self.busy_s, self.own_extra_ms = 0.0, 0.0
        if self.coll is not None:
            self.coll.extra_ms.clear()

    def _timers(self, elapsed_s: float) -> str:
        """Megatron's timer block for this interval, per iteration: `forward-backward` (every
        rank waits for the slowest, so the step), and at level 2 each rank's compute, split a
        third forward, two thirds backward. Only rank 0 computes here; its compute stands in
        for every rank's, plus a slow rank's extra."""
        n = max(self.interval_iters, 1)
        base = 1000.0 * self.busy_s / n
        extra = dict(self.coll.extra_ms) if self.coll is not None else {}
        extra[0] = extra.get(0, 0.0) + self.own_extra_ms
        compute = [base + extra.get(r, 0.0) / n for r in range(self.dist.world_size)]
        timers = {"forward-backward": [1000.0 * elapsed_s] * self.dist.world_size}
        if self.args.timing_log_level >= 2:
            timers["forward-compute"] = [c / 3 for c in compute]
            timers["backward-compute"] = [2 * c / 3 for c in compute]
        return timer_block(timers, self.args.timing_log_option)

    def _stop_after(self, it: int, sig: _Signals) -> int | None:
        """The exit code when iteration `it` ends the run (an asked-for crash, SIGTERM,
        `--exit-duration-in-mins`, `--exit-interval`; saved first but for the crash), else None."""
        args, out, save = self.args, self.out, self.save
        if args.emu_fail_at_iteration == it and save is not None \
                and not (save / f".emu-crashed-{it}").exists():
            (save / f".emu-crashed-{it}").touch()  # once per run: the resumed attempt goes on
            print(f"megatron_emu: crashing after iteration {it} (as asked)", file=out,
                  flush=True)
            return 1
        if sig.received is not None:
            self._save_unless_saved(it)
            print("exiting program after receiving SIGTERM.", file=out, flush=True)
            return 0
        if args.exit_duration_in_mins is not None and \
                (time.monotonic() - self.t_start) / 60.0 > args.exit_duration_in_mins:
            self._save_unless_saved(it)
            print(f"exiting program after {(time.monotonic() - self.t_start) / 60.0:.2f} "
                  f"minutes", file=out, flush=True)
            return 0
        if args.exit_interval and it % args.exit_interval == 0:
            self._save_unless_saved(it)
            print(f"exiting program at iteration {it}", file=out, flush=True)
            return 0
        return None

    def _save_unless_saved(self, it: int) -> None:
        if self.saved_at != it:
            self.checkpoint()

    def checkpoint(self) -> None:
        """Save (with Megatron's lines) and append the throughput record to progress.txt."""
        trainer, out, save, dist = self.trainer, self.out, self.save, self.dist
        self.saved_at = trainer.iteration
        if save is None:
            return
        # As Megatron's save_checkpoint_and_time: the interval timer stops for the save, so the
        # next iteration line's time leaves it out and the save shows as a gap in their clock.
        t0 = time.monotonic()
        print(f"saving checkpoint at iteration {trainer.iteration:7d} to {save} in torch format",
              file=out, flush=True)
        trainer.save(save)
        print(f"  successfully saved checkpoint from iteration {trainer.iteration:7d} to {save} "
              f"[ t 1/1, p 1/1 ]", file=out, flush=True)
        self.interval_t0 += time.monotonic() - t0
        wall = max(time.monotonic() - self.job_t0, 1e-9)
        job_tp = self.job_flops / wall / dist.world_size / 1e12  # as Megatron: per GPU
        cum_tp = trainer.iteration * self.flops_iter / max(trainer.train_s, 1e-9) \
            / dist.world_size / 1e12
        append_progress(save, dist, (
            f"Saved checkpoint\tIteration: {trainer.iteration}\t"
            f"Job throughput: {job_tp:.3g} TFLOP/s/GPU\t"
            f"Cumulative throughput: {cum_tp:.3g} TFLOP/s/GPU\t"
            f"Floating-point operations: {trainer.iteration * self.flops_iter:.2e}\t"
            f"Tokens (in billions): "
            f"{trainer.consumed_samples * self.args.seq_length / 1e9:.2f}"))


def main(argv: list[str] | None = None) -> int:
    args, unknown = build_parser().parse_known_args(argv)
    dist = Dist.from_env()
    gpu_activity.record_rank(dist.rank, dist.local_rank)
    if args.emu_report_env:
        report_env(dist, sys.stdout)
    if dist.rank != 0:
        return other_rank(args, dist)
    args = finish_args(args, dist)
    if unknown:
        print(f"megatron_emu: ignoring arguments it does not model: {' '.join(unknown)}",
              flush=True)
    coll = None
    if dist.world_size > 1:
        coll = Collective(dist, rendezvous_dir(args), args.distributed_timeout_minutes * 60.0)
        coll.listen()  # before loading: the other ranks connect while rank 0 starts up
    rc = 1
    try:
        rc = train(args, dist, coll=coll)
        return rc
    finally:
        if coll is not None:
            if rc == 0:
                with contextlib.suppress(PeerLost):
                    coll.finish()
            coll.close()


if __name__ == "__main__":
    sys.exit(main())
