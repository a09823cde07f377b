"""Error types that the CLI maps to one line and a distinct exit code."""

from __future__ import annotations


class SlurmpodError(Exception):
    """A failure the user can act on: printed as one line, never with a traceback."""

    exit_code = 1

    def __init__(self, message: str, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint


class UsageError(SlurmpodError):
    exit_code = 2


class ConfigError(SlurmpodError):
    """Bad site or run file. The message names the file and the key path."""

    exit_code = 3

    def __init__(
        self, message: str, *, file: str | None = None, key: str | None = None,
        hint: str | None = None,
    ) -> None:
        parts = [p for p in (file, key) if p]
        full = ": ".join([*parts, message])
        super().__init__(full, hint)
        self.file = file
        self.key = key


class SlurmError(SlurmpodError):
    """A Slurm command failed or Slurm is unreachable."""

    exit_code = 4


class SshError(SlurmpodError):
    exit_code = 5


class JobNotFinishedError(SlurmpodError):
    exit_code = 6


class OutputError(SlurmpodError):
    """An output file or directory cannot be created or written (`-o`, `--run-dir`, …).
    73 is sysexits.h's EX_CANTCREAT, beside 70 (EX_SOFTWARE) for internal bugs."""

    exit_code = 73


class CommandError(SlurmError):
    """An external command exited non-zero; carries argv, exit code and stderr."""

    def __init__(self, argv: list[str], returncode: int, stderr: str, hint: str | None = None):
        tail = " ".join(stderr.strip().splitlines()[-1:]) if stderr.strip() else "no output"
        super().__init__(f"`{argv[0]}` exited {returncode}: {tail}", hint)
        self.argv = argv
        self.returncode = returncode
        self.stderr = stderr


INTERNAL_EXIT_CODE = 70
