"""The run directory: what `submit` writes where, through the CommandRunner (here or over SSH).

    <run_dir>/<name>.sbatch           the script Slurm runs (`--chdir` is the run directory)
    <run_dir>/logs/                   Slurm's --output files; Slurm does not create directories
    <run_dir>/.slurmpod/submission.json
                                      the marker: the script's token, "submitting" before
                                      sbatch and "submitted" with the job ids after each one

The marker is read back with the bounded reader of a run's files (`runs.files`), as `slurmpod
runs`/`logs` read them.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import PurePosixPath
from typing import TYPE_CHECKING, Any

from slurmpod.errors import CommandError

if TYPE_CHECKING:
    from slurmpod.megatron.runspec import RunSpec
    from slurmpod.transport.base import CommandRunner

MARKER = ".slurmpod/submission.json"
LOGS = "logs"
_MARKER_MAX_BYTES = 64 << 10  # a marker holds a token and a few job ids


def script_path(run_dir: str, name: str) -> str:
    return f"{run_dir}/{name}.sbatch"


def resolve_run_dir(run: RunSpec, explicit: str | None, base: str) -> str:
    """An absolute run directory: explicit > [job] work_dir > slurmpod-runs/<name>, relative
    paths taken from `base` (the local cwd, or the remote home over SSH)."""
    from slurmpod.render.sbatch import default_run_dir  # lazy: start-up

    raw = explicit or run.job.work_dir or default_run_dir(run.job.name)
    p = PurePosixPath(raw)
    return str(p if p.is_absolute() else PurePosixPath(base) / p)


def store_script(runner: CommandRunner, run_dir: str, path: str, script: str) -> None:
    """The script, executable, and the logs directory Slurm opens --output in at start."""
    try:
        runner.write_text(path, script, mode=0o755)
        runner.write_text(f"{run_dir}/{LOGS}/.keep", "")
    except OSError as exc:  # a local run dir; SSH raises SshError itself
        from slurmpod.fsutil import output_error  # lazy: start-up

        raise output_error(run_dir, exc) from None


def read_marker(runner: CommandRunner, run_dir: str) -> dict[str, Any] | None:
    """The marker, or None when there is none (or it cannot be read or parsed: then the
    submission goes ahead, as for a new run)."""
    from slurmpod.runs.files import FileUnreadable, read_piece  # lazy: start-up

    try:
        piece = read_piece(runner, f"{run_dir}/{MARKER}", 0, _MARKER_MAX_BYTES)
        data = json.loads(piece.data.decode())
    except (FileUnreadable, CommandError, UnicodeDecodeError, json.JSONDecodeError):
        return None
    return data if isinstance(data, dict) else None


def write_marker(runner: CommandRunner, run_dir: str, *, token: str, state: str, script: str,
                 job_ids: Sequence[str]) -> None:
    data = {"token": token, "state": state, "script": script, "job_ids": list(job_ids)}
    runner.write_text(f"{run_dir}/{MARKER}", json.dumps(data, indent=2) + "\n")
