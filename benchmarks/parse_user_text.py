"""Time slurmpod's parsers of user-supplied text on long lines: every one must be linear.

`slurmpod plan x.sh` reads a launch script and `plan --from-megatron-args` a pasted command line;
both once had quadratic paths (a `\\S+\\.py\\b` search and shlex on one long word: 100 KB took
16 s). For each input shape and size this prints the seconds and the ratio to the previous
size: a linear parser shows ~10x per 10x of input, a quadratic one ~100x.

    .venv/bin/python benchmarks/parse_user_text.py [--max-mb 10]
"""

from __future__ import annotations

import argparse
import contextlib
import time
from collections.abc import Callable

from slurmpod.errors import SlurmpodError
from slurmpod.megatron.args import from_launch_script, from_megatron_args

REAL_ARGS = ("--num-layers 32 --hidden-size 4096 --num-attention-heads 32 --seq-length 4096 "
             "--max-position-embeddings 4096 --micro-batch-size 1 --global-batch-size 512 ")


def shapes(n: int) -> dict[str, tuple[Callable[[str], object], str]]:
    return {
        "script: one long assignment": (
            from_launch_script,
            "#!/bin/bash\nX=" + "a" * n + "\npython pretrain_gpt.py " + REAL_ARGS + "\n"),
        "script: long line of dots": (from_launch_script, "x . " + "." * n + " y\n"),
        "args: one long word": (from_megatron_args, REAL_ARGS + "--data-path " + "d" * n),
        "args: many words": (from_megatron_args,
                             REAL_ARGS + " ".join(["--x-y 1"] * (n // 8))),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--max-mb", type=float, default=10.0)
    args = ap.parse_args()
    sizes = [10_000, 100_000, 1_000_000]
    if args.max_mb >= 10:
        sizes.append(10_000_000)
    print(f"{'input':30} {'bytes':>11} {'seconds':>9} {'ratio':>7}")
    for name in shapes(1):
        prev = None
        for n in sizes:
            fn, text = shapes(n)[name]
            t = time.perf_counter()
            with contextlib.suppress(SlurmpodError):  # a refusal is an answer too
                fn(text)
            dt = time.perf_counter() - t
            ratio = f"{dt / prev:7.1f}" if prev else "      -"
            print(f"{name:30} {len(text):>11,} {dt:9.4f} {ratio}")
            prev = max(dt, 1e-6)


if __name__ == "__main__":
    main()
