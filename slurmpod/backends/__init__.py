"""Slurm backends: one protocol (SlurmBackend), the CLI and pyslurm implementations, a fake."""

from __future__ import annotations

from typing import TYPE_CHECKING

from slurmpod.backends.base import Script, SlurmBackend
from slurmpod.errors import UsageError

if TYPE_CHECKING:
    from slurmpod.transport.base import CommandRunner

BACKENDS = ("cli", "pyslurm")


def make_backend(kind: str, runner: CommandRunner) -> SlurmBackend:
    """Build a backend by name; `runner` is where Slurm's commands run (local or SSH)."""
    if kind == "cli":
        from slurmpod.backends.cli import CliBackend  # lazy: start-up

        return CliBackend(runner)
    if kind == "pyslurm":
        from slurmpod.backends.cli import CliBackend  # lazy: start-up
        from slurmpod.backends.pyslurm_backend import PyslurmBackend  # lazy: start-up

        if runner.where != "local":
            raise UsageError("the pyslurm backend only runs on a cluster node, not over SSH",
                             hint="use --backend cli with --host")
        return PyslurmBackend(CliBackend(runner).version())
    raise UsageError(f"unknown Slurm backend {kind!r}; choose one of: {', '.join(BACKENDS)}")


__all__ = ["BACKENDS", "Script", "SlurmBackend", "make_backend"]
