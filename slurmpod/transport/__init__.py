"""Where commands run: on this machine (LocalRunner) or on a login node over SSH (SshRunner)."""

from slurmpod.transport.base import (
    CommandResult,
    CommandRunner,
    CommandTimeoutError,
    remote_command_line,
)
from slurmpod.transport.local import LocalRunner

__all__ = [
    "CommandResult",
    "CommandRunner",
    "CommandTimeoutError",
    "LocalRunner",
    "SshRunner",
    "remote_command_line",
]


def __getattr__(name: str) -> object:
    # SshRunner pulls in paramiko only when asked for.
    if name == "SshRunner":
        from slurmpod.transport.ssh import SshRunner  # lazy: start-up

        return SshRunner
    raise AttributeError(name)
