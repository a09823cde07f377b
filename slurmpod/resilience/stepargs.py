"""The one parser form of the job script's resilience helpers: `python -m
slurmpod.resilience.shedding`, `.health` and `.allreduce` (templates/sbatch/megatron-base.sbatch.j2
and docs/resilience-in-job.md run them).

argparse, not click like slurmpod's commands, on purpose: they run inside the batch script on the
batch node with the job's Python (`$PY`), once or more per attempt and while an attempt is being
replaced, so they must start fast (the standard library only: no click, nothing of slurmpod.cli)
and must not depend on the `slurmpod` console script being on the compute node's PATH. The same
form as the emulator's `build_parser` (slurmpod/sandbox/workload/megatron_emu.py): each module
has one parser, its `build_parser()`, and the arguments they share are added here once.
"""

from __future__ import annotations

import argparse


def parser(module: str) -> argparse.ArgumentParser:
    """A parser named as the job script calls it: `python -m slurmpod.resilience.MODULE`."""
    return argparse.ArgumentParser(prog=f"python -m slurmpod.resilience.{module}")


def add_attempt(p: argparse.ArgumentParser) -> None:
    """Which job and attempt the step is about, and the run's record to append to."""
    p.add_argument("--job-id", required=True)
    p.add_argument("--attempt", type=int, required=True)
    p.add_argument("--attempts", required=True, help="the run's attempts.jsonl")


def add_nodes(p: argparse.ArgumentParser, *, required: bool, help: str) -> None:
    """`--nodes` as the job script builds it: `$(IFS=,; echo "${NODES[*]}")`."""
    if required:
        p.add_argument("--nodes", required=True, help=help)
    else:
        p.add_argument("--nodes", default="", help=help)


def node_list(text: str) -> list[str]:
    """The `--nodes` value as a list; empty items (a trailing comma, an empty array) dropped."""
    return [n for n in text.split(",") if n]
