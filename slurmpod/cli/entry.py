"""The installed `slurmpod` command and `python -m slurmpod`.

`slurmpod --version` is what login-node health checks and wrappers ask most often: it is
answered here, without loading click (two thirds of the command's start-up), in click's own
words. Everything else goes to `slurmpod.cli.main`.
"""

from __future__ import annotations

import sys

from slurmpod import __version__

# click.version_option's default message; tests/unit/cli/test_startup.py holds the two equal.
VERSION_LINE = f"slurmpod, version {__version__}"


def main() -> None:
    if sys.argv[1:] == ["--version"]:
        print(VERSION_LINE)
        return
    from slurmpod.cli.main import main as run  # lazy: start-up (click)

    run()
