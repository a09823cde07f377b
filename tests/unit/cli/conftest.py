"""A stand-in `sacct` on PATH for the report and calibrate commands: it prints the recorded-shape
files of tests/data/report/ with the delimiter the query asked for, and logs its argv."""

from __future__ import annotations

import os
import stat
import sys
from pathlib import Path

import pytest

from tests.helpers import DATA_DIR

DATA = DATA_DIR / "report"
FAKE = Path(__file__).parents[1] / "fake_sacct.py"


@pytest.fixture()
def fake_sacct(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The stand-in's argv log; the spool is `tmp_path / "spool"`, no sandbox in the env."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    argv_log = tmp_path / "sacct.argv"
    script = bin_dir / "sacct"
    script.write_text(f"""#!/bin/sh
printf '%s\\n' "$*" >> {argv_log}
[ "$SLURM_TIME_FORMAT" = "%s" ] || {{ echo "sacct: want epoch times" >&2; exit 1; }}
case "$*" in
  *Comment*) exec {sys.executable} {FAKE} {DATA / 'handmade.records.txt'} us "$@" ;;
  *ElapsedRaw,State*) exec {sys.executable} {FAKE} {DATA / 'handmade.attempts.txt'} pipe "$@" ;;
  *) echo "unexpected sacct call" >&2; exit 1 ;;
esac
""")
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("SLURMPOD_SPOOL", str(tmp_path / "spool"))
    monkeypatch.delenv("SLURMPOD_SANDBOX", raising=False)
    return argv_log
