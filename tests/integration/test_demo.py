"""`slurmpod demo`, the README's main command, on the session's sandbox: the job trains, and the
report shows its iterations; run again, it trains afresh instead of resuming a finished run."""

from __future__ import annotations

import re
import subprocess
import sys
from typing import Any


def _demo(sandbox: Any, iters: int) -> str:
    cp = subprocess.run(
        [sys.executable, "-m", "slurmpod", "demo", "--state", str(sandbox.sb.state_dir),
         "--iters", str(iters), "--timeout", "240"],
        env=sandbox.env, capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL,
        cwd=sandbox.tmp_dir)
    assert cp.returncode == 0, cp.stderr[-2000:]
    return cp.stdout


def _job_id(out: str) -> str:
    m = re.search(r"job (\d+) submitted", out)
    assert m, out[-2000:]
    return m[1]


def test_demo_trains_and_reports_twice_in_a_row(sandbox: Any) -> None:
    first = _demo(sandbox, 12)
    assert "already running" in first  # the session's sandbox, not a second one
    assert re.search(r"job \d+ COMPLETED in \S+ on gpu\S+", first), first[-2000:]
    assert "iterations   12 logged, last 12" in first
    again = _demo(sandbox, 10)
    assert _job_id(again) != _job_id(first)
    # A fresh run: ten iterations trained, not an instant exit from the finished checkpoint.
    assert "iterations   10 logged, last 10" in again, again[-2000:]
    assert "no-iterations" not in again
