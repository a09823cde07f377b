"""LocalRunner: argv lists without a shell, timeouts, CommandError with argv/exit code/stderr."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

from slurmpod.errors import CommandError
from slurmpod.transport import CommandRunner, LocalRunner
from slurmpod.transport.base import CommandTimeoutError

PY = sys.executable


def test_is_a_command_runner() -> None:
    assert isinstance(LocalRunner(), CommandRunner)


def test_argv_is_not_shell_parsed(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    hostile = f"$(touch {marker}); `touch {marker}` | & > {marker}"
    res = LocalRunner().run(["echo", hostile])
    assert res.stdout == hostile + "\n" and not marker.exists()
    assert res.argv == ("echo", hostile) and res.returncode == 0


def test_stdin_env_and_cwd(tmp_path: Path) -> None:
    runner = LocalRunner(env={"A_VAR": "from-runner"})
    code = "import os,sys; print(sys.stdin.read().upper(), os.environ['A_VAR'], " \
           "os.environ['B_VAR'], os.getcwd())"
    res = runner.run([PY, "-c", code], input_text="hello", env={"B_VAR": "per-call"},
                     cwd=str(tmp_path))
    assert res.stdout.split() == ["HELLO", "from-runner", "per-call", str(tmp_path)]


def test_nonzero_exit_raises_command_error_with_details() -> None:
    with pytest.raises(CommandError) as exc:
        LocalRunner().run([PY, "-c", "import sys; sys.stderr.write('first\\nboom\\n'); "
                           "sys.exit(3)"])
    err = exc.value
    assert err.argv[0] == PY and err.returncode == 3 and err.stderr == "first\nboom\n"
    assert err.exit_code == 4 and err.message.endswith("exited 3: boom")


def test_check_false_returns_the_result() -> None:
    res = LocalRunner().run([PY, "-c", "import sys; sys.exit(5)"], check=False)
    assert res.returncode == 5


def test_missing_program() -> None:
    with pytest.raises(CommandError, match="command not found") as exc:
        LocalRunner().run(["slurmpod-no-such-program-xyz"])
    assert exc.value.returncode == 127 and "PATH" in exc.value.hint


def test_timeout_kills_and_raises() -> None:
    t0 = time.monotonic()
    with pytest.raises(CommandTimeoutError, match=r"timed out after 0\.5 s") as exc:
        LocalRunner().run([PY, "-c", "import time; time.sleep(30)"], timeout_s=0.5)
    assert time.monotonic() - t0 < 10 and exc.value.returncode == 124
    assert isinstance(exc.value, CommandError)


def test_write_text_and_upload_are_atomic_copies(tmp_path: Path) -> None:
    runner = LocalRunner()
    path = runner.write_text(str(tmp_path / "d" / "job.sbatch"), "#!/bin/bash\n", 0o755)
    assert Path(path).read_text() == "#!/bin/bash\n" and Path(path).stat().st_mode & 0o111
    src = tmp_path / "src.txt"
    src.write_text("payload")
    dest = runner.upload(src, str(tmp_path / "remote dir"), name="copy.txt")
    assert Path(dest).read_text() == "payload"
    assert sorted(p.name for p in (tmp_path / "remote dir").iterdir()) == ["copy.txt"]
