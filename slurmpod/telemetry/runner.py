"""Run a telemetry tool: argv only (no shell), a timeout, output capped, never raises."""

from __future__ import annotations

import subprocess

MAX_OUTPUT = 4 << 20


def run(argv: list[str], timeout_s: float) -> tuple[int, str, str]:
    """(returncode, stdout, stderr). Missing tool: 127; timeout: 124 (the tool is killed)."""
    try:
        cp = subprocess.run(argv, capture_output=True, timeout=timeout_s, check=False,
                            stdin=subprocess.DEVNULL)
    except FileNotFoundError:
        return 127, "", f"{argv[0]}: not found"
    except subprocess.TimeoutExpired:
        return 124, "", f"{argv[0]}: timed out after {timeout_s:g} s"
    except OSError as exc:
        return 126, "", f"{argv[0]}: {exc}"
    out = cp.stdout[:MAX_OUTPUT].decode("utf-8", "replace")
    err = cp.stderr[:MAX_OUTPUT].decode("utf-8", "replace")
    return cp.returncode, out, err
