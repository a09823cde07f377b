"""The CommandRunner protocol: run an argv list somewhere (here or over SSH) and move files there.

Backends talk to Slurm only through a runner, so "where" (local subprocess or SSH) and "how"
(Slurm CLI or pyslurm) stay two independent axes.
"""

from __future__ import annotations

import os
import re
import shlex
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, Self, runtime_checkable

from slurmpod.errors import CommandError

_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


@dataclass(frozen=True)
class CommandResult:
    """What one finished command produced."""

    argv: tuple[str, ...]
    returncode: int
    stdout: str
    stderr: str
    duration_s: float


class CommandTimeoutError(CommandError):
    """The command ran past its timeout and was killed (reported as exit 124, like timeout(1))."""

    def __init__(self, argv: Sequence[str], timeout_s: float, stderr: str = "",
                 where: str = "local") -> None:
        super().__init__(list(argv), 124, stderr,
                         hint="Slurm may be overloaded or down; check `sinfo` and slurmctld")
        self.timeout_s = timeout_s
        self.message = f"`{argv[0]}` timed out after {timeout_s:g} s ({where})"
        self.args = (self.message,)


@runtime_checkable
class CommandRunner(Protocol):
    """Runs commands and places files on one machine (this one, or a cluster login node)."""

    @property
    def where(self) -> str:
        """A short description for messages: `local` or `ssh user@host:port`."""
        ...

    def run(
        self,
        argv: Sequence[str],
        *,
        input_text: str | None = None,
        timeout_s: float | None = None,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        check: bool = True,
    ) -> CommandResult:
        """Run `argv` (never through a local shell); CommandError on non-zero exit if `check`."""
        ...

    def write_text(self, path: str, text: str, mode: int = 0o644) -> str:
        """Write `text` to `path` on the runner's machine atomically; return the absolute path."""
        ...

    def upload(self, local_path: Path, remote_dir: str, name: str | None = None) -> str:
        """Copy a local file into `remote_dir` (created if missing); return the remote path."""
        ...

    def close(self) -> None:
        ...


class BaseRunner(ABC):
    """What LocalRunner and SshRunner do alike around one command: argv elements made strings
    (an empty argv refused), the runner's default timeout applied, a non-zero exit raised as
    CommandError when `check`. Subclasses only start the command (`_execute`)."""

    default_timeout_s: float

    @property
    @abstractmethod
    def where(self) -> str:
        ...

    def run(
        self,
        argv: Sequence[str],
        *,
        input_text: str | None = None,
        timeout_s: float | None = None,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        check: bool = True,
    ) -> CommandResult:
        """Run `argv` (never through a local shell); CommandError on non-zero exit if `check`."""
        args = [os.fspath(a) for a in argv]
        if not args:
            raise ValueError("empty argv")
        timeout = self.default_timeout_s if timeout_s is None else timeout_s
        result = self._execute(args, input_text, timeout, env, cwd)
        return check_result(result) if check else result

    @abstractmethod
    def _execute(self, args: list[str], input_text: str | None, timeout: float,
                 env: Mapping[str, str] | None, cwd: str | None) -> CommandResult:
        """Run `args` once to completion; raise only when it cannot run or runs past the
        timeout (CommandTimeoutError)."""

    @abstractmethod
    def close(self) -> None:
        """Release what the runner holds (an SSH connection)."""

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def remote_command_line(
    argv: Sequence[str], *, env: Mapping[str, str] | None = None, cwd: str | None = None
) -> str:
    """Build one POSIX shell command line from argv, quoting every element.

    An SSH server always hands the command to the user's login shell, so each element is passed
    through `shlex.quote`: a value with quotes, `$()`, `;`, spaces or newlines arrives intact as
    one argument. Environment goes through `env(1)` (SSH `SetEnv` needs server-side `AcceptEnv`).
    """
    if not argv:
        raise ValueError("empty argv")
    words = [shlex.quote(str(a)) for a in argv]
    if env:
        for key in env:
            if not _ENV_NAME.fullmatch(key):
                raise ValueError(f"invalid environment variable name: {key!r}")
        words = ["env", *(shlex.quote(f"{k}={v}") for k, v in env.items()), *words]
    line = " ".join(words)
    if cwd:
        line = f"cd {shlex.quote(cwd)} && {line}"
    return line


def check_result(result: CommandResult, hint: str | None = None) -> CommandResult:
    """Raise CommandError (argv, exit code, stderr) for a non-zero exit."""
    if result.returncode != 0:
        raise CommandError(list(result.argv), result.returncode, result.stderr or result.stdout,
                           hint=hint)
    return result
