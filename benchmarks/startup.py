"""What slurmpod's start-up costs over a bare `python -c pass`, for the commands people run most.

Each command runs in a fresh interpreter through the installed `slurmpod` entry point (the same
interpreter as the bare run), N times, interleaved with the bare runs so that a busy machine
slows both alike. Printed: min and median wall time of each, and each command minus bare
Python (min − min, median − median). Targets (issue 20): `--version` within 25 ms and
`plan --preset llama3-8b` within 100 ms of bare Python. Bytecode is compiled first, as pip does
at install. The figures live in docs/architecture.md ("Start-up").

    python benchmarks/startup.py [--runs 20]
"""

from __future__ import annotations

import argparse
import compileall
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BARE = [sys.executable, "-c", "pass"]
ENTRY = [sys.executable, "-c", "from slurmpod.cli.entry import main; main()"]
COMMANDS = {
    "--version": ["--version"],
    "--help": ["--help"],
    "plan --preset llama3-8b": ["plan", "--preset", "llama3-8b"],
}
TARGET_MS = {"--version": 25.0, "plan --preset llama3-8b": 100.0}


def wall_ms(argv: list[str]) -> float:
    t0 = time.perf_counter()
    cp = subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, cwd=ROOT)
    took = (time.perf_counter() - t0) * 1000
    if cp.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} exited {cp.returncode}: {cp.stderr.decode()[-500:]}")
    return took


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=20)
    args = ap.parse_args()
    compileall.compile_dir(ROOT / "slurmpod", quiet=1)
    times: dict[str, list[float]] = {"bare python": [], **{name: [] for name in COMMANDS}}
    for extra in COMMANDS.values():  # one warm-up each: the page cache, not the figure
        wall_ms([*ENTRY, *extra])
    for _ in range(args.runs):
        times["bare python"].append(wall_ms(BARE))
        for name, extra in COMMANDS.items():
            times[name].append(wall_ms([*ENTRY, *extra]))
    bare = times["bare python"]
    print(f"{args.runs} runs each, {sys.executable} (Python {sys.version.split()[0]})")
    print(f"{'command':28} {'min ms':>8} {'median':>8} {'+min':>8} {'+median':>8} {'target':>8}")
    for name, ts in times.items():
        lo, med = min(ts), statistics.median(ts)
        extra = ("" if name == "bare python" else
                 f" {lo - min(bare):8.1f} {med - statistics.median(bare):8.1f}")
        target = f" {'+' + format(TARGET_MS[name], '.0f'):>8}" if name in TARGET_MS else ""
        print(f"{name:28} {lo:8.1f} {med:8.1f}{extra}{target}")


if __name__ == "__main__":
    main()
