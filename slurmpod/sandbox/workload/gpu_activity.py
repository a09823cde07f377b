"""What the sandbox's emulated GPUs did: the emulator's real activity, recorded for the shims.

Only in the sandbox: `slurmpod sandbox up` installs a TaskProlog that exports
`SLURMPOD_EMU_GPU_DIR` (`<state>/gpu`) into every task; without it nothing is recorded, so on
a real cluster the emulator writes nothing. The sandbox's `dcgmi` and `nvidia-smi` shims
(slurmpod/sandbox/gpu_shims.py) read it back (docs/sandbox.md, "Emulated GPU telemetry").

Per job, `<dir>/<job id>/`:

- `rank-<R>.json`, one per rank at start: `{"node", "gpu", "job_gpus", "t"}`: which GPU of
  which node the rank drives (the `SLURM_LOCALID`-th of the step's or job's GPUs) and the
  job's GPUs on that node;
- `activity.json`, rewritten by rank 0 after every iteration: `{"t0", "t", "busy_s", "iters",
  "mem_bytes", "util_last", "util_max"}`: wall-clock start and last update (epoch s), seconds
  spent in the iteration's GEMMs (`Trainer.step`), the bytes of its arrays (the model, the
  dataset and one micro-batch's temporaries), and the busy fraction of the last and busiest
  iteration. A later step of the same job (a relaunch) continues the counters.

Only rank 0 computes; the other ranks of a data-parallel step do the same work on real GPUs,
so the shims show rank 0's activity on every GPU that has a rank.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

ENV = "SLURMPOD_EMU_GPU_DIR"
ACTIVITY = "activity.json"


def job_dir(env: Mapping[str, str]) -> Path | None:
    """`<dir>/<job id>` in the sandbox, else None (a real cluster: record nothing)."""
    root, job = env.get(ENV), env.get("SLURM_JOB_ID", "")
    if not root or not job.isdigit():
        return None
    return Path(root) / job


def _ids(text: str | None) -> list[int]:
    out = []
    for part in (text or "").split(","):
        if part.strip().isdigit():
            out.append(int(part))
    return out


def _write(path: Path, doc: Mapping[str, Any]) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    tmp.write_text(json.dumps(doc))
    os.replace(tmp, path)


def record_rank(rank: int, local_rank: int, env: Mapping[str, str] = os.environ) -> None:
    """Say which GPU this rank drives. Never fails the workload."""
    d = job_dir(env)
    if d is None:
        return
    job_gpus = _ids(env.get("SLURM_JOB_GPUS")) or _ids(env.get("CUDA_VISIBLE_DEVICES"))
    step_gpus = _ids(env.get("SLURM_STEP_GPUS")) or job_gpus
    gpu = step_gpus[local_rank % len(step_gpus)] if step_gpus else local_rank
    node = env.get("SLURMD_NODENAME") or os.uname().nodename
    try:
        d.mkdir(parents=True, exist_ok=True)
        _write(d / f"rank-{rank}.json", {"node": node, "gpu": gpu,
                                         "job_gpus": job_gpus or [gpu], "t": time.time()})
    except OSError:
        pass


class Recorder:
    """Rank 0's counters, written after every iteration (a few hundred bytes, atomically)."""

    def __init__(self, d: Path) -> None:
        self.path = d / ACTIVITY
        self.doc: dict[str, Any] = {"t0": time.time(), "busy_s": 0.0, "iters": 0,
                                    "mem_bytes": 0, "util_max": 0.0}
        try:
            old = json.loads(self.path.read_text())
            if isinstance(old, dict):  # a relaunch within the job: carry on
                self.doc.update({k: old[k] for k in self.doc if k in old})
        except (OSError, ValueError):
            pass
        self.doc["t"] = time.time()
        self.ok = True

    @classmethod
    def from_env(cls, env: Mapping[str, str] = os.environ) -> Recorder | None:
        d = job_dir(env)
        if d is None:
            return None
        try:
            d.mkdir(parents=True, exist_ok=True)
        except OSError:
            return None
        return cls(d)

    def iteration(self, busy_s: float, wall_s: float, mem_bytes: int) -> None:
        if not self.ok:
            return
        d = self.doc
        util = min(busy_s / wall_s, 1.0) if wall_s > 0 else 0.0
        d["busy_s"] += busy_s
        d["iters"] += 1
        d["mem_bytes"] = max(d["mem_bytes"], mem_bytes)
        d["util_last"] = util
        d["util_max"] = max(d["util_max"], util)
        d["t"] = time.time()
        try:
            _write(self.path, d)
        except OSError:
            self.ok = False  # a full disk must not stop training


def read_job(d: Path) -> tuple[dict[str, Any] | None, list[dict[str, Any]]]:
    """(activity or None, rank records) of one job's directory; unreadable files are skipped."""
    act: dict[str, Any] | None = None
    ranks: list[dict[str, Any]] = []
    try:
        names = os.listdir(d)
    except OSError:
        return None, []
    for name in names:
        if not (name == ACTIVITY or (name.startswith("rank-") and name.endswith(".json"))):
            continue
        try:
            doc = json.loads((d / name).read_text())
        except (OSError, ValueError):
            continue
        if not isinstance(doc, dict):
            continue
        if name == ACTIVITY:
            act = doc
        elif isinstance(doc.get("node"), str) and isinstance(doc.get("gpu"), int):
            ranks.append(doc)
    return act, ranks


def trainer_arrays(trainer: Any) -> list[int]:
    """The emulator's arrays as GPU memory, bytes each: dataset, targets, weights and gradient,
    plus one micro-batch chunk's gathered inputs, targets, error and data gradient (float32)."""
    x, w = trainer.x, trainer.w
    chunk = min(trainer.rows, x.shape[0]) * w.shape[0] * w.itemsize
    return [int(x.nbytes), int(trainer.y.nbytes), int(w.nbytes), int(w.nbytes)] + [chunk] * 4


def trainer_bytes(trainer: Any) -> int:
    """The emulator's arrays as GPU memory (`trainer_arrays`), in all."""
    return sum(trainer_arrays(trainer))
