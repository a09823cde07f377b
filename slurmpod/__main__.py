"""`python -m slurmpod` (used by hooks that must not depend on PATH)."""

from slurmpod.cli.entry import main

main()
