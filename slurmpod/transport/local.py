"""LocalRunner: run argv lists as local subprocesses (never through a shell) with timeouts."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Mapping
from pathlib import Path

from slurmpod.errors import CommandError
from slurmpod.fsutil import write_atomic
from slurmpod.transport.base import BaseRunner, CommandResult, CommandTimeoutError

DEFAULT_TIMEOUT_S = 60.0


class LocalRunner(BaseRunner):
    """Runs commands on this machine. `env` entries are added to the inherited environment."""

    def __init__(self, env: Mapping[str, str] | None = None,
                 default_timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        self._env = dict(env or {})
        self.default_timeout_s = default_timeout_s

    @property
    def where(self) -> str:
        return "local"

    def _execute(self, args: list[str], input_text: str | None, timeout: float,
                 env: Mapping[str, str] | None, cwd: str | None) -> CommandResult:
        full_env = None
        if self._env or env:
            full_env = {**os.environ, **self._env, **(env or {})}
        start = time.monotonic()
        try:
            proc = subprocess.run(  # argv list, shell=False: nothing is ever shell-parsed
                args, input=input_text, capture_output=True, text=True, timeout=timeout,
                env=full_env, cwd=cwd, check=False,
                stdin=None if input_text is not None else subprocess.DEVNULL,
            )
        except FileNotFoundError as exc:
            missing = args[0] if exc.filename in (None, args[0]) else exc.filename
            raise CommandError(args, 127, f"command not found: {missing}",
                               hint=f"is `{args[0]}` installed and on PATH?") from None
        except subprocess.TimeoutExpired as exc:
            err = exc.stderr.decode() if isinstance(exc.stderr, bytes) else (exc.stderr or "")
            raise CommandTimeoutError(args, timeout, err, where=self.where) from None
        return CommandResult(tuple(args), proc.returncode, proc.stdout, proc.stderr,
                             time.monotonic() - start)

    def write_text(self, path: str, text: str, mode: int = 0o644) -> str:
        target = Path(path).expanduser().resolve()
        write_atomic(target, text, mode)
        return str(target)

    def upload(self, local_path: Path, remote_dir: str, name: str | None = None) -> str:
        dest_dir = Path(remote_dir).expanduser().resolve()
        dest_dir.mkdir(parents=True, exist_ok=True)
        dest = dest_dir / (name or Path(local_path).name)
        tmp = dest.with_name(f".{dest.name}.upload.tmp")
        try:
            shutil.copy2(local_path, tmp)
            os.replace(tmp, dest)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        return str(dest)

    def close(self) -> None:
        """Nothing to release locally."""
