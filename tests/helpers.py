"""What several test files share: the Megatron emulator with a tiny model, an independent
reading of Megatron's iteration lines (a regex here, never slurmpod's log parser), polling
with a deadline and `promtool check metrics`."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from slurmpod.sandbox.workload import EMULATOR_MODULE

# tests/data: the fixtures every test reads (each file names its own subfolder).
DATA_DIR = Path(__file__).resolve().parent / "data"

# The emulated trainer (docs/workload.md): every test that starts it builds its command line from
# these, so a move of the module is one edit (slurmpod/sandbox/workload/__init__.py).
EMU_MODULE = EMULATOR_MODULE
EMU = [sys.executable, "-m", EMU_MODULE]
TINY = ["--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4",
        "--seq-length", "32", "--micro-batch-size", "2", "--global-batch-size", "8",
        "--vocab-size", "256", "--log-interval", "1", "--lr", "1e-3"]
ITERATION = re.compile(
    r"iteration\s+(\d+)/\s*\d+ \|.*?elapsed time per iteration \(ms\): ([0-9.]+) \|")
LOADED = re.compile(r"successfully loaded checkpoint from .* at iteration (\d+)")


def log_iterations(text: str) -> list[tuple[int, float]]:
    """(iteration, ms) from Megatron's iteration lines, in log order."""
    return [(int(m.group(1)), float(m.group(2))) for m in ITERATION.finditer(text)]


def segments(text: str) -> list[list[tuple[int, float]]]:
    """(iteration, ms) per launch: a new launch starts where the iteration does not increase."""
    segs: list[list[tuple[int, float]]] = []
    for it, ms in log_iterations(text):
        if not segs or it <= segs[-1][-1][0]:
            segs.append([])
        segs[-1].append((it, ms))
    return segs


def wait_for(fetch: Callable[[], Any], timeout_s: float, what: str) -> Any:
    """Poll `fetch` until it returns something truthy (returned); fail the test at the deadline."""
    deadline = time.monotonic() + timeout_s
    while True:
        got = fetch()
        if got:
            return got
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout_s:g} s waiting for {what}", pytrace=False)
        time.sleep(0.3)


def promtool_check(text: str) -> None:
    """`promtool check metrics` on a Prometheus textfile: skipped locally without promtool, a
    failure under CI (.ci/install installs Debian's prometheus, which ships it)."""
    promtool = shutil.which("promtool")
    if promtool is None:
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail("CI must run promtool (.ci/install installs Debian's prometheus)",
                        pytrace=False)
        pytest.skip("promtool not installed")
    cp = subprocess.run([promtool, "check", "metrics"], input=text.encode(),
                        capture_output=True, timeout=60)
    assert cp.returncode == 0, (cp.stdout + cp.stderr).decode(errors="replace")
