"""The health gate: quick per-node checks before each attempt's trainer starts.

The batch script runs `NODE_CHECK` once per candidate node (the job's healthy nodes, spares
included) in one `srun --ntasks-per-node=1` step, under a timeout, and hands the output to
`python -m slurmpod.resilience.health`, which records a `health` event in the attempts record
and prints the nodes that failed. A node fails when a check says so or when it printed nothing
(its slurmd did not launch the task, or the check hung). Checks (docs/resilience-in-job.md,
"Health gate"):

- **GPUs visible**: `nvidia-smi --query-gpu=index --format=csv,noheader` lists the expected
  count where nvidia-smi exists (the sandbox has an emulated one that answers this form);
  otherwise the GPUs Slurm gave the step (`CUDA_VISIBLE_DEVICES`).
- **HCAs up**: each expected compute HCA's ports in `/sys/class/infiniband` are ACTIVE, at the
  expected rate when one is given (left out for emulated GPUs: the sandbox has no HCAs).
- **Checkpoint path**: writable (a probe file) with at least the given free bytes (`df`).
- **Site checks**: an executable named by `--health-check` (render) runs last; non-zero fails
  the node with its first output line.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from collections.abc import Mapping, Sequence

from slurmpod.resilience import stepargs

# Run as `bash -c "$NODE_CHECK" slurmpod-health GPUS HCAS RATE CKPT MIN_FREE SITE_CHECK`; it
# prints exactly one `slurmpod-health: NODE ok|fail WHY` line. No user value is part of it.
NODE_CHECK = r"""node="${SLURMD_NODENAME:-$(hostname -s)}"
gpus="$1" hcas="$2" rate="$3" ckpt="$4" min_free="$5" site="$6"
fail() { echo "slurmpod-health: $node fail $*"; exit 0; }
if command -v nvidia-smi >/dev/null 2>&1; then
  n=$(timeout 20 nvidia-smi --query-gpu=index --format=csv,noheader 2>/dev/null \
      | grep -c '^[0-9]') || n=0
  [ "$n" -ge "$gpus" ] || fail "nvidia-smi lists $n of $gpus GPUs"
else
  IFS=, read -r -a vis <<< "${CUDA_VISIBLE_DEVICES:-}"
  n=0; for v in "${vis[@]}"; do [ -n "$v" ] && n=$((n + 1)); done
  [ "$n" -ge "$gpus" ] || fail "$n of $gpus GPUs visible (CUDA_VISIBLE_DEVICES)"
fi
if [ -n "$hcas" ]; then
  IFS=, read -r -a want <<< "$hcas"
  for h in "${want[@]}"; do
    d="/sys/class/infiniband/$h/ports"
    [ -d "$d" ] || fail "HCA $h missing"
    for p in "$d"/*; do
      st=$(cat "$p/state" 2>/dev/null)
      [[ "$st" == *ACTIVE* ]] || fail "HCA $h port ${p##*/} ${st:-unreadable}"
      if [ -n "$rate" ]; then
        r=$(cat "$p/rate" 2>/dev/null)
        [[ "$r" == "$rate"* ]] || fail "HCA $h port ${p##*/} rate ${r:-unreadable}, not $rate"
      fi
    done
  done
fi
if [ -n "$ckpt" ]; then
  probe="$ckpt/.slurmpod-health.${SLURM_JOB_ID:-0}.$node"
  { mkdir -p -- "$ckpt" && : > "$probe" && rm -f -- "$probe"; } 2>/dev/null \
    || fail "checkpoint directory $ckpt not writable"
  free=$(df -P -B1 -- "$ckpt" 2>/dev/null | awk 'NR==2 {print $4}')
  [ -z "$free" ] || [ "$free" -ge "$min_free" ] \
    || fail "checkpoint directory $ckpt has $free bytes free, needs $min_free"
fi
if [ -n "$site" ]; then
  out=$(timeout 60 "$site" 2>&1) || fail "site check $site: $(head -n1 <<< "$out")"
fi
echo "slurmpod-health: $node ok"
"""

_LINE = re.compile(r"^(?:\s*\d+: )?slurmpod-health: (?P<node>[A-Za-z0-9._-]+) "
                   r"(?P<ok>ok|fail)(?: (?P<why>.*))?$")


def failed_nodes(output: str, candidates: Sequence[str]) -> dict[str, str]:
    """node -> why, for every candidate that failed a check or printed nothing."""
    seen: dict[str, str | None] = {}
    for line in output.splitlines():
        m = _LINE.match(line.rstrip())
        if m:
            seen[m["node"]] = None if m["ok"] == "ok" else (m["why"] or "failed")
    out = {n: why for n, why in seen.items() if why is not None}
    for n in candidates:
        if n not in seen:
            out[n] = "no answer from the node's check (slurmd down or the check hung)"
    return out


def record(job_id: str, attempt: int, checked: Sequence[str], failed: Mapping[str, str],
           duration_s: float) -> str:
    return json.dumps({"v": 1, "event": "health", "job_id": job_id, "attempt": attempt,
                       "time": int(time.time()), "checked": list(checked),
                       "failed": dict(failed), "duration_s": round(duration_s, 3)},
                      separators=(",", ":")) + "\n"


def build_parser() -> argparse.ArgumentParser:
    """The gate's one parser: argparse, as it runs in the job script with the job's Python,
    starts fast and needs no `slurmpod` on PATH (slurmpod.resilience.stepargs)."""
    p = stepargs.parser("health")
    stepargs.add_attempt(p)
    stepargs.add_nodes(p, required=True, help="candidates, comma-separated")
    p.add_argument("--output", required=True, help="the gate step's output")
    p.add_argument("--duration-s", type=float, default=0.0)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    nodes = stepargs.node_list(args.nodes)
    try:
        with open(args.output, encoding="utf-8", errors="replace") as fh:
            text = fh.read(4 << 20)
    except OSError:
        text = ""
    failed = failed_nodes(text, nodes)
    with open(args.attempts, "a", encoding="utf-8") as fh:
        fh.write(record(args.job_id, args.attempt, nodes, failed, args.duration_s))
    for node, why in failed.items():
        print(f"slurmpod: health gate: {node} failed: {why}", file=sys.stderr)
        print(node)
    return 0


if __name__ == "__main__":
    sys.exit(main())
